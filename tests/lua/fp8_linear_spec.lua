-- fp8_linear_spec.lua: mp.fp8.linear (lua/mp/fp8/linear.lua), the FP8 linear
-- layer's forward and its three gradients against a reference built from the
-- decoded codes (codes x scales, in f32 matmuls), per recipe, on shapes that are
-- not multiples of 128 (partial tiles); and loosely against the f32 linear.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

-- the values q stands for, f32 {rows, k}: each code times its group's decode scale
local function decoded(q, scales, gran)
  local c = mp.fp8.codes(q):to("f32")
  local rows, k = c.shape[1], c.shape[2]
  if gran == "tensor" then return c * scales end
  local s, cv = scales:to("cpu"):to("f32"):totable(), c:to("cpu"):totable()
  local out = {}
  for r = 1, rows do
    local row = {}
    for j = 1, k do
      if gran == "mx" then   -- 1x32 blocks, E8M0 bytes: 2^(b - 127)
        row[j] = cv[r][j] * 2.0 ^ (s[r][(j - 1) // 32 + 1] - 127)
      else
        local sr = gran == "tile" and s[r] or s[(r - 1) // 128 + 1]
        row[j] = cv[r][j] * sr[(j - 1) // 128 + 1]
      end
    end
    out[r] = row
  end
  return mp.tensor(out):to(c.device)
end

-- q(src) as the linear quantizes the tensor of kind `kind` for this recipe
local function ref_quant(fs, layer, kind, src)
  local ts = fs.by_name[layer .. "." .. kind]
  local q, s = mp.fp8.quantize(src, {format = ts.format, granularity = ts.granularity, scale = fs.recipe:scale(ts)})
  return decoded(q, s, ts.granularity), q
end

-- |a - b| <= rtol * bound elementwise, bound = |A| |B|^T of the product's operands
local function assert_product(got, want, bound, rtol, what)
  local g, w, b = H.flat(got:to("cpu"):totable()), H.flat(want:to("cpu"):totable()), H.flat(bound:to("cpu"):totable())
  assert.are.equal(#w, #g, what .. ": element count")
  for i = 1, #w do
    if math.abs(g[i] - w[i]) > rtol * b[i] + 1e-30 then
      error(string.format("%s: element %d is %.9g, the reference %.9g (bound %.3g)", what, i, g[i], w[i], b[i]), 2)
    end
  end
end

-- The gradients' bound, relative to |A| |B|^T: f32 sums (the CPU, the emulated
-- device, and cuBLAS's bf16 GEMMs where cuBLASLt declines the FP8 one) keep well
-- within 1e-5 on these k (130..200). A GPU's FP8 tensor cores do not sum in f32
-- even in cuBLASLt's precise mode: each 32-deep MMA step keeps about 13 bits
-- (the H200's parity cases: an rms error of 2^-13 of the outputs), and its sums
-- are promoted to f32 every 128 of k, so a chunk's error is at most 4 steps of
-- 2^-13 |A| |B|^T: 2^-11. Under the 1e-5 bound the H200 reported each test's
-- first failing element, 1.7e-5 to 4.8e-5 of it (the worst was not printed).
-- A wrong scale, block or layout is off by far more (order 1).
local F32_SUMS = H.gpu_hardware() and 2 ^ -11 or 1e-5

local function rel(a, b)
  local d = (a:to("f32") - b:to("f32")):pow(2):sum():item()
  return math.sqrt(d / b:to("f32"):pow(2):sum():item())
end

local recipes = {
  {"delayed (hybrid)", function() return mp.fp8.delayed{history = 4} end},
  {"current", function() return mp.fp8.current{} end},
  {"block", function() return mp.fp8.block{} end},
  {"mx", function() return mp.fp8.mx{} end},
}

describe("mp.fp8.linear", function()
  for _, case in ipairs(recipes) do
    it(case[1] .. ": forward and dx, dw, db equal the decoded reference to f32 rounding", function()
      mp.manual_seed(7)
      local fs = mp.fp8.Scaler{recipe = case[2]()}
      local x0 = mp.randn({2, 75, 200})       -- 150 rows, k 200: partial tiles and blocks
      local w = (mp.randn({130, 200}) * 0.1):requires_grad(true)
      local b = mp.randn({130}):requires_grad(true)
      -- a first step, so delayed scaling has a scale of its own (not 1) in the second
      for step = 1, 2 do
        w.grad, b.grad = nil, nil
        local x = x0:clone():requires_grad(true)
        local y = mp.fp8.linear(x, w, b, fs, {name = "l", out_dtype = "f32"})
        assert.are.same({2, 75, 130}, y.shape)
        assert.are.equal("fp8_linear", y.grad_fn)
        local r = mp.randn({2, 75, 130})
        if step == 2 then
          -- the reference: the same quantizations, decoded, multiplied in f32
          local x2 = x0:reshape{-1, 200}:to("bf16")
          local X = ref_quant(fs, "l", "x", x2)
          local W = ref_quant(fs, "l", "w", w:detach())
          local want = mp.matmul(X, W:transpose(1, 2)) + b:detach()
          local bound = mp.matmul(X:abs(), W:abs():transpose(1, 2)) + b:detach():abs()
          assert_product(y:reshape{-1, 130}, want, bound, F32_SUMS, "y")
          assert.is_true(rel(y, mp.linear(x0, w:detach(), b:detach())) < 0.08, "y near the f32 linear");
          (y * r):sum():backward()
          local g2 = r:reshape{-1, 130}
          local G = ref_quant(fs, "l", "g", g2)
          local WT, qwt = ref_quant(fs, "l", "w", w:detach():transpose(1, 2))
          local GT = ref_quant(fs, "l", "g", g2:transpose(1, 2))
          local XT = ref_quant(fs, "l", "x", x2:transpose(1, 2))
          if fs.by_name["l.w"].granularity == "tensor" then
            -- per tensor, quantizing w^T gives the codes of w transposed
            local _, qw = ref_quant(fs, "l", "w", w:detach())
            assert.are.same(mp.fp8.codes(qw):to("f32"):transpose(1, 2):totable(), mp.fp8.codes(qwt):to("f32"):totable())
          end
          assert_product(x.grad:reshape{-1, 200}, mp.matmul(G, WT:transpose(1, 2)),
                         mp.matmul(G:abs(), WT:abs():transpose(1, 2)), F32_SUMS, "dx")
          assert_product(w.grad, mp.matmul(GT, XT:transpose(1, 2)), mp.matmul(GT:abs(), XT:abs():transpose(1, 2)),
                         F32_SUMS, "dw")
          H.assert_close(b.grad:totable(), g2:sum(1):totable(), 1e-6, 1e-5, "db")
          assert.are.equal("f32", w.grad.dtype)
          assert.are.equal("f32", x.grad.dtype)
          -- and near the f32 layer's gradients (e5m2 gradients under hybrid: 2 mantissa bits)
          local xr = x0:clone():requires_grad(true)
          local wr = w:detach():clone():requires_grad(true)
          local br = b:detach():clone():requires_grad(true);
          (mp.linear(xr, wr, br) * r):sum():backward()
          assert.is_true(rel(x.grad, xr.grad) < 0.15, "dx near the f32 one")
          assert.is_true(rel(w.grad, wr.grad) < 0.15, "dw near the f32 one")
        else
          (y * r):sum():backward()
        end
        fs:update()
      end
      local ts = fs.by_name["l.x"]
      assert.are.equal(2, ts.steps_seen)
    end)
  end

  it("records per step: amax as a running max over micro-batches, numel summed, the multiplier used", function()
    local fs = mp.fp8.Scaler{recipe = mp.fp8.current{}}
    local w = mp.full({3, 5}, 0.5):requires_grad(true)
    local xa = mp.full({2, 5}, 1.0):requires_grad(true)
    local xb = mp.full({4, 5}, -3.0):requires_grad(true)
    mp.fp8.linear(xa, w, nil, fs, {name = "fc"}):to("f32"):sum():backward()
    mp.fp8.linear(xb, w, nil, fs, {name = "fc"}):to("f32"):sum():backward()
    local ts = fs.by_name["fc.x"]
    assert.are.equal(3, ts.amax:item())
    assert.are.equal(30, ts.numel)
    assert.are.equal(H.f32(448 / 3), ts.used:item())   -- the last micro-batch's
    assert.are.equal(0.5, fs.by_name["fc.w"].amax:item())
    assert.are.equal(30, fs.by_name["fc.w"].numel)
    assert.are.equal(1, fs.by_name["fc.g"].amax:item())   -- dy of a sum: ones
    assert.are.equal("e5m2", fs.by_name["fc.g"].format)
    fs:update()
    assert.is_nil(ts.amax)
    assert.are.equal(0, ts.numel)
    assert.are.equal(1, ts.steps_seen)
  end)

  it("current scaling's multiplier used is 1 for a zero or non-finite amax (the quantizer's rule); eval records nothing", function()
    local fs = mp.fp8.Scaler{recipe = mp.fp8.current{}}
    mp.fp8.linear(mp.full({1, 3}, 1 / 0), mp.zeros({2, 3}), nil, fs)
    assert.are.equal(1, fs.by_name["linear.x"].used:item())
    assert.are.equal(1, fs.by_name["linear.w"].used:item())
    fs:update()
    do
      local _ <close> = mp.no_grad()
      mp.fp8.linear(mp.ones({1, 3}), mp.ones({2, 3}), nil, fs)
    end
    assert.is_nil(fs.by_name["linear.x"].amax)
    assert.are.equal(0, fs.by_name["linear.x"].numel)
  end)

  it("a bare recipe gets a holder of its own; grads of bf16 inputs stay bf16; no bias", function()
    local r = mp.fp8.current{}
    local x = mp.randn({4, 33}):to("bf16"):requires_grad(true)
    local w = mp.randn({17, 33}):requires_grad(true)
    local y = mp.fp8.linear(x, w, nil, r)
    assert.are.equal("bf16", y.dtype)
    y:to("f32"):sum():backward()
    assert.are.equal("bf16", x.grad.dtype)
    assert.are.equal("f32", w.grad.dtype)
    assert.are.equal("linear.x", r._scaler.tensors[1].name)
  end)

  it("refuses bad arguments, naming them", function()
    local w = mp.randn({3, 4})
    H.raises(function() mp.fp8.linear(mp.randn({2, 4}), w, nil, {}) end, {"mp.fp8.linear", "recipe"})
    H.raises(function() mp.fp8.linear(mp.randn({2, 4}), w, nil, mp.fp8.current{}, {out_dtype = "f64"}) end,
             {"mp.fp8.linear", "out_dtype"})
    H.raises(function() mp.fp8.linear(mp.randn({2, 4}), w, mp.randn({4}), mp.fp8.current{}) end,
             {"mp.fp8.linear", "bias"})
    H.raises(function() mp.fp8.linear(mp.randn({2, 5}), w, nil, mp.fp8.current{}) end, {"last dim is 5", "4"})
  end)
end)

-- mp.fp8.autocast(r, {matmul = true}): the functional mp.linear, mp.matmul and
-- Tensor:matmul run through the FP8 linear Function (lua/lfp8.c's route,
-- lua/mp/fp8/holder.lua), states "mp.linear<i>" / "mp.matmul<i>"
describe("mp.fp8.autocast{matmul = true}", function()
  local function grads_ref(fs, layer, x2, w, g2)
    local G = ref_quant(fs, layer, "g", g2)
    local WT = ref_quant(fs, layer, "w", w:transpose(1, 2))
    local GT = ref_quant(fs, layer, "g", g2:transpose(1, 2))
    local XT = ref_quant(fs, layer, "x", x2:transpose(1, 2))
    return mp.matmul(G, WT:transpose(1, 2)), mp.matmul(G:abs(), WT:abs():transpose(1, 2)),
           mp.matmul(GT, XT:transpose(1, 2)), mp.matmul(GT:abs(), XT:abs():transpose(1, 2))
  end

  for _, case in ipairs({recipes[1], recipes[3]}) do
    it(case[1] .. ": mp.linear's forward and grads equal the decoded reference", function()
      mp.manual_seed(11)
      local fs = mp.fp8.Scaler{recipe = case[2]()}
      local x0 = mp.randn({3, 50, 144})
      local w = (mp.randn({70, 144}) * 0.1):requires_grad(true)
      local b = mp.randn({70}):requires_grad(true)
      for step = 1, 2 do
        w.grad, b.grad = nil, nil
        local x = x0:clone():requires_grad(true)
        local y
        do
          local _ <close> = mp.fp8.autocast(fs, {matmul = true})
          y = mp.linear(x, w, b)
        end
        assert.are.equal("fp8_linear", y.grad_fn)
        assert.are.equal("bf16", y.dtype)
        assert.are.same({3, 50, 70}, y.shape)
        local r = mp.randn({3, 50, 70})
        if step == 2 then
          local x2 = x0:reshape{-1, 144}:to("bf16")
          local X = ref_quant(fs, "mp.linear1", "x", x2)
          local W = ref_quant(fs, "mp.linear1", "w", w:detach())
          local want = (mp.matmul(X, W:transpose(1, 2)) + b:detach()):to("bf16"):to("f32")
          local bound = mp.matmul(X:abs(), W:abs():transpose(1, 2)) + b:detach():abs()
          -- one bf16 rounding of the f32 product: half an ulp of bf16 each side
          assert_product(y:reshape{-1, 70}:to("f32"), want, bound, 2 ^ -8, "y")
          ;(y:to("f32") * r):sum():backward()
          local g2 = r:reshape{-1, 70}:to("bf16")
          local dx, dxb, dw, dwb = grads_ref(fs, "mp.linear1", x2, w:detach(), g2)
          assert_product(x.grad:reshape{-1, 144}, dx, dxb, F32_SUMS, "dx")
          assert_product(w.grad, dw, dwb, F32_SUMS, "dw")
          H.assert_close(b.grad:totable(), g2:to("f32"):sum(1):totable(), 1e-6, 1e-5, "db")
        else
          (y:to("f32") * r):sum():backward()
        end
        fs:update()
      end
      assert.are.same({"mp.linear1.x", "mp.linear1.w", "mp.linear1.g"},
                      {fs.tensors[1].name, fs.tensors[2].name, fs.tensors[3].name})
      assert.are.equal(3, #fs.tensors)   -- the same call each step: the same states
      assert.are.equal(2, fs.by_name["mp.linear1.x"].steps_seen)
    end)

    it(case[1] .. ": 2-D mp.matmul and Tensor:matmul, forward and both grads against the decoded reference", function()
      mp.manual_seed(12)
      local fs = mp.fp8.Scaler{recipe = case[2]()}
      local a0, b0 = mp.randn({40, 136}), mp.randn({136, 30}) * 0.5
      for step = 1, 2 do
        local a, b = a0:clone():requires_grad(true), b0:clone():requires_grad(true)
        local y, y2
        do
          local _ <close> = mp.fp8.autocast(fs, {matmul = true})
          y = mp.matmul(a, b)
          y2 = a:matmul(b)
        end
        assert.are.equal("fp8_linear", y.grad_fn)
        assert.are.equal("fp8_linear", y2.grad_fn)
        assert.are.same({40, 30}, y.shape)
        local r = mp.randn({40, 30})
        if step == 2 then
          local x2 = a0:to("bf16")
          local w = b0:transpose(1, 2)
          local X = ref_quant(fs, "mp.matmul1", "x", x2)
          local W = ref_quant(fs, "mp.matmul1", "w", w)
          local want = mp.matmul(X, W:transpose(1, 2)):to("bf16"):to("f32")
          assert_product(y:to("f32"), want, mp.matmul(X:abs(), W:abs():transpose(1, 2)), 2 ^ -8, "y")
          ;(y:to("f32") * r):sum():backward()
          local g2 = r:to("bf16")
          local da, dab, dw, dwb = grads_ref(fs, "mp.matmul1", x2, w, g2)
          assert_product(a.grad, da, dab, F32_SUMS, "da")
          assert_product(b.grad, dw:transpose(1, 2), dwb:transpose(1, 2), F32_SUMS, "db")
          assert.is_true(rel(b.grad, mp.matmul(a0:transpose(1, 2), r)) < 0.15, "db near the f32 one")
        else
          (y:to("f32") * r + y2:to("f32") * r):sum():backward()
        end
        fs:update()
      end
      assert.are.equal(6, #fs.tensors)   -- mp.matmul1 and mp.matmul2, the same each step
      assert.is_not_nil(fs.by_name["mp.matmul2.x"])
    end)
  end

  it("off by default, in a region of mp.amp.autocast(false) and in mp.fp8.autocast(false): the plain autocast's result", function()
    mp.manual_seed(13)
    local x, w, b = mp.randn({6, 32}):requires_grad(true), mp.randn({16, 32}), mp.randn({16})
    local m = mp.randn({32, 8})
    local ref_y, ref_m
    do
      local _ <close> = mp.amp.autocast("bf16")
      ref_y, ref_m = mp.linear(x, w, b), mp.matmul(x, m)
    end
    local r = mp.fp8.delayed{}
    local function same(y, want)
      assert.are_not.equal("fp8_linear", y.grad_fn)
      assert.are.equal(want.dtype, y.dtype)
      assert.are.same(want:to("f32"):totable(), y:to("f32"):totable())
    end
    do
      local _ <close> = mp.fp8.autocast(r)
      same(mp.linear(x, w, b), ref_y)
      same(mp.matmul(x, m), ref_m)
      same(x:matmul(m), ref_m)
    end
    do
      local _ <close> = mp.fp8.autocast(r, {matmul = true})
      do
        local _ <close> = mp.fp8.autocast(false)
        same(mp.linear(x, w, b), ref_y)
      end
      do
        local _ <close> = mp.amp.autocast(false)
        local y = mp.linear(x, w, b)
        assert.are_not.equal("fp8_linear", y.grad_fn)
        assert.are.equal("f32", y.dtype)
      end
      assert.are.equal("fp8_linear", mp.linear(x, w, b).grad_fn)
    end
    -- closed: nothing routed any more
    local y = mp.linear(x, w, b)
    assert.are.equal("f32", y.dtype)
    assert.are_not.equal("fp8_linear", y.grad_fn)
  end)

  it("batched matmuls stay bf16 (plain autocast's result); an f32-class registration keeps an op out", function()
    mp.manual_seed(14)
    local a, b = mp.randn({2, 5, 32}):requires_grad(true), mp.randn({2, 32, 8})
    local want
    do
      local _ <close> = mp.amp.autocast("bf16")
      want = mp.matmul(a, b)
    end
    local fs = mp.fp8.Scaler{recipe = mp.fp8.current{}}
    do
      local _ <close> = mp.fp8.autocast(fs, {matmul = true})
      local y = mp.matmul(a, b)
      assert.are_not.equal("fp8_linear", y.grad_fn)
      assert.are.equal("bf16", y.dtype)
      assert.are.same(want:to("f32"):totable(), y:to("f32"):totable())
    end
    assert.are.equal(0, #fs.tensors)
    local was = mp.amp.classes().matmul
    mp.amp.register("matmul", "f32")
    local ok, err = pcall(function()
      local _ <close> = mp.fp8.autocast(fs, {matmul = true})
      local y = mp.matmul(mp.randn({4, 32}):requires_grad(true), mp.randn({32, 8}))
      assert.are.equal("f32", y.dtype)
      assert.are_not.equal("fp8_linear", y.grad_fn)
    end)
    mp.amp.register("matmul", was)
    assert(ok, err)
  end)

  it("mp.linear_gelu: the FP8 linear (states mp.linear_gelu<i>) then mp.gelu; its own errors pass through", function()
    mp.manual_seed(15)
    local x = mp.randn({5, 48}):requires_grad(true)
    local w, b = mp.randn({24, 48}) * 0.2, mp.randn({24})
    local fs = mp.fp8.Scaler{recipe = mp.fp8.current{}}
    local y
    do
      local _ <close> = mp.fp8.autocast(fs, {matmul = true})
      y = mp.linear_gelu(x, w, b, {approximate = "tanh"})
      H.raises(function() mp.linear_gelu(x, w, b, {approximate = "erf"}) end, {"mp.linear_gelu", "approximate"})
    end
    assert.is_not_nil(fs.by_name["mp.linear_gelu1.w"])
    assert.is_nil(fs.by_name["mp.linear_gelu2.w"], "a call the op refuses makes no states")
    local want
    do
      local _ <close> = mp.amp.autocast("bf16")
      want = mp.gelu(mp.fp8.linear(x, w, b, mp.fp8.current{}, {name = "r"}), {approximate = "tanh"})
    end
    assert.are.equal(want.dtype, y.dtype)
    assert.are.same(want:to("f32"):totable(), y:to("f32"):totable())
    y:to("f32"):sum():backward()
    assert.are.same({5, 48}, x.grad.shape)
  end)

  it("numbers the calls from the outermost region's opening (micro-batches share states); refuses a bad option", function()
    local fs = mp.fp8.Scaler{recipe = mp.fp8.current{}}
    local x, w = mp.randn({4, 16}), mp.randn({8, 16})
    for _ = 1, 3 do
      local _ <close> = mp.fp8.autocast(fs, {matmul = true})
      mp.linear(x, w)
      do
        local _ <close> = mp.fp8.autocast(fs, {matmul = true})   -- nested: the count goes on
        mp.linear(x, w)
      end
    end
    assert.are.equal(6, #fs.tensors)
    assert.are.equal(3, fs.by_name["mp.linear2.x"].numel // 64)
    H.raises(function() mp.fp8.autocast(fs, {matmul = "yes"}) end, {"mp.fp8.autocast", "matmul", "true or false"})
    H.raises(function() mp.fp8.autocast(fs, {matmul = 1}) end, {"mp.fp8.autocast", "matmul"})
    H.raises(function() mp.fp8.autocast(fs, {matmull = true}) end, {"mp.fp8.autocast", "matmull"})
    -- an op's own errors pass through unrouted
    local _ <close> = mp.fp8.autocast(fs, {matmul = true})
    H.raises(function() mp.linear(mp.randn({4, 5}), w) end, {"mp.linear"})
    H.raises(function() mp.matmul(mp.randn({4, 5}), mp.randn({4, 5})) end, {"mp.matmul"})
  end)
end)
