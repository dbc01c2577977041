-- mp.nn: neural-network modules after torch.nn (API.md "nn").
--
-- A module is a Lua table whose metatable is its class. Parameters and child
-- modules live in two registries per instance (_parameters, _modules) with
-- their names in definition order, so that naming and ordering follow
-- PyTorch: m:named_parameters() gives "0.weight", "0.bias", "2.weight", ...
-- for Sequential(Linear, ReLU, Linear), a module's own parameters first, then
-- its children's, depth first.
--
-- Declaring: inside init, `self.fc = nn.Linear(...)` registers a child module
-- and `self.w = t` registers t as a parameter when t is a leaf tensor that
-- requires grad; any other value is a plain field. self:add_module(name, m)
-- and self:add_parameter(name, t) do the same explicitly.
--
--   local Net = mp.nn.Module:extend("Net")
--   function Net:init(d) self.fc = mp.nn.Linear(d, 10) end
--   function Net:forward(x) return mp.relu(self.fc(x)) end
--   local net = Net(784)
--
-- This file needs only mp.core, so lua/mp/init.lua can `mp.nn = require "mp.nn"`.
local core = require "mp.core"

local nn = {}

---------------------------------------------------------------- helpers

local tensor_mt
local function is_tensor(x)
  if type(x) ~= "userdata" then return false end
  if not tensor_mt then
    tensor_mt = debug.getregistry()["mp.Tensor"] or getmetatable(core.zeros { 1 })
  end
  return getmetatable(x) == tensor_mt
end

-- error(msg) at the first caller outside this file, so the message points at the user's line
local this_file = debug.getinfo(1, "S").source
local function raise(msg)
  local level = 2
  while true do
    local info = debug.getinfo(level, "S")
    if not info then level = 1; break end
    if info.source ~= this_file and info.what ~= "C" then break end
    level = level + 1
  end
  error(msg, level)
end

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "number" or type(v) == "boolean" or v == nil then return tostring(v) end
  return type(v)
end

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

-- a positive integer (784 or 784.0), else an error naming the function and argument
local function check_size(fname, what, v)
  local n = type(v) == "number" and math.tointeger(v)
  if not n or n < 1 then
    raise(string.format("%s: %s must be a positive integer (got %s)", fname, what, show(v)))
  end
  return n
end

-- an option table with only known keys, each of its default's type (the
-- binding's one checker, lua/lbind.c), defaults filled in
local function check_opts(fname, opts, defaults)
  local keys = {}
  for k in pairs(defaults) do keys[#keys + 1] = k end
  table.sort(keys)
  for i, k in ipairs(keys) do keys[i] = k .. ":" .. type(defaults[k]) end
  local ok, checked = pcall(core._options, fname, opts, table.concat(keys, " "), 0)
  if not ok then raise(tostring(checked)) end
  opts = checked
  local r = {}
  for k, v in pairs(defaults) do r[k] = v end
  for k, v in pairs(opts) do r[k] = v end
  return r
end

local function remove_name(list, name)
  for i = #list, 1, -1 do
    if list[i] == name then table.remove(list, i) end
  end
end

local function check_name(self, kind, name)
  if type(name) ~= "string" or name == "" or name:find(".", 1, true) then
    raise(string.format("mp.nn.Module:add_%s: name must be a non-empty string without dots (got %s)",
                        kind, show(name)))
  end
  if getmetatable(self)[name] ~= nil then
    raise(string.format("mp.nn.Module:add_%s: '%s' is a method or field of %s", kind, name,
                        self:type_name()))
  end
end

---------------------------------------------------------------- classes

local function is_module(x)
  if type(x) ~= "table" then return false end
  local mt = getmetatable(x)
  return type(mt) == "table" and rawget(mt, "__is_module_class") == true and rawget(x, "_parameters") ~= nil
end
nn.is_module = is_module

local function is_parameter_value(v)
  return is_tensor(v) and v.is_leaf and v:requires_grad()
end

-- self.k = v: a module registers as a child, a leaf tensor that requires grad as
-- a parameter; assigning to an existing parameter or child replaces it (nil removes)
local function module_newindex(self, k, v)
  local params, mods, bufs = rawget(self, "_parameters"), rawget(self, "_modules"), rawget(self, "_buffers")
  if bufs[k] ~= nil then
    if v == nil then
      bufs[k] = nil
      remove_name(rawget(self, "_buffer_names"), k)
    elseif is_tensor(v) then
      bufs[k] = v
    else
      raise(string.format("mp.nn.Module: cannot assign %s as buffer '%s' (a tensor, or nil, expected)",
                          show(v), tostring(k)))
    end
  elseif params[k] ~= nil then
    if v == nil then
      params[k] = nil
      remove_name(rawget(self, "_param_names"), k)
    elseif is_parameter_value(v) then
      params[k] = v
    else
      raise(string.format("mp.nn.Module: cannot assign %s as parameter '%s' (a leaf float tensor "
                          .. "with requires_grad, or nil, expected)", show(v), tostring(k)))
    end
  elseif mods[k] ~= nil then
    if v == nil then
      mods[k] = nil
      remove_name(rawget(self, "_module_names"), k)
    elseif is_module(v) then
      mods[k] = v
    else
      raise(string.format("mp.nn.Module: cannot assign %s as child module '%s' (a module, or nil, "
                          .. "expected)", show(v), tostring(k)))
    end
  elseif type(k) == "string" and is_module(v) then
    self:add_module(k, v)
  elseif type(k) == "string" and is_parameter_value(v) then
    self:add_parameter(k, v)
  else
    rawset(self, k, v)
  end
end

local function construct(cls, ...)
  local self = {
    _parameters = {}, _param_names = {},
    _modules = {}, _module_names = {},
    _buffers = {}, _buffer_names = {},
    training = true,
  }
  setmetatable(self, cls)
  self:init(...)
  return self
end

-- a new class: metamethods are copied (Lua does not inherit them through __index)
local function make_class(name, parent)
  local cls = {}
  cls.__is_module_class = true
  cls.__name = "mp.nn." .. name
  cls._class_name = name
  cls.__index = function(self, k)
    local v = rawget(self, "_parameters")[k]
    if v ~= nil then return v end
    v = rawget(self, "_buffers")[k]
    if v ~= nil then return v end
    v = rawget(self, "_modules")[k]
    if v ~= nil then return v end
    return cls[k]
  end
  cls.__newindex = module_newindex
  cls.__call = function(self, ...) return self:forward(...) end
  cls.__tostring = function(self) return self:repr() end
  if parent then
    for _, mm in ipairs { "__len" } do cls[mm] = rawget(parent, mm) end
  end
  return setmetatable(cls, {
    __index = parent,
    __call = construct,
    __tostring = function() return "mp.nn." .. name end,
  })
end

local Module = make_class("Module", nil)
nn.Module = Module

-- Module:extend(name) -> a subclass; define init(self, ...) and forward(self, ...)
function Module:extend(name)
  if type(name) ~= "string" or name == "" then
    raise("mp.nn.Module:extend: the class needs a name (got " .. show(name) .. ")")
  end
  return make_class(name, self)
end

function Module:init() end

function Module:forward()
  raise(string.format("mp.nn.%s: forward is not implemented", self:type_name()))
end

function Module:type_name() return getmetatable(self)._class_name end

---------------------------------------------------------------- registration

function Module:add_module(name, m)
  check_name(self, "module", name)
  if not is_module(m) then
    raise(string.format("mp.nn.Module:add_module: '%s' must be a module (got %s)", name, show(m)))
  end
  local params, mods = rawget(self, "_parameters"), rawget(self, "_modules")
  if params[name] ~= nil or rawget(self, "_buffers")[name] ~= nil then
    raise(string.format("mp.nn.Module:add_module: '%s' is already a parameter or buffer", name))
  end
  rawset(self, name, nil)
  if mods[name] == nil then table.insert(rawget(self, "_module_names"), name) end
  mods[name] = m
  return m
end

-- t must be a float leaf; it is made to require grad (a parameter, as nn.Parameter does)
function Module:add_parameter(name, t)
  check_name(self, "parameter", name)
  if not is_tensor(t) then
    raise(string.format("mp.nn.Module:add_parameter: '%s' must be a tensor (got %s)", name, show(t)))
  end
  if not t.is_leaf then
    raise(string.format("mp.nn.Module:add_parameter: '%s' must be a leaf tensor (it was computed by %s; "
                        .. "use detach())", name, tostring(t.grad_fn)))
  end
  if t.dtype ~= "f32" and t.dtype ~= "f16" and t.dtype ~= "bf16" then
    raise(string.format("mp.nn.Module:add_parameter: '%s' must be a float tensor (got %s)", name, t.dtype))
  end
  local params, mods = rawget(self, "_parameters"), rawget(self, "_modules")
  if mods[name] ~= nil or rawget(self, "_buffers")[name] ~= nil then
    raise(string.format("mp.nn.Module:add_parameter: '%s' is already a child module or buffer", name))
  end
  if not t:requires_grad() then t:requires_grad(true) end
  rawset(self, name, nil)
  if params[name] == nil then table.insert(rawget(self, "_param_names"), name) end
  params[name] = t
  return t
end

-- a buffer: state that is not a parameter (batch norm's running statistics): in
-- state_dict and moved by to(device), never trained, and keeping its dtype
-- under to(dtype) (running statistics stay f32 in a half-precision model)
function Module:add_buffer(name, t)
  check_name(self, "buffer", name)
  if not is_tensor(t) then
    raise(string.format("mp.nn.Module:add_buffer: '%s' must be a tensor (got %s)", name, show(t)))
  end
  if rawget(self, "_parameters")[name] ~= nil or rawget(self, "_modules")[name] ~= nil then
    raise(string.format("mp.nn.Module:add_buffer: '%s' is already a parameter or child module", name))
  end
  local bufs = rawget(self, "_buffers")
  rawset(self, name, nil)
  if bufs[name] == nil then table.insert(rawget(self, "_buffer_names"), name) end
  bufs[name] = t
  return t
end

---------------------------------------------------------------- walking

-- fn(module, prefix) for self and every descendant, depth first, each module once
local function walk(self, fn)
  local seen = {}
  local function go(m, prefix)
    if seen[m] then return end
    seen[m] = true
    fn(m, prefix)
    local mods = rawget(m, "_modules")
    for _, n in ipairs(rawget(m, "_module_names")) do go(mods[n], prefix .. n .. ".") end
  end
  go(self, "")
end

-- {module, ...}: self first, then every descendant depth first
function Module:modules()
  local r = {}
  walk(self, function(m) r[#r + 1] = m end)
  return r
end

-- {["fc1"] = module, ...}, {"fc1", ...}: the direct children, in order
function Module:named_children()
  local map, names = {}, {}
  local mods = rawget(self, "_modules")
  for _, n in ipairs(rawget(self, "_module_names")) do
    map[n] = mods[n]
    names[#names + 1] = n
  end
  return map, names
end

function Module:children()
  local _, names = self:named_children()
  local r = {}
  for i, n in ipairs(names) do r[i] = rawget(self, "_modules")[n] end
  return r
end

-- {["0.weight"] = t, ...} plus the names in definition order as a second result.
-- A parameter shared by two modules appears once, under its first name.
function Module:named_parameters()
  local map, names, seen = {}, {}, {}
  walk(self, function(m, prefix)
    local params = rawget(m, "_parameters")
    for _, n in ipairs(rawget(m, "_param_names")) do
      local p = params[n]
      if not seen[p] then
        seen[p] = true
        map[prefix .. n] = p
        names[#names + 1] = prefix .. n
      end
    end
  end)
  return map, names
end

-- {t, ...} in definition order (the order named_parameters gives)
function Module:parameters()
  local map, names = self:named_parameters()
  local r = {}
  for i, n in ipairs(names) do r[i] = map[n] end
  return r
end

-- {["bn.running_mean"] = t, ...} plus the names in definition order
function Module:named_buffers()
  local map, names = {}, {}
  walk(self, function(m, prefix)
    local bufs = rawget(m, "_buffers")
    for _, n in ipairs(rawget(m, "_buffer_names")) do
      map[prefix .. n] = bufs[n]
      names[#names + 1] = prefix .. n
    end
  end)
  return map, names
end

function Module:buffers()
  local map, names = self:named_buffers()
  local r = {}
  for i, n in ipairs(names) do r[i] = map[n] end
  return r
end

-- fn(module, own name, full name, store) for every parameter slot, then every
-- buffer slot (store: the module's _parameters or _buffers table), a shared
-- module under each of its names (as PyTorch's state_dict walks), cycles refused
local function each_slot(self, fn)
  local active = {}
  local function go(m, prefix)
    if active[m] then raise("mp.nn.Module: module '" .. prefix .. "' contains itself") end
    active[m] = true
    local params, bufs = rawget(m, "_parameters"), rawget(m, "_buffers")
    for _, n in ipairs(rawget(m, "_param_names")) do fn(m, n, prefix .. n, params) end
    for _, n in ipairs(rawget(m, "_buffer_names")) do fn(m, n, prefix .. n, bufs) end
    local mods = rawget(m, "_modules")
    for _, n in ipairs(rawget(m, "_module_names")) do go(mods[n], prefix .. n .. ".") end
    active[m] = nil
  end
  go(self, "")
end

---------------------------------------------------------------- modes and devices

-- m:train([mode=true]) sets .training on m and every descendant; returns m
function Module:train(mode)
  if mode == nil then mode = true end
  if type(mode) ~= "boolean" then
    raise("mp.nn.Module:train: mode must be a boolean (got " .. show(mode) .. ")")
  end
  walk(self, function(m) rawset(m, "training", mode) end)
  return self
end

function Module:eval() return self:train(false) end

-- m:zero_grad(): every parameter's .grad back to nil; returns m
function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
  return self
end

-- m:to(device) / m:to(dtype) / m:to(dtype, device), as Tensor:to takes them.
-- A parameter already on that device and dtype stays the same tensor. Any other
-- is replaced by a moved copy: a new leaf that requires grad, with its .grad
-- moved too. References taken before (an optimizer's) then point at the old
-- tensors: move the model before making its optimizer, as in PyTorch.
function Module:to(...)
  local n = select("#", ...)
  if n < 1 or n > 2 then raise("mp.nn.Module:to: expected a device and/or a float dtype") end
  for i = 1, n do
    local a = select(i, ...)
    if type(a) ~= "string" then
      raise("mp.nn.Module:to: expected a device or dtype name (got " .. show(a) .. ")")
    end
  end
  local args = table.pack(...)
  local moved, slots = {}, {}
  local _ <close> = core.no_grad()
  -- every copy first, then the swap: a failure halfway leaves the module as it was
  each_slot(self, function(m, name, _, store)
    local p = store[name]
    slots[#slots + 1] = { store, name, p }
    if moved[p] then return end
    local targs = args
    if store ~= rawget(m, "_parameters") then   -- a buffer: to its device, in its own dtype
      targs = { n = 0 }
      for i = 1, args.n do if args[i] ~= "f32" and args[i] ~= "f16" and args[i] ~= "bf16" then
        targs.n = targs.n + 1; targs[targs.n] = args[i] end end
      if targs.n == 0 then moved[p] = p return end
    end
    local ok, r = pcall(p.to, p, table.unpack(targs, 1, targs.n))
    if not ok then raise("mp.nn.Module:to: " .. tostring(r):gsub("^[^:]*:%d+: ", "")) end
    if targs ~= args then moved[p] = r return end
    if r.dtype ~= "f32" and r.dtype ~= "f16" and r.dtype ~= "bf16" then
      raise("mp.nn.Module:to: parameters must stay float tensors (asked for " .. r.dtype .. ")")
    end
    if r == p then   -- nothing to move: Tensor:to gave the same tensor back
      moved[p] = p
    else
      local q = r:requires_grad(true)
      local g = p.grad
      if g then q.grad = g:to(r.dtype, r.device) end
      moved[p] = q
    end
  end)
  for _, s in ipairs(slots) do s[1][s[2]] = moved[s[3]] end
  return self
end

---------------------------------------------------------------- state

-- {["0.weight"] = t, ...}: detached tensors sharing the parameters' storage (a
-- later optimizer step shows through them, as in PyTorch, provided the optimizer
-- existed when state_dict() was called: creating one moves the parameters into
-- its arena, and views taken before that keep the old values); a shared parameter
-- appears under each of its names. (One result only, so that
-- b:load_state_dict(a:state_dict()) passes no options by accident.)
function Module:state_dict()
  local sd = {}
  each_slot(self, function(_, name, full, store)
    sd[full] = store[name]:detach()
  end)
  return sd
end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- src's values into p's storage (cast to p's dtype, moved to its device): p stays
-- the same tensor, so an optimizer holding it (or its arena) sees the new values
local function copy_into(p, src)
  local _ <close> = core.no_grad()
  p:copy_(src:detach())
end

-- m:load_state_dict(sd [, {strict=true}]) copies sd's tensors into the existing
-- parameters (same tensors, same storage: an optimizer made before still sees
-- them). strict: every parameter name must be in sd and sd must hold nothing
-- else. Returns {missing_keys = {...}, unexpected_keys = {...}} (sorted).
function Module:load_state_dict(sd, opts)
  if type(sd) ~= "table" then
    raise("mp.nn.Module:load_state_dict: state_dict must be a table (got " .. show(sd) .. ")")
  end
  opts = check_opts("mp.nn.Module:load_state_dict", opts, { strict = true })
  local expected, missing, unexpected = {}, {}, {}
  local slots = {}
  each_slot(self, function(m, name, full, store)
    expected[full] = true
    slots[#slots + 1] = { store, name, full, store ~= rawget(m, "_parameters") }
  end)
  for _, s in ipairs(slots) do
    if sd[s[3]] == nil then missing[#missing + 1] = s[3] end
  end
  for k in pairs(sd) do
    if not expected[k] then unexpected[#unexpected + 1] = tostring(k) end
  end
  table.sort(missing)
  table.sort(unexpected)
  if opts.strict and (#missing > 0 or #unexpected > 0) then
    local parts = {}
    if #missing > 0 then parts[#parts + 1] = "missing keys: " .. table.concat(missing, ", ") end
    if #unexpected > 0 then parts[#parts + 1] = "unexpected keys: " .. table.concat(unexpected, ", ") end
    raise("mp.nn.Module:load_state_dict: " .. table.concat(parts, "; "))
  end
  -- check everything before writing anything, so a bad entry leaves the model untouched
  for _, s in ipairs(slots) do
    local v, p = sd[s[3]], s[1][s[2]]
    if v ~= nil then
      if not is_tensor(v) then
        raise(string.format("mp.nn.Module:load_state_dict: '%s' is %s (expected a tensor)", s[3], show(v)))
      end
      if not same_shape(v.shape, p.shape) then
        raise(string.format("mp.nn.Module:load_state_dict: size mismatch for '%s': the state_dict has %s, "
                            .. "the model %s", s[3], shape_str(v.shape), shape_str(p.shape)))
      end
      if not s[4] and v.dtype ~= "f32" and v.dtype ~= "f16" and v.dtype ~= "bf16" then
        raise(string.format("mp.nn.Module:load_state_dict: '%s' is %s (expected a float tensor)", s[3], v.dtype))
      end
    end
  end
  for _, s in ipairs(slots) do
    local v = sd[s[3]]
    if v ~= nil then copy_into(s[1][s[2]], v) end
  end
  return { missing_keys = missing, unexpected_keys = unexpected }
end

---------------------------------------------------------------- printing

function Module:extra_repr() return "" end

function Module:repr()
  local head = self:type_name() .. "(" .. self:extra_repr()
  local _, names = self:named_children()
  if #names == 0 then return head .. ")" end
  local lines = { head }
  for _, n in ipairs(names) do
    local child = rawget(self, "_modules")[n]:repr():gsub("\n", "\n  ")
    lines[#lines + 1] = "  (" .. n .. "): " .. child
  end
  return table.concat(lines, "\n") .. "\n)"
end

---------------------------------------------------------------- layers

local function uniform(shape, bound)
  return core.rand(shape, { dtype = "f32" }) * (2 * bound) - bound
end

-- Linear(in, out [, {bias=true}]): y = x @ weight^T + bias, weight {out,in}.
-- PyTorch's default init: kaiming_uniform_(a=sqrt(5)) gives weight ~ U(-1/sqrt(in), 1/sqrt(in)),
-- and the bias ~ U(-1/sqrt(in), 1/sqrt(in)). mp.manual_seed makes it reproducible.
local Linear = Module:extend("Linear")
nn.Linear = Linear

function Linear:init(in_features, out_features, opts)
  in_features = check_size("mp.nn.Linear", "in_features", in_features)
  out_features = check_size("mp.nn.Linear", "out_features", out_features)
  opts = check_opts("mp.nn.Linear", opts, { bias = true })
  self.in_features, self.out_features = in_features, out_features
  local bound = 1 / math.sqrt(in_features)
  self:add_parameter("weight", uniform({ out_features, in_features }, bound))
  if opts.bias then self:add_parameter("bias", uniform({ out_features }, bound)) end
end

function Linear:forward(x) return core.linear(x, self.weight, self.bias) end

function Linear:extra_repr()
  return string.format("in_features=%d, out_features=%d, bias=%s", self.in_features, self.out_features,
                       tostring(self.bias ~= nil))
end

-- Sequential(m1, m2, ...): children "0", "1", ...; forward feeds each output to the next.
-- #seq is the number of children; seq:get(i) is the i-th (1-based, as Lua lists are).
local Sequential = Module:extend("Sequential")
nn.Sequential = Sequential
Sequential.__len = function(self) return #rawget(self, "_module_names") end

function Sequential:init(...)
  local n = select("#", ...)
  for i = 1, n do
    local m = select(i, ...)
    if not is_module(m) then
      raise(string.format("mp.nn.Sequential: argument %d must be a module (got %s)", i, show(m)))
    end
    self:add_module(tostring(i - 1), m)
  end
end

-- seq:add(m) (alias append): m becomes the next child; returns seq
function Sequential:add(m)
  if not is_module(m) then
    raise("mp.nn.Sequential:add: expected a module (got " .. show(m) .. ")")
  end
  self:add_module(tostring(#self), m)
  return self
end
Sequential.append = Sequential.add

function Sequential:get(i)
  local n = #self
  if math.type(i) ~= "integer" or i < 1 or i > n then
    raise(string.format("mp.nn.Sequential:get: index must be an integer in 1..%d (got %s)", n, show(i)))
  end
  return rawget(self, "_modules")[rawget(self, "_module_names")[i]]
end

function Sequential:forward(x, ...)
  local mods = rawget(self, "_modules")
  local names = rawget(self, "_module_names")
  if #names == 0 then return x end
  x = mods[names[1]](x, ...)
  for i = 2, #names do x = mods[names[i]](x) end
  return x
end

-- ModuleList({m1, m2, ...}): modules held in order as children "0", "1", ...
-- (PyTorch's names, so state dicts match) with no forward of their own: ml[i]
-- (1-based, nil past the end, so ipairs(ml) walks them), #ml, ml:append(m),
-- ml:extend{...}. Their parameters are the list's.
local ModuleList = Module:extend("ModuleList")
nn.ModuleList = ModuleList
ModuleList.__len = Sequential.__len
local module_index = ModuleList.__index
ModuleList.__index = function(self, k)
  if math.type(k) == "integer" then
    local name = rawget(self, "_module_names")[k]
    return name and rawget(self, "_modules")[name] or nil
  end
  return module_index(self, k)
end

function ModuleList:init(mods)
  if mods == nil then return end
  if type(mods) ~= "table" or is_module(mods) then
    raise("mp.nn.ModuleList: expected a list of modules (got " .. show(mods) .. ")")
  end
  self:extend(mods)
end

function ModuleList:append(m)
  if not is_module(m) then
    raise("mp.nn.ModuleList:append: expected a module (got " .. show(m) .. ")")
  end
  self:add_module(tostring(#self), m)
  return self
end

function ModuleList:extend(mods)
  if type(mods) ~= "table" or is_module(mods) then
    raise("mp.nn.ModuleList:extend: expected a list of modules (got " .. show(mods) .. ")")
  end
  for i, m in ipairs(mods) do
    if not is_module(m) then
      raise(string.format("mp.nn.ModuleList: entry %d must be a module (got %s)", i, show(m)))
    end
    self:add_module(tostring(#self), m)
  end
  return self
end

function ModuleList:forward()
  raise("mp.nn.ModuleList: a list has no forward; call its modules (for _, m in ipairs(list) do x = m(x) end)")
end

local function activation(name, fn)
  local cls = Module:extend(name)
  cls.forward = function(self, x) return fn(x) end
  nn[name] = cls
  return cls
end

activation("ReLU", function(x) return core.relu(x) end)
activation("Tanh", function(x) return core.tanh(x) end)
activation("Sigmoid", function(x) return core.sigmoid(x) end)
activation("SiLU", function(x) return core.silu(x) end)
activation("Identity", function(x) return x end)

-- GELU([approximate]) with approximate "none" (default, the erf form) or "tanh";
-- also GELU{approximate="tanh"}
local GELU = Module:extend("GELU")
nn.GELU = GELU

function GELU:init(approximate)
  if type(approximate) == "table" then
    approximate = check_opts("mp.nn.GELU", approximate, { approximate = "none" }).approximate
  end
  approximate = approximate or "none"
  if approximate ~= "none" and approximate ~= "tanh" then
    raise("mp.nn.GELU: approximate must be \"none\" or \"tanh\" (got " .. show(approximate) .. ")")
  end
  self.approximate = approximate
end

function GELU:forward(x) return core.gelu(x, { approximate = self.approximate }) end

function GELU:extra_repr()
  return self.approximate == "none" and "" or "approximate='" .. self.approximate .. "'"
end

-- Dropout([p=0.5]): zeroes each element with probability p while training and
-- scales the rest by 1/(1-p); the identity after m:eval()
local Dropout = Module:extend("Dropout")
nn.Dropout = Dropout

function Dropout:init(p)
  if p == nil then p = 0.5 end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    raise("mp.nn.Dropout: p must be a number in [0, 1] (got " .. show(p) .. ")")
  end
  self.p = p
end

function Dropout:forward(x) return core.dropout(x, self.p, self.training) end

function Dropout:extra_repr() return "p=" .. tostring(self.p) end

-- LayerNorm(d [, {eps=1e-5, elementwise_affine=true, bias=true}]): normalises
-- over the last dim, of size d; weight ones and bias zeros, as PyTorch
local LayerNorm = Module:extend("LayerNorm")
nn.LayerNorm = LayerNorm

function LayerNorm:init(d, opts)
  if type(d) == "table" and #d == 1 then d = d[1] end
  d = check_size("mp.nn.LayerNorm", "normalized_shape", d)
  opts = check_opts("mp.nn.LayerNorm", opts, { eps = core._LAYER_NORM_EPS, elementwise_affine = true, bias = true })
  if not (opts.eps > 0) then
    raise("mp.nn.LayerNorm: eps must be positive (got " .. show(opts.eps) .. ")")
  end
  self.normalized_shape, self.eps, self.elementwise_affine = d, opts.eps, opts.elementwise_affine
  if opts.elementwise_affine then
    self:add_parameter("weight", core.ones({ d }, { dtype = "f32" }))
    if opts.bias then self:add_parameter("bias", core.zeros({ d }, { dtype = "f32" })) end
  end
end

function LayerNorm:forward(x) return core.layer_norm(x, self.weight, self.bias, self.eps) end

function LayerNorm:extra_repr()
  return string.format("(%d,), eps=%g, elementwise_affine=%s", self.normalized_shape, self.eps,
                       tostring(self.elementwise_affine))
end

-- Embedding(n, d): a lookup table of n rows of size d, weight ~ N(0, 1) as PyTorch;
-- forward takes i32 indices (0-based) of any shape and gives {..., d}
local Embedding = Module:extend("Embedding")
nn.Embedding = Embedding

function Embedding:init(n, d)
  n = check_size("mp.nn.Embedding", "num_embeddings", n)
  d = check_size("mp.nn.Embedding", "embedding_dim", d)
  self.num_embeddings, self.embedding_dim = n, d
  self:add_parameter("weight", core.randn({ n, d }, { dtype = "f32" }))
end

function Embedding:forward(idx) return core.embedding(idx, self.weight) end

function Embedding:extra_repr() return string.format("%d, %d", self.num_embeddings, self.embedding_dim) end

---------------------------------------------------------------- convolutional networks

-- an integer or a pair {rows, columns} of integers >= lo, as a pair
local function check_pair(fname, what, v, lo)
  local function ok(x) x = type(x) == "number" and math.tointeger(x); return x and x >= lo and x end
  if type(v) == "number" and ok(v) then return { ok(v), ok(v) } end
  if type(v) == "table" and #v == 2 and ok(v[1]) and ok(v[2]) then return { ok(v[1]), ok(v[2]) } end
  raise(string.format("%s: %s must be an integer >= %d or a pair {rows, columns} of them (got %s)", fname, what, lo,
                      type(v) == "table" and "a table" or show(v)))
end

local function pair_str(p) return p[1] == p[2] and tostring(p[1]) or string.format("(%d, %d)", p[1], p[2]) end

local function checked_options(fname, opts, spec)
  local ok, r = pcall(core._options, fname, opts, spec, 0)
  if not ok then raise(tostring(r)) end
  return r or {}
end

-- Conv2d(in, out, kernel_size [, {stride=1, padding=0, dilation=1, groups=1, bias=true}]):
-- weight {out, in / groups, kh, kw}; PyTorch's default init, kaiming_uniform_(a=sqrt(5)):
-- weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kh * kw
local Conv2d = Module:extend("Conv2d")
nn.Conv2d = Conv2d

function Conv2d:init(in_channels, out_channels, kernel_size, opts)
  local f = "mp.nn.Conv2d"
  in_channels = check_size(f, "in_channels", in_channels)
  out_channels = check_size(f, "out_channels", out_channels)
  local k = check_pair(f, "kernel_size", kernel_size, 1)
  opts = checked_options(f, opts, "stride:any padding:any dilation:any groups:integer bias:boolean")
  self.stride = check_pair(f, "stride", opts.stride or 1, 1)
  self.padding = check_pair(f, "padding", opts.padding or 0, 0)
  self.dilation = check_pair(f, "dilation", opts.dilation or 1, 1)
  self.groups = check_size(f, "groups", opts.groups or 1)
  if in_channels % self.groups ~= 0 or out_channels % self.groups ~= 0 then
    raise(string.format("%s: groups (%d) must divide in_channels (%d) and out_channels (%d)", f, self.groups,
                        in_channels, out_channels))
  end
  self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
  local bound = 1 / math.sqrt(in_channels // self.groups * k[1] * k[2])
  self:add_parameter("weight", uniform({ out_channels, in_channels // self.groups, k[1], k[2] }, bound))
  if opts.bias ~= false then self:add_parameter("bias", uniform({ out_channels }, bound)) end
end

function Conv2d:forward(x)
  return core.conv2d(x, self.weight, self.bias,
                     { stride = self.stride, padding = self.padding, dilation = self.dilation, groups = self.groups })
end

function Conv2d:extra_repr()
  local s = string.format("%d, %d, kernel_size=%s, stride=%s", self.in_channels, self.out_channels,
                          pair_str(self.kernel_size), pair_str(self.stride))
  if self.padding[1] ~= 0 or self.padding[2] ~= 0 then s = s .. ", padding=" .. pair_str(self.padding) end
  if self.dilation[1] ~= 1 or self.dilation[2] ~= 1 then s = s .. ", dilation=" .. pair_str(self.dilation) end
  if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
  if not self.bias then s = s .. ", bias=false" end
  return s
end

-- MaxPool2d(kernel_size [, {stride=kernel_size, padding=0}]) and AvgPool2d (padding
-- counted in the average, as PyTorch's default)
local function pool_class(name, fn)
  local cls = Module:extend(name)
  nn[name] = cls
  function cls:init(kernel_size, opts)
    local f = "mp.nn." .. name
    self.kernel_size = check_pair(f, "kernel_size", kernel_size, 1)
    opts = checked_options(f, opts, "stride:any padding:any")
    self.stride = opts.stride and check_pair(f, "stride", opts.stride, 1) or self.kernel_size
    self.padding = check_pair(f, "padding", opts.padding or 0, 0)
  end
  function cls:forward(x) return core[fn](x, self.kernel_size, { stride = self.stride, padding = self.padding }) end
  function cls:extra_repr()
    return string.format("kernel_size=%s, stride=%s, padding=%s", pair_str(self.kernel_size), pair_str(self.stride),
                         pair_str(self.padding))
  end
end
pool_class("MaxPool2d", "max_pool2d")
pool_class("AvgPool2d", "avg_pool2d")

-- AdaptiveAvgPool2d(output_size): output_size an integer or {rows, columns}
local AdaptiveAvgPool2d = Module:extend("AdaptiveAvgPool2d")
nn.AdaptiveAvgPool2d = AdaptiveAvgPool2d

function AdaptiveAvgPool2d:init(output_size)
  self.output_size = check_pair("mp.nn.AdaptiveAvgPool2d", "output_size", output_size, 1)
end

function AdaptiveAvgPool2d:forward(x) return core.adaptive_avg_pool2d(x, self.output_size) end

function AdaptiveAvgPool2d:extra_repr() return "output_size=" .. pair_str(self.output_size) end

-- BatchNorm2d(c [, {eps=1e-5, momentum=0.1, affine=true, track_running_stats=true}]) over
-- {n, c, h, w}: weight ones, bias zeros; buffers running_mean (zeros), running_var
-- (ones), always f32, and num_batches_tracked (i32; PyTorch's is i64), as PyTorch names
-- them. Training uses the batch's statistics and moves the running ones; eval uses
-- the running ones (or the batch's without track_running_stats).
local BatchNorm2d = Module:extend("BatchNorm2d")
nn.BatchNorm2d = BatchNorm2d

function BatchNorm2d:init(num_features, opts)
  local f = "mp.nn.BatchNorm2d"
  num_features = check_size(f, "num_features", num_features)
  opts = check_opts(f, opts, { eps = core._BATCH_NORM_EPS, momentum = core._BATCH_NORM_MOMENTUM, affine = true,
                               track_running_stats = true })
  if not (opts.eps > 0) then raise(f .. ": eps must be positive (got " .. show(opts.eps) .. ")") end
  if not (opts.momentum >= 0 and opts.momentum <= 1) then
    raise(f .. ": momentum must be in [0, 1] (got " .. show(opts.momentum) .. ")")
  end
  self.num_features, self.eps, self.momentum = num_features, opts.eps, opts.momentum
  self.affine, self.track_running_stats = opts.affine, opts.track_running_stats
  if opts.affine then
    self:add_parameter("weight", core.ones({ num_features }, { dtype = "f32" }))
    self:add_parameter("bias", core.zeros({ num_features }, { dtype = "f32" }))
  end
  if opts.track_running_stats then
    self:add_buffer("running_mean", core.zeros({ num_features }, { dtype = "f32" }))
    self:add_buffer("running_var", core.ones({ num_features }, { dtype = "f32" }))
    self:add_buffer("num_batches_tracked", core.zeros({}, { dtype = "i32" }))
  end
end

function BatchNorm2d:forward(x)
  if is_tensor(x) and #x.shape ~= 4 then
    raise(string.format("mp.nn.BatchNorm2d: expected a 4-d input {n, c, h, w} (got %s)", shape_str(x.shape)))
  end
  local batch_stats = self.training or not self.track_running_stats
  if self.training and self.track_running_stats then
    self.num_batches_tracked = self.num_batches_tracked + 1
  end
  return core.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         { training = batch_stats, momentum = self.momentum, eps = self.eps })
end

function BatchNorm2d:extra_repr()
  return string.format("%d, eps=%g, momentum=%g, affine=%s, track_running_stats=%s", self.num_features, self.eps,
                       self.momentum, tostring(self.affine), tostring(self.track_running_stats))
end

-- Flatten([{start_dim=2, end_dim=-1}]): dims start_dim..end_dim (1-based, negative
-- from the end) merged into one: {n, c, h, w} -> {n, c*h*w} by default (PyTorch's
-- Flatten(1, -1) in its 0-based dims)
local Flatten = Module:extend("Flatten")
nn.Flatten = Flatten

function Flatten:init(opts)
  opts = check_opts("mp.nn.Flatten", opts, { start_dim = 2, end_dim = -1 })
  self.start_dim, self.end_dim = opts.start_dim, opts.end_dim
end

function Flatten:forward(x)
  local n = #x.shape
  local s = self.start_dim < 0 and n + 1 + self.start_dim or self.start_dim
  local e = self.end_dim < 0 and n + 1 + self.end_dim or self.end_dim
  if s < 1 or e > n or s > e then
    raise(string.format("mp.nn.Flatten: dims %d..%d do not fit a %d-d input", self.start_dim, self.end_dim, n))
  end
  local shape, merged = {}, 1
  for d = 1, s - 1 do shape[#shape + 1] = x.shape[d] end
  for d = s, e do merged = merged * x.shape[d] end
  shape[#shape + 1] = merged
  for d = e + 1, n do shape[#shape + 1] = x.shape[d] end
  return x:reshape(shape)
end

function Flatten:extra_repr() return string.format("start_dim=%d, end_dim=%d", self.start_dim, self.end_dim) end

return nn
