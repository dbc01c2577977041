-- double_backward_spec.lua: second derivatives (create_graph) of the unary
-- ops, matmul and linear, narrow, select, index_select, tril/triu,
-- masked_fill, where, the GradScaler's scale and mixed-dtype arithmetic; the
-- first-order backward they keep when no graph is built.
--
-- Each op is checked two ways, in f32:
--   * H v against differences of first derivatives: for a scalar f(xs),
--     g = grad(f, xs, {create_graph = true}) and Hv = grad(sum_k g_k v_k, xs) for
--     random directions v, against the central differences
--     D(h) = (grad f(xs + h v) - grad f(xs - h v)) / 2h at h = 1e-2 and 2e-2,
--     extrapolated (Richardson): (4 D(h) - D(2h)) / 3.
--     Error budget, inputs of size <= 2 (log, sqrt, rdiv and fractional powers
--     on [0.5, 2]): the extrapolation's truncation is O(h^4 |f^(6)|) < 3e-6
--     (log's 120/x^6 at 0.5 is the largest, 7.7e3); the gradients' f32
--     rounding, a few ulps of |g| (<= 5e-6 for |g| <= 20), enters as
--     1.5 * 5e-6 / h = 7.5e-4 at worst; x +- h v rounded to f32 (half an ulp of
--     2 against a step of 1e-2 |v|): 1e-5 relative. Tolerance 1e-3 absolute +
--     1e-3 relative; the largest error measured over these cases and four
--     seeds was 1.4e-4 of 1 + |Hv|. A wrong second derivative (a missing term,
--     a sign, a factor) is off by O(|Hv|), 0.1 to 10 here. (A plain central
--     difference, O(h^2), was off by up to 3e-3 on the quartic products.)
--   * mp.autograd.gradgradcheck (PyTorch's semantics: the Jacobian of
--     (inputs, grad_outputs) -> grad, entry by entry), with f32's step and
--     tolerances (eps 1e-2, atol = rtol = 2e-2, as gradcheck_spec's).
-- plus exact checks where the second derivative is simple (x^3's 6x, relu's 0,
-- exp's exp). f64 will tighten both (issue 26: the lead moves them there).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local grad = mp.autograd.grad

local STEP, ATOL, RTOL = 1e-2, 1e-3, 1e-3
local GG = { eps = 1e-2, atol = 2e-2, rtol = 2e-2 }

local function leaf(t) return t:detach():requires_grad(true) end
local function in_use() collectgarbage(); collectgarbage(); return mp.memory("cpu").in_use end

-- the first derivatives of f at xs (a list), with or without a graph
local function first(f, xs, create)
  return grad(f(table.unpack(xs)), xs, { create_graph = create, allow_unused = true })
end

-- H v from the graph (nil entries: no dependence, zeros)
local function hvp(f, xs, vs)
  local g, s = first(f, xs, true), nil
  for k = 1, #xs do
    if g[k] and g[k]:requires_grad() then
      local term = (g[k] * vs[k]):sum()
      s = s and s + term or term
    end
  end
  assert(s, "no first derivative depends on the inputs")
  return grad(s, xs, { allow_unused = true })
end

-- central differences of the first derivatives along vs, with step h
local function central(f, xs, vs, h)
  local plus, minus = {}, {}
  for k = 1, #xs do
    plus[k] = leaf(xs[k]:detach() + vs[k] * h)
    minus[k] = leaf(xs[k]:detach() - vs[k] * h)
  end
  local gp, gm = first(f, plus, false), first(f, minus, false)
  local r = {}
  for k = 1, #xs do
    local fa = gp[k] and H.flat(gp[k]:to("f32"):totable()) or {}
    local fb = gm[k] and H.flat(gm[k]:to("f32"):totable()) or {}
    local d = {}
    for i = 1, xs[k]:numel() do d[i] = ((fa[i] or 0) - (fb[i] or 0)) / (2 * h) end
    r[k] = d
  end
  return r
end

-- H v by differences of the first derivatives along vs: Richardson's
-- extrapolation of the central differences at steps 2h and h, (4 D(h) - D(2h)) / 3,
-- whose error is O(h^4)
local function hvp_fd(f, xs, vs)
  local d1, d2 = central(f, xs, vs, STEP), central(f, xs, vs, 2 * STEP)
  for k = 1, #xs do
    for i = 1, #d1[k] do d1[k][i] = (4 * d1[k][i] - d2[k][i]) / 3 end
  end
  return d1
end

-- H v of f at xs along random directions, against central differences
local function check_hvp(what, f, xs)
  local vs = {}
  for k = 1, #xs do vs[k] = mp.randn(xs[k].shape) end
  local hv, fd = hvp(f, xs, vs), hvp_fd(f, xs, vs)
  for k = 1, #xs do
    local got = hv[k] and H.flat(hv[k]:to("f32"):totable()) or {}
    for i = 1, #fd[k] do got[i] = got[i] or 0 end
    H.assert_close(got, fd[k], RTOL, ATOL, what .. ": H v, input " .. k)
  end
end

-- values in [lo, hi), away from 0 by at least `gap` when the range holds 0
local function values(shape, lo, hi, gap)
  local u = mp.rand(shape) * (hi - lo) + lo
  if gap then u = mp.where(u:abs():lt(gap), u + 2 * gap, u) end
  return leaf(u)
end

-- each unary op, as a function of x, and its inputs' range
local UNARY = {
  { "neg", function(x) return -x end, linear = true },
  { "abs", function(x) return x:abs() end, gap = 0.2 },
  { "exp", function(x) return x:exp() end },
  { "log", function(x) return x:log() end, lo = 0.5 },
  { "sqrt", function(x) return x:sqrt() end, lo = 0.5 },
  { "pow 3", function(x) return x:pow(3) end },
  { "pow 2", function(x) return x:pow(2) end },
  { "pow 2.5", function(x) return x:pow(2.5) end, lo = 0.5 },
  { "pow -1.5", function(x) return x:pow(-1.5) end, lo = 0.5 },
  { "mul by a scalar", function(x) return x * 3 end, linear = true },
  { "add a scalar", function(x) return x + 2 end, linear = true },
  { "rsub", function(x) return 2 - x end, linear = true },
  { "div by a scalar", function(x) return x / 4 end, linear = true },
  { "rdiv", function(x) return 2 / x end, lo = 0.5 },
  { "relu", function(x) return mp.relu(x) end, gap = 0.2 },
  { "tanh", function(x) return mp.tanh(x) end },
  { "sigmoid", function(x) return mp.sigmoid(x) end },
  { "gelu (erf)", function(x) return mp.gelu(x) end },
  { "gelu (tanh)", function(x) return mp.gelu(x, { approximate = "tanh" }) end },
  { "silu", function(x) return mp.silu(x) end },
}

describe("second derivatives of the unary ops", function()
  for _, case in ipairs(UNARY) do
    local name, op = case[1], case[2]
    it(name .. ": H v against differences of gradients, and gradgradcheck", function()
      mp.manual_seed(7)
      local x = values({ 2, 3 }, case.lo or -2, case.lo and 2 or 2, case.gap)
      local w = mp.randn({ 2, 3 })
      -- op(x)^2 weighted: the op's backward gets a gradient that depends on x
      -- (2 w op(x)), so both its derivatives, in g and in x, are exercised
      check_hvp(name, function(a) local y = op(a); return (y * y * w):sum() end, { x })
      if case.linear then   -- its gradient is a constant: no graph, as in PyTorch
        assert.is_false(grad((op(x) * w):sum(), x, { create_graph = true }):requires_grad())
      else
        check_hvp(name .. " alone", function(a) return (op(a) * w):sum() end, { x * 1 }) -- a non-leaf input too
      end
      assert.is_true(mp.autograd.gradgradcheck(op, { x }, GG))
    end)
  end

  it("exact where the second derivative is simple: x^3's 6x, relu's 0, exp's exp", function()
    local x = leaf(mp.tensor({ 1, 2, -3 }))
    local g = grad(x:pow(3):sum(), x, { create_graph = true })
    H.assert_same(g:totable(), { 3, 12, 27 }, "3 x^2")
    H.assert_same(grad(g:sum(), x):totable(), { 6, 12, -18 }, "6 x")
    local r = grad((mp.relu(x) * x):sum(), x, { create_graph = true })   -- relu(x) + x relu'(x)
    assert.is_true(r:requires_grad())
    H.assert_same(grad(r:sum(), x):totable(), { 2, 2, 0 }, "relu's own second derivative adds nothing")
    local rg = grad(mp.relu(x):sum(), x, { create_graph = true })
    assert.is_true(rg:requires_grad(), "relu's gradient depends on x, with derivative 0 (PyTorch's too)")
    H.assert_same(grad(rg:sum(), x):totable(), { 0, 0, 0 }, "relu''")
    local y = leaf(mp.tensor({ 0.5, -1.25, 2 }))
    local e = grad(y:exp():sum(), y, { create_graph = true })
    H.assert_same(grad(e:sum(), y):totable(), y:exp():totable(), "exp''")
  end)

  it("gives the plain backward's first derivative: the same kernel for relu, abs and gelu, bit for bit", function()
    mp.manual_seed(3)
    for _, dt in ipairs({ "f32", "bf16", "f16" }) do
      local x = leaf(mp.randn({ 64 }):to(dt))
      local go = mp.randn({ 64 }):to(dt)
      for _, op in ipairs({ mp.relu, function(a) return a:abs() end, mp.gelu,
                            function(a) return mp.gelu(a, { approximate = "tanh" }) end }) do
        local plain = grad(op(x), x, { grad_outputs = go })
        local graph = grad(op(x), x, { grad_outputs = go, create_graph = true })
        assert.is_true(graph:requires_grad())
        H.assert_same(graph:to("f32"):totable(), plain:to("f32"):totable(), dt)
      end
      -- the others agree to the rounding of their steps
      for _, op in ipairs({ mp.tanh, mp.sigmoid, mp.silu, function(a) return a:exp() end }) do
        local plain = grad(op(x), x, { grad_outputs = go })
        local graph = grad(op(x), x, { grad_outputs = go, create_graph = true })
        local tol = dt == "f32" and 1e-6 or 2e-2
        H.assert_close(graph:to("f32"):totable(), plain:to("f32"):totable(), tol, tol, dt)
      end
    end
  end)

  it("third derivatives through gelu's and relu's backward ops", function()
    local x = leaf(mp.tensor({ 0.5, -1.0, 1.5 }))
    for _, approximate in ipairs({ "none", "tanh" }) do
      local f = function(a) return (mp.gelu(a, { approximate = approximate }) * mp.tensor({ 1, 2, 3 })):sum() end
      local g1 = grad(f(x), x, { create_graph = true })
      local g2 = grad(g1:sum(), x, { create_graph = true })
      local g3 = grad(g2:sum(), x)
      -- against differences of the second derivative
      local function second(a) local b = leaf(a); return grad(grad(f(b), b, { create_graph = true }):sum(), b) end
      local d = (second(x:detach() + STEP) - second(x:detach() - STEP)) / (2 * STEP)
      H.assert_close(g3:totable(), d:totable(), RTOL, 3 * ATOL, "gelu''' " .. approximate)
    end
  end)

  it("the second-order graphs are freed with their last tensor", function()
    local x = leaf(mp.randn({ 16 }))
    local before = in_use()
    for _, case in ipairs(UNARY) do
      local xin = case.lo and x:abs() + 0.5 or x
      local g = grad((case[2](xin) * case[2](xin)):sum(), x, { create_graph = true })
      grad((g * g):sum(), x)
    end
    assert.are.equal(before, in_use())
  end)
end)

describe("second derivatives of matmul and linear", function()
  local function sq(w) return function(y) return (y * y * w):sum() end end
  local MATMUL = {
    { "2-d @ 2-d", { 2, 3 }, { 3, 4 } }, { "3-d @ 2-d (one GEMM over all rows)", { 2, 2, 3 }, { 3, 4 } },
    { "2-d @ 3-d", { 2, 3 }, { 2, 3, 4 } }, { "3-d @ 3-d", { 2, 2, 3 }, { 2, 3, 4 } },
    { "vector @ 2-d", { 3 }, { 3, 4 } }, { "4-d broadcast @ 3-d", { 2, 1, 2, 3 }, { 3, 3, 2 } },
  }
  for _, case in ipairs(MATMUL) do
    it("matmul " .. case[1], function()
      mp.manual_seed(11)
      local a, b = leaf(mp.randn(case[2])), leaf(mp.randn(case[3]))
      local w = mp.randn(mp.matmul(a, b).shape)
      local f = sq(w)
      check_hvp("matmul " .. case[1], function(x, y) return f(mp.matmul(x, y)) end, { a, b })
      assert.is_true(mp.autograd.gradgradcheck(function(x, y) return mp.matmul(x, y) end, { a, b }, GG))
    end)
  end

  for _, case in ipairs({ { "2-d input with bias", { 2, 3 }, true }, { "3-d input with bias", { 2, 2, 3 }, true },
                          { "1-d input, no bias", { 3 }, false } }) do
    it("linear, " .. case[1], function()
      mp.manual_seed(12)
      local x, w = leaf(mp.randn(case[2])), leaf(mp.randn({ 4, 3 }))
      local b = case[3] and leaf(mp.randn({ 4 })) or nil
      local wt = mp.randn(mp.linear(x, w, b).shape)
      local f = sq(wt)
      local xs = b and { x, w, b } or { x, w }
      check_hvp("linear " .. case[1], function(p, q, r) return f(mp.linear(p, q, r)) end, xs)
      assert.is_true(mp.autograd.gradgradcheck(function(p, q, r) return mp.linear(p, q, r) end, xs, GG))
    end)
  end

  it("linear's first derivative with a graph agrees with the plain one", function()
    mp.manual_seed(13)
    local x, w, b = leaf(mp.randn({ 5, 3 })), leaf(mp.randn({ 4, 3 })), leaf(mp.randn({ 4 }))
    local go = mp.randn({ 5, 4 })
    local plain = grad(mp.linear(x, w, b), { x, w, b }, { grad_outputs = go })
    local graph = grad(mp.linear(x, w, b), { x, w, b }, { grad_outputs = go, create_graph = true })
    for k = 1, 3 do H.assert_close(graph[k]:totable(), plain[k]:totable(), 1e-6, 1e-6, "input " .. k) end
  end)
end)

describe("second derivatives of selecting and masking", function()
  local mask = mp.tensor({ { 1, 0, 0, 1 }, { 0, 1, 0, 0 }, { 1, 1, 0, 0 } }):to("u8")
  local SELECT = {
    { "narrow along dim 2 (a copy)", function(x) return x:narrow(2, 2, 2) end },
    { "narrow along dim 1 (a view)", function(x) return x:narrow(1, 2, 2) end },
    { "select", function(x) return x:select(2, 3) end },
    { "index_select, an index repeated", function(x) return x:index_select(1, mp.tensor({ 0, 2, 2 }):to("i32")) end },
    { "tril", function(x) return x:tril() end },
    { "triu", function(x) return x:triu(1) end },
    { "masked_fill", function(x) return x:masked_fill(mask, 5) end },
    { "where", function(x) return mp.where(mask, x, x * x) end },
  }
  for _, case in ipairs(SELECT) do
    it(case[1], function()
      mp.manual_seed(17)
      local x = leaf(mp.randn({ 3, 4 }))
      local w = mp.randn(case[2](x).shape)
      check_hvp(case[1], function(a) local y = case[2](a); return (y * y * w):sum() end, { x })
      assert.is_true(mp.autograd.gradgradcheck(case[2], { x }, GG))
    end)
  end
end)

describe("the GradScaler's scale under create_graph", function()
  it("differentiates scale(loss)'s gradient: the gradient penalty's H v is scale times the unscaled one", function()
    mp.manual_seed(19)
    local x, v = leaf(mp.randn({ 4 })), mp.randn({ 4 })
    local f = function(a) return (mp.tanh(a) * a):sum() end
    local scaler = mp.amp.GradScaler{ policy = mp.amp.policy.static(1024) }
    local g = grad(scaler:scale(f(x)), x, { create_graph = true })
    assert.is_true(g:requires_grad())
    local hv = grad((g * v):sum(), x)
    local ref = grad((grad(f(x), x, { create_graph = true }) * v):sum(), x)
    H.assert_same(hv:totable(), (ref * 1024):totable(), "a power of two scales exactly")
    check_hvp("scale", function(a) return scaler:scale(f(a)) end, { x })
    -- the penalty's own gradient (through the scaled gradient) reaches a weight
    local w = leaf(mp.tensor({ 0.5, -1, 2, 0.25 }))
    local gw = grad(scaler:scale((mp.tanh(x * w)):sum()), w, { create_graph = true })
    local penalty = (gw * gw):sum() / (1024 * 1024)   -- unscaled by hand
    local plain = grad((mp.tanh(x * w)):sum(), w, { create_graph = true })
    H.assert_close(grad(penalty, w):totable(), grad((plain * plain):sum(), w):totable(), 1e-6, 1e-7)
  end)
end)

describe("arithmetic of mixed dtypes", function()
  it("keeps the gradient through a promoted input: d/dy of d(x y)/dx is the direction", function()
    local x = leaf(mp.tensor({ 1, 2, 3 }))
    local y = leaf(mp.tensor({ 0.5, 0.25, 4 }):to("bf16"))
    local gx = grad((x * y):sum(), x, { create_graph = true })   -- y, in f32
    H.assert_same(gx:totable(), { 0.5, 0.25, 4 })
    local gy = grad((gx * mp.tensor({ 1, 2, 3 })):sum(), y)
    assert.are.equal("bf16", gy.dtype)
    H.assert_same(gy:to("f32"):totable(), { 1, 2, 3 }, "through the cast of y")
    -- a quotient: d/dy (x / y) = -x / y^2, whose derivative in y is 2 x / y^3
    local gq = grad((x / y):sum(), y, { create_graph = true })
    H.assert_close(grad(gq:sum(), y):to("f32"):totable(), { 16, 256, 0.09375 }, 1e-2, 0)
  end)

  it("the graph of a product holds the inputs, not a cast copy of one", function()
    local x, y = leaf(mp.randn({ 1024 })), leaf(mp.randn({ 1024 }):to("bf16"))
    local before = in_use()
    local z = x * y   -- f32: 4096 bytes; the f32 cast of y is a temporary
    assert.are.equal(4096, in_use() - before)
    z:sum():backward()
    H.assert_close(y.grad:to("f32"):totable(), x:to("bf16"):to("f32"):totable(), 0, 0)
    local same = leaf(mp.randn({ 1024 }))
    before = in_use()
    local z2 = x * same
    assert.are.equal(4096, in_use() - before, "same dtypes: the output only, as before")
    z, z2 = nil, nil
  end)
end)
