-- mp.fp8.Scaler, the holder of a run's FP8 tensor states, and mp.fp8.autocast
-- (docs/API.md "FP8 training"):
--
--   local fs = mp.fp8.Scaler{recipe = mp.fp8.delayed{}, model = model}
--   do local _ <close> = mp.fp8.autocast(fs); loss = f(model(x)) end
--   loss:backward(); opt:step(); fs:update()
--
-- One tensor state `ts` per FP8 tensor of each linear layer (its x, w and g),
-- made at the layer's first use: the recipe's layout, the recipe's own fields
-- (recipe:init), and what this step saw (amax, used, counts, numel), which
-- update() hands to recipe:observe and resets. Everything per step stays on the
-- device: no host wait here.
local core = require "mp.core"
local R = require "mp.fp8.recipes"
local L = require "mp.fp8.linear"
local active = require "mp.fp8.active"

local M = {}

local Scaler = {}
Scaler.__index = Scaler
Scaler.__name = "mp.fp8.Scaler"
M.class = Scaler

local KINDS = {"x", "w", "g"}
local GRANS = {tensor = true, tile = true, block = true, mx = true}
local FORMATS = {e4m3 = true, e5m2 = true}
-- the holder's own fields of a tensor state; the rest are the recipe's
local OWN = {name = true, layer = true, kind = true, device = true, format = true, granularity = true, amax = true,
             used = true, counts = true, numel = true, steps_seen = true}

local function check_recipe(r, name, what)
  local why = R.missing(r)
  if why then
    error(string.format("%s: %s must be a recipe (a table with name, layout, init, scale, observe, state and load: %s)",
                        name, what, why), 3)
  end
end

-- the modules' paths: every Linear under model, by its dotted name ("blocks.1.attn.proj")
local function name_modules(fs, model)
  local function go(m, prefix)
    if type(m) ~= "table" or type(m.named_children) ~= "function" then return end
    local map, names = m:named_children()
    for _, n in ipairs(names) do
      local c = map[n]
      local path = prefix == "" and n or prefix .. "." .. n
      if fs._names[c] == nil then fs._names[c] = path end
      go(c, path)
    end
  end
  go(model, "")
end

function M.new(opts)
  local N = "mp.fp8.Scaler"
  local o = core._options(N, opts, "recipe:any telemetry:boolean model:any", 2)
  check_recipe(o.recipe, N, "option 'recipe'")
  local self = setmetatable({recipe = o.recipe, telemetry = o.telemetry == true, tensors = {}, by_name = {},
                             _layers = {}, _names = setmetatable({}, {__mode = "k"}), _unnamed = 0,
                             _calls = {linear = 0, linear_gelu = 0, matmul = 0},
                             _pending = nil}, Scaler)
  if o.model ~= nil then
    if type(o.model) ~= "table" or type(o.model.named_children) ~= "function" then
      error(N .. ": option 'model' must be an mp.nn module (got " .. type(o.model) .. ")", 2)
    end
    name_modules(self, o.model)
  end
  return self
end

-- a tensor state's format and granularity from the recipe, checked
local function lay_out(fs, ts, where)
  local ok, f, g = pcall(fs.recipe.layout, fs.recipe, ts.kind)
  if not ok then error(string.format("%s: the recipe's layout(%q) failed: %s", where, ts.kind, tostring(f)), 0) end
  if not FORMATS[f] or not GRANS[g] then
    error(string.format('%s: the recipe\'s layout(%q) must give a format ("e4m3" or "e5m2") and a granularity '
                        .. '("tensor", "tile", "block" or "mx") (got %s, %s)', where, ts.kind, tostring(f), tostring(g)), 0)
  end
  ts.format, ts.granularity = f, g
end

-- the states {x =, w =, g =} of the layer `layer` on device, made at its first use
function Scaler:_layer(layer, device)
  local st = self._layers[layer]
  if st then
    if st.x.device ~= device then
      error(string.format("mp.fp8: layer %s ran on %s, now on %s", layer, st.x.device, device), 0)
    end
    return st
  end
  st = {}
  for _, kind in ipairs(KINDS) do
    local ts = {name = layer .. "." .. kind, layer = layer, kind = kind, device = device, numel = 0, steps_seen = 0}
    lay_out(self, ts, "mp.fp8.Scaler")
    self.recipe:init(ts)
    local saved = self._pending and self._pending[ts.name]
    if saved then
      self.recipe:load(ts, saved.state)
      ts.steps_seen = saved.steps_seen or 0
      self._pending[ts.name] = nil
    end
    st[kind] = ts
    self.tensors[#self.tensors + 1] = ts
    self.by_name[ts.name] = ts
  end
  self._layers[layer] = st
  return st
end

-- one quantization of ts this step: the running max of its amaxes, the
-- multiplier used (current scaling's FP8_MAX / amax where the recipe gave none),
-- the elements and the counts summed (gradient accumulation: one step of
-- several micro-batches)
function Scaler:_record(ts, amax, scale, numel, counts)
  ts.amax = ts.amax and core.cat({ts.amax, amax}, 1):max():reshape{1} or amax
  if scale ~= nil then
    ts.used = R.is_tensor(scale) and scale or core.full({1}, scale, {device = ts.device})
  elseif ts.granularity == "tensor" then
    -- the quantizer's rule: 1 for a zero or non-finite amax
    ts.used = core.where(amax:gt(0), core.where(amax:lt(math.huge), R.FP8_MAX[ts.format] / amax, 1), 1)
  else
    ts.used = nil   -- per-group scales
  end
  ts.numel = ts.numel + numel
  if counts ~= nil then
    ts.counts = ts.counts and ts.counts + counts or counts
  end
end

-- the step boundary, once per optimizer step after the backward
function Scaler:update()
  if self._tracer then self._tracer:record(self) end
  for _, ts in ipairs(self.tensors) do
    if ts.amax then
      self.recipe:observe(ts, ts.amax)
      ts.steps_seen = ts.steps_seen + 1
    end
    ts.amax, ts.used, ts.counts, ts.numel = nil, nil, nil, 0
  end
end

-- fs:set_recipe(r [, {history = "keep" | "reset"}]): r from the next quantization;
-- "keep" (the default) leaves the previous recipe's fields for r:init to use
-- (delayed -> delayed keeps the amax history and the scale), "reset" clears them
function Scaler:set_recipe(r, opts)
  local N = "mp.fp8.Scaler:set_recipe"
  check_recipe(r, N, "r")
  local o = core._options(N, opts, "history:any", 2)
  local h = o.history or "keep"
  if h ~= "keep" and h ~= "reset" then
    error(string.format('%s: option \'history\' must be "keep" or "reset" (got %s)', N, tostring(h)), 2)
  end
  self.recipe = r
  for _, ts in ipairs(self.tensors) do
    if h == "reset" then
      for k in pairs(ts) do
        if not OWN[k] then ts[k] = nil end
      end
    end
    lay_out(self, ts, N)
    r:init(ts)
  end
end

function Scaler:state_dict()
  local t = {}
  for _, ts in ipairs(self.tensors) do
    t[ts.name] = {state = self.recipe:state(ts), steps_seen = ts.steps_seen}
  end
  -- states loaded for layers that have not run since still belong to the run
  for name, s in pairs(self._pending or {}) do t[name] = s end
  return {recipe = self.recipe.name, tensors = t}
end

-- states of layers not made yet wait for their first use
function Scaler:load_state_dict(sd)
  local N = "mp.fp8.Scaler:load_state_dict"
  if type(sd) ~= "table" or type(sd.recipe) ~= "string" or type(sd.tensors) ~= "table" then
    error(N .. ": expected a table from state_dict()", 2)
  end
  if sd.recipe ~= self.recipe.name then
    error(string.format("%s: the state was taken under recipe '%s', this scaler has '%s'", N, sd.recipe,
                        self.recipe.name), 2)
  end
  self._pending = {}
  for name, s in pairs(sd.tensors) do
    local ts = self.by_name[name]
    if ts then
      self.recipe:load(ts, s.state)
      ts.steps_seen = s.steps_seen or 0
    else
      self._pending[name] = s
    end
  end
end

-- fs:trace(path [, {meta =}]) / fs:trace(false), fs:report(): mp.fp8.trace's
function Scaler:trace(path, opts)
  if path == false then
    if self._tracer then self._tracer:close() end
    self._tracer = nil
    return
  end
  self._tracer = require("mp.fp8.trace").new(self, path, opts)
end

function Scaler:report() return require("mp.fp8.trace").report(self) end

-- nn.Linear's forward inside a region: the module's path when the holder was
-- given the model, else "linear<i>" in the order of first use
function Scaler:_linear(m, x, dtype)
  local name = self._names[m]
  if name == nil then
    self._unnamed = self._unnamed + 1
    name = "linear" .. self._unnamed
    self._names[m] = name
  end
  return L.Function(x, m.weight, m.bias, self, name, dtype, core.is_grad_enabled())
end

local Scaler_api = {new = M.new, class = Scaler}

function M.holder(v, name) return L.holder(v, Scaler_api, name) end

function M.linear(x, w, b, fs, opts) return L.linear(Scaler_api, x, w, b, fs, opts) end

---------------------------------------------------------------- autocast

-- The functional GEMMs inside a region opened with {matmul = true}: lua/lfp8.c
-- calls route(op, args...) for mp.linear, mp.linear_gelu (the FP8 linear, then
-- mp.gelu), mp.matmul and Tensor:matmul when an autocast region is active and
-- the op's class is low (a region of mp.amp.autocast(false) inside, or
-- mp.amp.register(op, "f32"), leaves it alone). nil runs the op as it is: outside such a region, for a batched
-- matmul, and for arguments the op itself will reject with its own message.
-- Each call gets the states of the layer "mp.<op><i>" ("mp.linear1"), i
-- counting that op's calls from the opening of the holder's outermost region:
-- the same calls in the same order every step (and every micro-batch) meet the
-- same states.
local function tensor(v) return R.is_tensor(v) end

local function next_name(fs, op)
  local n = fs._calls[op] + 1
  fs._calls[op] = n
  return "mp." .. op .. n
end

-- GELU's options as mp.linear_gelu takes them (anything else: its own error)
local function gelu_opts(g)
  if g == nil then return true end
  if type(g) ~= "table" then return false end
  for k, v in pairs(g) do
    if k ~= "approximate" or (v ~= "none" and v ~= "tanh") then return false end
  end
  return true
end

local function route(op, a, b, c, opts)
  local f = active.top()
  if not (f and f.matmul and tensor(a) and tensor(b)) or #b.shape ~= 2 then return nil end
  local fs = f.holder
  if op == "linear" or op == "linear_gelu" then
    if #a.shape < 1 or a.shape[#a.shape] ~= b.shape[2] then return nil end
    if c ~= nil and not (tensor(c) and #c.shape == 1 and c.shape[1] == b.shape[1]) then return nil end
    if op == "linear" then return L.Function(a, b, c, fs, next_name(fs, op), f.dtype, core.is_grad_enabled()) end
    if not gelu_opts(opts) then return nil end
    return core.gelu(L.Function(a, b, c, fs, next_name(fs, op), f.dtype, core.is_grad_enabled()), opts)
  end
  -- matmul: a {m, k} as the activations ("x"), b {k, n} as the weight ("w"):
  -- the linear's product with w = b^T (a copy: tensors are contiguous here; its
  -- gradient reaches b through the transpose)
  if #a.shape ~= 2 or a.shape[2] ~= b.shape[1] then return nil end
  return L.Function(a, b:transpose(1, 2), nil, fs, next_name(fs, op), f.dtype, core.is_grad_enabled())
end

-- the route is installed while a region with the option is on the stack
local routed = false
local function set_route()
  local want = false
  for _, e in ipairs(active.stack) do
    if e.matmul then want = true end
  end
  if want ~= routed then
    core._fp8_route(want and route or nil)
    routed = want
  end
end

local Guard = {}
Guard.__index = Guard
Guard.__name = "mp.fp8.AutocastGuard"

function Guard:close()
  if self.closed then return end
  self.closed = true
  local s = active.stack
  -- regions close innermost first; one closed out of order takes those above it along
  for i = #s, self.depth, -1 do s[i] = nil end
  if routed then set_route() end
  if self.amp then self.amp:close() end
end

Guard.__close = Guard.close

-- mp.fp8.autocast(fs_or_recipe [, {dtype = "bf16", model =, matmul = false}]) / mp.fp8.autocast(false)
function M.autocast(v, opts)
  local N = "mp.fp8.autocast"
  local s = active.stack
  if v == false then
    core._options(N, opts, "", 2)
    s[#s + 1] = {off = true}
    return setmetatable({depth = #s}, Guard)
  end
  local fs = M.holder(v, N)
  local o = core._options(N, opts, "dtype:any model:any matmul:any", 2)
  local dtype = o.dtype or "bf16"
  if dtype ~= "bf16" and dtype ~= "f16" then
    error(string.format('%s: option \'dtype\' must be "bf16" or "f16" (got %s)', N, tostring(dtype)), 2)
  end
  if o.matmul ~= nil and type(o.matmul) ~= "boolean" then
    error(string.format("%s: option 'matmul' must be true or false (got %s)", N,
                        type(o.matmul) == "string" and string.format("%q", o.matmul) or tostring(o.matmul)), 2)
  end
  if o.model ~= nil then
    if type(o.model) ~= "table" or type(o.model.named_children) ~= "function" then
      error(N .. ": option 'model' must be an mp.nn module (got " .. type(o.model) .. ")", 2)
    end
    name_modules(fs, o.model)
  end
  local amp = core._autocast(dtype)
  local outer = false
  for _, e in ipairs(s) do
    if e.holder == fs then outer = true end
  end
  if not outer then
    local c = fs._calls
    c.linear, c.linear_gelu, c.matmul = 0, 0, 0
  end
  s[#s + 1] = {holder = fs, dtype = dtype, matmul = o.matmul == true}
  if o.matmul then set_route() end
  return setmetatable({depth = #s, amp = amp}, Guard)
end

return M
