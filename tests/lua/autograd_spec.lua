-- autograd_spec.lua: every differentiable op's backward against central finite
-- differences, and the semantics of the tape (accumulation, no_grad, detach,
-- errors, long chains).
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/autograd_spec.lua
--
-- Two checks, one per precision; each case's inputs are drawn in f32 (below):
--
-- In f64, where the default device holds f64 tensors (the CPU): the inputs as
-- f64 leaves, mp.autograd.gradcheck at PyTorch's defaults (eps 1e-6, atol 1e-5,
-- rtol 1e-3, every entry of the Jacobian), plus the gradients' shapes and
-- dtypes. Its truncation (eps^2 |f'''| / 6 ~ 1e-13) and rounding (~1e-16 / eps
-- ~ 1e-10) are far under atol on these O(1) values, for every op, so the
-- tolerance classes below do not apply to it. The inputs keep away from kinks
-- as for f32 (steps of 1e-6 never cross them).
--
-- In f32 (gradcheck32) where the default device declines f64 (MP_DEVICE=cuda:
-- the fake device's f32 kernels are the CPU's, the emulated device's are
-- CUDA's, so every f32 backward kernel is still checked by make test), and
-- always for what f64 cannot check:
--   * the round trips through f16 and bf16: their rounding is what is tested,
--     and at f64's eps of 1e-6 the step is lost to it;
--   * conv2d, avg_pool2d, adaptive_avg_pool2d, max_pool2d and batch_norm,
--     which the CPU has no f64 kernels for (f64_spec checks that it declines).
--
-- The f32 check (gradcheck32 below): out = f(x1, ..., xn) for leaves xi in f32;
-- L = sum(out * R) for a fixed random R of out's shape, so every output element
-- counts. The analytic gradient is xi.grad after out:backward(R). The numeric
-- one, for each element v of each input: (L(v+) - L(v-)) / (v+ - v-), where
-- v+ and v- are f32(v + h) and f32(v - h) (the steps actually taken), L summed
-- in double from the f32 outputs, with grad mode off. Element by element:
--   |numeric - analytic| <= atol + rtol * |analytic|.
--
-- Steps and tolerances (each case names the one it uses and why):
--   EXACT  h = 0.5, rtol = atol = 1e-4: f is at most quadratic in any one input
--          element (sums, products, matmul, shapes, casts between f32 and f32),
--          so the central difference has no truncation error at any h and a big
--          h leaves only f32 rounding of L, ~1e-6 here.
--   KINK   h = 0.05, rtol = atol = 1e-4: piecewise linear ops (relu, abs, max),
--          with inputs at least 0.1 from every kink (or max ties 0.3 apart), so
--          both steps stay on one linear piece: exact as above.
--   SMOOTH h = 1e-2, rtol = 1e-2, atol = 1e-3: smooth nonlinear ops on O(1)
--          inputs. Truncation error h^2 f'''/6 ~ 2e-5; rounding of L in f32,
--          n * 6e-8 * |out| over 2h, ~1e-4 for the few dozen outputs used here.
--   LOOSE  h = 1e-2, rtol = 2e-2, atol = 2e-3: composite ops whose f32 forward
--          rounds several times per output (layer_norm, cross_entropy over 3-d
--          logits), so L carries a few times SMOOTH's rounding.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local EXACT = { h = 0.5, rtol = 1e-4, atol = 1e-4 }
local KINK = { h = 0.05, rtol = 1e-4, atol = 1e-4 }
local SMOOTH = { h = 1e-2, rtol = 1e-2, atol = 1e-3 }
local LOOSE = { h = 1e-2, rtol = 2e-2, atol = 2e-3 }

---------------------------------------------------------------- inputs

local nest, numel, flat_of, gauss = H.nest, H.numel, H.values, H.gauss

-- An f32 leaf that requires grad, with values drawn in Lua:
--   X(shape)                    N(0, 1)
--   X(shape, {lo=, hi=})        uniform in [lo, hi]
--   X(shape, {away=m})          N(0, 1) pushed at least m away from 0
--   X(shape, {distinct=s})      a shuffled ladder of values s apart (no ties, gaps of s)
local function X(shape, o)
  o = o or {}
  local n, v = numel(shape), {}
  if o.distinct then
    for i = 1, n do v[i] = (i - (n + 1) / 2) * o.distinct end
    for i = n, 2, -1 do
      local j = math.random(i)
      v[i], v[j] = v[j], v[i]
    end
  else
    for i = 1, n do
      local x
      if o.lo then x = o.lo + (o.hi - o.lo) * math.random() else x = gauss() end
      if o.away then x = x + (x < 0 and -o.away or o.away) end
      v[i] = x
    end
  end
  local t = mp.tensor(nest(v, shape))
  if o.grad == false then return t end
  return t:requires_grad(true)
end

local function I32(list) return mp.tensor(list, { dtype = "i32" }) end

---------------------------------------------------------------- the check

-- L = sum(out * R) in double
local function project(out, Rv)
  local ov = flat_of(out:f32())
  assert(#ov == #Rv)
  local s = 0
  for i = 1, #ov do s = s + ov[i] * Rv[i] end
  return s
end

-- checks f's backward for every input against central differences in f32 (the
-- header's check); returns the largest |numeric - analytic| seen
local function gradcheck32(f, xs, tol, what)
  tol = tol or SMOOTH
  what = what or "gradcheck"
  for _, x in ipairs(xs) do x.grad = nil end
  local out = f(table.unpack(xs))
  assert(out.grad_fn, what .. ": the output has no grad_fn")
  mp.manual_seed(9001)
  local R = out:dim() == 0 and mp.tensor(1.25) or mp.randn(out.shape)
  local Rv = flat_of(R)
  out:backward(R:to(out.dtype))
  local worst = 0
  for i, x in ipairs(xs) do
    local g = x.grad
    assert(g, string.format("%s: no gradient reached input %d", what, i))
    assert.are.same(x.shape, g.shape, what .. ": gradient shape of input " .. i)
    assert.are.equal(x.dtype, g.dtype, what .. ": gradient dtype of input " .. i)
    local gv, xv, shape = flat_of(g), flat_of(x), x.shape
    local args = {}
    for k, y in ipairs(xs) do args[k] = y:detach() end
    local _ <close> = mp.no_grad()
    for j = 1, #xv do
      local v = xv[j]
      local vp, vm = H.f32(v + tol.h), H.f32(v - tol.h)
      xv[j] = vp
      args[i] = mp.tensor(nest(xv, shape))
      local lp = project(f(table.unpack(args)), Rv)
      xv[j] = vm
      args[i] = mp.tensor(nest(xv, shape))
      local lm = project(f(table.unpack(args)), Rv)
      xv[j] = v
      local num, ana = (lp - lm) / (vp - vm), gv[j]
      local err = math.abs(num - ana)
      worst = math.max(worst, err)
      if not (err <= tol.atol + tol.rtol * math.abs(ana)) then
        error(string.format("%s: input %d element %d: analytic %.7g, numeric %.7g (|diff| %.3g > %.3g)",
                            what, i, j, ana, num, err, tol.atol + tol.rtol * math.abs(ana)), 2)
      end
    end
    args[i] = x:detach()
  end
  return worst
end

-- the f64 check: xs as f64 leaves, mp.autograd.gradcheck at PyTorch's
-- defaults (eps 1e-6, atol 1e-5, rtol 1e-3: see the header), and one backward
-- for the gradients' shapes and dtypes, which it does not look at
local DEFAULTS = { eps = 1e-6, atol = 1e-5, rtol = 1e-3 }
local function gradcheck64(f, xs, what)
  local ys = {}
  for i, x in ipairs(xs) do ys[i] = x:detach():f64():requires_grad(true) end
  local ok, err = pcall(mp.autograd.gradcheck, f, ys, DEFAULTS)
  if not ok then error(what .. " (f64): " .. tostring(err), 3) end
  local out = f(table.unpack(ys))
  out:backward(mp.ones(out.shape, { dtype = "f64" }))
  for i, y in ipairs(ys) do
    assert(y.grad, string.format("%s: no gradient reached input %d", what, i))
    assert.are.same(y.shape, y.grad.shape, what .. ": gradient shape of input " .. i)
    assert.are.equal("f64", y.grad.dtype, what .. ": gradient dtype of input " .. i)
  end
end

-- the check each case below asks for: in f64 where the default device holds
-- f64 tensors (the CPU), in f32 where it does not (MP_DEVICE=cuda: the fake
-- device's f32 kernels are the CPU's, the emulated device's the CUDA ones)
local F64 = pcall(mp.zeros, { 1 }, { dtype = "f64" })
local function gradcheck(f, xs, tol, what)
  if F64 then return gradcheck64(f, xs, what or "gradcheck") end
  return gradcheck32(f, xs, tol, what)
end

---------------------------------------------------------------- op by op

describe("autograd: backward against finite differences", function()
  before_each(function()
    math.randomseed(20260101)
    mp.manual_seed(1)
    mp.set_grad_enabled(true)
  end)

  describe("arithmetic with broadcasting", function()
    -- EXACT: + and - are linear in each input
    it("add {2,3} + {3}: b's gradient sums over the rows", function()
      gradcheck(function(a, b) return a + b end, { X { 2, 3 }, X { 3 } }, EXACT, "add")
    end)

    it("sub {2,3} - {2,1} and {3} - {2,3}", function()
      gradcheck(function(a, b) return a - b end, { X { 2, 3 }, X { 2, 1 } }, EXACT, "sub 1")
      gradcheck(function(a, b) return a - b end, { X { 3 }, X { 2, 3 } }, EXACT, "sub 2")
    end)

    -- EXACT: a product is linear in each factor
    it("mul {4,1} * {1,5}: both gradients reduce to their own shapes", function()
      gradcheck(function(a, b) return a * b end, { X { 4, 1 }, X { 1, 5 } }, EXACT, "mul")
    end)

    -- EXACT: x * x is quadratic in each element, which central differences get exactly
    it("mul of a tensor by itself sums both paths", function()
      gradcheck(function(a) return a * a end, { X { 2, 3 } }, EXACT, "x*x")
    end)

    -- SMOOTH: 1/y on y in [0.5, 2]; a is linear (EXACT would do for it alone)
    it("div {2,3} / {3} with the denominator away from 0", function()
      gradcheck(function(a, b) return a / b end, { X { 2, 3 }, X({ 3 }, { lo = 0.5, hi = 2 }) }, SMOOTH, "div")
      gradcheck(function(a, b) return a / b end, { X { 3, 1 }, X({ 1, 2 }, { lo = -2, hi = -0.5 }) }, SMOOTH, "div 2")
    end)

    -- EXACT for the linear ones; SMOOTH for s / x (x in [0.5, 2])
    it("scalar operands on either side: x+s s+x x-s s-x x*s s*x x/s", function()
      local fs = {
        function(x) return x + 2.5 end, function(x) return 2.5 + x end,
        function(x) return x - 1.5 end, function(x) return 1.5 - x end,
        function(x) return x * -3 end, function(x) return 0.75 * x end,
        function(x) return x / 4 end,
      }
      for i, f in ipairs(fs) do gradcheck(f, { X { 2, 3 } }, EXACT, "scalar op " .. i) end
      gradcheck(function(x) return 3 / x end, { X({ 2, 3 }, { lo = 0.5, hi = 2 }) }, SMOOTH, "s / x")
    end)

    -- EXACT: linear; the 0-d operand's gradient is the sum over everything
    it("0-d tensor operands broadcast and get a 0-d gradient", function()
      gradcheck(function(a, s) return a * s + s end, { X { 2, 3 }, X {} }, EXACT, "0-d")
    end)

    it("unary minus", function()   -- EXACT: linear
      gradcheck(function(a) return -a end, { X { 3, 2 } }, EXACT, "neg")
    end)

    it("an input used by several ops gets the sum of their gradients", function()   -- EXACT: quadratic
      gradcheck(function(a, b) return a * b + a - b * 2 + a * a end, { X { 2, 2 }, X { 2, 2 } }, EXACT, "fan-out")
    end)
  end)

  -- EXACT: a matrix product is linear in each operand
  describe("matmul", function()
    local cases = {
      { "2-d @ 2-d", { 3, 4 }, { 4, 2 } },
      { "batched 3-d @ 3-d", { 2, 3, 4 }, { 2, 4, 5 } },
      { "3-d @ 2-d (shared right operand)", { 2, 3, 4 }, { 4, 5 } },
      { "2-d @ 3-d (shared left operand)", { 3, 4 }, { 2, 4, 5 } },
      { "1-d @ 2-d", { 4 }, { 4, 2 } },
      { "2-d @ 1-d", { 3, 4 }, { 4 } },
      { "1-d @ 1-d (a dot product, 0-d)", { 4 }, { 4 } },
      { "1-d @ 3-d", { 4 }, { 2, 4, 3 } },
      { "3-d @ 1-d", { 2, 3, 4 }, { 4 } },
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        gradcheck(function(a, b) return a:matmul(b) end, { X(c[2]), X(c[3]) }, EXACT, "matmul " .. c[1])
        gradcheck(function(a, b) return mp.matmul(a, b) end, { X(c[2]), X(c[3]) }, EXACT, "mp.matmul " .. c[1])
      end)
    end
  end)

  describe("reductions", function()
    -- EXACT: linear
    it("sum over everything and along each dim (1-based and negative)", function()
      gradcheck(function(a) return a:sum() end, { X { 2, 3 } }, EXACT, "sum()")
      for _, d in ipairs { 1, 2, 3, -1, -3 } do
        gradcheck(function(a) return a:sum(d) end, { X { 2, 3, 4 } }, EXACT, "sum(" .. d .. ")")
      end
    end)

    it("mean over everything and along each dim", function()   -- EXACT: linear
      gradcheck(function(a) return a:mean() end, { X { 2, 3 } }, EXACT, "mean()")
      for _, d in ipairs { 1, 2, 3, -2 } do
        gradcheck(function(a) return a:mean(d) end, { X { 2, 3, 4 } }, EXACT, "mean(" .. d .. ")")
      end
    end)

    -- KINK: values 0.3 apart, so a step of 0.05 never changes which one is largest
    it("max over everything goes to the largest element only", function()
      gradcheck(function(a) return a:max() end, { X({ 3, 4 }, { distinct = 0.3 }) }, KINK, "max()")
    end)

    it("max along a dim goes to each slice's largest element", function()   -- KINK, as above
      for _, d in ipairs { 1, 2, 3, -1 } do
        gradcheck(function(a) return (a:max(d)) end, { X({ 2, 3, 4 }, { distinct = 0.3 }) }, KINK, "max(" .. d .. ")")
      end
    end)
  end)

  -- EXACT: shape ops only move values
  describe("shapes", function()
    it("reshape and view, with -1", function()
      gradcheck(function(a) return a:reshape { 3, 2 } end, { X { 2, 3 } }, EXACT, "reshape")
      gradcheck(function(a) return a:view { -1 } end, { X { 2, 3 } }, EXACT, "view")
      gradcheck(function(a) return a:reshape(2, 1, 3) * a:reshape { 2, 1, 3 } end, { X { 6 } }, EXACT, "reshape twice")
    end)

    it("transpose of 2-d and of 3-d dims", function()
      gradcheck(function(a) return a:transpose(1, 2) end, { X { 2, 3 } }, EXACT, "transpose 2-d")
      gradcheck(function(a) return a:transpose(1, 3) end, { X { 2, 3, 4 } }, EXACT, "transpose 1,3")
      gradcheck(function(a) return a:transpose(-1, 2) end, { X { 2, 3, 4 } }, EXACT, "transpose -1,2")
    end)

    it("narrow along dim 1 (a shared slab) and dim 2 (a copy)", function()
      gradcheck(function(a) return a:narrow(1, 2, 2) end, { X { 4, 3 } }, EXACT, "narrow dim 1")
      gradcheck(function(a) return a:narrow(2, 2, 2) end, { X { 2, 4 } }, EXACT, "narrow dim 2")
      gradcheck(function(a) return a:narrow(3, 1, 2) end, { X { 2, 2, 3 } }, EXACT, "narrow dim 3")
      -- two narrows of one input add up where they overlap
      gradcheck(function(a) return a:narrow(2, 1, 2) + a:narrow(2, 2, 2) end, { X { 2, 3 } }, EXACT, "overlap")
    end)

    it("index_select along dims 1 and 2, with repeated indices", function()   -- EXACT: a gather
      gradcheck(function(a) return a:index_select(1, I32 { 2, 0, 2, 2 }) end, { X { 3, 2 } }, EXACT, "index_select 1")
      gradcheck(function(a) return a:index_select(2, I32 { 1, 1, 0 }) end, { X { 2, 3 } }, EXACT, "index_select 2")
      gradcheck(function(a) return a:index_select(-1, I32 { 3 }) end, { X { 2, 2, 4 } }, EXACT, "index_select -1")
    end)
  end)

  describe("casts", function()
    -- a copy to the same dtype is exact: EXACT
    it("clone and a cast to the tensor's own dtype pass the gradient through", function()
      gradcheck(function(a) return a:clone() * 2 end, { X { 2, 3 } }, EXACT, "clone")
      gradcheck(function(a) return a:to(a.dtype) * a end, { X { 2, 3 } }, EXACT, "to its own dtype")
    end)

    -- The f16 round trip rounds to 11 bits: with h = 0.25 on inputs in [0.5, 1.5]
    -- the rounding of x +- h (<= 2^-11 * 2) over 2h stays under 2e-3, hence rtol 1e-2.
    it("f32 -> f16 -> f32: the gradient comes back as f32", function()
      local x = X({ 2, 3 }, { lo = 0.5, hi = 1.5 })
      gradcheck32(function(a) return a:f16():f32() * 3 end, { x }, { h = 0.25, rtol = 1e-2, atol = 1e-3 }, "f16 trip")
      assert.are.equal("f32", x.grad.dtype)
      x.grad = nil
      local y = x:f16()
      assert.are.equal("f16", y.dtype)
      y:sum():backward()
      assert.are.equal("f32", x.grad.dtype)
      H.assert_same(x.grad:totable(), { { 1, 1, 1 }, { 1, 1, 1 } }, "f16 sum grad")
    end)

    it("f32 -> bf16 -> f32 likewise (8 bits: h = 0.25, rtol 2e-2)", function()
      local x = X({ 2, 3 }, { lo = 0.5, hi = 1.5 })
      gradcheck32(function(a) return a:bf16():f32() * 3 end, { x }, { h = 0.25, rtol = 2e-2, atol = 2e-3 }, "bf16 trip")
      assert.are.equal("f32", x.grad.dtype)
    end)

    it("a cast to an integer dtype cuts the graph", function()
      local x = X { 3 }
      local i = x:to("i32")
      assert.is_false(i:requires_grad())
      assert.is_nil(i.grad_fn)
    end)
  end)

  describe("unary maths", function()
    it("exp", function()   -- SMOOTH
      gradcheck(function(a) return a:exp() end, { X { 2, 3 } }, SMOOTH, "exp")
    end)

    it("log on [0.5, 2]", function()   -- SMOOTH: 1/x bounded on [0.5, 2]
      gradcheck(function(a) return a:log() end, { X({ 2, 3 }, { lo = 0.5, hi = 2 }) }, SMOOTH, "log")
    end)

    it("sqrt on [0.5, 2]", function()   -- SMOOTH
      gradcheck(function(a) return a:sqrt() end, { X({ 2, 3 }, { lo = 0.5, hi = 2 }) }, SMOOTH, "sqrt")
    end)

    it("pow with integer, fractional and negative exponents", function()
      gradcheck(function(a) return a:pow(2) end, { X { 2, 3 } }, EXACT, "pow 2")   -- quadratic: EXACT
      gradcheck(function(a) return a:pow(3) end, { X { 2, 3 } }, SMOOTH, "pow 3")  -- SMOOTH
      local pos = { lo = 0.5, hi = 2 }
      gradcheck(function(a) return a:pow(0.5) end, { X({ 2, 3 }, pos) }, SMOOTH, "pow 0.5")
      gradcheck(function(a) return a:pow(-1) end, { X({ 2, 3 }, pos) }, SMOOTH, "pow -1")
      gradcheck(function(a) return a:pow(2.5) end, { X({ 2, 3 }, pos) }, SMOOTH, "pow 2.5")
    end)

    it("abs away from 0", function()   -- KINK: |x| >= 0.1 > h
      gradcheck(function(a) return a:abs() end, { X({ 3, 3 }, { away = 0.1 }) }, KINK, "abs")
    end)
  end)

  describe("matmul over batch dims", function()
    it("4-d with broadcast batch dims, and a 1-d side", function()   -- SMOOTH
      gradcheck(function(a, b) return mp.matmul(a, b) end, { X { 2, 1, 3, 4 }, X { 3, 4, 2 } }, SMOOTH, "4-d x 3-d")
      gradcheck(function(a, b) return mp.matmul(a, b) end, { X { 2, 2, 3 }, X { 3 } }, SMOOTH, "3-d x 1-d")
      gradcheck(function(a, b) return mp.matmul(a, b) end, { X { 4 }, X { 2, 4, 3 } }, SMOOTH, "1-d x 3-d")
    end)
  end)

  describe("selecting and masking", function()
    it("select (t[i], negative, inner dims)", function()   -- KINK: linear, exact
      gradcheck(function(a) return a[2] end, { X { 3, 4 } }, KINK, "t[2]")
      gradcheck(function(a) return a[-1] end, { X { 3, 4 } }, KINK, "t[-1]")
      gradcheck(function(a) return a:select(2, 3) end, { X { 2, 4, 3 } }, KINK, "select(2, 3)")
    end)

    it("tril and triu, batched, off the main diagonal", function()   -- KINK: linear
      gradcheck(function(a) return a:tril() end, { X { 4, 4 } }, KINK, "tril")
      gradcheck(function(a) return a:triu(1) end, { X { 2, 3, 5 } }, KINK, "triu(1)")
      gradcheck(function(a) return mp.tril(a, -1) end, { X { 5, 3 } }, KINK, "tril(-1)")
    end)

    it("topk and sort send each gradient back to where its value came from", function()   -- KINK
      gradcheck(function(a) return (a:topk(2)) end, { X({ 3, 5 }, { distinct = 0.3 }) }, KINK, "topk")
      gradcheck(function(a) return (a:topk(2, 1, { largest = false })) end, { X({ 4, 3 }, { distinct = 0.3 }) }, KINK, "topk dim 1")
      gradcheck(function(a) return (a:sort(2, { descending = true })) end, { X({ 2, 3, 4 }, { distinct = 0.3 }) }, KINK, "sort")
    end)

    it("masked_fill passes the gradient where the mask is zero", function()   -- KINK
      local mask = mp.tensor({ { 1, 0, 0, 1 } }, { dtype = "u8" })
      gradcheck(function(a) return a:masked_fill(mask, -3) end, { X { 3, 4 } }, KINK, "masked_fill")
    end)

    it("split and chunk pieces", function()   -- KINK
      gradcheck(function(a) return select(2, a:split(2, 2)) end, { X { 3, 5 } }, KINK, "split")
      gradcheck(function(a) return mp.chunk(a, 2) * select(2, a:chunk(2)) end, { X { 4, 3 } }, SMOOTH, "chunk")
    end)
  end)

  describe("activations", function()
    it("relu away from 0", function()   -- KINK
      gradcheck(function(a) return mp.relu(a) end, { X({ 3, 4 }, { away = 0.1 }) }, KINK, "relu")
    end)

    it("gelu, erf form (default and explicit)", function()   -- SMOOTH
      gradcheck(function(a) return mp.gelu(a) end, { X { 3, 4 } }, SMOOTH, "gelu")
      gradcheck(function(a) return mp.gelu(a, { approximate = "none" }) end, { X { 3, 4 } }, SMOOTH, "gelu none")
    end)

    it("gelu, tanh form", function()   -- SMOOTH
      gradcheck(function(a) return mp.gelu(a, { approximate = "tanh" }) end, { X { 3, 4 } }, SMOOTH, "gelu tanh")
    end)

    it("tanh and sigmoid", function()   -- SMOOTH
      gradcheck(function(a) return mp.tanh(a) end, { X { 3, 4 } }, SMOOTH, "tanh")
      gradcheck(function(a) return mp.sigmoid(a) end, { X { 3, 4 } }, SMOOTH, "sigmoid")
    end)

    it("silu", function()   -- SMOOTH
      gradcheck(function(a) return mp.silu(a) end, { X { 3, 4 } }, SMOOTH, "silu")
    end)

    it("large inputs: tanh, sigmoid, gelu and silu saturate without NaN gradients", function()
      local x = mp.tensor({ -100, -30, -10, 10, 30, 100 }):requires_grad(true)
      for _, f in ipairs { mp.tanh, mp.sigmoid, mp.gelu, mp.silu } do
        x.grad = nil
        f(x):sum():backward()
        for _, g in ipairs(x.grad:totable()) do assert.is_true(g == g, "NaN gradient") end
      end
    end)
  end)

  describe("softmax family", function()
    it("softmax along dims 1, 2, 3 and -1", function()   -- SMOOTH
      for _, d in ipairs { 1, 2, 3, -1 } do
        gradcheck(function(a) return mp.softmax(a, d) end, { X { 2, 3, 4 } }, SMOOTH, "softmax " .. d)
      end
    end)

    it("log_softmax along dims 1 and 2 (2-d and 3-d)", function()   -- SMOOTH
      for _, d in ipairs { 1, 2 } do
        gradcheck(function(a) return mp.log_softmax(a, d) end, { X { 3, 4 } }, SMOOTH, "log_softmax 2-d " .. d)
        gradcheck(function(a) return mp.log_softmax(a, d) end, { X { 2, 3, 4 } }, SMOOTH, "log_softmax 3-d " .. d)
      end
    end)

    it("softmax of large logits stays finite and its gradient too", function()
      local x = mp.tensor { { 1000, 0, -1000 } }:requires_grad(true)
      mp.softmax(x, 2):sum():backward()
      for _, g in ipairs(x.grad:totable()[1]) do assert.is_true(g == g and math.abs(g) < 1e-3) end
    end)
  end)

  describe("losses", function()
    it("cross_entropy on 2-d logits, mean / sum / none", function()   -- SMOOTH
      local t = I32 { 0, 4, 2, 2 }
      for _, red in ipairs { "mean", "sum", "none" } do
        gradcheck(function(a) return mp.cross_entropy(a, t, { reduction = red }) end, { X { 4, 5 } }, SMOOTH,
                  "cross_entropy " .. red)
      end
      gradcheck(function(a) return mp.cross_entropy(a, t) end, { X { 4, 5 } }, SMOOTH, "cross_entropy default")
    end)

    -- LOOSE: 6 rows of 5 classes, each loss a log-sum-exp rounded in f32
    it("cross_entropy on 3-d logits {2,3,5}, mean / sum / none", function()
      local t = I32 { { 0, 4, 1 }, { 3, 3, 2 } }
      for _, red in ipairs { "mean", "sum", "none" } do
        gradcheck(function(a) return mp.cross_entropy(a, t, { reduction = red }) end, { X { 2, 3, 5 } }, LOOSE,
                  "cross_entropy 3-d " .. red)
      end
    end)

    it("cross_entropy's gradient is softmax minus one-hot, over N for the mean", function()
      local x = mp.tensor { { 1, 2, 3 }, { 0, 0, 0 } }:requires_grad(true)
      mp.cross_entropy(x, I32 { 2, 0 }):backward()
      local p = mp.softmax(x:detach(), 2):totable()
      local want = { { p[1][1] / 2, p[1][2] / 2, (p[1][3] - 1) / 2 }, { (p[2][1] - 1) / 2, p[2][2] / 2, p[2][3] / 2 } }
      H.assert_close(x.grad:totable(), want, 1e-5, 1e-7, "ce grad")
    end)

    it("mse_loss: gradients for both arguments", function()   -- EXACT: quadratic
      gradcheck(function(a, b) return mp.mse_loss(a, b) end, { X { 3, 4 }, X { 3, 4 } }, EXACT, "mse_loss")
    end)
  end)

  describe("layers", function()
    it("linear with and without bias", function()   -- EXACT: linear in x, w and b separately
      gradcheck(function(x, w, b) return mp.linear(x, w, b) end, { X { 4, 3 }, X { 2, 3 }, X { 2 } }, EXACT, "linear")
      gradcheck(function(x, w) return mp.linear(x, w) end, { X { 4, 3 }, X { 2, 3 } }, EXACT, "linear no bias")
    end)

    it("linear on a 3-d input {2,3,4}", function()   -- EXACT
      gradcheck(function(x, w, b) return mp.linear(x, w, b) end, { X { 2, 3, 4 }, X { 5, 4 }, X { 5 } }, EXACT,
                "linear 3-d")
      gradcheck(function(x, w) return mp.linear(x, w) end, { X { 2, 3, 4 }, X { 5, 4 } }, EXACT, "linear 3-d no bias")
    end)

    -- LOOSE: mean, variance and rsqrt each round in f32 before the output does
    it("layer_norm with weight and bias (2-d and 3-d)", function()
      gradcheck(function(x, w, b) return mp.layer_norm(x, w, b) end, { X { 3, 5 }, X { 5 }, X { 5 } }, LOOSE, "ln 2-d")
      gradcheck(function(x, w, b) return mp.layer_norm(x, w, b, 1e-3) end, { X { 2, 2, 4 }, X { 4 }, X { 4 } }, LOOSE,
                "ln 3-d")
    end)

    it("layer_norm without weight and bias, and with the weight only", function()   -- LOOSE
      gradcheck(function(x) return mp.layer_norm(x, nil, nil) end, { X { 3, 5 } }, LOOSE, "ln plain")
      gradcheck(function(x, w) return mp.layer_norm(x, w, nil) end, { X { 3, 5 }, X { 5 } }, LOOSE, "ln weight only")
      gradcheck(function(x, b) return mp.layer_norm(x, nil, b) end, { X { 3, 5 }, X { 5 } }, LOOSE, "ln bias only")
    end)

    -- LOOSE, as layer_norm: the mean square and rsqrt round in f32
    it("rms_norm with and without weight (2-d and 3-d)", function()
      gradcheck(function(x, w) return mp.rms_norm(x, w) end, { X { 3, 5 }, X { 5 } }, LOOSE, "rms 2-d")
      gradcheck(function(x, w) return mp.rms_norm(x, w, 1e-3) end, { X { 2, 2, 4 }, X { 4 } }, LOOSE, "rms 3-d")
      gradcheck(function(x) return mp.rms_norm(x, nil) end, { X { 3, 5 } }, LOOSE, "rms plain")
    end)

    -- EXACT: conv is linear in x and in w (bilinear), pooling by averages linear
    it("conv2d: stride, padding, dilation, groups, with and without bias", function()
      for _, c in ipairs {
        { x = { 2, 3, 5, 6 }, w = { 4, 3, 3, 2 }, o = {} },
        { x = { 1, 4, 6, 5 }, w = { 6, 2, 2, 3 }, o = { stride = { 2, 1 }, padding = { 1, 2 }, dilation = { 2, 1 }, groups = 2 } },
        { x = { 2, 2, 4, 4 }, w = { 2, 1, 3, 3 }, o = { padding = 1, groups = 2 }, nobias = true },
      } do
        local what = "conv2d " .. table.concat(c.x, "x") .. " * " .. table.concat(c.w, "x")
        if c.nobias then
          gradcheck32(function(x, w) return mp.conv2d(x, w, nil, c.o) end, { X(c.x), X(c.w) }, EXACT, what)
        else
          gradcheck32(function(x, w, b) return mp.conv2d(x, w, b, c.o) end, { X(c.x), X(c.w), X { c.w[1] } }, EXACT, what)
        end
      end
    end)

    it("avg_pool2d (padding counted) and adaptive_avg_pool2d (uneven windows)", function()   -- EXACT
      gradcheck32(function(x) return mp.avg_pool2d(x, 3, { stride = 2, padding = 1 }) end, { X { 2, 2, 5, 6 } }, EXACT,
                "avg_pool2d")
      gradcheck32(function(x) return mp.adaptive_avg_pool2d(x, { 3, 2 }) end, { X { 2, 7, 5 } }, EXACT, "adaptive")
    end)

    it("max_pool2d: each window's largest element, overlapping windows add", function()   -- KINK, no ties
      gradcheck32(function(x) return mp.max_pool2d(x, 2) end, { X({ 2, 2, 4, 6 }, { distinct = 0.3 }) }, KINK, "max 2")
      gradcheck32(function(x) return mp.max_pool2d(x, { 3, 2 }, { stride = 1, padding = 1 }) end,
                { X({ 1, 2, 5, 4 }, { distinct = 0.3 }) }, KINK, "max overlapping")
    end)

    -- LOOSE, as layer_norm: the batch statistics round in f32
    it("batch_norm in training (batch statistics) and evaluation (running statistics)", function()
      gradcheck32(function(x, w, b) return mp.batch_norm(x, nil, nil, w, b, { training = true }) end,
                { X { 3, 2, 2, 3 }, X { 2 }, X { 2 } }, LOOSE, "bn training")
      gradcheck32(function(x) return mp.batch_norm(x, nil, nil, nil, nil, { training = true }) end, { X { 4, 3 } }, LOOSE,
                "bn 2-d, no affine")
      local rm, rv = mp.tensor { 0.5, -1 }, mp.tensor { 2, 0.5 }
      gradcheck32(function(x, w, b) return mp.batch_norm(x, rm, rv, w, b) end, { X { 2, 2, 3 }, X { 2 }, X { 2 } }, EXACT,
                "bn evaluation")
    end)

    it("embedding: rows gather, repeated indices accumulate", function()   -- EXACT: a gather
      gradcheck(function(w) return mp.embedding(I32 { 1, 3, 1, 1 }, w) end, { X { 4, 3 } }, EXACT, "embedding 1-d")
      gradcheck(function(w) return mp.embedding(I32 { { 0, 2 }, { 2, 2 } }, w) end, { X { 3, 2 } }, EXACT,
                "embedding 2-d")
      local w = X { 4, 2 }
      mp.embedding(I32 { 1, 1, 1, 3 }, w):sum():backward()
      H.assert_same(w.grad:totable(), { { 0, 0 }, { 3, 3 }, { 0, 0 }, { 1, 1 } }, "embedding accumulation")
    end)

    it("dropout: with a fixed seed the mask repeats, and grad = R * mask / (1 - p)", function()
      local p = 0.4
      local x = X { 4, 5 }
      -- the mask itself: dropout of ones with the same seed and shape
      mp.manual_seed(77)
      local m = mp.dropout(mp.ones { 4, 5 }, p, true):totable()
      mp.manual_seed(77)
      local y = mp.dropout(x, p, true)
      local R = mp.randn { 4, 5 }
      y:backward(R)
      local g, r = x.grad:totable(), R:totable()
      local kept, dropped = 0, 0
      for i = 1, 4 do
        for j = 1, 5 do
          local mij = m[i][j]
          assert.is_true(mij == 0 or H.close(mij, 1 / (1 - p), 1e-6, 0), "mask value " .. mij)
          if mij == 0 then dropped = dropped + 1 else kept = kept + 1 end
          assert.is_true(H.close(g[i][j], r[i][j] * mij, 1e-6, 1e-7), "dropout grad")
        end
      end
      assert.is_true(kept > 0 and dropped > 0, "a 20-element mask at p = 0.4 both keeps and drops")
      -- finite differences with the seed reset before each evaluation: EXACT (linear in x)
      gradcheck(function(a) mp.manual_seed(77); return mp.dropout(a, p, true) end, { X { 4, 5 } }, EXACT, "dropout")
    end)

    it("dropout in eval mode and with p = 0 passes x and its gradient through", function()
      local x = X { 3 }
      mp.dropout(x, 0.5, false):sum():backward()
      H.assert_same(x.grad:totable(), { 1, 1, 1 }, "eval dropout grad")
      x.grad = nil
      mp.dropout(x, 0, true):sum():backward()
      H.assert_same(x.grad:totable(), { 1, 1, 1 }, "p = 0 grad")
    end)
  end)

  describe("joining and selecting", function()
    it("cat of 3 tensors along dims 1, 2 and -1", function()   -- EXACT
      gradcheck(function(a, b, c) return mp.cat({ a, b, c }, 1) end, { X { 1, 3 }, X { 2, 3 }, X { 3, 3 } }, EXACT, "cat 1")
      gradcheck(function(a, b, c) return mp.cat({ a, b, c }, 2) end, { X { 2, 1 }, X { 2, 3 }, X { 2, 2 } }, EXACT, "cat 2")
      gradcheck(function(a, b, c, d) return mp.cat({ a, b, c, d }, -1) end,
                { X { 2, 2, 1 }, X { 2, 2, 2 }, X { 2, 2, 1 }, X { 2, 2, 3 } }, EXACT, "cat -1 of 4")
    end)

    it("cat of more tensors than a node holds (9), and of one tensor used twice", function()   -- EXACT
      local xs = {}
      for i = 1, 9 do xs[i] = X { 2, i % 3 + 1 } end
      gradcheck(function(...) return mp.cat({ ... }, 2) end, xs, EXACT, "cat of 9")
      gradcheck(function(a) return mp.cat({ a, a * 2, a }, 1) end, { X { 2, 2 } }, EXACT, "cat repeated")
    end)

    -- a child process: the bug this guards against reads f16 buffers as f32
    it("cat of mixed dtypes sends each input its gradient in its own dtype", function()
      local r = H.child([[
        local x = mp.tensor({ 0.5, 1, 1.5, 2 }, { dtype = "f16" }):requires_grad(true)
        local z = mp.cat({ x:exp(), mp.tensor({ 5 }) }, 1)   -- f16 with f32 gives f32
        z:sum():backward()
        local g, want = x.grad:totable(), { 0.5, 1, 1.5, 2 }
        for i = 1, 4 do
          if math.abs(g[i] - math.exp(want[i])) > 1e-2 * math.exp(want[i]) then
            return string.format("element %d: %g, expected %g", i, g[i], math.exp(want[i]))
          end
        end
        return x.grad.dtype
      ]])
      assert.are.equal("OK:f16", r.out, r.err)
    end)

    it("where with cond from a comparison, tensors and numbers, broadcasting", function()   -- EXACT
      local c = X({ 2, 3 }, { grad = false }):gt(0)
      gradcheck(function(a, b) return mp.where(c, a, b) end, { X { 2, 3 }, X { 2, 3 } }, EXACT, "where")
      gradcheck(function(a, b) return mp.where(c, a, b) end, { X { 3 }, X { 2, 1 } }, EXACT, "where broadcast")
      gradcheck(function(a) return mp.where(c, a, 0) end, { X { 2, 3 } }, EXACT, "where a, 0")
      gradcheck(function(b) return mp.where(c, -1.5, b) end, { X { 2, 3 } }, EXACT, "where 1.5, b")
    end)

    it("where's cond from the input itself (a relu built by hand)", function()   -- KINK
      gradcheck(function(a) return mp.where(a:gt(0), a, a * 0.1) end, { X({ 3, 3 }, { away = 0.1 }) }, KINK, "leaky")
    end)
  end)

  describe("composites", function()
    it("a two-layer net end to end", function()   -- SMOOTH
      local t = I32 { 1, 0, 2 }
      gradcheck(function(x, w1, b1, w2)
        return mp.cross_entropy(mp.linear(mp.tanh(mp.linear(x, w1, b1)), w2), t)
      end, { X { 3, 4 }, X { 5, 4 }, X { 5 }, X { 3, 5 } }, SMOOTH, "mlp")
    end)

    it("attention-like: softmax(q k^T / sqrt(d)) v", function()   -- SMOOTH
      gradcheck(function(q, k, v)
        return mp.softmax(q:matmul(k:transpose(2, 3)) / 2, -1):matmul(v)
      end, { X { 2, 3, 4 }, X { 2, 3, 4 }, X { 2, 3, 2 } }, SMOOTH, "attention")
    end)
  end)
end)

---------------------------------------------------------------- semantics

describe("autograd semantics", function()
  before_each(function() mp.set_grad_enabled(true) end)

  it("a leaf's .grad accumulates across backward calls until set to nil", function()
    local x = mp.tensor({ 1, 2, 3 }):requires_grad(true)
    assert.is_nil(x.grad)
    ;(x * x):sum():backward()
    H.assert_same(x.grad:totable(), { 2, 4, 6 }, "first")
    ;(x * 3):sum():backward()
    H.assert_same(x.grad:totable(), { 5, 7, 9 }, "accumulated")
    x.grad = nil
    assert.is_nil(x.grad)
    ;(x * 3):sum():backward()
    H.assert_same(x.grad:totable(), { 3, 3, 3 }, "after reset")
  end)

  it("the .grad tensor read earlier sees later accumulation (it is updated in place)", function()
    local x = mp.tensor({ 1, 2 }):requires_grad(true)
    x:sum():backward()
    local g = x.grad
    x:sum():backward()
    H.assert_same(g:totable(), { 2, 2 }, "earlier reference")
  end)

  it(".grad may be set to a tensor of the same shape, and accumulation adds to it", function()
    local x = mp.tensor({ 1, 2 }):requires_grad(true)
    x.grad = mp.tensor { 10, 20 }
    x:sum():backward()
    H.assert_same(x.grad:totable(), { 11, 21 }, "grad")
    H.raises(function() x.grad = mp.zeros { 3 } end, { "grad", "shape" })
  end)

  it(".grad accepts only the leaf's dtype (a mismatch would be written as the leaf's dtype)", function()
    local x = mp.tensor({ 1, 2, 3, 4 }):requires_grad(true)
    H.raises(function() x.grad = mp.zeros({ 4 }, { dtype = "f16" }) end, { "grad", "dtype" })
    H.raises(function() x.grad = mp.zeros({ 4 }, { dtype = "i32" }) end, { "grad", "dtype" })
    assert.is_nil(x.grad)
  end)

  it("backward on a non-scalar without a gradient errors, with one it works", function()
    local x = mp.tensor({ 1, 2, 3 }):requires_grad(true)
    local y = x * 2
    H.raises(function() y:backward() end, { "backward", "gradient" })
    y:backward(mp.tensor { 1, 10, 100 })
    H.assert_same(x.grad:totable(), { 2, 20, 200 }, "grad")
  end)

  it("backward with a gradient of the wrong shape errors", function()
    local x = mp.tensor({ 1, 2, 3 }):requires_grad(true)
    local y = x * 2
    H.raises(function() y:backward(mp.ones { 2 }) end, { "shape" })
  end)

  it("backward on a 0-d and on a one-element tensor needs no gradient", function()
    local x = mp.tensor({ 3 }):requires_grad(true)
    ;(x * x):backward()
    H.assert_same(x.grad:totable(), { 6 }, "one element")
    x.grad = nil
    ;(x * x):sum():backward()
    H.assert_same(x.grad:totable(), { 6 }, "0-d")
  end)

  it("a second backward through the same graph errors clearly", function()
    local x = mp.tensor({ 1, 2 }):requires_grad(true)
    local y = (x * x):sum()
    y:backward()
    H.raises(function() y:backward() end, { "backward", "second time" })
    H.assert_same(x.grad:totable(), { 2, 4 }, "grad from the first pass only")
  end)

  it("backward on a tensor that does not require grad errors", function()
    H.raises(function() mp.ones({ 1 }):backward() end, { "require" })
  end)

  it("mp.no_grad() stops recording and restores the mode at scope end", function()
    local x = mp.tensor({ 1, 2 }):requires_grad(true)
    assert.is_true(mp.is_grad_enabled())
    do
      local _ <close> = mp.no_grad()
      assert.is_false(mp.is_grad_enabled())
      local y = x * 2
      assert.is_nil(y.grad_fn)
      assert.is_false(y:requires_grad())
      assert.is_true(y.is_leaf)
    end
    assert.is_true(mp.is_grad_enabled())
    local z = x * 2
    assert.are.equal("mul", z.grad_fn)
    -- restored on an error leaving the scope too
    pcall(function()
      local _ <close> = mp.no_grad()
      error("boom")
    end)
    assert.is_true(mp.is_grad_enabled())
    -- and nested guards restore the outer mode
    do
      local _ <close> = mp.no_grad()
      do
        local _ <close> = mp.no_grad()
      end
      assert.is_false(mp.is_grad_enabled())
    end
    assert.is_true(mp.is_grad_enabled())
  end)

  it("mp.set_grad_enabled returns the previous mode", function()
    assert.is_true(mp.set_grad_enabled(false))
    local x = mp.tensor({ 1 }):requires_grad(true)
    assert.is_nil((x * 2).grad_fn)
    assert.is_false(mp.set_grad_enabled(true))
    assert.is_not_nil((x * 2).grad_fn)
  end)

  it("detach() cuts the graph and shares the values", function()
    local x = mp.tensor({ 1, 2 }):requires_grad(true)
    local y = x * 3
    local d = y:detach()
    assert.is_false(d:requires_grad())
    assert.is_nil(d.grad_fn)
    assert.is_true(d.is_leaf)
    H.assert_same(d:totable(), { 3, 6 }, "values")
    local z = (d * x):sum()   -- only the x path is recorded
    z:backward()
    H.assert_same(x.grad:totable(), { 3, 6 }, "grad through the undetached path")
  end)

  it("requires_grad on an integer tensor errors; on a float leaf it sets and returns the tensor", function()
    H.raises(function() mp.tensor({ 1 }, { dtype = "i32" }):requires_grad(true) end, { "float" })
    H.raises(function() mp.tensor({ 1 }, { dtype = "u8" }):requires_grad(true) end, { "float" })
    local x = mp.tensor { 1 }
    assert.is_false(x:requires_grad())
    assert.are.equal(x, x:requires_grad(true))
    assert.is_true(x:requires_grad())
    x:requires_grad(false)
    assert.is_false(x:requires_grad())
    assert.is_true(mp.tensor({ 1 }, { dtype = "f16" }):requires_grad(true):requires_grad())
  end)

  -- API.md: mp.tensor(data [, opts]) -- opts {dtype=, device=, requires_grad=}
  it("mp.tensor takes requires_grad in its options (API.md)", function()
    local x = mp.tensor({ 1, 2 }, { requires_grad = true })
    assert.is_true(x:requires_grad())
    assert.is_true(x.is_leaf)
    assert.is_false(mp.tensor({ 1 }, { requires_grad = false }):requires_grad())
  end)

  it("requires_grad(true) on a non-leaf errors", function()
    local x = mp.tensor({ 1 }):requires_grad(true)
    local y = x * 2
    assert.is_false(y.is_leaf)
    H.raises(function() y:requires_grad(true) end, { "leaf" })
  end)

  it("ops on tensors that do not require grad record nothing", function()
    local a, b = mp.ones { 2 }, mp.ones { 2 }
    local c = mp.relu(a * b + 1):sum()
    assert.is_nil(c.grad_fn)
    assert.is_false(c:requires_grad())
  end)

  it("grad_fn names the op; is_leaf tells leaves from results", function()
    local x = mp.tensor({ 1, 2 }):requires_grad(true)
    assert.is_true(x.is_leaf)
    assert.is_nil(x.grad_fn)
    assert.are.equal("add", (x + x).grad_fn)
    assert.are.equal("matmul", x:reshape { 1, 2 }:matmul(x:reshape { 2, 1 }).grad_fn)
    assert.are.equal("sum", x:sum().grad_fn)
  end)

  it("only leaves get .grad; intermediate results do not", function()
    local x = mp.tensor({ 1, 2 }):requires_grad(true)
    local y = x * 2
    y:sum():backward()
    assert.is_nil(y.grad)
    assert.is_not_nil(x.grad)
  end)

  it("an f16 leaf accumulates an f16 gradient", function()
    local x = mp.tensor({ 1, 2 }, { dtype = "f16" }):requires_grad(true)
    ;(x * 3):sum():backward()
    assert.are.equal("f16", x.grad.dtype)
    H.assert_same(x.grad:totable(), { 3, 3 }, "f16 grad")
  end)

  it("a long chain (100k ops) runs backward and frees without overflowing the C stack", function()
    -- in a child process with a 256 KiB C stack: recursion over the chain would crash it
    local code = [[
      local mp = require "mp"
      local x = mp.tensor({ 1.0 }):requires_grad(true)
      local w = mp.tensor({ 1.0 })
      local y = x
      for i = 1, 100000 do
        y = y * 1.0000001          -- a scalar op: saves nothing
        if i % 2 == 0 then y = y * w end   -- a tensor op: saves its inputs
        if i % 5000 == 0 then collectgarbage() end   -- only the chain keeps the middle alive
      end
      y:sum():backward()
      io.write(string.format("grad=%.6f\n", x.grad:item()))
      -- and a chain that is dropped without a backward pass
      local z = x
      for i = 1, 100000 do z = z * w; if i % 5000 == 0 then collectgarbage() end end
      z = nil
      y = nil
      collectgarbage(); collectgarbage()
      io.write("freed\n")
    ]]
    local script = os.tmpname()
    local f = assert(io.open(script, "w")); f:write(code); f:close()
    local env = H.env { LUA_PATH = H.root .. "/lua/?.lua;" .. H.root .. "/lua/?/init.lua;;",
                        LUA_CPATH = H.build .. "/?.so;;" }
    local p = io.popen("ulimit -s 256 2>/dev/null; " .. env .. H.lua .. " " .. H.q(script)
                       .. " 2>&1; echo \"rc=$?\"")
    local out = p:read("a")
    p:close()
    os.remove(script)
    assert.is_truthy(out:find("rc=0", 1, true), out)
    assert.is_truthy(out:find("freed", 1, true), out)
    local g = tonumber(out:match("grad=([%d%.]+)"))
    -- 100k multiplications by f32(1.0000001) = 1 + 2^-23 (about 1.0000001192): ~e^0.0119
    assert.is_true(g and H.close(g, math.exp(100000 * math.log(1 + 2 ^ -23)), 1e-3, 0), out)
  end)
end)
