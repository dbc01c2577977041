-- autograd_function_spec.lua: mp.autograd.Function, autograd Functions written
-- in Lua (lua/mp/autograd.lua, lua/lfunction.c, engine/custom.c).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local core = require "mp.core"
local Function = mp.autograd.Function

local function full_gc() collectgarbage(); collectgarbage() end

-- the line of the first line of this file that contains `text`
local this_file = debug.getinfo(1, "S").source:sub(2)
local function line_of(text)
  local n = 0
  for l in io.lines(this_file) do
    n = n + 1
    if l:find(text, 1, true) then return n end
  end
  error("no line with " .. text)
end

local swish = Function {
  name = "swish",
  forward = function(ctx, x, beta)
    local s = mp.sigmoid(x * beta)
    ctx:save_for_backward(x, s)
    ctx.beta = beta
    return x * s
  end,
  backward = function(ctx, gy)
    local x, s = table.unpack(ctx.saved_tensors)
    return gy * s * (1 + ctx.beta * x * (1 - s)), nil
  end,
}

local xs = { -3, -1.25, -0.5, 0, 0.3, 1, 2.5, 4 }

describe("mp.autograd.Function", function()
  it("swish: the values and gradients of the same formula written with built-in ops", function()
    local x = mp.tensor(xs):requires_grad(true)
    local y = swish(x, 1.5)
    assert.are.equal("swish", y.grad_fn)
    assert.is_true(y:requires_grad())
    local w = mp.tensor { 1, 2, 3, 4, 5, 6, 7, 8 };
    (y * w):sum():backward()
    local x2 = mp.tensor(xs):requires_grad(true)
    local y2 = x2 * mp.sigmoid(x2 * 1.5);
    (y2 * w):sum():backward()
    H.assert_close(y:totable(), y2:totable(), 1e-6, 1e-7, "values")
    H.assert_close(x.grad:totable(), x2.grad:totable(), 1e-5, 1e-6, "gradients")
    -- f:apply(...) is the same call
    local x3 = mp.tensor(xs):requires_grad(true)
    swish:apply(x3, 1.5):sum():backward()
    assert.is_true(x3.grad ~= nil)
  end)

  it("runs the forward with grad mode off, and gives needs_input_grad per argument", function()
    local seen
    local f = Function {
      name = "probe",
      forward = function(ctx, a, b, c, d)
        seen = { grad = mp.is_grad_enabled(), needs = ctx.needs_input_grad }
        return a * 2
      end,
      backward = function(ctx, g) return g * 2, nil, nil, nil end,
    }
    local a = mp.tensor({ 1, 2 }):requires_grad(true)
    local b = mp.tensor { 3, 4 }
    local y = f(a, b, 7, "s")
    assert.is_false(seen.grad)
    assert.are.same({ true, false, false, false }, seen.needs)
    assert.is_true(mp.is_grad_enabled())
    -- under no_grad: nothing needs a gradient, and no node is recorded
    do
      local _ <close> = mp.no_grad()
      y = f(a, b, 7, "s")
    end
    assert.are.same({ false, false, false, false }, seen.needs)
    assert.is_false(y:requires_grad())
    assert.is_nil(y.grad_fn)
  end)

  it("takes any Lua values between the tensors, each with a nil gradient", function()
    local got
    local f = Function {
      name = "scale_by",
      forward = function(ctx, x, opts, missing, y)
        ctx.k = opts.k
        got = { opts = opts, missing = missing }
        return x * opts.k + y
      end,
      backward = function(ctx, g) return g * ctx.k, nil, nil, g end,
    }
    local x = mp.tensor({ 1, 2, 3 }):requires_grad(true)
    local y = mp.tensor({ 4, 5, 6 }):requires_grad(true)
    local opts = { k = 3 }
    local out = f(x, opts, nil, y)
    assert.are.equal(opts, got.opts)
    assert.is_nil(got.missing)
    out:sum():backward()
    assert.are.same({ 3, 3, 3 }, x.grad:totable())
    assert.are.same({ 1, 1, 1 }, y.grad:totable())
  end)

  it("several outputs: one backward call, with zeros for an output no gradient reached", function()
    local calls, seen = 0, nil
    local f = Function {
      name = "prod_sum",
      forward = function(ctx, a, b)
        ctx:save_for_backward(a, b)
        return a * b, a + b, "a string"
      end,
      backward = function(ctx, gp, gs, gstr)
        calls = calls + 1
        seen = { gp = gp:totable(), gs = gs:totable(), gstr = gstr }
        local a, b = table.unpack(ctx.saved_tensors)
        return gp * b + gs, gp * a + gs
      end,
    }
    local a = mp.tensor({ 1, 2 }):requires_grad(true)
    local b = mp.tensor({ 3, 5 }):requires_grad(true)
    local p, s, str = f(a, b)
    assert.are.equal("a string", str)
    assert.are.equal("prod_sum", p.grad_fn)
    assert.are.equal("prod_sum", s.grad_fn)
    p:sum():backward()   -- s takes no part: its gradient is zeros
    assert.are.equal(1, calls)
    assert.are.same({ 0, 0 }, seen.gs)
    assert.is_nil(seen.gstr)
    assert.are.same({ 3, 5 }, a.grad:totable())
    assert.are.same({ 1, 2 }, b.grad:totable())
    -- both: one call with both gradients
    a.grad, b.grad = nil, nil
    calls = 0
    p, s = f(a, b)
    ;(p * 2 + s * 10):sum():backward()
    assert.are.equal(1, calls)
    assert.are.same({ 2, 2 }, seen.gp)
    assert.are.same({ 10, 10 }, seen.gs)
    assert.are.same({ 16, 20 }, a.grad:totable())   -- 2b + 10
    assert.are.same({ 12, 14 }, b.grad:totable())   -- 2a + 10
  end)

  it("mark_non_differentiable: that output does not require grad, and its gradient is zeros", function()
    local seen
    local f = Function {
      name = "with_mask",
      forward = function(ctx, x)
        local mask = x:gt(0):to("f32")
        ctx:mark_non_differentiable(mask)
        ctx:save_for_backward(mask)
        return x * mask, mask
      end,
      backward = function(ctx, gy, gmask)
        seen = gmask:totable()
        return gy * ctx.saved_tensors[1]
      end,
    }
    local x = mp.tensor({ -1, 2, 3 }):requires_grad(true)
    local y, mask = f(x)
    assert.is_false(mask:requires_grad())
    assert.is_nil(mask.grad_fn)
    assert.are.equal("with_mask", y.grad_fn)
    y:sum():backward()
    assert.are.same({ 0, 0, 0 }, seen)
    assert.are.same({ 0, 1, 1 }, x.grad:totable())
    H.raises(function() (mask:sum()):backward() end, { "does not require grad" })
  end)

  it("a Function used twice in one graph: each call its own node, gradients summed", function()
    local x = mp.tensor(xs):requires_grad(true)
    local z = swish(swish(x, 1.0), 2.0) + swish(x, 0.5)
    z:sum():backward()
    local x2 = mp.tensor(xs):requires_grad(true)
    local function ref(t, beta) return t * mp.sigmoid(t * beta) end;
    (ref(ref(x2, 1.0), 2.0) + ref(x2, 0.5)):sum():backward()
    H.assert_close(x.grad:totable(), x2.grad:totable(), 1e-5, 1e-6, "gradients")
  end)

  it("a wrong count of gradients names the Function and the line of its backward", function()
    local f = Function {
      name = "short",
      forward = function(ctx, a, b) return a * b end,
      backward = function(ctx, g) return g end,   -- BACKWARD_SHORT: one for two arguments
    }
    local a = mp.tensor({ 1, 2 }):requires_grad(true)
    local msg = H.raises(function() f(a, 3):sum():backward() end,
      { "Tensor:backward", "mp.autograd.Function 'short'", "returned 1 gradient for 2 forward arguments" })
    assert.truthy(msg:find("autograd_function_spec.lua:" .. line_of("BACKWARD_SHORT"), 1, true), msg)
    -- too many (a non-nil past the arguments)
    local g = Function {
      name = "long",
      forward = function(ctx, a) return a * 1 end,
      backward = function(ctx, gy) return gy, gy end,
    }
    H.raises(function() g(a):sum():backward() end, { "'long'", "returned 2 gradients for 1 forward argument" })
    -- trailing nils are fine
    local h = Function {
      name = "nils",
      forward = function(ctx, x) return x * 1 end,
      backward = function(ctx, gy) return gy, nil, nil end,
    }
    a.grad = nil
    h(a):sum():backward()
    assert.are.same({ 1, 1 }, a.grad:totable())
  end)

  it("a gradient of the wrong shape, or one for a non-tensor argument, names the Function", function()
    local f = Function {
      name = "badshape",
      forward = function(ctx, a) return a * 1 end,
      backward = function(ctx, g) return mp.zeros { 3 } end,
    }
    local a = mp.tensor({ 1, 2 }):requires_grad(true)
    H.raises(function() f(a):sum():backward() end,
      { "'badshape'", "gradient 1 has shape {3}, but forward argument 1 has shape {2}", "defined at" })
    local g = Function {
      name = "numgrad",
      forward = function(ctx, a, k) return a * k end,
      backward = function(ctx, gy) return gy, gy end,
    }
    H.raises(function() g(a, 2):sum():backward() end, { "'numgrad'", "gradient 2 must be nil", "a number" })
    local h = Function {
      name = "strgrad",
      forward = function(ctx, a) return a * 1 end,
      backward = function(ctx, gy) return "oops" end,
    }
    H.raises(function() h(a):sum():backward() end, { "'strgrad'", "gradient 1 is \"oops\"" })
  end)

  it("an error inside the backward names the Function and the line where it happened", function()
    local f = Function {
      name = "broken",
      forward = function(ctx, a) return a * 1 end,
      backward = function(ctx, g)
        return g:matmul(mp.zeros { 5, 5 })   -- BROKEN_LINE
      end,
    }
    local a = mp.tensor({ 1, 2 }):requires_grad(true)
    local msg = H.raises(function() f(a):sum():backward() end,
      { "mp.autograd.Function 'broken': backward failed at", "matmul" })
    assert.truthy(msg:find("autograd_function_spec.lua:" .. line_of("BROKEN_LINE"), 1, true), msg)
    local g = Function {
      name = "raiser",
      forward = function(ctx, a) return a * 1 end,
      backward = function(ctx, gy) error("no gradient today") end,   -- RAISER_LINE
    }
    msg = H.raises(function() g(a):sum():backward() end, { "'raiser'", "no gradient today" })
    assert.truthy(msg:find("autograd_function_spec.lua:" .. line_of("RAISER_LINE"), 1, true), msg)
    -- the engine is unharmed: grad mode, and a later backward
    assert.is_true(mp.is_grad_enabled())
    a.grad = nil
    swish(a, 1):sum():backward()
    assert.is_true(a.grad ~= nil)
  end)

  it("a second backward through a node whose saved tensors were freed says so", function()
    local x = mp.tensor(xs):requires_grad(true)
    local loss = swish(x, 1):sum()
    loss:backward()
    H.raises(function() loss:backward() end, { "swish", "second time" })
  end)

  it("frees the saved tensors when the node runs, and the tensors the backward saw", function()
    local n = 1 << 18   -- 1 MiB of f32
    local seen
    local f = Function {
      name = "hoarder",
      forward = function(ctx, x)
        ctx:save_for_backward(x * 2, mp.zeros { 4 * n })   -- 5 MiB kept for the backward
        return x * 3
      end,
      backward = function(ctx, g)
        seen = { saved = ctx.saved_tensors, g = g }
        return g * 3
      end,
    }
    local x = mp.zeros({ n }):requires_grad(true)
    local loss = f(x):sum()
    full_gc()   -- the forward's own wrappers are garbage: only the node holds the 5 MiB
    local before = mp.memory().in_use
    loss:backward()
    local after = mp.memory().in_use   -- no collection in between
    -- gone: 5 MiB saved and the 1 MiB output gradient the backward saw; new:
    -- x.grad and the backward's result (1 MiB each; its wrapper is the script's)
    local MiB = 1024 * 1024
    assert.is_true(after <= before - 3 * MiB,
      string.format("in use went from %d to %d bytes (expected at least 3 MiB less)", before, after))
    H.raises(function() return seen.saved[1]:sum() end, { "freed" })
    H.raises(function() return seen.g:sum() end, { "freed" })
  end)

  it("releases each call's Lua state with its node (the registry does not grow)", function()
    local function records()
      local c = 0
      for _, v in pairs(debug.getregistry()) do
        if type(v) == "table" and rawget(v, "ctx") and rawget(v, "run") then c = c + 1 end
      end
      return c
    end
    full_gc()
    local c0 = records()
    local x = mp.tensor(xs):requires_grad(true)
    for _ = 1, 200 do swish(x, 1) end
    local y = swish(x, 1)
    assert.is_true(records() >= c0 + 1)
    y = nil
    full_gc()
    assert.are.equal(c0, records())
  end)

  it("closing the Lua state with live nodes is clean", function()
    local r = H.child([[
      local mp = require "mp"
      local swish = mp.autograd.Function {
        name = "swish",
        forward = function(ctx, x) ctx:save_for_backward(x) return x * 2 end,
        backward = function(ctx, g) return g * 2 end,
      }
      local x = mp.tensor({ 1, 2 }):requires_grad(true)
      KEEP = { swish(x), swish(swish(x)) }
      print("built")
      os.exit(0, true)   -- close the state: finalizers free the nodes
    ]], true)
    assert.are.equal(0, r.rc, r.err)
    assert.truthy(r.out:find("built"))
  end)

  describe("under autocast", function()
    local seen
    local function mm(opts)
      return Function {
        name = "mm",
        cast_inputs = opts.cast_inputs,
        forward = function(ctx, a, b)
          ctx:save_for_backward(a, b)
          local y = a:matmul(b)
          seen = { a = a.dtype, b = b.dtype, fwd = y.dtype }
          return y
        end,
        backward = function(ctx, g)
          local a, b = table.unpack(ctx.saved_tensors)
          local ga = g:matmul(b:transpose(1, 2))
          seen.bwd = ga.dtype
          return ga, a:transpose(1, 2):matmul(g)
        end,
      }
    end

    it("without cast_inputs: forward and backward both run in the region's state", function()
      local f = mm {}
      local a = mp.tensor({ { 1, 2 }, { 3, 4 } }):requires_grad(true)
      local b = mp.tensor({ { 1, 0 }, { 0, 1 } }):requires_grad(true)
      local loss
      do
        local _ <close> = mp.amp.autocast("f16")
        loss = f(a, b):to("f32"):sum()
      end
      assert.are.equal("f16", seen.fwd)
      loss:backward()   -- outside the region: the backward still runs in the forward's state
      assert.are.equal("f16", seen.bwd)
      assert.are.equal("f32", a.grad.dtype)
      assert.are.same({ { 1, 1 }, { 1, 1 } }, a.grad:totable())
      assert.are.same({ { 4, 4 }, { 6, 6 } }, b.grad:totable())
      -- built-in ops of the same backward pass still run without autocast
      assert.is_false((core._function_autocast()))
    end)

    it("cast_inputs = \"f32\": the forward sees f32 inputs with autocast off, and so does the backward", function()
      local f = mm { cast_inputs = "f32" }
      local a = mp.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = "f16" }):requires_grad(true)
      local b = mp.tensor({ { 1, 0 }, { 0, 1 } }, { dtype = "f16" }):requires_grad(true)
      local y
      do
        local _ <close> = mp.amp.autocast("f16")
        y = f(a, b)
        assert.is_true((core._function_autocast()))   -- the region is back after the call
      end
      assert.are.same({ "f32", "f32", "f32" }, { seen.a, seen.b, seen.fwd })
      assert.are.equal("f32", y.dtype)
      y:sum():backward()
      assert.are.equal("f32", seen.bwd)
      assert.are.equal("f16", a.grad.dtype)   -- through the recorded cast, back to the leaf's dtype
      assert.are.same({ { 1, 1 }, { 1, 1 } }, a.grad:totable())
      -- outside a region cast_inputs changes nothing (as PyTorch's custom_fwd)
      f(a, b)
      assert.are.same({ "f16", "f16", "f16" }, { seen.a, seen.b, seen.fwd })
    end)
  end)

  it("refuses bad definitions and misuse of ctx, naming what is wrong", function()
    H.raises(function() Function "swish" end, { "mp.autograd.Function", "expected a table" })
    H.raises(function() Function { name = "", forward = print, backward = print } end, { "name must be" })
    H.raises(function() Function { name = "f", backward = print } end, { "'f'", "forward must be a function" })
    H.raises(function() Function { name = "f", forward = print, backward = 3 } end, { "backward must be a function" })
    H.raises(function() Function { name = "f", forward = print, backward = print, cast_inputs = "i32" } end,
      { "'f'", "cast_inputs must be a float dtype", "i32" })
    H.raises(function() Function { name = "f", forward = print, backward = print, setup = print } end,
      { "unknown option 'setup'" })
    local bad_save = Function {
      name = "bad_save",
      forward = function(ctx, x) ctx:save_for_backward(x, 5) return x end,
      backward = function(ctx, g) return g end,
    }
    H.raises(function() bad_save(mp.zeros { 2 }) end, { "ctx:save_for_backward", "argument 2 is 5" })
    local early = Function {
      name = "early",
      forward = function(ctx, x) return ctx.saved_tensors end,
      backward = function(ctx, g) return g end,
    }
    H.raises(function() early(mp.zeros { 2 }) end, { "ctx.saved_tensors: only in a Function's backward" })
  end)

  it("gathers mp.core's _autograd_<x> functions as mp.autograd.<x>", function()
    local probe = function() return "probe" end
    core._autograd_probe_fn = probe
    package.loaded["mp.autograd"] = nil
    local ok, A = pcall(require, "mp.autograd")
    core._autograd_probe_fn = nil
    package.loaded["mp.autograd"] = mp.autograd
    assert.is_true(ok, tostring(A))
    assert.are.equal(probe, A.probe_fn)
    assert.is_function(A.Function)
  end)
end)

describe("mp.autograd.Function under create_graph", function()
  local function fn_tanh(name, second)
    return mp.autograd.Function { name = name,
      forward = function(ctx, x)
        local y = mp.tanh(x)
        ctx:save_for_backward(y)
        if second then return y, x * 2 end
        return y
      end,
      backward = function(ctx, g, h)
        local y = ctx.saved_tensors[1]
        local gx = g * (1 - y * y)
        if h then gx = gx + h * 2 end
        return gx
      end }
  end

  it("a saved output is attached to the graph again: second derivatives are right (f64 gradgradcheck)", function()
    local T = fn_tanh("mytanh")
    local x = mp.tensor({ 0.3, -0.5, 1.2 }, { dtype = "f64", device = "cpu", requires_grad = true })   -- f64 lives on the CPU
    assert.is_true(mp.autograd.gradcheck(function(a) return T(a) end, { x }))
    assert.is_true(mp.autograd.gradgradcheck(function(a) return T(a) end, { x }))
  end)

  it("with several differentiable outputs a saved output is refused, naming the Function, only when asked", function()
    local T = fn_tanh("two_out", true)
    local x = mp.tensor({ 0.3, -0.5, 1.2 }, { dtype = "f64", device = "cpu", requires_grad = true })   -- f64 lives on the CPU
    assert.is_true(mp.autograd.gradcheck(function(a) return { T(a) } end, { x }))
    local ok, err = pcall(mp.autograd.gradgradcheck, function(a) return { T(a) } end, { x })
    assert.is_false(ok)
    assert.is_truthy(tostring(err):find("Function two_out saved one of its outputs", 1, true), tostring(err))
  end)
end)

describe("mp.autograd.Function's name", function()
  -- flush counts (mp.amp's telemetry) and mp.amp.diagnose's record keep a node's
  -- name past the node: a Function's name must outlive its nodes (under the
  -- sanitizers a freed name read here was a heap-use-after-free)
  it("outlives its nodes: the backward's flush counts name each Function after its nodes are freed", function()
    local core = require "mp.core"
    core._count_flush(true)
    core._flush_reset()
    for i = 1, 3 do
      local F = mp.autograd.Function { name = "named_" .. i,
        forward = function(ctx, x) return x * 2 end, backward = function(ctx, g) return g * 2 end }
      local x = mp.randn({ 4 }, { requires_grad = true })
      F(x):sum():backward()
      F, x = nil, nil
      collectgarbage()
      collectgarbage()
    end
    local stats = core._flush_stats(true)
    core._count_flush(false)
    for i = 1, 3 do assert.is_table(stats["named_" .. i], "named_" .. i) end
  end)
end)
