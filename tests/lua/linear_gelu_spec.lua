-- linear_gelu_spec.lua: mp.linear_gelu, the linear layer and its GELU as one op,
-- against mp.gelu(mp.linear(...)): values and gradients in f32, f16 and bf16,
-- both forms, with and without bias, under autocast; f64 gradcheck and
-- gradgradcheck; its errors; and the GPT MLP that uses it. On the default
-- device (MP_DEVICE=cuda: the emulated device too). Where the backend writes
-- the GELU in the GEMM's epilogue (CUDA's cuBLASLt, the tanh form) the values
-- may differ from the two ops' by the product's rounding before the GELU (the
-- epilogue applies GELU to the f32 sum): half an ulp of the pre-activation h
-- times GELU's slope (|gelu'| < 1.13), plus the two results' roundings and
-- the two GELU implementations' (the CUDA kernel's and the CPU's, which the
-- emulated cuBLASLt uses) differences, an ulp or two of y: |dy| <= 1.13 eps |h|
-- + 2 eps |y| (eps the dtype's spacing at 1); elsewhere bit for bit. On a GPU
-- (not the emulated device, which sums every product in one order) cuBLASLt
-- picks a kernel per epilogue, so the fused product and mp.linear's may sum k
-- in different orders (other tiles, split k): two f32 sums of the same terms
-- differ by at most 2 k u S (u = 2^-24, S = |x| |w|^T + |b|), which GELU's
-- slope carries into y; the H200 showed 1.9e-6 at y = 1.6 in f32 (k = 24,
-- outside the bound without this term).
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function two_ops(x, w, b, form) return mp.gelu(mp.linear(x, w, b), { approximate = form }) end
local function fused(x, w, b, form) return mp.linear_gelu(x, w, b, { approximate = form }) end

-- the epilogue path can round once fewer (see the head); else bit for bit
local EPS = { f32 = 2 ^ -23, f16 = 2 ^ -10, bf16 = 2 ^ -7 }
local function epilogue_may_differ(form) return form == "tanh" and mp.default_device() ~= "cpu" end
local function check(got, want, pre, sums, k, dt, form, what)
  local g, w = H.flat(got:f32():totable()), H.flat(want:f32():totable())
  assert.are.equal(#w, #g, what)
  if not epilogue_may_differ(form) then return H.assert_same(g, w, what) end
  local h = H.flat(pre:f32():totable())
  local order = {}   -- the two sums' difference in order, on a GPU (see the head)
  if H.gpu_hardware() then order = H.flat(sums:f32():totable()) end
  for i = 1, #w do
    local tol = 1.13 * EPS[dt] * math.abs(h[i]) + 2 * EPS[dt] * math.abs(w[i]) + 2 ^ -24
                + 1.13 * 2 * k * 2 ^ -24 * (order[i] or 0)
    if not (math.abs(g[i] - w[i]) <= tol) then
      error(string.format("%s: element %d: %.9g vs %.9g (bound %.3g)", what, i, g[i], w[i], tol), 2)
    end
  end
end

local function leaves(dt, shape_x, out, bias)
  mp.manual_seed(11)
  local x = mp.randn(shape_x):to(dt):requires_grad(true)
  local w = (mp.randn { out, shape_x[#shape_x] } * 0.5):to(dt):requires_grad(true)
  local b = bias and (mp.randn { out } * 0.5):to(dt):requires_grad(true) or nil
  return x, w, b
end

describe("mp.linear_gelu", function()
  for _, dt in ipairs { "f32", "f16", "bf16" } do
    for _, form in ipairs { "none", "tanh" } do
      for _, bias in ipairs { true, false } do
        it(("%s, approximate=%s, %s: the values and gradients of gelu(linear)"):format(dt, form,
           bias and "bias" or "no bias"), function()
          local x, w, b = leaves(dt, { 2, 5, 24 }, 40, bias)
          local want = two_ops(x, w, b, form)
          mp.manual_seed(3)
          local g = mp.randn(want.shape):to(dt)
          want:backward(g)
          local wx, ww, wb = x.grad, w.grad, b and b.grad
          x.grad, w.grad = nil, nil
          if b then b.grad = nil end
          local got = fused(x, w, b, form)
          assert.are.same(want.shape, got.shape)
          assert.are.equal(dt, got.dtype)
          local sums = mp.linear(x:detach():abs(), w:detach():abs(), b and b:detach():abs())
          check(got, want, mp.linear(x, w, b), sums, 24, dt, form, "forward")
          got:backward(g)
          -- the backward reads the pre-activation: in the epilogue path it is
          -- the same rounded product, so the gradients are the two ops' exactly
          H.assert_same(H.flat(x.grad:f32():totable()), H.flat(wx:f32():totable()), "dx")
          H.assert_same(H.flat(w.grad:f32():totable()), H.flat(ww:f32():totable()), "dw")
          if b then H.assert_same(H.flat(b.grad:f32():totable()), H.flat(wb:f32():totable()), "db") end
        end)
      end
    end
  end

  for _, low in ipairs { "f16", "bf16" } do
    it("under " .. low .. " autocast: f32 leaves, a " .. low .. " result, as linear then gelu", function()
      local x, w, b = leaves("f32", { 6, 16 }, 24, true)
      local want, got
      do
        local _ <close> = mp.amp.autocast(low)
        want = two_ops(x, w, b, "none")
        got = fused(x, w, b, "none")
      end
      assert.are.equal(low, got.dtype)
      check(got, want, nil, nil, 16, low, "none", "autocast forward")
      got:sum():backward()
      assert.are.equal("f32", w.grad.dtype)
      local gw = H.flat(w.grad:totable())
      w.grad, x.grad, b.grad = nil, nil, nil
      want:sum():backward()
      H.assert_same(gw, H.flat(w.grad:totable()), "autocast dw")
    end)
  end

  it("gradcheck and gradgradcheck in f64 (both forms)", function()
    if not pcall(mp.zeros, { 1 }, { dtype = "f64" }) then
      return H.gradcheck32(function(x, w, b) return fused(x, w, b, "none") end,
                           { { shape = { 3, 4 }, v = H.uniform(12, -2, 2) }, { shape = { 5, 4 }, v = H.uniform(20, -1, 1) },
                             { shape = { 5 }, v = H.uniform(5, -1, 1) } }, "linear_gelu f32")
    end
    for _, form in ipairs { "none", "tanh" } do
      mp.manual_seed(5)
      local x = mp.randn({ 3, 4 }, { dtype = "f64" }):requires_grad(true)
      local w = mp.randn({ 5, 4 }, { dtype = "f64" }):requires_grad(true)
      local b = mp.randn({ 5 }, { dtype = "f64" }):requires_grad(true)
      local f = function(x_, w_, b_) return fused(x_, w_, b_, form) end
      assert.is_true(mp.autograd.gradcheck(f, { x, w, b }))
      assert.is_true(mp.autograd.gradgradcheck(f, { x, w, b }))
    end
  end)

  it("refuses bad shapes, dtypes and options, naming mp.linear_gelu", function()
    local x, w = mp.randn { 2, 3 }, mp.randn { 4, 3 }
    H.raises(function() mp.linear_gelu(x, mp.randn { 4, 5 }) end, { "mp.linear_gelu", "does not match weight" })
    H.raises(function() mp.linear_gelu(x, w, mp.randn { 3 }) end, { "mp.linear_gelu", "bias" })
    H.raises(function() mp.linear_gelu(x, w:f16()) end, { "mp.linear_gelu", "dtypes" })
    H.raises(function() mp.linear_gelu(x, w, nil, { approximate = "erf" }) end,
             { "mp.linear_gelu", "approximate must be" })
    H.raises(function() mp.linear_gelu(x, w, nil, { approx = "tanh" }) end, { "mp.linear_gelu", "approx" })
  end)

  it("records one node named linear_gelu", function()
    local x, w, b = leaves("f32", { 2, 8 }, 4, true)
    assert.are.equal("linear_gelu", tostring(fused(x, w, b).grad_fn):match("linear_gelu"))
  end)
end)

describe("scripts/models/gpt.lua's MLP", function()
  local GPT = dofile(H.root .. "/scripts/models/gpt.lua")

  it("runs c_fc and its GELU as one op, with the two modules' loss and gradients bit for bit", function()
    local function run(unfused)
      mp.manual_seed(1)
      local model = GPT { vocab = 23, ctx = 8, layers = 1, dim = 16, heads = 2 }
      local mlp
      for _, blk in ipairs(model.h) do mlp = blk.mlp end
      if unfused then mlp.c_fc:register_forward_hook(function() end) end   -- a hook: the modules run apart
      local idx = mp.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 }, { 8, 7, 6, 5, 4, 3, 2, 1 } }, { dtype = "i32" })
      local targets = mp.tensor({ 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 7, 8, 9, 10 }, { dtype = "i32" })
      local loss = mp.cross_entropy(model(idx):reshape { -1, 23 }, targets)
      loss:backward()
      return loss:item(), H.flat(mlp.c_fc.weight.grad:totable()), H.flat(mlp.c_fc.bias.grad:totable())
    end
    local fused_op, calls = mp.linear_gelu, 0
    mp.linear_gelu = function(...) calls = calls + 1 return fused_op(...) end
    local ok1, l1, w1, b1 = pcall(run, false)
    local fused_calls = calls
    local ok2, l2, w2, b2 = pcall(run, true)
    mp.linear_gelu = fused_op
    assert(ok1 and ok2, tostring(ok1 and l2 or l1))
    assert.are.equal(1, fused_calls, "the plain MLP takes the fused op")
    assert.are.equal(1, calls, "a hooked c_fc runs the modules apart")
    assert.are.equal(l2, l1)
    H.assert_same(w1, w2, "c_fc.weight.grad")
    H.assert_same(b1, b2, "c_fc.bias.grad")
  end)
end)

describe("scripts/models/gpt.lua's MLP inside mp.fp8.autocast", function()
  local GPT = dofile(H.root .. "/scripts/models/gpt.lua")
  it("runs c_fc as nn.Linear does there (in FP8), not as the fused op", function()
    mp.manual_seed(1)
    local model = GPT { vocab = 23, ctx = 8, layers = 1, dim = 16, heads = 2 }
    local idx = mp.tensor({ { 1, 2, 3, 4, 5, 6, 7, 8 } }, { dtype = "i32" })
    local r = mp.fp8.current {}
    local fused_op, calls = mp.linear_gelu, 0
    mp.linear_gelu = function(...) calls = calls + 1 return fused_op(...) end
    local ok, err = pcall(function()
      local _ <close> = mp.fp8.autocast(r)
      model(idx)
    end)
    mp.linear_gelu = fused_op
    assert(ok, tostring(err))
    assert.are.equal(0, calls, "the fused op bypassed FP8")
    local names = {}
    for _, t in ipairs(r._scaler.tensors) do names[#names + 1] = t.name end
    assert.are.equal(4 * 3, #names, "c_attn, attn.c_proj, c_fc and mlp.c_proj in FP8 (x, w, g each): "
                     .. table.concat(names, " "))
  end)
end)

describe("mp.linear's backward", function()
  -- the bias gradient: a reduce over the rows, or on CUDA the weight GEMM's
  -- epilogue (cuBLASLt BGRADB): f32 sums either way, in different orders
  for _, dt in ipairs { "f32", "f16", "bf16" } do
    it(dt .. ": dx, dw and db on the default device as on the CPU (within the sums' rounding)", function()
      local function grads(device)
        mp.manual_seed(9)
        local x = mp.randn { 3, 50, 24 }:to(dt):to(device):requires_grad(true)
        local w = (mp.randn { 40, 24 } * 0.5):to(dt):to(device):requires_grad(true)
        local b = (mp.randn { 40 } * 0.5):to(dt):to(device):requires_grad(true)
        mp.manual_seed(3)
        local g = mp.randn { 3, 50, 40 }:to(dt):to(device)
        mp.linear(x, w, b):backward(g)
        return { x.grad, w.grad, b.grad }
      end
      local here, cpu = grads(mp.default_device()), grads("cpu")
      local rtol = ({ f32 = 1e-5, f16 = 2e-3, bf16 = 1.6e-2 })[dt]
      for i, name in ipairs { "dx", "dw", "db" } do
        assert.are.equal(dt, here[i].dtype, name)
        H.assert_close(H.flat(here[i]:f32():cpu():totable()), H.flat(cpu[i]:f32():totable()), rtol, rtol, name)
      end
    end)
  end
end)
