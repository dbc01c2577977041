-- f64_spec.lua: f64 tensors on the CPU (issue 26, item 4): creation, arithmetic
-- against Lua's own doubles bit for bit, reductions, matmul through dgemm
-- against a triple loop, casts with their rounding, safetensors round trips,
-- the ops the CPU declines in f64, autocast leaving f64 alone, gradients
-- against finite differences, and CUDA's refusal of f64 tensors (emulated).
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/f64_spec.lua
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

-- the device these checks run on: the default one where it holds f64 tensors,
-- else the CPU (the emulated CUDA pass: CUDA declines f64, tested below)
local DEV = pcall(mp.zeros, { 1 }, { dtype = "f64" }) and mp.default_device() or "cpu"
local O = { dtype = "f64", device = DEV }

local function T(values, shape)
  local t = mp.tensor(values, O)
  return shape and t:reshape(shape) or t
end
local function flat(t) return H.flat(t:totable()) end

-- Lua's generator, seeded per test: values with all 53 bits in use
local function draws(n, scale)
  local v = {}
  for i = 1, n do v[i] = (math.random() - 0.5) * (scale or 4) end
  return v
end

-- the f32/f16/bf16 value of known bits, read back as a double
local function f32_bits(b) return (string.unpack("<f", string.pack("<I4", b))) end
local function f16_value(b)   -- sign, 5-bit exponent, 10-bit mantissa (normal numbers)
  local s, e, m = b >> 15, (b >> 10) & 0x1f, b & 0x3ff
  return (s == 1 and -1 or 1) * (1 + m / 1024) * 2.0 ^ (e - 15)
end
local function bf16_value(b) return f32_bits(b << 16) end

describe("f64 tensors", function()
  before_each(function() math.randomseed(26) end)

  it("are made by every creation function and keep Lua's doubles exactly", function()
    local v = { 0.1, 1 / 3, -2 ^ -1074, 1e300, 1 + 2 ^ -52 }
    local t = T(v)
    assert.equal("f64", t.dtype)
    for i = 1, #v do assert.equal(v[i], t[i]:item()) end
    assert.same(v, t:totable())
    assert.equal(0.1, mp.full({ 2, 2 }, 0.1, O)[2][2]:item())
    assert.same({ 0, 0, 0 }, mp.zeros({ 3 }, O):totable())
    assert.same({ 1, 1 }, mp.ones({ 2 }, O):totable())
    assert.same({ 0, 1, 2, 3, 4 }, mp.arange(5, O):totable())
    for _, name in ipairs { "f64", "float64", "double" } do
      assert.equal("f64", mp.zeros({ 1 }, { dtype = name, device = DEV }).dtype)
    end
    -- random draws: f32's draws widened, the same seed the same values
    for _, fn in ipairs { mp.rand, mp.randn } do
      mp.manual_seed(7)
      local a = fn({ 64 }, O)
      mp.manual_seed(7)
      local b = fn({ 64 }, { device = DEV })
      assert.equal("f64", a.dtype)
      assert.same(b:totable(), a:totable())
    end
    assert.equal(2 ^ 53 + 2, T { 2 ^ 53 + 2 }:item())   -- no f32 on the way
  end)

  it("prints as many digits as read back exactly", function()
    local s = tostring(T { 0.1, 1 / 3 })
    local a, b = s:match("^%s*(%S+)%s+(%S+)")
    assert.equal(0.1, tonumber(a))
    assert.equal(1 / 3, tonumber(b))
    assert.truthy(tostring(T { 1.5, 2.25 }):find("1.5000 2.2500", 1, true))   -- short where that is exact
    assert.truthy(tostring(T { 1, 2 }):find("[f64 2 " .. DEV .. "]", 1, true))
  end)

  it("add, sub, mul, div, scalars and comparisons equal Lua's double arithmetic", function()
    local a, b = draws(50), draws(50)
    local ta, tb = T(a), T(b)
    local ops = {
      { ta + tb, function(x, y) return x + y end }, { ta - tb, function(x, y) return x - y end },
      { ta * tb, function(x, y) return x * y end }, { ta / tb, function(x, y) return x / y end },
      { ta * 0.1, function(x) return x * 0.1 end }, { ta + 0.1, function(x) return x + 0.1 end },
      { 0.3 - ta, function(x) return 0.3 - x end }, { ta / 3, function(x) return x / 3 end },
      { -ta, function(x) return -x end }, { ta:abs(), function(x) return math.abs(x) end },
      { ta:exp(), math.exp }, { ta:abs():log(), function(x) return math.log(math.abs(x)) end },
      { ta:abs():sqrt(), function(x) return math.sqrt(math.abs(x)) end },
      { mp.relu(ta), function(x) return x < 0 and 0 or x end },
    }
    for k, c in ipairs(ops) do
      assert.equal("f64", c[1].dtype)
      local got = flat(c[1])
      for i = 1, #a do assert(got[i] == c[2](a[i], b[i]), ("op %d element %d: %.17g"):format(k, i, got[i])) end
    end
    -- a difference f32 could not see
    local x, y = T { 1 + 2 ^ -40, 1 }, T { 1, 1 }
    assert.same({ 1, 0 }, x:gt(y):totable())
    assert.same({ 0, 1 }, x:eq(y):totable())
    assert.same({ 1, 0 }, x:ne(1):totable())
    assert.equal("f64", (T { 1 } + mp.ones({ 1 }, { device = DEV })).dtype)            -- f64 with f32: f64
    assert.equal("f64", (T { 1 } + mp.ones({ 1 }, { dtype = "bf16", device = DEV })).dtype)
    assert.equal("f64", (T { 1 } + mp.ones({ 1 }, { dtype = "i32", device = DEV })).dtype)
  end)

  it("computes the activations in double", function()
    local a = draws(40, 8)
    local t = T(a)
    local function sig(x) return 1 / (1 + math.exp(-x)) end
    local function tanh(x) return (math.exp(2 * x) - 1) / (math.exp(2 * x) + 1) end
    local checks = {
      { mp.sigmoid(t), sig }, { mp.tanh(t), tanh }, { mp.silu(t), function(x) return x * sig(x) end },
      { mp.gelu(t, { approximate = "tanh" }), function(x)
          return 0.5 * x * (1 + tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3))) end },
    }
    for k, c in ipairs(checks) do
      assert.equal("f64", c[1].dtype)
      local got = flat(c[1])
      for i = 1, #a do H.assert_close(got[i], c[2](a[i]), 1e-14, 1e-15, "activation " .. k) end
    end
    -- erf GELU at known points: 0.5 x (1 + erf(x / sqrt 2)), erf(1/sqrt 2) = 0.6826894921370859
    local g = mp.gelu(T { 1, -1 }):totable()
    H.assert_close(g[1], 0.5 * (1 + 0.6826894921370859), 1e-15, 0)
    H.assert_close(g[2], -0.5 * (1 - 0.6826894921370859), 1e-15, 1e-17)
  end)

  it("sums, means, max and argmax in double", function()
    local a = draws(1000)
    local s = 0
    for i = 1, #a do s = s + a[i] end
    assert.equal(s, T(a):sum():item())   -- in order, in double: Lua's sum exactly
    assert.equal(s / #a, T(a):mean():item())
    assert.equal(1 + 2 ^ -40, T { 1, 2 ^ -40 }:sum():item())
    local m = T({ 1, 1 + 2 ^ -45, 1, 1 - 2 ^ -45 }, { 2, 2 })
    assert.same({ 1 + 2 ^ -45, 1 }, m:max(2):totable())
    assert.same({ 1, 0 }, m:argmax(2):totable())
    assert.same({ 2, 2 }, m:sum(1):totable())
    assert.same({ 2 + 2 ^ -45, 2 - 2 ^ -45 }, m:sum(2):totable())
    assert.equal("f64", m:sum(1).dtype)
  end)

  it("matmul and linear go through dgemm: a triple loop's sums to 1e-12", function()
    local function check(m, k, n, ta)
      local A, B = draws(m * k), draws(k * n)
      local got = flat(T(A, { m, k }):matmul(T(B, { k, n })))
      for i = 1, m do
        for j = 1, n do
          local s = 0
          for q = 1, k do s = s + A[(i - 1) * k + q] * B[(q - 1) * n + j] end
          H.assert_close(got[(i - 1) * n + j], s, 1e-12, 1e-12, ta)
        end
      end
    end
    check(5, 7, 3, "5x7 @ 7x3")
    check(33, 65, 17, "33x65 @ 65x17")
    -- batched, and linear with its bias (y = x w^T + b)
    local x, w, b = draws(6), draws(12), draws(4)
    local y = mp.linear(T(x, { 2, 3 }), T(w, { 4, 3 }), T(b)):totable()
    assert.equal("f64", mp.linear(T(x, { 2, 3 }), T(w, { 4, 3 })).dtype)
    for i = 1, 2 do
      for j = 1, 4 do
        local s = b[j]
        for q = 1, 3 do s = s + x[(i - 1) * 3 + q] * w[(j - 1) * 3 + q] end
        H.assert_close(y[i][j], s, 1e-12, 1e-12, "linear")
      end
    end
    local bt = T(draws(24), { 2, 3, 4 }):matmul(T(draws(8), { 4, 2 }))
    assert.same({ 2, 3, 2 }, bt.shape)
    assert.equal("f64", bt.dtype)
  end)

  it("softmax, log_softmax, cross_entropy, mse_loss and layer_norm in double", function()
    local a = draws(12)
    local x = T(a, { 3, 4 })
    local sm, lsm = mp.softmax(x, 2):totable(), mp.log_softmax(x, 2):totable()
    local ce = mp.cross_entropy(x, mp.tensor({ 0, 3, 1 }, { dtype = "i32", device = DEV }), { reduction = "none" })
    assert.equal("f64", ce.dtype)
    local cev = ce:totable()
    for r = 1, 3 do
      local row, mx, s = { table.unpack(a, (r - 1) * 4 + 1, r * 4) }, -math.huge, 0
      for _, v in ipairs(row) do mx = math.max(mx, v) end
      for _, v in ipairs(row) do s = s + math.exp(v - mx) end
      local lse = mx + math.log(s)
      for j = 1, 4 do
        H.assert_close(sm[r][j], math.exp(row[j] - lse), 1e-14, 1e-16)
        H.assert_close(lsm[r][j], row[j] - lse, 1e-14, 1e-15)
      end
      H.assert_close(cev[r], lse - row[({ 1, 4, 2 })[r]], 1e-14, 1e-15)
    end
    local b = draws(12)
    local mse, want = mp.mse_loss(x, T(b, { 3, 4 })), 0
    for i = 1, 12 do want = want + (a[i] - b[i]) ^ 2 end
    assert.equal("f64", mse.dtype)
    H.assert_close(mse:item(), want / 12, 1e-15, 0)
    local ln = mp.layer_norm(x):totable()
    for r = 1, 3 do
      local m, v = 0, 0
      for j = 1, 4 do m = m + a[(r - 1) * 4 + j] / 4 end
      for j = 1, 4 do v = v + (a[(r - 1) * 4 + j] - m) ^ 2 / 4 end
      for j = 1, 4 do
        local eps = H.f32(1e-5)   -- eps reaches the kernel as f32 (backend.h)
        H.assert_close(ln[r][j], (a[(r - 1) * 4 + j] - m) / math.sqrt(v + eps), 1e-13, 1e-14)
      end
    end
  end)

  it("casts: widening exact, narrowing to nearest even (f16/bf16 through f32, as PyTorch)", function()
    -- f32: 0.1 rounds to 0x3dcccccd; ties go to the even neighbour
    local f = T { 0.1, 1 + 2 ^ -24, 1 + 3 * 2 ^ -24, -(1 + 2 ^ -24 + 2 ^ -50), 1e39 }:to("f32"):totable()
    assert.same({ f32_bits(0x3dcccccd), 1, 1 + 2 ^ -22, -(1 + 2 ^ -23), math.huge }, f)
    -- f16: 0.1 -> 0x2e66; 1 + 2^-11 is a tie (-> 1); 1 + 2^-11 + 2^-40 is one too after
    -- f32 (which drops the 2^-40): PyTorch's cast of a double; 65520 -> inf
    local h = T { 0.1, 1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 1 + 2 ^ -11 + 2 ^ -40, 65520 }:to("f16"):totable()
    assert.same({ f16_value(0x2e66), 1, 1 + 2 ^ -9, 1, math.huge }, h)
    local bf = T { 0.1, 1 + 2 ^ -8, 1 + 3 * 2 ^ -8 }:to("bf16"):totable()
    assert.same({ bf16_value(0x3dcd), 1, 1 + 2 ^ -6 }, bf)
    -- integers: toward zero, saturating, NaN to 0, no f32 on the way
    assert.same({ 2147483647, -3, 2147483647, -2147483648, 0, 16777217 },
      T { 2 ^ 31 - 0.5, -3.7, 1e10, -1e10, 0 / 0, 16777217 }:to("i32"):totable())
    assert.same({ 255, 0, 3 }, T { 300, -5, 3.9 }:to("u8"):totable())
    -- up to f64: exact from every dtype
    local d = { 0.1, -2.5, 1 / 3 }
    for _, dt in ipairs { "f32", "f16", "bf16" } do
      local low = mp.tensor(d, { dtype = dt, device = DEV })
      assert.same(low:totable(), low:to("f64"):totable())
      assert.same(low:totable(), low:to("f64"):to(dt):totable())   -- and back, bit for bit
    end
    assert.same({ -7, 2147483647 }, mp.tensor({ -7, 2147483647 }, { dtype = "i32", device = DEV }):to("f64"):totable())
    assert.same({ 0, 255 }, mp.tensor({ 0, 255 }, { dtype = "u8", device = DEV }):f64():totable())
  end)

  it("round-trips through safetensors bit for bit (F64)", function()
    local v = { 0.1, -0.0, 1 / 3, 2 ^ -1074, 1.7976931348623157e308, math.huge, -math.huge }
    local path = os.tmpname()
    mp.save(path, { x = T(v), y = mp.ones({ 2 }, { device = DEV }) })
    local r = mp.load(path)
    local raw = H.slurp(path)
    os.remove(path)
    assert.equal("f64", r.x.dtype)
    assert.truthy(raw:find('"dtype":"F64"', 1, true))
    local got = r.x:totable()
    for i = 1, #v do assert.equal(string.pack("<d", v[i]), string.pack("<d", got[i])) end
  end)

  it("declines, naming op and dtype, the ops the CPU has no f64 kernel for", function()
    local x4 = T(draws(16), { 1, 1, 4, 4 })
    for _, c in ipairs {
      { "conv2d", function() return mp.conv2d(x4, T(draws(9), { 1, 1, 3, 3 })) end },
      { "max_pool2d", function() return mp.max_pool2d(x4, 2) end },
      { "avg_pool2d", function() return mp.avg_pool2d(x4, 2) end },
      { "adaptive_avg_pool2d", function() return mp.adaptive_avg_pool2d(x4, 1) end },
      { "batch_norm", function() return mp.batch_norm(T(draws(6), { 2, 3 })) end },
      { "attention", function() local q = T(draws(8), { 1, 2, 4 }); return mp.attention(q, q, q) end },
    } do
      H.raises(c[2], { c[1] .. " is not available for f64 tensors on " .. DEV, "declines" })
    end
    H.raises(function() return T { 1 }:matmul(mp.ones({ 1, 1 }, { device = DEV })) end, { "f64", "f32", "differ" })
    H.raises(function() return mp.amp.autocast("f64") end, { "autocast", "f16 or bf16", "f64" })
  end)

  it("is left alone by autocast, for low-precision and f32 ops alike (as PyTorch)", function()
    local x, w = T(draws(6), { 2, 3 }), T(draws(12), { 4, 3 })
    local _ <close> = mp.amp.autocast("f16")
    assert.equal("f64", mp.linear(x, w).dtype)                       -- a low-precision op
    assert.equal("f64", x:matmul(T(draws(6), { 3, 2 })).dtype)
    local sm = mp.softmax(x, 2)                                      -- an f32 op
    assert.equal("f64", sm.dtype)
    assert.equal(math.exp(0) / 1, mp.softmax(T { 0 }, 1):item())
    assert.equal("f64", mp.layer_norm(x).dtype)
    assert.equal("f16", mp.linear(x:f32(), w:f32()).dtype)          -- f32 still is cast
  end)

  it("differentiates in f64: an MLP's gradients match central differences to 1e-8", function()
    -- loss = cross_entropy(linear(gelu(layer_norm(linear(x, w1, b1))), w2, b2)) + mse(tanh(x), t)
    local shapes = { x = { 4, 3 }, w1 = { 5, 3 }, b1 = { 5 }, w2 = { 3, 5 }, b2 = { 3 }, t = { 4, 3 } }
    local vals = {}
    for k, s in pairs(shapes) do vals[k] = draws(s[1] * (s[2] or 1), 2) end
    local target = mp.tensor({ 0, 2, 1, 2 }, { dtype = "i32", device = DEV })
    local function loss(p)
      local h = mp.gelu(mp.layer_norm(mp.linear(p.x, p.w1, p.b1)))
      local z = mp.linear(mp.silu(h), p.w2, p.b2)
      return mp.cross_entropy(z, target) + mp.mse_loss(mp.tanh(p.x), p.t) + (mp.sigmoid(z) * z):sum()
    end
    local function leaves(grad)
      local p = {}
      for k, s in pairs(shapes) do
        p[k] = T(vals[k], s)
        if grad then p[k]:requires_grad(true) end
      end
      return p
    end
    local p = leaves(true)
    local L = loss(p)
    assert.equal("f64", L.dtype)
    L:backward()
    local h = 1e-6
    for k, s in pairs(shapes) do
      local g = p[k].grad
      assert.equal("f64", g.dtype)
      local gf = flat(g)
      for i = 1, #vals[k] do
        local v = vals[k][i]
        vals[k][i] = v + h
        local up = loss(leaves(false)):item()
        vals[k][i] = v - h
        local down = loss(leaves(false)):item()
        vals[k][i] = v
        H.assert_close(gf[i], (up - down) / (2 * h), 1e-7, 1e-8, k .. "[" .. i .. "]")
      end
    end
  end)
end)

describe("f64 on CUDA", function()
  it("is refused by the emulated CUDA backend: no f64 tensor is made there", function()
    if not H.emu then pending(H.no_emu) return end
    local env = H.emu_env()
    for _, code in ipairs {
      "return mp.zeros({2}, {dtype = 'f64'})",
      "return mp.ones({2}, {dtype = 'f64', device = 'cpu'}):to('cuda')",
      "return mp.ones({2}, {device = 'cpu'}):to('f64', 'cuda')",
      "return mp.ones({2}):to('f64')",
    } do
      local r = H.child(code, false, env)
      local msg = r.out:match("^ERR:(.*)$")
      assert(msg and r.rc == 3, code .. ": " .. r.out .. r.err)
      assert(msg:find("f64 tensors are not available on cuda (the backend declines them)", 1, true), msg)
    end
    -- and the device still works after: the refusal loses nothing
    local r = H.child("local ok = pcall(mp.zeros, {2}, {dtype = 'f64'}); return (mp.ones{3} * 2):sum():item()",
      false, env)
    assert.equal("OK:6.0", r.out)
  end)
end)
