-- module_hooks_spec.lua: Module:register_forward_pre_hook, register_forward_hook and
-- register_full_backward_hook (lua/mp/nn/module.lua), and the layerwise gradient
-- statistic of scripts/examples/grad_norms.lua.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local function lin(w, b)
  local m = nn.Linear(#w[1], #w)
  m:load_state_dict { weight = mp.tensor(w), bias = mp.tensor(b) }
  return m
end

describe("Module hooks", function()
  it("forward pre hooks see the inputs and may replace them, in registration order", function()
    local m = lin({ { 1, 0 }, { 0, 1 } }, { 0, 0 })
    local log = {}
    local h1 = m:register_forward_pre_hook(function(mod, x)
      assert.are.equal(m, mod)
      log[#log + 1] = "first"
      return x * 2
    end)
    local h2 = m:register_forward_pre_hook(function(_, x)
      log[#log + 1] = "second saw " .. math.tointeger(x:totable()[1][1])
    end)
    local y = m(mp.tensor { { 1, 2 } })
    assert.are.same({ "first", "second saw 2" }, log)
    assert.are.same({ { 2, 4 } }, y:totable())
    h1:remove()
    h1:remove()   -- twice: harmless
    log = {}
    y = m(mp.tensor { { 1, 2 } })
    assert.are.same({ "second saw 1" }, log)
    assert.are.same({ { 1, 2 } }, y:totable())
    h2:remove()
    assert.are.same({ { 1, 2 } }, m(mp.tensor { { 1, 2 } }):totable())
  end)

  it("forward hooks see inputs and output and may replace the output", function()
    local m = lin({ { 1, 0 }, { 0, 1 } }, { 1, 1 })
    local seen
    local h = m:register_forward_hook(function(mod, inputs, out)
      seen = { mod = mod, n = inputs.n, x = inputs[1]:totable(), out = out:totable() }
      return out * 10
    end)
    local h2 = m:register_forward_hook(function(_, _, out) seen.second = out:totable() end)
    local y = m(mp.tensor { { 1, 2 } })
    assert.are.equal(m, seen.mod)
    assert.are.equal(1, seen.n)
    assert.are.same({ { 1, 2 } }, seen.x)
    assert.are.same({ { 2, 3 } }, seen.out)
    assert.are.same({ { 20, 30 } }, seen.second)   -- the next hook sees the replacement
    assert.are.same({ { 20, 30 } }, y:totable())
    h:remove()
    h2:remove()
    assert.are.same({ { 2, 3 } }, m(mp.tensor { { 1, 2 } }):totable())
  end)

  it("a hook on a child runs when the parent calls it", function()
    local inner = nn.ReLU()
    local seq = nn.Sequential(lin({ { 1 } }, { -1 }), inner)
    local calls = 0
    inner:register_forward_hook(function() calls = calls + 1 end)
    seq(mp.tensor { { 3 } })
    seq(mp.tensor { { 5 } })
    assert.are.equal(2, calls)
  end)

  it("full backward hooks get grad_input and grad_output, and may replace grad_input", function()
    local w = { { 1, 2 }, { 3, 4 }, { 5, 6 } }
    local m = lin(w, { 0, 0, 0 })
    local seen = {}
    local h = m:register_full_backward_hook(function(mod, grad_input, grad_output)
      seen.mod = mod
      seen.gin = grad_input[1]:totable()
      seen.gout = grad_output[1]:totable()
      return { grad_input[1] * 0 + 7 }
    end)
    local order = {}
    local h2 = m:register_full_backward_hook(function(_, grad_input)
      order[#order + 1] = grad_input[1]:totable()[1][1]   -- sees the first hook's replacement
    end)
    local x = mp.tensor({ { 1, 1 } }):requires_grad(true)
    local c = mp.tensor { { 1, 10, 100 } }
    ;(m(x) * c):sum():backward()
    assert.are.equal(m, seen.mod)
    assert.are.same({ { 1, 10, 100 } }, seen.gout)
    assert.are.same({ { 1 + 30 + 500, 2 + 40 + 600 } }, seen.gin)   -- c W
    assert.are.same({ 7 }, order)
    assert.are.same({ { 7, 7 } }, x.grad:totable())             -- the replacement went on
    assert.are.same({ { 1, 1 }, { 10, 10 }, { 100, 100 } }, m.weight.grad:totable())   -- untouched
    h:remove()
    h2:remove()
    x.grad = nil
    ;(m(x) * c):sum():backward()
    assert.are.same({ { 531, 642 } }, x.grad:totable())
  end)

  it("a full backward hook on a module whose input needs no gradient gets an empty grad_input", function()
    local m = lin({ { 2 } }, { 0 })
    local seen
    m:register_full_backward_hook(function(_, grad_input, grad_output)
      seen = { gin1 = grad_input[1], gout = grad_output[1]:totable() }
    end)
    m(mp.tensor { { 3 } }):sum():backward()
    assert.is_nil(seen.gin1)
    assert.are.same({ { 1 } }, seen.gout)
    assert.are.same({ { 3 } }, m.weight.grad:totable())
  end)

  it("a per-layer gradient-norm table with full backward hooks matches the chain rule", function()
    local l1 = lin({ { 1, -1 }, { 2, 1 } }, { 0, -10 })   -- second unit: relu cuts it
    local l2 = lin({ { 1, 3 } }, { 0 })
    local model = nn.Sequential(l1, nn.ReLU(), l2)
    local norms = {}
    local handles = {}
    for name, m in pairs { l1 = l1, l2 = l2 } do
      handles[#handles + 1] = m:register_full_backward_hook(function(_, gin, gout)
        local function norm(t) return math.sqrt((t * t):sum():item()) end
        norms[name] = { out = norm(gout[1]), inp = norm(gin[1]) }
      end)
    end
    local x = mp.tensor({ { 3, 1 } }):requires_grad(true)
    model(x):sum():backward()
    -- l2: grad_output 1, grad_input W2 = (1, 3); relu keeps unit 1 only: (1, 0);
    -- l1: grad_output (1, 0), grad_input (1, 0) W1 = (1, -1)
    assert.is_true(H.close(norms.l2.out, 1))
    assert.is_true(H.close(norms.l2.inp, math.sqrt(10)))
    assert.is_true(H.close(norms.l1.out, 1))
    assert.is_true(H.close(norms.l1.inp, math.sqrt(2)))
    assert.are.same({ { 1, -1 } }, x.grad:totable())
    for _, h in ipairs(handles) do h:remove() end
    norms = {}
    model(x):sum():backward()
    assert.is_nil(next(norms))
  end)

  it("scripts/examples/grad_norms.lua prints a row per Linear layer and step", function()
    local out, status = H.script(H.root .. "/scripts/examples/grad_norms.lua")("2")
    assert.are.equal(0, status, out)
    local rows = 0
    for layer, step, go, gi in out:gmatch("\n(%d+)%s+(%d+)%s+(%S+)%s+(%S+)") do
      rows = rows + 1
      go, gi = tonumber(go), tonumber(gi)
      assert.is_true(go > 0 and go < math.huge and gi > 0 and gi < math.huge, out)
    end
    assert.are.equal(6, rows, out)   -- 3 layers x 2 steps
  end)

  it("refuses a hook that is not a function, naming the method", function()
    local m = nn.ReLU()
    H.raises(function() m:register_forward_hook(3) end,
      { "mp.nn.Module:register_forward_hook", "hook must be a function", "3" })
    H.raises(function() m:register_forward_pre_hook("f") end, { "register_forward_pre_hook", "hook must be a function" })
    H.raises(function() m:register_full_backward_hook() end, { "register_full_backward_hook", "nil" })
    local lin1 = lin({ { 1 } }, { 0 })
    lin1:register_full_backward_hook(function() return 5 end)
    H.raises(function() lin1(mp.tensor({ { 1 } }):requires_grad(true)):sum():backward() end,
      { "full backward hook returned 5" })
  end)
end)
