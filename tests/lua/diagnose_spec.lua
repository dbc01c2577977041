-- diagnose_spec.lua: mp.amp.diagnose (lua/mp/amp/lab.lua over engine/observe.c and
-- mp_autocast_suppress): the low-precision run against FP32 op by op names the first
-- op whose inf/NaN FP32 does not have, forward or backward; a clean step has none;
-- underflow shows where f16 flushes what FP32 keeps; the model's gradients and the
-- random state are left as they were; it works from scaler.on_skip; bad use is refused.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local function setup_model()
  mp.manual_seed(0)
  return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)), mp.randn { 8, 16 },
         mp.randint(0, 4, { 8 })
end

describe("mp.amp.diagnose", function()
  it("names a forward overflow: the first linear's f16 output, which FP32 keeps finite", function()
    local model, x, y = setup_model()
    local r = mp.amp.diagnose { model = model, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x * 1e5), y)
    end }
    assert.is_truthy(r.first, "no offending op")
    assert.are.equal("forward", r.first.kind)
    assert.is_truthy(r.first.name == "linear" or r.first.name == "to", r.first.name)
    assert.are.equal(0, r.first.nonfinite_f32)
    assert.is_nil(r.mismatch)
  end)

  it("names a backward overflow under a loss scale, and leaves gradients and randomness alone", function()
    local model, x, y = setup_model()
    local before = model[0] and nil
    local p1 = model:parameters()[1]
    p1.grad = mp.full(p1.shape, 7)
    local state = mp.get_rng_state()
    local r = mp.amp.diagnose { model = model, scale = 2 ^ 16, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x * 3000), y)
    end }
    assert.is_truthy(r.first)
    assert.are.equal("backward", r.first.kind)
    assert.are.equal(2 ^ 16, r.scale)
    assert.are.equal(7, p1.grad:max():item())
    assert.is_nil(model:parameters()[2].grad)
    assert.are.same(state, mp.get_rng_state())
    local params = 0
    for _, row in ipairs(r.rows) do if row.kind == "param" then params = params + 1 end end
    assert.are.equal(4, params)
  end)

  it("finds nothing in a clean step, and shows f16 flushing a tiny loss's gradients", function()
    local model, x, y = setup_model()
    local clean = mp.amp.diagnose { model = model, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x), y)
    end }
    assert.is_nil(clean.first)
    local tiny = mp.amp.diagnose { model = model, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x), y) * 2 ^ -30
    end }
    local worst = 0
    for _, row in ipairs(tiny.rows) do if row.kind == "backward" then worst = math.max(worst, row.underflow) end end
    assert.is_true(worst > 0.5, "f16 flushes most of the 2^-30 gradients: " .. worst)
  end)

  it("runs from scaler.on_skip and prints its table", function()
    local out = H.child([[
      local nn = mp.nn
      mp.manual_seed(0)
      local model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
      local opt = mp.optim.SGD(model:parameters(), {lr = 0.1})
      local sc = mp.amp.GradScaler{policy = mp.amp.policy.static(2^16)}
      local x, y = mp.randn{4, 8} * 1e5, mp.randint(0, 2, {4})
      local function loss_fn()
        local _ <close> = mp.amp.autocast("f16")
        return mp.cross_entropy(model(x), y)
      end
      local found
      sc.on_skip = function() found = mp.amp.diagnose{model = model, loss = loss_fn, scaler = sc} end
      opt:zero_grad()
      sc:scale(loss_fn()):backward()
      sc:step(opt)
      sc:update()
      return found and found.first and found.first.kind
    ]])
    assert.is_truthy(out.out:find("first inf/NaN that FP32 does not have", 1, true), out.out .. out.err)
    assert.is_truthy(out.out:find("OK:", 1, true), out.out .. out.err)
  end)

  it("refuses bad use", function()
    local model = setup_model()
    H.raises(function() mp.amp.diagnose { loss = function() end } end, { "mp.amp.diagnose", "model" })
    H.raises(function() mp.amp.diagnose { model = model } end, { "mp.amp.diagnose", "loss" })
    H.raises(function() mp.amp.diagnose { model = model, loss = function() return 1 end } end, { "loss tensor" })
    H.raises(function() mp.amp.diagnose { model = model, loss = function() end, bogus = 1 } end, { "bogus" })
  end)
end)
