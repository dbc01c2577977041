-- The built-in FP8 scaling recipes (docs/API.md "FP8 recipes"): mp.fp8.delayed,
-- current, block and mx. A recipe is a stateless policy: each tensor's state
-- (its amax history, its scale) lives in the tensor state `ts` the holder
-- (holder.lua) gives it, on the tensor's device, so that observe() and scale()
-- run as device ops without waiting on the host. A user's recipe is any table
-- with the same fields and methods:
--
--   recipe.name
--   recipe:layout(kind) -> format, granularity   kind "x" | "w" | "g"
--   recipe:init(ts)                              set up ts's fields (set_recipe "keep": the
--                                                previous recipe's fields may be there)
--   recipe:scale(ts) -> nil | f32 {1} tensor     the multiplier for this step's quantization
--   recipe:observe(ts, amax)                     amax: f32 {1}, the step's amax (max over micro-batches)
--   recipe:state(ts) -> table; recipe:load(ts, t)  checkpointing
local core = require "mp.core"

local R = {}

-- the largest finite value of each format (OCP FP8: E4M3FN, E5M2)
R.FP8_MAX = {e4m3 = 448, e5m2 = 57344}

local function show(v) return type(v) == "string" and string.format("%q", v) or tostring(v) end

local function bad(name, what, want, got)
  error(string.format("%s: option '%s' must be %s (got %s)", name, what, want, show(got)), 3)
end

local is_tensor = require("mp.autograd")._is_tensor
R.is_tensor = is_tensor

local function check_format(N, f, allowed)
  if f == nil then return allowed[1] end
  for _, a in ipairs(allowed) do
    if f == a then return f end
  end
  local w = {}
  for i, a in ipairs(allowed) do w[i] = string.format("%q", a) end
  bad(N, "format", table.concat(w, " or "), f)
end

-- hybrid: e4m3 forward (x, w), e5m2 backward (g), as TE's Format.HYBRID
local function hybrid_format(format, kind)
  if format == "hybrid" then return kind == "g" and "e5m2" or "e4m3" end
  return format
end

local function check_kind(N, kind)
  if kind ~= "x" and kind ~= "w" and kind ~= "g" then
    error(string.format('%s:layout: kind must be "x", "w" or "g" (got %s)', N, show(kind)), 3)
  end
end

local function device_tensor(v, ts, what, N)
  if not is_tensor(v) or v.dtype ~= "f32" then
    error(string.format("%s:load: %s of %s must be an f32 tensor (got %s)", N, what, ts.name,
                        is_tensor(v) and v.dtype or type(v)), 3)
  end
  return v.device == ts.device and v:clone() or v:to(ts.device)
end

---------------------------------------------------------------- delayed

-- TE's DelayedScaling: the multiplier of step n+1 is FP8_MAX / amax / 2^margin,
-- amax from the window of the last `history` steps' amaxes (newest first) by
-- algo; the first step runs at multiplier 1. An amax that is zero or not finite
-- keeps the previous multiplier (TE's torch.where pair); it stays in the window
-- as TE keeps it, so with algo "max" a NaN holds the scale for `history` steps.
local Delayed = {}
Delayed.__index = Delayed
Delayed.__name = "mp.fp8.recipe"

function R.delayed(opts)
  local N = "mp.fp8.delayed"
  opts = core._options(N, opts, "history:any algo:any margin:any format:any", 2)
  local len, algo, margin = opts.history or 1024, opts.algo or "max", opts.margin or 0
  if math.type(len) ~= "integer" or len < 1 then bad(N, "history", "a positive integer", len) end
  if algo ~= "max" and algo ~= "most_recent" and type(algo) ~= "function" then
    bad(N, "algo", '"max", "most_recent" or a function(history) -> f32 {1} tensor', algo)
  end
  if type(margin) ~= "number" or not (margin >= 0 and margin < math.huge) then
    bad(N, "margin", "a finite number >= 0", margin)
  end
  local format = check_format(N, opts.format, {"hybrid", "e4m3"})
  return setmetatable({name = "delayed", history = len, algo = algo, margin = margin, format = format}, Delayed)
end

function Delayed:layout(kind)
  check_kind("mp.fp8.delayed", kind)
  return hybrid_format(self.format, kind), "tensor"
end

-- a history of another length (set_recipe "keep" from a delayed recipe of
-- another window) is cut to its newest entries or padded with zeros
function Delayed:init(ts)
  local h, len = ts.history, self.history
  if is_tensor(h) and h.dtype == "f32" and h:dim() == 1 and h.device == ts.device then
    local n = h:numel()
    if n > len then h = h:narrow(1, 1, len):clone()
    elseif n < len then h = core.cat({h, core.zeros({len - n}, {device = ts.device})}, 1) end
  else
    h = core.zeros({len}, {device = ts.device})
  end
  ts.history = h
  local s = ts.scale
  if not (is_tensor(s) and s.dtype == "f32" and s:numel() == 1 and s.device == ts.device) then
    ts.scale = core.ones({1}, {device = ts.device})
  end
end

function Delayed:scale(ts) return ts.scale end

function Delayed:observe(ts, amax)
  local len = self.history
  local h = len == 1 and amax:clone() or core.cat({amax, ts.history:narrow(1, 1, len - 1)}, 1)
  ts.history = h
  local a
  if self.algo == "max" then
    a = h:max():reshape{1}
  elseif self.algo == "most_recent" then
    a = amax
  else
    local ok, r = pcall(self.algo, h)
    if not ok then error("mp.fp8.delayed: the algo function failed on " .. ts.name .. ": " .. tostring(r), 0) end
    if not is_tensor(r) or r.dtype ~= "f32" or r:numel() ~= 1 or r.device ~= ts.device then
      error(string.format("mp.fp8.delayed: the algo function must return an f32 tensor of one value on %s (got %s)",
                          ts.device, is_tensor(r) and (r.dtype .. " of " .. r:numel() .. " on " .. r.device) or type(r)), 0)
    end
    a = r:reshape{1}
  end
  local sf = (R.FP8_MAX[ts.format] / a) / 2.0 ^ self.margin
  local old = ts.scale
  ts.scale = core.where(a:gt(0), core.where(a:lt(math.huge), sf, old), old)
end

function Delayed:state(ts) return {history = ts.history, scale = ts.scale} end

function Delayed:load(ts, t)
  local N = "mp.fp8.delayed"
  if type(t) ~= "table" then error(N .. ":load: expected the table state() gave for " .. ts.name, 2) end
  local h = device_tensor(t.history, ts, "the history", N)
  if h:dim() ~= 1 or h:numel() ~= self.history then
    error(string.format("%s:load: the history of %s holds %d values, this recipe's %d", N, ts.name, h:numel(),
                        self.history), 2)
  end
  local s = device_tensor(t.scale, ts, "the scale", N)
  ts.history, ts.scale = h, s:reshape{1}
end

---------------------------------------------------------------- stateless recipes

-- the recipes whose scales come from each tensor (or group) itself: nothing to
-- keep, observe or checkpoint
local function stateless(name, layout)
  local cls = {}
  cls.__index = cls
  cls.__name = "mp.fp8.recipe"
  cls.layout = function(self, kind)
    check_kind("mp.fp8." .. name, kind)
    return layout(self, kind)
  end
  cls.init = function() end
  cls.scale = function() return nil end
  cls.observe = function() end
  cls.state = function() return {} end
  cls.load = function() end
  return function(self_fields) self_fields.name = name return setmetatable(self_fields, cls) end
end

-- current scaling (TE's Float8CurrentScaling): per tensor, the multiplier
-- FP8_MAX / amax of the tensor being quantized (the quantizer takes it itself)
local make_current = stateless("current", function(self, kind) return hybrid_format(self.format, kind), "tensor" end)

function R.current(opts)
  local N = "mp.fp8.current"
  opts = core._options(N, opts, "margin:any format:any", 2)
  if opts.margin ~= nil and opts.margin ~= 0 then
    bad(N, "margin", "0 (the scale comes from the amax of the tensor being quantized)", opts.margin)
  end
  return make_current{format = check_format(N, opts.format, {"hybrid", "e4m3"}), margin = 0}
end

-- DeepSeek-V3: activations and gradients in 1x128 tiles along k, weights in
-- 128x128 blocks, all e4m3, the scales computed online
local make_block = stateless("block", function(self, kind)
  return hybrid_format(self.format, kind), kind == "w" and "block" or "tile"
end)

function R.block(opts)
  local N = "mp.fp8.block"
  opts = core._options(N, opts, "tile:any format:any", 2)
  if opts.tile ~= nil and opts.tile ~= 128 then bad(N, "tile", "128 (the quantizer's tiles)", opts.tile) end
  return make_block{tile = 128, format = check_format(N, opts.format, {"e4m3", "hybrid"})}
end

-- OCP microscaling: 32-element blocks along k sharing a power-of-two (E8M0) scale
local make_mx = stateless("mx", function(self, kind) return hybrid_format(self.format, kind), "mx" end)

function R.mx(opts)
  local N = "mp.fp8.mx"
  opts = core._options(N, opts, "block:any format:any", 2)
  if opts.block ~= nil and opts.block ~= 32 then bad(N, "block", "32 (the MX block)", opts.block) end
  return make_mx{block = 32, format = check_format(N, opts.format, {"e4m3", "hybrid"})}
end

-- is r a recipe (the fields and methods above)? nil, or what is missing
function R.missing(r)
  if type(r) ~= "table" then return "not a table (got " .. type(r) .. ")" end
  if type(r.name) ~= "string" or r.name == "" then return "no name (a non-empty string)" end
  for _, m in ipairs{"layout", "init", "scale", "observe", "state", "load"} do
    if type(r[m]) ~= "function" then return "no method '" .. m .. "'" end
  end
  return nil
end

return R
