-- dp_mlp.lua: data-parallel training of train_mlp.lua's MLP for dist_spec.lua,
-- run as one process (a world of one) or under mpirun. Each rank writes its
-- weights and its loss scaler's counts to OUT.rank<r>.safetensors.
--
--   mpengine tests/lua/dist/dp_mlp.lua --batch B --steps N --amp off|f16
--       [--poison K] [--accum M] [--save-at K PATH] [--resume PATH] [--policy lua]
--       [--bucket-mb X] --out PREFIX
--
-- --policy lua: the loss scaler's policy is a Lua table (halve on a skip), which
-- notes the steps whose info says found_inf (out.seen, e.g. "20").
-- --save-at K PATH: after step K, rank 0 writes a checkpoint (mp.dist.save);
-- --resume PATH: every rank loads it and goes on from its step. The output
-- then also holds the optimizer's and the scaler's state, to compare ranks.
--
-- --accum M (one process): each batch is M micro-batches, each loss divided by
-- M, the gradients accumulated before the step: the arithmetic of M ranks with
-- batch B / M each, whose per-rank backward rounds its own partial gradients
-- (to f16 under autocast); M ranks must match it to f32 rounding.
--
-- --poison K: after the backward of step K the last rank sets one of its
-- gradients to inf, after the gradients were averaged: only that rank finds
-- it, and only the scaler's reduction of the findings makes the others skip.
local mp = require "mp"

local opts = {batch = 64, steps = 50, amp = "off", accum = 1}
local i = 1
while arg[i] do
  local k, v = arg[i]:match("^%-%-(.+)$"), arg[i + 1]
  opts[k] = tonumber(v) or v
  i = i + 2
  if k == "save-at" then opts[1], i = arg[i], i + 1 end
end
assert(opts.out, "--out PREFIX is required")

local rank, world = mp.dist.init()
mp.manual_seed(0)
local nn = mp.nn
local model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
local params = model:parameters()
-- --bucket-mb X: buckets of about X MiB (default 25: one bucket for this MLP)
local opt = mp.optim.Adam(params, {lr = 1e-3, dist = opts["bucket-mb"] and {bucket_mb = opts["bucket-mb"]} or true})
local found_steps = {}
local policy = opts.policy == "lua" and {
  update = function(_, info)
    if info.found_inf then found_steps[#found_steps + 1] = info.step end
    return info.found_inf and info.scale / 2 or info.scale
  end,
} or mp.amp.policy.dynamic{}
local scaler = opts.amp ~= "off" and mp.amp.GradScaler{policy = policy} or nil

local step = 0
local function state()
  return {model = model:state_dict(), optim = opt:state_dict(), scaler = scaler and scaler:state_dict() or nil, step = step}
end
if opts.resume then
  local ck = mp.load(opts.resume)
  model:load_state_dict(ck.model)
  opt:load_state_dict(ck.optim)
  if scaler then scaler:load_state_dict(ck.scaler) end
  step = ck.step
end
local start = step

local train = mp.data.fashion_mnist("train")
local loader = mp.data.loader(train, {batch = opts.batch, shuffle = true, seed = 1, shard = {rank, world}})
local seen = 0
for x, y in loader do
  seen = seen + 1
  if seen <= start then goto continue end   -- a resumed run's batches done
  step = step + 1
  opt:zero_grad()
  local m = opts.accum
  local xs, ys = { x:chunk(m, 1) }, { y:chunk(m, 1) }
  if scaler then
    for j = 1, m do
      local loss
      do
        local _ <close> = mp.amp.autocast(opts.amp)
        loss = mp.cross_entropy(model(xs[j]:reshape{-1, 784}), ys[j])
      end
      scaler:scale(m > 1 and loss / m or loss):backward()
    end
    if step == opts.poison and rank == world - 1 then
      local g = params[#params].grad
      local v = g:totable()
      v[1] = math.huge
      g:copy_(mp.tensor(v))
    end
    scaler:step(opt)
    scaler:update()
  else
    for j = 1, m do
      local loss = mp.cross_entropy(model(xs[j]:reshape{-1, 784}), ys[j])
      ;(m > 1 and loss / m or loss):backward()
    end
    opt:step()
  end
  if opts["save-at"] == step then mp.dist.save(opts[1], state()) end
  if step == opts.steps then break end
  ::continue::
end

local out = {model = model:state_dict(), optim = opt:state_dict(), steps = step, world = world}
if scaler then
  local st = scaler.stats
  out.scaler = {steps = st.steps, skipped = st.skipped, scale = scaler:get_scale(), state = scaler:state_dict(),
                seen = table.concat(found_steps, ",")}
end
mp.save(string.format("%s.rank%d.safetensors", opts.out, rank), out)
mp.dist.finalize()
