-- mp.amp.GradScaler: the loss scaler (docs/API.md "Mixed precision (mp.amp)", docs/DESIGN.md section 6).
--
--   local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}}
--   scaler:scale(loss):backward()
--   scaler:step(opt)     -- true when applied, false when skipped (inf/NaN)
--   scaler:update()
--
-- The scale, the unscale + inf/NaN check, the skip and the built-in policies live
-- in C (engine/scaler.c, through lua/lscaler.c). A Lua policy (policy.lua) is
-- called from update() with what the step found. scaler:trace is trace.lua's.
local core = require "mp.core"
local P = require "mp.amp.policy"
local trace = require "mp.amp.trace"

local policy, Builtin, builtin = P.policy, P.Builtin, P.builtin
local check_scale, checked_view = P.check_scale, P.checked_view

local GradScaler = {}
GradScaler.__index = GradScaler
GradScaler.__name = "mp.amp.GradScaler"

local function new(opts)
  local o = core._options("mp.amp.GradScaler", opts, "policy:table enabled:boolean sync:boolean", 2)
  local p = o.policy or policy.dynamic{}
  local ep = checked_view(p, "mp.amp.GradScaler")   -- its init: the policy's own, else the engine's default
  local enabled = o.enabled ~= false
  if not enabled then p = policy.none(); ep = p end
  local self = setmetatable({_c = core._scaler(ep), _policy = p, enabled = enabled, on_skip = nil,
                             _telemetry = false, _names = nil, _sync = o.sync ~= false}, GradScaler)
  self._c:set_sync(self._sync)
  return self
end

function GradScaler:get_scale() return self._c:_info().scale end

-- scaler:set_policy(p [, {scale = "keep" | "init" | number}]): any policy the
-- constructor takes, from the next step (at once outside a step). The scale it
-- starts from: by default the current one, unless the policy fixes its own (a
-- static scale, none's 1, an init given explicitly, a Lua policy's init() or
-- init); "init" takes the policy's first scale (the engine's default 65536
-- where it has none), "keep" the current one, a number that number. The new
-- policy starts fresh (growth tracker 0, full hysteresis, empty amax history,
-- its floor warning re-armed); steps and skipped counts go on. A scaler made
-- with enabled = false checks its arguments and stays disabled (as PyTorch's
-- disabled GradScaler ignores its calls).
function GradScaler:set_policy(p, opts)
  local name = "GradScaler:set_policy"
  local ep, own = checked_view(p, name)
  local o = core._options(name, opts, "scale:any", 2)
  local scale = o.scale
  if scale == nil then scale = own and "init" or nil
  elseif scale == "keep" then scale = nil
  elseif scale ~= "init" and not core._scale_ok(scale) then
    error(string.format('%s: scale must be "keep", "init" or a finite number > 0 (got %s)', name,
                        type(scale) == "number" and tostring(scale) or type(scale)), 2)
  end
  if getmetatable(p) == Builtin and p.kind == "none" and scale ~= "init" and scale ~= 1 then
    error(name .. ": scale: policy.none() always runs at scale 1 (got " .. tostring(o.scale) .. ")", 2)
  end
  if not self.enabled then return end
  self._c:set_policy(ep, scale)
  self._policy = p
end

function GradScaler:scale(loss)
  if self._telemetry then core._flush_reset() end   -- a new step: count this backward only (no read)
  if self._trace then   -- the step's loss: the sum of its micro-batches' (gradient accumulation)
    self._trace_loss = self._trace_loss or {}
    self._trace_loss[#self._trace_loss + 1] = loss
  end
  return self._c:scale(loss)
end

function GradScaler:unscale(opt) self._c:unscale(opt) end

-- names of the optimizer's parameters, by position, when the script gave them
local function param_name(self, i)
  if self._names and self._names[i] then return self._names[i] end
  return "param " .. i
end

-- true when applied, false when skipped; with sync = false, nil: the decision
-- stayed on the device (the optimizer kernels read it there), and an attached
-- schedule advances every step, as PyTorch's schedulers do
function GradScaler:step(opt)
  if not self._sync and self.on_skip then
    error("GradScaler:step: on_skip needs the step's outcome on the host (create the scaler with sync = true)", 2)
  end
  local applied = self._c:step(opt)
  self._last_opt = opt
  if applied == false then
    local info = self._c:_info()
    if self.on_skip then
      self.on_skip{reason = info.reason, step = info.steps, scale = info.scale,
                   param = info.first_bad > 0 and param_name(self, info.first_bad) or nil}
    end
  else
    local sched = core._schedule_of and core._schedule_of(opt)
    if sched then sched:step() end
  end
  return applied
end

-- info for Lua policies and scaler.stats
-- (with telemetry: hist, the log2 histogram of the scaled gradients, all parameters
-- together: hist[b] counts 2^(b - 1 + hist_lo) <= |g scale| < 2^(b + hist_lo))
local function step_info(self, c)
  local t = c.total
  return {scale = c.scale, found_inf = c.found_inf, reason = c.reason, step = c.steps, skipped = c.skipped,
          grad_amax = t.amax, underflow_frac = t.underflow_frac, overflow_frac = t.overflow_frac,
          zero_frac = t.zero_frac, hist = self._telemetry and t.hist or nil, hist_lo = t.hist_lo}
end

function GradScaler:update(new_scale)
  if self._trace then
    if self._trace_lag == nil then self._trace_lag = self._c:_trace_async() end
    local err = trace.write_step(self)
    if err then error("GradScaler:update: " .. err, 2) end
  end
  if new_scale ~= nil then
    local v, err = check_scale(new_scale, "update(new_scale)")
    if not v then error("GradScaler:update: " .. err, 2) end
    self._c:update(v)
    return
  end
  local p = self._policy
  if getmetatable(p) == Builtin then
    self._c:update()
    return
  end
  self._c:_share()   -- data parallel: the policy sees what any rank found
  local c = self._c:_info()
  local ok, v = pcall(p.update, p, step_info(self, c))
  if not ok then error("GradScaler:update: the policy's update failed: " .. tostring(v), 2) end
  local s, err = check_scale(v, "the policy's update(self, info)")
  if not s then error("GradScaler:update: " .. err .. "; the scale stays " .. c.scale, 2) end
  self._c:update(s)
end

-- telemetry(true) also takes the names of the optimizer's parameters, in order
-- (e.g. from model:named_parameters()), for the report
function GradScaler:telemetry(on, names)
  if not on and self._trace then
    error("GradScaler:telemetry: a trace is being recorded, and needs telemetry (scaler:trace(false) first)", 2)
  end
  self._telemetry = on and true or false
  if names ~= nil then self._names = names end
  self._c:telemetry(self._telemetry)
  core._count_flush(self._telemetry)
end

function GradScaler:__index(k)
  if k == "stats" then
    local c = self._c:_info()
    return {steps = c.steps, skipped = c.skipped, found_inf = c.found_inf, last_skip_reason = c.last_skip_reason,
            scale = c.scale}
  end
  return GradScaler[k]
end

-- per parameter: amax, fractions, histogram (a table), or nil without telemetry
function GradScaler:telemetry_table()
  local c = self._c:_info()
  if not c.per_param then return nil end
  local out = {}
  for i, st in ipairs(c.per_param) do
    out[param_name(self, i)] = st
  end
  -- values that rounding to f16/bf16 flushed to zero (or to inf) in the last backward, per op
  c.backward = core._flush_stats(false)
  return out, c
end

local function fmt_frac(x) return x == 0 and "0" or string.format("%.2e", x) end

function GradScaler:report()
  local t, c = self:telemetry_table()
  if not t then return "GradScaler:report: telemetry is off (scaler:telemetry(true), then a step)" end
  local rows = {string.format("loss scale %g   step %d   skipped %d%s", c.scale, c.steps, c.skipped,
    c.found_inf and ("   last step skipped: " .. tostring(c.reason)) or ""),
    string.format("%-28s %12s %10s %12s %12s", "parameter", "grad amax", "zeros", "f16 underflow", "f16 overflow")}
  local names = {}
  for k in pairs(t) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local st = t[k]
    rows[#rows + 1] = string.format("%-28s %12.4e %10s %12s %12s", k, st.amax, fmt_frac(st.zero_frac),
      fmt_frac(st.underflow_frac), fmt_frac(st.overflow_frac))
  end
  local ops = {}
  for k in pairs(c.backward) do ops[#ops + 1] = k end
  table.sort(ops)
  if #ops > 0 then
    rows[#rows + 1] = string.format("%-28s %12s %12s %12s", "backward op (low precision)", "rounded", "flushed to 0", "to inf")
    for _, k in ipairs(ops) do
      local b = c.backward[k]
      if b.rounded > 0 then
        rows[#rows + 1] = string.format("%-28s %12d %12s %12s", k, b.rounded,
          string.format("%d (%s)", b.flushed, fmt_frac(b.flushed / b.rounded)), tostring(b.overflowed))
      end
    end
  end
  return table.concat(rows, "\n")
end

function GradScaler:state_dict()
  local c = self._c:_info()
  local p = self._policy
  local pol = {}
  if getmetatable(p) == Builtin then
    for k, v in pairs(p) do pol[k] = v end
  else
    pol.kind = "lua"
    if type(p.state_dict) == "function" then pol.state = p:state_dict() end
  end
  return {scale = c.scale, tracker = c.tracker, last_overflow = c.last_overflow,
          hysteresis_left = c.hysteresis_left, warned_at_min = c.warned_at_min,
          amax_history = c.amax_history, amax_pos = c.amax_pos,
          steps = c.steps, skipped = c.skipped, policy = pol}
end

function GradScaler:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.scale) ~= "number" then
    error("GradScaler:load_state_dict: expected a table from state_dict()", 2)
  end
  local pol = sd.policy
  if type(pol) == "table" and pol.kind == "lua" and getmetatable(self._policy) == Builtin then
    error("GradScaler:load_state_dict: the checkpoint was taken under a Lua policy, which a checkpoint cannot hold; " ..
          "give this scaler that policy first (GradScaler{policy = p} or scaler:set_policy(p))", 2)
  end
  if type(pol) == "table" and pol.kind and pol.kind ~= "lua" then
    local p = builtin{}
    for k, v in pairs(pol) do p[k] = v end
    self._c:set_policy(p, "init")
    self._policy = p
  elseif type(pol) == "table" and pol.state ~= nil and type(self._policy.load_state_dict) == "function" then
    self._policy:load_state_dict(pol.state)
  end
  self._c:_restore(sd)
end

-- scaler:trace(path [, opts]): the trace file (trace.lua)
GradScaler.trace = trace.method

return {GradScaler = new}
