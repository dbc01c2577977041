-- select_spec.lua: selecting and masking (engine/ops_select.c): t[i] and
-- t:select(d, i) (1-based, negative from the end, the dim dropped), tril and
-- triu, masked_fill, split and chunk, randint; values against plain loops,
-- shapes, and errors that name the function and the argument. Gradients are in
-- autograd_spec.lua.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local function seq(shape)   -- 0, 1, 2, ... in the given shape
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return mp.arange(n):reshape(shape)
end

describe("t[i] and select", function()
  it("t[i] is the i-th slice along dim 1, 1-based, negative from the end", function()
    local x = seq { 3, 4 }
    assert.are.same({ 4, 5, 6, 7 }, x[2]:totable())
    assert.are.same({ 8, 9, 10, 11 }, x[-1]:totable())
    assert.are.same({ 4 }, x[1].shape)
    assert.are.equal(5, x[2][2]:item())
    assert.are.same({}, x[3][4].shape)   -- a 0-d tensor
  end)

  it("select along any dim drops that dim", function()
    local x = seq { 2, 3, 4 }
    local s = x:select(2, 3)   -- x[:, 2, :] in 0-based terms
    assert.are.same({ 2, 4 }, s.shape)
    assert.are.same({ { 8, 9, 10, 11 }, { 20, 21, 22, 23 } }, s:totable())
    assert.are.same({ { 3, 7, 11 }, { 15, 19, 23 } }, mp.select(x, -1, -1):totable())
  end)

  it("out of range and bad indices are errors, never nil", function()
    local x = seq { 3, 4 }
    H.raises(function() return x[0] end, { "Tensor[]", "index 0 out of range", "1..3" })
    H.raises(function() return x[4] end, { "index 4 out of range" })
    H.raises(function() return x[-4] end, { "index -4 out of range" })
    H.raises(function() return x:select(3, 1) end, { "Tensor:select", "dim 3 out of range" })
    H.raises(function() return x:select(1, 1.5) end, { "Tensor:select", "index" })
    H.raises(function() return mp.zeros({})[1] end, { "0-d" })
  end)
end)

describe("tril and triu", function()
  local function tri(rows, cols, k, lower)
    local r = {}
    for i = 1, rows do
      r[i] = {}
      for j = 1, cols do
        local keep = lower and (j - i <= k) or (not lower and j - i >= k)
        r[i][j] = keep and (i - 1) * cols + (j - 1) or 0
      end
    end
    return r
  end

  it("match a plain loop for every diagonal, rectangular and batched", function()
    for _, sh in ipairs { { 4, 4 }, { 3, 5 }, { 5, 2 } } do
      for k = -3, 3 do
        local x = seq(sh)
        assert.are.same(tri(sh[1], sh[2], k, true), x:tril(k):totable(), "tril " .. k)
        assert.are.same(tri(sh[1], sh[2], k, false), x:triu(k):totable(), "triu " .. k)
      end
    end
    local b = seq { 2, 3, 3 }:tril()
    assert.are.same({ { 9, 0, 0 }, { 12, 13, 0 }, { 15, 16, 17 } }, b:totable()[2])
  end)

  it("keep the dtype, and a causal mask of -inf above the diagonal works", function()
    local x = mp.randn({ 4, 4 }):to("f16")
    assert.are.equal("f16", x:tril().dtype)
    local scores = mp.zeros { 3, 3 }
    local causal = mp.ones({ 3, 3 }):triu(1)
    local p = mp.softmax(scores:masked_fill(causal:gt(0), -math.huge), 2):totable()
    assert.are.same({ 1, 0, 0 }, p[1])
    H.assert_close(p[3], { 1 / 3, 1 / 3, 1 / 3 }, 1e-6, 0, "last row")
  end)

  it("errors name the function", function()
    H.raises(function() return mp.arange(3):tril() end, { "Tensor:tril", "at least 2 dims" })
    H.raises(function() return mp.tril(mp.zeros { 2, 2 }, 0.5) end, { "mp.tril", "diagonal" })
  end)
end)

describe("masked_fill", function()
  it("fills where the mask is nonzero, broadcasting the mask", function()
    local x = seq { 2, 3 }
    local m = mp.tensor({ 1, 0, 1 }, { dtype = "u8" })
    assert.are.same({ { -1, 1, -1 }, { -1, 4, -1 } }, x:masked_fill(m, -1):totable())
    local xi = seq({ 2, 2 }):to("i32")
    assert.are.same({ { 7, 1 }, { 2, 7 } }, xi:masked_fill(mp.tensor({ { 1, 0 }, { 0, 1 } }, { dtype = "i32" }), 7):totable())
  end)

  it("bad masks and values are errors", function()
    local x = seq { 2, 3 }
    H.raises(function() return x:masked_fill(mp.zeros { 3 }, 0) end, { "Tensor:masked_fill", "mask must be u8 or i32" })
    H.raises(function() return x:masked_fill(mp.zeros({ 4 }, { dtype = "u8" }), 0) end, { "do not broadcast" })
    H.raises(function() return x:masked_fill(mp.zeros({ 2, 2, 3 }, { dtype = "u8" }), 0) end, { "more dims" })
    H.raises(function() return x:to("i32"):masked_fill(mp.zeros({ 3 }, { dtype = "u8" }), 0.5) end, { "does not fit" })
    H.raises(function() return x:masked_fill(x:gt(1), "a") end, { "value must be a number" })
  end)
end)

describe("split and chunk", function()
  it("split by a size (the last piece smaller) and by a list of sizes", function()
    local x = seq { 5, 2 }
    local p = { x:split(2) }   -- the pieces are values, as string.byte's
    assert.are.equal(3, #p)
    assert.are.same({ { 0, 1 }, { 2, 3 } }, p[1]:totable())
    assert.are.same({ { 8, 9 } }, p[3]:totable())
    local q = { mp.split(x, { 1, 4 }) }
    assert.are.same({ 1, 2 }, q[1].shape)
    assert.are.same({ 4, 2 }, q[2].shape)
    local _, r2 = seq({ 2, 5 }):split(3, 2)
    assert.are.same({ { 3, 4 }, { 8, 9 } }, r2:totable())
  end)

  it("chunk into n pieces as PyTorch does (ceil(size / n) each)", function()
    local x = seq { 6 }
    local c = { x:chunk(4) }   -- sizes 2, 2, 2: PyTorch gives 3 chunks here too
    assert.are.equal(3, #c)
    assert.are.same({ 4, 5 }, c[3]:totable())
    local _, k = mp.chunk(seq({ 2, 9 }), 3, -1)
    assert.are.same({ { 3, 4, 5 }, { 12, 13, 14 } }, k:totable())
  end)

  it("bad sizes are errors", function()
    local x = seq { 5 }
    H.raises(function() return x:split(0) end, { "Tensor:split", "size must be positive" })
    H.raises(function() return x:split({ 2, 2 }) end, { "add up to 4, dim 1 has 5" })
    H.raises(function() return x:split({ 3, 3 }) end, { "more than" })
    H.raises(function() return x:split({}) end, { "must not be empty" })
    H.raises(function() return x:chunk(0) end, { "Tensor:chunk", "chunks must be positive" })
    H.raises(function() return x:split(2, 2) end, { "dim 2 out of range" })
  end)
end)

describe("mp.randint", function()
  it("draws every value of [low, high) and nothing else, reproducibly", function()
    mp.manual_seed(7)
    local r = mp.randint(-3, 4, { 2000 })
    assert.are.equal("i32", r.dtype)
    local seen = {}
    for _, v in ipairs(r:totable()) do
      assert.is_true(v >= -3 and v < 4, "value " .. v)
      seen[v] = true
    end
    for v = -3, 3 do assert.is_true(seen[v], "never drew " .. v) end
    mp.manual_seed(7)
    assert.are.same(r:totable(), mp.randint(-3, 4, { 2000 }):totable())
    assert.are.equal("f32", mp.randint(0, 2, { 3 }, { dtype = "f32" }).dtype)
  end)

  it("bad ranges and options are errors", function()
    H.raises(function() return mp.randint(3, 3, { 2 }) end, { "mp.randint", "greater than low" })
    H.raises(function() return mp.randint(0, 2 ^ 25, { 2 }) end, { "at most 2^24" })
    H.raises(function() return mp.randint(0, 2, { 2 }, { dtype = "f16" }) end, { "dtype must be i32 or f32" })
    H.raises(function() return mp.randint(0, 2, { 2 }, { requires_grad = true }) end, { "cannot require grad" })
    H.raises(function() return mp.randint(0.5, 2, { 2 }) end, { "mp.randint", "low" })
  end)
end)

describe("matmul over any number of batch dims", function()
  -- the product of each pair of matrices, by a plain loop
  local function ref(A, B)   -- A {m,k}, B {k,n} as tables
    local C = {}
    for i = 1, #A do
      C[i] = {}
      for j = 1, #B[1] do
        local s = 0
        for t = 1, #B do s = s + A[i][t] * B[t][j] end
        C[i][j] = s
      end
    end
    return C
  end

  it("broadcasts batch dims as numpy does, item by item equal to 2-d products", function()
    mp.manual_seed(3)
    local a, b = mp.randn { 2, 1, 3, 4 }, mp.randn { 5, 4, 2 }
    local c = mp.matmul(a, b)
    assert.are.same({ 2, 5, 3, 2 }, c.shape)
    for i = 1, 2 do
      for j = 1, 5 do
        H.assert_close(c[i][j]:totable(), ref(a[i][1]:totable(), b[j]:totable()), 1e-5, 1e-6, i .. "," .. j)
      end
    end
    local q, k = mp.randn { 2, 4, 6, 8 }, mp.randn { 2, 4, 6, 8 }   -- attention scores {B, H, T, T}
    local s = q:matmul(k:transpose(3, 4))
    assert.are.same({ 2, 4, 6, 6 }, s.shape)
    H.assert_close(s[2][3]:totable(), ref(q[2][3]:totable(), k[2][3]:transpose(1, 2):totable()), 1e-5, 1e-6, "scores")
  end)

  it("1-d operands take part and drop their dim", function()
    assert.are.same({ 2, 3, 5 }, mp.matmul(mp.randn { 4 }, mp.randn { 2, 3, 4, 5 }).shape)
    assert.are.same({ 2, 3, 4 }, mp.matmul(mp.randn { 2, 3, 4, 5 }, mp.randn { 5 }).shape)
  end)
end)

describe("topk and sort", function()
  it("match a plain sort, ties in index order, NaN above every number", function()
    mp.manual_seed(11)
    local x = mp.randint(0, 6, { 4, 9 }, { dtype = "f32" })   -- many ties
    local v, i = x:topk(4)
    local rows = x:totable()
    for r = 1, 4 do
      local e = {}
      for j, val in ipairs(rows[r]) do e[j] = { val, j - 1 } end
      table.sort(e, function(a, b) return a[1] > b[1] or (a[1] == b[1] and a[2] < b[2]) end)
      for j = 1, 4 do
        assert.are.equal(e[j][1], v:totable()[r][j])
        assert.are.equal(e[j][2], i:totable()[r][j])
      end
    end
    local s, si = mp.tensor({ 2, 0 / 0, -1, 2 }):sort(1, { descending = true })
    local sv = s:totable()
    assert.is_true(sv[1] ~= sv[1], "NaN first when descending")
    assert.are.same({ 2, 2, -1 }, { sv[2], sv[3], sv[4] })
    assert.are.same({ 1, 0, 3, 2 }, si:totable())
    local a, ai = mp.tensor({ 3, 1, 2 }):sort()
    assert.are.same({ 1, 2, 3 }, a:totable())
    assert.are.same({ 1, 2, 0 }, ai:totable())
    local lo = mp.tensor({ 5, 1, 4 }):topk(2, 1, { largest = false })
    assert.are.same({ 1, 4 }, lo:totable())
    -- i32 exactly: 2^24 + 1 and 2^24 round to one f32, and -1 is no NaN
    local iv, ii = mp.tensor({ 16777216, -1, 16777217, 0 }, { dtype = "i32" }):topk(3)
    assert.are.same({ 16777217, 16777216, 0 }, iv:totable())
    assert.are.same({ 2, 0, 3 }, ii:totable())
    assert.are.same({ -1, 0 }, mp.tensor({ 3, -1, 0 }, { dtype = "i32" }):topk(2, 1, { largest = false }):totable())
  end)

  it("along any dim, and the indices gather the values back", function()
    local x = mp.randn { 3, 5, 4 }
    local v, i = x:topk(2, 2)
    assert.are.same({ 3, 2, 4 }, v.shape)
    assert.are.equal("i32", i.dtype)
    local xv, iv, vv = x:totable(), i:totable(), v:totable()
    for a = 1, 3 do for c = 1, 4 do for b = 1, 2 do
      assert.are.equal(xv[a][iv[a][b][c] + 1][c], vv[a][b][c])
    end end end
    local s = x:sort(1)
    assert.are.same({ 3, 5, 4 }, s.shape)
  end)

  it("bad k, dims and dtypes are errors", function()
    local x = mp.randn { 2, 3 }
    H.raises(function() return x:topk(0) end, { "Tensor:topk", "k must be in 1..3" })
    H.raises(function() return x:topk(4) end, { "k must be in 1..3" })
    H.raises(function() return x:topk(1, 3) end, { "dim 3 out of range" })
    H.raises(function() return x:topk(1, 1, { biggest = true }) end, { "unknown option 'biggest'" })
    H.raises(function() return x:to("u8"):sort() end, { "Tensor:sort", "u8" })
  end)
end)

describe("mp.multinomial", function()
  it("draws in proportion to the weights, never a zero weight, reproducibly", function()
    mp.manual_seed(3)
    local d = mp.multinomial(mp.tensor({ 1, 0, 3 }), 4000, { replacement = true }):totable()
    local count = { [0] = 0, [1] = 0, [2] = 0 }
    for _, c in ipairs(d) do count[c] = count[c] + 1 end
    assert.are.equal(0, count[1])
    assert.is_true(math.abs(count[2] / 4000 - 0.75) < 0.03, "frequency " .. count[2] / 4000)
    mp.manual_seed(3)
    assert.are.same(d, mp.multinomial(mp.tensor({ 1, 0, 3 }), 4000, { replacement = true }):totable())
  end)

  it("without replacement draws each category at most once; rows are independent", function()
    local d = mp.multinomial(mp.ones { 3, 6 }, 6)
    assert.are.same({ 3, 6 }, d.shape)
    for _, row in ipairs(d:totable()) do
      table.sort(row)
      assert.are.same({ 0, 1, 2, 3, 4, 5 }, row)
    end
    -- weights whose running total does not come back to 0 exactly after each draw
    local w = mp.tensor({ { 0.1, 0.2, 0.7, 1e-7, 0.3 } }) * mp.ones { 200, 1 }
    local all = mp.multinomial(w, 5):totable()
    for _, row in ipairs(all) do
      table.sort(row)
      assert.are.same({ 0, 1, 2, 3, 4 }, row)
    end
  end)

  it("bad tables are errors", function()
    H.raises(function() return mp.multinomial(mp.tensor({ 1, -1 }), 1) end, { "mp.multinomial", "negative" })
    H.raises(function() return mp.multinomial(mp.zeros { 3 }, 1) end, { "sums to 0" })
    H.raises(function() return mp.multinomial(mp.tensor({ 1, 0 }), 2) end, { "fewer than 2" })
    H.raises(function() return mp.multinomial(mp.ones { 3 }, 4) end, { "without replacement" })
    H.raises(function() return mp.multinomial(mp.ones { 3 }, 0) end, { "positive" })
    H.raises(function() return mp.multinomial(mp.ones { 2, 2, 2 }, 1) end, { "1-d or 2-d" })
  end)
end)
