-- mp.autograd.gradcheck and gradgradcheck, as PyTorch's: an op's analytical
-- gradients (its backward, through mp.autograd.grad) against central finite
-- differences of its forward, element by element of the Jacobian.
--
-- For each input that requires grad, each of its elements v is moved to v + eps
-- and v - eps (new tensors; the inputs are never written) and the outputs are
-- evaluated: column (out - out') / (2 eps) of the numerical
-- Jacobian. Each row of the analytical one is mp.autograd.grad of one output
-- element (grad_outputs a one-hot) with respect to every input. They must agree
-- entry by entry: |analytical - numerical| <= atol + rtol * |numerical|.
-- Use f64 inputs: in f32 the differences round at ~1e-7 / eps.
--
-- gradgradcheck checks the gradients' own gradients: it runs gradcheck on
--   (inputs..., grad_outputs...) -> mp.autograd.grad(fn(inputs...), inputs,
--                                    {grad_outputs = grad_outputs, create_graph = true})
-- with random grad_outputs (requiring grad) unless they are given.
local core = require "mp.core"

local M = {}

local GC, GGC = "mp.autograd.gradcheck", "mp.autograd.gradgradcheck"

local function is_tensor(v) return getmetatable(v) == getmetatable(core.zeros({ 1 })) end

local function flat(t) return t:detach():reshape({ t:numel() }):totable() end

-- fn's results as a list of tensors
local function outputs_of(name, ...)
  local outs = table.pack(...)
  if outs.n == 1 and type(outs[1]) == "table" and not is_tensor(outs[1]) then outs = outs[1] end
  local r = {}
  for i = 1, outs.n or #outs do
    if not is_tensor(outs[i]) then
      error(string.format("%s: fn's result %d is %s (expected tensors)", name, i, type(outs[i])), 4)
    end
    r[#r + 1] = outs[i]
  end
  if #r == 0 then error(name .. ": fn returned no tensor", 4) end
  return r
end

local function input_list(name, inputs)
  if is_tensor(inputs) then return { inputs } end
  if type(inputs) ~= "table" then
    error(string.format("%s: inputs must be a tensor or a list (got %s)", name, type(inputs)), 3)
  end
  return inputs
end

local function options(name, opts, extra)
  core._options(name, opts, "eps:number atol:number rtol:number raise_exception:boolean" .. (extra or ""), 4)
  opts = opts or {}
  local o = { eps = opts.eps or 1e-6, atol = opts.atol or 1e-5, rtol = opts.rtol or 1e-3,
              raise = opts.raise_exception ~= false }
  if not (o.eps > 0) then error(name .. ": eps must be positive", 3) end
  if not (o.atol >= 0 and o.rtol >= 0) then error(name .. ": atol and rtol must be >= 0", 3) end
  return o, opts
end

local function differentiable(inputs)
  local d = {}
  for i, v in ipairs(inputs) do
    if is_tensor(v) and v:requires_grad() then d[#d + 1] = i end
  end
  return d
end

-- the numerical Jacobian of every output with respect to input i:
-- J[o][k][e] = d out_o[e] / d x_i[k]
local function numerical(fn, inputs, i, eps, nouts)
  local x = inputs[i]
  local vals, shape, n = flat(x), x.shape, x:numel()
  local J = {}
  for o = 1, nouts do J[o] = {} end
  local args = {}
  for k = 1, #inputs do args[k] = inputs[k] end
  local function eval(k, delta)
    local v = table.move(vals, 1, n, 1, {})
    v[k] = v[k] + delta
    -- a new leaf that requires grad as x does: fn may differentiate it (gradgradcheck's does)
    args[i] = core.tensor(v, { dtype = x.dtype, device = x.device }):reshape(shape):detach():requires_grad(true)
    local outs = outputs_of(GC, fn(table.unpack(args, 1, #inputs)))
    local r = {}
    for o = 1, nouts do r[o] = flat(outs[o]) end
    return r
  end
  for k = 1, n do
    local plus, minus = eval(k, eps), eval(k, -eps)
    for o = 1, nouts do
      local col = {}
      for e = 1, #plus[o] do col[e] = (plus[o][e] - minus[o][e]) / (2 * eps) end
      J[o][k] = col
    end
  end
  return J
end

-- the analytical Jacobians: A[o][i][k][e] = d out_o[e] / d x_i[k] for the
-- differentiable inputs (index list d)
local function analytical(outs, inputs, d)
  local xs = {}
  for j, i in ipairs(d) do xs[j] = inputs[i] end
  local A = {}
  for o, out in ipairs(outs) do
    A[o] = {}
    for j = 1, #d do A[o][j] = {} end
    local m = out:numel()
    if out:requires_grad() then
      for e = 1, m do
        local onehot = {}
        for q = 1, m do onehot[q] = q == e and 1 or 0 end
        local go = core.tensor(onehot, { dtype = out.dtype, device = out.device }):reshape(out.shape)
        local g = core._autograd_grad(out, xs, { grad_outputs = go, retain_graph = true, allow_unused = true })
        for j = 1, #d do
          local gv = g[j] and flat(g[j]) or nil
          for k = 1, xs[j]:numel() do
            A[o][j][k] = A[o][j][k] or {}
            A[o][j][k][e] = gv and gv[k] or 0
          end
        end
      end
    else   -- an output that does not require grad: its Jacobian is zero
      for j = 1, #d do
        for k = 1, xs[j]:numel() do
          A[o][j][k] = {}
          for e = 1, m do A[o][j][k][e] = 0 end
        end
      end
    end
  end
  return A
end

local function check(name, fn, inputs, o)
  local d = differentiable(inputs)
  if #d == 0 then error(name .. ": no input requires grad: nothing to check", 3) end
  local outs = outputs_of(name, fn(table.unpack(inputs)))
  for k, out in ipairs(outs) do
    if out.dtype ~= "f64" and out.dtype ~= "f32" and out.dtype ~= "f16" and out.dtype ~= "bf16" then
      error(string.format("%s: output %d is %s (expected a float tensor)", name, k, out.dtype), 3)
    end
  end
  local A = analytical(outs, inputs, d)
  for j, i in ipairs(d) do
    local N = numerical(fn, inputs, i, o.eps, #outs)
    for oi = 1, #outs do
      for k = 1, inputs[i]:numel() do
        for e = 1, outs[oi]:numel() do
          local a, n = A[oi][j][k][e], N[oi][k][e]
          if not (math.abs(a - n) <= o.atol + o.rtol * math.abs(n)) then
            if not o.raise then return false end
            error(string.format("%s: Jacobian mismatch for output %d with respect to input %d, at output element "
                                .. "%d and input element %d: numerical %.10g, analytical %.10g (atol %g, rtol %g)",
                                name, oi, i, e, k, n, a, o.atol, o.rtol), 3)
          end
        end
      end
    end
  end
  return true
end

--- mp.autograd.gradcheck(fn, inputs [, {eps = 1e-6, atol = 1e-5, rtol = 1e-3, raise_exception = true}])
-- true, or an error naming the output, the input and the entry that disagree
-- (false instead with raise_exception = false)
function M.gradcheck(fn, inputs, opts)
  if type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    error(string.format("%s: fn must be a function (got %s)", GC, type(fn)), 2)
  end
  local o = options(GC, opts)
  return check(GC, fn, input_list(GC, inputs), o)
end

--- mp.autograd.gradgradcheck(fn, inputs [, {grad_outputs =, eps =, atol =, rtol =, raise_exception =}])
function M.gradgradcheck(fn, inputs, opts)
  if type(fn) ~= "function" and not (getmetatable(fn) or {}).__call then
    error(string.format("%s: fn must be a function (got %s)", GGC, type(fn)), 2)
  end
  local o, raw = options(GGC, opts, " grad_outputs:any")
  inputs = input_list(GGC, inputs)
  local d = differentiable(inputs)
  if #d == 0 then error(GGC .. ": no input requires grad: nothing to check", 2) end
  local outs = outputs_of(GGC, fn(table.unpack(inputs)))
  local gos = raw.grad_outputs
  if gos == nil then
    gos = {}
    for k, out in ipairs(outs) do
      gos[k] = core.randn(out.shape, { dtype = out.dtype, device = out.device, requires_grad = true })
    end
  elseif is_tensor(gos) then
    gos = { gos }
  end
  if #gos ~= #outs then
    error(string.format("%s: grad_outputs has %d tensors for %d outputs", GGC, #gos, #outs), 2)
  end
  local n = #inputs
  local all = {}
  for k = 1, n do all[k] = inputs[k] end
  for k = 1, #gos do all[n + k] = gos[k] end
  local function grads(...)
    local args = table.pack(...)
    local xs = {}
    for j, i in ipairs(d) do xs[j] = args[i] end
    local go = {}
    for k = 1, #gos do go[k] = args[n + k] end
    local g = core._autograd_grad(outputs_of(GGC, fn(table.unpack(args, 1, n))), xs,
                                  { grad_outputs = go, create_graph = true, allow_unused = true })
    local r = {}
    for j = 1, #d do
      if g[j] then r[#r + 1] = g[j] end
    end
    return r
  end
  return check(GGC, grads, all, o)
end

return M
