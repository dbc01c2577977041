-- conv_spec.lua: convolution, pooling and batch norm (engine/ops_conv.c, ops_pool.c,
-- ops_batch_norm.c; kernels/cpu/cpu_conv.c, cpu_pool.c, cpu_batch_norm.c) and their
-- modules. The gradients are checked against finite differences in autograd_spec.lua
-- and a whole CNN against PyTorch in cnn_reference_spec.lua; here: f16/bf16 computed
-- in f32 and rounded once, the autocast classes, batches large enough to be cut into
-- chunks, pooling's edge rules, batch norm's running statistics and modes, the
-- modules' names, defaults and buffers, and every bad input's error.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local function maxdiff(a, b) return (a:to("f32") - b:to("f32")):abs():max():item() end

describe("mp.conv2d", function()
  it("f16 and bf16: the f32 convolution of the same values, rounded once", function()
    mp.manual_seed(3)
    for _, dt in ipairs { "f16", "bf16" } do
      local x, w, b = mp.randn({ 2, 4, 9, 7 }):to(dt), mp.randn({ 6, 2, 3, 3 }):to(dt), mp.randn({ 6 }):to(dt)
      local o = { stride = { 2, 1 }, padding = 1, groups = 2 }
      local lo = mp.conv2d(x, w, b, o)
      assert.are.equal(dt, lo.dtype)
      local ref = mp.conv2d(x:to("f32"), w:to("f32"), b:to("f32"), o):to(dt)
      assert.are.equal(0, maxdiff(lo, ref), dt)
    end
  end)

  it("is in autocast's low-precision class; batch_norm and pooling keep the dtype", function()
    local x, w = mp.randn({ 2, 3, 8, 8 }), mp.randn({ 4, 3, 3, 3 })
    local _ <close> = mp.amp.autocast("f16")
    local y = mp.conv2d(x, w)
    assert.are.equal("f16", y.dtype)
    assert.are.equal("f16", mp.batch_norm(y, nil, nil, nil, nil, { training = true }).dtype)
    assert.are.equal("f16", mp.max_pool2d(y, 2).dtype)
    assert.are.equal("f16", mp.avg_pool2d(y, 2).dtype)
    assert.is_nil(mp.amp.classes().batch_norm)   -- no class: its input's dtype
  end)

  it("a batch cut into chunks gives what each image gives alone, forward and weight gradient", function()
    mp.manual_seed(4)
    -- 16 x 9 x 62 x 62 columns per image: the kernel takes 7 images at a time
    local x, w = mp.randn({ 9, 16, 64, 64 }), mp.randn({ 3, 16, 3, 3 }):requires_grad(true)
    local y = mp.conv2d(x, w)
    local g = mp.randn(y.shape)
    ;(y * g):sum():backward()
    local gw = w.grad
    w.grad = nil
    for i = 0, 8 do
      local yi = mp.conv2d(x:narrow(1, i + 1, 1), w)
      assert.are.equal(0, maxdiff(yi, y:narrow(1, i + 1, 1)), "image " .. i)
      ;(yi * g:narrow(1, i + 1, 1)):sum():backward()
    end
    assert.is_true(maxdiff(gw, w.grad) <= 1e-3 * w.grad:abs():max():item())
  end)

  it("names the argument of every bad input", function()
    local x, w = mp.randn({ 1, 4, 5, 5 }), mp.randn({ 2, 4, 3, 3 })
    H.raises(function() mp.conv2d(x, mp.randn({ 2, 3, 3, 3 })) end, { "mp.conv2d", "input channels" })
    H.raises(function() mp.conv2d(x, mp.randn({ 2, 2, 3, 3 }), nil, { groups = 3 }) end, { "groups" })
    H.raises(function() mp.conv2d(x, mp.randn({ 3, 2, 3, 3 }), nil, { groups = 2 }) end, { "groups", "divide" })
    H.raises(function() mp.conv2d(x, mp.randn({ 2, 4, 7, 3 })) end, { "larger than the padded input" })
    H.raises(function() mp.conv2d(x, w, nil, { stride = 0 }) end, { "stride", "[1, 2^30]" })
    H.raises(function() mp.conv2d(x, w, nil, { stride = 2 ^ 40 }) end, { "stride", "[1, 2^30]" })
    H.raises(function() mp.conv2d(x, w, nil, { padding = 2 ^ 29 }) end, { "out of memory" })
    H.raises(function() mp.conv2d(x, w, nil, { stride = { 1, -2 } }) end, { "stride" })
    H.raises(function() mp.conv2d(x, w, nil, { padding = -1 }) end, { "padding" })
    H.raises(function() mp.conv2d(x, w, nil, { dilation = 0 }) end, { "dilation" })
    H.raises(function() mp.conv2d(x, w, nil, { stride = { 1, 2, 3 } }) end, { "stride", "pair" })
    H.raises(function() mp.conv2d(x, w, nil, { stride = "1" }) end, { "stride" })
    H.raises(function() mp.conv2d(x, w, nil, { strides = 1 }) end, { "strides" })
    H.raises(function() mp.conv2d(mp.randn({ 4, 5, 5 }), w) end, { "input", "4-d" })
    H.raises(function() mp.conv2d(x, mp.randn({ 2, 4, 3 })) end, { "weight", "4-d" })
    H.raises(function() mp.conv2d(x, w, mp.randn({ 3 })) end, { "bias" })
    H.raises(function() mp.conv2d(x, w, 5) end, { "bias" })
    H.raises(function() mp.conv2d(x, w:to("f16")) end, { "weight", "f16" })
    H.raises(function() mp.conv2d(mp.zeros({ 1, 4, 5, 5 }, { dtype = "i32" }), w) end, { "float" })
  end)
end)

describe("pooling", function()
  it("max_pool2d: windows clipped by padding, the first of equal maxima, NaN propagates", function()
    local x = mp.tensor { { { { 1, 5, 2 }, { 5, 3, -1 }, { 0, 4, 9 } } } }
    local y = mp.max_pool2d(x, 2, { stride = 1, padding = 1 })
    assert.are.same({ 1, 1, 4, 4 }, y.shape)
    assert.are.same({ { 1, 5, 5, 2 }, { 5, 5, 5, 2 }, { 5, 5, 9, 9 }, { 0, 4, 9, 9 } }, y:totable()[1][1])
    local xg = x:detach():requires_grad(true)
    mp.max_pool2d(xg, 2):sum():backward()   -- one window {1, 5, 5, 3}: the first 5 takes it
    assert.are.same({ { 0, 1, 0 }, { 0, 0, 0 }, { 0, 0, 0 } }, xg.grad:totable()[1][1])
    local n = mp.tensor { { { 1, 0 / 0 }, { 7, 2 } } }   -- a number after the NaN does not win
    assert.is_true(H.isnan(mp.max_pool2d(n, 2):item()))
    local ng = mp.tensor({ { { 0 / 0, 3 }, { 0 / 0, 9 } } }):requires_grad(true)
    mp.max_pool2d(ng, 2):sum():backward()   -- the last NaN takes the gradient, as in PyTorch
    assert.are.same({ { 0, 0 }, { 1, 0 } }, ng.grad:totable()[1])
    local inf = mp.full({ 1, 2, 2 }, -math.huge):requires_grad(true)
    local yi = mp.max_pool2d(inf, 2)
    assert.are.equal(-math.huge, yi:item())
    yi:sum():backward()   -- all equal: the window's first element
    assert.are.same({ { 1, 0 }, { 0, 0 } }, inf.grad:totable()[1])
  end)

  it("avg_pool2d counts padding; adaptive windows cover the input with overlap", function()
    local x = mp.ones({ 1, 1, 2, 2 })
    assert.are.same({ { 0.25, 0.25 }, { 0.25, 0.25 } }, mp.avg_pool2d(x, 2, { stride = 2, padding = 1 }):totable()[1][1])
    local r = mp.arange(5):to("f32"):reshape { 1, 1, 5 }
    -- rows [0, 3) and [2, 5) of a 5-row input into 2: means 1 and 3
    assert.are.same({ { 1 }, { 3 } }, mp.adaptive_avg_pool2d(r:reshape { 1, 5, 1 }, { 2, 1 }):totable()[1])
    assert.are.same({ 2 }, mp.adaptive_avg_pool2d(r, 1):totable()[1][1])
  end)

  it("names the argument of every bad input", function()
    local x = mp.randn({ 1, 2, 4, 4 })
    H.raises(function() mp.max_pool2d(x, 0) end, { "mp.max_pool2d", "kernel size" })
    H.raises(function() mp.max_pool2d(x, 2, { stride = 0 }) end, { "stride" })
    H.raises(function() mp.max_pool2d(x, 2, { padding = 2 }) end, { "padding", "half" })
    H.raises(function() mp.avg_pool2d(x, 7) end, { "larger than the padded input" })
    H.raises(function() mp.avg_pool2d(mp.randn({ 4, 4 }), 2) end, { "3-d", "4-d" })
    H.raises(function() mp.max_pool2d(x, { 2 }) end, { "kernel size", "pair" })
    H.raises(function() mp.adaptive_avg_pool2d(x, 0) end, { "output size" })
    H.raises(function() mp.adaptive_avg_pool2d(x) end, { "output size" })
  end)
end)

describe("mp.batch_norm", function()
  it("moves the running statistics by momentum (unbiased variance) and evaluates with them", function()
    local x = mp.tensor { { { 1, 3 }, { 0, 0 } }, { { 5, 7 }, { 2, 2 } } }   -- {2, 2, 2}: channel 0 holds 1, 3, 5, 7
    local rm, rv = mp.zeros({ 2 }), mp.ones({ 2 })
    local y = mp.batch_norm(x, rm, rv, nil, nil, { training = true, momentum = 0.5 })
    H.assert_close(rm:totable(), { 2, 0.5 }, 1e-6, 0, "running_mean")
    H.assert_close(rv:totable(), { 0.5 + 0.5 * 20 / 3, 0.5 + 0.5 * 4 / 3 }, 1e-6, 0, "running_var")
    local r = 1 / math.sqrt(5 + 1e-5)
    H.assert_close(H.flat(y:totable()), { -3 * r, -r, -1 / math.sqrt(1 + 1e-5), -1 / math.sqrt(1 + 1e-5),
                                          r, 3 * r, 1 / math.sqrt(1 + 1e-5), 1 / math.sqrt(1 + 1e-5) }, 1e-5, 1e-6, "y")
    local e = mp.batch_norm(x, rm, rv, mp.tensor { 2, 1 }, mp.tensor { 0, 1 })
    H.assert_close(H.flat(e:totable())[1], 2 * (1 - 2) / math.sqrt(rv:totable()[1] + 1e-5), 1e-5, 0, "eval")
  end)

  -- Under autocast batch_norm runs in its input's dtype, as PyTorch's CPU autocast:
  -- a bf16 (f16) x with the f32 weight, bias and running statistics as they are (no
  -- cast of them per call); statistics in f32 from sums in f64; y and the gradient of
  -- x in x's dtype, the gradients of weight and bias f32. The kernel widens x and the
  -- incoming gradient exactly, computes in f32 and rounds each output once, so y is
  -- the f32 computation on the same values (x:to("f32")) rounded once: |y - y32| <=
  -- u |y32| with u = 2^-8 (bf16) or 2^-11 (f16), plus 1e-6 for the f32 results' own
  -- differences (the f64 sums of the two paths may group a run differently). The
  -- same bound holds for the gradient of x; weight's and bias's are f32 both ways.
  it("keeps a bf16 or f16 input's dtype under autocast, with f32 statistics, within one rounding of f32", function()
    mp.manual_seed(5)
    for _, case in ipairs { { "bf16", 2 ^ -8 }, { "f16", 2 ^ -11 } } do
      local dt, u = case[1], case[2]
      local x = (mp.randn({ 4, 3, 5, 6 }) * 2 + 1):to(dt):requires_grad(true)
      local w, b = (mp.rand({ 3 }) + 0.5):requires_grad(true), mp.randn({ 3 }):requires_grad(true)
      local rm, rv = mp.zeros({ 3 }), mp.ones({ 3 })
      local g = mp.randn({ 4, 3, 5, 6 }):to(dt)
      local y
      do
        local _ <close> = mp.amp.autocast(dt)
        y = mp.batch_norm(x, rm, rv, w, b, { training = true })
        assert.are.equal(dt, y.dtype)
        -- what follows a batch norm in a CNN keeps the dtype too
        assert.are.equal(dt, mp.relu(y).dtype)
        assert.are.equal(dt, mp.max_pool2d(mp.relu(y), 2).dtype)
        assert.are.equal(dt, mp.adaptive_avg_pool2d(y, 1).dtype)
        assert.are.equal(dt, (y + y).dtype)
      end
      ;(y:to("f32") * g:to("f32")):sum():backward()
      assert.are.equal(dt, x.grad.dtype)
      assert.are.equal("f32", w.grad.dtype)
      assert.are.equal("f32", b.grad.dtype)
      assert.are.equal("f32", rm.dtype)
      -- the reference: the same values in f32
      local x32 = x:detach():to("f32"):requires_grad(true)
      local w32, b32 = w:detach():requires_grad(true), b:detach():requires_grad(true)
      local rm32, rv32 = mp.zeros({ 3 }), mp.ones({ 3 })
      local y32 = mp.batch_norm(x32, rm32, rv32, w32, b32, { training = true })
      ;(y32 * g:to("f32")):sum():backward()
      local function within(lo, ref, what)
        local bound = ref:abs() * u + 1e-6
        local excess = ((lo:to("f32") - ref):abs() - bound):max():item()
        assert.is_true(excess <= 0, string.format("%s %s: exceeds the bound by %g", dt, what, excess))
      end
      within(y, y32, "y")
      within(x.grad, x32.grad, "grad x")
      H.assert_close(w.grad:totable(), w32.grad:totable(), 1e-5, 1e-6, dt .. " grad weight")
      H.assert_close(b.grad:totable(), b32.grad:totable(), 1e-5, 1e-6, dt .. " grad bias")
      H.assert_close(rm:totable(), rm32:totable(), 1e-6, 1e-7, dt .. " running_mean")
      H.assert_close(rv:totable(), rv32:totable(), 1e-6, 1e-7, dt .. " running_var")
    end
  end)

  it("can be put back in autocast's f32 class by name", function()
    local x = mp.conv2d(mp.randn({ 2, 3, 6, 6 }), mp.randn({ 4, 3, 3, 3 }))
    mp.amp.register("batch_norm", "f32")
    local ok, err = pcall(function()
      local _ <close> = mp.amp.autocast("bf16")
      assert.are.equal("f32", mp.batch_norm(x, nil, nil, nil, nil, { training = true }).dtype)
    end)
    mp.amp.register("batch_norm", "none")
    assert(ok, err)
    local _ <close> = mp.amp.autocast("bf16")
    assert.are.equal("bf16", mp.batch_norm(x:to("bf16"), nil, nil, nil, nil, { training = true }).dtype)
  end)

  it("names the argument of every bad input", function()
    local x = mp.randn({ 4, 3, 2 })
    H.raises(function() mp.batch_norm(x, mp.zeros({ 2 }), mp.ones({ 3 }), nil, nil, { training = true }) end,
             { "mp.batch_norm", "running_mean" })
    H.raises(function() mp.batch_norm(x, mp.zeros({ 3 }):to("f16"), mp.ones({ 3 })) end, { "running_mean", "f32" })
    H.raises(function() mp.batch_norm(x, nil, nil) end, { "running" })
    H.raises(function() mp.batch_norm(x, mp.zeros({ 3 }), nil, nil, nil, { training = true }) end, { "running_var" })
    H.raises(function() mp.batch_norm(x, nil, nil, mp.ones({ 4 }), nil, { training = true }) end, { "weight" })
    H.raises(function() mp.batch_norm(mp.randn({ 1, 3 }), nil, nil, nil, nil, { training = true }) end,
             { "more than one value" })
    H.raises(function() mp.batch_norm(x, nil, nil, nil, nil, { training = true, momentum = 2 }) end, { "momentum" })
    H.raises(function() mp.batch_norm(x, nil, nil, nil, nil, { training = true, eps = 0 }) end, { "eps" })
    H.raises(function() mp.batch_norm(mp.randn({ 3 }), nil, nil, nil, nil, { training = true }) end, { "2 dims" })
  end)
end)

describe("the convolutional modules", function()
  it("Conv2d: PyTorch's names, layout and default init bounds", function()
    mp.manual_seed(1)
    local c = nn.Conv2d(6, 8, { 3, 2 }, { groups = 2, stride = 2 })
    assert.are.same({ 8, 3, 3, 2 }, c.weight.shape)
    assert.are.same({ 8 }, c.bias.shape)
    local bound = 1 / math.sqrt(3 * 3 * 2)
    assert.is_true(c.weight:abs():max():item() <= bound and c.bias:abs():max():item() <= bound)
    assert.is_true(c.weight:abs():max():item() > 0.8 * bound)
    assert.is_nil(nn.Conv2d(1, 2, 3, { bias = false }).bias)
    assert.are.same({ 2, 8, 1, 2 }, c(mp.randn({ 2, 6, 4, 4 })).shape)
    H.raises(function() nn.Conv2d(3, 4, 3, { groups = 2 }) end, { "mp.nn.Conv2d", "groups" })
    H.raises(function() nn.Conv2d(3, 4, 0) end, { "kernel_size" })
    H.raises(function() nn.Conv2d(3, 4, 3, { padding = { 1 } }) end, { "padding" })
  end)

  it("BatchNorm2d: buffers in state_dict, train and eval, f32 statistics in a half-precision model", function()
    local bn = nn.BatchNorm2d(3)
    local names = {}
    for k in pairs(bn:state_dict()) do names[#names + 1] = k end
    table.sort(names)
    assert.are.same({ "bias", "num_batches_tracked", "running_mean", "running_var", "weight" }, names)
    assert.are.equal(2, #bn:parameters())
    mp.manual_seed(2)
    local x = mp.randn({ 4, 3, 2, 2 }) * 3 + 1
    bn(x)
    bn(x)
    assert.are.equal(2, bn.num_batches_tracked:item())
    local m = bn.running_mean:totable()
    bn:eval()
    local y1 = bn(x)
    assert.are.same(m, bn.running_mean:totable())   -- eval leaves the statistics alone
    assert.are.equal(2, bn.num_batches_tracked:item())
    local ref = mp.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias)
    assert.are.equal(0, maxdiff(y1, ref))
    bn:to("bf16")
    assert.are.equal("bf16", bn.weight.dtype)
    assert.are.equal("f32", bn.running_mean.dtype)
    local copy = nn.BatchNorm2d(3)
    copy:load_state_dict(bn:state_dict())
    assert.are.same(bn.running_var:totable(), copy.running_var:totable())
    assert.are.equal(2, copy.num_batches_tracked:item())
    local free = nn.BatchNorm2d(3, { track_running_stats = false, affine = false })
    assert.are.same({}, free:parameters())
    assert.is_nil(next(free:state_dict()))
    free:eval()
    assert.is_true(math.abs(free(x):mean():item()) < 1e-5)   -- batch statistics even in eval
    H.raises(function() bn(mp.randn({ 4, 3 })) end, { "mp.nn.BatchNorm2d", "4-d" })
  end)

  it("Module:add_buffer refuses what is not a tensor and names already taken", function()
    local m = nn.Linear(2, 2)
    H.raises(function() m:add_buffer("stats", 5) end, { "mp.nn.Module:add_buffer", "stats", "tensor" })
    H.raises(function() m:add_buffer("weight", mp.zeros { 2 }) end, { "add_buffer", "weight", "already" })
    H.raises(function() m:add_buffer("a.b", mp.zeros { 2 }) end, { "add_buffer", "dots" })
    m:add_buffer("stats", mp.zeros({ 3 }, { dtype = "i32" }))
    H.raises(function() m:add_parameter("stats", mp.zeros { 3 }) end, { "add_parameter", "buffer" })
    H.raises(function() m.stats = 7 end, { "buffer 'stats'" })
    m.stats = nil
    assert.is_nil(m:state_dict().stats)
  end)

  it("pooling modules, Flatten and a whole CNN's shapes", function()
    local x = mp.randn({ 2, 3, 8, 6 })
    assert.are.same({ 2, 3, 4, 3 }, nn.MaxPool2d(2)(x).shape)
    assert.are.same({ 2, 3, 8, 6 }, nn.AvgPool2d(3, { stride = 1, padding = 1 })(x).shape)
    assert.are.same({ 2, 3, 1, 1 }, nn.AdaptiveAvgPool2d(1)(x).shape)
    assert.are.same({ 2, 144 }, nn.Flatten()(x).shape)
    assert.are.same({ 2, 3, 48 }, nn.Flatten { start_dim = 3 }(x).shape)
    H.raises(function() nn.Flatten { start_dim = 5 }(x) end, { "mp.nn.Flatten" })
    local CNN = dofile(H.root .. "/scripts/models/cnn.lua")
    local model = CNN {}
    assert.are.same({ 3, 10 }, model(mp.randn({ 3, 1, 28, 28 })).shape)
  end)
end)
