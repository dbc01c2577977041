-- autograd_graph_spec.lua: graphs walked twice (retain_graph), gradients
-- accumulating over backward passes, mp.autograd.grad (several outputs and
-- inputs, grad_outputs, allow_unused, leaves' .grad untouched) and
-- create_graph's gradients of gradients, including the error of an op whose
-- backward is not differentiable, raised only when a second derivative is
-- asked of it.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local function leaf(values) return mp.tensor(values, { requires_grad = true }) end
local function in_use() collectgarbage(); collectgarbage(); return mp.memory().in_use end

describe("retain_graph", function()
  it("a graph walked twice gives twice the gradient; without it the second walk raises", function()
    local w = leaf({ 1, 2 })
    local l = (w * w * w):sum()
    l:backward(nil, { retain_graph = true })
    H.assert_close(w.grad:totable(), { 3, 12 }, 0, 0, "first")
    l:backward(nil, { retain_graph = true })
    H.assert_close(w.grad:totable(), { 6, 24 }, 0, 0, "two passes accumulate")
    l:backward()   -- the last walk may free the graph
    H.assert_close(w.grad:totable(), { 9, 36 }, 0, 0, "three passes")
    H.raises(function() l:backward() end, { "Tensor:backward", "second time", "retain_graph" })
  end)

  it("takes the gradient and the options together, and checks both", function()
    local w = leaf({ 1, 2 })
    local y = w * 3
    y:backward(mp.tensor({ 1, 10 }), { retain_graph = true })
    y:backward(mp.tensor({ 1, 1 }))
    H.assert_close(w.grad:totable(), { 6, 33 }, 0, 0)
    H.raises(function() (w * 2):backward(nil, { retain = true }) end, { "Tensor:backward", "retain" })
    H.raises(function() (w * 2):sum():backward(nil, { retain_graph = 1 }) end, { "Tensor:backward", "retain_graph" })
    H.raises(function() (w * 2):sum():backward("x") end, { "Tensor:backward", "grad" })
    H.raises(function() (w * 2):sum():backward(nil, { create_graph = true }) end,
      { "Tensor:backward", "create_graph", "mp.autograd.grad" })
  end)
end)

describe("mp.autograd.grad", function()
  it("returns the gradients and leaves every .grad as it was", function()
    local x, w = leaf({ 1, 2, 3 }), leaf({ 2, 2, 2 })
    w.grad = mp.tensor({ 7, 7, 7 })
    local l = (x * w):sum()
    local gx, gw = table.unpack(mp.autograd.grad(l, { x, w }))
    H.assert_close(gx:totable(), { 2, 2, 2 }, 0, 0, "d/dx")
    H.assert_close(gw:totable(), { 1, 2, 3 }, 0, 0, "d/dw")
    assert.is_nil(x.grad)
    H.assert_close(w.grad:totable(), { 7, 7, 7 }, 0, 0, "w.grad untouched")
    local one = mp.autograd.grad((x * x):sum(), x)   -- one input: one tensor back
    assert.are.equal("userdata", type(one))
    H.assert_close(one:totable(), { 2, 4, 6 }, 0, 0)
  end)

  it("sums over several outputs with their grad_outputs, and reaches non-leaf inputs", function()
    local x = leaf({ 1, 2 })
    local h = x * x          -- a non-leaf input
    local a, b = h * 3, (h * x):sum()
    local gh, gx = table.unpack(mp.autograd.grad({ a, b }, { h, x }, { grad_outputs = { mp.tensor({ 1, 2 }), nil } }))
    -- d/dh: 3 * go + x = {3 + 1, 6 + 2}; d/dx = dh/dx * gh + h = 2x * gh + x^2
    H.assert_close(gh:totable(), { 4, 8 }, 0, 0, "d/dh")
    H.assert_close(gx:totable(), { 2 * 4 + 1, 4 * 8 + 4 }, 0, 0, "d/dx")
  end)

  it("takes many outputs with a list of grad_outputs", function()
    local x = leaf({ 1, 2 })
    local outs, gos = {}, {}
    for k = 1, 300 do outs[k], gos[k] = x * k, mp.tensor({ 1, 1 }) end
    local g = mp.autograd.grad(outs, x, { grad_outputs = gos })
    H.assert_close(g:totable(), { 300 * 301 / 2, 300 * 301 / 2 }, 0, 0)
  end)

  it("allow_unused gives nil for an input the outputs do not use; otherwise it is an error", function()
    local x, u = leaf({ 1, 2 }), leaf({ 5 })
    H.raises(function() mp.autograd.grad((x * x):sum(), { x, u }) end,
      { "mp.autograd.grad", "input 2", "allow_unused" })
    local r = mp.autograd.grad((x * x):sum(), { x, u }, { allow_unused = true })
    H.assert_close(r[1]:totable(), { 2, 4 }, 0, 0)
    assert.is_nil(r[2])
  end)

  it("refuses what it cannot differentiate, naming the argument", function()
    local x = leaf({ 1, 2 })
    local c = mp.tensor({ 1, 2 })
    H.raises(function() mp.autograd.grad(c:sum(), x) end, { "mp.autograd.grad", "output 1", "require grad" })
    H.raises(function() mp.autograd.grad((x * 2):sum(), c) end, { "mp.autograd.grad", "input 1", "require grad" })
    H.raises(function() mp.autograd.grad(x * 2, x) end, { "mp.autograd.grad", "output 1", "grad_outputs" })
    H.raises(function() mp.autograd.grad((x * 2):sum(), { x, 3 }) end, { "mp.autograd.grad", "inputs[2]" })
    H.raises(function() mp.autograd.grad((x * 2):sum(), x, { grad_outputs = "a" }) end,
      { "mp.autograd.grad", "grad_outputs" })
    H.raises(function() mp.autograd.grad((x * 2):sum(), x, { create = true }) end, { "mp.autograd.grad", "create" })
    H.raises(function() mp.autograd.grad(x * 2, x, { grad_outputs = mp.ones({ 3 }) }) end,
      { "mp.autograd.grad", "shape" })
  end)

  it("without retain_graph frees the graph's saved tensors; with it the graph can be asked again", function()
    local x = leaf({ 1, 2 })
    local l = (x * x * x):sum()
    local g1 = mp.autograd.grad(l, x, { retain_graph = true })
    local g2 = mp.autograd.grad(l, x)
    H.assert_close(g1:totable(), g2:totable(), 0, 0)
    H.raises(function() mp.autograd.grad(l, x) end, { "second time" })
  end)
end)

describe("create_graph", function()
  it("gives gradients that are differentiable again: d2/dx2 of x^3 is 6x", function()
    local x = leaf({ 1, 2, 3 })
    local g = mp.autograd.grad((x * x * x):sum(), x, { create_graph = true })
    assert.is_true(g:requires_grad())
    H.assert_close(g:totable(), { 3, 12, 27 }, 0, 0, "first")
    local gg = mp.autograd.grad(g, x, { grad_outputs = mp.ones({ 3 }) })
    H.assert_close(gg:totable(), { 6, 12, 18 }, 0, 0, "second")
    -- the graph was kept (create_graph implies retain_graph): the first can be asked again
    local x2 = leaf({ 2 })
    local y = x2 * x2 * x2
    local d1 = mp.autograd.grad(y, x2, { create_graph = true, grad_outputs = mp.ones({ 1 }) })
    local d1b = mp.autograd.grad(y, x2, { grad_outputs = mp.ones({ 1 }) })
    H.assert_close(d1:totable(), d1b:totable(), 0, 0)
  end)

  it("gradients of a gradient with respect to differentiable grad_outputs", function()
    local x, v = leaf({ 1, 2 }), leaf({ 3, 4 })
    local g = mp.autograd.grad(x * x, x, { grad_outputs = v, create_graph = true })   -- 2 x v
    local gv = mp.autograd.grad(g, v, { grad_outputs = mp.ones({ 2 }) })
    H.assert_close(gv:totable(), { 2, 4 }, 0, 0)
  end)

  it("an op without a second derivative raises, naming it, only when one is asked of it", function()
    local x = leaf({ 1, 3, 2 })
    local m = mp.conv2d(x:reshape({ 1, 1, 1, 3 }), mp.ones({ 1, 1, 1, 2 }))   -- conv2d's backward runs kernels
    local g = mp.autograd.grad(m, x, { grad_outputs = mp.ones({ 1, 1, 1, 2 }), create_graph = true })
    H.assert_close(g:totable(), { 1, 2, 1 }, 0, 0, "the first derivative is right")
    assert.is_true(g:requires_grad())
    H.raises(function() mp.autograd.grad(g, x, { grad_outputs = mp.ones({ 3 }) }) end,
      { "mp.autograd.grad", "conv2d has no second derivative" })
    -- nothing asked of it: a later plain backward through the same graph works
    local w = leaf({ 2, 2, 2 })
    local h = mp.autograd.grad((x * w):sum(), x, { create_graph = true })
    ;(h * h):sum():backward()
    H.assert_close(w.grad:totable(), { 4, 4, 4 }, 0, 0)
  end)

  it("the second-order graph is freed with its last tensor", function()
    local x = leaf({ 1, 2, 3 })
    collectgarbage()
    local before = in_use()
    for _ = 1, 20 do
      local g = mp.autograd.grad((x * x * x):sum(), x, { create_graph = true })
      mp.autograd.grad((g * g):sum(), x)
    end
    assert.are.equal(before, in_use())
  end)
end)
