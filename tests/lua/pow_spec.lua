-- pow_spec.lua: `^` on tensors, Tensor:pow and mp.pow in their three forms
-- (tensor ^ number, number ^ tensor, tensor ^ tensor): values against Lua's
-- maths, f16/bf16 rounded once, integer powers, broadcasting, gradients against
-- central differences (in f64 where the device has it, with mp.autograd.gradcheck)
-- and at the edge cases as PyTorch gives them, memory, errors.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/pow_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local function vals(t) return H.flat(t:f32():totable()) end
local function T(list, dtype) return mp.tensor(list, dtype and { dtype = dtype } or nil) end
local function leaf(list) return mp.tensor(list):requires_grad(true) end

local uniform, gradcheck32, gradcheck = H.uniform, H.gradcheck32, H.gradcheck

describe("pow on tensors", function()
  before_each(function()
    math.randomseed(2026)
    mp.set_grad_enabled(true)
  end)

  describe("values", function()
    -- powf against Lua's pow in double: within 1 ulp on the CPU (glibc), 2 on a GPU
    it("tensor ^ tensor, tensor ^ number and number ^ tensor match Lua's ^ (f32)", function()
      local av, bv = uniform(40, 0.05, 3), uniform(40, -3, 3)
      local a, b = T(av), T(bv)
      local want_ab, want_a2, want_2b, want_ar = {}, {}, {}, {}
      for i = 1, 40 do
        want_ab[i] = H.f32(av[i] ^ bv[i])
        want_a2[i] = H.f32(av[i] ^ 2.5)
        want_2b[i] = H.f32(1.5 ^ bv[i])
        want_ar[i] = H.f32(av[i] ^ -1.25)
      end
      H.assert_close(vals(a ^ b), want_ab, 3e-7, 0, "a ^ b")
      H.assert_close(vals(a ^ 2.5), want_a2, 3e-7, 0, "a ^ 2.5")
      H.assert_close(vals(1.5 ^ b), want_2b, 3e-7, 0, "1.5 ^ b")
      H.assert_close(vals(a ^ -1.25), want_ar, 3e-7, 0, "a ^ -1.25")
      H.assert_close(vals(mp.pow(a, b)), want_ab, 3e-7, 0, "mp.pow(a, b)")
      H.assert_close(vals(a:pow(b)), want_ab, 3e-7, 0, "a:pow(b)")
      H.assert_close(vals(mp.pow(1.5, b)), want_2b, 3e-7, 0, "mp.pow(1.5, b)")
      H.assert_close(vals(mp.pow(a, 2.5)), want_a2, 3e-7, 0, "mp.pow(a, 2.5)")
      assert.are.equal("f32", (a ^ b).dtype)
    end)

    it("f16 and bf16 are computed in f32 and rounded once, in all three forms", function()
      for _, dt in ipairs { "f16", "bf16" } do
        local a, b = T(uniform(64, 0.05, 3)):to(dt), T(uniform(64, -3, 3)):to(dt)
        local af, bf = a:f32(), b:f32()
        assert.are.equal(dt, (a ^ b).dtype)
        H.assert_same(vals(a ^ b), vals((af ^ bf):to(dt)), dt .. " a ^ b")
        H.assert_same(vals(a ^ 1.7), vals((af ^ 1.7):to(dt)), dt .. " a ^ 1.7")
        -- the number becomes a 0-d tensor of the tensor's dtype, as PyTorch's wrapped
        -- scalar: 2.5 is exact in both, so the f32 computation is the reference
        assert.are.equal(dt, (2.5 ^ b).dtype)
        H.assert_same(vals(2.5 ^ b), vals((2.5 ^ bf):to(dt)), dt .. " 2.5 ^ b")
      end
      -- and so 1e6 ^ x overflows in f16 before the power is taken (PyTorch 1.13:
      -- torch.pow(1e6, torch.tensor([0.5], dtype=torch.half)) is inf)
      assert.are.equal(math.huge, vals(1e6 ^ T({ 0.5 }, "f16"))[1])
      -- mixed dtypes promote as multiplication does
      assert.are.equal("f32", (T({ 2 }, "f16") ^ T({ 3 }, "bf16")).dtype)
      assert.are.equal("f32", (T({ 2 }, "f16") ^ T({ 3 })).dtype)
    end)

    it("0^0 is 1; a negative base to an integer is signed; to a fraction NaN", function()
      assert.are.same({ 1 }, vals(T { 0 } ^ T { 0 }))
      assert.are.same({ 1 }, vals(T { 0 } ^ 0))
      assert.are.same({ 1 }, vals(0 ^ T { 0 }))
      assert.are.same({ -8, 4, -0.125 }, vals(T { -2, -2, -2 } ^ T { 3, 2, -3 }))
      assert.are.same({ -8, -0.125 }, vals(T { -2, -0.5 } ^ 3))
      assert.are.same({ 4, 0.25 }, vals(T { -2, -0.5 } ^ 2))
      assert.are.same({ -8, 4 }, vals((-2) ^ T { 3, 2 }))
      for _, v in ipairs(vals(T { -2, -8 } ^ T { 0.5, 1 / 3 })) do assert.is_true(H.isnan(v)) end
      for _, v in ipairs(vals(T { -2, -8 } ^ 0.5)) do assert.is_true(H.isnan(v)) end
      for _, v in ipairs(vals((-2) ^ T { 0.5, -1.5 })) do assert.is_true(H.isnan(v)) end
      assert.are.same({ math.huge, 0 }, vals(T { 0, 0 } ^ T { -1, 2 }))
    end)

    it("broadcasts as the other binary ops: {3,1} ^ {1,4} and {4} ^ {2,1,4}", function()
      local av, bv = { 0.5, 1, 2 }, { -1, 0, 1, 2.5 }
      local y = T { { 0.5 }, { 1 }, { 2 } } ^ T { bv }
      assert.are.same({ 3, 4 }, y.shape)
      local want = {}
      for i = 1, 3 do for j = 1, 4 do want[#want + 1] = H.f32(av[i] ^ bv[j]) end end
      H.assert_close(vals(y), want, 3e-7, 0, "{3,1} ^ {1,4}")
      assert.are.same({ 2, 1, 4 }, (T(bv) ^ T { { { 1, 2, 3, 4 } }, { { 0, 1, 0, 1 } } }).shape)
      H.raises(function() return T { 1, 2, 3 } ^ T { 1, 2 } end, { "Tensor:__pow", "broadcast" })
    end)

    -- PyTorch 1.13: torch.pow(i32, i32) = [8, -8, 0, 1, -1, 1] for these, i32;
    -- uint8 3^6 = 217 (729 wrapped); int ** 2 and 2 ** int stay int, 2.5 ** int is f32
    it("integer ^ integer stays an integer, as PyTorch's", function()
      local i, e = T({ 2, -2, 3, 1, -1, 0 }, "i32"), T({ 3, 3, -1, -5, -5, 0 }, "i32")
      local r = i ^ e
      assert.are.equal("i32", r.dtype)
      assert.are.same({ 8, -8, 0, 1, -1, 1 }, r:totable())
      local u = T({ 3 }, "u8") ^ T({ 6 }, "u8")
      assert.are.equal("u8", u.dtype)
      assert.are.same({ 217 }, u:totable())
      assert.are.same({ 1, 2147483648 - 4294967296, 9 }, (T({ 0, 2, -3 }, "i32") ^ T({ 0, 31, 2 }, "i32")):totable())
      local sq = T({ -3, 4 }, "i32") ^ 2
      assert.are.equal("i32", sq.dtype)
      assert.are.same({ 9, 16 }, sq:totable())
      local p2 = 2 ^ T({ 0, 10 }, "i32")
      assert.are.equal("i32", p2.dtype)
      assert.are.same({ 1, 1024 }, p2:totable())
      assert.are.equal("u8", (2 ^ T({ 3 }, "u8")).dtype)
      assert.are.equal("f32", (2.5 ^ T({ 2 }, "i32")).dtype)
      assert.are.equal("f32", (T({ 4 }, "i32") ^ 0.5).dtype)
      assert.are.same({ 2 }, vals(T({ 4 }, "i32") ^ 0.5))
      assert.are.equal("f32", (T({ 2 }, "i32") ^ T({ 0.5 })).dtype)
    end)
  end)

  describe("gradients", function()
    it("tensor ^ tensor against finite differences, broadcast inputs reduced to their shapes", function()
      gradcheck(function(a, b) return a ^ b end,
                { { v = uniform(6, 0.5, 2), shape = { 2, 3 } }, { v = uniform(6, -1.5, 2.5), shape = { 2, 3 } } }, "a ^ b")
      gradcheck(function(a, b) return a ^ b end,
                { { v = uniform(3, 0.5, 2), shape = { 3, 1 } }, { v = uniform(4, -1.5, 2.5), shape = { 1, 4 } } },
                "{3,1} ^ {1,4}")
      gradcheck(function(a, b) return mp.pow(a, b) end,
                { { v = uniform(4, 0.5, 2), shape = { 4 } }, { v = uniform(8, -1.5, 2.5), shape = { 2, 4 } } }, "mp.pow")
    end)

    it("tensor ^ number and number ^ tensor against finite differences", function()
      for _, p in ipairs { 2, 3, 0.5, -1, -0.5, 2.5 } do
        gradcheck(function(a) return a ^ p end, { { v = uniform(6, 0.5, 2), shape = { 2, 3 } } }, "a ^ " .. p)
      end
      for _, s in ipairs { 2, 0.5, 3.7 } do
        gradcheck(function(b) return s ^ b end, { { v = uniform(6, -2, 2), shape = { 2, 3 } } }, s .. " ^ b")
      end
      gradcheck(function(a) return a:pow(3) end, { { v = uniform(4, -2, 2), shape = { 4 } } }, "a:pow(3), negative a")
    end)

    -- PyTorch 1.13, in f64, y = x ** p then y.sum().backward(), x = [0, -2, 1.5]:
    --   p = 0: grad [0, 0, 0]      p = 1: [1, 1, 1]         p = 2: [0, -4, 3]
    --   p = 0.5: [inf, nan, 0.408248] p = -1: [-inf, -0.25, -0.444444] p = 3: [0, 12, 6.75]
    it("tensor ^ number at the edge cases, as PyTorch", function()
      local cases = {
        { 0, { 0, 0, 0 } }, { 1, { 1, 1, 1 } }, { 2, { 0, -4, 3 } }, { 0.5, { math.huge, 0 / 0, 0.40824829 } },
        { -1, { -math.huge, -0.25, -0.44444445 } }, { 3, { 0, 12, 6.75 } },
      }
      for _, c in ipairs(cases) do
        local x = leaf { 0, -2, 1.5 }
        ;(x ^ c[1]):sum():backward()
        H.assert_close(vals(x.grad), c[2], 1e-6, 0, "d/dx x^" .. c[1])
      end
    end)

    -- PyTorch 1.13, f64, torch.pow(a, b).sum().backward() with
    --   a = [0, 0, 0, 0, 2, -2, -2, 3], b = [0, 1, 2, -1, 0.5, 2, 0.5, 0]:
    --   a.grad = [0, 1, 0, -inf, 0.353553, -4, nan, 0]   (0 where b == 0)
    --   b.grad = [0, 0, 0, -inf, 0.980258, nan, nan, 1.098612]   (0 where a == 0 and b >= 0)
    -- and (s ** x) with s = 0, x = [0, 1, -1, 0.5, -0.5]: x.grad = [0, 0, -inf, 0, -inf];
    -- s = 1: all 0; s = -2: all nan
    it("tensor ^ tensor and number ^ tensor at the edge cases, as PyTorch", function()
      local a, b = leaf { 0, 0, 0, 0, 2, -2, -2, 3 }, leaf { 0, 1, 2, -1, 0.5, 2, 0.5, 0 }
      local y = a ^ b
      H.assert_close(vals(y), { 1, 0, 0, math.huge, 1.4142135, 4, 0 / 0, 1 }, 1e-6, 0, "a ^ b")
      y:sum():backward()
      local nan = 0 / 0
      H.assert_close(vals(a.grad), { 0, 1, 0, -math.huge, 0.35355339, -4, nan, 0 }, 1e-6, 0, "a.grad")
      H.assert_close(vals(b.grad), { 0, 0, 0, -math.huge, 0.98025814, nan, nan, 1.0986123 }, 1e-6, 0, "b.grad")
      for _, c in ipairs { { 0, { 0, 0, -math.huge, 0, -math.huge } }, { 1, { 0, 0, 0, 0, 0 } },
                           { -2, { nan, nan, nan, nan, nan } } } do
        local x = leaf { 0, 1, -1, 0.5, -0.5 }
        ;(c[1] ^ x):sum():backward()
        H.assert_close(vals(x.grad), c[2], 1e-6, 0, c[1] .. " ^ x")
      end
    end)

    it("(a - b) ^ 2 in a loss: backward gives 2 (a - b) / n and its negative", function()
      local av, bv = uniform(6, -2, 2), uniform(6, -2, 2)
      av[1], bv[1] = -1, 1   -- one negative difference at least (see e.grad below)
      local a, b = mp.tensor(H.nest(av, { 2, 3 })):requires_grad(true), mp.tensor(H.nest(bv, { 2, 3 })):requires_grad(true)
      local loss = ((a - b) ^ 2):mean()
      local want, wa, wb = 0, {}, {}
      for i = 1, 6 do
        local d = H.f32(av[i] - bv[i])
        want = want + d * d / 6
        wa[i], wb[i] = 2 * d / 6, -2 * d / 6
      end
      H.assert_close(loss:item(), want, 1e-6, 0, "loss")
      loss:backward()
      H.assert_close(vals(a.grad), wa, 1e-6, 1e-7, "a.grad")
      H.assert_close(vals(b.grad), wb, 1e-6, 1e-7, "b.grad")
      -- the same with the exponent a tensor, which then gets its gradient too
      local e = mp.tensor(2):requires_grad(true)
      a.grad, b.grad = nil, nil
      local loss2 = ((a - b) ^ e):mean()
      loss2:backward()
      H.assert_close(vals(a.grad), wa, 1e-6, 1e-7, "a.grad, tensor exponent")
      -- d/de d^e = d^e log(d): NaN for a negative d, as PyTorch's; summed to e's 0-d shape
      assert.are.same({}, e.grad.shape)
      assert.is_true(H.isnan(e.grad:item()))
      e.grad = nil
      local dv = {}
      for i = 1, 6 do dv[i] = H.f32(math.abs(H.f32(av[i] - bv[i])) + 0.5) end
      (((a - b):abs() + 0.5) ^ e):mean():backward()
      local ge = 0
      for i = 1, 6 do ge = ge + dv[i] ^ 2 * math.log(dv[i]) / 6 end
      H.assert_close(e.grad:item(), ge, 1e-5, 1e-7, "e.grad")
    end)

    it("under autocast pow runs in f32, as PyTorch's autocast, and the gradient comes back in f16", function()
      local _ <close> = mp.amp.autocast("f16")
      local h = mp.tensor { 0.5, 1.5, 2 }:f16():requires_grad(true)
      local y = h ^ mp.tensor({ 2, 2, 2 }):f16()
      assert.are.equal("f32", y.dtype)
      assert.are.equal("f32", (1.5 ^ h).dtype)
      y:sum():backward()
      assert.are.equal("f16", h.grad.dtype)
      assert.are.same({ 1, 3, 4 }, vals(h.grad))
    end)

    it("keeps nothing after the backward: memory in use returns to the inputs and their gradients", function()
      local a, b = leaf(uniform(1000, 0.5, 2)), leaf(uniform(1000, -1, 1))
      collectgarbage()
      local base = mp.memory().in_use
      do
        local y <close> = a ^ b
        local z <close> = 2 ^ a
        local w <close> = a ^ 3
        local s <close> = y:sum() + z:sum() + w:sum()
        s:backward()
      end
      local grads = a.grad:numel() * 4 + b.grad:numel() * 4
      -- before any collection: the nodes, still reachable from the sums Lua holds,
      -- have released what they saved (y's storage is 4000 bytes)
      assert.is_true(mp.memory().in_use - base - grads < 1000, "in use: " .. mp.memory().in_use - base - grads)
      collectgarbage()
      assert.are.equal(base + grads, mp.memory().in_use)
    end)
  end)

  describe("errors", function()
    it("name the function and the argument", function()
      local t = T { 1, 2 }
      H.raises(function() return t ^ "2" end, { "Tensor:__pow", "exponent", "string" })
      H.raises(function() return "2" ^ t end, { "Tensor:__pow", "base", "string" })
      H.raises(function() return t ^ {} end, { "Tensor:__pow", "exponent", "table" })
      H.raises(function() return t:pow() end, { "Tensor:pow", "exponent", "number" })
      H.raises(function() return t:pow("2") end, { "Tensor:pow", "exponent", "string" })
      H.raises(function() return mp.pow(nil, t) end, { "mp.pow", "base", "nil" })
      H.raises(function() return mp.pow(2, 3) end, { "mp.pow", "tensor", "two numbers" })
      H.raises(function() return T({ 2 }, "i32") ^ -1 end, { "Tensor:__pow", "negative integer power" })
      H.raises(function() return mp.pow(T({ 2 }, "i32"), -2) end, { "mp.pow", "negative integer power" })
    end)

    it("refuse tensors on different devices, naming both", function()
      if not mp.cuda.is_available() then return end   -- the MP_DEVICE=cuda passes (fake and emulated device) run it
      local c, g = mp.ones({ 2 }, { device = "cpu" }), mp.ones({ 2 }, { device = "cuda" })
      H.raises(function() return c ^ g end, { "Tensor:__pow", "base is on cpu", "exponent on cuda" })
      H.raises(function() return mp.pow(g, c) end, { "mp.pow", "base is on cuda", "exponent on cpu" })
    end)
  end)
end)
