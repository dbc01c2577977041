-- train_mlp.lua: Fashion-MNIST with an MLP 784-512-256-10 (ReLU), Adam, batch 128.
--
--   build/mpengine scripts/train_mlp.lua [--epochs N] [--batch B] [--lr LR] [--seed S]
--       [--save PATH] [--resume PATH] [--metrics FILE] [--max-steps K]
--       [--amp off|f16|bf16] [--policy NAME]
--
-- The same seed gives bit-identical weights on the CPU. --save writes a checkpoint
-- (model, optimizer, data position, random state) at the end of each epoch and
-- at the end of the run; --resume continues from one exactly where it stopped,
-- mid-epoch included. --max-steps stops early (after K optimizer steps in all).
local mp = mp or require "mp"

local function usage(msg)
  io.stderr:write("train_mlp.lua: ", msg, "\n",
    "usage: train_mlp.lua [--epochs N] [--batch B] [--lr LR] [--seed S] [--save PATH] [--resume PATH]\n",
    "                     [--metrics FILE] [--max-steps K] [--amp off|f16|bf16] [--policy NAME]\n")
  os.exit(2)
end

-- ---- options ----
local opts = {epochs = 1, batch = 128, lr = 1e-3, seed = 0, amp = "off"}
local numeric = {epochs = "int", batch = "int", lr = "num", seed = "int", ["max-steps"] = "int"}
local strings = {save = true, resume = true, metrics = true, amp = true, policy = true}
local argv = arg or {}
local i = 1
while i <= #argv do
  local a = argv[i]
  local key, val = a:match("^%-%-([%w-]+)=(.*)$")
  if not key then key = a:match("^%-%-([%w-]+)$"); val = argv[i + 1]; i = i + 1 end
  if not key or not (numeric[key] or strings[key]) then usage("unknown option " .. a) end
  if val == nil then usage("option --" .. key .. " needs a value") end
  if numeric[key] then
    local n = tonumber(val)
    if not n or (numeric[key] == "int" and math.type(n) ~= "integer") or n <= 0 and key ~= "seed" then
      usage(string.format("--%s must be a positive %s (got %s)", key, numeric[key] == "int" and "integer" or "number", val))
    end
    opts[key] = n
  else
    opts[key] = val
  end
  i = i + 1
end
if opts.amp ~= "off" and opts.amp ~= "f16" and opts.amp ~= "bf16" then
  usage("--amp must be off, f16 or bf16 (got " .. opts.amp .. ")")
end
if opts.amp ~= "off" or opts.policy then
  usage("--amp " .. opts.amp .. (opts.policy and " and --policy" or "") ..
        " need the mixed-precision layer, which this build does not have yet; use --amp off")
end

-- ---- data, model, optimizer ----
mp.manual_seed(opts.seed)
local train = mp.data.fashion_mnist("train")
local test = mp.data.fashion_mnist("test")
local nn = mp.nn
local model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
local opt = mp.optim.Adam(model:parameters(), {lr = opts.lr})
local steps_per_epoch = #mp.data.loader(train, {batch = opts.batch, seed = 0})
local total_steps = steps_per_epoch * opts.epochs
if opts["max-steps"] then total_steps = math.min(total_steps, opts["max-steps"]) end

-- ---- checkpoints ----
local state = {step = 0, epoch = 1, batch = 0}   -- batch: batches done in the current epoch

local function save(path)
  mp.save(path, {
    model = model:state_dict(), optim = opt:state_dict(), rng = mp.get_rng_state(),
    step = state.step, epoch = state.epoch, batch = state.batch,
    seed = opts.seed, batch_size = opts.batch,
  })
end

if opts.resume then
  local ck = mp.load(opts.resume)
  if ck.batch_size ~= opts.batch or ck.seed ~= opts.seed then
    usage(string.format("--resume: the checkpoint was made with --batch %s --seed %s", tostring(ck.batch_size), tostring(ck.seed)))
  end
  model:load_state_dict(ck.model)
  opt:load_state_dict(ck.optim)
  mp.set_rng_state(ck.rng)
  state.step, state.epoch, state.batch = ck.step, ck.epoch, ck.batch
  print(string.format("resumed from %s at step %d (epoch %d, batch %d)", opts.resume, state.step, state.epoch, state.batch))
end

-- ---- progress ----
local tty = mp.isatty(1)
local metrics = opts.metrics and assert(io.open(opts.metrics, opts.resume and "a" or "w"))
local LOG_EVERY = 100

local function fmt_time(s)
  s = math.max(0, math.floor(s + 0.5))
  return string.format("%d:%02d", s // 60, s % 60)
end

local function progress(loss, rate, eta)
  local width = 30
  local done = math.floor(width * state.step / total_steps)
  io.stdout:write(string.format("\r[%s%s] %d/%d  loss %.4f  %.0f samples/s  ETA %s ",
    string.rep("=", done), string.rep(" ", width - done), state.step, total_steps, loss, rate, fmt_time(eta)))
  io.stdout:flush()
end

local function evaluate()
  local _ <close> = mp.no_grad()
  model:eval()
  local correct, n = 0, 0
  for x, y in mp.data.loader(test, {batch = 1000}) do
    correct = correct + model(x:reshape{-1, 784}):argmax(2):eq(y):sum():item()
    n = n + y:numel()
  end
  model:train()
  return correct / n
end

-- ---- training ----
local accuracy
local start, t_last, step_last = mp.clock(), mp.clock(), state.step
while state.step < total_steps and state.epoch <= opts.epochs do
  -- one explicit seed per epoch, so a resumed run sees the same order
  local loader = mp.data.loader(train, {batch = opts.batch, shuffle = true, seed = opts.seed * 1000003 + state.epoch})
  local loss_sum, loss_n = 0, 0
  local b = 0
  for x, y in loader do
    b = b + 1
    if b > state.batch then
      opt:zero_grad()
      local loss = mp.cross_entropy(model(x:reshape{-1, 784}), y)
      loss:backward()
      opt:step()
      state.step, state.batch = state.step + 1, b
      local l = loss:item()
      loss_sum, loss_n = loss_sum + l, loss_n + 1
      local now = mp.clock()
      local rate = (state.step - step_last) * opts.batch / math.max(now - t_last, 1e-9)
      if tty and (state.step % 10 == 0 or state.step == total_steps) then
        progress(l, rate, (total_steps - state.step) * opts.batch / math.max(rate, 1e-9))
      end
      if state.step % LOG_EVERY == 0 then
        if not tty then
          print(string.format("step %d/%d  epoch %d  loss %.4f  %.0f samples/s", state.step, total_steps, state.epoch, l, rate))
        end
        if metrics then
          metrics:write(string.format('{"step": %d, "epoch": %d, "loss": %.6g, "lr": %.6g, "samples_per_s": %.1f}\n',
            state.step, state.epoch, l, opt.lr, rate))
          metrics:flush()
        end
        t_last, step_last = now, state.step
      end
      if state.step >= total_steps then break end
    end
  end
  local finished_epoch = state.batch >= #loader
  if tty then io.stdout:write("\n") end
  accuracy = evaluate()
  print(string.format("epoch %d  train loss %.4f  test accuracy %.4f  (%.1f s)", state.epoch,
    loss_n > 0 and loss_sum / loss_n or 0 / 0, accuracy, mp.clock() - start))
  if finished_epoch then state.epoch, state.batch = state.epoch + 1, 0 end
  if opts.save then save(opts.save) end
end
if metrics then metrics:close() end
accuracy = accuracy or evaluate()
print(string.format("final test accuracy: %.4f", accuracy))
