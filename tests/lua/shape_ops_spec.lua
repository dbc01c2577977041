-- shape_ops_spec.lua: the shape and indexing ops (engine/ops_dims.c,
-- engine/ops_gather.c, lua/lshape.c): stack, unsqueeze, squeeze, permute,
-- expand, gather, scatter, scatter_add, and split/chunk returning values; each
-- as mp.X(x, ...) and x:X(...), in every dtype it serves, against values
-- worked out by hand; gradients (exact for these linear ops, and gradcheck and
-- gradgradcheck in f64 on the CPU); errors naming the form called and the
-- argument. Runs on the default device (MP_DEVICE=cuda: the emulated device).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local DEV = mp.default_device()
local FLOATS = { "f32", "f16", "bf16" }
local MOVE = { "f32", "f16", "bf16", "i32", "u8" }   -- pure data movement: every dtype
if DEV == "cpu" then FLOATS[#FLOATS + 1] = "f64"; MOVE[#MOVE + 1] = "f64" end

local function T(v, dt) return mp.tensor(v, { dtype = dt or "f32" }) end
local function I(v) return mp.tensor(v, { dtype = "i32" }) end
local function seq(shape, dt)   -- 0, 1, 2, ... in the given shape
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return mp.arange(n):reshape(shape):to(dt or "f32")
end

-- a bad index value: raised by the op on the CPU; an asynchronous device
-- checks on the device and raises at the next read (by the reader's name), so
-- the result is read here
local function bad_index(fn, name, words)
  local msg = H.raises(function() return fn():totable() end, words)
  if DEV == "cpu" then assert(msg:find(name, 1, true), msg) end
end

-- x's gradient of sum(f(x) * w) for a weight w of f(x)'s shape
local function grad_of(f, x, w)
  local xr = x:detach():requires_grad(true)
  local loss = (f(xr) * w):sum()
  loss:backward()
  return xr.grad
end

describe("unsqueeze and squeeze", function()
  it("insert and drop size-1 dims as views, both forms, every dtype", function()
    for _, dt in ipairs(MOVE) do
      local x = seq({ 2, 3 }, dt)
      assert.are.same({ 1, 2, 3 }, x:unsqueeze(1).shape)
      assert.are.same({ 2, 1, 3 }, mp.unsqueeze(x, 2).shape)
      assert.are.same({ 2, 3, 1 }, x:unsqueeze(3).shape)
      assert.are.same({ 2, 3, 1 }, x:unsqueeze(-1).shape)
      assert.are.same({ 2, 1, 3 }, x:unsqueeze(-2).shape)
      assert.are.same({ { { 0, 1, 2 } }, { { 3, 4, 5 } } }, x:unsqueeze(2):totable())
      local y = mp.zeros({ 1, 2, 1, 3, 1 }, { dtype = dt })
      assert.are.same({ 2, 3 }, y:squeeze().shape)
      assert.are.same({ 2, 1, 3, 1 }, mp.squeeze(y, 1).shape)
      assert.are.same({ 1, 2, 1, 3 }, y:squeeze(-1).shape)
      assert.are.same({ 1, 2, 1, 3, 1 }, y:squeeze(2).shape)   -- size 2: stays, as PyTorch's
    end
    assert.are.same({}, mp.ones({ 1, 1 }):squeeze().shape)
  end)

  it("gradients reshape back", function()
    local x = seq { 2, 3 }
    assert.are.same({ 2, 3 }, grad_of(function(a) return a:unsqueeze(2) end, x, mp.ones { 2, 1, 3 }).shape)
    assert.are.same({ 1, 3 }, grad_of(function(a) return mp.squeeze(a) end, mp.ones { 1, 3 }, T { 1, 2, 3 }).shape)
  end)

  it("errors name the form and the dim", function()
    local x = seq { 2, 3 }
    H.raises(function() return x:unsqueeze(4) end, { "Tensor:unsqueeze", "dim 4 out of range", "1..3" })
    H.raises(function() return mp.unsqueeze(x, -4) end, { "mp.unsqueeze", "dim -4" })
    H.raises(function() return mp.unsqueeze(x, 0) end, { "mp.unsqueeze", "dim 0" })
    H.raises(function() return x:squeeze(3) end, { "Tensor:squeeze", "dim 3 out of range" })
    H.raises(function() return mp.squeeze(x, 0) end, { "mp.squeeze", "dim 0 is not a dim" })
    H.raises(function() return mp.squeeze("x") end, { "mp.squeeze", "x must be a tensor", "string" })
  end)
end)

describe("mp.stack", function()
  it("stacks along a new dim (default 1, up to ndim+1), every dtype", function()
    for _, dt in ipairs(MOVE) do
      local a, b = T({ { 1, 2 }, { 3, 4 } }, dt), T({ { 5, 6 }, { 7, 8 } }, dt)
      local s = mp.stack { a, b }
      assert.are.same({ 2, 2, 2 }, s.shape)
      assert.are.same({ { { 1, 2 }, { 3, 4 } }, { { 5, 6 }, { 7, 8 } } }, s:totable())
      assert.are.same({ { { 1, 2 }, { 5, 6 } }, { { 3, 4 }, { 7, 8 } } }, mp.stack({ a, b }, 2):totable())
      assert.are.same({ { { 1, 5 }, { 2, 6 } }, { { 3, 7 }, { 4, 8 } } }, mp.stack({ a, b }, 3):totable())
      assert.are.same(mp.stack({ a, b }, 3):totable(), mp.stack({ a, b }, -1):totable())
      assert.are.equal(dt, s.dtype)
    end
    assert.are.same({ 3, 1 }, mp.stack { T { 1 }, T { 2 }, T { 3 } }.shape)
    local many = {}
    for i = 1, 20 do many[i] = T { i, -i } end   -- more than the 16 kept on the C stack
    local m = mp.stack(many, 2)
    assert.are.same({ 2, 20 }, m.shape)
    assert.are.same({ 20, -20 }, m:select(2, 20):totable())
  end)

  it("each input gets its slice of the gradient", function()
    local a, b = T({ 1, 2 }):requires_grad(true), T({ 3, 4 }):requires_grad(true)
    local loss = (mp.stack({ a, b }, 2) * T { { 1, 2 }, { 3, 4 } }):sum()
    loss:backward()
    assert.are.same({ 1, 3 }, a.grad:totable())
    assert.are.same({ 2, 4 }, b.grad:totable())
  end)

  it("refuses different shapes, an empty list and bad dims", function()
    H.raises(function() return mp.stack { T { 1, 2 }, T { 1, 2, 3 } } end, { "mp.stack", "tensor 2 is {3}", "one shape" })
    H.raises(function() return mp.stack {} end, { "mp.stack", "empty" })
    H.raises(function() return mp.stack({ T { 1 } }, 3) end, { "mp.stack", "dim 3 out of range" })
    H.raises(function() return mp.stack { T { 1 }, 2 } end, { "mp.stack", "list[2]" })
    H.raises(function() return mp.stack(T { 1 }) end, { "mp.stack", "list" })
  end)
end)

describe("permute", function()
  it("reorders dims (dims as arguments or a table), every dtype", function()
    for _, dt in ipairs(MOVE) do
      local x = seq({ 2, 3, 4 }, dt)
      local p = x:permute(3, 1, 2)
      assert.are.same({ 4, 2, 3 }, p.shape)
      -- p[k][i][j] = x[i][j][k] = 12 i + 4 j + k (0-based)
      local v = p:totable()
      for k = 1, 4 do for i = 1, 2 do for j = 1, 3 do
        assert.are.equal(12 * (i - 1) + 4 * (j - 1) + (k - 1), v[k][i][j])
      end end end
      assert.are.same(p:totable(), mp.permute(x, { -1, 1, 2 }):totable())
      assert.are.same(x:transpose(1, 3):totable(), x:permute(3, 2, 1):totable())
    end
  end)

  it("its gradient is the inverse permutation", function()
    local x = seq { 2, 3, 4 }
    local w = seq({ 4, 2, 3 }) + 1
    local g = grad_of(function(a) return a:permute(3, 1, 2) end, x, w)
    assert.are.same(w:permute(2, 3, 1):totable(), g:totable())
  end)

  it("refuses wrong counts and repeated dims", function()
    local x = seq { 2, 3 }
    H.raises(function() return x:permute(1) end, { "Tensor:permute", "expected 2 dims", "got 1" })
    H.raises(function() return mp.permute(x, 1, 1) end, { "mp.permute", "dim 1 is repeated" })
    H.raises(function() return mp.permute(x, 1, 3) end, { "mp.permute", "dim 3 out of range" })
    H.raises(function() return mp.permute(x, 1, 2.5) end, { "mp.permute", "size of dim 2" })
  end)
end)

describe("expand", function()
  it("repeats size-1 dims and adds leading ones, -1 keeping a size, every dtype", function()
    for _, dt in ipairs(MOVE) do
      local x = T({ { 1 }, { 2 } }, dt)
      assert.are.same({ { 1, 1, 1 }, { 2, 2, 2 } }, x:expand(2, 3):totable())
      assert.are.same({ { 1, 1, 1 }, { 2, 2, 2 } }, mp.expand(x, { -1, 3 }):totable())
      local e = mp.expand(x, 2, -1, 2)
      assert.are.same({ 2, 2, 2 }, e.shape)
      assert.are.same({ { { 1, 1 }, { 2, 2 } }, { { 1, 1 }, { 2, 2 } } }, e:totable())
      assert.are.equal(dt, e.dtype)
    end
    -- values are copied exactly: -0 keeps its sign
    assert.are.equal(-math.huge, 1 / T({ -0.0 }):expand(3):totable()[3])
  end)

  it("its gradient sums over the repeats", function()
    local x = T { { 1 }, { 2 } }
    local g = grad_of(function(a) return a:expand(3, 2, 4) end, x, seq({ 3, 2, 4 }))
    -- row r sums w[b][r][c] over b and c: r=1: 0..3 + 8..11 + 16..19, r=2: 4..7 + 12..15 + 20..23
    assert.are.same({ { 6 + 38 + 70 }, { 22 + 54 + 86 } }, g:totable())
  end)

  it("refuses sizes that do not fit", function()
    local x = T { { 1 }, { 2 } }
    H.raises(function() return x:expand(3, 3) end, { "Tensor:expand", "cannot expand {2,1}", "dim 1 has size 2" })
    H.raises(function() return mp.expand(x, 3) end, { "mp.expand", "1 sizes for a 2-d tensor" })
    H.raises(function() return mp.expand(x, -1, 2, 2) end, { "mp.expand", "-1 in new dim 1" })
    H.raises(function() return mp.expand(x, 2, 0) end, { "mp.expand", "dim 2 must be positive" })
  end)
end)

describe("gather", function()
  it("picks along a dim with 0-based i32 indices, an index smaller than x, every dtype", function()
    for _, dt in ipairs(MOVE) do
      local x = T({ { 1, 2, 3 }, { 4, 5, 6 } }, dt)
      local g = x:gather(2, I { { 2, 0 }, { 1, 1 } })
      assert.are.same({ { 3, 1 }, { 5, 5 } }, g:totable())
      assert.are.equal(dt, g.dtype)
      assert.are.same({ { 4, 2, 6 } }, mp.gather(x, 1, I { { 1, 0, 1 } }):totable())
      assert.are.same({ { 4 }, { 1 }, { 4 } }, mp.gather(x, -2, I { { 1 }, { 0 }, { 1 } }):totable())   -- dim 1 may be larger
    end
  end)

  it("its gradient is the scatter_add of the gradient (repeats add up)", function()
    local x = T { { 1, 2, 3 }, { 4, 5, 6 } }
    local g = grad_of(function(a) return a:gather(2, I { { 2, 2, 0 }, { 1, 1, 1 } }) end, x, T { { 1, 2, 4 }, { 1, 10, 100 } })
    assert.are.same({ { 4, 0, 3 }, { 0, 111, 0 } }, g:totable())
  end)

  it("refuses bad indices, naming the form and the argument", function()
    local x = T { { 1, 2, 3 }, { 4, 5, 6 } }
    bad_index(function() return x:gather(2, I { { 3 } }) end, "Tensor:gather", { "index: 3 at position 1 out of range [0, 3)" })
    bad_index(function() return mp.gather(x, 2, I { { -1 } }) end, "mp.gather", { "index: -1" })
    H.raises(function() return mp.gather(x, 2, T { { 0 } }) end, { "mp.gather", "index must be i32 (got f32)" })
    H.raises(function() return mp.gather(x, 2, I { 0 }) end, { "mp.gather", "as many dims", "2, got 1" })
    H.raises(function() return mp.gather(x, 2, I { { 0 }, { 0 }, { 0 } }) end, { "mp.gather", "larger than the tensor", "dim 1" })
    H.raises(function() return mp.gather(x, 3, I { { 0 } }) end, { "mp.gather", "dim 3 out of range" })
    H.raises(function() return mp.gather(x, 2, { { 0 } }) end, { "mp.gather", "index must be a tensor", "table" })
    H.raises(function() return mp.gather(nil, 2, I { { 0 } }) end, { "mp.gather", "x must be a tensor", "nil" })
  end)
end)

describe("scatter and scatter_add", function()
  it("scatter writes src (a tensor, its corner, or a number) at the indexed places, out of place", function()
    for _, dt in ipairs(MOVE) do
      local x = mp.zeros({ 3, 4 }, { dtype = dt })
      local src = T({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }, dt)
      local s = x:scatter(1, I { { 2, 0 } }, src)   -- src larger than the index: its corner
      assert.are.same({ { 0, 2, 0, 0 }, { 0, 0, 0, 0 }, { 1, 0, 0, 0 } }, s:totable())
      assert.are.same({ { 0, 0, 0, 0 }, { 0, 0, 0, 0 }, { 0, 0, 0, 0 } }, x:totable())   -- x unchanged
      assert.are.same({ { 9, 0, 0, 9 }, { 0, 0, 0, 0 }, { 0, 0, 0, 0 } }, mp.scatter(x, 2, I { { 3, 0 } }, 9):totable())
      assert.are.equal(dt, s.dtype)
    end
  end)

  it("scatter_add adds, repeated indices adding up, every dtype", function()
    for _, dt in ipairs(MOVE) do
      local x = mp.ones({ 2, 3 }, { dtype = dt })
      local r = x:scatter_add(2, I { { 0, 0, 2, 0 }, { 1, 1, 1, 1 } }, T({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }, dt))
      assert.are.same({ { 8, 1, 4 }, { 1, 27, 1 } }, r:totable())
      assert.are.same(r:totable(), mp.scatter_add(x, -1, I { { 0, 0, 2, 0 }, { 1, 1, 1, 1 } },
        T({ { 1, 2, 3, 4 }, { 5, 6, 7, 8 } }, dt)):totable())
    end
  end)

  it("gradients: x's with the scattered places zeroed (scatter) or whole (scatter_add), src's gathered", function()
    local idx = I { { 2, 0 } }
    local w = seq({ 3, 2 }) + 1   -- 1..6
    for _, add in ipairs { false, true } do
      local x = mp.zeros({ 3, 2 }, { requires_grad = true })
      local src = T({ { 10, 20, 30 }, { 40, 50, 60 } }):requires_grad(true)
      local y = add and mp.scatter_add(x, 1, idx, src) or mp.scatter(x, 1, idx, src)
      local loss = (y * w):sum()
      loss:backward()
      if add then
        assert.are.same({ { 1, 2 }, { 3, 4 }, { 5, 6 } }, x.grad:totable())
      else
        assert.are.same({ { 1, 0 }, { 3, 4 }, { 0, 6 } }, x.grad:totable())
      end
      -- src[1][1] went to (3, 1), src[1][2] to (1, 2); the rest of src took no part
      assert.are.same({ { 5, 2, 0 }, { 0, 0, 0 } }, src.grad:totable())
    end
  end)

  it("refuses bad indices, dtypes and shapes, naming the form and the argument", function()
    local x = mp.zeros { 3, 4 }
    bad_index(function() return x:scatter(1, I { { 3 } }, 1) end, "Tensor:scatter", { "index: 3 at position 1 out of range [0, 3)" })
    H.raises(function() return mp.scatter_add(x, 1, I { { 0 } }, 1) end, { "mp.scatter_add", "src must be a tensor (got number)" })
    H.raises(function() return mp.scatter(x, 1, I { { 0 } }, "a") end, { "mp.scatter", "src must be a tensor or a number" })
    H.raises(function() return mp.scatter(x, 1, I { { 0, 0 } }, mp.ones { 1, 1 }) end, { "mp.scatter", "larger than src", "dim 2" })
    H.raises(function() return mp.scatter(x, 1, I { { 0 } }, mp.ones { 1 }) end, { "mp.scatter", "src must have as many dims" })
    H.raises(function() return x:scatter_add(1, I { { 0 } }, mp.ones({ 1, 1 }, { dtype = "f16" })) end,
      { "Tensor:scatter_add", "src is f16 and the tensor f32" })
    H.raises(function() return x:scatter(2, I { { 0 }, { 0 }, { 0 }, { 0 } }, 1) end, { "Tensor:scatter", "larger than the tensor" })
    H.raises(function() return x:scatter(1, T { { 0 } }, 1) end, { "Tensor:scatter", "index must be i32" })
  end)
end)

describe("gradcheck in f64 (the CPU)", function()
  local function X(shape, seed)
    mp.manual_seed(seed or 1)
    return mp.randn(shape, { dtype = "f64", device = "cpu", requires_grad = true })
  end
  local idx = mp.tensor({ { 2, 0, 1 }, { 1, 1, 0 } }, { dtype = "i32", device = "cpu" })
  -- scatter's src gradient is PyTorch's (the gather of the gradient): right where no index repeats
  local uniq = mp.tensor({ { 2, 0, 1 }, { 1, 3, 0 } }, { dtype = "i32", device = "cpu" })
  local cases = {
    { "gather", function(a) return a:gather(2, idx) end, { X { 2, 4 } } },
    { "scatter", function(a, s) return a:scatter(2, uniq, s) end, { X { 2, 4 }, X({ 2, 3 }, 2) } },
    { "scatter_add", function(a, s) return mp.scatter_add(a, 2, idx, s) end, { X { 2, 4 }, X({ 3, 5 }, 2) } },
    { "permute", function(a) return a:permute(2, 3, 1) end, { X { 2, 3, 4 } } },
    { "expand", function(a) return a:expand(3, -1, 4) end, { X { 2, 1 } } },
    { "stack", function(a, b) return mp.stack({ a, b }, 2) end, { X { 2, 3 }, X({ 2, 3 }, 2) } },
    { "unsqueeze and squeeze", function(a) return a:unsqueeze(2):squeeze(3) end, { X { 2, 1 } } },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. ": gradcheck and gradgradcheck", function()
      local f = function(...) return c[2](...) * c[2](...) end   -- squared: a second derivative to check
      assert.is_true(mp.autograd.gradcheck(f, c[3]))
      assert.is_true(mp.autograd.gradgradcheck(f, c[3]))
    end)
  end
end)

describe("split and chunk return values", function()
  it("as many values as pieces, both forms", function()
    local x = seq { 5, 2 }
    assert.are.equal(3, select("#", x:split(2)))
    assert.are.equal(3, select("#", mp.split(x, 2)))
    local a, b = mp.split(x, { 1, 4 })
    assert.are.same({ 1, 2 }, a.shape)
    assert.are.same({ 4, 2 }, b.shape)
    local q, k, v = seq({ 2, 6 }):chunk(3, 2)
    assert.are.same({ { 0, 1 }, { 6, 7 } }, q:totable())
    assert.are.same({ { 4, 5 }, { 10, 11 } }, v:totable())
    assert.are.same(k:totable(), select(2, mp.chunk(seq({ 2, 6 }), 3, -1)):totable())
    H.raises(function() return mp.chunk(x, 0) end, { "mp.chunk", "chunks must be positive" })
    H.raises(function() return mp.split(x, 0) end, { "mp.split", "size must be positive" })
    -- counts near 2^63: no overflow in the rounding up (chunk divided by zero and killed the process)
    assert.are.equal(x.shape[1], select("#", x:chunk(math.maxinteger)))
    assert.are.equal(1, select("#", x:split(math.maxinteger)))
    assert.are.equal(1, select("#", mp.split(x, math.maxinteger - 1)))
    -- more arguments than the function takes are refused, never ignored
    H.raises(function() return x:unsqueeze(1, 2) end, { "Tensor:unsqueeze", "too many arguments (at most 2, got 3)" })
    H.raises(function() return mp.stack({ x, x }, 1, 2) end, { "mp.stack", "too many arguments" })
    H.raises(function() return mp.sin(x, 3) end, { "mp.sin", "too many arguments" })
  end)
end)

describe("every shape method has its mp function, and errors name the form called", function()
  local names = { "size", "dim", "numel", "reshape", "view", "unsqueeze", "squeeze", "transpose", "permute", "expand", "contiguous", "clone",
    "detach", "to", "narrow", "select", "split", "chunk", "tril", "triu", "masked_fill", "index_select", "gather",
    "scatter", "scatter_add", "topk", "sort" }
  it("both forms exist and agree", function()
    local x = seq { 2, 3 }
    for _, n in ipairs(names) do
      assert.is_function(mp[n], "mp." .. n)
      assert.is_not_nil(x[n], "Tensor:" .. n)
    end
    assert.are.same({ 2, 3 }, mp.size(x))
    assert.are.equal(3, mp.size(x, -1))
    assert.are.equal(2, mp.dim(x))
    assert.are.equal(6, mp.numel(x))
    assert.are.same(x:reshape(3, 2):totable(), mp.reshape(x, { 3, 2 }):totable())
    assert.are.same(x:view(-1):totable(), mp.view(x, -1):totable())
    assert.are.same(x:transpose(1, 2):totable(), mp.transpose(x, 1, 2):totable())
    assert.are.same(x:narrow(2, 2, 2):totable(), mp.narrow(x, 2, 2, 2):totable())
    assert.are.same(x:index_select(2, I { 2, 0 }):totable(), mp.index_select(x, 2, I { 2, 0 }):totable())
    assert.are.same(mp.clone(x):totable(), x:totable())
    assert.are.equal("f16", mp.to(x, "f16").dtype)
    assert.is_true(mp.contiguous(x) == x)
    local v, i = mp.topk(x, 2)
    assert.are.same({ { 2, 1 }, { 5, 4 } }, v:totable())
    assert.are.same({ { 2, 1 }, { 2, 1 } }, i:totable())
    local d = mp.detach(x:requires_grad(true) * 2)
    assert.is_true(d.is_leaf)
  end)

  it("errors carry mp.X or Tensor:X", function()
    local x = seq { 2, 3 }
    H.raises(function() return mp.size(x, 3) end, { "mp.size:", "dim 3 out of range" })
    H.raises(function() return x:size(3) end, { "Tensor:size:", "dim 3 out of range" })
    H.raises(function() return mp.reshape(x, 4) end, { "mp.reshape:", "cannot reshape" })
    H.raises(function() return x:reshape(4) end, { "Tensor:reshape:", "cannot reshape" })
    H.raises(function() return mp.narrow(x, 1, 3, 1) end, { "mp.narrow:", "start 3" })
    H.raises(function() return mp.to(x, "f17") end, { "mp.to:", "'f17'" })
    H.raises(function() return mp.sort(x, 3) end, { "mp.sort:", "dim 3" })
    H.raises(function() return mp.transpose(x, 1, 3) end, { "mp.transpose:", "dim 3" })
  end)
end)
