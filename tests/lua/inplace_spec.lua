-- inplace_spec.lua: mp.clamp and the in-place ops (engine/ops_inplace.c,
-- engine/ops_clamp.c) with version counters (engine/graph.h): values against
-- plain Lua, gradients, the errors PyTorch raises (a saved tensor modified in
-- place, a leaf that requires grad), init under no_grad, views sharing their
-- storage's counter, and training (optimizer steps, .grad accumulation) that
-- must not trip the checks. Runs on the default device: the CPU, and with
-- MP_DEVICE=cuda the fake and the emulated device (f64 only where it exists).

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local DEV = mp.default_device()
local FLOATS = DEV == "cpu" and { "f32", "f16", "bf16", "f64" } or { "f32", "f16", "bf16" }
local NAN = 0 / 0

local function T(v, dt) return mp.tensor(v, { dtype = dt or "f32" }) end
local function leaf(v, dt)
  local t = T(v, dt)
  t:requires_grad(true)
  return t
end
local function no_grad(fn)
  local _ <close> = mp.no_grad()
  return fn()
end
-- the value x holds in dtype dt (what a kernel rounds it to)
local function in_dtype(x, dt) return T({ x }, dt):totable()[1] end

describe("mp.clamp", function()
  local xs = { -3, -1, -0.5, 0, 0.25, 1, 2.5, NAN, 1 / 0, -1 / 0 }

  local function ref(x, lo, hi)
    if x ~= x then return x end
    if lo and x < lo then x = lo end
    if hi and x > hi then x = hi end
    return x
  end

  it("limits values to [min, max] in every float dtype; NaN passes through", function()
    for _, dt in ipairs(FLOATS) do
      for _, b in ipairs { { -1, 1 }, { nil, 0.25 }, { 0, nil }, { 1, -1 }, { -0.3, 0.7 } } do
        local lo, hi = b[1], b[2]
        local want = {}
        for i, x in ipairs(xs) do
          want[i] = ref(in_dtype(x, dt), lo and in_dtype(lo, dt), hi and in_dtype(hi, dt))
        end
        local x = T(xs, dt)
        local y = mp.clamp(x, lo, hi)
        assert.are.equal(dt, y.dtype)
        H.assert_same(y:totable(), want, dt .. " clamp(" .. tostring(lo) .. ", " .. tostring(hi) .. ")")
        H.assert_same(x:clamp(lo, hi):totable(), want, "t:clamp")
      end
    end
  end)

  it("min > max gives max everywhere, as PyTorch", function()
    H.assert_same(mp.clamp(T { -5, 0, 5 }, 1, -1):totable(), { -1, -1, -1 })
  end)

  it("gradient: 1 where min <= x <= max (bounds included), 0 outside and at NaN", function()
    for _, dt in ipairs(FLOATS) do
      local x = leaf({ -2, -1, 0, 1, 2, NAN }, dt)
      mp.clamp(x, -1, 1):sum():backward()
      H.assert_same(x.grad:totable(), { 0, 1, 1, 1, 0, 0 }, dt)
      local z = leaf({ -2, 0, 2 }, dt)
      z:clamp(nil, 0):sum():backward()
      H.assert_same(z.grad:totable(), { 1, 1, 0 }, dt .. " max only")
    end
  end)

  it("passes gradcheck in f64 and differentiates its gradient again (create_graph)", function()
    if DEV ~= "cpu" then return end
    local x = mp.tensor({ -1.7, -0.4, 0.3, 0.9, 1.6 }, { dtype = "f64" })
    x:requires_grad(true)
    assert.is_true(mp.autograd.gradcheck(function(a) return mp.clamp(a, -0.5, 1) end, { x }))
    local y = mp.clamp(x, -0.5, 1)
    local g = mp.ones({ 5 }, { dtype = "f64" })
    g:requires_grad(true)
    local gx = mp.autograd.grad({ y }, { x }, { grad_outputs = { g }, create_graph = true })[1]
    local gg = mp.autograd.grad({ (gx * gx):sum() }, { g })[1]
    H.assert_same(gg:totable(), { 0, 2, 2, 2, 0 })   -- d/dg sum((g * mask)^2) = 2 g mask
  end)

  it("errors name the function and the argument", function()
    local x = T { 1, 2 }
    H.raises(function() return mp.clamp(x) end, { "mp.clamp", "min or max" })
    H.raises(function() return x:clamp(nil, nil) end, { "Tensor:clamp", "min or max" })
    H.raises(function() return mp.clamp(x, "a", 1) end, { "mp.clamp", "min must be a number or nil", "string" })
    H.raises(function() return mp.clamp(x, 0, {}) end, { "mp.clamp", "max must be a number or nil" })
    H.raises(function() return mp.clamp(x, NAN, 1) end, { "mp.clamp", "min", "NaN" })
    H.raises(function() return mp.clamp(mp.tensor({ 1, 2 }, { dtype = "i32" }), 0, 1) end,
      { "mp.clamp", "float", "i32" })
    H.raises(function() return mp.clamp(5, 0, 1) end, { "mp.clamp", "x must be a tensor (got number)" })
  end)
end)

describe("in-place ops", function()
  it("add_, sub_, mul_, div_, pow_ with a tensor or a number, returning self", function()
    for _, dt in ipairs(FLOATS) do
      local x = T({ 1, 2, 4 }, dt)
      assert.is_true(rawequal(x, x:add_(1)))
      H.assert_same(x:totable(), { 2, 3, 5 }, dt)
      x:sub_(T({ 1, 1, 1 }, dt)):mul_(2):div_(T({ 2, 4, 8 }, dt))
      H.assert_same(x:totable(), { 1, 1, 1 }, dt)
      x:add_(T({ 1, 2, 3 }, dt)):pow_(2)
      H.assert_same(x:totable(), { 4, 9, 16 }, dt)
      x:pow_(T({ 0.5, 0.5, 0.5 }, dt))
      H.assert_same(x:totable(), { 2, 3, 4 }, dt)
      assert.are.equal(dt, x.dtype)
    end
  end)

  it("give the out-of-place op's values bit for bit, with and without autograd", function()
    math.randomseed(7)
    local function rnd(shape, dt)
      local v = {}
      for i = 1, H.numel(shape) do v[i] = H.gauss() end
      return mp.tensor(H.nest(v, shape), { dtype = dt })
    end
    for _, dt in ipairs(FLOATS) do
      local x, y, r = rnd({ 4, 5 }, dt), rnd({ 4, 5 }, dt), rnd({ 5 }, dt)
      for _, op in ipairs { "add", "sub", "mul", "div" } do
        local f = ({ add = function(a, b) return a + b end, sub = function(a, b) return a - b end,
                     mul = function(a, b) return a * b end, div = function(a, b) return a / b end })[op]
        for _, other in ipairs { y, r, 0.3, -1.7 } do
          local want = f(x, other):totable()
          local c = x:clone()                -- no history: the direct path
          H.assert_same(c[op .. "_"](c, other):totable(), want, dt .. " " .. op .. "_")
          local a = x:clone()
          a:requires_grad(true)
          local b = a * 1                    -- with history: the general path
          b[op .. "_"](b, other)
          H.assert_same(b:totable(), want, dt .. " " .. op .. "_ with autograd")
        end
      end
    end
  end)

  it("the unary ones, fill_, zero_ and clamp_", function()
    local x = T { -1, 0, 4 }
    H.assert_same(x:clone():neg_():totable(), { 1, 0, -4 })
    H.assert_same(x:clone():abs_():totable(), { 1, 0, 4 })
    H.assert_same(x:clone():relu_():totable(), { 0, 0, 4 })
    H.assert_same(x:clone():clamp_(-0.5, 2):totable(), { -0.5, 0, 2 })
    H.assert_same(x:clone():relu_():sqrt_():totable(), { 0, 0, 2 })
    H.assert_close(x:clone():exp_():totable(), x:exp():totable())
    H.assert_close(x:clone():tanh_():totable(), mp.tanh(x):totable())
    H.assert_close(x:clone():sigmoid_():totable(), mp.sigmoid(x):totable())
    H.assert_close(x:clone():abs_():add_(1):log_():totable(), { math.log(2), 0, math.log(5) })
    H.assert_same(x:clone():fill_(7):totable(), { 7, 7, 7 })
    H.assert_same(x:clone():zero_():totable(), { 0, 0, 0 })
    local i = mp.tensor({ 1, 2 }, { dtype = "i32" })
    H.assert_same(i:fill_(3):totable(), { 3, 3 })
    H.assert_same(i:add_(2):mul_(i):totable(), { 25, 25 })
  end)

  it("the other operand broadcasts into self's shape, never self into a larger one", function()
    local x = mp.zeros { 2, 3 }
    x:add_(T { 1, 2, 3 })
    H.assert_same(x:totable(), { { 1, 2, 3 }, { 1, 2, 3 } })
    x:mul_(mp.tensor({ { 2 }, { 3 } }))
    H.assert_same(x:totable(), { { 2, 4, 6 }, { 3, 6, 9 } })
    H.raises(function() return T({ 1, 2, 3 }):add_(mp.zeros { 2, 3 }) end,
      { "Tensor:add_", "{2,3}", "{3}", "self's shape" })
  end)

  it("keeps self's dtype; a float result into an integer tensor is refused", function()
    local h = T({ 1, 2 }, "f16")
    h:mul_(T({ 0.5, 0.25 }, "f32"))
    assert.are.equal("f16", h.dtype)
    H.assert_same(h:totable(), { 0.5, 0.5 })
    local i = mp.tensor({ 1, 2 }, { dtype = "i32" })
    H.raises(function() return i:div_(2) end, { "Tensor:div_", "f32", "i32" })
    H.raises(function() return i:add_(0.5) end, { "Tensor:add_", "i32" })
    H.raises(function() return i:fill_(0.5) end, { "Tensor:fill_" })
    H.assert_same(i:totable(), { 1, 2 })   -- a refused op writes nothing
  end)

  it("argument errors name the method", function()
    local x = T { 1 }
    H.raises(function() return x:add_("2") end, { "Tensor:add_", "other must be a tensor or a number", "string" })
    -- PyTorch's add_(other, alpha) has no alpha here: refused, not ignored
    H.raises(function() return x:add_(x, -0.1) end, { "Tensor:add_", "too many arguments (at most 2, got 3)" })
    H.raises(function() return x:zero_(5) end, { "Tensor:zero_", "too many arguments" })
    H.raises(function() return x:clamp_(0, 1, 2) end, { "Tensor:clamp_", "too many arguments" })
    H.raises(function() return mp.Tensor.add_(nil, 1) end, { "Tensor:add_", "self must be a tensor (got nil)" })
    H.raises(function() return x:fill_() end, { "Tensor:fill_", "value must be a number" })
    H.raises(function() return x:exp_(2) end, { "Tensor:exp_", "no arguments" })
    H.raises(function() return x:clamp_() end, { "Tensor:clamp_", "min or max" })
  end)

  it("every in-place write bumps the storage's version; reads do not", function()
    local x = T { 1, 2 }
    assert.are.equal(0, x:_version())
    x:add_(1); x:zero_(); x:fill_(2); x:clamp_(0, 1); x:exp_()
    x:copy_(T { 3, 4 })
    assert.are.equal(6, x:_version())
    local _ = x + 1, x:sum(), x:clone()
    assert.are.equal(6, x:_version())
  end)
end)

describe("version checks", function()
  it("a saved output modified in place: the backward raises naming the op", function()
    local w = leaf { 1, 2 }
    local y = (w * 1):exp()
    y:mul_(2)
    H.raises(function() y:sum():backward() end,
      { "modified by an in-place operation", "exp's saved tensor", "its output", "at version 1, expected 0" })
  end)

  it("a saved input modified in place, under no_grad too", function()
    local w, v = leaf { 1, 2 }, leaf { 3, 4 }
    local a = w * 1
    local y = a * v                         -- mul saves a and v
    no_grad(function() a:add_(1) end)
    H.raises(function() y:sum():backward() end, { "mul's saved tensor 0", "version 1, expected 0" })
    local b = w * 1
    local s = mp.sigmoid(b)
    b:zero_()                               -- sigmoid saves its output, not b: fine
    s:sum():backward()
    H.assert_close(w.grad:totable(), { 0.19661193, 0.10499359 }, 1e-5)
  end)

  it("Functions' saved tensors are checked too", function()
    local Square = mp.autograd.Function {
      name = "Square",
      forward = function(ctx, x) ctx:save_for_backward(x); return x * x end,
      backward = function(ctx, g) local x = ctx.saved_tensors[1]; return g * 2 * x end,
    }
    local w = leaf { 3 }
    local a = w * 1
    local y = Square(a)
    a:add_(1)
    H.raises(function() y:backward() end, { "Square's saved tensor 0", "modified by an in-place operation" })
  end)

  it("a retained graph walked again after an optimizer step raises; normal training does not", function()
    local w = leaf({ { 0.5, -0.25 }, { 0.1, 0.3 } })
    local opt = mp.optim.SGD({ w }, { lr = 0.1 })
    local x = T({ { 1, 2 }, { 3, 4 } })
    for _ = 1, 3 do                         -- forward, backward (accumulating into .grad), step
      opt:zero_grad()
      local loss = mp.matmul(x, w):sum()
      loss:backward()
      opt:step()
    end
    local loss = mp.matmul(x, w):sum()
    loss:backward({ retain_graph = true })
    loss:backward({ retain_graph = true })  -- a second walk before the step: fine (grads accumulate)
    opt:step()
    H.raises(function() loss:backward() end, { "matmul's saved tensor", "modified by an in-place operation" })
  end)

  it("under autocast too: the arena's f16 working copy is rewritten by the step", function()
    if DEV ~= "cpu" and not mp.cuda.is_available() then return end
    local w = leaf({ { 0.5, -0.25 }, { 0.1, 0.3 } })
    local opt = mp.optim.SGD({ w }, { lr = 0.1 })
    local x = T({ { 1, 2 }, { 3, 4 } })
    local loss
    do
      local _ <close> = mp.amp.autocast("f16")
      loss = mp.matmul(x, w):f32():sum()
    end
    loss:backward({ retain_graph = true })
    opt:step()
    H.raises(function() loss:backward() end, { "modified by an in-place operation" })
    opt:zero_grad()
    for _ = 1, 2 do                         -- and steps in between fresh graphs are fine
      local _ <close> = mp.amp.autocast("f16")
      mp.matmul(x, w):f32():sum():backward()
      opt:step()
      opt:zero_grad()
    end
  end)
end)

describe("autograd of in-place ops", function()
  it("a leaf that requires grad refuses them in grad mode, naming the op", function()
    local w = leaf { 1, 2 }
    for _, f in ipairs {
      function() w:add_(1) end, function() w:mul_(T { 2, 2 }) end, function() w:zero_() end,
      function() w:fill_(1) end, function() w:clamp_(0, 1) end, function() w:exp_() end,
    } do
      H.raises(f, { "a leaf tensor that requires grad is used in an in-place operation" })
    end
    H.raises(function() w:sub_(1) end, { "Tensor:sub_", "leaf" })
    H.assert_same(w:totable(), { 1, 2 })
    assert.are.equal(0, w:_version())
  end)

  it("under no_grad they initialise weights, which then train", function()
    local w = leaf { 1, 2, 3 }
    no_grad(function() w:zero_():add_(T { 0.5, 0.5, 0.5 }):mul_(2) end)
    H.assert_same(w:totable(), { 1, 1, 1 })
    assert.is_true(w.is_leaf)
    assert.is_true(w:requires_grad())
    ;(w * T { 1, 2, 3 }):sum():backward()
    H.assert_same(w.grad:totable(), { 1, 2, 3 })
  end)

  it("on a tensor with history the op's node becomes its grad_fn (rebased, as PyTorch)", function()
    local x = leaf { 1, 2, 3 }
    local y = x * 2
    y:mul_(3):add_(1)
    assert.are.equal("add", y.grad_fn)
    y:sum():backward()
    H.assert_same(x.grad:totable(), { 6, 6, 6 })
    x.grad = nil
    local z = x * 1
    z:exp_()
    z:sum():backward()
    H.assert_close(x.grad:totable(), { math.exp(1), math.exp(2), math.exp(3) }, 1e-6)
  end)

  it("mul_ by a tensor that requires grad keeps the old self for the other's gradient", function()
    local x, w = leaf { 1, 2 }, leaf { 3, 5 }
    local a = x * 1
    a:mul_(w)                               -- a = x * w, written over x's copy
    H.assert_same(a:totable(), { 3, 10 })
    a:sum():backward()
    H.assert_same(x.grad:totable(), { 3, 5 })
    H.assert_same(w.grad:totable(), { 1, 2 })
    local b = mp.zeros { 2 }                -- a plain tensor gains history from its operand
    b:add_(w)
    assert.is_true(b:requires_grad())
    b:mul_(b):sum():backward()              -- d/dw sum(w^2) added to w.grad
    H.assert_same(w.grad:totable(), { 7, 12 })
  end)

  it("fill_ and zero_ on a tensor with history send it no gradient", function()
    local x = leaf { 1, 2 }
    local y = x * 3
    y:fill_(5)
    assert.is_true(y:requires_grad())
    ;(y * x):sum():backward()
    H.assert_same(x.grad:totable(), { 5, 5 })   -- through the product only
  end)

  it("a float16 tensor updated from a float32 one keeps its dtype and its gradient", function()
    local x, w = leaf({ 1, 2 }, "f16"), leaf({ 0.5, 4 }, "f32")
    local a = x * 1
    a:mul_(w)
    assert.are.equal("f16", a.dtype)
    a:sum():backward()
    H.assert_same(x.grad:totable(), { 0.5, 4 })
    H.assert_same(w.grad:totable(), { 1, 2 })
  end)
end)

describe("views share their storage's version", function()
  it("an in-place op through reshape or narrow writes the base and bumps the shared counter", function()
    local x = mp.zeros { 2, 3 }
    local r, n = x:reshape { 6 }, x:narrow(1, 2, 1)
    n:fill_(1)
    H.assert_same(x:totable(), { { 0, 0, 0 }, { 1, 1, 1 } })
    r:add_(1)
    H.assert_same(x:totable(), { { 1, 1, 1 }, { 2, 2, 2 } })
    assert.are.equal(2, x:_version())
    assert.are.equal(2, r:_version())
    assert.are.equal(2, n:_version())
  end)

  it("a tensor saved for backward and written through a view: the backward raises", function()
    local w = leaf { 1, 2, 3, 4 }
    local a = w * 1
    local y = a * w
    no_grad(function() a:reshape({ 2, 2 }):narrow(1, 1, 1):zero_() end)
    H.raises(function() y:sum():backward() end, { "mul's saved tensor 0", "modified by an in-place operation" })
  end)

  it("in grad mode, a view of a tensor that requires grad (and its base) refuse in-place ops", function()
    local w = leaf { 1, 2, 3, 4 }
    local a = w * 1
    local v = a:narrow(1, 1, 2)
    H.raises(function() v:mul_(2) end, { "Tensor:mul_", "view recorded for autograd", "clone()" })
    H.raises(function() a:add_(1) end, { "Tensor:add_", "view recorded for autograd" })
    H.assert_same(a:totable(), { 1, 2, 3, 4 })
    local c = v:clone()                     -- a clone is its own storage
    c:mul_(2)
    c:sum():backward()
    H.assert_same(w.grad:totable(), { 2, 2, 0, 0 })
  end)

  it("a view of a tensor without grad written with a history is refused too (its base would lose it)", function()
    local w = leaf { 1, 2, 3 }
    local buf = mp.zeros { 2, 3 }
    local row = buf:narrow(1, 1, 1)
    H.raises(function() row:add_(w * 2) end, { "Tensor:add_", "view recorded for autograd" })
    H.assert_same(buf:totable(), { { 0, 0, 0 }, { 0, 0, 0 } })
  end)

  it("once the other header is gone, a reshaped result takes in-place ops again", function()
    local w = leaf { 1, 2, 3, 4 }
    local y = (w * 2):reshape { 2, 2 }
    collectgarbage()   -- the product's own header, the view's only sibling
    y:add_(1)
    y:sum():backward()
    H.assert_same(y:totable(), { { 3, 5 }, { 7, 9 } })
    H.assert_same(w.grad:totable(), { 2, 2, 2, 2 })
  end)
end)
