-- gradcheck_spec.lua: mp.autograd.gradcheck and gradgradcheck pass on right
-- gradients and catch wrong ones, naming the output, input and entry.
-- (f32 here, with steps and tolerances loose enough for f32 rounding: the
-- checks of second derivatives in f64 are in gradgradcheck_f64_spec.lua)
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local F32 = { eps = 1e-2, atol = 1e-2, rtol = 1e-2 }

describe("mp.autograd.gradcheck", function()
  it("passes for right gradients, several inputs and outputs, inputs that do not require grad", function()
    mp.manual_seed(1)
    local x, w = mp.randn({ 2, 3 }, { requires_grad = true }), mp.randn({ 3, 2 }, { requires_grad = true })
    local c = mp.randn({ 2, 2 })
    assert.is_true(mp.autograd.gradcheck(function(a, b, k) return a:matmul(b) * k end, { x, w, c }, F32))
    assert.is_true(mp.autograd.gradcheck(function(a, b) return { (a * a):sum(), a:matmul(b) } end, { x, w }, F32))
    assert.is_true(mp.autograd.gradcheck(function(a) return a * 3 end, x, F32))   -- one tensor as inputs
  end)

  it("catches a wrong gradient: relu at its kink, where the two sides disagree", function()
    local x = mp.tensor({ 0, 1 }, { requires_grad = true })
    assert.is_false(mp.autograd.gradcheck(function(a) return mp.relu(a) end, { x },
      { eps = 1e-2, atol = 1e-3, rtol = 1e-3, raise_exception = false }))
    H.raises(function() mp.autograd.gradcheck(function(a) return mp.relu(a) end, { x }, F32) end,
      { "mp.autograd.gradcheck", "Jacobian mismatch", "output 1", "input 1", "element 1" })
  end)

  it("refuses bad arguments, naming them", function()
    local x = mp.randn({ 2 }, { requires_grad = true })
    H.raises(function() mp.autograd.gradcheck(3, { x }) end, { "mp.autograd.gradcheck", "fn" })
    H.raises(function() mp.autograd.gradcheck(function(a) return a end, 3) end, { "mp.autograd.gradcheck", "inputs" })
    H.raises(function() mp.autograd.gradcheck(function(a) return a end, { mp.randn({ 2 }) }) end,
      { "mp.autograd.gradcheck", "no input requires grad" })
    H.raises(function() mp.autograd.gradcheck(function(a) return a end, { x }, { epsilon = 1 }) end,
      { "mp.autograd.gradcheck", "epsilon" })
    H.raises(function() mp.autograd.gradcheck(function(a) return a end, { x }, { eps = 0 }) end,
      { "mp.autograd.gradcheck", "eps" })
    H.raises(function() mp.autograd.gradcheck(function(a) return "no" end, { x }) end,
      { "mp.autograd.gradcheck", "result 1" })
  end)
end)

describe("mp.autograd.gradgradcheck", function()
  it("passes for second derivatives built from differentiable ops", function()
    mp.manual_seed(2)
    local x, w = mp.randn({ 3 }, { requires_grad = true }), mp.randn({ 3 }, { requires_grad = true })
    assert.is_true(mp.autograd.gradgradcheck(function(a, b) return a * b * a end, { x, w }, F32))
    assert.is_true(mp.autograd.gradgradcheck(function(a, b) return (a * a / b):sum() end, { x, w + 3 }, F32))
  end)

  it("surfaces an op without a second derivative, naming it", function()
    local x = mp.randn({ 3 }, { requires_grad = true })
    H.raises(function()
      mp.autograd.gradgradcheck(function(a) return mp.conv2d(a:reshape({ 1, 1, 1, 3 }), mp.ones({ 1, 1, 1, 2 })) end,
        { x }, F32)
    end, { "conv2d has no second derivative" })
  end)

  it("takes grad_outputs, checks their count", function()
    local x = mp.randn({ 3 }, { requires_grad = true })
    local go = mp.randn({ 3 }, { requires_grad = true })
    assert.is_true(mp.autograd.gradgradcheck(function(a) return a * a * a end, { x }, { grad_outputs = go, eps = 1e-2,
      atol = 2e-2, rtol = 2e-2 }))
    H.raises(function() mp.autograd.gradgradcheck(function(a) return a * a end, { x }, { grad_outputs = { go, go } }) end,
      { "mp.autograd.gradgradcheck", "grad_outputs has 2 tensors for 1 outputs" })
  end)
end)
