-- optim_spec.lua: mp.optim (SGD, Adam, AdamW, RMSprop, Adagrad, clip_grad_norm) against torch.optim
-- and on its own terms: grads from backward vs assigned, zero_grad, lr changes,
-- state_dict round trips through mp.save/mp.load, clipping, and argument checks.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/optim_spec.lua
-- OPTIM_REPORT=1 prints the worst error per configuration at the end.
--
-- The fixtures (tests/reference/fixtures/optim_*.safetensors, made by
-- tests/reference/make_optim_fixtures.py; see tests/reference/README.md) hold
-- PyTorch 1.13's float32 run of each configuration: two parameters, five
-- gradients each, the parameters after every step and the final state.
--
-- The norms, per tensor:
--   parameters (after every step):  max_i |ours_i - ref_i| / max(max_i |ref_i|, 1) <= 1e-6
--   optimizer state (final):        max_i |ours_i - ref_i| / max_i |ref_i|          <= 1e-6
-- PyTorch's own float32 run is within 1.9e-7 (parameters) and 2.3e-7 (state) of
-- the same run in float64 (the generator prints both), so 1e-6 leaves room for a
-- different but equally good order of rounding (FMA or not) and no more.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local DIR = H.root .. "/tests/reference/fixtures/"
local TOL = 1e-6
local NAMES = { "p1", "p2" }

local CONFIGS = {
  "sgd_plain", "sgd_momentum", "sgd_momentum_damp_wd", "sgd_nesterov",
  "adam_default", "adam_wd_betas_eps", "adamw_default", "adamw_lr_wd",
  "sgd_momentum_lr_change", "adam_lr_change",
  "rmsprop_default", "rmsprop_momentum_wd", "rmsprop_centered", "rmsprop_centered_momentum",
  "adagrad_default", "adagrad_decay_wd_init",
}

---------------------------------------------------------------- helpers

local function values(t)
  local v = t:totable()
  if type(v) == "number" then return { v } end
  return H.flat(v)
end

-- max |a - b| / max(max |b|, floor)
local function err(a, b, floor)
  local va, vb = values(a), values(b)
  assert(#va == #vb, string.format("%d elements, expected %d", #va, #vb))
  local d, m = 0, floor
  for i = 1, #vb do
    local x = math.abs(va[i] - vb[i])
    if x ~= x then x = math.huge end
    if x > d then d = x end
    if math.abs(vb[i]) > m then m = math.abs(vb[i]) end
  end
  return d / m
end

-- max |a - b|
local function maxdiff(a, b)
  local va, vb = values(a), values(b)
  local d = 0
  for i = 1, #vb do d = math.max(d, math.abs(va[i] - vb[i])) end
  return d
end

-- the raw f32 bits of a tensor, as one string
local function bits(t)
  local out = {}
  for i, v in ipairs(values(t)) do out[i] = string.pack("<f", v) end
  return table.concat(out)
end

local function assert_bits(a, b, what)
  local sa, sb = bits(a), bits(b)
  if sa ~= sb then
    local va, vb = values(a), values(b)
    for i = 1, #vb do
      if string.pack("<f", va[i]) ~= string.pack("<f", vb[i]) then
        error(string.format("%s: element %d is %.9g, expected %.9g (bit-identical)", what, i, va[i], vb[i]), 2)
      end
    end
    error(what .. ": differ", 2)
  end
end

local function shape_str(t) return "{" .. table.concat(t.shape, ",") .. "}" end

local cache = {}
local function fixture(name)
  if not cache[name] then
    local t, meta = mp.load(DIR .. "optim_" .. name .. ".safetensors")
    assert(meta and meta.optimizer, "optim_" .. name .. ": no metadata")
    cache[name] = { t = t, meta = meta }
  end
  return cache[name].t, cache[name].meta
end

-- fresh leaf parameters (f32, requires_grad) with the fixture's initial values
local function fresh_params(t)
  local ps = {}
  for i, n in ipairs(NAMES) do ps[i] = mp.tensor(t["init." .. n]):requires_grad(true) end
  return ps
end

-- copies of tensors as fresh leaf parameters
local function copies(ps)
  local r = {}
  for i, p in ipairs(ps) do r[i] = mp.tensor(p:detach()):requires_grad(true) end
  return r
end

-- the optimizer of a fixture's configuration; *_default configs pass no options at all
local function make_opt(name, meta, params)
  local lr, wd = tonumber(meta.lr), tonumber(meta.weight_decay)
  if meta.optimizer == "SGD" then
    return mp.optim.SGD(params, {
      lr = lr, momentum = tonumber(meta.momentum), dampening = tonumber(meta.dampening),
      weight_decay = wd, nesterov = meta.nesterov == "true",
    })
  end
  if name:match("_default$") then return mp.optim[meta.optimizer](params) end
  if meta.optimizer == "RMSprop" then
    return mp.optim.RMSprop(params, {
      lr = lr, alpha = tonumber(meta.alpha), eps = tonumber(meta.eps), weight_decay = wd,
      momentum = tonumber(meta.momentum), centered = meta.centered == "true",
    })
  end
  if meta.optimizer == "Adagrad" then
    return mp.optim.Adagrad(params, {
      lr = lr, lr_decay = tonumber(meta.lr_decay), weight_decay = wd, eps = tonumber(meta.eps),
      initial_accumulator_value = tonumber(meta.initial_accumulator_value),
    })
  end
  return mp.optim[meta.optimizer](params, {
    lr = lr, betas = { tonumber(meta.beta1), tonumber(meta.beta2) }, eps = tonumber(meta.eps), weight_decay = wd,
  })
end

local function lrs(meta)
  local r = {}
  for x in meta.lrs:gmatch("[^,]+") do r[#r + 1] = tonumber(x) end
  return r
end

local function assign(t, ps, k)
  for i, n in ipairs(NAMES) do ps[i].grad = t["grad." .. n .. "." .. k] end
end

local function state_keys(meta)
  if meta.optimizer == "Adagrad" then return { "sum" } end
  if meta.optimizer == "RMSprop" then
    local k = { "square_avg" }
    if tonumber(meta.momentum) > 0 then k[#k + 1] = "momentum_buffer" end
    if meta.centered == "true" then k[#k + 1] = "grad_avg" end
    return k
  end
  if meta.optimizer ~= "SGD" then return { "exp_avg", "exp_avg_sq" } end
  if tonumber(meta.momentum) ~= 0 then return { "momentum_buffer" } end
  return {}
end

local function sgd_params()
  return { mp.tensor({ { 1, -2, 3 }, { 0.5, 0.25, -4 } }):requires_grad(true), mp.tensor({ 0.1, -0.2 }):requires_grad(true) }
end

local REPORT = {}

---------------------------------------------------------------- specs

describe("mp.optim", function()
  before_each(function() mp.set_grad_enabled(true) end)

  teardown(function()
    if os.getenv("OPTIM_REPORT") then
      io.stderr:write("\noptim_spec: worst error per configuration (params: /max(|ref|,1); state: /max|ref|)\n")
      for _, name in ipairs(CONFIGS) do
        local r = REPORT[name]
        if r then
          io.stderr:write(string.format("  %-24s params %.3g (%.3g of the distance moved)   state %.3g%s\n",
            name, r.params, r.moved, r.state,
            r.state_worst and ("  (" .. r.state_worst .. ")") or ""))
        end
      end
    end
  end)

  describe("against torch.optim (PyTorch 1.13, float32)", function()
    for _, name in ipairs(CONFIGS) do
      it(name .. ": parameters after every step and the final state", function()
        local t, meta = fixture(name)
        local ps = fresh_params(t)
        local opt = make_opt(name, meta, ps)
        local schedule = lrs(meta)
        local worst, worst_state, where, worst_moved = 0, 0, nil, 0
        local failures = {}
        for k = 1, tonumber(meta.steps) do
          if opt.lr ~= schedule[k] then opt.lr = schedule[k] end
          assert.are.equal(schedule[k], opt.lr)
          assign(t, ps, k)
          opt:step()
          for i, n in ipairs(NAMES) do
            local ref = t["param." .. n .. "." .. k]
            local e = err(ps[i], ref, 1)
            worst = math.max(worst, e)
            -- for the report only: the error relative to how far the parameter has moved
            worst_moved = math.max(worst_moved, maxdiff(ps[i], ref) / maxdiff(ref, t["init." .. n]))
            if e > TOL then failures[#failures + 1] = string.format("%s after step %d: %.3g", n, k, e) end
          end
        end
        assert.are.equal(tonumber(meta.steps), opt.step_count)
        local sd = opt:state_dict()
        for i, n in ipairs(NAMES) do
          for _, key in ipairs(state_keys(meta)) do
            local ref = t["state." .. n .. "." .. key]
            assert.is_not_nil(ref, "fixture has no state." .. n .. "." .. key)
            local got = sd.state[i - 1] and sd.state[i - 1][key]   -- PyTorch's 0-based ids
            assert.is_not_nil(got, "state_dict has no state[" .. i - 1 .. "]." .. key)
            assert.are.same(ref.shape, got.shape)
            local e = err(got, ref, 0)
            if e > worst_state then worst_state, where = e, n .. "." .. key end
            if e > TOL then failures[#failures + 1] = string.format("state %s.%s: %.3g", n, key, e) end
          end
        end
        REPORT[name] = { params = worst, state = worst_state, state_worst = where, moved = worst_moved }
        assert(#failures == 0, name .. ": over " .. TOL .. ": " .. table.concat(failures, "; "))
      end)
    end

    it("the defaults are PyTorch's: Adam lr 1e-3, betas (0.9, 0.999), eps 1e-8, wd 0; AdamW wd 0.01; SGD 0s", function()
      local a = mp.optim.Adam(sgd_params())
      assert.are.same({ 1e-3, 0.9, 0.999, 1e-8, 0 }, { a.lr, a.beta1, a.beta2, a.eps, a.weight_decay })
      local w = mp.optim.AdamW(sgd_params())
      assert.are.same({ 1e-3, 0.9, 0.999, 1e-8, 0.01 }, { w.lr, w.beta1, w.beta2, w.eps, w.weight_decay })
      local s = mp.optim.SGD(sgd_params(), { lr = 0.1 })
      assert.are.same({ 0.1, 0, 0, 0, false }, { s.lr, s.momentum, s.dampening, s.weight_decay, s.nesterov })
      assert.are.equal(0, s.step_count)
    end)
  end)

  describe("gradients", function()
    for _, name in ipairs({ "sgd_momentum_damp_wd", "adamw_lr_wd", "adam_wd_betas_eps" }) do
      it(name .. ": gradients from backward (loss = sum(p*c)) give the same steps as assigning c", function()
        local t, meta = fixture(name)
        local pa, pb = fresh_params(t), fresh_params(t)
        local oa, ob = make_opt(name, meta, pa), make_opt(name, meta, pb)
        for k = 1, tonumber(meta.steps) do
          assign(t, pa, k)
          oa:step()
          ob:zero_grad()
          local loss
          for i, n in ipairs(NAMES) do
            local term = (pb[i] * t["grad." .. n .. "." .. k]):sum()
            loss = loss and loss + term or term
          end
          loss:backward()
          for i, n in ipairs(NAMES) do
            assert_bits(pb[i].grad, t["grad." .. n .. "." .. k], "backward's " .. n .. ".grad at step " .. k)
          end
          ob:step()
          for i, n in ipairs(NAMES) do
            assert_bits(pb[i], pa[i], n .. " after step " .. k)
            assert(err(pb[i], t["param." .. n .. "." .. k], 1) <= TOL)
          end
        end
      end)
    end

    it("backward accumulates into the arena: .grad stays a view of the optimizer's gradients", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 0.5 })
      local c = mp.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
      ;(ps[1] * c):sum():backward()
      ;(ps[1] * c):sum():backward()   -- accumulates: 2c
      local arena = opt:_views("grads")
      assert.are.same({ { 2, 4, 6 }, { 8, 10, 12 } }, ps[1].grad:totable())
      assert.are.same({ { 2, 4, 6 }, { 8, 10, 12 } }, arena[1]:totable())
      opt:step()
      assert.are.same({ { 0, -4, 0 }, { -3.5, -4.75, -10 } }, ps[1]:totable())
      assert.are.same({ H.f32(0.1), H.f32(-0.2) }, ps[2]:totable())   -- no gradient: zeros in the arena
    end)

    it("the parameters keep their identity and values when the optimizer packs them", function()
      local ps = sgd_params()
      local before = { values(ps[1]), values(ps[2]) }
      local keep = ps[1]
      local opt = mp.optim.SGD(ps, { lr = 0.1 })
      assert.is_true(rawequal(keep, ps[1]))
      assert.are.same(before[1], values(ps[1]))
      assert.are.same(before[2], values(ps[2]))
      assert.is_true(ps[1].is_leaf)
      assert.are.same({ 2, 3 }, ps[1].shape)
      assert.are.same(values(opt:_views("values")[1]), values(ps[1]))
    end)

    it("zero_grad zeroes the arena and every .grad view", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      ;((ps[1] * 3):sum() + (ps[2] * ps[2]):sum()):backward()
      assert.are.same({ 3, 3, 3, 3, 3, 3 }, values(ps[1].grad))
      assert.are_not.same({ 0, 0 }, values(ps[2].grad))
      local g1 = ps[1].grad
      opt:zero_grad()
      assert.are.same({ 0, 0, 0, 0, 0, 0 }, values(ps[1].grad))
      assert.are.same({ 0, 0 }, values(ps[2].grad))
      assert.are.same({ 0, 0, 0, 0, 0, 0 }, values(g1))    -- the old reference is the same view
      for _, v in ipairs(opt:_views("grads")) do
        for _, x in ipairs(values(v)) do assert.are.equal(0, x) end
      end
      -- a step after zero_grad leaves the parameters alone (SGD, no weight decay)
      local before = values(ps[1])
      opt:step()
      assert.are.same(before, values(ps[1]))
    end)

    it("zero_grad re-points a .grad the script replaced, leaving the script's tensor alone", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      local mine = mp.tensor({ 7, 8 })
      ps[2].grad = mine
      opt:zero_grad()
      assert.is_false(rawequal(mine, ps[2].grad))
      assert.are.same({ 7, 8 }, values(mine))
      assert.are.same({ 0, 0 }, values(ps[2].grad))
      -- .grad is a view again: writing into it writes the arena, and step uses it
      ps[2].grad:copy_(mp.tensor({ 1, 2 }))
      assert.are.same({ 1, 2 }, values(opt:_views("grads")[2]))
      opt:step()
      assert.are.same({ H.f32(H.f32(0.1) - 1), H.f32(H.f32(-0.2) - 2) }, values(ps[2]))
    end)

    -- PyTorch: making an optimizer does not touch .grad, and the first step uses it.
    -- engine/optim.c copies an existing .grad into the arena, then zeroes the arena
    it("a .grad that exists when the optimizer is made is used by the first step", function()
      local ps = sgd_params()
      ;(ps[2] * mp.tensor({ 1, -1 })):sum():backward()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      assert.are.same({ 1, -1 }, values(ps[2].grad), ".grad from before the optimizer was made was zeroed")
      opt:step()
      assert.are.same({ H.f32(H.f32(0.1) - 1), H.f32(H.f32(-0.2) + 1) }, values(ps[2]))
    end)

    it("a .grad assigned before each step is used by that step (copied in), then reads its values", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      ps[2].grad = mp.tensor({ 1, 1 })
      opt:step()
      assert.are.same({ 1, 1 }, values(ps[2].grad))
      ps[2].grad = mp.tensor({ 2, -2 })
      opt:step()
      assert.are.same({ 2, -2 }, values(ps[2].grad))
      assert.are.same({ H.f32(H.f32(H.f32(0.1) - 1) - 2), H.f32(H.f32(H.f32(-0.2) - 1) + 2) }, values(ps[2]))
      -- and the arena holds them: zero_grad then zeroes what step used
      assert.are.same({ 2, -2 }, values(opt:_views("grads")[2]))
      opt:zero_grad()
      assert.are.same({ 0, 0 }, values(ps[2].grad))
    end)

    -- PyTorch 1.13 skips a parameter whose .grad is None (no update, no weight decay,
    -- no state change); a stale gradient left in the arena must not be applied
    it("a parameter whose .grad was set to nil is skipped by step, as in PyTorch", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      ps[2].grad = mp.tensor({ 1, 1 })
      opt:step()
      local after1 = values(ps[2])
      ps[2].grad = nil
      opt:step()
      assert.are.same(after1, values(ps[2]), "step applied the stale arena gradient to a parameter whose .grad is nil")
    end)
  end)

  describe("hyperparameters", function()
    it("opt.lr reads and writes the engine's value; the next step uses the new lr", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      ps[2].grad = mp.tensor({ 1, -1 })
      opt:step()
      opt.lr = 0.25
      assert.are.equal(0.25, opt.lr)
      ps[2].grad = mp.tensor({ 1, -1 })
      opt:step()
      assert.are.same({ H.f32(H.f32(H.f32(0.1) - 1) - 0.25), H.f32(H.f32(H.f32(-0.2) + 1) + 0.25) }, values(ps[2]))
      opt.lr = 0
      opt:step()   -- lr 0: nothing moves
      assert.are.same({ H.f32(H.f32(H.f32(0.1) - 1) - 0.25), H.f32(H.f32(H.f32(-0.2) + 1) + 0.25) }, values(ps[2]))
    end)

    it("the other hyperparameters read and write too (momentum, weight_decay, beta1, beta2, eps)", function()
      local a = mp.optim.Adam(sgd_params(), { lr = 0.01 })
      a.beta1, a.beta2, a.eps, a.weight_decay = 0.5, 0.75, 1e-4, 0.125
      assert.are.same({ 0.5, 0.75, 1e-4, 0.125 }, { a.beta1, a.beta2, a.eps, a.weight_decay })
      local s = mp.optim.SGD(sgd_params(), { lr = 0.01 })
      s.momentum = 0.5
      assert.are.equal(0.5, s.momentum)
    end)
  end)

  describe("state_dict", function()
    local function roundtrip(name, transform)
      local t, meta = fixture(name)
      local pa = fresh_params(t)
      local A = make_opt(name, meta, pa)
      for k = 1, 3 do
        assign(t, pa, k)
        A:step()
      end
      local path = os.tmpname()
      local sd = A:state_dict()
      mp.save(path, { optim = transform and transform(sd) or sd })
      local loaded = mp.load(path)
      os.remove(path)
      assert.is_table(loaded.optim)
      local pb = copies(pa)
      local B = make_opt(name, meta, pb)
      B:load_state_dict(loaded.optim)
      assert.are.equal(3, B.step_count)
      for k = 4, 5 do
        assign(t, pa, k)
        assign(t, pb, k)
        A:step()
        B:step()
        for i, n in ipairs(NAMES) do assert_bits(pb[i], pa[i], n .. " after step " .. k) end
      end
      local sa, sb = A:state_dict(), B:state_dict()
      for i = 1, #NAMES do
        for _, key in ipairs(state_keys(meta)) do
          assert_bits(sb.state[i - 1][key], sa.state[i - 1][key], "state[" .. i - 1 .. "]." .. key)
        end
      end
      return A, B
    end

    for _, name in ipairs({ "sgd_momentum_damp_wd", "sgd_nesterov", "adam_wd_betas_eps", "adamw_lr_wd",
                            "rmsprop_centered_momentum", "adagrad_decay_wd_init" }) do
      it(name .. ": state_dict -> mp.save -> mp.load -> load_state_dict continues bit-identically", function()
        roundtrip(name)
      end)
    end

    -- the layout written before state ids became PyTorch's 0-based ones: state[1..n], params {1..n}
    local function old_layout(sd)
      local state = {}
      for i, st in pairs(sd.state) do state[i + 1] = st end
      for _, g in ipairs(sd.param_groups) do
        for j, id in ipairs(g.params) do g.params[j] = id + 1 end
      end
      sd.state = state
      return sd
    end
    for _, name in ipairs({ "adam_wd_betas_eps", "sgd_momentum_damp_wd", "rmsprop_centered_momentum" }) do
      it(name .. ": a checkpoint in the old 1-based layout still loads and continues bit-identically", function()
        roundtrip(name, old_layout)
      end)
    end

    it("state keys that are neither 0..n-1 nor 1..n are refused, naming the keys", function()
      local ps = sgd_params()
      local opt = mp.optim.Adam(ps, { lr = 0.01 })
      for _, p in ipairs(ps) do p.grad = mp.ones(p.shape) end
      opt:step()
      local sd = opt:state_dict()
      sd.state[5], sd.state[1] = sd.state[1], nil
      local ok, err = pcall(opt.load_state_dict, opt, sd)
      assert.is_false(ok)
      assert.matches("state keys must be 0..1 %(got 0..5%)", err)
      sd = opt:state_dict()
      sd.state.x = sd.state[0]
      ok, err = pcall(opt.load_state_dict, opt, sd)
      assert.is_false(ok)
      assert.matches("state keys must be parameter indices %(got x%)", err)
    end)

    it("layout: {state = {[i] = {exp_avg=, exp_avg_sq=}}, param_groups = {{lr=, step=, ...}}} with copies", function()
      local ps = sgd_params()
      local opt = mp.optim.Adam(ps, { lr = 0.01 })
      ps[1].grad = mp.ones({ 2, 3 })
      opt:step()
      local sd = opt:state_dict()
      local keys = {}
      for k in pairs(sd.state) do keys[#keys + 1] = k end
      table.sort(keys)
      assert.are.same({ 0, 1 }, keys)   -- PyTorch's integer ids, 0-based in parameter order
      assert.are.same({ 0, 1 }, sd.param_groups[1].params)
      assert.are.same({ 2, 3 }, sd.state[0].exp_avg.shape)
      assert.are.same({ 2 }, sd.state[1].exp_avg_sq.shape)
      assert.are.equal(1, #sd.param_groups)
      assert.are.equal(0.01, sd.param_groups[1].lr)
      assert.are.equal(1, sd.param_groups[1].step)
      assert.are.equal(0.9, sd.param_groups[1].beta1)
      -- copies: changing the state dict does not change the optimizer
      sd.state[0].exp_avg:copy_(mp.full({ 2, 3 }, 42))
      assert.are_not.same(values(sd.state[0].exp_avg), values(opt:state_dict().state[0].exp_avg))
      local s = mp.optim.SGD(sgd_params(), { lr = 0.1, momentum = 0.5 })
      s:step()
      assert.are.same({ 2, 3 }, s:state_dict().state[0].momentum_buffer.shape)
    end)

    it("an lr that is not a short decimal survives mp.save/mp.load exactly", function()
      local ps = sgd_params()
      local A = mp.optim.Adam(ps, { lr = 1 / 300, betas = { 1 / 3, 0.999 }, eps = 1e-7 / 3, weight_decay = 2 / 7 })
      local path = os.tmpname()
      mp.save(path, { o = A:state_dict() })
      local B = mp.optim.Adam(sgd_params())
      B:load_state_dict(mp.load(path).o)
      os.remove(path)
      assert.are.same({ A.lr, A.beta1, A.beta2, A.eps, A.weight_decay }, { B.lr, B.beta1, B.beta2, B.eps, B.weight_decay })
    end)

    it("load_state_dict takes lr (and the other hyperparameters) from the state dict", function()
      local t, meta = fixture("adam_wd_betas_eps")
      local pa = fresh_params(t)
      local A = make_opt("adam_wd_betas_eps", meta, pa)
      assign(t, pa, 1)
      A:step()
      local pb = copies(pa)
      local B = mp.optim.Adam(pb, { lr = 0.5 })
      B:load_state_dict(A:state_dict())
      assert.are.same({ A.lr, A.beta1, A.beta2, A.eps, A.weight_decay }, { B.lr, B.beta1, B.beta2, B.eps, B.weight_decay })
      assign(t, pa, 2)
      assign(t, pb, 2)
      A:step()
      B:step()
      for i, n in ipairs(NAMES) do assert_bits(pb[i], pa[i], n) end
    end)

    -- PyTorch's load_state_dict replaces every hyperparameter of the group, momentum and
    -- nesterov included, and loads the momentum buffers
    it("SGD: an optimizer made without momentum takes momentum and its buffers from the state dict", function()
      local t, meta = fixture("sgd_momentum")
      local pa = fresh_params(t)
      local A = make_opt("sgd_momentum", meta, pa)
      for k = 1, 2 do assign(t, pa, k); A:step() end
      local pb = copies(pa)
      local B = mp.optim.SGD(pb, { lr = 0.1 })
      B:load_state_dict(A:state_dict())
      assert.are.equal(0.9, B.momentum)
      assign(t, pa, 3)
      assign(t, pb, 3)
      A:step()
      B:step()
      for i, n in ipairs(NAMES) do assert_bits(pb[i], pa[i], n .. " after the step that follows the load") end
    end)

    it("SGD: nesterov comes from the state dict too", function()
      local t, meta = fixture("sgd_nesterov")
      local pa = fresh_params(t)
      local A = make_opt("sgd_nesterov", meta, pa)
      for k = 1, 2 do assign(t, pa, k); A:step() end
      local pb = copies(pa)
      local B = mp.optim.SGD(pb, { lr = 0.1, momentum = 0.9 })
      B:load_state_dict(A:state_dict())
      assert.is_true(B.nesterov, "nesterov = true in param_groups was not loaded")
      assign(t, pa, 3)
      assign(t, pb, 3)
      A:step()
      B:step()
      for i, n in ipairs(NAMES) do assert_bits(pb[i], pa[i], n .. " after the step that follows the load") end
    end)
  end)

  describe("clip_grad_norm", function()
    local function setup(scale)
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      ps[1].grad = mp.tensor({ { 3 * scale, 0, -4 * scale }, { 1 * scale, 2 * scale, -2 * scale } })
      ps[2].grad = mp.tensor({ 0.5 * scale, -1.5 * scale })
      return ps, opt
    end
    local function norm_of(gs)
      local s = 0
      for _, g in ipairs(gs) do for _, v in ipairs(g) do s = s + v * v end end
      return math.sqrt(s)
    end

    it("returns the norm before clipping and scales the gradients to max_norm", function()
      local ps, opt = setup(1)
      local g1, g2 = values(ps[1].grad), values(ps[2].grad)
      local want = norm_of({ g1, g2 })   -- sqrt(9+16+1+4+4+0.25+2.25) = sqrt(36.5)
      local total = mp.optim.clip_grad_norm(ps, 2)
      assert.is_number(total)
      assert(H.close(total, want, 1e-6, 0), string.format("norm %.9g, expected %.9g", total, want))
      local coef = 2 / (want + 1e-6)
      for i, g in ipairs({ g1, g2 }) do
        local got = values(ps[i].grad)
        for j = 1, #g do
          assert(H.close(got[j], g[j] * coef, 1e-6, 1e-7),
            string.format("grad %d[%d] %.9g, expected %.9g", i, j, got[j], g[j] * coef))
        end
      end
      local after = norm_of({ values(ps[1].grad), values(ps[2].grad) })
      assert(H.close(after, 2, 1e-5, 0), "norm after clipping " .. after)
      -- the step uses the clipped gradients
      local p2 = values(ps[2])
      opt:step()
      local g = values(ps[2].grad)
      assert.are.same({ H.f32(p2[1] - g[1]), H.f32(p2[2] - g[2]) }, values(ps[2]))
    end)

    it("on .grad views of the arena: clips in place, so they stay views", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 1 })
      ;(ps[1] * mp.tensor({ { 3, 0, -4 }, { 0, 0, 0 } })):sum():backward()
      local total = mp.optim.clip_grad_norm(ps, 1)
      assert(H.close(total, 5, 1e-6, 0))
      local arena = values(opt:_views("grads")[1])
      assert(H.close(arena[1], 3 / (5 + 1e-6), 1e-6, 0) and H.close(arena[3], -4 / (5 + 1e-6), 1e-6, 0))
      assert.are.same(arena, values(ps[1].grad))
    end)

    it("over an arena: one reduction, one read, the same norm for every subset and order", function()
      mp.manual_seed(11)
      local ps = { mp.randn({ 4, 3 }):requires_grad(true), mp.randn({ 5 }):requires_grad(true),
                   mp.randn({ 2, 2 }):requires_grad(true) }
      local opt = mp.optim.SGD(ps, { lr = 1 })
      ;(ps[1]:sum() * 3 + (ps[2] * ps[2]):sum() + (ps[3] * 0.5):sum()):backward()
      local function norm(list)
        local s = 0
        for _, p in ipairs(list) do for _, v in ipairs(values(p.grad)) do s = s + v * v end end
        return math.sqrt(s)
      end
      local subsets = { { ps[1], ps[2], ps[3] }, { ps[3], ps[1], ps[2] }, { ps[1], ps[3] }, { ps[2] }, { ps[1], ps[1] } }
      for k, list in ipairs(subsets) do
        local want = norm(list)
        if k == 5 then want = math.sqrt(2) * norm({ ps[1] }) end   -- listed twice counts twice, as PyTorch
        local before = mp.counters().host_reads
        local total = mp.optim.clip_grad_norm(list, 1e9)
        assert.are.equal(1, mp.counters().host_reads - before, "subset " .. k)
        assert(H.close(total, want, 1e-6, 0), string.format("subset %d: %.9g, expected %.9g", k, total, want))
      end
      assert.are.same(values(opt:_views("grads")[1]), values(ps[1].grad))
    end)

    it("leaves the gradients alone when the norm is under max_norm", function()
      local ps = setup(0.1)
      local b1, b2 = bits(ps[1].grad), bits(ps[2].grad)
      local want = norm_of({ values(ps[1].grad), values(ps[2].grad) })
      local total = mp.optim.clip_grad_norm(ps, 10)
      assert(H.close(total, want, 1e-6, 0))
      assert.are.equal(b1, bits(ps[1].grad))
      assert.are.equal(b2, bits(ps[2].grad))
    end)

    it("works on parameters outside any optimizer and skips those without a .grad", function()
      local a = mp.tensor({ 6, 8 }):requires_grad(true)
      local b = mp.tensor({ 1, 2 }):requires_grad(true)
      ;(a * a * 0.5):sum():backward()   -- grad = a = {6, 8}, norm 10
      local total = mp.optim.clip_grad_norm({ a, b }, 5)
      assert(H.close(total, 10, 1e-6, 0))
      assert(H.close(values(a.grad)[1], 3, 1e-6, 0) and H.close(values(a.grad)[2], 4, 1e-6, 0))
      assert.is_nil(b.grad)
    end)

    it("rejects a max_norm that is not positive", function()
      local ps = setup(1)
      assert.has_error(function() mp.optim.clip_grad_norm(ps, 0) end)
      assert.has_error(function() mp.optim.clip_grad_norm(ps, -1) end)
      assert.has_error(function() mp.optim.clip_grad_norm(ps, 0 / 0) end)
      assert.has_error(function() mp.optim.clip_grad_norm({ 1 }, 1) end)
    end)
  end)

  describe("bad input", function()
    local function fails(pattern, f, ...)
      local ok, e = pcall(f, ...)
      assert(not ok, "expected an error matching '" .. pattern .. "'")
      e = tostring(e)
      assert(e:find(pattern), "error '" .. e .. "' does not match '" .. pattern .. "'")
    end

    it("errors point at the caller's line, not into lua/mp/optim.lua", function()
      local here = debug.getinfo(1, "S").short_src
      local p = sgd_params()
      local opt = mp.optim.SGD(p, { lr = 0.1 })
      -- (no tail calls here: a tail call has no line of its own to point at)
      local r
      for i, f in ipairs {
        function() r = mp.optim.SGD(p, { lr = -1 }) end,
        function() r = mp.optim.Adam(p, { betas = { 2, 0.9 } }) end,
        function() r = mp.optim.AdamW({ mp.randn { 2 } }) end,
        function() r = mp.optim.clip_grad_norm(p, -1) end,
        function() opt.lr = -1 end,
        function() r = mp.optim.SGD(p, { lr = 0.1, bogus = 1 }) end,
      } do
        local ok, e = pcall(f)
        assert.is_false(ok)
        assert.truthy(tostring(e):find(here, 1, true), "case " .. i .. ": " .. tostring(e))
      end
    end)

    it("unknown option keys", function()
      fails("unknown option 'momentm'", mp.optim.SGD, sgd_params(), { lr = 0.1, momentm = 0.9 })
      fails("unknown option 'beta1'", mp.optim.Adam, sgd_params(), { beta1 = 0.9 })
      fails("unknown option 'nesterov'", mp.optim.AdamW, sgd_params(), { nesterov = true })
      fails("options must be a table", mp.optim.Adam, sgd_params(), 0.1)
    end)

    it("SGD without lr; lr negative, NaN or infinite; lr not a number", function()
      fails("lr is required", mp.optim.SGD, sgd_params(), {})
      fails("lr is required", mp.optim.SGD, sgd_params())
      fails("lr must be a number", function() return mp.optim.SGD(sgd_params(), { lr = "0.1" }) end)
      -- the defaults are the engine's (mp_optim_defaults), PyTorch's
      local a, w = mp.optim.Adam(sgd_params()), mp.optim.AdamW(sgd_params(), { betas = { 0.8, 0.9 } })
      assert.are.same({ 1e-3, 0.9, 0.999, 1e-8, 0 }, { a.lr, a.beta1, a.beta2, a.eps, a.weight_decay })
      assert.are.same({ 1e-3, 0.8, 0.9, 0.01 }, { w.lr, w.beta1, w.beta2, w.weight_decay })
      local sgd = mp.optim.SGD(sgd_params(), { lr = 0.1 })
      assert.are.same({ 0, 0, 0, false }, { sgd.momentum, sgd.dampening, sgd.weight_decay, sgd.nesterov })
      fails("lr", mp.optim.SGD, sgd_params(), { lr = -0.1 })
      fails("lr", mp.optim.SGD, sgd_params(), { lr = 0 / 0 })
      fails("lr", mp.optim.Adam, sgd_params(), { lr = -1e-3 })
      fails("lr", mp.optim.Adam, sgd_params(), { lr = 0 / 0 })
      fails("lr", mp.optim.AdamW, sgd_params(), { lr = math.huge })
      fails("lr", mp.optim.AdamW, sgd_params(), { lr = "0.1" })
    end)

    it("negative momentum, weight_decay or eps", function()
      fails("momentum", mp.optim.SGD, sgd_params(), { lr = 0.1, momentum = -0.5 })
      fails("weight_decay", mp.optim.SGD, sgd_params(), { lr = 0.1, weight_decay = -1 })
      fails("weight_decay", mp.optim.AdamW, sgd_params(), { weight_decay = -0.01 })
      fails("eps", mp.optim.Adam, sgd_params(), { eps = -1e-8 })
    end)

    it("betas out of [0, 1) or not a table of two numbers", function()
      fails("betas", mp.optim.Adam, sgd_params(), { betas = { 1.0, 0.999 } })
      fails("betas", mp.optim.Adam, sgd_params(), { betas = { 0.9, 1 } })
      fails("betas", mp.optim.AdamW, sgd_params(), { betas = { -0.1, 0.999 } })
      fails("betas", mp.optim.AdamW, sgd_params(), { betas = { 0.9, 0 / 0 } })
      fails("betas", mp.optim.Adam, sgd_params(), { betas = 0.9 })
      fails("betas", mp.optim.Adam, sgd_params(), { betas = { 0.9 } })
      fails("betas", mp.optim.Adam, sgd_params(), { betas = { "0.9", 0.999 } })
    end)

    -- option tables reject what they do not understand (ARCHITECTURE.md); a third beta
    -- is most likely a mistake (e.g. {b1, b2, eps}) and is silently ignored
    it("betas with three numbers", function()
      fails("betas", mp.optim.Adam, sgd_params(), { betas = { 0.9, 0.999, 0.5 } })
    end)

    it("nesterov without momentum, or with dampening", function()
      fails("nesterov", mp.optim.SGD, sgd_params(), { lr = 0.1, nesterov = true })
      fails("nesterov", mp.optim.SGD, sgd_params(), { lr = 0.1, nesterov = true, momentum = 0.9, dampening = 0.1 })
    end)

    it("empty params, non-tensor params, params that are not a list", function()
      fails("empty", mp.optim.SGD, {}, { lr = 0.1 })
      fails("empty", mp.optim.Adam, {})
      fails("params%[2%] is number", mp.optim.SGD, { sgd_params()[1], 3 }, { lr = 0.1 })
      fails("params%[1%] is string", mp.optim.Adam, { "w" })
      fails("params must be a list", mp.optim.Adam, sgd_params()[1])
      fails("params must be a list", mp.optim.SGD, nil, { lr = 0.1 })
    end)

    it("an f16 parameter, one that does not require grad, a non-leaf", function()
      fails("f16", mp.optim.Adam, { sgd_params()[1], mp.tensor({ 1, 2 }, { dtype = "f16" }):requires_grad(true) })
      fails("parameter 1 is not a leaf that requires grad", mp.optim.SGD, { mp.tensor({ 1, 2 }) }, { lr = 0.1 })
      local p = mp.tensor({ 1, 2 }):requires_grad(true)
      fails("parameter 1 is not a leaf", mp.optim.SGD, { p * 2 }, { lr = 0.1 })
    end)

    it("the same tensor twice; a parameter owned by another optimizer (free() releases it)", function()
      local ps = sgd_params()
      fails("appears twice", mp.optim.SGD, { ps[1], ps[2], ps[1] }, { lr = 0.1 })
      local first = mp.optim.SGD(ps, { lr = 0.1 })
      fails("already belongs to an optimizer", mp.optim.Adam, { ps[2] })
      fails("already belongs to an optimizer", mp.optim.SGD, { mp.tensor({ 1 }):requires_grad(true), ps[1] }, { lr = 1 })
      first:free()
      local second = mp.optim.Adam(ps)
      assert.are.equal(0, second.step_count)
    end)

    it("a failed construction leaves the parameters as they were, free for another optimizer", function()
      local ps = sgd_params()
      local before = values(ps[1])
      fails("appears twice", mp.optim.SGD, { ps[1], ps[2], ps[2] }, { lr = 0.1 })
      assert.are.same(before, values(ps[1]))
      local opt = mp.optim.SGD(ps, { lr = 1 })   -- not owned by the failed one
      ps[1].grad = mp.tensor({ { 1, 1, 1 }, { 1, 1, 1 } })
      opt:step()
      local want = {}
      for i, v in ipairs(before) do want[i] = H.f32(v - 1) end
      assert.are.same(want, values(ps[1]))
    end)

    it("setting opt.lr to a string, a negative number or NaN errors and keeps the old value", function()
      local opt = mp.optim.Adam(sgd_params(), { lr = 0.01 })
      fails("lr", function() opt.lr = "0.1" end)
      assert.are.equal(0.01, opt.lr)
      fails("lr", function() opt.lr = -0.1 end)
      assert.are.equal(0.01, opt.lr)
      fails("lr", function() opt.lr = 0 / 0 end)
      assert.are.equal(0.01, opt.lr)
      fails("beta", function() opt.beta2 = 1 end)
      assert.are.equal(0.999, opt.beta2)
      fails("no field 'learning_rate'", function() opt.learning_rate = 0.1 end)
      local s = mp.optim.SGD(sgd_params(), { lr = 0.5, momentum = 0.9, nesterov = true })
      fails("nesterov", function() s.momentum = 0 end)
      assert.are.equal(0.9, s.momentum)
    end)

    describe("load_state_dict with a state that does not fit", function()
      local function trained(ps, opts)
        local opt = mp.optim.Adam(ps, opts or { lr = 0.01 })
        for i, p in ipairs(ps) do p.grad = mp.full(p.shape, i) end
        opt:step()
        return opt
      end
      local function snapshot(opt)
        local sd = opt:state_dict()
        local r = { lr = opt.lr, beta1 = opt.beta1, step = opt.step_count }
        for i, st in ipairs(sd.state) do r[i] = bits(st.exp_avg) .. bits(st.exp_avg_sq) end
        return r
      end
      local function unchanged(opt, before, what)
        assert.are.same(before, snapshot(opt), what .. ": the optimizer's state changed")
      end

      it("the wrong number of tensors", function()
        local opt = trained(sgd_params())
        local before = snapshot(opt)
        local other = trained({ mp.tensor({ 1, 2 }):requires_grad(true) }, { lr = 0.5 })
        fails("state has 1 parameters", opt.load_state_dict, opt, other:state_dict())
        unchanged(opt, before, "fewer")
        local more = trained({ sgd_params()[1], mp.tensor({ 1, 2 }):requires_grad(true), mp.tensor({ 3 }):requires_grad(true) },
          { lr = 0.5 })
        fails("state has 3 parameters", opt.load_state_dict, opt, more:state_dict())
        unchanged(opt, before, "more")
      end)

      it("a tensor with the wrong number of elements", function()
        local opt = trained(sgd_params())
        local before = snapshot(opt)
        local other = trained({ mp.zeros({ 2, 3 }):requires_grad(true), mp.zeros({ 3 }):requires_grad(true) }, { lr = 0.5 })
        fails("does not match parameter 2", opt.load_state_dict, opt, other:state_dict())
        unchanged(opt, before, "wrong numel")
      end)

      it("a tensor with the same number of elements but another shape", function()
        local opt = trained(sgd_params())
        local before = snapshot(opt)
        local other = trained({ mp.zeros({ 3, 2 }):requires_grad(true), mp.zeros({ 2 }):requires_grad(true) }, { lr = 0.5 })
        fails("does not match parameter 1", opt.load_state_dict, opt, other:state_dict())
        unchanged(opt, before, "transposed shape")
      end)

      it("a state entry without exp_avg_sq (an SGD state into Adam)", function()
        local opt = trained(sgd_params())
        local before = snapshot(opt)
        local s = mp.optim.SGD(sgd_params(), { lr = 0.5, momentum = 0.9 })
        s:step()
        fails("exp_avg is missing", opt.load_state_dict, opt, s:state_dict())
        unchanged(opt, before, "SGD state")
        fails("expected a table", opt.load_state_dict, opt, 42)
        fails("expected a table", opt.load_state_dict, opt, { state = {} })
        unchanged(opt, before, "not a state dict")
      end)

      it("an invalid hyperparameter in param_groups: error, and nothing loaded", function()
        local opt = trained(sgd_params())
        local before = snapshot(opt)
        local sd = trained(sgd_params(), { lr = 0.5 }):state_dict()
        sd.state[0].exp_avg:copy_(mp.full({ 2, 3 }, 123))
        sd.param_groups[1].lr = -1
        fails("lr", opt.load_state_dict, opt, sd)
        unchanged(opt, before, "negative lr in param_groups")
      end)
    end)
  end)

  describe("RMSprop and Adagrad", function()
    it("the defaults are PyTorch's", function()
      local r = mp.optim.RMSprop(sgd_params())
      assert.are.same({ 0.01, 0.99, 1e-8, 0, 0, false, "rmsprop" },
                      { r.lr, r.alpha, r.eps, r.weight_decay, r.momentum, r.centered, r.kind })
      local a = mp.optim.Adagrad(sgd_params())
      assert.are.same({ 0.01, 0, 0, 0, 1e-10, "adagrad" },
                      { a.lr, a.lr_decay, a.weight_decay, a.initial_accumulator_value, a.eps, a.kind })
    end)

    it("bad hyperparameters are refused, naming the optimizer and the option", function()
      local function fails(pat, f, ...)
        local ok, err = pcall(f, ...)
        assert.is_false(ok)
        assert.matches(pat, tostring(err))
      end
      fails("mp.optim.RMSprop: alpha must be >= 0", mp.optim.RMSprop, sgd_params(), { alpha = -1 })
      fails("mp.optim.RMSprop: momentum must be >= 0", mp.optim.RMSprop, sgd_params(), { momentum = -0.5 })
      fails("mp.optim.RMSprop: eps must be >= 0", mp.optim.RMSprop, sgd_params(), { eps = -1 })
      fails("mp.optim.RMSprop: unknown option 'betas'", mp.optim.RMSprop, sgd_params(), { betas = { 0.9, 0.99 } })
      fails("mp.optim.Adagrad: lr_decay must be >= 0", mp.optim.Adagrad, sgd_params(), { lr_decay = -1 })
      fails("mp.optim.Adagrad: initial_accumulator_value must be >= 0", mp.optim.Adagrad, sgd_params(),
            { initial_accumulator_value = -1 })
      fails("mp.optim.Adagrad: group 2: lr must be", mp.optim.Adagrad,
            { { params = { sgd_params()[1] } }, { params = { sgd_params()[2] }, lr = -1 } })
      local r = mp.optim.RMSprop(sgd_params())
      fails("alpha must be >= 0", function() r.alpha = -1 end)
      assert.are.equal(0.99, r.alpha)
    end)

    it("groups: each its own hyperparameters, Adagrad's sum from each group's initial_accumulator_value", function()
      local ps = sgd_params()
      local opt = mp.optim.Adagrad({ { params = { ps[1] }, initial_accumulator_value = 0.5 },
                                     { params = { ps[2] }, lr = 0.1 } })
      for _, p in ipairs(ps) do p.grad = mp.ones(p.shape) end
      opt:step()
      local sd = opt:state_dict()
      assert.are.same(H.flat({ { 1.5, 1.5, 1.5 }, { 1.5, 1.5, 1.5 } }), values(sd.state[0].sum))
      assert.are.same({ 1, 1 }, values(sd.state[1].sum))
      -- p2 = p2 - 0.1 * 1 / (sqrt(1) + 1e-10)
      assert.are.same({ H.f32(H.f32(0.1) - H.f32(0.1)), H.f32(H.f32(-0.2) - H.f32(0.1)) }, values(ps[2]))
      local r = mp.optim.RMSprop({ { params = { sgd_params()[1] } }, { params = { sgd_params()[2] }, centered = true } })
      local g = r:param_groups()
      assert.are.same({ false, true }, { g[1].centered, g[2].centered })
    end)

    for _, kind in ipairs({ "RMSprop", "Adagrad" }) do
      it(kind .. ": a step the loss scaler skips leaves parameters, state and step count as they were", function()
        local ps = sgd_params()
        local opt = kind == "RMSprop" and mp.optim.RMSprop(ps, { centered = true, momentum = 0.9 })
                                       or mp.optim.Adagrad(ps, { lr_decay = 0.1 })
        local sc = mp.amp.GradScaler{ policy = mp.amp.policy.dynamic{ init = 1024, interval = 2 } }
        local function grads(bad)
          ps[1].grad = mp.tensor({ { 1, 2, 3 }, { 4, bad and math.huge or 5, 6 } })
          ps[2].grad = mp.tensor({ 0.5, -0.5 })
        end
        local function snap()
          local sd = opt:state_dict()
          local r = { bits(ps[1]), bits(ps[2]), opt.step_count }
          for i = 0, 1 do
            for _, k in ipairs(opt.state_names) do
              if sd.state[i][k] then r[#r + 1] = k .. bits(sd.state[i][k]) end
            end
          end
          return r
        end
        sc:scale(mp.tensor(1.0)); grads(false)
        assert.is_true(sc:step(opt)); sc:update()
        local before = snap()
        assert.are.equal(1, opt.step_count)
        sc:scale(mp.tensor(1.0)); grads(true)
        assert.is_false(sc:step(opt)); sc:update()
        assert.are.same(before, snap())
        sc:scale(mp.tensor(1.0)); grads(false)
        assert.is_true(sc:step(opt)); sc:update()
        assert.are.equal(2, opt.step_count)
        assert.are_not.same(before[1], bits(ps[1]))
      end)
    end

    -- the f16/bf16 working copy autocast uses is the masters rounded after their steps
    -- (the kernels write it in the same pass), as working_copy_spec checks for AdamW
    for _, kind in ipairs({ "RMSprop", "Adagrad" }) do
      it(kind .. ": the working copy autocast uses is the masters rounded after each step", function()
        mp.manual_seed(5)
        local w = mp.randn({ 6, 5 }, { requires_grad = true })
        local x = mp.randn({ 4, 5 })
        local opt = kind == "RMSprop" and mp.optim.RMSprop({ w }, { lr = 0.05, centered = true, momentum = 0.5 })
                                       or mp.optim.Adagrad({ w }, { lr = 0.05 })
        local function check(dtype, what)
          local got, want
          do
            local _ <close> = mp.amp.autocast(dtype)
            got = mp.linear(x, w)
          end
          do
            local _ <close> = mp.no_grad()
            want = mp.linear(x:to(dtype), w:detach():to(dtype))
          end
          H.assert_same(got:f32():totable(), want:f32():totable(), what)
        end
        for i, dtype in ipairs({ "f16", "f16", "bf16", "bf16" }) do
          check(dtype, "before step " .. i)
          opt:zero_grad()
          local loss
          do
            local _ <close> = mp.amp.autocast(dtype)
            loss = mp.linear(x, w):pow(2):mean()
          end
          loss:backward()
          opt:step()
          check(dtype, "after step " .. i)
        end
      end)
    end

    it("a state dict without the states its hyperparameters do not use loads; those are zeroed", function()
      local a, b = sgd_params(), sgd_params()
      local A = mp.optim.RMSprop(a, { centered = true, momentum = 0.9 })
      local B = mp.optim.RMSprop(b)
      for _, p in ipairs(a) do p.grad = mp.ones(p.shape) end
      for _, p in ipairs(b) do p.grad = mp.ones(p.shape) end
      A:step()
      B:step()
      A:load_state_dict(B:state_dict())
      assert.are.same({ false, 0 }, { A.centered, A.momentum })
      local sd = A:state_dict()
      assert.are.same(values(B:state_dict().state[0].square_avg), values(sd.state[0].square_avg))
      assert.are.same(values(mp.zeros({ 2, 3 })), values(sd.state[0].grad_avg))
      -- the other way, a centered state dict into a plain optimizer, brings its states along
      local C = mp.optim.RMSprop(sgd_params())
      A.centered = true
      A:step()
      C:load_state_dict(A:state_dict())
      assert.is_true(C.centered)
      assert.are.same(values(A:state_dict().state[1].grad_avg), values(C:state_dict().state[1].grad_avg))
    end)

    it("centered and momentum turned on later make their state then, as zeros", function()
      local ps = sgd_params()
      local opt = mp.optim.RMSprop(ps)
      for _, p in ipairs(ps) do p.grad = mp.ones(p.shape) end
      opt:step()
      local sd = opt:state_dict()
      assert.is_nil(sd.state[0].grad_avg)
      assert.is_nil(sd.state[0].momentum_buffer)
      opt.centered, opt.momentum = true, 0.5
      opt:step()
      sd = opt:state_dict()
      assert.is_not_nil(sd.state[0].grad_avg)
      assert.is_not_nil(sd.state[0].momentum_buffer)
      assert.are.equal(0.5, sd.param_groups[1].momentum)
      assert.is_true(sd.param_groups[1].centered)
    end)
  end)

  describe("clip_grad_value", function()
    it("clamps every .grad in place into [-c, c], as torch.nn.utils.clip_grad_value_; NaN stays", function()
      local ps = sgd_params()
      local opt = mp.optim.SGD(ps, { lr = 0.1 })
      ps[1].grad:copy_(mp.tensor({ { 3, -0.5, -7 }, { 0.25, 1, 0 / 0 } }))
      ps[2].grad:copy_(mp.tensor({ -1.5, 1.5 }))
      local views = opt:_views("grads")
      assert.is_nil(mp.optim.clip_grad_value(ps, 1))
      local g = values(ps[1].grad)
      assert.are.same({ 1, -0.5, -1, 0.25, 1 }, { g[1], g[2], g[3], g[4], g[5] })
      assert.is_true(g[6] ~= g[6])
      assert.are.same({ -1, 1 }, values(ps[2].grad))
      assert.are.same({ -1, 1 }, values(views[2]))   -- in place: .grad is still the arena's view
    end)

    it("parameters without a .grad are left out; a list without optimizer; errors name the function", function()
      local a = mp.tensor({ 5, -5 }):requires_grad(true)
      local b = mp.tensor({ 1 }):requires_grad(true)
      a.grad = mp.tensor({ 5, -0.1 })
      mp.optim.clip_grad_value({ a, b }, 0.5)
      assert.are.same({ 0.5, H.f32(-0.1) }, values(a.grad))
      assert.is_nil(b.grad)
      mp.optim.clip_grad_value({ a }, 0)
      assert.are.same({ 0, 0 }, values(a.grad))
      local ok, err = pcall(mp.optim.clip_grad_value, { a }, -1)
      assert.is_false(ok)
      assert.matches("mp.optim.clip_grad_value: clip_value must be a finite number >= 0 %(got %-1%)", err)
      ok, err = pcall(mp.optim.clip_grad_value, { a }, 0 / 0)
      assert.is_false(ok)
      ok, err = pcall(mp.optim.clip_grad_value, 42, 1)
      assert.is_false(ok)
      assert.matches("mp.optim.clip_grad_value", err)
    end)
  end)
end)
