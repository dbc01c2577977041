-- math_ops_spec.lua: the math and reduction ops (docs/API.md "Tensor ops: math and
-- reductions"): both forms, mp.op(x, ...) and x:op(...), for every name;
-- values against Lua's maths, f16/bf16 computed in f32 and rounded once;
-- gradients (mp.autograd.gradcheck in f64 where the device has it, central
-- differences in f32 elsewhere, hand-computed at the edges); errors naming the
-- form that was called.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/math_ops_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local function vals(t) return H.flat(t:f32():totable()) end
local function T(list, dtype) return mp.tensor(list, dtype and { dtype = dtype } or nil) end

local uniform, gradcheck32, gradcheck = H.uniform, H.gradcheck32, H.gradcheck
local F64 = pcall(mp.zeros, { 1 }, { dtype = "f64" })   -- the default device holds f64 (the CPU)


-- every math and reduction name, in both forms
local BOTH = { "neg", "abs", "exp", "log", "sqrt", "sin", "cos", "tanh", "relu", "sigmoid", "gelu", "silu",
               "softmax", "log_softmax", "pow", "matmul", "gt", "lt", "ge", "le", "eq", "ne",
               "sum", "mean", "max", "min", "argmax", "argmin", "any", "all", "var", "std", "norm", "cumsum" }

describe("math and reduction ops", function()
  before_each(function()
    math.randomseed(2027)
    mp.set_grad_enabled(true)
  end)

  it("every name exists as mp.op and as a tensor method", function()
    for _, name in ipairs(BOTH) do
      assert.are.equal("function", type(mp[name]), "mp." .. name)
      assert.are.equal("function", type(mp.Tensor[name]), "Tensor:" .. name)
    end
    local x = T { 0.5, -1, 2 }
    for _, name in ipairs { "neg", "abs", "exp", "sin", "cos", "tanh", "relu", "sigmoid", "gelu", "silu" } do
      H.assert_same(vals(x[name](x)), vals(mp[name](x)), name)
    end
    H.assert_same(vals(x:softmax(1)), vals(mp.softmax(x, 1)), "softmax")
    H.assert_same(vals(x:log_softmax(-1)), vals(mp.log_softmax(x, -1)), "log_softmax")
    H.assert_same(vals(x:gelu { approximate = "tanh" }), vals(mp.gelu(x, { approximate = "tanh" })), "gelu tanh")
    assert.are.same({ 0, 0, 1 }, vals(mp.gt(x, 1)))
    assert.are.same({ 1, 0, 0 }, vals(mp.eq(x, T { 0.5, 1, 1 })))
    assert.are.equal("u8", mp.le(x, 0).dtype)
  end)

  it("every name is documented in docs/API.md, in both forms", function()
    local root = (debug.getinfo(1, "S").source:match("^@(.*/)tests/lua/") or "./")
    local f = assert(io.open(root .. "docs/API.md"))
    local documented = {}
    for line in f:lines() do
      if line:match("^### ") then
        for sig in line:gmatch("`([^`]+)`") do documented[sig:match("^[^%(%s%[{]+")] = true end
      end
    end
    f:close()
    -- the functional ops' mp. forms are documented with the functional ops (lfunctional.c)
    local elsewhere = { tanh = true, relu = true, sigmoid = true, silu = true, gelu = true, softmax = true,
                        log_softmax = true }
    for _, name in ipairs(BOTH) do
      assert.is_true(documented["t:" .. name] or false, "t:" .. name .. " is not documented")
      if not elsewhere[name] then
        assert.is_true(documented["mp." .. name] or false, "mp." .. name .. " is not documented")
      end
    end
  end)

  describe("values", function()
    it("sin and cos match Lua's maths (f32), f16/bf16 rounded once from f32", function()
      local v = uniform(300, -10, 10)
      local x = T(v)
      local ws, wc = {}, {}
      for i = 1, #v do ws[i], wc[i] = H.f32(math.sin(v[i])), H.f32(math.cos(v[i])) end
      H.assert_close(vals(mp.sin(x)), ws, 0, 2.4e-7, "sin")
      H.assert_close(vals(x:cos()), wc, 0, 2.4e-7, "cos")
      for _, dt in ipairs { "f16", "bf16" } do
        local xl = x:to(dt)
        assert.are.equal(dt, xl:sin().dtype)
        H.assert_same(vals(xl:sin()), vals(xl:f32():sin():to(dt)), dt .. " sin")
        H.assert_same(vals(mp.cos(xl)), vals(mp.cos(xl:f32()):to(dt)), dt .. " cos")
      end
      assert.are.equal("f32", T({ 1, 2 }, "i32"):sin().dtype)   -- integers give f32, as PyTorch
      assert.are.same({ -1, 2, -0 }, vals(mp.neg(T { 1, -2, 0 })))
      assert.are.same({ -3, 4 }, vals(T({ 3, -4 }, "i32"):neg()))
    end)

    it("min and argmin mirror max and argmax: values and 0-based indices, NaN wins", function()
      local x = T { { 3, 1, 2 }, { -1, 5, -1 } }
      assert.are.same({ -1 }, { x:min():item() })
      local v, i = x:min(2)
      assert.are.same({ 1, -1 }, vals(v))
      assert.are.same({ 1, 0 }, vals(i))
      assert.are.equal("i32", i.dtype)
      local mv, mi = mp.min(x, 1)
      assert.are.same({ -1, 1, -1 }, vals(mv))
      assert.are.same({ 1, 0, 1 }, vals(mi))
      assert.are.same({ 1, 0 }, vals(x:argmin(2)))
      assert.are.same({ 0, 1 }, vals(mp.argmax(x, 2)))
      assert.are.same({ 2, 1 }, mp.argmin(x, -1, true).shape)
      local kv, ki = x:max(1, true)
      assert.are.same({ 1, 3 }, kv.shape)
      assert.are.same({ 1, 3 }, ki.shape)
      assert.are.same({ 0, 1, 0 }, vals(ki))
      local n = T { 1, 0 / 0, -5 }
      assert.is_true(H.isnan(n:min():item()))
      assert.are.same({ 1 }, vals(n:argmin(1)))
      assert.are.same({ 1 }, vals(n:argmax(1)))
      for _, dt in ipairs { "f16", "bf16", "i32", "u8" } do
        local y = T({ { 4, 2, 7 }, { 9, 3, 3 } }, dt)
        local yv, yi = y:min(2)
        assert.are.equal(dt, yv.dtype)
        assert.are.same({ 2, 3 }, vals(yv))
        assert.are.same({ 1, 1 }, vals(yi))
      end
    end)

    it("sum, mean, max and argmax take keepdim", function()
      local x = mp.arange(6):reshape { 2, 3 }
      assert.are.same({ 2, 1 }, x:sum(2, true).shape)
      assert.are.same({ 3, 12 }, vals(mp.sum(x, 2)))
      assert.are.same({ 1, 3 }, mp.mean(x, 1, true).shape)
      assert.are.same({ 1.5, 2.5, 3.5 }, vals(x:mean(1)))
      assert.are.same({}, mp.sum(x).shape)
      assert.are.same({ 15 }, { mp.sum(x):item() })
      assert.are.same({ 2, 1 }, x:argmax(2, true).shape)
    end)

    it("var and std: unbiased by default, correction = 0, keepdim; f16 computed in f32", function()
      local v = { 1, 2, 3, 4, 10 }
      local x = T(v)
      local m = 4
      local ss = 0
      for _, a in ipairs(v) do ss = ss + (a - m) ^ 2 end
      H.assert_close({ x:var():item() }, { ss / 4 }, 1e-6, 0, "var")
      H.assert_close({ mp.var(x, { correction = 0 }):item() }, { ss / 5 }, 1e-6, 0, "var correction 0")
      H.assert_close({ mp.std(x):item() }, { math.sqrt(ss / 4) }, 1e-6, 0, "std")
      local y = T { { 1, 2, 3 }, { 2, 4, 9 } }
      H.assert_close(vals(y:var(2)), { 1, 13 }, 1e-6, 0, "var dim 2")
      H.assert_close(vals(mp.std(y, 1, { correction = 0 })), { 0.5, 1, 3 }, 1e-6, 0, "std dim 1")
      assert.are.same({ 2, 1 }, y:var(2, { keepdim = true }).shape)
      assert.are.same({ 1, 3 }, mp.std(y, 1, { keepdim = true }).shape)
      assert.is_true(H.isnan(T({ 3 }):var():item()))   -- one value, unbiased: 0/0, as PyTorch
      -- f16 values whose squares and sums overflow f16 (65504): fine in f32, rounded once
      local big = T({ 300, 400, 500 }, "f16")
      assert.are.equal("f16", big:var().dtype)
      assert.are.same(vals(big:f32():var():to("f16")), vals(big:var()))
      assert.are.same({ 10000 }, vals(big:var()))
      assert.are.same(vals(big:f32():std():to("bf16")), vals(big:bf16():std():to("bf16")))
    end)

    it("norm: p = 2 by default, 1, inf, -inf and others; over a dim with keepdim", function()
      local x = T { { 3, -4 }, { 0, 1 } }
      H.assert_close({ x:norm():item() }, { math.sqrt(26) }, 1e-6, 0, "2-norm")
      H.assert_close({ mp.norm(x, 1):item() }, { 8 }, 1e-6, 0, "1-norm")
      H.assert_close({ x:norm(math.huge):item() }, { 4 }, 0, 0, "inf-norm")
      H.assert_close({ x:norm(-math.huge):item() }, { 0 }, 0, 0, "-inf-norm")
      H.assert_close({ x:norm(3):item() }, { (27 + 64 + 1) ^ (1 / 3) }, 1e-6, 0, "3-norm")
      H.assert_close(vals(x:norm(2, 2)), { 5, 1 }, 1e-6, 0, "rows")
      H.assert_close(vals(mp.norm(x, 1, 1)), { 3, 5 }, 1e-6, 0, "columns")
      assert.are.same({ 2, 1 }, x:norm(2, -1, true).shape)
      local h = T({ 300, 400 }, "f16")   -- 300^2 + 400^2 overflows f16, not f32
      assert.are.same({ 500 }, vals(h:norm()))
      assert.are.equal("f16", h:norm().dtype)
    end)

    it("cumsum along a dim, integers as f32, f16 rounded once per output", function()
      local x = T { { 1, 2, 3 }, { 4, 5, 6 } }
      assert.are.same({ 1, 3, 6, 4, 9, 15 }, vals(x:cumsum(2)))
      assert.are.same({ 1, 2, 3, 5, 7, 9 }, vals(mp.cumsum(x, 1)))
      assert.are.same({ 1, 3, 6, 4, 9, 15 }, vals(mp.cumsum(x, -1)))
      local i = T({ 1, 2, 3 }, "i32"):cumsum(1)
      assert.are.equal("f32", i.dtype)
      assert.are.same({ 1, 3, 6 }, vals(i))
      local v = uniform(500, -1, 1)
      local f = T(v):to("f16")
      local fv, want, s = vals(f), {}, 0
      for k = 1, #fv do s = s + fv[k]; want[k] = s end
      H.assert_same(vals(f:cumsum(1)), vals(T(want):to("f16")), "f16 cumsum")
    end)

    it("f64 (where the device has it) computes in double", function()
      if not F64 then return end
      local v = { 0.1, 1.7, -2.3 }
      local x = mp.tensor(v, { dtype = "f64" })
      local ws, wc, cs = {}, {}, {}
      local s = 0
      for i = 1, 3 do ws[i], wc[i] = math.sin(v[i]), math.cos(v[i]); s = s + v[i]; cs[i] = s end
      H.assert_close(x:sin():totable(), ws, 1e-15, 0, "f64 sin")
      H.assert_close(mp.cos(x):totable(), wc, 1e-15, 0, "f64 cos")
      assert.are.same(cs, x:cumsum(1):totable())
      assert.are.equal("f64", x:var().dtype)
      assert.are.equal("f64", x:norm().dtype)
      local mv, mi = x:min(1)
      assert.are.same({ -2.3, 2 }, { mv:item(), mi:item() })
    end)

    it("any and all: u8, over dims, any dtype, NaN is true", function()
      local x = T { { 0, 1, 0 }, { 0, 0, 0 } }
      assert.are.equal("u8", x:any().dtype)
      assert.are.same({ 1 }, { x:any():item() })
      assert.are.same({ 0 }, { mp.all(x):item() })
      assert.are.same({ 1, 0 }, vals(x:any(2)))
      assert.are.same({ 0, 0, 0 }, vals(mp.all(x, 1)))
      assert.are.same({ 2, 1 }, x:any(2, true).shape)
      assert.are.same({ 1 }, { T({ 1, 2 }, "i32"):all():item() })
      assert.are.same({ 0 }, { T({ 1, 0 }, "u8"):all():item() })
      assert.are.same({ 1 }, { T({ 0, 0 / 0 }, "bf16"):any():item() })
      assert.are.same({ 1 }, { T({ 0.5, -1 }, "f16"):all():item() })
      local r = T({ 1, 2 }):requires_grad(true)
      assert.is_false(r:any():requires_grad())   -- not differentiable
    end)
  end)

  describe("gradients", function()
    it("sin, cos, neg", function()
      gradcheck(mp.sin, { { v = uniform(6, -3, 3), shape = { 2, 3 } } }, "sin")
      gradcheck(function(x) return x:cos() end, { { v = uniform(6, -3, 3), shape = { 6 } } }, "cos")
      gradcheck(mp.neg, { { v = uniform(4, -3, 3), shape = { 4 } } }, "neg")
    end)

    it("min (to the first minimum), var, std, cumsum", function()
      gradcheck(function(x) return (x:min(2)) end, { { v = { 3, 1, 2, 0.5, 5, 4 }, shape = { 2, 3 } } }, "min dim")
      gradcheck(function(x) return mp.min(x) end, { { v = { 3, 1, 2, 0.5 }, shape = { 4 } } }, "min")
      gradcheck(function(x) return x:var(2) end, { { v = uniform(8, -2, 2), shape = { 2, 4 } } }, "var dim")
      gradcheck(function(x) return mp.var(x, { correction = 0 }) end, { { v = uniform(5, -2, 2), shape = { 5 } } },
                "var")
      gradcheck(function(x) return x:std(1, { keepdim = true }) end,
                { { v = uniform(6, -2, 2), shape = { 3, 2 } } }, "std")
      gradcheck(function(x) return x:cumsum(2) end, { { v = uniform(6, -2, 2), shape = { 2, 3 } } }, "cumsum")
      gradcheck(function(x) return mp.cumsum(x, 1) end, { { v = uniform(6, -2, 2), shape = { 3, 2 } } }, "cumsum 1")
    end)

    it("norm for p = 1, 2, 3, inf; the 2-norm's gradient at 0 is 0, not NaN", function()
      gradcheck(function(x) return x:norm() end, { { v = uniform(6, -2, 2), shape = { 2, 3 } } }, "2-norm")
      gradcheck(function(x) return mp.norm(x, 2, 2) end, { { v = uniform(6, -2, 2), shape = { 2, 3 } } }, "2-norm dim")
      gradcheck(function(x) return x:norm(1, 1) end, { { v = { 1, -2, 0.5, 3 }, shape = { 2, 2 } } }, "1-norm")
      gradcheck(function(x) return x:norm(3) end, { { v = { 1, -2, 0.5, 3 }, shape = { 4 } } }, "3-norm")
      gradcheck(function(x) return x:norm(math.huge) end, { { v = { 1, -2, 0.5 }, shape = { 3 } } }, "inf-norm")
      local z = T({ { 0, 0 }, { 3, 4 } }):requires_grad(true)
      z:norm(2, 2):sum():backward()
      H.assert_close(vals(z.grad), { 0, 0, 0.6, 0.8 }, 1e-6, 0, "2-norm rows with a zero row")
      local w = T({ 0, 0, 0 }):requires_grad(true)
      w:norm():backward()
      assert.are.same({ 0, 0, 0 }, vals(w.grad))
      local q = T({ 0, -1, 2 }):requires_grad(true)
      mp.norm(q, 1):backward()
      assert.are.same({ 0, -1, 1 }, vals(q.grad))
    end)

    it("second derivatives (gradgradcheck in f64, where the device has it)", function()
      if not F64 then return end
      local function X(v, shape) return mp.tensor(H.nest(v, shape), { dtype = "f64" }):requires_grad(true) end
      local cases = {
        { "sin", mp.sin }, { "cos", function(x) return x:cos() end },
        { "cumsum", function(x) return x:cumsum(2) end }, { "2-norm", function(x) return x:norm(2, 2) end },
        { "var", function(x) return x:var(2) end }, { "std", function(x) return mp.std(x) end },
      }
      for _, c in ipairs(cases) do
        local ok, err = pcall(mp.autograd.gradgradcheck, c[2], { X(uniform(6, -2, 2), { 2, 3 }) },
                              { eps = 1e-6, atol = 1e-5, rtol = 1e-3 })
        assert(ok, c[1] .. ": " .. tostring(err))
      end
    end)

    it("cumsum runs in f32 under autocast, as PyTorch's; the gradient comes back in f16", function()
      local x = T({ 1, 2, 3 }):to("f16"):requires_grad(true)
      local y
      do
        local _ <close> = mp.amp.autocast("f16")
        y = x:cumsum(1)
      end
      assert.are.equal("f32", y.dtype)
      y:sum():backward()
      assert.are.equal("f16", x.grad.dtype)
      assert.are.same({ 3, 2, 1 }, vals(x.grad))
    end)

    it("f16 inputs get f16 gradients through var, norm and cumsum", function()
      for _, f in ipairs { function(x) return x:var() end, function(x) return x:norm() end,
                           function(x) return x:cumsum(1):sum() end, function(x) return x:sin():sum() end } do
        local x = T({ 1, 2, 4 }):to("f16"):requires_grad(true)
        f(x):backward()
        assert.are.equal("f16", x.grad.dtype)
      end
      local x = T({ 1, 2, 4 }):to("f16"):requires_grad(true)
      x:var():backward()   -- 2 (x - mean) / 2
      assert.are.same(vals(T { -4 / 3, -1 / 3, 5 / 3 }:to("f16")), vals(x.grad))
    end)
  end)

  describe("errors name the form that was called", function()
    it("arguments", function()
      local x = T { { 1, 2 }, { 3, 4 } }
      H.raises(function() mp.exp("x") end, { "mp.exp:", "x must be a Tensor" })
      H.raises(function() mp.sin(nil) end, { "mp.sin:", "Tensor" })
      H.raises(function() x:cumsum() end, { "Tensor:cumsum:", "dim is required" })
      H.raises(function() mp.cumsum(x) end, { "mp.cumsum:", "dim is required" })
      H.raises(function() mp.cumsum(x, 3) end, { "mp.cumsum:", "dim 3 out of range" })
      H.raises(function() x:min(5) end, { "Tensor:min:", "dim 5 out of range" })
      H.raises(function() mp.min(x, 0) end, { "mp.min:", "dim 0 is not a dim" })
      -- without a dim, argmax/argmin of a tensor of several dims is PyTorch's flat index
      local m = mp.tensor({ { 1, 5, 2 }, { 7, 0, 3 } })
      assert.are.equal(3, m:argmax():item())
      assert.are.equal(4, mp.argmin(m):item())
      assert.are.equal(0, #m:argmax().shape)
      H.raises(function() mp.sum(x, 1, "yes") end, { "mp.sum:", "keepdim must be a boolean" })
      H.raises(function() mp.norm(x, 0) end, { "mp.norm:", "p must be > 0" })
      H.raises(function() x:norm("fro") end, { "Tensor:norm:", "p must be a number" })
      H.raises(function() mp.var(T({ 1, 2 }, "i32")) end, { "mp.var:", "float tensor", "i32" })
      H.raises(function() T({ 1, 2 }, "u8"):std() end, { "Tensor:std:", "float tensor" })
      H.raises(function() x:var(1, { correction = -1 }) end, { "Tensor:var:", "correction" })
      H.raises(function() x:var(1, { bias = true }) end, { "Tensor:var:", "bias" })
      H.raises(function() mp.gt(x, "1") end, { "mp.gt:", "b must be a Tensor or a number" })
      H.raises(function() x:softmax() end, { "Tensor:softmax:", "dim is required" })
      H.raises(function() x:gelu { approximate = "erf" } end, { "Tensor:gelu:", "approximate" })
      H.raises(function() x:any(9) end, { "Tensor:any:", "dim" })
    end)
  end)
end)
