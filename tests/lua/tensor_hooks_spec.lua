-- tensor_hooks_spec.lua: Tensor:register_hook, as PyTorch's Tensor.register_hook:
-- a function run on a tensor's whole gradient during backward (a leaf's before
-- it goes into .grad, a computed tensor's before its node's backward uses it),
-- which may return a replacement; hooks run in registration order, with
-- retain_graph, in mp.autograd.grad and under create_graph; handles remove
-- them; errors name the hook; the functions and the graph are let go.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local function leaf(values) return mp.tensor(values, { requires_grad = true }) end
local function in_use() collectgarbage(); collectgarbage(); return mp.memory().in_use end
local function back(t) t:sum():backward() end   -- a statement may not begin with "("

describe("Tensor:register_hook", function()
  it("on a leaf: sees the gradient, and its replacement goes into .grad", function()
    local x = leaf({ 1, 2, 3 })
    local seen
    x:register_hook(function(g) seen = g:totable(); return g * 10 end)
    local l = (x * x):sum()
    l:backward()
    H.assert_close(seen, { 2, 4, 6 }, 0, 0, "the hook's argument")
    H.assert_close(x.grad:totable(), { 20, 40, 60 }, 0, 0, ".grad")
  end)

  it("on a computed tensor: the replacement flows on to the inputs", function()
    local x = leaf({ 1, 2 })
    local y = x * 3
    local seen
    y:register_hook(function(g) seen = g:totable(); return g + 1 end)
    local l = (y * y):sum()
    l:backward()
    H.assert_close(seen, { 6, 12 }, 0, 0, "dl/dy")
    H.assert_close(x.grad:totable(), { 21, 39 }, 0, 0, "3 * (dl/dy + 1)")
  end)

  it("nil keeps the gradient; several hooks run in registration order, each on the last one's result", function()
    local x = leaf({ 1, 1 })
    local order = {}
    x:register_hook(function(g) order[#order + 1] = "a"; return g * 2 end)
    x:register_hook(function(g) order[#order + 1] = "b:" .. g:totable()[1] end)
    x:register_hook(function(g) order[#order + 1] = "c"; return g + 1 end)
    local l = x:sum()
    l:backward()
    assert.are.same({ "a", "b:2.0", "c" }, order)
    H.assert_close(x.grad:totable(), { 3, 3 }, 0, 0)
  end)

  it("runs once per backward on the sum of a leaf used several times", function()
    local x = leaf({ 1, 2 })
    local calls, seen = 0, nil
    x:register_hook(function(g) calls = calls + 1; seen = g:totable(); return g * g end)
    local l = (x * 2 + x * 3):sum()
    l:backward()
    assert.are.equal(1, calls)
    H.assert_close(seen, { 5, 5 }, 0, 0, "the whole gradient")
    H.assert_close(x.grad:totable(), { 25, 25 }, 0, 0, "the hook of the sum, not the sum of hooks")
  end)

  it("runs on the gradient a backward started at the leaf itself gives", function()
    local x = leaf({ 1, 2 })
    x:register_hook(function(g) return g * 2 end)
    x:backward(mp.tensor({ 3, 4 }))
    H.assert_close(x.grad:totable(), { 6, 8 }, 0, 0)
  end)

  it("handle:remove() stops the hook, twice is harmless, and so is after the tensor is gone", function()
    local x = leaf({ 1 })
    local calls = 0
    local h = x:register_hook(function() calls = calls + 1 end)
    back(x * 2)
    h:remove()
    h:remove()
    back(x * 2)
    assert.are.equal(1, calls)
    local y = leaf({ 1 })
    local h2 = y:register_hook(function() end)
    y:free()
    collectgarbage()
    h2:remove()
    assert.matches("HookHandle", tostring(h2))
  end)

  it("runs on every walk of a graph kept with retain_graph", function()
    local x = leaf({ 1, 2 })
    local y = x * x
    local calls = 0
    y:register_hook(function(g) calls = calls + 1; return g * 0 + 1 end)
    local l = (y * 5):sum()
    l:backward(nil, { retain_graph = true })
    l:backward()
    assert.are.equal(2, calls)
    H.assert_close(x.grad:totable(), { 4, 8 }, 0, 0, "2 * (2x * 1)")
  end)

  it("runs in mp.autograd.grad before an input's gradient is taken, leaving .grad alone", function()
    local x = leaf({ 1, 2 })
    x:register_hook(function(g) return g * 10 end)
    local y = x * 3
    y:register_hook(function(g) return g + 1 end)
    local l = (y * y):sum()
    local gx, gy = table.unpack(mp.autograd.grad(l, { x, y }, { retain_graph = true }))
    H.assert_close(gy:totable(), { 7, 13 }, 0, 0, "y's hook ran before capture")
    H.assert_close(gx:totable(), { 210, 390 }, 0, 0, "y's hook, then 3x, then x's hook")
    assert.is_nil(x.grad)
    -- a leaf's hooks are not a training step's: a grad that does not reach x runs none of x's
    local calls = 0
    x:register_hook(function() calls = calls + 1 end)
    mp.autograd.grad(l, y)
    assert.are.equal(0, calls)
  end)

  it("under create_graph the gradient it sees can require grad, and its replacement is differentiated", function()
    local x = leaf({ 1, 2 })
    local y = x * x
    local req
    y:register_hook(function(g) req = g:requires_grad(); return g * 2 end)
    local z = (y * x):sum()   -- dz/dy = x; with the hook 2x, so dz/dx = 2x * 2x + x^2 = 5x^2
    local g1 = mp.autograd.grad(z, x, { create_graph = true })
    assert.is_true(req)
    assert.is_true(g1:requires_grad())
    H.assert_close(g1:totable(), { 5, 20 }, 0, 0, "first derivative")
    -- g1 = 4x^2 (through y's hook) + y (mul's saved input): y is in g1's graph,
    -- so its hook runs in this walk too (as in PyTorch, where the hook is on
    -- y's node): d/dx = 8x + 2 * 2x
    local g2 = mp.autograd.grad(g1:sum(), x)
    H.assert_close(g2:totable(), { 12, 24 }, 0, 0, "second derivative")
  end)

  it("casts a replacement of another dtype to the gradient's", function()
    local x = leaf({ 1, 2 })
    x:register_hook(function(g) return (g * 3):to("f16") end)
    back(x * 2)
    assert.are.equal("f32", x.grad.dtype)
    H.assert_close(x.grad:totable(), { 6, 6 }, 0, 0)
  end)

  it("a hook added by a hook runs from the next gradient on", function()
    local x = leaf({ 1 })
    local log = {}
    x:register_hook(function(g)
      log[#log + 1] = "outer"
      if #log == 1 then x:register_hook(function() log[#log + 1] = "inner" end) end
    end)
    back(x * 1)
    assert.are.same({ "outer" }, log)
    back(x * 1)
    assert.are.same({ "outer", "outer", "inner" }, log)
  end)

  it("a hook that removes itself while running runs no more", function()
    local x = leaf({ 1 })
    local calls, h = 0, nil
    h = x:register_hook(function() calls = calls + 1; h:remove() end)
    x:register_hook(function(g) return g * 2 end)
    back(x * 1)
    back(x * 1)
    assert.are.equal(1, calls)
    H.assert_close(x.grad:totable(), { 4 }, 0, 0, "the second hook ran both times")
  end)

  it("runs on the coroutine that called backward", function()
    local x = leaf({ 1 })
    local ran_on
    x:register_hook(function(g) ran_on = coroutine.running(); return g * 4 end)
    local co = coroutine.create(function() back(x * 1) end)
    assert(coroutine.resume(co))
    assert.are.equal(co, ran_on)
    H.assert_close(x.grad:totable(), { 4 }, 0, 0)
  end)

  it("keeps running on a computed tensor freed from Lua while its graph lives", function()
    local x = leaf({ 1, 2 })
    local y = x * 2
    local calls = 0
    y:register_hook(function(g) calls = calls + 1 end)
    local l = (y * 1):sum()
    y:free()
    l:backward()
    assert.are.equal(1, calls)
  end)

  it("refuses what is not a function, a tensor without grad, and a wrong answer, naming the hook", function()
    local x = leaf({ 1, 2 })
    H.raises(function() x:register_hook(5) end, { "Tensor:register_hook", "fn must be a function", "number" })
    H.raises(function() mp.tensor({ 1 }):register_hook(function() end) end,
      { "Tensor:register_hook", "cannot register a hook on a tensor that does not require grad" })
    local line = debug.getinfo(1, "l").currentline + 1
    local h = x:register_hook(function(g) error("boom") end)
    H.raises(function() (x * 2):sum():backward() end,
      { "Tensor:backward", "gradient hook", "tensor_hooks_spec.lua:" .. line, "boom" })
    h:remove()
    h = x:register_hook(function(g) return mp.tensor({ 1, 2, 3 }) end)
    H.raises(function() (x * 2):sum():backward() end, { "Tensor:backward", "gradient hook", "{3}", "{2}" })
    h:remove()
    h = x:register_hook(function(g) error({}) end)   -- an error that is no string
    H.raises(function() (x * 2):sum():backward() end, { "gradient hook", "an error object: table" })
    h:remove()
    h = x:register_hook(function(g) return "x" end)
    H.raises(function() (x * 2):sum():backward() end, { "gradient hook", "returned string" })
    h:remove()
    h = x:register_hook(function(g) (x * 3):sum():backward() end)
    H.raises(function() (x * 2):sum():backward() end, { "gradient hook", "cannot start inside a gradient hook" })
    h:remove()
    h = x:register_hook(function(g) mp.autograd.grad((x * 3):sum(), x) end)
    H.raises(function() mp.autograd.grad((x * 2 * x):sum(), x) end, { "mp.autograd.grad", "inside a gradient hook" })
    h:remove()
    x.grad = nil
    back(x * 2)   -- the failures left nothing behind
    H.assert_close(x.grad:totable(), { 2, 2 }, 0, 0)
  end)

  it("lets the hooks' functions, the tensors they hold and the graph go", function()
    local before = in_use()
    do
      local x = mp.randn({ 256, 256 }, { requires_grad = true })
      local big = mp.randn({ 512, 512 })   -- held by the hook's closure only
      local y = x * 2
      y:register_hook(function(g) return g + big:sum() end)
      local h = x:register_hook(function(g) return g * 2 end)
      local l = (y * y):sum()
      l:backward()
      h:remove()
      -- a failing hook leaves a graph that is still freed
      local y2 = x * 3
      y2:register_hook(function() error("stop") end)
      H.raises(function() (y2 * y2):sum():backward() end, { "stop" })
      x:free(); big:free(); y:free(); l:free(); y2:free()
    end
    assert.are.equal(before, in_use())
  end)

  it("a leaf's hook and its closure go with the leaf, the handle kept or not", function()
    local before = in_use()
    local handle
    do
      local x = mp.randn({ 128, 128 }, { requires_grad = true })
      local big = mp.randn({ 256, 256 })
      handle = x:register_hook(function(g) return g + big:sum() end)
      big = nil
      x = nil
    end
    assert.are.equal(before, in_use())
    handle:remove()
  end)
end)
