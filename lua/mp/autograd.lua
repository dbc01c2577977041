-- mp.autograd: autograd Functions written in Lua (as torch.autograd.Function),
-- and the autograd functions of the C module: every mp.core field named
-- _autograd_<x> appears here as <x> (grad, gradcheck, detect_anomaly, ...).
--
--   local swish = mp.autograd.Function {
--     name = "swish",
--     forward = function(ctx, x, beta)
--       local s = mp.sigmoid(x * beta)
--       ctx:save_for_backward(x, s)
--       ctx.beta = beta
--       return x * s
--     end,
--     backward = function(ctx, gy)
--       local x, s = table.unpack(ctx.saved_tensors)
--       return gy * s * (1 + ctx.beta * x * (1 - s)), nil
--     end,
--   }
--   local y = swish(x, 1.5)            -- or swish:apply(x, 1.5)
--
-- The forward runs with grad mode off; the call's tensor outputs get one node
-- (engine/custom.h) whose backward calls the Lua backward with one gradient per
-- forward result (zeros for a tensor no gradient reached, nil for a non-tensor),
-- which returns one gradient per forward argument. lua/lfunction.c is the C half.
local core = require "mp.core"

local M = {}
for k, v in pairs(core) do
  local name = type(k) == "string" and k:match("^_autograd_(.+)$")
  if name then M[name] = v end
end

local tensor_mt
local function is_tensor(x)
  if type(x) ~= "userdata" then return false end
  tensor_mt = tensor_mt or getmetatable(core.zeros { 1 })
  return getmetatable(x) == tensor_mt
end

local FLOAT = { f16 = true, bf16 = true, f32 = true, f64 = true }

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "number" or type(v) == "boolean" or v == nil then return tostring(v) end
  return is_tensor(v) and "a tensor" or "a " .. type(v)
end

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

---------------------------------------------------------------- ctx

-- what a ctx holds for the machinery, out of the user's namespace
local private = setmetatable({}, { __mode = "k" })

local Ctx = {}

-- ctx:save_for_backward(t, ...): tensors (nil allowed) for ctx.saved_tensors in
-- the backward; kept by the node, freed when the node runs
function Ctx:save_for_backward(...)
  local p = private[self]
  if not p or not p.forward then error("ctx:save_for_backward: only in a Function's forward", 2) end
  local saved = table.pack(...)
  for i = 1, saved.n do
    if saved[i] ~= nil and not is_tensor(saved[i]) then
      error(string.format("ctx:save_for_backward: argument %d is %s (expected a tensor or nil)", i, show(saved[i])), 2)
    end
  end
  p.saved = saved
end

-- ctx:mark_non_differentiable(t, ...): these outputs of the forward do not
-- require grad; the backward still gets a gradient for each (zeros)
function Ctx:mark_non_differentiable(...)
  local p = private[self]
  if not p or not p.forward then error("ctx:mark_non_differentiable: only in a Function's forward", 2) end
  for i = 1, select("#", ...) do
    local t = select(i, ...)
    if not is_tensor(t) then
      error(string.format("ctx:mark_non_differentiable: argument %d is %s (expected a tensor)", i, show(t)), 2)
    end
    p.nondiff[t] = true
  end
end

local CtxMT = {
  __name = "mp.autograd.ctx",
  __index = function(_, k)
    if Ctx[k] then return Ctx[k] end
    if k == "saved_tensors" then error("ctx.saved_tensors: only in a Function's backward", 2) end
    return nil
  end,
}

---------------------------------------------------------------- backward

local function where(f)
  local info = debug.getinfo(f, "S")
  return info.short_src .. ":" .. info.linedefined
end

-- the position of the innermost Lua code below an error (a C function's error
-- has none of its own), as "file:line"
local function error_position()
  for level = 3, 200 do
    local info = debug.getinfo(level, "Sl")
    if not info then break end
    if info.what ~= "C" and info.currentline and info.currentline > 0 then
      return info.short_src .. ":" .. info.currentline
    end
  end
  return nil
end

local function backward_failed(msg)
  msg = tostring(msg)
  local pos = error_position()
  if pos and msg:sub(1, #pos + 1) == pos .. ":" then msg = msg:sub(#pos + 3) end
  return { pos = pos, msg = msg }
end

-- called by lua/lfunction.c when the node runs: (record, saved, one gradient per
-- tensor output) -> {gradient per tensor input}
local function run_backward(record, saved, ...)
  local F, ctx = record.F, record.ctx
  local head = string.format("mp.autograd.Function '%s': backward", F.name)
  local g = {}
  for j, pos in ipairs(record.opos) do g[pos] = select(j, ...) end
  rawset(ctx, "saved_tensors", saved)
  local ok, res = xpcall(function() return table.pack(F.backward(ctx, table.unpack(g, 1, record.nres))) end,
                         backward_failed)
  rawset(ctx, "saved_tensors", nil)
  if not ok then
    error(string.format("%s failed at %s: %s", head, res.pos or "?", res.msg), 0)
  end
  head = head .. " (defined at " .. where(F.backward) .. ")"
  local nargs = record.nargs
  local last = res.n
  while last > nargs and res[last] == nil do last = last - 1 end
  if res.n < nargs or last > nargs then
    error(string.format("%s returned %d gradient%s for %d forward argument%s", head, res.n, res.n == 1 and "" or "s",
                        nargs, nargs == 1 and "" or "s"), 0)
  end
  local out = {}
  for i = 1, nargs do
    local gi, ti = res[i], record.tindex[i]
    if gi ~= nil then
      if not ti then
        error(string.format("%s: gradient %d must be nil (forward argument %d is %s)", head, i, i,
                            record.kinds[i]), 0)
      end
      if not is_tensor(gi) then
        error(string.format("%s: gradient %d is %s (expected a tensor or nil)", head, i, show(gi)), 0)
      end
      if not same_shape(gi.shape, record.shapes[ti]) then
        error(string.format("%s: gradient %d has shape %s, but forward argument %d has shape %s", head, i,
                            shape_str(gi.shape), i, shape_str(record.shapes[ti])), 0)
      end
      out[ti] = gi
    end
  end
  return out
end

---------------------------------------------------------------- apply

local function run_forward(F, ctx, cast, args)
  local _ <close> = core.no_grad()
  local _ac <close> = cast and core._autocast(false) or nil
  return table.pack(F.forward(ctx, table.unpack(args, 1, args.n)))
end

local function apply(F, ...)
  local args = table.pack(...)
  local grad_on = core.is_grad_enabled()
  local cast = false
  if F.cast_inputs and core._function_autocast() then
    cast = true   -- as PyTorch's custom_fwd: only inside an autocast region
    for i = 1, args.n do
      local a = args[i]
      if is_tensor(a) and FLOAT[a.dtype] and a.dtype ~= F.cast_inputs then args[i] = a:to(F.cast_inputs) end
    end
  end
  local needs, inputs, tindex, tpos, shapes, kinds = {}, {}, {}, {}, {}, {}
  local record_it = false
  for i = 1, args.n do
    local a = args[i]
    if is_tensor(a) then
      local j = #inputs + 1
      inputs[j], tindex[i], tpos[j], shapes[j] = a, j, i, a.shape
      needs[i] = grad_on and a:requires_grad()
      record_it = record_it or needs[i]
    else
      needs[i] = false
      kinds[i] = a == nil and "nil" or "a " .. type(a)
    end
  end
  local ctx = setmetatable({ needs_input_grad = needs }, CtxMT)
  local p = { forward = true, nondiff = {} }
  private[ctx] = p
  local results = run_forward(F, ctx, cast, args)
  p.forward = false
  local outs, opos, diff = {}, {}, {}
  for i = 1, results.n do
    local r = results[i]
    if is_tensor(r) then
      local j = #outs + 1
      outs[j], opos[j], diff[j] = r, i, not p.nondiff[r]
    end
  end
  local saved = p.saved or { n = 0 }
  p.saved, p.nondiff = nil, nil   -- the node holds the saved tensors from here on
  local record = record_it and {
    run = run_backward, F = F, ctx = ctx, nargs = args.n, nres = results.n, opos = opos,
    tindex = tindex, shapes = shapes, kinds = kinds,
  } or nil
  local fresh = core._function_record(record, F.name, inputs, outs, diff, saved, saved.n, not cast)
  for j, pos in ipairs(opos) do results[pos] = fresh[j] end
  return table.unpack(results, 1, results.n)
end

---------------------------------------------------------------- Function

local FunctionMT = {
  __name = "mp.autograd.Function",
  __call = function(F, ...) return apply(F, ...) end,
  __tostring = function(F) return "mp.autograd.Function '" .. F.name .. "'" end,
}
FunctionMT.__index = { apply = apply }

-- mp.autograd.Function{name =, forward =, backward = [, cast_inputs = dtype]}
function M.Function(def)
  local fname = "mp.autograd.Function"
  if type(def) ~= "table" then error(fname .. ": expected a table {name =, forward =, backward =} (got "
                                     .. show(def) .. ")", 2) end
  local ok, err = pcall(core._options, fname, def, "name:string forward:function backward:function cast_inputs:string", 0)
  if not ok then error(err, 2) end
  if type(def.name) ~= "string" or def.name == "" then
    error(fname .. ": name must be a non-empty string (got " .. show(def.name) .. ")", 2)
  end
  for _, k in ipairs { "forward", "backward" } do
    if type(def[k]) ~= "function" then
      error(string.format("%s '%s': %s must be a function (got %s)", fname, def.name, k, show(def[k])), 2)
    end
  end
  local cast = def.cast_inputs
  if cast ~= nil and (not FLOAT[cast] or not pcall(core.zeros, { 1 }, { dtype = cast })) then
    error(string.format("%s '%s': cast_inputs must be a float dtype (got %s)", fname, def.name, show(cast)), 2)
  end
  return setmetatable({ name = def.name, forward = def.forward, backward = def.backward, cast_inputs = cast },
                      FunctionMT)
end

local check = require "mp.autograd.gradcheck"
M.gradcheck, M.gradgradcheck = check.gradcheck, check.gradgradcheck
M._is_tensor = is_tensor   -- for mp's own Lua files (mp.fp8's option checks)

return M
