-- mp.optim: SGD, Adam and AdamW with PyTorch's defaults and update rules, over
-- flat parameter/gradient arenas in C (lua/optim.c, engine/optim.c), plus
-- state_dict/load_state_dict and gradient clipping.
local core = require "mp.core"

local optim = {}
local methods = core._optim_methods

local function check_options(name, opts, allowed)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(string.format("%s: options must be a table (got %s)", name, type(opts)), 3)
  end
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for a in pairs(allowed) do names[#names + 1] = a end
      table.sort(names)
      error(string.format("%s: unknown option '%s' (expected %s)", name, tostring(k), table.concat(names, ", ")), 3)
    end
  end
  return opts
end

local function check_params(name, params)
  if type(params) ~= "table" then
    error(string.format("%s: params must be a list of tensors, e.g. model:parameters() (got %s)", name, type(params)), 3)
  end
end

local function betas(name, b)
  if b == nil then return 0.9, 0.999 end
  if type(b) ~= "table" or #b ~= 2 or type(b[1]) ~= "number" or type(b[2]) ~= "number" then
    error(name .. ": betas must be a table of two numbers, e.g. {0.9, 0.999}", 3)
  end
  return b[1], b[2]
end

function optim.SGD(params, opts)
  local name = "mp.optim.SGD"
  check_params(name, params)
  opts = check_options(name, opts, {lr = true, momentum = true, dampening = true, weight_decay = true, nesterov = true})
  if opts.lr == nil then error(name .. ": lr is required", 2) end
  return core._optimizer("sgd", params, {
    lr = opts.lr, momentum = opts.momentum or 0, dampening = opts.dampening or 0,
    weight_decay = opts.weight_decay or 0, nesterov = opts.nesterov or false,
  })
end

local function adam(kind, name, default_wd)
  return function(params, opts)
    check_params(name, params)
    opts = check_options(name, opts, {lr = true, betas = true, eps = true, weight_decay = true})
    local b1, b2 = betas(name, opts.betas)
    return core._optimizer(kind, params, {
      lr = opts.lr or 1e-3, beta1 = b1, beta2 = b2, eps = opts.eps or 1e-8,
      weight_decay = opts.weight_decay or default_wd,
    })
  end
end
optim.Adam = adam("adam", "mp.optim.Adam", 0)
optim.AdamW = adam("adamw", "mp.optim.AdamW", 0.01)

local HYPER = {"lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps"}

-- {state = {[i] = {...}}, param_groups = {{lr=, ..., step=}}} with copies of the state tensors
function methods.state_dict(opt)
  local group = {step = opt.step_count, nesterov = opt.nesterov}
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
end

function optim.clip_grad_norm(params, max_norm)
  return core._clip_grad_norm(params, max_norm)
end

return optim
