-- param_groups_spec.lua: parameter groups in every optimizer (engine/optim.c groups,
-- lua/mp/optim.lua): per-group hyperparameters equal to separate optimizers, live
-- group views, state_dict round trips, schedules per group, the weight-decay helper
-- and errors.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local function leaf(shape, seed)
  mp.manual_seed(seed)
  return mp.randn(shape):requires_grad(true)
end

local function set_grads(ps, step)
  for i, p in ipairs(ps) do
    mp.manual_seed(100 * step + i)
    p.grad = mp.randn(p.shape)
  end
end

describe("parameter groups", function()
  for _, kind in ipairs { "SGD", "Adam", "AdamW" } do
    it(kind .. ": two groups step exactly as two optimizers with those settings", function()
      local a1, a2 = leaf({ 3, 4 }, 1), leaf({ 5 }, 2)
      local b1, b2 = leaf({ 3, 4 }, 1), leaf({ 5 }, 2)
      local extra = kind == "SGD" and { momentum = 0.9 } or {}
      local base = { lr = 0.1 }
      for k, v in pairs(extra) do base[k] = v end
      local g1 = { params = { a1 }, weight_decay = 0.1 }
      local g2 = { params = { a2 }, lr = 0.01, weight_decay = 0 }
      if kind ~= "SGD" then g2.betas = { 0.8, 0.95 } end
      local grouped = mp.optim[kind]({ g1, g2 }, base)
      local o1 = mp.optim[kind]({ b1 }, { lr = 0.1, weight_decay = 0.1, momentum = extra.momentum })
      local o2opts = { lr = 0.01, weight_decay = 0, momentum = extra.momentum }
      if kind ~= "SGD" then o2opts.betas = { 0.8, 0.95 } end
      local o2 = mp.optim[kind]({ b2 }, o2opts)
      for step = 1, 4 do
        set_grads({ a1, a2 }, step)
        set_grads({ b1, b2 }, step)
        grouped:step()
        o1:step()
        o2:step()
      end
      H.assert_same(a1:totable(), b1:totable(), "group 1")
      H.assert_same(a2:totable(), b2:totable(), "group 2")
      assert.are.equal(2, grouped.ngroups)
    end)
  end

  it("param_groups() are live views; opt.lr reads group 1 and sets every group", function()
    local p, q = leaf({ 2 }, 1), leaf({ 2 }, 2)
    local opt = mp.optim.AdamW({ { params = { p } }, { params = { q }, weight_decay = 0 } }, { lr = 0.5 })
    local g = opt:param_groups()
    assert.are.same({ 0.5, 0.01, 1 }, { g[1].lr, g[1].weight_decay, g[1].size })
    assert.are.same({ 0.5, 0 }, { g[2].lr, g[2].weight_decay })
    g[2].lr = 0.25
    assert.are.equal(0.25, opt:param_groups()[2].lr)
    assert.are.equal(0.5, opt.lr)
    opt.lr = 0.125
    assert.are.same({ 0.125, 0.125 }, { g[1].lr, g[2].lr })
    H.raises(function() g[1].lr = -1 end, { "lr must be a finite number >= 0" })
    assert.are.equal(0.125, g[1].lr)
  end)

  it("state_dict keeps each group's settings and parameter indices; a load continues exactly", function()
    local function make(seed)
      local p, q = leaf({ 3 }, seed), leaf({ 2, 2 }, seed + 1)
      return { p, q }, mp.optim.Adam({ { params = { p }, lr = 0.1 }, { params = { q }, lr = 0.02, eps = 1e-6 } })
    end
    local ps, opt = make(1)
    for step = 1, 3 do set_grads(ps, step); opt:step() end
    local sd = opt:state_dict()
    assert.are.equal(2, #sd.param_groups)
    assert.are.same({ 0 }, sd.param_groups[1].params)
    assert.are.same({ 1 }, sd.param_groups[2].params)
    assert.are.same({ 0.02, 1e-6 }, { sd.param_groups[2].lr, sd.param_groups[2].eps })
    local qs, opt2 = make(1)
    for i = 1, 2 do qs[i]:detach():copy_(ps[i]) end
    local p2 = opt2:param_groups()
    p2[2].lr = 0.5
    opt2:load_state_dict(sd)
    assert.are.equal(0.02, p2[2].lr)
    for step = 4, 5 do
      set_grads(ps, step); opt:step()
      set_grads(qs, step); opt2:step()
    end
    for i = 1, 2 do H.assert_same(qs[i]:totable(), ps[i]:totable(), "param " .. i) end
    local single = mp.optim.Adam({ leaf({ 3 }, 9) })
    H.raises(function() single:load_state_dict(sd) end, { "2 parameter groups, this optimizer 1" })
  end)

  it("a schedule moves every group from its own peak lr", function()
    local opt = mp.optim.SGD({ { params = { leaf({ 2 }, 1) } }, { params = { leaf({ 2 }, 2) }, lr = 0.01 } }, { lr = 0.1 })
    opt:set_schedule(mp.optim.schedule.cosine { warmup = 2, total = 10, min_lr = 0 })
    local g = opt:param_groups()
    H.assert_close({ g[1].lr, g[2].lr }, { 0.05, 0.005 }, 1e-12, 0, "warmup step 1")
    for _ = 1, 6 do opt:step() end
    local f = 0.5 * (1 + math.cos(math.pi * 4 / 8))
    H.assert_close({ g[1].lr, g[2].lr }, { 0.1 * f, 0.01 * f }, 1e-12, 0, "cosine")
  end)

  it("a schedule may be a Lua function of the step: a factor of each group's peak lr", function()
    local opt = mp.optim.SGD({ { params = { leaf({ 2 }, 1) } }, { params = { leaf({ 2 }, 2) }, lr = 0.01 } }, { lr = 0.1 })
    opt:set_schedule(function(step) return 1 / (step + 1) end)
    local g = opt:param_groups()
    H.assert_close({ g[1].lr, g[2].lr }, { 0.1, 0.01 }, 1e-12, 0, "step 0")
    for _ = 1, 3 do opt:step() end
    H.assert_close({ g[1].lr, g[2].lr }, { 0.025, 0.0025 }, 1e-12, 0, "step 3")
    local sd = opt:state_dict()
    assert.are.equal(3, sd.param_groups[1].schedule_count)
    local bad = mp.optim.SGD({ leaf({ 2 }, 3) }, { lr = 0.1 })
    H.raises(function() bad:set_schedule(function() return -1 end) end, { "returned -1" })
    H.raises(function() bad:set_schedule(42) end, { "function of the step" })
  end)

  it("decay_groups: Linear weights decay; biases, norms, embeddings and tied weights do not", function()
    local nn = mp.nn
    local Tied = nn.Module:extend("Tied")
    function Tied:init()
      self.emb = nn.Embedding(10, 4)
      self.fc = nn.Linear(4, 4)
      self.ln = nn.LayerNorm(4)
      self.head = nn.Linear(4, 10, { bias = false })
      self.head.weight = self.emb.weight   -- the output layer tied to the embedding
    end
    local m = Tied()
    local groups = mp.optim.decay_groups(m, 0.1)
    assert.are.equal(2, #groups)
    assert.are.same({ 0.1, 0 }, { groups[1].weight_decay, groups[2].weight_decay })
    assert.are.equal(1, #groups[1].params)
    assert.is_true(groups[1].params[1] == m.fc.weight)
    local kept = {}
    for _, p in ipairs(groups[2].params) do kept[p] = true end
    for _, p in ipairs { m.emb.weight, m.fc.bias, m.ln.weight, m.ln.bias } do assert.is_true(kept[p]) end
    local opt = mp.optim.AdamW(groups, { lr = 1e-3 })
    assert.are.same({ 0.1, 0 }, { opt:param_groups()[1].weight_decay, opt:param_groups()[2].weight_decay })
    H.raises(function() mp.optim.decay_groups({}, 0.1) end, { "mp.optim.decay_groups", "module" })
    H.raises(function() mp.optim.decay_groups(m, -1) end, { "weight_decay" })
  end)

  it("bad groups are errors naming the group", function()
    local p = leaf({ 2 }, 1)
    H.raises(function() mp.optim.SGD({ { params = { p }, lrr = 1 } }, { lr = 0.1 }) end, { "group 1", "unknown option 'lrr'" })
    H.raises(function() mp.optim.SGD({ { params = { p } }, { params = {} } }, { lr = 0.1 }) end, { "group 2 has no parameters" })
    H.raises(function() mp.optim.Adam({ { params = { p }, lr = -1 } }) end, { "lr must be" })
    H.raises(function() mp.optim.Adam({ { params = { p }, betas = 3 } }) end, { "betas" })
    H.raises(function() mp.optim.SGD({ { params = { p } }, { params = { p } } }, { lr = 0.1 }) end, {})
  end)
end)
