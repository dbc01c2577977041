-- attention_spec.lua: mp.attention (engine/ops_attention.c, kernels/cpu/cpu_attention.c):
-- the blocked kernel against the same attention written with matmul, masked_fill and
-- softmax (forward and every gradient, across block boundaries, causal or not, tq != tk),
-- f16/bf16 computed in f32 and rounded once, the autocast class, dropout drawn the same
-- in forward and backward, no t x t scores in memory, and errors.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

-- attention by the composite ops (t x t scores in memory)
local function reference(q, k, v, causal, scale)
  local tq, tk, d = q.shape[#q.shape - 1], k.shape[#k.shape - 1], q.shape[#q.shape]
  local s = q:matmul(k:transpose(-2, -1)) * (scale or 1 / math.sqrt(d))
  if causal then s = s:masked_fill(mp.ones({ tq, tk }):triu(1):gt(0), -math.huge) end
  return mp.softmax(s, -1):matmul(v)
end

local function maxdiff(a, b) return (a:to("f32") - b:to("f32")):abs():max():item() end

describe("mp.attention", function()
  it("matches the composite attention, forward and gradients, across blocks", function()
    mp.manual_seed(5)
    for _, c in ipairs {
      { q = { 2, 3, 70, 16 }, k = { 2, 3, 70, 16 }, causal = false },
      { q = { 2, 3, 70, 16 }, k = { 2, 3, 70, 16 }, causal = true },
      { q = { 1, 2, 130, 8 }, k = { 1, 2, 67, 8 }, causal = false },
      { q = { 1, 1, 5, 8 }, k = { 1, 1, 130, 8 }, causal = true },
      { q = { 4, 9, 8 }, k = { 4, 9, 8 }, causal = true, scale = 0.3 },
    } do
      local what = table.concat(c.q, "x") .. (c.causal and " causal" or "")
      local q, k, v = mp.randn(c.q):requires_grad(true), mp.randn(c.k):requires_grad(true), mp.randn(c.k):requires_grad(true)
      local o = mp.attention(q, k, v, { causal = c.causal, scale = c.scale })
      assert.are.same(c.q, o.shape)
      local g = mp.randn(c.q);
      (o * g):sum():backward()
      local gq, gk, gv = q.grad, k.grad, v.grad
      q.grad, k.grad, v.grad = nil, nil, nil
      local r = reference(q, k, v, c.causal, c.scale)
      assert.is_true(maxdiff(o, r) < 2e-6, what .. " forward " .. maxdiff(o, r))
      ;(r * g):sum():backward()
      for name, pair in pairs { q = { gq, q.grad }, k = { gk, k.grad }, v = { gv, v.grad } } do
        local diff = maxdiff(pair[1], pair[2])
        assert.is_true(diff < 1e-5, what .. " d" .. name .. " " .. diff)
      end
    end
  end)

  it("keeps every saved tensor for its backward (five: q, k, v, out, lse)", function()
    local q = mp.randn({ 1, 1, 4, 4 }):requires_grad(true)
    local o = mp.attention(q, q, q)
    assert.are.equal("attention", o.grad_fn)
    o:sum():backward()
    assert.are.same({ 1, 1, 4, 4 }, q.grad.shape)
  end)

  it("f16 computes in f32 and rounds once; autocast runs it in the low dtype", function()
    mp.manual_seed(2)
    local q, k, v = mp.randn({ 2, 2, 40, 8 }):to("f16"), mp.randn({ 2, 2, 40, 8 }):to("f16"), mp.randn({ 2, 2, 40, 8 }):to("f16")
    local lo = mp.attention(q, k, v, { causal = true })
    assert.are.equal("f16", lo.dtype)
    local hi = mp.attention(q:to("f32"), k:to("f32"), v:to("f32"), { causal = true }):to("f16")
    H.assert_same(lo:to("f32"):totable(), hi:to("f32"):totable(), "f16")
    local o
    do
      local _ <close> = mp.amp.autocast("bf16")
      o = mp.attention(mp.randn { 1, 1, 3, 4 }, mp.randn { 1, 1, 3, 4 }, mp.randn { 1, 1, 3, 4 })
    end
    assert.are.equal("bf16", o.dtype)
    assert.are.equal("low", mp.amp.classes().attention)
  end)

  -- bf16 (cpu_attention.c's head): the block products take bf16 operands into f32
  -- sums, and the probabilities P (and dS in the backward) are rounded to bf16
  -- before they multiply, as PyTorch's CPU flash attention does. Against attention
  -- with f32 intermediates on the same bf16 values, element by element (u = 2^-8,
  -- bf16's relative rounding error; s the scale; D = dO . out, whose bf16 out
  -- differs by dout = out_bf16 - out_f32):
  --   out: u P|V| + u |out|            dV: u P^T|dO| + u |dV|
  --   dQ: s (u |dS| + P |dD|) |K| + u |dQ|    dK: s (u |dS| + P |dD|)^T |Q| + u |dK|
  -- with |dD| <= |dO| . |dout| and a slack of 2^-14 on u for the f32 sums' order.
  it("bf16 runs its products on bf16 operands, P and dS rounded to bf16 first: within the derived bound", function()
    mp.manual_seed(3)
    local u = 2 ^ -8 + 2 ^ -14
    for _, c in ipairs { { shape = { 2, 2, 70, 16 }, causal = true }, { shape = { 1, 3, 45, 7 }, causal = false } } do
      local shape, d = c.shape, c.shape[4]
      local s = 1 / math.sqrt(d)
      local q, k, v = mp.randn(shape):to("bf16"), mp.randn(shape):to("bf16"), (mp.randn(shape) * 3):to("bf16")
      local g = mp.randn(shape):to("bf16")
      local function run(dt)
        local qq, kk, vv = q:to(dt):detach():requires_grad(true), k:to(dt):detach():requires_grad(true), v:to(dt):detach():requires_grad(true)
        local o = mp.attention(qq, kk, vv, { causal = c.causal })
        assert.are.equal(dt, o.dtype)
        ;(o * g:to(dt)):sum():backward()
        return { o = o:to("f32"), dq = qq.grad:to("f32"), dk = kk.grad:to("f32"), dv = vv.grad:to("f32") }
      end
      local lo, hi = run("bf16"), run("f32")
      local Q, K, V, G = q:to("f32"), k:to("f32"), v:to("f32"), g:to("f32")
      local t = shape[3]
      local sc = Q:matmul(K:transpose(-2, -1)) * s
      if c.causal then sc = sc:masked_fill(mp.ones({ t, t }):triu(1):gt(0), -math.huge) end
      local P = mp.softmax(sc, -1)
      local dS = P * (G:matmul(V:transpose(-2, -1)) - (G * hi.o):sum(-1, true))
      local dD = (G:abs() * (lo.o - hi.o):abs()):sum(-1, true)
      local eS = dS:abs() * u + P * dD
      local bounds = {
        o = P:matmul(V:abs()) * u + lo.o:abs() * u,
        dv = P:transpose(-2, -1):matmul(G:abs()) * u + lo.dv:abs() * u,
        dq = eS:matmul(K:abs()) * s + lo.dq:abs() * u,
        dk = eS:transpose(-2, -1):matmul(Q:abs()) * s + lo.dk:abs() * u,
      }
      for _, n in ipairs { "o", "dq", "dk", "dv" } do
        local over = ((lo[n] - hi[n]):abs() - bounds[n] - 1e-6):max():item()
        assert.is_true(over <= 0, table.concat(shape, "x") .. " " .. n .. " over its bound by " .. over)
      end
    end
  end)

  it("dropout: p = 0 is none, draws are reproducible and the same in the backward", function()
    local q, k, v = mp.randn { 1, 2, 50, 8 }, mp.randn { 1, 2, 50, 8 }, mp.randn { 1, 2, 50, 8 }
    H.assert_same(mp.attention(q, k, v, { dropout = 0 }):totable(), mp.attention(q, k, v):totable(), "p = 0")
    mp.manual_seed(9)
    local a = mp.attention(q, k, v, { dropout = 0.3 })
    mp.manual_seed(9)
    H.assert_same(a:totable(), mp.attention(q, k, v, { dropout = 0.3 }):totable(), "reseeded")
    assert.is_true(maxdiff(a, mp.attention(q, k, v, { dropout = 0.3 })) > 0, "a new draw differs")
    -- v = 1: each output is the kept probability mass / (1 - p), 1 on average
    local ones = mp.ones { 1, 2, 50, 8 }
    local m = mp.attention(mp.randn { 1, 2, 50, 8 }, mp.randn { 1, 2, 50, 8 }, ones, { dropout = 0.5 }):mean():item()
    assert.is_true(math.abs(m - 1) < 0.1, "mean " .. m)
    -- the gradient through the same draws: a numerical check with the seed fixed
    local x = mp.randn({ 1, 1, 6, 4 }):requires_grad(true)
    local function f()
      mp.manual_seed(4)
      return (mp.attention(x, x, x, { dropout = 0.4, causal = true }) * mp.arange(24):reshape { 1, 1, 6, 4 }):sum()
    end
    f():backward()
    local analytic, h = x.grad:totable()[1][1], 1e-2
    local flat = x:detach():totable()[1][1]
    for i = 1, 6 do
      for j = 1, 4 do
        local function at(delta)
          local t = mp.tensor(flat)
          local vals = t:totable()
          vals[i][j] = vals[i][j] + delta
          x = mp.tensor({ { vals } }):requires_grad(true)
          return f():item()
        end
        local num = (at(h) - at(-h)) / (2 * h)
        assert.is_true(math.abs(num - analytic[i][j]) < 2e-2 * (1 + math.abs(num)), i .. "," .. j .. ": " .. num .. " vs " .. analytic[i][j])
      end
    end
  end)

  it("never holds the t x t scores: memory grows by the blocks, not t^2", function()
    local t, d = 4096, 16
    local q, k, v = mp.randn { 1, 1, t, d }, mp.randn { 1, 1, t, d }, mp.randn { 1, 1, t, d }
    mp.attention(q, k, v, { causal = true })   -- warm: scratch grown once
    local before = H.rss()
    mp.reset_peak_memory()
    local base = mp.memory().in_use
    local o = mp.attention(q, k, v, { causal = true })
    local grew = H.rss() - before
    assert.is_true(mp.memory().peak - base <= 2 * t * d * 4 + 4 * t, "engine peak " .. (mp.memory().peak - base))
    assert.is_true(grew < 16 * 2 ^ 20, "RSS grew " .. grew .. " bytes; t x t f32 is " .. t * t * 4)
    assert.are.same({ 1, 1, t, d }, o.shape)
  end)

  it("bad inputs are errors naming the argument", function()
    local q = mp.randn { 1, 2, 5, 8 }
    H.raises(function() return mp.attention(q, mp.randn { 1, 2, 5, 4 }, q) end, { "mp.attention", "do not fit" })
    H.raises(function() return mp.attention(q, mp.randn { 2, 2, 5, 8 }, mp.randn { 2, 2, 5, 8 }) end, { "leading dims" })
    H.raises(function() return mp.attention(q, q:to("f16"), q) end, { "one dtype and device" })
    H.raises(function() return mp.attention(q:to("i32"), q:to("i32"), q:to("i32")) end, { "float" })
    H.raises(function() return mp.attention(q, q, q, { dropout = 1 }) end, { "dropout must be in [0, 1)" })
    H.raises(function() return mp.attention(q, q, q, { casual = true }) end, { "unknown option 'casual'" })
    H.raises(function() return mp.attention(q, q, q, { scale = "x" }) end, { "option scale must be a number" })
    H.raises(function() return mp.attention(q, q) end, { "attention", "tensor expected" })
  end)
end)

-- The CUDA backend sends f16/bf16 attention with head dims 64 and 128 to its
-- tensor-core kernels (kernels/cuda/cuda_flash.cu); here they run on the emulated
-- device in a child, against the CPU's kernel on the same inputs: within the
-- bound cuda_flash.cu's head derives (normalised squared error <= 1e-5), and the
-- backward, free of atomics, gives the same bits when run again.
describe("mp.attention on the emulated CUDA device's tensor-core kernels", function()
  it("matches the CPU and repeats its backward bit for bit (f16/bf16, d 64 and 128, causal, dropout)", function()
    if not H.emu then return pending(H.no_emu) end
    local r = H.child([[
      local function nmse(a, b)
        local d = a:cpu():to("f64") - b:cpu():to("f64")
        return (d * d):sum():item() / math.max((b:cpu():to("f64") * b:cpu():to("f64")):sum():item(), 1e-300)
      end
      local function same(a, b) return (a:cpu():to("f32") - b:cpu():to("f32")):abs():max():item() == 0 end
      local out = {}
      for _, c in ipairs {
        { dt = "f16", q = { 1, 2, 70, 64 }, k = { 1, 2, 70, 64 }, causal = true },
        { dt = "bf16", q = { 1, 1, 40, 128 }, k = { 1, 1, 90, 128 }, causal = false, dropout = 0.2 },
        { dt = "f16", q = { 2, 1, 3, 64 }, k = { 2, 1, 3, 64 }, causal = true, dropout = 0.5 },
      } do
        mp.manual_seed(11)
        local cpu = { device = "cpu" }
        local q, k, v = mp.randn(c.q, cpu):to(c.dt), mp.randn(c.k, cpu):to(c.dt), mp.randn(c.k, cpu):to(c.dt)
        local g = mp.randn(c.q, cpu):to(c.dt)
        local function run(dev)
          local qq, kk, vv = q:to(dev):detach():requires_grad(true), k:to(dev):detach():requires_grad(true),
            v:to(dev):detach():requires_grad(true)
          mp.manual_seed(3)   -- the dropout's draws: the same counters on both devices
          local o = mp.attention(qq, kk, vv, { causal = c.causal, dropout = c.dropout or 0 })
          o:backward(g:to(dev))
          return o, qq.grad, kk.grad, vv.grad
        end
        local ref = { run("cpu") }
        local a = { run("cuda") }
        local b = { run("cuda") }
        local worst = 0
        for i = 1, 4 do
          worst = math.max(worst, nmse(a[i], ref[i]))
          if not same(a[i], b[i]) then error(c.dt .. ": output " .. i .. " differs between two runs") end
        end
        if worst > 1e-5 then error(string.format("%s %s: nmse %.3g above 1e-5", c.dt, table.concat(c.q, "x"), worst)) end
        out[#out + 1] = string.format("%.2g", worst)
      end
      return table.concat(out, " ")]], false, H.emu_env { MP_EMU_ORDER = "shuffle" })
    assert.are.equal(0, r.rc, r.out .. r.err)
    assert.truthy(r.out:match("^OK:"), r.out .. r.err)
  end)
end)
