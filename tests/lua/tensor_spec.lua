-- tensor_spec.lua: tensors from Lua: creation, properties, values, casts,
-- arithmetic, maths, reductions, matmul, shapes, random numbers, printing.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/tensor_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local DTYPES = { "f32", "f16", "bf16", "i32", "u8" }
local DEV = mp.default_device()   -- cpu, or cuda on a GPU machine (MP_DEVICE)
local FLOATS = { "f32", "f16", "bf16" }

describe("mp tensors", function()

  ---------------------------------------------------------------- creation
  describe("creation", function()
    it("mp.tensor from a number is a 0-d f32 tensor", function()
      local t = mp.tensor(2.5)
      assert.are.same({}, t.shape)
      assert.are.equal(0, t:dim())
      assert.are.equal(1, t:numel())
      assert.are.equal("f32", t.dtype)
      assert.are.equal(mp.default_device(), t.device)
      assert.are.equal(2.5, t:item())
      assert.are.equal(2.5, t:totable())
    end)

    it("mp.tensor from nested tables keeps shape and row-major order", function()
      local t = mp.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
      assert.are.same({ 2, 3 }, t.shape)
      assert.are.same({ { 1, 2, 3 }, { 4, 5, 6 } }, t:totable())
      local u = mp.tensor { { { 1 }, { 2 } }, { { 3 }, { 4 } }, { { 5 }, { 6 } } }
      assert.are.same({ 3, 2, 1 }, u.shape)
      assert.are.same({ { { 1 }, { 2 } }, { { 3 }, { 4 } }, { { 5 }, { 6 } } }, u:totable())
    end)

    it("mp.tensor accepts 8 levels of nesting", function()
      local t = mp.tensor { { { { { { { { 7 } } } } } } } }
      assert.are.equal(8, t:dim())
      assert.are.same({ 1, 1, 1, 1, 1, 1, 1, 1 }, t.shape)
    end)

    it("mp.tensor defaults to f32 and takes dtype and device options", function()
      assert.are.equal("f32", mp.tensor({ 1, 2 }).dtype)
      for _, dt in ipairs(DTYPES) do
        local t = mp.tensor({ 1, 2 }, { dtype = dt, device = "cpu" })
        assert.are.equal(dt, t.dtype)
        assert.are.equal("cpu", t.device)
        assert.are.same({ 1, 2 }, t:totable())
      end
    end)

    it("accepts the dtype aliases", function()
      local aliases = { float32 = "f32", float16 = "f16", half = "f16", bfloat16 = "bf16",
                        int32 = "i32", uint8 = "u8" }
      for alias, dt in pairs(aliases) do
        assert.are.equal(dt, mp.tensor({ 1 }, { dtype = alias }).dtype, alias)
        assert.are.equal(dt, mp.zeros({ 2 }, { dtype = alias }).dtype, alias)
        assert.are.equal(dt, mp.ones({ 2 }):to(alias).dtype, alias)
      end
    end)

    it("mp.tensor(t) copies a tensor, optionally to another dtype", function()
      local a = mp.tensor { 1.5, 2.5 }
      local b = mp.tensor(a)
      assert.are.same({ 1.5, 2.5 }, b:totable())
      assert.is_false(a == b)
      a:free()
      assert.are.same({ 1.5, 2.5 }, b:totable())
      local c = mp.tensor(b, { dtype = "i32" })
      assert.are.equal("i32", c.dtype)
      assert.are.same({ 1, 2 }, c:totable())
    end)

    it("zeros, ones and full take a shape table or a number", function()
      for _, dt in ipairs(DTYPES) do
        local z = mp.zeros({ 2, 3 }, { dtype = dt })
        assert.are.same({ 2, 3 }, z.shape)
        assert.are.equal(dt, z.dtype)
        assert.are.same({ { 0, 0, 0 }, { 0, 0, 0 } }, z:totable())
        local o = mp.ones(4, { dtype = dt })
        assert.are.same({ 4 }, o.shape)
        assert.are.same({ 1, 1, 1, 1 }, o:totable())
        local f = mp.full({ 3, 1 }, 7, { dtype = dt })
        assert.are.same({ { 7 }, { 7 }, { 7 } }, f:totable())
      end
      assert.are.equal("f32", mp.zeros { 1 }.dtype)
      assert.are.same({ 5 }, mp.zeros(5).shape)
      assert.are.same({ -1.5, -1.5 }, mp.full(2, -1.5):totable())
    end)

    it("mp.zeros{} is a 0-d tensor", function()
      local z = mp.zeros {}
      assert.are.equal(0, z:dim())
      assert.are.equal(0, z:item())
    end)

    it("mp.full rounds into a float dtype; an integer dtype takes only the whole numbers it holds", function()
      assert.are.equal(123456789, mp.full({ 1 }, 123456789, { dtype = "i32" }):item())
      -- refused, not saturated (as torch.full refuses an overflow): arguments_spec.lua
      assert.has_error(function() mp.full({ 1 }, 2 ^ 40, { dtype = "i32" }) end)
      assert.has_error(function() mp.full({ 1 }, 1000, { dtype = "u8" }) end)
      assert.has_error(function() mp.full({ 1 }, -3, { dtype = "u8" }) end)
      assert.are.equal(H.f32(0.1), mp.full({ 1 }, 0.1):item())
      assert.are.equal(0.0999755859375, mp.full({ 1 }, 0.1, { dtype = "f16" }):item())
    end)

    it("mp.arange(n) is 0..n-1 in any dtype", function()
      local a = mp.arange(5)
      assert.are.equal("f32", a.dtype)
      assert.are.same({ 0, 1, 2, 3, 4 }, a:totable())
      for _, dt in ipairs(DTYPES) do
        local t = mp.arange(6, { dtype = dt })
        assert.are.equal(dt, t.dtype)
        assert.are.same({ 0, 1, 2, 3, 4, 5 }, t:totable())
      end
      assert.are.equal(255, mp.arange(256, { dtype = "u8" }):totable()[256])
      assert.are.equal(99999, mp.arange(100000, { dtype = "i32" }):totable()[100000])
    end)

    it("rand and randn take shapes, numbers and float dtypes", function()
      for _, dt in ipairs(FLOATS) do
        local r = mp.rand({ 3, 4 }, { dtype = dt })
        assert.are.same({ 3, 4 }, r.shape)
        assert.are.equal(dt, r.dtype)
        local n = mp.randn(7, { dtype = dt })
        assert.are.same({ 7 }, n.shape)
        assert.are.equal(dt, n.dtype)
      end
      assert.are.equal("f32", mp.rand { 2 }.dtype)
      assert.are.equal("f32", mp.randn { 2 }.dtype)
    end)
  end)

  ---------------------------------------------------------------- properties
  describe("properties", function()
    it("shape, dtype, device, size, dim, numel", function()
      local t = mp.zeros({ 2, 3, 4 }, { dtype = "bf16" })
      assert.are.same({ 2, 3, 4 }, t.shape)
      assert.are.equal("bf16", t.dtype)
      assert.are.equal(mp.default_device(), t.device)
      assert.are.same({ 2, 3, 4 }, t:size())
      assert.are.equal(2, t:size(1))
      assert.are.equal(3, t:size(2))
      assert.are.equal(4, t:size(3))
      assert.are.equal(4, t:size(-1))
      assert.are.equal(3, t:size(-2))
      assert.are.equal(2, t:size(-3))
      assert.are.equal(3, t:dim())
      assert.are.equal(24, t:numel())
      assert.are.equal("integer", math.type(t:size(1)))
      assert.are.equal("integer", math.type(t:numel()))
    end)

    it("shape is a fresh table each time", function()
      local t = mp.zeros { 2, 3 }
      local s = t.shape
      s[1] = 99
      assert.are.same({ 2, 3 }, t.shape)
    end)

    it("unknown keys are an error naming the key, never a silent nil", function()
      local t = mp.zeros { 2 }
      H.raises(function() return t.nonexistent end, { "no method or field 'nonexistent'" })
      H.raises(function() return t[true] end, { "cannot index a tensor with a boolean" })
      H.raises(function() return t[1.5] end, { "index must be an integer" })
    end)

    it("== is identity of the engine tensor", function()
      local a = mp.zeros { 2 }
      local b = mp.zeros { 2 }
      assert.is_true(a == a)
      assert.is_false(a == b)
    end)

    it("== with another kind of userdata is false, not an error", function()
      local a = mp.zeros { 2 }
      local ok, r = pcall(function() return a == io.stdout end)
      assert.is_true(ok, "t == io.stdout raised: " .. tostring(r))
      assert.is_false(r)
      ok, r = pcall(function() return io.stdout == a end)
      assert.is_true(ok, "io.stdout == t raised: " .. tostring(r))
      assert.is_false(r)
    end)

    it("the default device is MP_DEVICE, else cuda where it is available, else cpu", function()
      local avail, why = mp.cuda.is_available()
      local env = os.getenv("MP_DEVICE")
      local want = env and env ~= "" and env or avail and "cuda" or "cpu"
      assert.are.equal(want, mp.default_device())
      if avail then
        assert.is_nil(why)
      else   -- and it says why not
        assert.are.equal("string", type(why))
        assert.is_true(#why > 0)
      end
      local saved = mp.default_device()
      mp.set_default_device("cpu")
      assert.are.equal("cpu", mp.default_device())
      assert.are.equal("cpu", mp.ones { 1 }.device)
      local t = mp.ones { 2 }
      assert.are.equal("cpu", t:cpu().device)
      assert.are.equal("cpu", t:to("cpu").device)
      if avail then
        mp.set_default_device("cuda")
        assert.are.equal("cuda", mp.ones { 1 }.device)
        assert.are.equal("cuda", t:cuda().device)
        assert.same({ 1, 1 }, t:cuda():cpu():totable())
      end
      mp.set_default_device(saved)
    end)
  end)

  ---------------------------------------------------------------- values
  describe("item and totable", function()
    local cases = {
      f32 = { 1.5, -2.25, H.f32(3e-5), H.f32(1 / 3), 16777216 },
      f16 = { 0.5, -1.25, 1024, 6.103515625e-05, 65504 },
      bf16 = { 0.5, -1.25, 256, 2 ^ -100, 0.333984375 },
      i32 = { -2147483648, 2147483647, 0, -7, 123456789 },
      u8 = { 0, 255, 128, 1, 7 },
    }
    for _, dt in ipairs(DTYPES) do
      it("round-trips exactly for " .. dt, function()
        local vals = cases[dt]
        local t = mp.tensor(vals, { dtype = dt })
        local back = t:totable()
        assert.are.equal(#vals, #back)
        local want_type = (dt == "i32" or dt == "u8") and "integer" or "float"
        for i, v in ipairs(vals) do
          assert.are.equal(v, back[i], dt .. " element " .. i)
          assert.are.equal(want_type, math.type(back[i]), dt .. " element " .. i)
          local one = mp.tensor(v, { dtype = dt })
          assert.are.equal(v, one:item(), dt .. " item " .. i)
          assert.are.equal(want_type, math.type(one:item()))
          assert.are.equal(v, t:narrow(1, i, 1):item(), dt .. " narrowed item " .. i)
        end
      end)
    end

    it("item works on any one-element tensor", function()
      assert.are.equal(3, mp.full({ 1, 1, 1 }, 3):item())
      assert.are.equal(4, mp.tensor({ { 4 } }, { dtype = "i32" }):item())
    end)

    it("totable of a 0-d tensor is a number", function()
      assert.are.equal(5, mp.tensor(5, { dtype = "i32" }):totable())
      assert.are.equal("integer", math.type(mp.tensor(5, { dtype = "i32" }):totable()))
    end)
  end)

  ---------------------------------------------------------------- casts
  describe("casts", function()
    it("between every pair of dtypes keeps representable values", function()
      local vals = { 0, 1, 2, 3, 100, 255 }
      for _, from in ipairs(DTYPES) do
        local src = mp.tensor(vals, { dtype = from })
        for _, to in ipairs(DTYPES) do
          local d = src:to(to)
          assert.are.equal(to, d.dtype, from .. "->" .. to)
          assert.are.same(vals, d:totable(), from .. "->" .. to)
        end
        assert.are.same(vals, src:f32():totable())
        assert.are.same(vals, src:f16():totable())
        assert.are.same(vals, src:bf16():totable())
        assert.are.equal("f32", src:f32().dtype)
        assert.are.equal("f16", src:f16().dtype)
        assert.are.equal("bf16", src:bf16().dtype)
      end
    end)

    it("to(dtype, device) and to(device, dtype) both work", function()
      assert.are.equal("f16", mp.ones { 2 }:to("f16", "cpu").dtype)
      assert.are.equal("bf16", mp.ones { 2 }:to("cpu", "bf16").dtype)
    end)

    it("f32 -> f16 rounds to nearest even, keeps subnormals, overflows to inf", function()
      local src = mp.tensor { 65504, 65519, 65520, -65520, 1e-8, 2 ^ -24, 2 ^ -25, 3 * 2 ^ -26,
                              2 ^ -14, 0.1, 1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 2049, 2051 }
      local got = src:f16():totable()
      H.assert_same(got, { 65504, 65504, math.huge, -math.huge, 0, 2 ^ -24, 0, 2 ^ -24,
                           2 ^ -14, 0.0999755859375, 1, 1 + 2 ^ -9, 2048, 2052 }, "f16")
      -- the same through the constructor and through :to
      assert.are.equal(math.huge, mp.tensor(65520, { dtype = "f16" }):item())
      assert.are.equal(65504, mp.tensor(65504, { dtype = "half" }):item())
      assert.are.equal(0, mp.tensor(1e-8, { dtype = "f16" }):item())
      assert.are.equal(2 ^ -24, mp.tensor(2 ^ -24):to("f16"):item())
    end)

    it("f32 -> bf16 rounds to nearest even", function()
      assert.are.equal(0.333984375, mp.tensor(1 / 3, { dtype = "bf16" }):item())
      assert.are.equal(0.333984375, mp.tensor(1 / 3):bf16():item())
      local got = mp.tensor { 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, 256, 257, 3.4e38, 2 ^ -130 }:bf16():totable()
      H.assert_same(got, { 1, 1 + 2 ^ -6, 256, 256, math.huge, 2 ^ -130 }, "bf16")
    end)

    it("NaN and inf survive float casts", function()
      local t = mp.tensor { 0 / 0, math.huge, -math.huge }
      for _, dt in ipairs(FLOATS) do
        local v = t:to(dt):totable()
        assert.is_true(H.isnan(v[1]), dt)
        assert.are.equal(math.huge, v[2])
        assert.are.equal(-math.huge, v[3])
      end
    end)

    it("float -> i32 truncates toward zero and saturates; NaN -> 0", function()
      local t = mp.tensor { 2.7, -2.7, 0.5, -0.5, 1e10, -1e10, 0 / 0 }
      assert.are.same({ 2, -2, 0, 0, 2147483647, -2147483648, 0 }, t:to("i32"):totable())
      -- a cast converts; values given to mp.tensor for an integer dtype must fit (arguments_spec.lua)
      assert.has_error(function() mp.tensor({ 2.7 }, { dtype = "i32" }) end)
      assert.are.same({ 2, -2 }, mp.tensor({ 2.7, -2.7 }, { dtype = "f16" }):to("i32"):totable())
    end)

    it("float -> u8 truncates and saturates at 0 and 255", function()
      local t = mp.tensor { 300, -5, 2.9, 255.9, -0.5, 0 / 0 }
      assert.are.same({ 255, 0, 2, 255, 0, 0 }, t:to("u8"):totable())
      assert.are.same({ 255, 0, 2, 255, 0, 0 }, t:to("bf16"):to("u8"):totable())
      assert.has_error(function() mp.tensor({ 300 }, { dtype = "u8" }) end)
    end)

    it("i32 -> u8 saturates at 0 and 255 like every other path into u8", function()
      local t = mp.tensor({ 300, -5, 255, 256, 7 }, { dtype = "i32" })
      assert.are.same({ 255, 0, 255, 255, 7 }, t:to("u8"):totable())
    end)

    it("i32 -> f32 rounds large integers to f32", function()
      assert.are.equal(H.f32(123456789), mp.tensor(123456789, { dtype = "i32" }):f32():item())
      assert.are.equal(2147483647, mp.tensor(2 ^ 31 - 1, { dtype = "i32" }):item())
    end)
  end)

  ---------------------------------------------------------------- arithmetic
  describe("arithmetic", function()
    local function each2(a, b, f)
      local r = {}
      for i = 1, #a do
        r[i] = {}
        for j = 1, #a[i] do r[i][j] = f(a[i][j], b[i][j]) end
      end
      return r
    end

    it("+ - * / with equal shapes", function()
      local a = mp.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
      local b = mp.tensor { { 2, 4, 8 }, { -1, 0.5, 3 } }
      local A, B = a:totable(), b:totable()
      H.assert_same((a + b):totable(), each2(A, B, function(x, y) return x + y end), "+")
      H.assert_same((a - b):totable(), each2(A, B, function(x, y) return x - y end), "-")
      H.assert_same((a * b):totable(), each2(A, B, function(x, y) return x * y end), "*")
      H.assert_same((a / b):totable(), each2(A, B, function(x, y) return H.f32(x / y) end), "/")
    end)

    it("broadcasts {2,3} + {3}", function()
      local r = mp.tensor { { 1, 2, 3 }, { 4, 5, 6 } } + mp.tensor { 10, 20, 30 }
      assert.are.same({ 2, 3 }, r.shape)
      assert.are.same({ { 11, 22, 33 }, { 14, 25, 36 } }, r:totable())
      local l = mp.tensor { 10, 20, 30 } - mp.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
      assert.are.same({ { 9, 18, 27 }, { 6, 15, 24 } }, l:totable())
    end)

    it("broadcasts {2,1} + {1,3}", function()
      local r = mp.tensor { { 1 }, { 2 } } + mp.tensor { { 10, 20, 30 } }
      assert.are.same({ 2, 3 }, r.shape)
      assert.are.same({ { 11, 21, 31 }, { 12, 22, 32 } }, r:totable())
    end)

    it("broadcasts {4,1,3} * {2,1}", function()
      local a = mp.arange(12):reshape { 4, 1, 3 }
      local b = mp.tensor { { 2 }, { -1 } }
      local r = a * b
      assert.are.same({ 4, 2, 3 }, r.shape)
      local want = {}
      for i = 1, 4 do
        want[i] = {}
        for j = 1, 2 do
          want[i][j] = {}
          for k = 1, 3 do want[i][j][k] = ((i - 1) * 3 + (k - 1)) * (j == 1 and 2 or -1) end
        end
      end
      assert.are.same(want, r:totable())
    end)

    it("broadcasts a 0-d tensor and a {1} tensor", function()
      assert.are.same({ 3, 4 }, (mp.tensor { 1, 2 } + mp.tensor(2)):totable())
      assert.are.same({ { 5, 6 } }, (mp.tensor { { 1, 2 } } + mp.tensor { 4 }):totable())
      assert.are.same({}, (mp.tensor(1) + mp.tensor(2)).shape)
    end)

    it("takes numbers on either side", function()
      local t = mp.tensor { 1, 2, 4 }
      assert.are.same({ 3, 4, 6 }, (t + 2):totable())
      assert.are.same({ 3, 4, 6 }, (2 + t):totable())
      assert.are.same({ -1, 0, 2 }, (t - 2):totable())
      assert.are.same({ 1, 0, -2 }, (2 - t):totable())
      assert.are.same({ 3, 6, 12 }, (t * 3):totable())
      assert.are.same({ 3, 6, 12 }, (3 * t):totable())
      assert.are.same({ 0.5, 1, 2 }, (t / 2):totable())
      assert.are.same({ 4, 2, 1 }, (4 / t):totable())
    end)

    it("unary minus", function()
      assert.are.same({ -1, 2, -0.5 }, (-mp.tensor { 1, -2, 0.5 }):totable())
      assert.are.same({ -3, 4 }, (-mp.tensor({ 3, -4 }, { dtype = "i32" })):totable())
      assert.are.equal("f16", (-mp.tensor({ 3 }, { dtype = "f16" })).dtype)
    end)

    it("promotes dtypes: f16+bf16 -> f32, float beats int, u8+i32 -> i32", function()
      local function t(dt) return mp.tensor({ 2 }, { dtype = dt }) end
      assert.are.equal("f32", (t "f16" + t "bf16").dtype)
      assert.are.equal("f32", (t "f16" * t "f32").dtype)
      assert.are.equal("f32", (t "bf16" - t "f32").dtype)
      assert.are.equal("f16", (t "f16" + t "i32").dtype)
      assert.are.equal("bf16", (t "u8" + t "bf16").dtype)
      assert.are.equal("f32", (t "i32" * t "f32").dtype)
      assert.are.equal("i32", (t "u8" + t "i32").dtype)
      assert.are.equal("i32", (t "i32" + t "i32").dtype)
      assert.are.equal("u8", (t "u8" * t "u8").dtype)
      assert.are.equal("f16", (t "f16" + 1.5).dtype)
      assert.are.equal("bf16", (3 * t "bf16").dtype)
      assert.are.equal("i32", (t "i32" * 2).dtype)
      assert.are.equal("f32", (t "i32" + 0.5).dtype)
      assert.are.equal(2.5, (t "i32" + 0.5):item())
    end)

    it("integer division gives f32", function()
      local a = mp.tensor({ 1, 7, -7 }, { dtype = "i32" })
      local b = mp.tensor({ 2, 2, 2 }, { dtype = "i32" })
      local q = a / b
      assert.are.equal("f32", q.dtype)
      assert.are.same({ 0.5, 3.5, -3.5 }, q:totable())
      assert.are.equal("f32", (a / 2).dtype)
      assert.are.same({ 0.5, 3.5, -3.5 }, (a / 2):totable())
      assert.are.equal("f32", (mp.tensor({ 3 }, { dtype = "u8" }) / mp.tensor({ 2 }, { dtype = "u8" })).dtype)
      assert.are.equal(1.5, (mp.tensor({ 3 }, { dtype = "u8" }) / mp.tensor({ 2 }, { dtype = "u8" })):item())
    end)

    it("f16 ops compute in f32 and round the result once (tie to even)", function()
      local one = mp.tensor({ 1 }, { dtype = "f16" })
      -- 1 + 2^-11 is half way between 1 and 1 + 2^-10: even is 1
      assert.are.equal(1, (one + 2 ^ -11):item())
      assert.are.equal(1, (one + mp.tensor({ 2 ^ -11 }, { dtype = "f16" })):item())
      -- 1 + 3*2^-11 is half way between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9
      assert.are.equal(1 + 2 ^ -9, (one + 3 * 2 ^ -11):item())
      -- just above half way rounds up
      assert.are.equal(1 + 2 ^ -10, (one + (2 ^ -11 + 2 ^ -12)):item())
      -- the scalar is not rounded to f16 first: 2^-11 + 2^-22 would round to 2^-11 in f16,
      -- and 1 + 2^-11 would then tie down to 1; computed in f32 it is above the tie
      assert.are.equal(1 + 2 ^ -10, (one + (2 ^ -11 + 2 ^ -22)):item())
      -- (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20 rounds to 1 + 2^-9
      local x = mp.tensor({ 1 + 2 ^ -10 }, { dtype = "f16" })
      assert.are.equal(1 + 2 ^ -9, (x * x):item())
      assert.are.equal(1 + 2 ^ -9, x:pow(2):item())
      -- overflow to inf in the output, not in the computation
      local big = mp.tensor({ 60000 }, { dtype = "f16" })
      assert.are.equal(math.huge, (big + big):item())
      -- each op rounds its own output: the inf of big + big stays inf
      assert.are.equal(math.huge, ((big + big) / 2):item())
    end)

    it("bf16 ops round once too", function()
      local one = mp.tensor({ 1 }, { dtype = "bf16" })
      assert.are.equal(1, (one + 2 ^ -8):item())
      assert.are.equal(1 + 2 ^ -6, (one + 3 * 2 ^ -8):item())
      assert.are.equal(1 + 2 ^ -7, (one + (2 ^ -8 + 2 ^ -16)):item())
    end)

    for _, dt in ipairs { "f16", "bf16" } do
      it(dt .. " binary and unary ops equal the f32 op rounded to " .. dt, function()
        mp.manual_seed(7)
        local a = (mp.randn({ 64, 33 }) * 3):to(dt)
        local b = (mp.randn({ 64, 33 }) * 3):to(dt)
        local pos = (mp.rand({ 64, 33 }) * 10 + 0.01):to(dt)
        local fa, fb, fp = a:f32(), b:f32(), pos:f32()
        H.assert_same((a + b):totable(), (fa + fb):to(dt):totable(), dt .. " +")
        H.assert_same((a - b):totable(), (fa - fb):to(dt):totable(), dt .. " -")
        H.assert_same((a * b):totable(), (fa * fb):to(dt):totable(), dt .. " *")
        H.assert_same((a / b):totable(), (fa / fb):to(dt):totable(), dt .. " /")
        H.assert_same((a * 0.3):totable(), (fa * 0.3):to(dt):totable(), dt .. " * 0.3")
        H.assert_same((a:narrow(2, 1, 1) + b):totable(), (fa:narrow(2, 1, 1) + fb):to(dt):totable(),
                      dt .. " broadcast +")
        H.assert_same(a:exp():totable(), fa:exp():to(dt):totable(), dt .. " exp")
        H.assert_same(pos:log():totable(), fp:log():to(dt):totable(), dt .. " log")
        H.assert_same(pos:sqrt():totable(), fp:sqrt():to(dt):totable(), dt .. " sqrt")
        H.assert_same(pos:pow(1.5):totable(), fp:pow(1.5):to(dt):totable(), dt .. " pow")
        H.assert_same(a:abs():totable(), fa:abs():to(dt):totable(), dt .. " abs")
      end)
    end

    it("integer arithmetic stays exact", function()
      local a = mp.tensor({ 100000, -3 }, { dtype = "i32" })
      local b = mp.tensor({ 20000, 5 }, { dtype = "i32" })
      assert.are.same({ 120000, 2 }, (a + b):totable())
      assert.are.same({ 80000, -8 }, (a - b):totable())
      assert.are.same({ 2000000000, -15 }, (a * b):totable())
      assert.are.same({ 100005, 2 }, (a + 5):totable())
      assert.are.equal("integer", math.type((a + b):totable()[1]))
    end)
  end)

  ---------------------------------------------------------------- maths
  describe("unary maths", function()
    local xs = { 0.25, 1, 2, 3.5, 10 }
    local t = mp.tensor(xs)
    local function check(got, f, what)
      local want = {}
      for i, x in ipairs(xs) do want[i] = f(x) end
      H.assert_close(got:totable(), want, 2e-6, 1e-7, what)
    end
    it("exp", function() check(t:exp(), math.exp, "exp") end)
    it("log", function() check(t:log(), math.log, "log") end)
    it("sqrt", function() check(t:sqrt(), math.sqrt, "sqrt") end)
    it("pow", function()
      check(t:pow(2), function(x) return x ^ 2 end, "pow 2")
      check(t:pow(3), function(x) return x ^ 3 end, "pow 3")
      check(t:pow(0.5), function(x) return x ^ 0.5 end, "pow 0.5")
      check(t:pow(-1), function(x) return 1 / x end, "pow -1")
    end)
    it("abs", function()
      assert.are.same({ 1.5, 0, 2 }, mp.tensor { -1.5, 0, 2 }:abs():totable())
      assert.are.same({ 3, 2 }, mp.tensor({ -3, 2 }, { dtype = "i32" }):abs():totable())
      assert.are.equal("i32", mp.tensor({ -3, 2 }, { dtype = "i32" }):abs().dtype)
    end)
    it("edge values: log 0, log -1, sqrt -1, exp overflow", function()
      local v = mp.tensor { 0, -1 }:log():totable()
      assert.are.equal(-math.huge, v[1])
      assert.is_true(H.isnan(v[2]))
      assert.is_true(H.isnan(mp.tensor(-1):sqrt():item()))
      assert.are.equal(math.huge, mp.tensor(100):exp():item())
      assert.are.equal(math.huge, mp.tensor({ 12 }, { dtype = "f16" }):exp():item())
    end)
    it("maths of integers gives f32", function()
      local i = mp.tensor({ 1, 4 }, { dtype = "i32" })
      assert.are.equal("f32", i:sqrt().dtype)
      assert.are.same({ 1, 2 }, i:sqrt():totable())
      assert.are.equal("f32", i:exp().dtype)
      assert.are.equal("f32", mp.tensor({ 1, 4 }, { dtype = "u8" }):log().dtype)
    end)
  end)

  ---------------------------------------------------------------- reductions
  describe("reductions", function()
    local m = mp.tensor { { 1, 5, 3 }, { 7, 2, 4 } }

    it("over all elements give a 0-d tensor", function()
      for _, r in ipairs { m:sum(), m:mean(), m:max() } do
        assert.are.equal(0, r:dim())
        assert.are.same({}, r.shape)
      end
      assert.are.equal(22, m:sum():item())
      assert.are.equal(H.f32(22 / 6), m:mean():item())
      assert.are.equal(7, m:max():item())
      assert.are.equal(1, mp.tensor { 1, 9, 3, 9 }:argmax():item()) -- 0-based, the first maximum
      assert.are.equal(0, mp.tensor { 1, 9, 3, 9 }:argmax():dim())
    end)

    it("sum and mean along dims, 1-based and negative", function()
      assert.are.same({ 8, 7, 7 }, m:sum(1):totable())
      assert.are.same({ 8, 7, 7 }, m:sum(-2):totable())
      assert.are.same({ 9, 13 }, m:sum(2):totable())
      assert.are.same({ 9, 13 }, m:sum(-1):totable())
      assert.are.same({ 3 }, m:sum(1).shape)
      assert.are.same({ 4, 3.5, 3.5 }, m:mean(1):totable())
      H.assert_same(m:mean(2):totable(), { 3, H.f32(13 / 3) }, "mean(2)")
    end)

    it("sum along the middle dim of a 3-d tensor", function()
      local t = mp.arange(24):reshape { 2, 3, 4 }
      local s = t:sum(2)
      assert.are.same({ 2, 4 }, s.shape)
      local want = {}
      for i = 0, 1 do
        want[i + 1] = {}
        for k = 0, 3 do
          local acc = 0
          for j = 0, 2 do acc = acc + i * 12 + j * 4 + k end
          want[i + 1][k + 1] = acc
        end
      end
      assert.are.same(want, s:totable())
      assert.are.same({ 2, 3 }, t:sum(3).shape)
      assert.are.same({ 3, 4 }, t:mean(1).shape)
      assert.are.same(t:sum(-1):totable(), t:sum(3):totable())
    end)

    it("max(d) returns values and 0-based i32 indices", function()
      local v, i = m:max(2)
      assert.are.same({ 5, 7 }, v:totable())
      assert.are.same({ 1, 0 }, i:totable())
      assert.are.equal("i32", i.dtype)
      assert.are.equal("f32", v.dtype)
      v, i = m:max(1)
      assert.are.same({ 7, 5, 4 }, v:totable())
      assert.are.same({ 1, 0, 1 }, i:totable())
      v, i = m:max(-1)
      assert.are.same({ 5, 7 }, v:totable())
      assert.are.same({ 1, 0 }, i:totable())
      assert.is_nil(select(2, m:max()))
    end)

    it("argmax along dims, first of equal maxima", function()
      assert.are.same({ 1, 0 }, m:argmax(2):totable())
      assert.are.same({ 1, 0 }, m:argmax(-1):totable())
      assert.are.same({ 1, 0, 1 }, m:argmax(1):totable())
      assert.are.equal("i32", m:argmax(1).dtype)
      assert.are.same({ 1 }, mp.tensor { { 2, 9, 9 } }:argmax(2):totable())
      assert.are.equal("integer", math.type(m:argmax(2):totable()[1]))
    end)

    it("max propagates NaN and argmax points at it", function()
      local n = mp.tensor { { 1, 5, 3 }, { 7, 0 / 0, 4 } }
      assert.is_true(H.isnan(n:max():item()))
      local v, i = n:max(2)
      local vt = v:totable()
      assert.are.equal(5, vt[1])
      assert.is_true(H.isnan(vt[2]))
      assert.are.same({ 1, 1 }, i:totable())
      local v1 = n:max(1):totable()
      assert.are.equal(7, v1[1])
      assert.is_true(H.isnan(v1[2]))
      assert.are.equal(4, v1[3])
      assert.are.same({ 1, 1 }, n:argmax(2):totable())
      assert.is_true(H.isnan(mp.tensor({ 0 / 0, 1 }, { dtype = "f16" }):max():item()))
      assert.is_true(H.isnan(n:sum():item()))
    end)

    it("reduces each dtype; integer sums and means are f32 (no i32 wrap)", function()
      local i = mp.tensor({ { 1, 5, 3 }, { 7, 2, 4 } }, { dtype = "i32" })
      assert.are.equal(22, i:sum():item())
      assert.are.equal("f32", i:sum().dtype)
      -- 255 * 50,000,000 would wrap an i32 accumulator; f32 keeps it to 24 bits
      local big = mp.full({ 50000000 }, 255, { dtype = "u8" }):sum():item()
      assert.is_true(math.abs(big - 12750000000) / 12750000000 < 1e-7, tostring(big))
      assert.are.equal("f32", i:mean().dtype)
      assert.are.equal(H.f32(22 / 6), i:mean():item())
      assert.are.same({ 5, 7 }, (i:max(2)):totable())
      local u = mp.tensor({ 200, 200, 200 }, { dtype = "u8" })
      assert.are.equal(600, u:sum():item())
      assert.are.equal(200, u:mean():item())
      local h = mp.tensor({ { 1, 5, 3 }, { 7, 2, 4 } }, { dtype = "f16" })
      assert.are.equal("f16", h:sum().dtype)
      assert.are.same({ 9, 13 }, h:sum(2):totable())
      assert.are.same({ 5, 7 }, (h:max(2)):totable())
    end)

    it("f16 sums accumulate wide and round once", function()
      -- 4096 ones: an f16 accumulator would stop at 2048
      local t = mp.ones({ 4096 }, { dtype = "f16" })
      assert.are.equal(4096, t:sum():item())
      assert.are.equal(1, t:mean():item())
      -- but the result is f16: 65504 + 65504 overflows
      assert.are.equal(math.huge, mp.full({ 2 }, 65504, { dtype = "f16" }):sum():item())
      assert.are.equal(65504, mp.full({ 2 }, 65504, { dtype = "f16" }):mean():item())
    end)

    it("a long f32 sum is accurate", function()
      local t = mp.full({ 1000000 }, 0.1)
      assert.is_true(H.close(t:sum():item(), 1000000 * H.f32(0.1), 1e-6),
                     "sum = " .. t:sum():item())
    end)
  end)

  ---------------------------------------------------------------- matmul
  describe("matmul", function()
    local function rnd(shape)
      return mp.randn(shape)
    end

    local function mat(t, b) -- Lua matrix of a 2-d tensor or of batch b of a 3-d tensor
      local v = t:totable()
      if b then return v[b] end
      return v
    end

    setup(function() mp.manual_seed(1234) end)

    it("2-d @ 2-d matches a naive triple loop", function()
      local a, b = rnd { 5, 7 }, rnd { 7, 3 }
      local c = mp.matmul(a, b)
      assert.are.same({ 5, 3 }, c.shape)
      H.assert_close(c:totable(), H.matmul(mat(a), mat(b)), 1e-5, 1e-5, "2-d")
      H.assert_same(a:matmul(b):totable(), c:totable(), "method")
    end)

    it("a known small product", function()
      local c = mp.matmul(mp.tensor { { 1, 2 }, { 3, 4 } }, mp.tensor { { 5, 6 }, { 7, 8 } })
      assert.are.same({ { 19, 22 }, { 43, 50 } }, c:totable())
    end)

    it("a larger product (threaded BLAS path)", function()
      local a, b = rnd { 64, 96 }, rnd { 96, 80 }
      H.assert_close(mp.matmul(a, b):totable(), H.matmul(mat(a), mat(b)), 1e-4, 1e-4, "64x96x80")
    end)

    it("batched 3-d @ 3-d", function()
      local a, b = rnd { 3, 4, 5 }, rnd { 3, 5, 2 }
      local c = mp.matmul(a, b)
      assert.are.same({ 3, 4, 2 }, c.shape)
      for i = 1, 3 do
        H.assert_close(c:totable()[i], H.matmul(mat(a, i), mat(b, i)), 1e-5, 1e-5, "batch " .. i)
      end
    end)

    it("3-d @ 2-d uses the one matrix for every batch", function()
      local a, b = rnd { 3, 4, 5 }, rnd { 5, 6 }
      local c = mp.matmul(a, b)
      assert.are.same({ 3, 4, 6 }, c.shape)
      for i = 1, 3 do
        H.assert_close(c:totable()[i], H.matmul(mat(a, i), mat(b)), 1e-5, 1e-5, "batch " .. i)
      end
    end)

    it("2-d @ 3-d broadcasts the matrix over the batch (numpy)", function()
      local a, b = rnd { 4, 5 }, rnd { 3, 5, 2 }
      local c = mp.matmul(a, b)
      assert.are.same({ 3, 4, 2 }, c.shape)
      for i = 1, 3 do
        H.assert_close(c:totable()[i], H.matmul(mat(a), mat(b, i)), 1e-5, 1e-5, "batch " .. i)
      end
    end)

    it("1-d operands as numpy: dot, row vector, column vector", function()
      local v, w = mp.tensor { 1, 2, 3 }, mp.tensor { 4, 5, 6 }
      local d = mp.matmul(v, w)
      assert.are.equal(0, d:dim())
      assert.are.equal(32, d:item())
      local M = mp.tensor { { 1, 2 }, { 3, 4 }, { 5, 6 } }
      local r = mp.matmul(v, M) -- {3} @ {3,2} -> {2}
      assert.are.same({ 2 }, r.shape)
      assert.are.same({ 22, 28 }, r:totable())
      local N = mp.tensor { { 1, 0, 2 }, { 0, 1, -1 } }
      local c = mp.matmul(N, v) -- {2,3} @ {3} -> {2}
      assert.are.same({ 2 }, c.shape)
      assert.are.same({ 7, -1 }, c:totable())
    end)

    it("3-d @ 1-d and 1-d @ 3-d", function()
      local a = rnd { 2, 3, 4 }
      local v = mp.tensor { 1, -1, 2, 0.5 }
      local c = mp.matmul(a, v)
      assert.are.same({ 2, 3 }, c.shape)
      local A, V = a:totable(), v:totable()
      for i = 1, 2 do
        for j = 1, 3 do
          local s = 0
          for k = 1, 4 do s = s + A[i][j][k] * V[k] end
          assert.is_true(H.close(c:totable()[i][j], s, 1e-5, 1e-5))
        end
      end
      local u = mp.tensor { 2, -1, 0.5 }
      local d = mp.matmul(u, a) -- {3} @ {2,3,4} -> {2,4}
      assert.are.same({ 2, 4 }, d.shape)
      for i = 1, 2 do
        for k = 1, 4 do
          local s = 0
          for j = 1, 3 do s = s + u:totable()[j] * A[i][j][k] end
          assert.is_true(H.close(d:totable()[i][k], s, 1e-5, 1e-5))
        end
      end
    end)

    it("works on narrowed views (storage offset)", function()
      local a = rnd { 6, 4 }
      local b = rnd { 4, 3 }
      local an = a:narrow(1, 3, 2)
      local want = H.matmul({ mat(a)[3], mat(a)[4] }, mat(b))
      H.assert_close(mp.matmul(an, b):totable(), want, 1e-5, 1e-5, "narrowed")
    end)

    for _, dt in ipairs { "f16", "bf16" } do
      it(dt .. " matmul equals the f32 product of the same inputs rounded once to " .. dt, function()
        local cases = { { { 8, 16 }, { 16, 8 } }, { { 33, 70 }, { 70, 17 } }, { { 3, 5, 7 }, { 3, 7, 4 } },
                        { { 3, 5, 7 }, { 7, 4 } }, { { 7 }, { 7, 4 } }, { { 5, 7 }, { 7 } } }
        for _, c in ipairs(cases) do
          local a, b = rnd(c[1]):to(dt), rnd(c[2]):to(dt)
          local got = mp.matmul(a, b)
          assert.are.equal(dt, got.dtype)
          local want = mp.matmul(a:f32(), b:f32()):to(dt)
          assert.are.same(want.shape, got.shape)
          H.assert_same(got:totable(), want:totable(), dt .. " " .. table.concat(c[1], "x"))
        end
      end)
    end

    it("f16 matmul accumulates in f32 (no overflow in the middle of a sum)", function()
      -- 40000*1 + 40000*1 - 40000*1 = 40000, but an f16 accumulator would hit inf at 80000
      local a = mp.tensor({ { 40000, 40000, -40000 } }, { dtype = "f16" })
      local b = mp.tensor({ { 1 }, { 1 }, { 1 } }, { dtype = "f16" })
      assert.are.equal(40000, mp.matmul(a, b):item())
    end)
  end)

  ---------------------------------------------------------------- shapes
  describe("shapes", function()
    it("reshape and view keep row-major values, with one -1 inferred", function()
      local t = mp.arange(12)
      local r = t:reshape { 3, -1 }
      assert.are.same({ 3, 4 }, r.shape)
      assert.are.same({ { 0, 1, 2, 3 }, { 4, 5, 6, 7 }, { 8, 9, 10, 11 } }, r:totable())
      assert.are.same({ 2, 2, 3 }, t:reshape(2, -1, 3).shape)
      assert.are.same({ 12 }, r:reshape { -1 }.shape)
      assert.are.same({ 4, 3 }, t:view { 4, 3 }.shape)
      assert.are.same({ 2, 6 }, t:view(2, 6).shape)
      assert.are.same({ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 }, t:view { 2, 6 }:reshape { 12 }:totable())
      assert.are.equal(0, mp.ones { 1 }:reshape {}:dim())
      assert.are.same({ 1, 1, 1, 1, 1, 1, 1, 1 }, mp.ones { 1 }:reshape { 1, 1, 1, 1, 1, 1, 1, 1 }.shape)
    end)

    it("reshape shares storage (no new bytes, survives freeing the source)", function()
      collectgarbage()
      local t = mp.randn { 1000 }
      local vals = t:totable()
      local before = mp.memory()
      local r = t:reshape { 10, -1 }
      local v = t:view { 100, 10 }
      local after = mp.memory()
      assert.are.equal(before.in_use, after.in_use)
      assert.are.equal(before.storages, after.storages)
      t:free()
      H.assert_same(r:totable(), H.rows(vals, 10, 100), "reshape after free of the source")
      H.assert_same(v:reshape { 1000 }:totable(), vals, "view after free of the source")
      assert.are.equal(before.in_use, mp.memory().in_use)
    end)

    it("transpose swaps dims with a contiguous copy", function()
      local t = mp.tensor { { 1, 2, 3 }, { 4, 5, 6 } }
      local tt = t:transpose(1, 2)
      assert.are.same({ 3, 2 }, tt.shape)
      assert.are.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, tt:totable())
      assert.are.same(tt:totable(), t:transpose(-1, -2):totable())
      assert.are.same(tt:totable(), t:transpose(2, 1):totable())
      assert.are.same(t:totable(), t:transpose(1, 1):totable())
      assert.are.same(t:totable(), tt:transpose(1, 2):totable())
      -- reshape of the transposed copy follows the new order
      assert.are.same({ 1, 4, 2, 5, 3, 6 }, tt:reshape { 6 }:totable())
    end)

    it("transpose of a 3-d tensor", function()
      local t = mp.arange(24):reshape { 2, 3, 4 }
      local u = t:transpose(1, 3)
      assert.are.same({ 4, 3, 2 }, u.shape)
      local T, U = t:totable(), u:totable()
      for i = 1, 2 do for j = 1, 3 do for k = 1, 4 do
        assert.are.equal(T[i][j][k], U[k][j][i])
      end end end
      local w = t:transpose(2, -1)
      assert.are.same({ 2, 4, 3 }, w.shape)
      assert.are.equal(T[2][3][4], w:totable()[2][4][3])
      assert.are.equal("bf16", t:bf16():transpose(1, 2).dtype)
      assert.are.same(t:transpose(1, 2):totable(), t:to("u8"):transpose(1, 2):totable())
    end)

    it("narrow along dim 1 is a view; along other dims a copy", function()
      collectgarbage()
      local t = mp.arange(24):reshape { 4, 6 }
      local base = mp.memory().in_use
      local n1 = t:narrow(1, 2, 2)
      assert.are.same({ 2, 6 }, n1.shape)
      assert.are.same({ { 6, 7, 8, 9, 10, 11 }, { 12, 13, 14, 15, 16, 17 } }, n1:totable())
      assert.are.equal(base, mp.memory().in_use)
      local n2 = t:narrow(2, 3, 2)
      assert.are.same({ 4, 2 }, n2.shape)
      assert.are.same({ { 2, 3 }, { 8, 9 }, { 14, 15 }, { 20, 21 } }, n2:totable())
      assert.are.equal(base + 4 * 2 * 4, mp.memory().in_use)
      local n3 = t:narrow(-1, 6, 1)
      assert.are.same({ { 5 }, { 11 }, { 17 }, { 23 } }, n3:totable())
      local n4 = t:narrow(-2, 4, 1)
      assert.are.same({ { 18, 19, 20, 21, 22, 23 } }, n4:totable())
    end)

    it("narrow of a 3-d tensor along each dim, and narrow of a narrow", function()
      local t = mp.arange(24):reshape { 2, 3, 4 }
      local T = t:totable()
      local a = t:narrow(2, 2, 2)
      assert.are.same({ 2, 2, 4 }, a.shape)
      assert.are.same({ { T[1][2], T[1][3] }, { T[2][2], T[2][3] } }, a:totable())
      local b = t:narrow(3, 2, 2)
      assert.are.same({ 2, 3, 2 }, b.shape)
      assert.are.equal(T[2][1][2], b:totable()[2][1][1])
      local c = t:narrow(1, 2, 1):narrow(2, 3, 1):narrow(3, 4, 1)
      assert.are.equal(23, c:reshape {}:item())
      local d = t:reshape { 6, 4 }:narrow(1, 3, 4):narrow(1, 2, 2)
      assert.are.same({ { 12, 13, 14, 15 }, { 16, 17, 18, 19 } }, d:totable())
    end)

    it("clone is an independent copy", function()
      collectgarbage()
      local t = mp.tensor { 1, 2, 3 }
      local before = mp.memory().in_use
      local c = t:clone()
      assert.are.equal(before + 12, mp.memory().in_use)
      assert.is_false(c == t)
      assert.are.same({ 1, 2, 3 }, c:totable())
      t:free()
      assert.are.same({ 1, 2, 3 }, c:totable())
      local h = mp.tensor({ 1, 2 }, { dtype = "f16" }):clone()
      assert.are.equal("f16", h.dtype)
    end)

    it("detach gives the same values and dtype, sharing storage", function()
      collectgarbage()
      local t = mp.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "bf16" })
      local before = mp.memory().in_use
      local d = t:detach()
      assert.are.equal(before, mp.memory().in_use)
      assert.are.same(t:totable(), d:totable())
      assert.are.same(t.shape, d.shape)
      assert.are.equal("bf16", d.dtype)
      t:free()
      assert.are.same({ { 1, 2 }, { 3, 4 } }, d:totable())
    end)
  end)

  ---------------------------------------------------------------- random
  describe("random numbers", function()
    it("manual_seed makes randn and rand repeatable", function()
      mp.manual_seed(42)
      local a = mp.randn { 1000 }:totable()
      local b = mp.rand { 10 }:totable()
      mp.manual_seed(42)
      H.assert_same(mp.randn { 1000 }:totable(), a, "randn after the same seed")
      H.assert_same(mp.rand { 10 }:totable(), b, "rand after the same seed")
      mp.manual_seed(43)
      local c = mp.randn { 1000 }:totable()
      local diff = 0
      for i = 1, 1000 do if c[i] ~= a[i] then diff = diff + 1 end end
      assert.is_true(diff > 990, "another seed gives other numbers")
    end)

    it("successive draws differ", function()
      mp.manual_seed(1)
      local a = mp.randn { 100 }:totable()
      local b = mp.randn { 100 }:totable()
      local same = 0
      for i = 1, 100 do if a[i] == b[i] then same = same + 1 end end
      assert.is_true(same < 3)
    end)

    it("the stream does not depend on how it is split or on the dtype", function()
      mp.manual_seed(5)
      local whole = mp.randn { 200 }:totable()
      mp.manual_seed(5)
      local p1, p2 = mp.randn { 50 }:totable(), mp.randn { 3, 50 }:reshape { 150 }:totable()
      for i = 1, 150 do p1[50 + i] = p2[i] end
      H.assert_same(p1, whole, "split stream")
      mp.manual_seed(5)
      local h = mp.randn({ 200 }, { dtype = "f16" })
      H.assert_same(h:totable(), mp.tensor(whole):f16():totable(), "f16 randn is f32 randn rounded")
    end)

    it("rand is in [0, 1) with mean 1/2 (f32)", function()
      mp.manual_seed(11)
      local r = mp.rand { 100000 }
      assert.is_true(r:max():item() < 1)
      assert.is_true((-r):max():item() <= 0)
      assert.is_true(math.abs(r:mean():item() - 0.5) < 0.01)
    end)

    for _, dt in ipairs { "f16", "bf16" } do
      it("rand is in [0, 1) in " .. dt .. " too (never rounds up to 1)", function()
        mp.manual_seed(11)
        local r = mp.rand({ 100000 }, { dtype = dt })
        local mx = r:max():item()
        assert.is_true(mx < 1, dt .. " rand max is " .. mx)
        assert.is_true((-r):max():item() <= 0)
      end)
    end

    it("randn has mean ~0 and std ~1 on 100k samples", function()
      mp.manual_seed(12)
      local x = mp.randn { 100000 }
      local mean = x:mean():item()
      local std = math.sqrt(((x - mean):pow(2)):mean():item())
      assert.is_true(math.abs(mean) < 0.02, "mean " .. mean)
      assert.is_true(math.abs(std - 1) < 0.02, "std " .. std)
      -- about 68.3% within one std
      local v = x:totable()
      local within = 0
      for i = 1, #v do if math.abs(v[i]) < 1 then within = within + 1 end end
      assert.is_true(math.abs(within / #v - 0.6827) < 0.01, "within 1 std: " .. within / #v)
      assert.is_true(x:max():item() < 7 and (-x):max():item() < 7)
    end)
  end)

  ---------------------------------------------------------------- printing
  describe("tostring", function()
    it("shows values and ends with the summary line", function()
      local s = tostring(mp.tensor { { 1, 2, 3 }, { 4, 5, 6 } })
      assert.is_truthy(s:find("[f32 2x3 " .. DEV .. "]", 1, true))
      assert.are.equal("[f32 2x3 " .. DEV .. "]", s:match("[^\n]*$"))
      local lines = {}
      for l in s:gmatch("[^\n]+") do lines[#lines + 1] = l end
      assert.are.equal(3, #lines)
      assert.are.same({ "1", "2", "3" }, { lines[1]:match("(%S+)%s+(%S+)%s+(%S+)") })
      assert.are.same({ "4", "5", "6" }, { lines[2]:match("(%S+)%s+(%S+)%s+(%S+)") })
    end)

    it("names the dtype, shape and device", function()
      assert.are.equal("[f16 2x3 " .. DEV .. "]", tostring(mp.ones({ 2, 3 }, { dtype = "f16" })):match("[^\n]*$"))
      assert.are.equal("[bf16 4 " .. DEV .. "]", tostring(mp.ones({ 4 }, { dtype = "bf16" })):match("[^\n]*$"))
      assert.are.equal("[i32 1x2x3 " .. DEV .. "]", tostring(mp.ones({ 1, 2, 3 }, { dtype = "i32" })):match("[^\n]*$"))
      assert.are.equal("[u8 2 " .. DEV .. "]", tostring(mp.ones({ 2 }, { dtype = "u8" })):match("[^\n]*$"))
      assert.is_truthy(tostring(mp.tensor(3)):find("[f32 scalar " .. DEV .. "]", 1, true))
      assert.is_truthy(tostring(mp.tensor(3)):find("3", 1, true))
    end)

    it("shows fractions, NaN and inf", function()
      local s = tostring(mp.tensor { 0.5, -1.25, 0 / 0, math.huge, -math.huge })
      assert.is_truthy(s:find("0.5", 1, true))
      assert.is_truthy(s:find("-1.25", 1, true))
      assert.is_truthy(s:find("nan", 1, true))
      assert.is_truthy(s:find("inf", 1, true))
      assert.is_truthy(s:find("-inf", 1, true))
      assert.is_truthy(tostring(mp.tensor({ -7, 123456 }, { dtype = "i32" })):find("123456", 1, true))
    end)

    it("prints 3-d tensors as slices", function()
      local s = tostring(mp.arange(8):reshape { 2, 2, 2 })
      assert.is_truthy(s:find("(1,.,.)", 1, true))
      assert.is_truthy(s:find("(2,.,.)", 1, true))
      assert.is_truthy(s:find("7", 1, true))
    end)

    it("elides tensors over 1000 elements with ...", function()
      local big = tostring(mp.arange(2000))
      assert.is_truthy(big:find("...", 1, true))
      assert.is_truthy(big:find("[f32 2000 " .. DEV .. "]", 1, true))
      assert.is_truthy(big:find("1999", 1, true))
      assert.is_truthy(big:find(" 0 ", 1, true) or big:find("^%s*0 "))
      assert.is_falsy(big:find("1000", 1, true))
      assert.is_true(#big < 200, "elided print is " .. #big .. " characters")
      local m = tostring(mp.zeros { 100, 100 })
      assert.is_truthy(m:find("...", 1, true))
      assert.is_true(#m < 500, "elided 100x100 print is " .. #m .. " characters")
      local big3 = tostring(mp.zeros { 50, 50, 50 })
      assert.is_true(#big3 < 2000, "elided 50x50x50 print is " .. #big3 .. " characters")
    end)

    it("does not elide 1000 elements", function()
      local s = tostring(mp.arange(1000))
      assert.is_falsy(s:find("...", 1, true))
      assert.is_truthy(s:find("999", 1, true))
      assert.is_truthy(s:find("500", 1, true))
    end)

    it("of a freed tensor says so instead of failing", function()
      local t = mp.ones { 2 }
      t:free()
      local ok, s = pcall(tostring, t)
      assert.is_true(ok)
      assert.is_truthy(s:lower():find("freed", 1, true))
    end)
  end)
end)
