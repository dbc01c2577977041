-- mp.amp.policy: the loss scale's policies. The built-in ones (static, none,
-- dynamic, hysteresis, amax) are tables the engine runs (engine/scaler.c, through
-- lua/lscaler.c); a policy written in Lua is any table with update(self, info) ->
-- new scale (and optionally init(self) -> first scale). This file makes the
-- built-in ones and checks a Lua one; GradScaler (grad_scaler.lua) and replay
-- (lab.lua) take either through checked_view.
local core = require "mp.core"

local policy = {}   -- the public table, mp.amp.policy

local Builtin = {}
Builtin.__index = Builtin
Builtin.__name = "mp.amp.policy"
function Builtin:__tostring()
  local parts = {}
  for _, k in ipairs{"init", "growth", "backoff", "interval", "window", "hysteresis", "history", "margin", "min", "max"} do
    if self[k] ~= nil then parts[#parts + 1] = k .. "=" .. tostring(self[k]) end
  end
  return string.format("%s{%s}", self.kind, table.concat(parts, ", "))
end

local function builtin(t) return setmetatable(t, Builtin) end

-- The built-in policies: the options each takes, the engine's defaults for the
-- rest and the engine's check of every value (engine/scaler.c,
-- mp_policy_defaults and mp_policy_check), through core._policy. A bad value is
-- refused here, when the policy is made.
function policy.static(scale)
  if not core._scale_ok(scale) then
    error("mp.amp.policy.static: scale must be a finite number > 0 (got " .. tostring(scale) .. ")", 2)
  end
  return builtin(core._policy("static", {init = scale}))
end

function policy.none() return builtin(core._policy("none")) end

-- The floor of every policy whose scale moves: the smallest normal f32 unless
-- min says otherwise (the engine's MP_MIN_SCALE). At its floor with gradients
-- that still overflow, a policy warns once (on_min = "warn") or raises
-- (on_min = "error"): the scale never reaches 0 with every later step skipped
-- in silence, as PyTorch's GradScaler's does (docs/ARCHITECTURE.md, "The floor").
policy.MIN_SCALE = core._MIN_SCALE

-- the built-in policies made with an explicit init: they fix their own first
-- scale at a swap (GradScaler:set_policy); the others start from the current one
local init_given = setmetatable({}, {__mode = "k"})
local function moving(kind, opts)
  local p = builtin(core._policy(kind, opts))
  if type(opts) == "table" and opts.init ~= nil then init_given[p] = true end
  return p
end
function policy.dynamic(opts) return moving("dynamic", opts) end
function policy.hysteresis(opts) return moving("hysteresis", opts) end
function policy.amax(opts) return moving("amax", opts) end

local function is_policy(p)
  return type(p) == "table" and (getmetatable(p) == Builtin or type(p.update) == "function")
end

-- the engine's test of a scale (mp_scale_ok), with the policy's words
local function check_scale(v, what)
  if not core._scale_ok(v) then
    return nil, string.format("%s returned %s (expected a finite number > 0)", what, tostring(v))
  end
  return v
end

-- The C view of a policy and the first scale it fixes for itself (nil when it
-- leaves that to whoever uses it: the engine's default in a new scaler, the
-- current scale at a swap): a static policy's scale, none's 1, an init given
-- explicitly, a Lua policy's init() or init number. A Lua policy's fields are
-- checked here, once for every user (GradScaler, set_policy, replay); nil and
-- the reason when one is wrong.
local function engine_view(p)
  if getmetatable(p) == Builtin then
    local own = (p.kind == "static" or p.kind == "none" or init_given[p]) and p.init or nil
    return p, own
  end
  local own = p.init
  if type(own) == "function" then
    local v, err = check_scale(own(p), "policy:init()")
    if not v then return nil, err end
    own = v
  elseif own ~= nil and not core._scale_ok(own) then
    return nil, string.format("policy.init must be a function or a finite number > 0 (got %s)",
                              type(own) == "number" and tostring(own) or type(own))
  end
  if p.min ~= nil and not (type(p.min) == "number" and p.min >= 0 and p.min < math.huge) then
    return nil, string.format("policy.min must be a finite number >= 0 (got %s)",
                              type(p.min) == "number" and tostring(p.min) or type(p.min))
  end
  -- its result is held to a floor (its min, else the engine's) and warns or
  -- raises there as its on_min says (checked by the binding)
  return {kind = "external", init = own, min = p.min ~= 0 and p.min or nil, on_min = p.on_min}, own
end

-- a policy's engine view for `fname`, raising at the caller of fname's caller
local function checked_view(p, fname)
  if not is_policy(p) then
    error(fname .. ": policy must be a built-in policy or a table with update(self, info)", 3)
  end
  local ep, own = engine_view(p)
  if not ep then error(fname .. ": " .. own, 3) end
  return ep, own
end

-- what the other files of mp.amp use; `policy` is the public table
return {policy = policy, Builtin = Builtin, builtin = builtin, check_scale = check_scale,
        checked_view = checked_view}
