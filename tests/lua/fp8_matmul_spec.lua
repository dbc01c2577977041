-- fp8_matmul_spec.lua: mp.fp8.quantize and mp.fp8.matmul (issue 30, item 2) on
-- the default device (the CPU; the fake and emulated CUDA devices under
-- MP_DEVICE=cuda): the scales' shapes and values from each group's amax, the
-- amax and the counts, a given scale, the product against one computed here
-- in Lua from the decoded codes (f32 accumulation: within the f32 bound), the
-- modelled accumulator on the CPU, and the errors that name the function and
-- the argument.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/fp8_matmul_spec.lua
local mp = require "mp"

local ON_CPU = mp.default_device() == "cpu"

-- a {rows, k} table of values over several binades (deterministic)
local function values(rows, k, seed)
  local t = {}
  for i = 1, rows do
    t[i] = {}
    for j = 1, k do
      seed = (seed * 1103515245 + 12345) % 2147483648
      t[i][j] = (seed / 2147483648 - 0.5) * 2.0 ^ ((i + j) % 7 - 3)
    end
  end
  return t
end

local function max_abs(t, r0, r1, c0, c1)
  local m = 0
  for i = r0, r1 do for j = c0, c1 do m = math.max(m, math.abs(t[i][j])) end end
  return m
end

-- f32 rounding of a Lua number (the engine's scale arithmetic is f32)
local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

describe("mp.fp8.quantize", function()
  local x = values(5, 300, 7)
  local X = mp.tensor(x)

  it("takes per tensor scales from the amax and gives the amax", function()
    local q, s, amax = mp.fp8.quantize(X)
    local a = max_abs(x, 1, 5, 1, 300)
    assert.are.equal("e4m3", q.dtype)
    assert.are.same({5, 300}, q.shape)
    assert.are.same({1}, s.shape)
    assert.are.equal(f32(a), amax:item())
    assert.are.equal(f32(1 / f32(448 / f32(a))), s:item())
    -- decoded values times the scale are x within e4m3's half ulp (2^-4 relative) or its step
    local back = mp.fp8.codes(q):to("f32"):cpu():totable()
    local d = s:item()
    for i = 1, 5 do
      for j = 1, 300 do
        local err = math.abs(back[i][j] * d - x[i][j])
        assert.is_true(err <= math.max(math.abs(x[i][j]) / 16, d * 2 ^ -10) * (1 + 1e-6), i .. "," .. j)
      end
    end
  end)

  it("takes one scale per 1x128 tile and per 128x128 block", function()
    local _, s = mp.fp8.quantize(X, {granularity = "tile"})
    assert.are.same({5, 3}, s.shape)
    local st = s:cpu():totable()
    for i = 1, 5 do
      for b = 1, 3 do
        local a = max_abs(x, i, i, (b - 1) * 128 + 1, math.min(b * 128, 300))
        assert.are.equal(f32(1 / f32(448 / f32(a))), st[i][b])
      end
    end
    local qb, sb = mp.fp8.quantize(X, {granularity = "block", format = "e5m2"})
    assert.are.equal("e5m2", qb.dtype)
    assert.are.same({1, 3}, sb.shape)
    assert.are.equal(f32(1 / f32(57344 / f32(max_abs(x, 1, 5, 129, 256)))), sb:cpu():totable()[1][2])
  end)

  it("takes OCP MX blocks of 32 along k with E8M0 byte scales", function()
    for _, fmt in ipairs({{"e4m3", 8}, {"e5m2", 15}}) do
      local q, s, amax = mp.fp8.quantize(X, {granularity = "mx", format = fmt[1]})
      assert.are.equal(fmt[1], q.dtype)
      assert.are.equal("u8", s.dtype)
      assert.are.same({5, 10}, s.shape)   -- ceil(300 / 32)
      assert.are.equal(f32(max_abs(x, 1, 5, 1, 300)), amax:item())
      local st, codes = s:cpu():totable(), mp.fp8.codes(q):to("f32"):cpu():totable()
      for i = 1, 5 do
        for b = 1, 10 do
          local c0, c1 = (b - 1) * 32 + 1, math.min(b * 32, 300)
          -- OCP MX v1.0: X = 2^(floor(log2 amax) - emax), emax of the element format
          local a = f32(max_abs(x, i, i, c0, c1))
          local e = math.floor(math.log(a, 2)) - fmt[2]
          if 2.0 ^ (e + fmt[2]) > a then e = e - 1 elseif 2.0 ^ (e + fmt[2] + 1) <= a then e = e + 1 end
          assert.are.equal(e + 127, st[i][b], i .. "," .. b)
          -- each code is x / X cast (saturating) to the format
          local want = (mp.tensor({table.move(x[i], c0, c1, 1, {})}) * 2.0 ^ -e)
                         :to(fmt[1], {saturate = true}):to("f32"):cpu():totable()[1]
          for j = c0, c1 do assert.are.equal(want[j - c0 + 1], codes[i][j], i .. "," .. j) end
        end
      end
    end
    -- an all-zero block has scale 1 (byte 127)
    local _, sz = mp.fp8.quantize(mp.zeros({2, 40}), {granularity = "mx"})
    assert.are.same({{127, 127}, {127, 127}}, sz:cpu():totable())
  end)

  it("uses a given scale, counting saturated and flushed values", function()
    local q, s, amax, n = mp.fp8.quantize(mp.tensor({{300, -224, 2 ^ -12, 1}}), {scale = 2, counts = true})
    assert.are.equal(0.5, s:item())
    assert.are.equal(300, amax:item())
    assert.are.same({saturated = 1, flushed = 1}, n)
    assert.are.same({{448, -448, 0, 2}}, mp.fp8.codes(q):to("f32"):cpu():totable())
    local _, s2 = mp.fp8.quantize(X, {scale = mp.full({1}, 4)})
    assert.are.equal(0.25, s2:item())
  end)

  it("gives the counts as a device tensor without a wait, the same as the host table", function()
    -- tensor scale from the amax, a given scale, tiles, blocks, mx: each with saturated and flushed values
    local y = mp.tensor({{300, -224, 2 ^ -12, 1, 0, 2 ^ -30}, {-1e6, 5, 2 ^ -11, 0, 7, -2 ^ -40}})
    for _, o in ipairs({{scale = 2}, {}, {granularity = "tile"}, {granularity = "block", format = "e5m2"},
                        {granularity = "mx"}}) do
      local oh, od = {counts = true}, {counts = "tensor"}
      for k, v in pairs(o) do oh[k], od[k] = v, v end
      local qh, sh, ah, n = mp.fp8.quantize(y, oh)
      local qd, sd, ad, c = mp.fp8.quantize(y, od)
      assert.are.equal("f32", c.dtype)
      assert.are.same({2}, c.shape)
      assert.are.equal(y.device, c.device)
      assert.are.same({n.saturated, n.flushed}, c:cpu():totable())
      assert.are.same(mp.fp8.codes(qh):view("u8"):cpu():totable(), mp.fp8.codes(qd):view("u8"):cpu():totable())
      assert.are.same(sh:cpu():totable(), sd:cpu():totable())
      assert.are.equal(ah:item(), ad:item())
    end
    -- by hand, times 2: 600 and -2e6 saturate; 2^-11 and 2^-29 flush, 2^-10 ties to the even zero, -2^-39 too
    local _, _, _, n = mp.fp8.quantize(y, {scale = 2, counts = true})
    assert.are.same({saturated = 2, flushed = 4}, n)
    -- summed over micro-batches with + (the recipes' use)
    local _, _, _, c1 = mp.fp8.quantize(y, {scale = 2, counts = "tensor"})
    local _, _, _, c2 = mp.fp8.quantize(y, {scale = 2, counts = "tensor"})
    assert.are.same({4, 8}, (c1 + c2):cpu():totable())
  end)

  it("names the function and the option in its errors", function()
    local function err(f) local ok, e = pcall(f); assert.is_false(ok); return tostring(e) end
    assert.matches("mp.fp8.quantize: option 'counts' must be true, false or \"tensor\"",
                   err(function() mp.fp8.quantize(X, {counts = "host"}) end))
    assert.matches("mp.fp8.quantize: option 'format' must be", err(function() mp.fp8.quantize(X, {format = "e3m4"}) end))
    assert.matches("option 'granularity' must be \"tensor\", \"tile\", \"block\" or \"mx\"",
                   err(function() mp.fp8.quantize(X, {granularity = "row"}) end))
    assert.matches("option 'scale'", err(function() mp.fp8.quantize(X, {granularity = "tile", scale = 2}) end))
    assert.matches("option 'scale'", err(function() mp.fp8.quantize(X, {scale = -1}) end))
    assert.matches("mp.fp8.quantize: .*x must be f32, f16 or bf16",
                   err(function() mp.fp8.quantize(mp.tensor({1, 2}, {dtype = "i32"})) end))
    assert.matches("mp.fp8.quantize:.*unknown option", err(function() mp.fp8.quantize(X, {formats = "e4m3"}) end))
  end)
end)

describe("mp.fp8.matmul", function()
  local a, b = values(6, 256, 3), values(5, 256, 11)
  local A, B = mp.tensor(a), mp.tensor(b)

  -- the product of the decoded values (and their scales) in Lua doubles
  local function exact(qa, sa, qb, sb)
    local da, db = mp.fp8.codes(qa):to("f32"):cpu():totable(), mp.fp8.codes(qb):to("f32"):cpu():totable()
    local ta, tb = sa:cpu():totable(), sb:cpu():totable()
    local out, mag = {}, {}
    for i = 1, 6 do
      out[i], mag[i] = {}, {}
      for j = 1, 5 do
        local s, m = 0, 0
        for q = 1, 256 do
          local c = (q - 1) // 128 + 1
          local sa_ = type(ta[1]) == "table" and ta[i][c] or ta[1]
          local sb_ = type(tb[1]) == "table" and tb[(j - 1) // 128 + 1][c] or tb[1]
          local t = da[i][q] * db[j][q] * sa_ * sb_
          s, m = s + t, m + math.abs(t)
        end
        out[i][j], mag[i][j] = s, m
      end
    end
    return out, mag
  end

  for _, g in ipairs({{"tensor", "tensor"}, {"tile", "block"}}) do
    it("multiplies " .. g[1] .. " by " .. g[2] .. " scaled operands with f32 sums", function()
      local qa, sa = mp.fp8.quantize(A, {granularity = g[1]})
      local qb, sb = mp.fp8.quantize(B, {granularity = g[2]})
      local c = mp.fp8.matmul(qa, qb, {out_dtype = "f32"})
      assert.are.equal("f32", c.dtype)
      assert.are.same({6, 5}, c.shape)
      local want, mag = exact(qa, sa, qb, sb)
      local got = c:cpu():totable()
      for i = 1, 6 do
        for j = 1, 5 do
          assert.is_true(math.abs(got[i][j] - want[i][j]) <= 300 * 2 ^ -24 * mag[i][j], i .. "," .. j)
        end
      end
      local h = mp.fp8.matmul(qa, qb)   -- bf16 by default: the f32 result rounded once
      assert.are.equal("bf16", h.dtype)
      assert.are.same(c:to("bf16"):to("f32"):cpu():totable(), h:to("f32"):cpu():totable())
    end)
  end

  it("multiplies two mx operands with f32 sums (e4m3 and e5m2), and refuses mx with another granularity",
     function()
    local function exact_mx(qa, sa, qb, sb)
      local da, db = mp.fp8.codes(qa):to("f32"):cpu():totable(), mp.fp8.codes(qb):to("f32"):cpu():totable()
      local ta, tb = sa:cpu():totable(), sb:cpu():totable()
      local out, mag = {}, {}
      for i = 1, 6 do
        out[i], mag[i] = {}, {}
        for j = 1, 5 do
          local acc, m = 0, 0
          for q = 1, 256 do
            local c = (q - 1) // 32 + 1
            local t = da[i][q] * 2.0 ^ (ta[i][c] - 127) * db[j][q] * 2.0 ^ (tb[j][c] - 127)
            acc, m = acc + t, m + math.abs(t)
          end
          out[i][j], mag[i][j] = acc, m
        end
      end
      return out, mag
    end
    for _, f in ipairs({{"e4m3", "e4m3"}, {"e5m2", "e5m2"}, {"e4m3", "e5m2"}}) do
      local qa, sa = mp.fp8.quantize(A, {granularity = "mx", format = f[1]})
      local qb, sb = mp.fp8.quantize(B, {granularity = "mx", format = f[2]})
      local c = mp.fp8.matmul(qa, qb, {out_dtype = "f32"})
      local want, mag = exact_mx(qa, sa, qb, sb)
      local got = c:cpu():totable()
      for i = 1, 6 do
        for j = 1, 5 do
          assert.is_true(math.abs(got[i][j] - want[i][j]) <= 300 * 2 ^ -24 * mag[i][j], f[1] .. f[2] .. i .. "," .. j)
        end
      end
      local h = mp.fp8.matmul(qa, qb)   -- bf16: the f32 result rounded once
      assert.are.same(c:to("bf16"):to("f32"):cpu():totable(), h:to("f32"):cpu():totable())
      if ON_CPU then   -- the modelled accumulator folds the powers of two in: 23 bits promoted every 1 is f32
        local m = mp.fp8.matmul(qa, qb, {out_dtype = "f32", accumulate = {acc_bits = 23, promote_every = 1}})
        local mt = m:cpu():totable()
        for i = 1, 6 do
          for j = 1, 5 do
            assert.is_true(math.abs(mt[i][j] - want[i][j]) <= 300 * 2 ^ -24 * mag[i][j], "model " .. i .. "," .. j)
          end
        end
      end
    end
    local qm = mp.fp8.quantize(A, {granularity = "mx"})
    local qt = mp.fp8.quantize(B, {granularity = "tile"})
    local function err(f) local ok, e = pcall(f); assert.is_false(ok); return tostring(e) end
    assert.matches("mp.fp8.matmul: a is mx%-scaled but b is 1x128%-scaled", err(function() mp.fp8.matmul(qm, qt) end))
    assert.matches("mp.fp8.matmul: b is mx%-scaled but a is tensor%-scaled",
                   err(function() mp.fp8.matmul((mp.fp8.quantize(A)), (mp.fp8.quantize(B, {granularity = "mx"}))) end))
    assert.matches("option 'scale'", err(function() mp.fp8.quantize(A, {granularity = "mx", scale = 2}) end))
  end)

  it("models a limited accumulator on the cpu, and says where it does not run", function()
    local qa = mp.fp8.quantize(A)
    local qb = mp.fp8.quantize(B)
    local acc = {acc_bits = 14, promote_every = 128}
    local ok, got = pcall(mp.fp8.matmul, qa, qb, {out_dtype = "f32", accumulate = acc})
    if not ok then   -- a CUDA device: the model is the CPU's (the fake device's kernels are the CPU's)
      assert.is_false(ON_CPU, got)
      assert.matches("mp.fp8.matmul: the cuda backend cannot compute this product %(the modelled accumulator", got)
      return
    end
    -- 14 bits promoted every 128 stays close to f32 sums; 3 bits without promotion does not
    local f = mp.fp8.matmul(qa, qb, {out_dtype = "f32"}):cpu():totable()
    local m = got:cpu():totable()
    local c = mp.fp8.matmul(qa, qb, {out_dtype = "f32", accumulate = {acc_bits = 3}}):cpu():totable()
    local top, far, worst = 0, 0, 0
    for i = 1, 6 do for j = 1, 5 do top = math.max(top, math.abs(f[i][j])) end end
    for i = 1, 6 do
      for j = 1, 5 do
        worst = math.max(worst, math.abs(m[i][j] - f[i][j]))
        far = math.max(far, math.abs(c[i][j] - f[i][j]))
      end
    end
    assert.is_true(worst <= 2 ^ -12 * top, "14 bits: " .. worst / top)
    assert.is_true(far > 2 ^ -6 * top, "3 bits: " .. far / top)
  end)

  it("rounds the modelled accumulator's partial sums to nearest or toward zero", function()
    -- by hand: 4 + 1.75 = 5.75 kept to 3 significant bits (acc_bits 2: 4 5 6 7 in [4, 8)) is 6 to
    -- nearest and 5 truncated (-6 and -5 for the negated row); promoted after each product, 5.75
    local qa = mp.fp8.quantize(mp.tensor({{4, 1.75}, {-4, -1.75}}), {scale = 1})
    local qb = mp.fp8.quantize(mp.tensor({{1, 1}}), {scale = 1})
    local function mm(acc) return mp.fp8.matmul(qa, qb, {out_dtype = "f32", accumulate = acc}) end
    local ok, near = pcall(mm, {acc_bits = 2})
    if not ok then
      assert.is_false(ON_CPU, near)
      assert.matches("the modelled accumulator runs on the cpu only", near)
      return
    end
    assert.are.same({{6}, {-6}}, near:cpu():totable())
    assert.are.same({{6}, {-6}}, mm({acc_bits = 2, acc_round = "nearest"}):cpu():totable())
    assert.are.same({{5}, {-5}}, mm({acc_bits = 2, acc_round = "truncate"}):cpu():totable())
    assert.are.same({{5.75}, {-5.75}}, mm({acc_bits = 2, promote_every = 1, acc_round = "truncate"}):cpu():totable())
    -- truncation biases long sums toward zero: 7 bits over k = 256 of positive products drift below
    local pa = mp.fp8.quantize(mp.tensor(values(6, 256, 3)):abs())
    local pb = mp.fp8.quantize(mp.tensor(values(5, 256, 11)):abs())
    local f = mp.fp8.matmul(pa, pb, {out_dtype = "f32"}):cpu():totable()
    local t = mp.fp8.matmul(pa, pb, {out_dtype = "f32", accumulate = {acc_bits = 7, acc_round = "truncate"}})
    local n = mp.fp8.matmul(pa, pb, {out_dtype = "f32", accumulate = {acc_bits = 7}})
    t, n = t:cpu():totable(), n:cpu():totable()
    local below, bias_t, bias_n = 0, 0, 0
    for i = 1, 6 do
      for j = 1, 5 do
        below = below + (t[i][j] <= f[i][j] and 1 or 0)
        bias_t, bias_n = bias_t + (t[i][j] - f[i][j]) / f[i][j], bias_n + (n[i][j] - f[i][j]) / f[i][j]
      end
    end
    assert.are.equal(30, below, "every truncated sum is at most the f32 one")
    -- (both lose small terms on a large partial sum; measured: -15% truncated, -3.7% to nearest)
    assert.is_true(bias_t < 2 * bias_n and bias_n < 0, "mean biases " .. bias_t / 30 .. ", " .. bias_n / 30)
  end)

  it("names the function and the argument in its errors", function()
    local qa, qb = mp.fp8.quantize(A, {granularity = "tile"}), mp.fp8.quantize(B)
    local function err(f) local ok, e = pcall(f); assert.is_false(ok); return tostring(e) end
    assert.matches("mp.fp8.matmul: a must be an e4m3 or e5m2 tensor", err(function() mp.fp8.matmul(A, qb) end))
    assert.matches("mp.fp8.matmul: b carries no scales",
                   err(function() mp.fp8.matmul(qa, B:to("e4m3")) end))
    assert.matches("must share k", err(function() mp.fp8.matmul(qa, (mp.fp8.quantize(mp.ones({5, 128})))) end))
    assert.matches("mp.fp8.codes: q must be a quantized", err(function() mp.fp8.codes(A) end))
    assert.matches("option 'out_dtype'", err(function() mp.fp8.matmul(qa, qb, {out_dtype = "i32"}) end))
    assert.matches("option 'accumulate'", err(function() mp.fp8.matmul(qa, qb, {accumulate = "f16"}) end))
    assert.matches("accumulate.acc_bits", err(function() mp.fp8.matmul(qa, qb, {accumulate = {acc_bits = 30}}) end))
    assert.matches("mp.fp8.matmul: option 'accumulate.acc_round' must be \"nearest\" or \"truncate\" %(got \"up\"%)",
                   err(function() mp.fp8.matmul(qa, qb, {accumulate = {acc_bits = 14, acc_round = "up"}}) end))
    assert.matches("promote_every must divide 128",
                   err(function() mp.fp8.matmul(qa, qb, {accumulate = {acc_bits = 14, promote_every = 100}}) end))
  end)
end)
