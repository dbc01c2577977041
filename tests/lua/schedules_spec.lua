-- schedules_spec.lua: mp.optim.schedule.step, multistep, exponential, onecycle and
-- plateau (lua/mp/optim/schedules.lua) against PyTorch 1.13's StepLR, MultiStepLR,
-- ExponentialLR, OneCycleLR and ReduceLROnPlateau: the lr (and OneCycleLR's
-- momentum / beta1) after construction and after each of 60 steps, from
-- tests/reference/fixtures/optim_schedules.safetensors (make_optim_fixtures.py).
-- The values are doubles in both; the engine keeps the lr as a double, so they
-- agree to a few ulps (the closed forms here, PyTorch's chained products there).

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local FIX = H.root .. "/tests/reference/fixtures/optim_schedules.safetensors"
local _, META = mp.load(FIX)
local STEPS = tonumber(META.steps)

local function list(s)
  local r = {}
  for x in s:gmatch("[^,]+") do r[#r + 1] = tonumber(x) end
  return r
end

local function close(a, b, what)
  local tol = 1e-12 * math.max(1, math.abs(b))
  if not (math.abs(a - b) <= tol) then error(string.format("%s: %.17g, PyTorch %.17g", what, a, b), 2) end
end

local function param() return mp.zeros({ 2 }):requires_grad(true) end

-- one optimizer step with a gradient (the schedules count applied steps)
local function step(opt, p)
  p.grad = mp.ones({ 2 })
  opt:step()
end

local CASES = {
  step = function(p) return mp.optim.SGD({ p }, { lr = 0.1 }), mp.optim.schedule.step{ step_size = 7, gamma = 0.5 } end,
  multistep = function(p)
    return mp.optim.SGD({ p }, { lr = 0.1 }), mp.optim.schedule.multistep{ milestones = { 30, 5, 12, 12 }, gamma = 0.3 }
  end,
  exponential = function(p) return mp.optim.SGD({ p }, { lr = 0.1 }), mp.optim.schedule.exponential{ gamma = 0.9 } end,
  onecycle_cos = function(p)
    return mp.optim.SGD({ p }, { lr = 0.1, momentum = 0.9 }), mp.optim.schedule.onecycle{ max_lr = 0.5, total_steps = STEPS }
  end,
  onecycle_linear_three = function(p)
    return mp.optim.Adam({ p }, { lr = 1e-3 }), mp.optim.schedule.onecycle{
      max_lr = 0.2, epochs = 6, steps_per_epoch = 10, anneal_strategy = "linear", three_phase = true, pct_start = 0.25,
      div_factor = 10, final_div_factor = 100, base_momentum = 0.8, max_momentum = 0.9 }
  end,
}

describe("mp.optim.schedule against torch.optim.lr_scheduler", function()
  for _, name in ipairs({ "step", "multistep", "exponential", "onecycle_cos", "onecycle_linear_three" }) do
    it(name .. ": the lr after construction and after each step", function()
      local p = param()
      local opt, sched = CASES[name](p)
      opt:set_schedule(sched)
      local lrs, moms = list(META[name .. ".lrs"]), META[name .. ".momentum"] and list(META[name .. ".momentum"])
      local key = opt.kind == "adam" and "beta1" or "momentum"
      for k = 0, STEPS do
        if k > 0 then step(opt, p) end
        -- (PyTorch's linear anneal goes below 0 after the last step: 0 here, the engine takes no negative lr)
        close(opt.lr, math.max(0, lrs[k + 1]), name .. " lr after " .. k .. " steps")
        if moms then close(opt[key], moms[k + 1], name .. " " .. key .. " after " .. k .. " steps") end
      end
    end)
  end

  for _, case in ipairs({
    { "plateau_min_rel", { factor = 0.5, patience = 2, threshold = 0.01, cooldown = 1, min_lr = 0.003 } },
    { "plateau_max_abs", { mode = "max", threshold_mode = "abs", threshold = 0.02, patience = 1, factor = 0.2, eps = 1e-3 } },
  }) do
    it(case[1] .. ": sched:step(metric) over PyTorch's metric sequence", function()
      local p = param()
      local opt = mp.optim.SGD({ p }, { lr = 0.1 })
      local sched = mp.optim.schedule.plateau(case[2])
      opt:set_schedule(sched)
      local lrs, metrics = list(META[case[1] .. ".lrs"]), list(META.plateau_metrics)
      close(opt.lr, lrs[1], "lr at the start")
      for k = 1, STEPS do
        step(opt, p)   -- the optimizer's steps do not move it
        close(opt.lr, lrs[k], case[1] .. " lr before step(metric) " .. k)
        sched:step(metrics[k])
        close(opt.lr, lrs[k + 1], case[1] .. " lr after step(metric) " .. k)
      end
    end)
  end
end)

describe("mp.optim.schedule: the rest", function()
  it("manual = true: opt:step() leaves it; sched:step() advances it (per epoch)", function()
    local p = param()
    local opt = mp.optim.SGD({ p }, { lr = 1 })
    local sched = mp.optim.schedule.step{ step_size = 2, gamma = 0.5, manual = true }
    opt:set_schedule(sched)
    for _ = 1, 5 do step(opt, p) end
    assert.are.equal(1, opt.lr)
    sched:step(); sched:step()
    assert.are.equal(0.5, opt.lr)
  end)

  it("every group from its own lr; onecycle from max_lr per group", function()
    local a, b = param(), param()
    local opt = mp.optim.SGD({ { params = { a }, lr = 1 }, { params = { b }, lr = 0.1 } })
    opt:set_schedule(mp.optim.schedule.exponential{ gamma = 0.5 })
    step(opt, a)
    local g = opt:param_groups()
    assert.are.same({ 0.5, 0.05 }, { g[1].lr, g[2].lr })
    local c, d = param(), param()
    local o2 = mp.optim.SGD({ { params = { c } }, { params = { d } } }, { lr = 1 })
    o2:set_schedule(mp.optim.schedule.onecycle{ max_lr = { 1, 2 }, total_steps = 10, cycle_momentum = false })
    local g2 = o2:param_groups()
    close(g2[1].lr, 1 / 25, "group 1")
    close(g2[2].lr, 2 / 25, "group 2")
    assert.are.same({ 0, 0 }, { g2[1].momentum, g2[2].momentum })
  end)

  it("state_dict keeps a plateau's counters; a fresh one continues as the first would", function()
    local function run(n, opt, sched, p, from)
      for k = from, from + n - 1 do
        step(opt, p)
        sched:step(k < 3 and 1 - k * 0.1 or 1)
      end
    end
    local p = param()
    local opt = mp.optim.SGD({ p }, { lr = 1 })
    local s = mp.optim.schedule.plateau{ patience = 1, cooldown = 2, factor = 0.5 }
    opt:set_schedule(s)
    run(5, opt, s, p, 0)
    local path = os.tmpname()
    mp.save(path, { optim = opt:state_dict() })
    local sd = mp.load(path)
    os.remove(path)
    local q = param()
    local opt2 = mp.optim.SGD({ q }, { lr = 1 })
    local s2 = mp.optim.schedule.plateau{ patience = 1, cooldown = 2, factor = 0.5 }
    opt2:set_schedule(s2)
    opt2:load_state_dict(sd.optim)
    assert.are.same({ s.best, s.num_bad_epochs, s.cooldown_counter, opt.lr },
                    { s2.best, s2.num_bad_epochs, s2.cooldown_counter, opt2.lr })
    run(6, opt, s, p, 5)
    run(6, opt2, s2, q, 5)
    assert.are.equal(opt.lr, opt2.lr)
    assert.is_true(opt.lr < 0.5)
  end)

  it("the count survives state_dict for the count-driven ones", function()
    local p = param()
    local opt = mp.optim.SGD({ p }, { lr = 0.1, momentum = 0.9 })
    opt:set_schedule(mp.optim.schedule.onecycle{ max_lr = 0.5, total_steps = 20 })
    for _ = 1, 7 do step(opt, p) end
    local sd = opt:state_dict()
    local q = param()
    local opt2 = mp.optim.SGD({ q }, { lr = 0.1, momentum = 0.9 })
    opt2:set_schedule(mp.optim.schedule.onecycle{ max_lr = 0.5, total_steps = 20 })
    opt2:load_state_dict(sd)
    assert.are.same({ opt.lr, opt.momentum }, { opt2.lr, opt2.momentum })
    -- the lr above comes back with param_groups anyway: the next step shows the count did too
    step(opt, p)
    step(opt2, q)
    assert.are.same({ opt.lr, opt.momentum }, { opt2.lr, opt2.momentum })
  end)

  it("errors at the caller's line, also from deep checks and past the last step", function()
    local ok, err = pcall(function() return mp.optim.schedule.step { step_size = 0 } end)
    assert.is_false(ok)
    assert.is_truthy(tostring(err):match("schedules_spec%.lua:%d+: mp%.optim%.schedule%.step"), err)
    local manual = mp.optim.schedule.step { step_size = 2, manual = true }
    H.raises(function() manual:step() end, { "sched:step", "not attached" })
  end)

  it("errors name the schedule and the option", function()
    local S = mp.optim.schedule
    local function fails(pat, f, ...)
      local ok, err = pcall(f, ...)
      assert.is_false(ok)
      assert.matches(pat, tostring(err))
    end
    fails("mp.optim.schedule.step: step_size must be an integer >= 1", S.step, { gamma = 0.5 })
    fails("mp.optim.schedule.multistep: milestones%[2%] must be an integer >= 0", S.multistep, { milestones = { 1, -2 } })
    fails("mp.optim.schedule.exponential: gamma must be a number >= 0", S.exponential, {})
    fails("mp.optim.schedule.onecycle: max_lr is required", S.onecycle, { total_steps = 10 })
    fails("mp.optim.schedule.onecycle: total_steps, or epochs and steps_per_epoch, are required", S.onecycle, { max_lr = 1 })
    fails("anneal_strategy must be 'cos' or 'linear'", S.onecycle, { max_lr = 1, total_steps = 5, anneal_strategy = "x" })
    fails("mp.optim.schedule.plateau: factor must be a number in %[0, 1%)", S.plateau, { factor = 1 })
    fails("mode must be 'min' or 'max'", S.plateau, { mode = "up" })
    fails("threshold_mode must be 'rel' or 'abs'", S.plateau, { threshold_mode = "x" })
    fails("unknown option", S.step, { step_size = 1, gama = 0.5 })
    -- onecycle on Adagrad: nothing to cycle unless cycle_momentum = false
    local p = param()
    local opt = mp.optim.Adagrad({ p })
    fails("no momentum or beta1 to cycle", opt.set_schedule, opt, S.onecycle{ max_lr = 1, total_steps = 5 })
    opt:set_schedule(S.onecycle{ max_lr = 1, total_steps = 2, cycle_momentum = false })
    step(opt, p); step(opt, p)
    fails("tried to step 3 times; total_steps is 2", step, opt, p)
    local o2 = mp.optim.SGD({ param() }, { lr = 1 })
    local pl = S.plateau{}
    fails("step%(metric%) needs the metric", pl.step, pl, nil)
    o2:set_schedule(pl)
    fails("step%(metric%) needs the metric", pl.step, pl, "x")
  end)
end)
