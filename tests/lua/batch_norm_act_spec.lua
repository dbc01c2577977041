-- batch_norm_act_spec.lua: mp.batch_norm's residual and activation options (and
-- nn.BatchNorm2d's), relu(batch_norm(x) + z) as one op where the backend fuses
-- them (engine/ops_batch_norm.c batch_norm_act; kernels/cpu/cpu_batch_norm.c),
-- against the three ops written out: the output, every gradient (x, weight,
-- bias, z) and the running statistics bit for bit, in f32, f16 and bf16, with
-- negatives, zeros and sums that cancel to zero; the small ResNet of
-- scripts/models/resnet.lua trained a few steps both ways, losses equal bit for
-- bit (f32 and bf16 autocast); the errors. On the default device
-- (MP_DEVICE=cuda: the emulated device, which has no fused entry and runs the
-- three ops).
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local nn = mp.nn

-- each element's f32 bits (f16/bf16 widen exactly): -0 and +0 differ, NaN is itself
local function bits(t) return H.flat(t:detach():to("f32"):view("i32"):totable()) end
local function same(got, want, what) return H.assert_same(bits(got), bits(want), what) end

-- x {n, c, h, w} with negatives, exact zeros and one constant channel (variance 0:
-- bn gives the bias exactly), and z = -bias on that channel so that sums cancel to 0
local function inputs(dt, seed)
  mp.manual_seed(seed)
  local n, c, h, w = 3, 4, 5, 6
  local x = mp.randn { n, c, h, w } * 2 - 0.5
  x = x * mp.gt(mp.rand { n, c, h, w }, 0.2):to("f32")                     -- zeros
  local keep = mp.tensor({ 1, 1, 0, 1 }):reshape { 1, c, 1, 1 }
  x = x * keep + (1 - keep) * 0.75                                      -- channel 3 constant
  local wt, b = mp.randn { c } * 0.5 + 1, mp.tensor { 0.25, -0.5, 0.375, 0 }
  local z = mp.randn { n, c, h, w } * mp.gt(mp.rand { n, c, h, w }, 0.3):to("f32")
  z = z * keep - (1 - keep) * b:reshape { 1, c, 1, 1 }                 -- channel 3: bias + z = 0
  return x:to(dt), wt, b, z:to(dt)
end

local function leaf(t) return t:detach():requires_grad(true) end

-- the output and gradients of one way (f(x, rm, rv, w, b, z, opts))
local function run(f, dt, with_z, relu, training)
  local x0, w0, b0, z0 = inputs(dt, 7)
  local x, w, b, z = leaf(x0), leaf(w0), leaf(b0), with_z and leaf(z0) or nil
  local rm, rv = mp.randn { 4 } * 0.1, mp.rand { 4 } + 0.5
  local y = f(x, rm, rv, w, b, z, { training = training, momentum = 0.3 }, relu)
  mp.manual_seed(9)
  local g = (mp.randn(y.shape) * mp.gt(mp.rand(y.shape), 0.25):to("f32")):to(dt)
  ;(y:to("f32") * g:to("f32")):sum():backward()
  return { y = y, gx = x.grad, gw = w.grad, gb = b.grad, gz = z and z.grad, rm = rm, rv = rv }
end

local function three_ops(x, rm, rv, w, b, z, o, relu)
  local y = mp.batch_norm(x, rm, rv, w, b, o)
  if z then y = y + z end
  return relu and mp.relu(y) or y
end

local function one_op(x, rm, rv, w, b, z, o, relu)
  o.residual, o.activation = z, relu and "relu" or "none"
  return mp.batch_norm(x, rm, rv, w, b, o)
end

describe("mp.batch_norm's residual and activation", function()
  it("give relu(batch_norm(x) + z) bit for bit: output, gradients, running statistics", function()
    for _, dt in ipairs { "f32", "bf16", "f16" } do
      for _, training in ipairs { true, false } do
        for _, case in ipairs { { true, true }, { false, true }, { true, false } } do
          local with_z, relu = case[1], case[2]
          local what = string.format("%s training=%s residual=%s relu=%s", dt, training, with_z, relu)
          local want, got = run(three_ops, dt, with_z, relu, training), run(one_op, dt, with_z, relu, training)
          assert.are.equal(dt, got.y.dtype, what)
          for _, k in ipairs { "y", "gx", "gw", "gb", "gz", "rm", "rv" } do
            if want[k] then same(got[k], want[k], what .. " " .. k) else assert.is_nil(got[k], what .. " " .. k) end
          end
          if relu then   -- the cases the head promises are there: zeros from the ReLU and from the sum
            assert.is_true(mp.eq(got.y, 0):to("f32"):sum():item() > 0, what)
          end
        end
      end
    end
  end)

  it("is one op where the backend fuses it (the CPU), with the ReLU's mask from its output", function()
    local x, w, b, z = inputs("f32", 3)
    x, z = leaf(x), leaf(z)
    local y = mp.batch_norm(x, nil, nil, w, b, { training = true, residual = z, activation = "relu" })
    if mp.default_device() == "cpu" then assert.are.equal("batch_norm_act", y.grad_fn) end
    -- no residual, no activation: batch norm itself
    assert.are.equal("batch_norm", mp.batch_norm(x, nil, nil, w, b, { training = true, activation = "none" }).grad_fn)
  end)

  it("runs the three ops when z is broadcast or of another dtype, with their values", function()
    local x, w, b = inputs("f32", 4)
    for _, z in ipairs { mp.randn { 1, 4, 1, 1 }, mp.randn { 3, 4, 5, 6 }:to("bf16") } do
      local y = mp.batch_norm(x, nil, nil, w, b, { training = true, residual = z, activation = "relu" })
      same(y, mp.relu(mp.batch_norm(x, nil, nil, w, b, { training = true }) + z), "broadcast or promoted z")
    end
  end)

  it("keeps a bf16 activation bf16 under autocast", function()
    local x, w, b, z = inputs("bf16", 5)
    local _ <close> = mp.amp.autocast("bf16")
    local y = mp.batch_norm(x, nil, nil, w, b, { training = true, residual = z, activation = "relu" })
    assert.are.equal("bf16", y.dtype)
  end)

  it("names the option of every bad input, and moves no statistics then", function()
    local x, rm, rv = mp.randn { 4, 3, 2 }, mp.zeros { 3 }, mp.ones { 3 }
    H.raises(function() mp.batch_norm(x, rm, rv, nil, nil, { training = true, residual = 3 }) end,
             { "mp.batch_norm", "residual", "tensor" })
    H.raises(function() mp.batch_norm(x, rm, rv, nil, nil, { training = true, activation = "gelu" }) end,
             { "mp.batch_norm", "activation", "relu" })
    H.raises(function() mp.batch_norm(x, rm, rv, nil, nil, { training = true, activation = 1 }) end,
             { "mp.batch_norm", "activation" })
    H.raises(function() mp.batch_norm(x, rm, rv, nil, nil, { training = true, residual = mp.randn { 4, 3, 3 } }) end,
             { "mp.batch_norm", "residual", "broadcast" })
    H.raises(function() mp.batch_norm(x, rm, rv, nil, nil, { training = true, residual = mp.randn { 2, 4, 3, 2 } }) end,
             { "mp.batch_norm", "residual", "broadcast" })
    H.raises(function()
      mp.batch_norm(x, rm, rv, nil, nil, { training = true, residual = mp.ones({ 4, 3, 2 }, { dtype = "i32" }) })
    end, { "mp.batch_norm", "residual", "float" })
    H.raises(function() mp.batch_norm(x:to("f64"), nil, nil, nil, nil, { training = true, activation = "relu" }) end,
             { "batch_norm", "f64" })
    H.assert_same(rm:totable(), { 0, 0, 0 }, "running_mean after the errors")
    local bn = nn.BatchNorm2d(3)
    local x4 = mp.randn { 2, 3, 2, 2 }
    H.raises(function() bn(x4, { residual = "no" }) end, { "mp.nn.BatchNorm2d", "residual" })
    H.raises(function() bn(x4, { activation = "tanh" }) end, { "mp.nn.BatchNorm2d", "activation" })
    H.raises(function() bn(x4, { extra = 1 }) end, { "mp.nn.BatchNorm2d", "extra" })
    assert.are.equal(0, bn.num_batches_tracked:item())
  end)
end)

describe("nn.BatchNorm2d's residual and activation, in the ResNet", function()
  it("BatchNorm2d(x, {residual, activation}) is relu(bn(x) + z)", function()
    local x, _, _, z = inputs("f32", 6)
    mp.manual_seed(1)
    local a, b = nn.BatchNorm2d(4), nn.BatchNorm2d(4)
    same(a(x, { residual = z, activation = "relu" }), mp.relu(b(x) + z), "module")
    same(a.running_var, b.running_var, "module running_var")
  end)

  local function losses(mode, fused)
    local ResNet = dofile(H.root .. "/scripts/models/resnet.lua")
    mp.manual_seed(0)
    local model = ResNet { widths = { 8, 16, 16 }, blocks = 1 }
    if not fused then
      for _, s in ipairs { "layer1", "layer2", "layer3" } do
        for _, blk in ipairs(model[s]:children()) do
          rawset(blk, "forward", function(self, x)
            local out = mp.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return mp.relu(out + (self.downsample and self.downsample(x) or x))
          end)
        end
      end
      rawset(model, "forward", function(self, x)
        x = mp.relu(self.bn1(self.conv1(x)))
        for s = 1, self.nstages do x = self["layer" .. s](x) end
        return self.fc(self.flatten(self.pool(x)))
      end)
    end
    local opt = mp.optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
    local out = {}
    for step = 1, 3 do
      mp.manual_seed(100 + step)
      local x, y = mp.randn { 4, 3, 16, 16 }, mp.randint(0, 10, { 4 })
      opt:zero_grad()
      local loss
      do
        local _ <close> = mode == "bf16" and mp.amp.autocast("bf16") or nil
        loss = mp.cross_entropy(model(x), y)
      end
      loss:backward()
      opt:step()
      out[step] = loss:item()
    end
    local state, names = model:state_dict(), {}
    for k in pairs(state) do names[#names + 1] = k end
    table.sort(names)
    return out, state, names
  end

  it("trains the ResNet to the same losses, parameters and statistics bit for bit, f32 and bf16 autocast", function()
    for _, mode in ipairs { "f32", "bf16" } do
      local a, sa, names = losses(mode, true)
      local b, sb = losses(mode, false)
      H.assert_same(a, b, mode .. " losses")
      assert.is_true(a[1] == a[1] and a[1] > 0, mode)
      assert.is_true(#names > 20, mode)
      for _, k in ipairs(names) do same(sa[k], sb[k], mode .. " " .. k) end
    end
  end)
end)
