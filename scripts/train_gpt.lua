-- train_gpt.lua: a character-level GPT (scripts/models/gpt.lua) on Debian's
-- fortunes, or on any text file with --data PATH.
--
--   build/mpengine scripts/train_gpt.lua [--layers 2] [--dim 128] [--heads 4] [--ctx 64]
--       [--batch 32] [--steps 1500] [--accum 1] [--lr 3e-3] [--wd 0.1] [--warmup 30]
--       [--amp off|f16|bf16|fp8] [--recipe delayed|current|block|mx[:k=v,...]|FILE.lua]
--       [--fp8-trace FILE] [--fp8-matmul] [--policy NAME[:ARGS]|PATH] [--seed 0] [--data PATH]
--       [--eval-every 100] [--eval-batches 20] [--save PATH] [--resume PATH]
--       [--sample N] [--metrics FILE] [--trace FILE]
--
-- The recipe: AdamW with weight decay on the Linear weights only
-- (mp.optim.decay_groups), --warmup steps of linear warmup then a cosine to 0.1x
-- the lr over the run, gradients clipped to norm 1.0 (after scaler:unscale with
-- --amp), GPT-2's initialisation (scripts/models/gpt.lua). A step is --accum micro-batches of
-- --batch random windows of --ctx + 1 characters, the loss of each divided by
-- --accum, so --accum 2 --batch B gives the step of --batch 2B to f32 rounding.
-- Validation: the mean loss of --eval-batches batches of the validation split (the
-- text's last 10%) drawn with a fixed seed, every --eval-every steps. The last
-- lines are `final val loss: X.XXX` and, with --sample N, N generated characters
-- (temperature 0.8, top-k 40). --trace FILE (with --amp) records the loss scaler's
-- view of every step, as train_mlp.lua's does.
--
-- --amp fp8 runs every nn.Linear in FP8 under mp.fp8.autocast (the rest in bf16,
-- as --amp bf16) with the scaling recipe --recipe (default delayed: TE's
-- DelayedScaling, HYBRID formats; NAME:k=v,... sets a built-in's options, e.g.
-- delayed:history=16,margin=1; or a .lua file returning a recipe); the loss
-- scaler is --amp bf16's (policy none unless --policy). Checkpoints hold the
-- recipe's state (mp.fp8.Scaler:state_dict) and resume it exactly. --fp8-trace FILE
-- records every FP8 tensor's amax, scale and saturated/flushed fractions at each
-- step (fs:trace), for scripts/fp8_lab.lua and scripts/plot.lua. --fp8-matmul
-- (with --amp fp8) also runs the tied output layer (the functional mp.linear
-- against wte.weight) in FP8: mp.fp8.autocast's matmul option, its states
-- "mp.linear1.x/w/g"; without it the head stays bf16, as Transformer Engine and
-- DeepSeek-V3 keep it.
local mp = mp or require "mp"
local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
local cli = dofile(here .. "lib/cli.lua")
local GPT = dofile(here .. "models/gpt.lua")

local function usage(msg)
  io.stderr:write("train_gpt.lua: ", msg, "\n",
    "usage: train_gpt.lua [--layers L] [--dim D] [--heads H] [--ctx T] [--batch B] [--steps N] [--accum K]\n",
    "                     [--lr LR] [--wd WD] [--warmup W] [--amp off|f16|bf16|fp8] [--recipe NAME[:k=v,...]|FILE.lua]\n",
    "                     [--fp8-trace FILE] [--fp8-matmul] [--policy NAME[:ARGS]|PATH]\n",
    "                     [--seed S] [--data PATH] [--eval-every N] [--eval-batches N] [--save PATH]\n",
    "                     [--resume PATH] [--sample N] [--metrics FILE] [--trace FILE]\n")
  os.exit(2)
end

local opts = cli.parse(arg or {}, {
  layers = "int", dim = "int", heads = "int", ctx = "int", batch = "int", steps = "int", accum = "int",
  lr = "num", wd = "num", warmup = "int", seed = "int", ["eval-every"] = "int", ["eval-batches"] = "int",
  sample = "int", amp = "str", policy = "str", data = "str", save = "str", resume = "str", metrics = "str",
  trace = "str", recipe = "str", ["fp8-trace"] = "str", ["fp8-matmul"] = "flag",
}, {
  layers = 2, dim = 128, heads = 4, ctx = 64, batch = 32, steps = 1500, accum = 1, lr = 3e-3, wd = 0.1,
  warmup = 30, seed = 0, ["eval-every"] = 100, ["eval-batches"] = 20, amp = "off",
}, usage, {seed = true, wd = true, warmup = true, sample = true})
if opts.amp ~= "off" and opts.amp ~= "f16" and opts.amp ~= "bf16" and opts.amp ~= "fp8" then usage("--amp must be off, f16, bf16 or fp8") end
if opts.recipe and opts.amp ~= "fp8" then usage("--recipe needs --amp fp8") end
if opts["fp8-trace"] and opts.amp ~= "fp8" then usage("--fp8-trace needs --amp fp8") end
if opts["fp8-matmul"] and opts.amp ~= "fp8" then usage("--fp8-matmul needs --amp fp8") end
local fp8_region = {matmul = opts["fp8-matmul"] == true}
if opts.amp == "off" and opts.policy then usage("--policy needs --amp f16 or bf16") end
if opts.amp == "off" and opts.trace then usage("--trace needs --amp f16 or bf16 (it records the loss scaler's view of each step)") end
if opts.dim % opts.heads ~= 0 then usage("--dim must be a multiple of --heads") end
if opts.wd < 0 then usage("--wd must be >= 0") end
local amp_on = opts.amp ~= "off"
local policy_spec = opts.policy or ((opts.amp == "bf16" or opts.amp == "fp8") and "none" or "dynamic")
local policy = amp_on and cli.policy(policy_spec, usage) or nil
local recipe_spec = opts.amp == "fp8" and (opts.recipe or "delayed") or nil
local r8 = recipe_spec and dofile(here .. "lib/recipe.lua")
local recipe = r8 and r8.recipe(recipe_spec, usage)

-- ---- data and model ----
local text = mp.data.text(opts.data)
local cfg = {vocab = text.vocab_size, ctx = opts.ctx, layers = opts.layers, dim = opts.dim, heads = opts.heads}
mp.manual_seed(opts.seed)
local model = GPT(cfg)
local groups = mp.optim.decay_groups(model, opts.wd)
local opt = mp.optim.AdamW(groups, {lr = opts.lr})
-- (a run shorter than the warmup warms up over the whole run)
opt:set_schedule(mp.optim.schedule.cosine{warmup = math.min(opts.warmup, opts.steps), total = opts.steps, min_lr = opts.lr * 0.1})
local scaler = amp_on and mp.amp.GradScaler{policy = policy} or nil
local fp8s = recipe and mp.fp8.Scaler{recipe = recipe, model = model} or nil
if fp8s and opts["fp8-trace"] then
  fp8s:trace(opts["fp8-trace"], {meta = {script = "train_gpt.lua", recipe = recipe_spec, seed = opts.seed,
                                         batch = opts.batch, accum = opts.accum}})
end
if scaler and opts.trace then
  -- the parameters' names in the optimizer's order (its groups one after another)
  local by_tensor, names = {}, {}
  for name, p in pairs(model:named_parameters()) do by_tensor[p] = name end
  for _, g in ipairs(groups) do
    for _, p in ipairs(g.params) do names[#names + 1] = by_tensor[p] end
  end
  scaler:trace(opts.trace, {names = names, meta = {script = "train_gpt.lua", amp = opts.amp, policy = policy_spec,
                                                  seed = opts.seed, batch = opts.batch, accum = opts.accum}})
end
local V = cfg.vocab

local function loss_of(x, y)
  local _ <close> = fp8s and mp.fp8.autocast(fp8s, fp8_region) or amp_on and mp.amp.autocast(opts.amp) or nil
  return mp.cross_entropy(model(x):reshape{-1, V}, y:reshape{-1})
end

-- the validation loss over fixed windows: the random stream is put back after
local function validate()
  local _ <close> = mp.no_grad()
  local saved = mp.get_rng_state()
  mp.manual_seed(1234567)
  local total = 0
  for _ = 1, opts["eval-batches"] do
    local x, y = mp.data.windows(text.val, opts.batch, opts.ctx)
    total = total + loss_of(x, y):item()
  end
  mp.set_rng_state(saved)
  return total / opts["eval-batches"]
end

-- ---- checkpoints ----
local step = 0
local function save(path)
  mp.save(path, {model = model:state_dict(), optim = opt:state_dict(), rng = mp.get_rng_state(), step = step,
                 config = {layers = opts.layers, dim = opts.dim, heads = opts.heads, ctx = opts.ctx, vocab = V,
                           batch = opts.batch, accum = opts.accum, amp = opts.amp,
                           policy = amp_on and policy_spec or nil, recipe = recipe_spec, seed = opts.seed,
                           fp8_matmul = opts["fp8-matmul"] or nil},
                 scaler = scaler and scaler:state_dict() or nil, fp8 = fp8s and fp8s:state_dict() or nil})
end
cli.clear_stale_saves(print, opts.save, opts.resume)
if opts.resume then
  local ck = mp.load(opts.resume)
  local c = ck.config or {}
  for _, k in ipairs{"layers", "dim", "heads", "ctx", "batch", "accum", "amp", "seed"} do
    if c[k] ~= opts[k] then usage(string.format("--resume: the checkpoint has --%s %s, this run %s", k, tostring(c[k]), tostring(opts[k]))) end
  end
  if c.vocab ~= V then usage("--resume: the checkpoint's vocabulary differs from this text's") end
  if amp_on and c.policy ~= policy_spec then usage("--resume: the checkpoint has --policy " .. tostring(c.policy)) end
  if c.recipe ~= recipe_spec then usage("--resume: the checkpoint has --recipe " .. tostring(c.recipe)) end
  if c.fp8_matmul ~= (opts["fp8-matmul"] or nil) then
    usage("--resume: the checkpoint was " .. (c.fp8_matmul and "" or "not ") .. "trained with --fp8-matmul")
  end
  model:load_state_dict(ck.model)
  opt:load_state_dict(ck.optim)
  if scaler then scaler:load_state_dict(ck.scaler) end
  if fp8s then fp8s:load_state_dict(ck.fp8) end
  mp.set_rng_state(ck.rng)
  step = ck.step
  print(string.format("resumed from %s at step %d", opts.resume, step))
end

-- ---- training ----
local tty = mp.isatty(1)
local metrics = opts.metrics and assert(io.open(opts.metrics, opts.resume and "a" or "w"))
local tokens_per_step = opts.batch * opts.ctx * opts.accum
print(string.format("gpt: %d layers, d %d, %d heads, ctx %d, vocab %d, %d parameters; %d tokens a step%s",
  opts.layers, opts.dim, opts.heads, opts.ctx, V, (function() local n = 0
    for _, p in ipairs(model:parameters()) do n = n + p:numel() end return n end)(), tokens_per_step,
  recipe and ("; fp8 recipe " .. r8.recipe_line(recipe) .. (fp8_region.matmul and "; tied head in fp8" or ""))
    or ""))
local t_last, step_last, val = mp.clock(), step, nil
while step < opts.steps do
  opt:zero_grad()
  local loss_sum = 0
  for _ = 1, opts.accum do
    local x, y = mp.data.windows(text.train, opts.batch, opts.ctx)
    local loss = loss_of(x, y)
    loss_sum = loss_sum + loss:item()
    local scaled = opts.accum > 1 and loss / opts.accum or loss
    if scaler then scaler:scale(scaled):backward() else scaled:backward() end
  end
  if scaler then
    scaler:unscale(opt)
    mp.optim.clip_grad_norm(model:parameters(), 1.0)
    scaler:step(opt)
    scaler:update()
    if fp8s then fp8s:update() end
  else
    mp.optim.clip_grad_norm(model:parameters(), 1.0)
    opt:step()
  end
  step = step + 1
  local loss = loss_sum / opts.accum
  local now = mp.clock()
  local rate = (step - step_last) * tokens_per_step / math.max(now - t_last, 1e-9)
  if tty and (step % 10 == 0 or step == opts.steps) then
    local width, done = 30, math.floor(30 * step / opts.steps)
    io.stdout:write(string.format("\r[%s%s] %d/%d  loss %.4f  %.0f tokens/s ", string.rep("=", done),
      string.rep(" ", width - done), step, opts.steps, loss, rate))
    io.stdout:flush()
  end
  if step % opts["eval-every"] == 0 or step == opts.steps then
    val = validate()
    if tty then io.stdout:write("\n") end
    print(string.format("step %d/%d  loss %.4f  val loss %.4f  lr %.3g  %.0f tokens/s%s", step, opts.steps, loss, val,
      opt.lr, rate, scaler and string.format("  scale %g  skipped %d", scaler:get_scale(), scaler.stats.skipped) or ""))
    if metrics then
      metrics:write(string.format('{"step": %d, "loss": %.6g, "val_loss": %.6g, "lr": %.6g, "tokens_per_s": %.1f%s}\n',
        step, loss, val, opt.lr, rate, scaler and string.format(', "scale": %.9g', scaler:get_scale()) or ""))
      metrics:flush()
    end
    t_last, step_last = mp.clock(), step
    if opts.save then save(opts.save) end
  end
end
if metrics then metrics:close() end
if scaler then scaler:trace(false) end
if fp8s then fp8s:trace(false) end
val = val or validate()
print(string.format("final val loss: %.3f", val))
if opts.sample and opts.sample > 0 then
  model:eval()
  print(text.decode(model:generate(text.encode("\n"), opts.sample, 0.8, 40)))
end
