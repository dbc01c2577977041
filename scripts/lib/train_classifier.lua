-- train_classifier.lua: the training script of scripts/train_mlp.lua and
-- scripts/train_cnn.lua, which differ only in their model and the shape the
-- images take: options, checkpoints and resuming, mixed precision with the loss
-- scaler and its policies, progress, metrics and the last lines are this file's
-- (documented in train_mlp.lua's header).
--
--   dofile("scripts/lib/train_classifier.lua"){
--     name = "train_mlp.lua",              -- in usage and error messages
--     model = function() return nn.Sequential(...) end,   -- made after the seed is set
--     shape = {-1, 784},                   -- each batch of images reshaped to this
--   }
local mp = mp or require "mp"

return function(spec)

  local function usage(msg)
    local pad = string.rep(" ", #spec.name)
    io.stderr:write(spec.name, ": ", msg, "\n",
      "usage: ", spec.name, " [--epochs N] [--batch B] [--lr LR] [--seed S] [--save PATH] [--resume PATH]\n",
      "       ", pad, " [--metrics FILE] [--max-steps K] [--amp off|f16|bf16|fp8] [--recipe NAME|FILE.lua]\n",
      "       ", pad, " [--policy NAME[:ARGS]|PATH]\n",
      "       ", pad, " [--trace FILE] [--tiny K] [--inject-overflow N [--inject-rank R]] [--dist]\n")
    os.exit(2)
  end

  local cli = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "cli.lua")

  -- ---- options ----
  local opts = cli.parse(arg or {}, {epochs = "int", batch = "int", lr = "num", seed = "int", ["max-steps"] = "int",
                                     save = "str", resume = "str", metrics = "str", amp = "str", policy = "str",
                                     trace = "str", tiny = "int", ["inject-overflow"] = "int",
                                     ["inject-rank"] = "int", dist = "flag", recipe = "str"},
                         {epochs = 1, batch = 128, lr = 1e-3, seed = 0, amp = "off"}, usage,
                         {seed = true, ["inject-rank"] = true})
  if opts.amp ~= "off" and opts.amp ~= "f16" and opts.amp ~= "bf16" and opts.amp ~= "fp8" then
    usage("--amp must be off, f16, bf16 or fp8 (got " .. opts.amp .. ")")
  end
  if opts.recipe and opts.amp ~= "fp8" then usage("--recipe needs --amp fp8") end
  if opts.amp == "off" and opts.policy then
    usage("--policy needs --amp f16 or bf16 (this run has --amp off, which uses no loss scaler)")
  end
  if opts.amp == "off" and opts["inject-overflow"] then
    usage("--inject-overflow needs --amp f16 or bf16 (an overflow is what the loss scaler handles)")
  end
  if opts.amp == "off" and opts.trace then
    usage("--trace needs --amp f16 or bf16 (it records the loss scaler's view of each step)")
  end
  if opts["inject-rank"] and not opts["inject-overflow"] then usage("--inject-rank needs --inject-overflow") end
  local amp_on = opts.amp ~= "off"

  -- ---- data parallel (--dist, under mpirun): each rank takes --batch examples of
  -- each global batch, the gradients are averaged, and the loss scaler decides for
  -- all; rank 0 prints and writes checkpoints, every rank reads them ----
  local rank, world = 0, 1
  if opts.dist then rank, world = mp.dist.init() end
  if opts["inject-rank"] and (opts["inject-rank"] < 0 or opts["inject-rank"] >= world) then
    usage(string.format("--inject-rank must be a rank, 0..%d (got %d)", world - 1, opts["inject-rank"]))
  end
  local print = rank == 0 and print or function() end
  local io_write = rank == 0 and function(...) io.stdout:write(...) end or function() end

  local policy_spec = opts.policy or ((opts.amp == "bf16" or opts.amp == "fp8") and "none" or "dynamic")
  local policy = amp_on and cli.policy(policy_spec, usage) or nil
  -- --amp fp8: nn.Linear in FP8 under mp.fp8.autocast (bf16 for the rest), the recipe's state in checkpoints
  local recipe_spec = opts.amp == "fp8" and (opts.recipe or "delayed") or nil
  local r8 = recipe_spec and dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "recipe.lua")
  local recipe = r8 and r8.recipe(recipe_spec, usage)
  -- the region of a forward pass: FP8 or mp.amp's
  local function region(fs)
    if fs then return mp.fp8.autocast(fs) end
    return mp.amp.autocast(opts.amp)
  end

  if rank == 0 then cli.clear_stale_saves(print, opts.save, opts.resume) end

  -- ---- the checkpoint to resume from: checked before anything is loaded ----
  local ck
  if opts.resume then
    ck = mp.load(opts.resume)
    if ck.batch_size ~= opts.batch or ck.seed ~= opts.seed then
      usage(string.format("--resume: the checkpoint was made with --batch %s --seed %s", tostring(ck.batch_size), tostring(ck.seed)))
    end
    -- the same mixed precision and the same policy spec (compared as written, e.g. "dynamic",
    -- "static:1024", "scripts/policies/logging.lua"; a checkpoint without "amp" is --amp off)
    local ck_amp, ck_policy = ck.amp or "off", ck.policy
    if ck_amp ~= opts.amp or (amp_on and ck_policy ~= policy_spec) or ck.recipe ~= recipe_spec then
      usage(string.format("--resume: the checkpoint was made with --amp %s%s%s; this run has --amp %s%s%s", ck_amp,
        ck_policy and (" --policy " .. ck_policy) or "", ck.recipe and (" --recipe " .. ck.recipe) or "", opts.amp,
        amp_on and (" --policy " .. policy_spec) or "", recipe_spec and (" --recipe " .. recipe_spec) or ""))
    end
    if amp_on and type(ck.scaler) ~= "table" then usage("--resume: the checkpoint has no loss scaler state") end
  end

  -- ---- data, model, optimizer ----
  mp.manual_seed(opts.seed)
  local train = mp.data.fashion_mnist("train")
  local test = mp.data.fashion_mnist("test")
  local model = spec.model()
  -- --tiny K: Adam's eps scaled with the loss, so that its steps stay those of the
  -- ordinary run (Adam's update does not depend on the gradients' scale but for eps)
  local opt = mp.optim.Adam(model:parameters(), {lr = opts.lr, eps = 1e-8 * 2.0 ^ -(opts.tiny or 0), dist = opts.dist})
  -- each rank's own random stream (dropout and the like), at the same position
  -- as rank 0's; rank 0 keeps the run's, so one process runs as before
  local function rank_stream(st) return {seed = mp.dist.rank_seed(st.seed), offset = st.offset} end
  if rank > 0 then mp.set_rng_state(rank_stream(mp.get_rng_state())) end
  local scaler, skips = nil, {overflow = 0, nan = 0, forward = 0}
  local fp8s = recipe and mp.fp8.Scaler{recipe = recipe, model = model} or nil
  if recipe then print("fp8 recipe " .. r8.recipe_line(recipe)) end
  if amp_on then
    scaler = mp.amp.GradScaler{policy = policy}
    local _, names = model:named_parameters()   -- in optimizer order: on_skip names the parameter
    -- a Lua policy with `telemetry = true` gets the per-step gradient fractions in its info
    scaler:telemetry(type(policy) == "table" and rawget(policy, "telemetry") == true, names)
    scaler.on_skip = function(info) skips[info.reason] = (skips[info.reason] or 0) + 1 end
    if opts.trace and rank == 0 then   -- --dist: rank 0's view (decisions are every rank's)
      scaler:trace(opts.trace, {names = names, meta = {script = spec.name, amp = opts.amp, policy = policy_spec,
                                                       seed = opts.seed, batch = opts.batch, lr = opts.lr}})
    end
  end
  local shard = opts.dist and {rank, world} or nil
  local steps_per_epoch = #mp.data.loader(train, {batch = opts.batch, seed = 0, shard = shard})
  local total_steps = steps_per_epoch * opts.epochs
  if opts["max-steps"] then total_steps = math.min(total_steps, opts["max-steps"]) end

  -- --dist: the buffers (batch norm's running statistics) are rank 0's, as
  -- PyTorch's DDP broadcasts them before each forward; in training mode they
  -- change no output, so they are made alike where they are read: before an
  -- evaluation and a checkpoint
  local function sync_buffers()
    if opts.dist then
      for _, b in ipairs(model:buffers()) do mp.dist.broadcast(b, 0) end
    end
  end

  -- ---- checkpoints ----
  local state = {step = 0, epoch = 1, batch = 0}   -- batch: batches done in the current epoch

  local function save(path)
    sync_buffers()
    local write = opts.dist and mp.dist.save or mp.save
    write(path, {
      model = model:state_dict(), optim = opt:state_dict(), rng = mp.get_rng_state(),
      step = state.step, epoch = state.epoch, batch = state.batch,
      seed = opts.seed, batch_size = opts.batch,
      amp = opts.amp, policy = amp_on and policy_spec or nil,
      scaler = scaler and scaler:state_dict() or nil, skips = scaler and skips or nil,
      recipe = recipe_spec, fp8 = fp8s and fp8s:state_dict() or nil,
    })
  end

  if ck then
    model:load_state_dict(ck.model)
    if scaler then
      scaler:load_state_dict(ck.scaler)
      for k, v in pairs(ck.skips or {}) do skips[k] = v end
    end
    if fp8s then fp8s:load_state_dict(ck.fp8) end
    opt:load_state_dict(ck.optim)
    mp.set_rng_state(rank > 0 and rank_stream(ck.rng) or ck.rng)
    state.step, state.epoch, state.batch = ck.step, ck.epoch, ck.batch
    print(string.format("resumed from %s at step %d (epoch %d, batch %d)", opts.resume, state.step, state.epoch, state.batch))
  end

  -- ---- progress ----
  local tty = mp.isatty(1)
  local metrics = opts.metrics and rank == 0 and assert(io.open(opts.metrics, opts.resume and "a" or "w"))
  local LOG_EVERY = 100

  local function fmt_time(s)
    s = math.max(0, math.floor(s + 0.5))
    return string.format("%d:%02d", s // 60, s % 60)
  end

  local function progress(loss, rate, eta)
    local width = 30
    local done = math.floor(width * state.step / total_steps)
    io_write(string.format("\r[%s%s] %d/%d  loss %.4f  %.0f samples/s  ETA %s ",
      string.rep("=", done), string.rep(" ", width - done), state.step, total_steps, loss, rate, fmt_time(eta)))
    if rank == 0 then io.stdout:flush() end
  end

  -- the test set in batches of the training batch: without the graph a batch
  -- needs less memory than a training step of the same size, so evaluation never
  -- raises the run's peak (at batch 1000 it held 5x what training did); each
  -- batch's inputs and logits go as soon as it is counted
  local function evaluate()
    sync_buffers()
    local _ <close> = mp.no_grad()
    local _a <close> = amp_on and region(fp8s) or nil
    model:eval()
    local correct, n = 0, 0
    for x, y in mp.data.loader(test, {batch = opts.batch}) do
      local _x <close> = x
      local _y <close> = y
      local logits <close> = model(x:reshape(spec.shape))
      local right <close> = logits:argmax(2):eq(y):sum()
      correct = correct + right:item()
      n = n + y:numel()
      -- the forward's intermediate tensors are the collector's to free: a step
      -- per batch keeps them from piling up between its cycles, whose pace moves
      -- with the Lua heap's size (by 21 MiB of peak in train_cnn_spec's run)
      collectgarbage("step")
    end
    model:train()
    return correct / n
  end

  -- ---- training ----
  local accuracy
  local start, t_last, step_last = mp.clock(), mp.clock(), state.step
  while state.step < total_steps and state.epoch <= opts.epochs do
    -- one explicit seed per epoch, so a resumed run sees the same order
    local loader = mp.data.loader(train, {batch = opts.batch, shuffle = true, seed = opts.seed * 1000003 + state.epoch,
                                          shard = shard})
    local loss_sum, loss_n = 0, 0
    local b = 0
    for x, y in loader do
      b = b + 1
      if b > state.batch then
        opt:zero_grad()
        local loss
        if scaler then
          do
            local _ <close> = region(fp8s)
            loss = mp.cross_entropy(model(x:reshape(spec.shape)), y)
          end
          if opts.tiny then loss = loss * 2.0 ^ -opts.tiny end
          -- a spike, as a rare bad batch makes (gradients 2^12 larger): at the usual
          -- scales (2^16) the scaled backward overflows in f16, at 2^3 and below not
          local spike = opts["inject-overflow"] and (state.step + 1) % opts["inject-overflow"] == 0
                        and (opts["inject-rank"] == nil or opts["inject-rank"] == rank)
          scaler:scale(spike and loss * 2.0 ^ 12 or loss):backward()
          scaler:step(opt)     -- skipped (false) when a gradient holds inf/NaN
          scaler:update()
          if fp8s then fp8s:update() end
        else
          loss = mp.cross_entropy(model(x:reshape(spec.shape)), y)
          if opts.tiny then loss = loss * 2.0 ^ -opts.tiny end
          loss:backward()
          opt:step()
        end
        state.step, state.batch = state.step + 1, b
        local l = loss:item() * (opts.tiny and 2.0 ^ opts.tiny or 1)   -- the true loss
        if not scaler or (l == l and math.abs(l) ~= math.huge) then   -- a forward overflow's loss stays out of the mean
          loss_sum, loss_n = loss_sum + l, loss_n + 1
        end
        local now = mp.clock()
        local rate = (state.step - step_last) * opts.batch * world / math.max(now - t_last, 1e-9)
        if tty and (state.step % 10 == 0 or state.step == total_steps) then
          progress(l, rate, (total_steps - state.step) * opts.batch * world / math.max(rate, 1e-9))
        end
        if state.step % LOG_EVERY == 0 then
          if not tty then
            print(string.format("step %d/%d  epoch %d  loss %.4f  %.0f samples/s%s", state.step, total_steps, state.epoch, l, rate,
              scaler and string.format("  scale %g", scaler:get_scale()) or ""))
          end
          if metrics then
            local amp_fields = ""
            if scaler then
              amp_fields = string.format(', "scale": %.9g, "skipped": %d', scaler:get_scale(), scaler.stats.skipped)
            end
            metrics:write(string.format('{"step": %d, "epoch": %d, "loss": %.6g, "lr": %.6g, "samples_per_s": %.1f%s}\n',
              state.step, state.epoch, l, opt.lr, rate, amp_fields))
            metrics:flush()
          end
          t_last, step_last = now, state.step
        end
        if state.step >= total_steps then break end
      end
    end
    local finished_epoch = state.batch >= #loader
    if tty then io_write("\n") end
    accuracy = evaluate()
    print(string.format("epoch %d  train loss %.4f  test accuracy %.4f  (%.1f s)%s", state.epoch,
      loss_n > 0 and loss_sum / loss_n or 0 / 0, accuracy, mp.clock() - start,
      scaler and string.format("  loss scale %g  skipped %d", scaler:get_scale(), scaler.stats.skipped) or ""))
    if finished_epoch then state.epoch, state.batch = state.epoch + 1, 0 end
    if opts.save then save(opts.save) end
  end
  if metrics then metrics:close() end
  if scaler then scaler:trace(false) end
  accuracy = accuracy or evaluate()
  if scaler then
    local st, parts = scaler.stats, {}
    for _, r in ipairs{"overflow", "nan", "forward"} do
      if skips[r] > 0 then parts[#parts + 1] = r .. " " .. skips[r] end
    end
    print(string.format("skipped steps: %d of %d%s", st.skipped, st.steps,
      #parts > 0 and (" (" .. table.concat(parts, ", ") .. ")") or ""))
  end
  print(string.format("final test accuracy: %.4f", accuracy))
  if opts.dist then mp.dist.finalize() end
end
