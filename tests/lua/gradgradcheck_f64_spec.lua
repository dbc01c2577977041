-- gradgradcheck_f64_spec.lua: first and second derivatives of the ops issue 26
-- lists (item 3), checked against finite differences in f64 with PyTorch's
-- own defaults: mp.autograd.gradcheck and mp.autograd.gradgradcheck at eps 1e-6,
-- atol 1e-5, rtol 1e-3, entry by entry of the Jacobians.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/gradgradcheck_f64_spec.lua
--
-- Why these tolerances hold in f64: a central difference at eps 1e-6 has a
-- truncation error eps^2 |f'''| / 6 ~ 1e-13 and a rounding error ~ 1e-16 |f| /
-- 1e-6 ~ 1e-10 on the O(1) values used here, five orders under atol. A wrong
-- formula (a missing term, a factor, a sign, a step through f32) is off by
-- O(1), or by f32's 6e-8 relative / 1e-6 = 6e-2 where a backward rounds to
-- f32: both fail. Inputs stay away from kinks (relu's 0) and poles (log, sqrt,
-- /, fractional powers: positive and >= 0.5), as PyTorch's tests keep theirs.
--
-- gradgradcheck differentiates (inputs, grad_outputs) -> grad(fn, inputs,
-- {grad_outputs, create_graph = true}): every gradient formula must itself be
-- recorded in f64. gradcheck checks the first derivatives on their own. The
-- other ops whose backward is built for create_graph are checked the same way
-- (narrow, select, index_select, cat, tril/triu, masked_fill, where, abs,
-- clone, dropout, the GradScaler's scale); max, topk and sort have first
-- derivatives only, and a second one raises naming the op.
--
-- The casts autocast inserts (f32 <-> f16/bf16, and f64 -> f32 -> f64 here):
-- a round trip through a narrower type is not differentiable at eps 1e-6 (the
-- step is lost to its rounding, and the backward rounds the incoming gradient
-- too). They are checked where they are exact: inputs and grad_outputs drawn
-- from {0.5, 0.75, 1, 1.25, 1.5} (at most 3 significant bits), eps = 2^-4 (so
-- every x +- eps has at most 5 bits and every product of two values here at
-- most 8: exact in bf16, f16 and f32), atol and rtol PyTorch's. The functions
-- around the casts are at most quadratic, so the central difference at that
-- eps has no truncation error either: any difference is a wrong formula (a
-- cast's backward that returns the wrong dtype, drops or doubles a gradient).
--
-- f64 lives on the CPU (CUDA declines it): every tensor here is made there,
-- whatever MP_DEVICE says.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local gradcheck, gradgradcheck = mp.autograd.gradcheck, mp.autograd.gradgradcheck

local CPU = { dtype = "f64", device = "cpu" }

-- PyTorch's defaults, spelled out so that a change of mp's defaults shows here
local DEFAULT = { eps = 1e-6, atol = 1e-5, rtol = 1e-3 }

-- an f64 leaf on the CPU that requires grad:
--   X(shape)              N(0, 1)
--   X(shape, lo, hi)      uniform in [lo, hi]
--   X(shape, "away", m)   N(0, 1) pushed at least m away from 0
local function X(shape, lo, hi)
  local t
  if lo == nil then
    t = mp.randn(shape, CPU)
  elseif lo == "away" then
    local v = H.flat(mp.randn(shape, CPU):totable())
    for i = 1, #v do v[i] = v[i] + (v[i] < 0 and -hi or hi) end
    t = mp.tensor(H.nest(v, shape), CPU)
  else
    t = mp.rand(shape, CPU) * (hi - lo) + lo
  end
  return t:detach():requires_grad(true)
end

local function I32(list) return mp.tensor(list, { dtype = "i32", device = "cpu" }) end

-- both checks of fn at xs, at PyTorch's defaults
local function check(fn, xs, what)
  local ok, err = pcall(gradcheck, fn, xs, DEFAULT)
  if not ok then error(what .. ": first derivatives: " .. tostring(err), 2) end
  assert.is_true(err, what)
  ok, err = pcall(gradgradcheck, fn, xs, DEFAULT)
  if not ok then error(what .. ": second derivatives: " .. tostring(err), 2) end
  assert.is_true(err, what)
end

describe("second derivatives in f64 against finite differences (gradgradcheck at PyTorch's defaults)", function()
  before_each(function()
    mp.manual_seed(26)
    mp.set_grad_enabled(true)
  end)

  it("the checks themselves fail on a wrong second derivative in f64", function()
    -- a Function whose backward is right to first order but rounds through f32:
    -- the sign that a cast in a create_graph formula would leave
    local sq = mp.autograd.Function {
      name = "square_via_f32",
      forward = function(ctx, x)
        ctx:save_for_backward(x)
        return x * x
      end,
      backward = function(ctx, g)
        local x = table.unpack(ctx.saved_tensors)
        return ((g * x):f32() * 2):f64()
      end,
    }
    local x = X { 3 }
    assert.is_true(gradcheck(function(a) return sq(a) end, { x }, { eps = 1e-6, atol = 1e-5, rtol = 1e-3 }))
    assert.is_false(gradgradcheck(function(a) return sq(a) end, { x },
      { eps = 1e-6, atol = 1e-5, rtol = 1e-3, raise_exception = false }))
  end)

  describe("linear and matmul", function()
    it("linear with and without bias", function()
      check(function(x, w, b) return mp.linear(x, w, b) end, { X { 3, 4 }, X { 2, 4 }, X { 2 } }, "linear")
      check(function(x, w) return mp.linear(x, w) end, { X { 3, 4 }, X { 2, 4 } }, "linear no bias")
      check(function(x, w, b) return mp.linear(x, w, b) end, { X { 2, 2, 3 }, X { 2, 3 }, X { 2 } }, "linear 3-d")
    end)

    it("matmul 2-d, batched, and a quadratic form through it", function()
      check(function(a, b) return mp.matmul(a, b) end, { X { 2, 3 }, X { 3, 2 } }, "matmul 2-d")
      check(function(a, b) return a:matmul(b) end, { X { 2, 2, 3 }, X { 2, 3, 2 } }, "matmul batched")
      check(function(a, b) return a:matmul(b) end, { X { 2, 2, 3 }, X { 3, 2 } }, "matmul broadcast")
      -- second derivatives that are not zero: x^T A x
      check(function(x, a) return x:matmul(a):matmul(x) end, { X { 3 }, X { 3, 3 } }, "x^T A x")
    end)
  end)

  it("transpose and reshape (matmul's and linear's create_graph formulas use transpose)", function()
    local x = mp.tensor({ { 1.5, 2.25, -3 }, { 4, 5.125, 6 } }, CPU)
    assert.are.same({ { 1.5, 4 }, { 2.25, 5.125 }, { -3, 6 } }, x:transpose(1, 2):totable())
    check(function(a) return a:transpose(1, 2) * a:transpose(-1, 1) end, { X { 2, 3 } }, "transpose 2-d")
    check(function(a) return a:transpose(1, 3):reshape { 6, 2 } * 2 end, { X { 2, 3, 2 } }, "transpose 3-d")
  end)

  describe("elementwise arithmetic and ^", function()
    it("+ - * / with broadcasting and numbers", function()
      check(function(a, b) return a + b end, { X { 2, 3 }, X { 3 } }, "add")
      check(function(a, b) return a - b end, { X { 2, 3 }, X { 2, 1 } }, "sub")
      check(function(a, b) return a * b end, { X { 2, 3 }, X { 3 } }, "mul")
      check(function(a) return a * a * a end, { X { 2, 3 } }, "a * a * a")
      check(function(a, b) return a / b end, { X { 2, 3 }, X({ 3 }, 0.5, 2) }, "div")
      check(function(a, b) return a / b end, { X { 3, 1 }, X({ 1, 2 }, -2, -0.5) }, "div by negatives")
      check(function(a) return 3 / a - a * 2 + 1.5 end, { X({ 2, 3 }, 0.5, 2) }, "numbers on either side")
      check(function(a) return -a * a end, { X { 4 } }, "unary minus")
    end)

    it("tensor ^ number: integer exponents on any base, fractional on positive bases", function()
      check(function(a) return a ^ 2 end, { X { 2, 3 } }, "x ^ 2")
      check(function(a) return a ^ 3 end, { X { 2, 3 } }, "x ^ 3")
      check(function(a) return a ^ -1 end, { X({ 2, 3 }, 0.5, 2) }, "x ^ -1")
      check(function(a) return a ^ 0.5 end, { X({ 2, 3 }, 0.5, 2) }, "x ^ 0.5")
      check(function(a) return a ^ 2.5 end, { X({ 2, 3 }, 0.5, 2) }, "x ^ 2.5")
      check(function(a) return a:pow(-1.5) end, { X({ 2, 3 }, 0.5, 2) }, "x:pow(-1.5)")
    end)

    it("number ^ tensor and tensor ^ tensor", function()
      check(function(a) return 1.7 ^ a end, { X { 2, 3 } }, "1.7 ^ x")
      check(function(a) return 0.5 ^ a end, { X { 2, 3 } }, "0.5 ^ x")
      check(function(a, b) return a ^ b end, { X({ 2, 3 }, 0.5, 2), X { 2, 3 } }, "x ^ y")
      check(function(a, b) return a ^ b end, { X({ 2, 3 }, 0.5, 2), X { 3 } }, "x ^ y broadcast")
      check(function(a, b) return (a - b) ^ 2 end, { X { 2, 3 }, X { 2, 3 } }, "(a - b) ^ 2")
    end)
  end)

  describe("reductions", function()
    it("sum and mean, over everything and along a dim", function()
      check(function(a) return a:sum() end, { X { 2, 3 } }, "sum()")
      check(function(a) return a:sum(2) end, { X { 2, 3, 2 } }, "sum(2)")
      check(function(a) return a:mean() end, { X { 2, 3 } }, "mean()")
      check(function(a) return a:mean(-1) end, { X { 2, 3, 2 } }, "mean(-1)")
      -- with curvature around them
      check(function(a) return (a * a):sum(1) * a:mean() end, { X { 3, 2 } }, "sum(1) * mean()")
    end)
  end)

  describe("activations and unary maths", function()
    it("relu away from its kink", function()
      check(function(a) return mp.relu(a) * a end, { X({ 2, 3 }, "away", 0.1) }, "relu * x")
    end)

    it("gelu (both forms), tanh, sigmoid, silu", function()
      check(function(a) return mp.gelu(a) end, { X { 2, 3 } }, "gelu")
      check(function(a) return mp.gelu(a, { approximate = "tanh" }) end, { X { 2, 3 } }, "gelu tanh")
      check(function(a) return mp.tanh(a) end, { X { 2, 3 } }, "tanh")
      check(function(a) return mp.sigmoid(a) end, { X { 2, 3 } }, "sigmoid")
      check(function(a) return mp.silu(a) end, { X { 2, 3 } }, "silu")
    end)

    it("exp, log and sqrt (log and sqrt on [0.5, 2])", function()
      check(function(a) return a:exp() end, { X { 2, 3 } }, "exp")
      check(function(a) return a:log() end, { X({ 2, 3 }, 0.5, 2) }, "log")
      check(function(a) return a:sqrt() end, { X({ 2, 3 }, 0.5, 2) }, "sqrt")
    end)
  end)

  describe("losses", function()
    it("mse_loss, both arguments", function()
      check(function(a, b) return mp.mse_loss(a, b) end, { X { 2, 3 }, X { 2, 3 } }, "mse_loss")
    end)

    it("cross_entropy on 2-d and 3-d logits, mean / sum / none", function()
      local t2, t3 = I32 { 0, 3, 1 }, I32 { { 2, 0 }, { 1, 1 } }
      for _, red in ipairs { "mean", "sum", "none" } do
        check(function(a) return mp.cross_entropy(a, t2, { reduction = red }) end, { X { 3, 4 } },
              "cross_entropy " .. red)
        check(function(a) return mp.cross_entropy(a, t3, { reduction = red }) end, { X { 2, 2, 3 } },
              "cross_entropy 3-d " .. red)
      end
    end)
  end)

  describe("norms and the softmax family", function()
    it("layer_norm with weight and bias: second derivatives in x, weight and bias", function()
      check(function(x, w, b) return mp.layer_norm(x, w, b) end, { X { 2, 4 }, X { 4 }, X { 4 } }, "layer_norm")
      check(function(x, w, b) return mp.layer_norm(x, w, b, 1e-3) end, { X { 2, 1, 3 }, X { 3 }, X { 3 } },
            "layer_norm 3-d, eps 1e-3")
      check(function(x) return mp.layer_norm(x) end, { X { 2, 4 } }, "layer_norm plain")
    end)

    it("rms_norm with and without weight", function()
      check(function(x, w) return mp.rms_norm(x, w) end, { X { 2, 4 }, X { 4 } }, "rms_norm")
      check(function(x) return mp.rms_norm(x, nil, 1e-3) end, { X { 2, 1, 3 } }, "rms_norm plain 3-d")
    end)

    it("softmax and log_softmax along each dim", function()
      for _, d in ipairs { 1, 2, -1 } do
        check(function(a) return mp.softmax(a, d) end, { X { 2, 3 } }, "softmax " .. d)
        check(function(a) return mp.log_softmax(a, d) end, { X { 2, 3 } }, "log_softmax " .. d)
      end
    end)
  end)

  describe("the other ops with second derivatives (beyond the issue's list)", function()
    it("narrow, select, index_select, split and chunk, cat", function()
      check(function(a) return a:narrow(2, 2, 2) * a:narrow(2, 1, 2) end, { X { 2, 3 } }, "narrow")
      check(function(a) return a[2] * a:select(2, 1) end, { X { 3, 3 } }, "select")
      check(function(a) return a:index_select(1, I32 { 2, 0, 2 }) ^ 2 end, { X { 3, 2 } }, "index_select")
      check(function(a) return a:chunk(2) * select(2, a:split(2, 1)) end, { X { 4, 3 } }, "chunk and split")
      check(function(a, b) return mp.cat({ a * a, b }, 1) * mp.cat({ b, a }, 1) end, { X { 1, 3 }, X { 1, 3 } }, "cat")
    end)

    it("tril, triu, masked_fill, where (a given condition and one from the input)", function()
      local cond = mp.randn({ 2, 3 }, CPU):gt(0)
      local mask = mp.tensor({ { 1, 0, 0 } }, { dtype = "u8", device = "cpu" })
      check(function(a) return a:tril() * a:triu(1) + a:tril(-1) end, { X { 3, 3 } }, "tril and triu")
      check(function(a) return a:masked_fill(mask, -3) * a end, { X { 2, 3 } }, "masked_fill")
      check(function(a, b) return mp.where(cond, a * b, b) end, { X { 2, 3 }, X { 2, 3 } }, "where")
      check(function(a) return mp.where(a:gt(0), a, a * 0.1) * a end, { X({ 3, 3 }, "away", 0.1) }, "leaky relu")
    end)

    it("abs, clone, dropout (its seed fixed) and the GradScaler's scale", function()
      check(function(a) return a:abs() * a end, { X({ 2, 3 }, "away", 0.1) }, "abs")
      check(function(a) return a:clone() * a end, { X { 2, 3 } }, "clone")
      check(function(a)
        mp.manual_seed(77)
        return mp.dropout(a, 0.4, true) * a
      end, { X { 2, 3 } }, "dropout")
      local scaler = mp.amp.GradScaler { policy = mp.amp.policy.static(4) }
      check(function(a) return scaler:scale(a * a * a) end, { X { 2, 3 } }, "scale")
    end)

    -- max, topk and sort have first derivatives only: a second one raises, naming the op
    it("max, topk and sort: gradcheck passes, gradgradcheck raises naming the op", function()
      for _, c in ipairs {
        { "max", function(a) return a:max(2) * a:sum(2) end },
        { "topk", function(a) return (a:topk(2)) ^ 2 end },
        { "sort", function(a) return (a:sort(2)) ^ 2 end },
      } do
        local x = X { 2, 3 }
        assert.is_true(gradcheck(c[2], { x }, DEFAULT), c[1])
        H.raises(function() gradgradcheck(c[2], { x }, DEFAULT) end, { c[1] .. " has no second derivative" })
      end
    end)
  end)

  describe("the casts autocast inserts, where they are exact (see the header)", function()
    local VALUES = { 0.5, 0.75, 1, 1.25, 1.5 }   -- at most 3 significant bits
    local EXACT_CAST = { eps = 2 ^ -4, atol = DEFAULT.atol, rtol = DEFAULT.rtol }
    -- an f64 leaf of values drawn from VALUES
    local function G(shape)
      local n = 1
      for _, s in ipairs(shape) do n = n * s end
      local v = {}
      for i = 1, n do v[i] = VALUES[math.random(#VALUES)] end
      return mp.tensor(H.nest(v, shape), CPU):requires_grad(true)
    end
    local function both(fn, xs, go, what)
      assert.is_true(gradcheck(fn, xs, EXACT_CAST), what)
      assert.is_true(gradgradcheck(fn, xs, { eps = EXACT_CAST.eps, atol = EXACT_CAST.atol, rtol = EXACT_CAST.rtol,
                                             grad_outputs = go }), what)
    end

    before_each(function() math.randomseed(2026) end)

    it("f64 -> f32 -> f64, f64 -> f16 -> f64 and f64 -> bf16 -> f64 keep f64 gradients", function()
      for _, dt in ipairs { "f32", "f16", "bf16" } do
        local x = G { 2, 3 }
        -- linear: the gradient passes through dt itself
        both(function(a) return a:to(dt):to("f64") * 3 end, { x }, G { 2, 3 }, dt .. " round trip")
        -- quadratic: its second derivative too
        both(function(a) return a:to(dt):to("f64") * a end, { x }, G { 2, 3 }, dt .. " round trip * x")
        x.grad = nil
        ;(x:to(dt):to("f64") * 3):sum():backward()
        assert.are.equal("f64", x.grad.dtype, dt)
      end
    end)

    it("the chain autocast makes of an f32 input, f32 -> f16/bf16 -> f32, inside f64", function()
      for _, dt in ipairs { "f16", "bf16" } do
        both(function(a, b) return a:f32():to(dt):f32():f64() * b end, { G { 3 }, G { 3 } }, G { 3 }, dt .. " chain")
      end
    end)

    -- autocast's own casts around an f16 linear: every value here is a multiple
    -- of 2^-4 (x +- eps, grad_outputs +- eps) or 2^-2 (VALUES), so every
    -- product is a multiple of 2^-6, and the sums of two or three of them are
    -- under 2^3: at most 9 significant bits, exact in f16's 11 (not in bf16's
    -- 8: bf16 has the casts alone, above)
    it("a linear under f16 autocast, from f32 views of f64 leaves", function()
      both(function(x, w)
        local _ <close> = mp.amp.autocast("f16")
        local y = mp.linear(x:f32(), w:f32())
        assert.are.equal("f16", y.dtype)
        return y:f64()
      end, { G { 2, 2 }, G { 3, 2 } }, G { 2, 3 }, "linear under f16 autocast")
    end)
  end)
end)
