-- mp.optim: SGD, Adam and AdamW with PyTorch's defaults and update rules, over
-- flat parameter/gradient arenas in C (lua/optim.c, engine/optim.c), plus
-- state_dict/load_state_dict and gradient clipping.
local core = require "mp.core"

local optim = {}
local methods = core._optim_methods
local schedules = setmetatable({}, {__mode = "k"})   -- optimizer -> its lr schedule

-- option tables: the binding's one checker (lua/bind.c); values are the
-- engine's to check and default (engine/optim.c, mp_optim_defaults)
local function check_options(name, opts, spec)
  local r = core._options(name, opts, spec, 3)   -- not a tail call: level 3 is our caller's caller
  return r
end

-- a C function called on the caller's behalf by a public function of this file:
-- its error is raised at the caller's line (level 3 from here), not at ours
local function call(f, ...)
  local r = table.pack(pcall(f, ...))
  if r[1] then return table.unpack(r, 2, r.n) end
  error((tostring(r[2]):gsub("^[^\n]-:%d+: ", "", 1)), 3)
end

local function check_params(name, params)
  if type(params) ~= "table" then
    error(string.format("%s: params must be a list of tensors, e.g. model:parameters() (got %s)", name, type(params)), 3)
  end
end

-- betas = {b1, b2}: nil leaves the engine's defaults
local function betas(name, b)
  if b == nil then return nil, nil end
  if type(b) ~= "table" or #b ~= 2 or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
    error(name .. ": betas must be a table of two numbers, e.g. {0.9, 0.999}", 3)
  end
  return b[1], b[2]
end

function optim.SGD(params, opts)
  local name = "mp.optim.SGD"
  check_params(name, params)
  opts = check_options(name, opts, "lr:any momentum:any dampening:any weight_decay:any nesterov:any")
  local opt = call(core._optimizer, "sgd", params, {   -- not a tail call: call() raises at our caller
    lr = opts.lr, momentum = opts.momentum, dampening = opts.dampening,
    weight_decay = opts.weight_decay, nesterov = opts.nesterov,
  })
  return opt
end

local function adam(kind, name)
  return function(params, opts)
    check_params(name, params)
    opts = check_options(name, opts, "lr:any betas:any eps:any weight_decay:any")
    local b1, b2 = betas(name, opts.betas)
    local opt = call(core._optimizer, kind, params, {
      lr = opts.lr, beta1 = b1, beta2 = b2, eps = opts.eps, weight_decay = opts.weight_decay,
    })
    return opt
  end
end
optim.Adam = adam("adam", "mp.optim.Adam")
optim.AdamW = adam("adamw", "mp.optim.AdamW")

local HYPER = {"lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps"}

-- {state = {[i] = {...}}, param_groups = {{lr=, ..., step=}}} with copies of the state tensors
function methods.state_dict(opt)
  local group = {step = opt.step_count, nesterov = opt.nesterov}
  local sched = schedules[opt]
  if sched then group.schedule_count, group.schedule_base = sched.count, sched.base end
  for _, k in ipairs(HYPER) do group[k] = opt[k] end
  local s1, s2 = opt:_views("state1"), opt:_views("state2")
  local state = {}
  if s1 then
    for i = 1, #s1 do
      state[i] = s2 and {exp_avg = s1[i]:clone(), exp_avg_sq = s2[i]:clone()}
                     or {momentum_buffer = s1[i]:clone()}
    end
  end
  return {state = state, param_groups = {group}}
end

local function same_shape(t, u)
  local a, b = t.shape, u.shape
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

function methods.load_state_dict(opt, sd)
  local name = "Optimizer:load_state_dict"
  if type(sd) ~= "table" or type(sd.param_groups) ~= "table" or type(sd.param_groups[1]) ~= "table" then
    error(name .. ": expected a table from state_dict()", 2)
  end
  local group = sd.param_groups[1]
  local state = sd.state or {}
  local values = opt:_views("values")
  -- hyperparameters first (they decide which state exists), undone if any is bad
  local old = {nesterov = opt.nesterov, step = opt.step_count}
  for _, k in ipairs(HYPER) do old[k] = opt[k] end
  local ok, err = pcall(function()
    for _, k in ipairs(HYPER) do
      if group[k] ~= nil then opt[k] = group[k] end
    end
    if group.nesterov ~= nil then opt.nesterov = group.nesterov end
  end)
  local function undo()
    opt.momentum, opt.dampening = old.momentum, old.dampening
    for _, k in ipairs(HYPER) do pcall(function() opt[k] = old[k] end) end
    pcall(function() opt.nesterov = old.nesterov end)
  end
  if not ok then
    undo()
    error(name .. ": " .. tostring(err):gsub("^.-Optimizer: ", ""), 2)
  end
  local s1, s2 = opt:_views("state1"), opt:_views("state2")
  if next(state) ~= nil and #state ~= #values then
    undo()
    error(string.format("%s: state has %d parameters, this optimizer %d", name, #state, #values), 2)
  end
  -- check every tensor before changing any
  for i, st in pairs(state) do
    local want = s2 and {"exp_avg", "exp_avg_sq"} or s1 and {"momentum_buffer"} or {}
    for _, k in ipairs(want) do
      local t = st[k]
      local okt, same = pcall(same_shape, t or {}, values[i])
      if t == nil or not okt or not same then
        undo()
        error(string.format("%s: state[%d].%s is missing or does not match parameter %d's shape", name, i, k, i), 2)
      end
    end
  end
  for i, st in pairs(state) do
    if s2 then
      s1[i]:copy_(st.exp_avg)
      s2[i]:copy_(st.exp_avg_sq)
    elseif s1 then
      s1[i]:copy_(st.momentum_buffer)
    end
  end
  opt.step_count = group.step or 0
  local sched = schedules[opt]
  if sched and group.schedule_count then
    sched.count, sched.base = group.schedule_count, group.schedule_base or sched.base
    opt.lr = sched:lr_at(sched.count)
  end
end

-- ---- learning-rate schedules ----
-- local sched = mp.optim.schedule.cosine{warmup = 100, total = 10000, min_lr = 1e-5}
-- opt:set_schedule(sched)   -- the optimizer's lr at this point is the peak lr
-- The schedule advances once per applied step: opt:step(), or scaler:step(opt)
-- when it did not skip; skipped steps leave the lr where it was.
core._schedule_of = function(opt) return schedules[opt] end

local Schedule = {}
Schedule.__index = Schedule

local function schedule(kind, shape)
  return function(opts)
    local name = "mp.optim.schedule." .. kind
    opts = check_options(name, opts, "warmup:any total:any min_lr:any")
    local warmup, total, min_lr = opts.warmup or 0, opts.total, opts.min_lr or 0
    if math.type(warmup) ~= "integer" or warmup < 0 then error(name .. ": warmup must be an integer >= 0", 2) end
    if kind ~= "constant" and (math.type(total) ~= "integer" or total < 1 or total < warmup) then
      error(name .. ": total must be an integer >= max(1, warmup)", 2)
    end
    if type(min_lr) ~= "number" or min_lr < 0 then error(name .. ": min_lr must be a number >= 0", 2) end
    return setmetatable({kind = kind, warmup = warmup, total = total, min_lr = min_lr, count = 0, shape = shape}, Schedule)
  end
end

-- the lr after `count` applied steps, for a peak lr of base
function Schedule:lr_at(count)
  local base = self.base
  if count < self.warmup then return base * (count + 1) / self.warmup end
  return self.shape(self, base, count)
end

function Schedule:step()
  self.count = self.count + 1
  self.opt.lr = self:lr_at(self.count)
end

optim.schedule = {
  constant = schedule("constant", function(self, base) return base end),
  linear = schedule("linear", function(self, base, n)
    local f = math.min(1, (n - self.warmup) / math.max(1, self.total - self.warmup))
    return base + (self.min_lr - base) * f
  end),
  cosine = schedule("cosine", function(self, base, n)
    local f = math.min(1, (n - self.warmup) / math.max(1, self.total - self.warmup))
    return self.min_lr + (base - self.min_lr) * 0.5 * (1 + math.cos(math.pi * f))
  end),
}

function methods.set_schedule(opt, sched)
  if getmetatable(sched) ~= Schedule then error("Optimizer:set_schedule: expected an mp.optim.schedule", 2) end
  sched.opt, sched.base = opt, sched.base or opt.lr
  schedules[opt] = sched
  opt.lr = sched:lr_at(sched.count)
end

-- opt:step() in C, then the schedule
local c_step = methods.step
function methods.step(opt)
  call(c_step, opt)
  local sched = schedules[opt]
  if sched then sched:step() end
end

function optim.clip_grad_norm(params, max_norm)
  local norm = call(core._clip_grad_norm, params, max_norm)
  return norm
end

return optim
