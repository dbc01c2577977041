-- mp.optim.schedules: PyTorch's StepLR, MultiStepLR, ExponentialLR, OneCycleLR
-- and ReduceLROnPlateau as mp.optim.schedule.step, .multistep, .exponential,
-- .onecycle and .plateau, in the style of the schedules of lua/mp/optim.lua:
-- made from an options table, attached with opt:set_schedule(sched), advanced
-- once per applied optimizer step (opt:step(), or scaler:step(opt) when it did
-- not skip) unless made with manual = true, in which case the script calls
-- sched:step() itself (once per epoch, as PyTorch's epoch schedulers are used).
-- plateau is always manual: sched:step(metric).
--
-- The lr after `count` steps is PyTorch's closed form of each (its
-- _get_closed_form_lr: the chained form multiplies the same factors), from each
-- group's lr when the schedule was attached (its base); onecycle's come from
-- max_lr instead, and it cycles SGD's and RMSprop's momentum or Adam's beta1
-- as PyTorch does (cycle_momentum = false leaves them).
return function(optim, Schedule, check_options)
  local S = optim.schedule

  -- at the script's line however deep the check sits (lua/mp/errors.lua)
  local function fail(name, msg) require("mp.errors").raise(name .. ": " .. msg) end

  local function positive_int(name, key, v)
    if math.type(v) ~= "integer" or v < 1 then fail(name, key .. " must be an integer >= 1 (got " .. tostring(v) .. ")") end
    return v
  end
  local function manual_flag(name, v)
    if v ~= nil and type(v) ~= "boolean" then fail(name, "manual must be a boolean") end
    return v == true
  end

  -- a count-driven schedule: shape(self, base, count) -> lr
  local function make(kind, fields, shape)
    fields.kind, fields.warmup, fields.count, fields.shape = kind, 0, 0, shape
    return setmetatable(fields, Schedule)
  end

  -- StepLR: base * gamma^floor(count / step_size)
  function S.step(opts)
    local name = "mp.optim.schedule.step"
    opts = check_options(name, opts, "step_size:any gamma:any manual:any")
    local step_size = positive_int(name, "step_size", opts.step_size)
    local gamma = opts.gamma == nil and 0.1 or opts.gamma
    if type(gamma) ~= "number" or not (gamma >= 0) then fail(name, "gamma must be a number >= 0") end
    return make("step", {step_size = step_size, gamma = gamma, manual = manual_flag(name, opts.manual)},
      function(self, base, n) return base * self.gamma ^ (n // self.step_size) end)
  end

  -- MultiStepLR: base * gamma^(the milestones <= count; a milestone listed twice counts twice)
  function S.multistep(opts)
    local name = "mp.optim.schedule.multistep"
    opts = check_options(name, opts, "milestones:any gamma:any manual:any")
    local ms = opts.milestones
    if type(ms) ~= "table" then fail(name, "milestones must be a list of integers >= 0") end
    local sorted = {}
    for i, m in ipairs(ms) do
      if math.type(m) ~= "integer" or m < 0 then fail(name, "milestones[" .. i .. "] must be an integer >= 0") end
      sorted[i] = m
    end
    table.sort(sorted)
    local gamma = opts.gamma == nil and 0.1 or opts.gamma
    if type(gamma) ~= "number" or not (gamma >= 0) then fail(name, "gamma must be a number >= 0") end
    return make("multistep", {milestones = sorted, gamma = gamma, manual = manual_flag(name, opts.manual)},
      function(self, base, n)
        local k = 0
        for _, m in ipairs(self.milestones) do if m <= n then k = k + 1 end end
        return base * self.gamma ^ k
      end)
  end

  -- ExponentialLR: base * gamma^count
  function S.exponential(opts)
    local name = "mp.optim.schedule.exponential"
    opts = check_options(name, opts, "gamma:any manual:any")
    local gamma = opts.gamma
    if type(gamma) ~= "number" or not (gamma >= 0) then fail(name, "gamma must be a number >= 0 (it is required)") end
    return make("exponential", {gamma = gamma, manual = manual_flag(name, opts.manual)},
      function(self, base, n) return base * self.gamma ^ n end)
  end

  ---------------------------------------------------------------- OneCycleLR

  local OneCycle = setmetatable({__schedule = true}, {__index = Schedule})
  OneCycle.__index = OneCycle

  local function anneal_cos(a, b, pct) return b + (a - b) / 2.0 * (math.cos(math.pi * pct) + 1) end
  local function anneal_linear(a, b, pct) return (b - a) * pct + a end

  -- per group: a number, or a list with one per group
  local function per_group(name, key, v)
    if type(v) == "number" then return v end
    if type(v) ~= "table" or #v < 1 then fail(name, key .. " must be a number or a list of numbers, one per group") end
    for i, x in ipairs(v) do
      if type(x) ~= "number" then fail(name, key .. "[" .. i .. "] must be a number") end
    end
    return v
  end

  function S.onecycle(opts)
    local name = "mp.optim.schedule.onecycle"
    opts = check_options(name, opts, "max_lr:any total_steps:any epochs:any steps_per_epoch:any pct_start:any " ..
      "anneal_strategy:any cycle_momentum:any base_momentum:any max_momentum:any div_factor:any " ..
      "final_div_factor:any three_phase:any manual:any")
    if opts.max_lr == nil then fail(name, "max_lr is required") end
    local total = opts.total_steps
    if total ~= nil then
      positive_int(name, "total_steps", total)
    elseif opts.epochs ~= nil or opts.steps_per_epoch ~= nil then
      total = positive_int(name, "epochs", opts.epochs) * positive_int(name, "steps_per_epoch", opts.steps_per_epoch)
    else
      fail(name, "total_steps, or epochs and steps_per_epoch, are required")
    end
    local pct = opts.pct_start == nil and 0.3 or opts.pct_start
    if type(pct) ~= "number" or not (pct >= 0 and pct <= 1) then fail(name, "pct_start must be a number in [0, 1]") end
    local strategy = opts.anneal_strategy or "cos"
    if strategy ~= "cos" and strategy ~= "linear" then
      fail(name, "anneal_strategy must be 'cos' or 'linear' (got " .. tostring(strategy) .. ")")
    end
    local function factor(key, d)
      local v = opts[key] == nil and d or opts[key]
      if type(v) ~= "number" or not (v > 0) then fail(name, key .. " must be a number > 0") end
      return v
    end
    local three = opts.three_phase == true
    local cycle = opts.cycle_momentum ~= false
    local self = setmetatable({
      kind = "onecycle", warmup = 0, count = 0, total = total, manual = manual_flag(name, opts.manual),
      max_lr = per_group(name, "max_lr", opts.max_lr),
      base_momentum = per_group(name, "base_momentum", opts.base_momentum == nil and 0.85 or opts.base_momentum),
      max_momentum = per_group(name, "max_momentum", opts.max_momentum == nil and 0.95 or opts.max_momentum),
      div_factor = factor("div_factor", 25.0), final_div_factor = factor("final_div_factor", 1e4),
      anneal = strategy == "cos" and anneal_cos or anneal_linear, cycle_momentum = cycle,
    }, OneCycle)
    -- PyTorch's phases: {end_step, start lr, end lr, start momentum, end momentum}
    if three then
      self.phases = {
        {pct * total - 1, "initial", "max", "max_m", "base_m"},
        {2 * pct * total - 2, "max", "initial", "base_m", "max_m"},
        {total - 1, "initial", "min", "max_m", "max_m"},
      }
    else
      self.phases = {
        {pct * total - 1, "initial", "max", "max_m", "base_m"},
        {total - 1, "max", "min", "base_m", "max_m"},
      }
    end
    return self
  end

  local function pick(v, i)
    if type(v) == "table" then return v[i] end
    return v
  end

  -- the optimizer's momentum-like hyperparameter, for cycle_momentum
  local MOMENTUM = {sgd = "momentum", rmsprop = "momentum", adam = "beta1", adamw = "beta1"}

  function OneCycle:_check(opt)
    local name = "mp.optim.schedule.onecycle"
    for _, key in ipairs({"max_lr", "base_momentum", "max_momentum"}) do
      local v = self[key]
      if type(v) == "table" and #v ~= opt.ngroups then
        error(string.format("%s: %s has %d values, the optimizer %d groups", name, key, #v, opt.ngroups), 0)
      end
    end
    if self.cycle_momentum and not MOMENTUM[opt.kind] then
      error(name .. ": this optimizer has no momentum or beta1 to cycle (pass cycle_momentum = false)", 0)
    end
  end

  -- group i's lr and momentum after `count` steps (PyTorch's OneCycleLR.get_lr)
  function OneCycle:values_at(count, i)
    if count > self.total then
      require("mp.errors").raise(string.format("mp.optim.schedule.onecycle: tried to step %d times; total_steps is %d",
                                               count, self.total))
    end
    local max = pick(self.max_lr, i)
    local v = {max = max, initial = max / self.div_factor,
               max_m = pick(self.max_momentum, i), base_m = pick(self.base_momentum, i)}
    v.min = v.initial / self.final_div_factor
    local start = 0
    for k, ph in ipairs(self.phases) do
      local stop = ph[1]
      if count <= stop or k == #self.phases then
        local pct = (count - start) / (stop - start)
        -- after the last step (count == total) pct passes 1 and a linear anneal
        -- goes past min lr, below 0 for some settings, as PyTorch's; the engine
        -- takes no negative lr, so that one is 0
        return math.max(0, self.anneal(v[ph[2]], v[ph[3]], pct)), self.anneal(v[ph[4]], v[ph[5]], pct)
      end
      start = stop
    end
  end

  function OneCycle:lr_at(count, group)
    return (self:values_at(count, group or 1))
  end

  function OneCycle:apply()
    local key = self.cycle_momentum and MOMENTUM[self.opt.kind]
    local set = {}
    for i = 1, self.opt.ngroups do
      local lr, m = self:values_at(self.count, i)
      set[i] = {lr = lr}
      if key then set[i][key] = m end
    end
    for i = 1, self.opt.ngroups do self.opt:_set_group(i, set[i]) end
  end

  ---------------------------------------------------------------- ReduceLROnPlateau

  local Plateau = setmetatable({__schedule = true}, {__index = Schedule})
  Plateau.__index = Plateau

  function S.plateau(opts)
    local name = "mp.optim.schedule.plateau"
    opts = check_options(name, opts, "mode:any factor:any patience:any threshold:any threshold_mode:any " ..
      "cooldown:any min_lr:any eps:any")
    local mode = opts.mode or "min"
    if mode ~= "min" and mode ~= "max" then fail(name, "mode must be 'min' or 'max' (got " .. tostring(mode) .. ")") end
    local tmode = opts.threshold_mode or "rel"
    if tmode ~= "rel" and tmode ~= "abs" then
      fail(name, "threshold_mode must be 'rel' or 'abs' (got " .. tostring(tmode) .. ")")
    end
    local factor = opts.factor == nil and 0.1 or opts.factor
    if type(factor) ~= "number" or not (factor >= 0 and factor < 1) then fail(name, "factor must be a number in [0, 1)") end
    local patience = opts.patience == nil and 10 or opts.patience
    if math.type(patience) ~= "integer" or patience < 0 then fail(name, "patience must be an integer >= 0") end
    local cooldown = opts.cooldown == nil and 0 or opts.cooldown
    if math.type(cooldown) ~= "integer" or cooldown < 0 then fail(name, "cooldown must be an integer >= 0") end
    local threshold = opts.threshold == nil and 1e-4 or opts.threshold
    if type(threshold) ~= "number" or not (threshold >= 0) then fail(name, "threshold must be a number >= 0") end
    local eps = opts.eps == nil and 1e-8 or opts.eps
    if type(eps) ~= "number" or not (eps >= 0) then fail(name, "eps must be a number >= 0") end
    local min_lr = per_group(name, "min_lr", opts.min_lr == nil and 0 or opts.min_lr)
    return setmetatable({
      kind = "plateau", warmup = 0, count = 0, manual = true, mode = mode, threshold_mode = tmode,
      factor = factor, patience = patience, cooldown = cooldown, threshold = threshold, eps = eps, min_lr = min_lr,
      best = mode == "min" and math.huge or -math.huge, num_bad_epochs = 0, cooldown_counter = 0,
    }, Plateau)
  end

  function Plateau:_check(opt)
    if type(self.min_lr) == "table" and #self.min_lr ~= opt.ngroups then
      error(string.format("mp.optim.schedule.plateau: min_lr has %d values, the optimizer %d groups",
                          #self.min_lr, opt.ngroups), 0)
    end
  end

  -- the lr is the optimizer's own: attaching or loading changes nothing
  function Plateau:apply() end

  function Plateau:_is_better(a)
    local best, t = self.best, self.threshold
    if self.mode == "min" then
      if self.threshold_mode == "rel" then return a < best * (1 - t) end
      return a < best - t
    end
    if self.threshold_mode == "rel" then return a > best * (t + 1) end
    return a > best + t
  end

  -- sched:step(metric): PyTorch's ReduceLROnPlateau.step
  function Plateau:step(metric)
    if type(metric) ~= "number" then
      error("mp.optim.schedule.plateau: step(metric) needs the metric, a number (got " .. type(metric) .. ")", 2)
    end
    if not self.opt then error("mp.optim.schedule.plateau: attach it first with opt:set_schedule(sched)", 2) end
    self.count = self.count + 1
    if self:_is_better(metric) then
      self.best, self.num_bad_epochs = metric, 0
    else
      self.num_bad_epochs = self.num_bad_epochs + 1
    end
    if self.cooldown_counter > 0 then
      self.cooldown_counter = self.cooldown_counter - 1
      self.num_bad_epochs = 0
    end
    if self.num_bad_epochs > self.patience then
      for i = 1, self.opt.ngroups do
        local old = self.opt:_group(i).lr
        local new = math.max(old * self.factor, pick(self.min_lr, i))
        if old - new > self.eps then self.opt:_set_group(i, {lr = new}) end
      end
      self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
    end
  end

  -- what opt:state_dict() keeps of it beyond count (schedule_state)
  function Plateau:_save()
    return {best = self.best, num_bad_epochs = self.num_bad_epochs, cooldown_counter = self.cooldown_counter}
  end
  function Plateau:_load(t)
    self.best, self.num_bad_epochs, self.cooldown_counter = t.best, t.num_bad_epochs, t.cooldown_counter
  end
end
