-- mp.optim: SGD, Adam, AdamW, RMSprop and Adagrad with PyTorch's defaults and update rules, over
-- flat parameter/gradient arenas in C (lua/loptim.c, engine/optim.c), plus
-- state_dict/load_state_dict and gradient clipping.
local core = require "mp.core"

local optim = {}
local methods = core._optim_methods
local schedules = setmetatable({}, {__mode = "k"})   -- optimizer -> its lr schedule

-- option tables: the binding's one checker (lua/lbind.c); values are the
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

-- params as PyTorch's param groups: a list of tables {params = {...}, lr = ..., ...}
local function is_groups(params)
  local first = params[1]
  return type(first) == "table" and getmetatable(first) == nil and first.params ~= nil
end

-- each group's options, checked like the optimizer's own, betas split for the engine
local function group_list(name, groups, spec, split_betas)
  local out = {}
  for i, g in ipairs(groups) do
    local gname = string.format("%s: group %d", name, i)
    local ok, checked = pcall(core._options, gname, g, "params:table " .. spec, 0)
    if not ok then error(checked, 4) end
    if not is_groups({ g }) then error(gname .. ": params must be a list of tensors", 4) end
    local e = {}
    for k, v in pairs(checked) do e[k] = v end
    if split_betas and g.betas ~= nil then
      e.beta1, e.beta2 = split_betas(gname, g.betas)
      e.betas = nil
    end
    out[i] = e
  end
  return out
end

-- betas = {b1, b2}: nil leaves the engine's defaults
local function betas(name, b)
  if b == nil then return nil, nil end
  if type(b) ~= "table" or #b ~= 2 or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
    error(name .. ": betas must be a table of two numbers, e.g. {0.9, 0.999}", 3)
  end
  return b[1], b[2]
end

-- dist = true (or {bucket_mb = N}): data parallel over mp.dist's world
-- (engine/dist.h): the parameters start from rank 0's, and after each backward
-- the gradients are averaged over the ranks in buckets of bucket_mb MiB
-- (PyTorch DDP's default: 25), so every rank takes the same step
local DEFAULT_BUCKET_MB = 25
local function attach_dist(name, opt, d)
  if d == nil or d == false then return end
  local mb = DEFAULT_BUCKET_MB
  if type(d) == "table" then
    core._options(name .. ": dist", d, "bucket_mb:number", 4)
    mb = d.bucket_mb or mb
    if not (mb > 0 and mb <= 1 << 20) then
      error(string.format("%s: dist.bucket_mb must be a number in (0, 2^20] (got %s)", name, tostring(mb)), 3)
    end
  elseif d ~= true then
    error(string.format("%s: dist must be true, false or {bucket_mb = N} (got %s)", name, type(d)), 3)
  end
  local ok, err = pcall(core._dist_attach, opt, math.max(4, math.floor(mb * 1048576)))
  if not ok then
    opt:free()
    error(name .. ": " .. (tostring(err):gsub("^[^\n]-:%d+: ", "", 1)), 3)
  end
end

function optim.SGD(params, opts)
  local name = "mp.optim.SGD"
  check_params(name, params)
  local spec = "lr:any momentum:any dampening:any weight_decay:any nesterov:any"
  opts = check_options(name, opts, spec .. " dist:any")
  local groups = is_groups(params) and group_list(name, params, spec) or nil
  local opt = call(core._optimizer, "sgd", params, {   -- not a tail call: call() raises at our caller
    lr = opts.lr, momentum = opts.momentum, dampening = opts.dampening,
    weight_decay = opts.weight_decay, nesterov = opts.nesterov,
  }, groups)
  attach_dist(name, opt, opts.dist)
  return opt
end

local function adam(kind, name)
  return function(params, opts)
    check_params(name, params)
    local spec = "lr:any betas:any eps:any weight_decay:any"
    opts = check_options(name, opts, spec .. " dist:any")
    local b1, b2 = betas(name, opts.betas)
    local groups = is_groups(params) and group_list(name, params, spec, function(_, b) return betas(name, b) end) or nil
    local opt = call(core._optimizer, kind, params, {
      lr = opts.lr, beta1 = b1, beta2 = b2, eps = opts.eps, weight_decay = opts.weight_decay,
    }, groups)
    attach_dist(name, opt, opts.dist)
    return opt
  end
end
optim.Adam = adam("adam", "mp.optim.Adam")
optim.AdamW = adam("adamw", "mp.optim.AdamW")

-- RMSprop and Adagrad: their options go to the engine as they are
local function plain(kind, name, spec)
  return function(params, opts)
    check_params(name, params)
    opts = check_options(name, opts, spec .. " dist:any")
    local groups = is_groups(params) and group_list(name, params, spec) or nil
    local cfg = {}
    for k in spec:gmatch("(%w[%w_]*):") do cfg[k] = opts[k] end
    local opt = call(core._optimizer, kind, params, cfg, groups)
    attach_dist(name, opt, opts.dist)
    return opt
  end
end
optim.RMSprop = plain("rmsprop", "mp.optim.RMSprop", "lr:any alpha:any eps:any weight_decay:any momentum:any centered:any")
optim.Adagrad = plain("adagrad", "mp.optim.Adagrad",
                      "lr:any lr_decay:any weight_decay:any initial_accumulator_value:any eps:any")

local HYPER = {"lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps",
               "alpha", "lr_decay", "initial_accumulator_value"}

-- opt:param_groups() -> a list with one live view per group: g.lr reads the
-- engine's value and g.lr = x sets it (checked), g.size is its parameter count.
-- opt.lr (and the other fields) read group 1 and set every group.
local Group = {}
Group.__index = function(g, k) return rawget(g, "_opt"):_group(rawget(g, "_i"))[k] end
Group.__newindex = function(g, k, v)
  local t = {}
  t[k] = v
  local ok, err = pcall(rawget(g, "_opt")._set_group, rawget(g, "_opt"), rawget(g, "_i"), t)
  if not ok then error((tostring(err):gsub("^[^\n]-:%d+: ", "", 1)), 2) end
end
function methods.param_groups(opt)
  local r = {}
  for i = 1, opt.ngroups do r[i] = setmetatable({ _opt = opt, _i = i }, Group) end
  return r
end

-- the state arenas that exist, as {name, per-parameter views}: state1.. named
-- by the kind's description (momentum_buffer; exp_avg, exp_avg_sq; square_avg,
-- momentum_buffer, grad_avg; sum). _views creates those the hyperparameters need.
local function state_arenas(opt)
  local r = {}
  local wanted = opt.state_wanted
  for k, name in ipairs(opt.state_names) do
    local v = opt:_views("state" .. k)
    if v then r[#r + 1] = {name = name, views = v, wanted = wanted[k]} end
  end
  return r
end

-- {state = {[i] = {...}}, param_groups = {{lr=, ..., step=, params = {i...}}}} with copies
-- of the state tensors. i is 0-based, as PyTorch's integer ids in parameter order.
function methods.state_dict(opt)
  local groups, first = {}, 0
  for i = 1, opt.ngroups do   -- PyTorch's layout: each group's hyperparameters and its parameters' indices
    local g = opt:_group(i)
    local group = {step = opt.step_count, nesterov = g.nesterov, centered = g.centered, params = {}}
    for _, k in ipairs(HYPER) do group[k] = g[k] end
    for j = 0, g.size - 1 do group.params[j + 1] = first + j end
    first = first + g.size
    groups[i] = group
  end
  local group = groups[1]
  local sched = schedules[opt]
  if sched then
    group.schedule_count, group.schedule_base = sched.count, sched.base
    if sched._save then group.schedule_state = sched:_save() end
  end
  local state = {}
  local arenas = state_arenas(opt)
  if #arenas > 0 then
    for i = 1, #arenas[1].views do
      local st = {}
      for _, a in ipairs(arenas) do st[a.name] = a.views[i]:clone() end
      state[i - 1] = st
    end
  end
  return {state = state, param_groups = groups}
end

-- a state table keyed 0..n-1 (PyTorch's ids, this layout since issue 27) or, as
-- state_dicts and checkpoints written before it, 1..n: the 0-based table and its size
local function zero_based(name, state)
  local n, lo, hi = 0, math.huge, -math.huge
  for k in pairs(state) do
    if math.type(k) ~= "integer" then
      error(string.format("%s: state keys must be parameter indices (got %s)", name, tostring(k)), 3)
    end
    n, lo, hi = n + 1, math.min(lo, k), math.max(hi, k)
  end
  if n == 0 then return {}, 0 end
  local shift = (lo == 1 and state[0] == nil) and 1 or 0   -- the old 1-based layout
  if lo - shift ~= 0 or hi - shift ~= n - 1 then
    error(string.format("%s: state keys must be 0..%d (got %d..%d)", name, n - 1, lo, hi), 3)
  end
  local r = {}
  for k, v in pairs(state) do r[k - shift] = v end
  return r, n
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
  local state, nstate = zero_based(name, sd.state or {})
  local values = opt:_views("values")
  -- hyperparameters first (they decide which state exists), undone if any is bad
  local ngroups = opt.ngroups
  if #sd.param_groups ~= ngroups and not (#sd.param_groups == 1 and ngroups == 1) then
    error(string.format("%s: the state has %d parameter groups, this optimizer %d", name, #sd.param_groups, ngroups), 2)
  end
  local old = {}
  for i = 1, ngroups do old[i] = opt:_group(i) end
  local ok, err = pcall(function()
    for i = 1, ngroups do
      local g, set = sd.param_groups[i], {}
      for _, k in ipairs(HYPER) do set[k] = g[k] end
      set.nesterov, set.centered = g.nesterov, g.centered
      if g.momentum ~= nil and g.nesterov == nil then set.nesterov = old[i].nesterov end
      opt:_set_group(i, set)
    end
  end)
  local function undo()
    for i = 1, ngroups do pcall(opt._set_group, opt, i, old[i]) end
  end
  if not ok then
    undo()
    error(name .. ": " .. tostring(err):gsub("^.-Optimizer: ", ""), 2)
  end
  local arenas = state_arenas(opt)
  if nstate ~= 0 and nstate ~= #values then
    undo()
    error(string.format("%s: state has %d parameters, this optimizer %d", name, nstate, #values), 2)
  end
  -- check every tensor before changing any
  for i, st in pairs(state) do
    for _, a in ipairs(arenas) do
      local k, t = a.name, st[a.name]
      local okt, same = pcall(same_shape, t or {}, values[i + 1])
      -- a state the loaded hyperparameters do not use (momentum 0, not centered) may be absent
      if (t ~= nil or a.wanted) and (t == nil or not okt or not same) then
        undo()
        error(string.format("%s: state[%d].%s is missing or does not match parameter %d's shape", name, i, k, i + 1), 2)
      end
    end
  end
  for i, st in pairs(state) do
    for _, a in ipairs(arenas) do
      local v = a.views[i + 1]
      v:copy_(st[a.name] or core.zeros(v.shape, {device = v.device}))
    end
  end
  opt.step_count = group.step or 0
  local sched = schedules[opt]
  if sched and group.schedule_count then
    sched.count, sched.base = group.schedule_count, group.schedule_base or sched.base
    if sched._load and group.schedule_state then sched:_load(group.schedule_state) end
    sched:apply()
  end
end

-- ---- learning-rate schedules ----
-- local sched = mp.optim.schedule.cosine{warmup = 100, total = 10000, min_lr = 1e-5}
-- opt:set_schedule(sched)   -- the optimizer's lr at this point is the peak lr
-- The schedule advances once per applied step: opt:step(), or scaler:step(opt)
-- when it did not skip; skipped steps leave the lr where it was.
-- (a manual schedule, ReduceLROnPlateau's or one made with manual = true, is
-- stepped by the script alone: the scaler does not see it)
core._schedule_of = function(opt)
  local s = schedules[opt]
  if s and not s.manual then return s end
end

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

-- the lr after `count` applied steps, for a peak lr of base (default: group 1's)
function Schedule:lr_at(count, base)
  base = base or (type(self.base) == "table" and self.base[1] or self.base)
  if self.fn then
    local f = self.fn(count)
    if type(f) ~= "number" or f ~= f or f < 0 or f == math.huge then
      require("mp.errors").raise("Optimizer: the schedule function returned " .. tostring(f) .. " for step " .. count ..
                                 " (expected a finite factor >= 0)")   -- at the script's line (opt:step's)
    end
    return base * f
  end
  if count < self.warmup then return base * (count + 1) / self.warmup end
  return self.shape(self, base, count)
end

-- every group's lr from its own peak (PyTorch's schedulers keep a base lr per group)
function Schedule:apply()
  local base = type(self.base) == "table" and self.base or { self.base }
  for i = 1, self.opt.ngroups do
    self.opt:_set_group(i, { lr = self:lr_at(self.count, base[i] or base[1]) })
  end
end

function Schedule:step()
  if not self.opt then
    require("mp.errors").raise("sched:step: the schedule is not attached (opt:set_schedule(sched) first)")
  end
  self.count = self.count + 1
  self:apply()
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

require("mp.optim.schedules")(optim, Schedule, check_options)

-- a schedule as a Lua function of the applied steps so far (0 at the start):
-- lr = f(count) * each group's peak lr, as PyTorch's LambdaLR
local function lambda_schedule(f)
  return setmetatable({kind = "lambda", warmup = 0, count = 0, fn = f}, Schedule)
end

function methods.set_schedule(opt, sched)
  if type(sched) == "function" then sched = lambda_schedule(sched) end
  local mt = getmetatable(sched)
  if mt ~= Schedule and not (type(mt) == "table" and rawget(mt, "__schedule")) then
    error("Optimizer:set_schedule: expected an mp.optim.schedule or a function of the step", 2)
  end
  if sched._check then
    local ok, err = pcall(sched._check, sched, opt)
    if not ok then error(tostring(err), 2) end
  end
  local base = {}
  for i = 1, opt.ngroups do base[i] = opt:_group(i).lr end
  sched.opt, sched.base = opt, sched.base or base
  local ok, err = pcall(sched.apply, sched)   -- a bad schedule is refused before it is kept
  if not ok then error(tostring(err), 2) end
  schedules[opt] = sched
end

-- opt:step() in C, then the schedule
local c_step = methods.step
function methods.step(opt)
  call(c_step, opt)
  local sched = schedules[opt]
  if sched and not sched.manual then sched:step() end
end

-- mp.optim.decay_groups(model, weight_decay) -> param groups for any optimizer:
-- the weights of Linear layers decayed, everything else (biases, norms,
-- embeddings, and a weight shared with an embedding, as a tied output layer is)
-- not: minGPT's rule. Parameters keep model:parameters()' order within a group.
function optim.decay_groups(model, weight_decay)
  local name = "mp.optim.decay_groups"
  if type(model) ~= "table" or type(model.modules) ~= "function" then
    error(name .. ": expected an mp.nn module (got " .. type(model) .. ")", 2)
  end
  if type(weight_decay) ~= "number" or not (weight_decay >= 0) then
    error(name .. ": weight_decay must be a number >= 0 (got " .. tostring(weight_decay) .. ")", 2)
  end
  local decay, keep = {}, {}
  for _, m in ipairs(model:modules()) do
    local params = rawget(m, "_parameters")
    for _, n in ipairs(rawget(m, "_param_names")) do
      local p = params[n]
      if m:type_name() == "Linear" and n == "weight" then
        if keep[p] == nil then decay[p] = true end
      else
        keep[p], decay[p] = true, nil
      end
    end
  end
  local d, k = {}, {}
  for _, p in ipairs(model:parameters()) do
    if decay[p] then d[#d + 1] = p else k[#k + 1] = p end
  end
  local groups = {}
  if #d > 0 then groups[#groups + 1] = { params = d, weight_decay = weight_decay } end
  if #k > 0 then groups[#groups + 1] = { params = k, weight_decay = 0 } end
  return groups
end

function optim.clip_grad_norm(params, max_norm)
  local norm = call(core._clip_grad_norm, params, max_norm)
  return norm
end

-- PyTorch's clip_grad_value_: every .grad clamped in place into [-clip_value, clip_value]
function optim.clip_grad_value(params, clip_value)
  call(core._clip_grad_value, params, clip_value)
end

return optim
