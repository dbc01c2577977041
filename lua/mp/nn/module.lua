-- mp.nn.Module: the machinery every module shares. A module is a Lua table
-- whose metatable is its class; parameters, buffers and child modules live in
-- registries per instance with their names in definition order (nn.lua says
-- how they are named and declared). Here: classes (Module:extend), registration,
-- walking (parameters, children), modes and devices (train, eval, to),
-- state dicts, hooks, printing.
local core = require "mp.core"
local common = require "mp.nn.common"
common.own_file()

local is_tensor, raise, show, shape_str = common.is_tensor, common.raise, common.show, common.shape_str
local check_opts = common.check_opts

local M = {}

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
M.is_module = is_module

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
  cls.__call = function(self, ...) return M.call(self, ...) end
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
M.Module = Module

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

---------------------------------------------------------------- hooks

-- A module's hooks, as PyTorch's: each kind a list in registration order, kept
-- in the instance (rawset: not a parameter, child or buffer), absent until the
-- first one is registered, so that a call without hooks is one rawget more.
local HOOK_KINDS = { pre = "register_forward_pre_hook", fwd = "register_forward_hook",
                     bwd = "register_full_backward_hook" }

local Handle = {}
Handle.__index = Handle
Handle.__name = "mp.nn.HookHandle"
-- handle:remove(): the hook runs no more (removing it again does nothing)
function Handle:remove()
  local list = self._list
  if not list then return end
  for i = #list, 1, -1 do
    if list[i] == self._fn then table.remove(list, i) break end
  end
  self._list = nil
end

local function add_hook(self, kind, fn)
  if type(fn) ~= "function" then
    raise(string.format("mp.nn.Module:%s: hook must be a function (got %s)", HOOK_KINDS[kind], show(fn)))
  end
  local hooks = rawget(self, "_hooks")
  if not hooks then
    hooks = { pre = {}, fwd = {}, bwd = {} }
    rawset(self, "_hooks", hooks)
  end
  -- a fresh closure per registration: the same function registered twice is two hooks
  local entry = function(...) return fn(...) end
  table.insert(hooks[kind], entry)
  return setmetatable({ _list = hooks[kind], _fn = entry }, Handle)
end

-- fn(module, input...) before each forward; what it returns (anything but
-- nothing or nil) replaces the inputs
function Module:register_forward_pre_hook(fn) return add_hook(self, "pre", fn) end
-- fn(module, inputs, output...) after each forward (inputs: a table of the
-- arguments, with n); what it returns (anything but nothing or nil) replaces the output
function Module:register_forward_hook(fn) return add_hook(self, "fwd", fn) end
-- fn(module, grad_input, grad_output) when the gradients of the module's inputs
-- are computed: grad_input[i] for argument i (nil for one that is not a tensor
-- requiring grad), grad_output[j] for tensor output j; a table it returns
-- replaces grad_input
function Module:register_full_backward_hook(fn) return add_hook(self, "bwd", fn) end

-- The full backward hook wraps the module's inputs and outputs in identity
-- Functions, as PyTorch's BackwardHook does: the outputs' node runs first in the
-- backward (it was recorded last) and keeps grad_output; the inputs' node then
-- has grad_input, calls the hooks and passes on what they return. With no input
-- requiring grad the outputs' node calls them, with an empty grad_input.
local hook_fns
local function backward_hook_functions()
  if hook_fns then return hook_fns end
  local Function = require("mp.autograd").Function
  local function run_hooks(st, grad_input)
    for _, h in ipairs(st.hooks) do
      local r = h(st.module, grad_input, st.grad_output)
      if r ~= nil then
        if type(r) ~= "table" then
          error("mp.nn.Module: a full backward hook returned " .. show(r) .. " (expected a table of gradients or nil)")
        end
        grad_input = r
      end
    end
    local g = st.grad_output
    st.grad_output = nil
    for i = 1, g.n do g[i]:free() end
    return grad_input
  end
  hook_fns = {
    outputs = Function {
      name = "BackwardHookOutputs",
      forward = function(ctx, st, ...) ctx.st = st; return ... end,
      backward = function(ctx, ...)
        local st = ctx.st
        -- the gradients a backward gets are freed when it returns: the inputs'
        -- node sees grad_output through headers of its own, freed after the hooks
        local g = table.pack(...)
        for i = 1, g.n do g[i] = g[i]:detach() end
        st.grad_output = g
        if not st.has_inputs then run_hooks(st, {}) end
        return nil, ...
      end,
    },
    inputs = Function {
      name = "BackwardHookInputs",
      forward = function(ctx, st, ...) ctx.st = st; return ... end,
      backward = function(ctx, ...)
        local st = ctx.st
        local grad_input = {}
        for j, pos in ipairs(st.inpos) do grad_input[pos] = (select(j, ...)) end
        grad_input = run_hooks(st, grad_input)
        local r = { n = #st.inpos + 1 }
        for j, pos in ipairs(st.inpos) do r[j + 1] = grad_input[pos] end
        return table.unpack(r, 1, r.n)
      end,
    },
  }
  return hook_fns
end

local function copy(list)
  local r = {}
  for i, v in ipairs(list) do r[i] = v end
  return r
end

-- module(...): the pre hooks, the backward hook's input wrapper, forward, the
-- forward hooks, the backward hook's output wrapper (PyTorch's order)
function M.call(self, ...)
  local hooks = rawget(self, "_hooks")
  if not hooks or (#hooks.pre == 0 and #hooks.fwd == 0 and #hooks.bwd == 0) then return self:forward(...) end
  local args = table.pack(...)
  for _, h in ipairs(copy(hooks.pre)) do
    local r = table.pack(h(self, table.unpack(args, 1, args.n)))
    if r.n > 0 and not (r.n == 1 and r[1] == nil) then args = r end
  end
  local st
  if #hooks.bwd > 0 and core.is_grad_enabled() then
    st = { module = self, hooks = copy(hooks.bwd), inpos = {} }
    local wrap = {}
    for i = 1, args.n do
      if is_tensor(args[i]) and args[i]:requires_grad() then
        st.inpos[#st.inpos + 1] = i
        wrap[#wrap + 1] = args[i]
      end
    end
    st.has_inputs = #wrap > 0
    if st.has_inputs then
      local wrapped = table.pack(backward_hook_functions().inputs(st, table.unpack(wrap)))
      for j, pos in ipairs(st.inpos) do args[pos] = wrapped[j] end
    end
  end
  local out = table.pack(self:forward(table.unpack(args, 1, args.n)))
  for _, h in ipairs(copy(hooks.fwd)) do
    local r = table.pack(h(self, args, table.unpack(out, 1, out.n)))
    if r.n > 0 and not (r.n == 1 and r[1] == nil) then out = r end
  end
  if st then
    local outpos, wrap = {}, {}
    for i = 1, out.n do
      if is_tensor(out[i]) and out[i]:requires_grad() then
        outpos[#outpos + 1] = i
        wrap[#wrap + 1] = out[i]
      end
    end
    if #wrap > 0 then
      local wrapped = table.pack(backward_hook_functions().outputs(st, table.unpack(wrap)))
      for j, pos in ipairs(outpos) do out[pos] = wrapped[j] end
    end
  end
  return table.unpack(out, 1, out.n)
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

return M
