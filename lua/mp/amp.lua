-- mp.amp: autocast and the loss scaler (docs/API.md "Mixed precision (mp.amp)", docs/DESIGN.md section 6).
--
--   local _ <close> = mp.amp.autocast("f16")        -- or "bf16", or false inside a region
--   local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}}
--   scaler:scale(loss):backward()
--   scaler:step(opt)     -- true when applied, false when skipped (inf/NaN)
--   scaler:update()
--
-- The scale, the unscale + inf/NaN check, the skip and the built-in policies live
-- in C (engine/scaler.c). A policy written in Lua is any table with
-- update(self, info) -> new scale (and optionally init(self) -> first scale); it
-- is called from update() with what the step found.
--
-- One file per job under lua/mp/amp/: autocast_regions.lua (regions, op classes),
-- policy.lua (the loss scale's policies), grad_scaler.lua (GradScaler), trace.lua
-- (scaler:trace, load_trace), lab.lua (replay, diagnose). This file gathers
-- them into the public module.
local autocast = require "mp.amp.autocast_regions"
local policy = require "mp.amp.policy"
local scaler = require "mp.amp.grad_scaler"
local trace = require "mp.amp.trace"
local lab = require "mp.amp.lab"

local amp = {}

amp.autocast = autocast.autocast
amp.register = autocast.register
amp.classes = autocast.classes

amp.policy = policy.policy
amp.GradScaler = scaler.GradScaler

amp._json = trace.json   -- for scripts that write their own JSON lines (the policy lab)
amp.load_trace = trace.load_trace

amp.replay = lab.replay
amp.diagnose = lab.diagnose

return amp
