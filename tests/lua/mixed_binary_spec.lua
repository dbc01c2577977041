-- mixed_binary_spec.lua: f32 with an f16/bf16 tensor of the same shape (add,
-- sub, mul) widens the low operand inside the kernel (backend binary_mixed,
-- engine/ops_math.c) instead of casting it into an f32 tensor first; the
-- result must be bit for bit the cast's (the widening is exact), in either
-- order, with the gradients' dtypes and values as before.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/mixed_binary_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

describe("f32 op f16/bf16 of one shape", function()
  for _, dt in ipairs { "bf16", "f16" } do
    it(dt .. ": add, sub, mul give the bits of the cast, either order", function()
      mp.manual_seed(5)
      local a = mp.randn({ 37, 53 }) * 3          -- f32; lengths with a tail past 16
      local b = (mp.randn({ 37, 53 }) * 2):to(dt)
      local bw = b:f32()                          -- the cast the old way made
      for _, op in ipairs { "add", "sub", "mul" } do
        local f = ({ add = function(x, y) return x + y end, sub = function(x, y) return x - y end,
                     mul = function(x, y) return x * y end })[op]
        local r1, r2 = f(a, b), f(b, a)
        assert.are.equal("f32", r1.dtype)
        assert.are.equal("f32", r2.dtype)
        H.assert_same(r1:totable(), f(a, bw):totable(), dt .. " f32 " .. op .. " low")
        H.assert_same(r2:totable(), f(bw, a):totable(), dt .. " low " .. op .. " f32")
      end
    end)
    it(dt .. ": gradients keep each input's dtype and the old values", function()
      mp.manual_seed(6)
      local a0, b0 = mp.randn({ 9, 21 }), mp.randn({ 9, 21 }):to(dt)
      local a, b = a0:clone():requires_grad(true), b0:clone():requires_grad(true)
      local l = ((a * b) - b + a):sum()
      l:backward()
      -- each use cast on its own, as the old way did (each gradient rounded into dt, then summed)
      local ar, br = a0:clone():requires_grad(true), b0:clone():requires_grad(true)
      local lr = ((ar * br:f32()) - br:f32() + ar):sum()
      lr:backward()
      assert.are.equal(dt, b.grad.dtype)
      H.assert_same(a.grad:totable(), ar.grad:totable(), "a's gradient")
      assert.are.equal(dt, br.grad.dtype)
      H.assert_same(b.grad:f32():totable(), br.grad:f32():totable(), "b's gradient")
    end)
  end
end)
