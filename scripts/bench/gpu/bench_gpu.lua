-- bench_gpu.lua: the mpengine side of `make bench-gpu` (scripts/bench/gpu/run.sh).
--
--   build/mpengine scripts/bench/gpu/bench_gpu.lua matmul   -- f16/bf16 C = A@B, n = 4096, 8192
--   build/mpengine scripts/bench/gpu/bench_gpu.lua mlp      -- the f16 AMP MLP training step
--   build/mpengine scripts/bench/gpu/bench_gpu.lua gpt      -- the GPT-2-small f16 AMP training step
--   build/mpengine scripts/bench/gpu/bench_gpu.lua cnn      -- train_cnn.lua's CNN, f16 AMP, a large batch
--   build/mpengine scripts/bench/gpu/bench_gpu.lua attention -- mp.attention forward + backward, GPT-2's shape
--
-- Each mode runs in a process of its own, so that mp.cuda.memory().peak (which
-- counts from the start of the process) is the MLP's alone.
--
-- Output: human-readable lines starting with '#', and one parseable line per figure,
--   ROW <key> <value> <unit>
-- with the same keys as bench_gpu_torch.py prints; run.sh joins the two.
--
-- Timing: mp.cuda.synchronize(), a loop of reps, mp.cuda.synchronize(), after a
-- warm-up; several such trials, the median trial. Nothing in the timed loops reads
-- a value back from the GPU (no :item()).
--
-- MP_BENCH_SMOKE=1: a smoke test on the CPU with tiny sizes and few steps (the
-- figures mean nothing; it checks that the script runs end to end). Without it
-- and without a GPU it prints one "skipped" line and exits 0.
local mp = mp or require "mp"

local mode = arg and arg[1] or "matmul"
local SMOKE = (os.getenv("MP_BENCH_SMOKE") or "") ~= "" and os.getenv("MP_BENCH_SMOKE") ~= "0"
local dev = SMOKE and "cpu" or "cuda"

if not SMOKE and not mp.cuda.is_available() then
  print("# bench_gpu " .. mode .. ": skipped: no GPU (mp.cuda.is_available() is false)")
  os.exit(0)
end
mp.set_default_device(dev)

local function sync()
  if dev == "cuda" then mp.cuda.synchronize() end
end

local function median(t)
  local c = {}
  for i = 1, #t do c[i] = t[i] end
  table.sort(c)
  return c[(#c + 1) // 2]
end

-- seconds per call of step: warm-up calls, then trials of `steps` calls between
-- two syncs; the median trial
local function timed_steps(step, warmup, steps, trials)
  for _ = 1, warmup do step() end
  sync()
  local times = {}
  for t = 1, trials do
    local t0 = mp.clock()
    for _ = 1, steps do step() end
    sync()
    times[t] = (mp.clock() - t0) / steps
  end
  return median(times)
end

local function row(key, value, unit)
  print(string.format("ROW %s %.6g %s", key, value, unit))
end

-- ---- a. matmul ----

local function bench_matmul()
  local sizes = SMOKE and {64, 128} or {4096, 8192}
  local trials = SMOKE and 2 or 5
  for _, dt in ipairs{"f16", "bf16"} do
    for _, n in ipairs(sizes) do
      mp.manual_seed(0)
      local a = mp.randn({n, n}, {dtype = dt, device = dev})
      local b = mp.randn({n, n}, {dtype = dt, device = dev})
      -- each trial about 50 ms on an H200 (~0.2 ms per 4096^3, ~1.5 ms per 8192^3)
      local reps = SMOKE and 3 or (n <= 4096 and 200 or 30)
      for _ = 1, 5 do mp.matmul(a, b):free() end   -- warm-up: cuBLAS heuristics, the allocator's cache
      sync()
      local times = {}
      for t = 1, trials do
        local t0 = mp.clock()
        for _ = 1, reps do mp.matmul(a, b):free() end   -- free(): the block goes back to the cache at once
        sync()
        times[t] = (mp.clock() - t0) / reps
      end
      local s = median(times)
      local tflops = 2 * n * n * n / s / 1e12
      print(string.format("# mpengine matmul %s n=%d: %.3f ms per C = A@B (median of %d trials x %d reps), %.1f TFLOP/s",
        dt, n, s * 1e3, trials, reps, tflops))
      row(string.format("matmul_%s_%d", dt, n), tflops, "TFLOP/s")
      a:free()
      b:free()
    end
  end
end

-- ---- c. the Fashion-MNIST MLP training step, f16 AMP, dynamic loss scaling ----

local function bench_mlp()
  local BATCH = SMOKE and 32 or 1024
  local WARMUP, STEPS, TRIALS = SMOKE and 2 or 30, SMOKE and 3 or 200, SMOKE and 2 or 3
  local NB = 8   -- distinct batches, cycled
  local nn = mp.nn
  mp.manual_seed(0)
  -- synthetic data already on the device: the benchmark is about step speed
  -- (inputs uniform in [0,1] like Fashion-MNIST's pixels / 255, labels 0..9)
  local batches = {}
  for i = 1, NB do
    local labels = {}
    for j = 1, BATCH do labels[j] = (i * 7919 + j * 104729) % 10 end
    batches[i] = {mp.rand({BATCH, 784}, {device = dev}), mp.tensor(labels, {dtype = "i32", device = dev})}
  end
  local model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
  model:to(dev)
  local opt = mp.optim.Adam(model:parameters(), {lr = 1e-3})
  local policy = mp.amp.policy.dynamic{}
  local ok, scaler = pcall(mp.amp.GradScaler, {policy = policy, sync = false})
  local note = "sync = false"
  if not ok then
    if not tostring(scaler):find("unknown option 'sync'", 1, true) then error(scaler, 0) end
    scaler = mp.amp.GradScaler{policy = policy}
    note = "this build has no GradScaler sync option: default (synchronous) scaler"
  end

  local s = 0
  local loss
  local function step()
    s = s + 1
    local b = batches[(s - 1) % NB + 1]
    opt:zero_grad()
    do
      local _ <close> = mp.amp.autocast("f16")
      loss = mp.cross_entropy(model(b[1]), b[2])
    end
    scaler:scale(loss):backward()
    scaler:step(opt)
    scaler:update()
  end

  local ms = timed_steps(step, WARMUP, STEPS, TRIALS) * 1e3
  local peak = (dev == "cuda" and mp.cuda.memory() or mp.memory(dev)).peak
  print(string.format("# mpengine mlp 784-512-256-10 batch %d, f16 autocast + GradScaler(dynamic, %s) + Adam: "
    .. "%.3f ms/step (median of %d trials x %d steps), %.0f samples/s, peak %s memory %.1f MiB (mp.%smemory().peak)",
    BATCH, note, ms, TRIALS, STEPS, BATCH / ms * 1e3, dev, peak / 2^20, dev == "cuda" and "cuda." or ""))
  print(string.format("# mpengine mlp after %d steps: loss %.4f, loss scale %g, %d of %d steps skipped (synthetic data: "
    .. "random inputs in [0,1], random labels)", s, loss:item(), scaler:get_scale(), scaler.stats.skipped,
    scaler.stats.steps))
  row("mlp_samples_per_s", BATCH / ms * 1e3, "samples/s")
  row("mlp_peak_mem", peak / 2^20, "MiB")
end

-- ---- d. GPT-2 small (scripts/models/gpt.lua), f16 AMP, dynamic scaling, AdamW ----
-- 12 layers, d 768, 12 heads, T 1024, vocab 50304; batch MP_BENCH_GPT_BATCH (32:
-- fits both sides on an H200's 141 GB; not searched, to spare device time);
-- MP_BENCH_GPT_STEPS="warm-up,steps,trials" (3,10,3; scripts/gpu_check.sh, with
-- its few minutes, takes a smaller batch and fewer steps, the same on both sides).
-- MFU: the model's FLOPs per token (6 N + 6 L T d for attention's two products,
-- forward and backward, causal half counted whole as PyTorch's bench counts it)
-- over the H200's dense f16 peak, 989 TFLOP/s.
local function bench_gpt()
  local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
  local GPT = dofile(here .. "../../models/gpt.lua")
  local cfg = SMOKE and {vocab = 128, ctx = 32, layers = 2, dim = 64, heads = 4}
    or {vocab = 50304, ctx = 1024, layers = 12, dim = 768, heads = 12}
  local B = tonumber(os.getenv("MP_BENCH_GPT_BATCH") or (SMOKE and 2 or 32))
  local T = cfg.ctx
  local WARMUP, STEPS, TRIALS = SMOKE and 1 or 3, SMOKE and 2 or 10, SMOKE and 1 or 3
  local knob = os.getenv("MP_BENCH_GPT_STEPS")
  if knob and not SMOKE then
    local w, s, t = knob:match("^(%d+),(%d+),(%d+)$")
    assert(w, "MP_BENCH_GPT_STEPS must be warm-up,steps,trials (got " .. knob .. ")")
    WARMUP, STEPS, TRIALS = tonumber(w), tonumber(s), tonumber(t)
  end
  mp.manual_seed(0)
  local model = GPT(cfg)
  model:to(dev)
  local opt = mp.optim.AdamW(mp.optim.decay_groups(model, 0.1), {lr = 6e-4})
  local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}}
  local nparams = 0
  for _, p in ipairs(model:parameters()) do nparams = nparams + p:numel() end
  local x = mp.randint(0, cfg.vocab, {B, T}, {device = dev})
  local y = mp.randint(0, cfg.vocab, {B, T}, {device = dev})
  local loss
  -- a training step with scaler sc (the eager rows' and, below, the graph's)
  local function step_with(sc)
    return function()
      opt:zero_grad()
      do
        local _ <close> = mp.amp.autocast("f16")
        loss = mp.cross_entropy(model(x):reshape{-1, cfg.vocab}, y:reshape{-1})
      end
      sc:scale(loss):backward()
      sc:step(opt)
      sc:update()
      return loss
    end
  end
  local step = step_with(scaler)
  local sec = timed_steps(step, WARMUP, STEPS, TRIALS)
  local tokens = B * T / sec
  local flops_per_token = 6 * nparams + 6 * cfg.layers * T * cfg.dim
  local mfu = tokens * flops_per_token / 989e12
  local peak = (dev == "cuda" and mp.cuda.memory() or mp.memory(dev)).peak
  print(string.format("# mpengine gpt %dL d%d h%d T%d vocab %d (%.1f M parameters) batch %d, f16 autocast + "
    .. "GradScaler(dynamic) + AdamW: %.1f ms/step (median of %d trials x %d steps), %.0f tokens/s, MFU %.1f%%, "
    .. "peak %s memory %.0f MiB; loss %.3f", cfg.layers, cfg.dim, cfg.heads, T, cfg.vocab, nparams / 1e6, B,
    sec * 1e3, TRIALS, STEPS, tokens, mfu * 100, dev, peak / 2^20, loss:item()))
  row("gpt_tokens_per_s", tokens, "tokens/s")
  row("gpt_mfu", mfu * 100, "%")
  row("gpt_peak_mem", peak / 2^20, "MiB")
  -- the same step captured once as a CUDA graph (mp.cuda.graph, after the warm
  -- steps above) and replayed: no host work per step but the launch
  if dev == "cuda" then
    -- a scaler that keeps its skip decision on the device (sync = false): a
    -- capture refuses the host read of sync = true
    local gstep = step_with(mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}, sync = false})
    gstep()   -- the warm-up step a capture needs (the scaler's state made outside it)
    local ok, g = pcall(mp.cuda.graph, gstep)
    if not ok then
      print("# mpengine gpt as a CUDA graph: capture refused: " .. tostring(g))
      return
    end
    local gsec = timed_steps(function() g:replay() end, WARMUP, STEPS, TRIALS)
    print(string.format("# mpengine gpt as a CUDA graph (mp.cuda.graph, replayed): %.1f ms/step, %.0f tokens/s",
      gsec * 1e3, B * T / gsec))
    row("gpt_graph_tokens_per_s", B * T / gsec, "tokens/s")
    g:free()
  end
end

-- ---- e. the CNN of scripts/train_cnn.lua (scripts/models/cnn.lua), f16 AMP, Adam ----
-- Fashion-MNIST-sized inputs (1 x 28 x 28, synthetic), batch MP_BENCH_CNN_BATCH (4096:
-- enough work per step to keep the GPU busy; not searched, to spare device time),
-- NCHW on both sides.
local function bench_cnn()
  local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
  local CNN = dofile(here .. "../../models/cnn.lua")
  local B = tonumber(os.getenv("MP_BENCH_CNN_BATCH") or (SMOKE and 16 or 4096))
  local WARMUP, STEPS, TRIALS = SMOKE and 1 or 5, SMOKE and 2 or 20, SMOKE and 1 or 3
  mp.manual_seed(0)
  local model = CNN {}
  model:to(dev)
  local opt = mp.optim.Adam(model:parameters(), {lr = 1e-3})
  local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}}
  local x = mp.rand({B, 1, 28, 28}, {device = dev})
  local y = mp.randint(0, 10, {B}, {device = dev})
  local loss
  local function step()
    opt:zero_grad()
    do
      local _ <close> = mp.amp.autocast("f16")
      loss = mp.cross_entropy(model(x), y)
    end
    scaler:scale(loss):backward()
    scaler:step(opt)
    scaler:update()
  end
  local sec = timed_steps(step, WARMUP, STEPS, TRIALS)
  local peak = (dev == "cuda" and mp.cuda.memory() or mp.memory(dev)).peak
  print(string.format("# mpengine cnn (conv 1-32-64 + batch norm + pooling, 3136-128-10) batch %d, f16 autocast + "
    .. "GradScaler(dynamic) + Adam: %.2f ms/step (median of %d trials x %d steps), %.0f samples/s, peak %s memory "
    .. "%.0f MiB; loss %.3f", B, sec * 1e3, TRIALS, STEPS, B / sec, dev, peak / 2^20, loss:item()))
  row("cnn_samples_per_s", B / sec, "samples/s")
  row("cnn_peak_mem", peak / 2^20, "MiB")
end

-- ---- f. attention forward + backward (mp.attention, the tensor-core kernels of
-- kernels/cuda/cuda_flash.cu), GPT-2 small's shape: batch MP_BENCH_GPT_BATCH (8
-- here), 12 heads, T 1024, head dim 64, causal, f16 and bf16. FLOPs as
-- step_model.lua counts them: 2 B T^2 d forward and 5 B T^2 d backward (causal
-- halves), the same count on both sides.
local function bench_attention()
  local B = SMOKE and 1 or tonumber(os.getenv("MP_BENCH_ATTN_BATCH") or 8)
  local H, T, D = SMOKE and 2 or 12, SMOKE and 64 or 1024, 64
  local WARMUP, STEPS, TRIALS = SMOKE and 1 or 3, SMOKE and 2 or 20, SMOKE and 1 or 3
  for _, dt in ipairs{"f16", "bf16"} do
    mp.manual_seed(0)
    local function t() return mp.randn({B, H, T, D}, {dtype = dt, device = dev}):requires_grad(true) end
    local q, k, v = t(), t(), t()
    local g = mp.randn({B, H, T, D}, {dtype = dt, device = dev})
    local function step()
      q.grad, k.grad, v.grad = nil, nil, nil
      mp.attention(q, k, v, {causal = true}):backward(g)
    end
    local sec = timed_steps(step, WARMUP, STEPS, TRIALS)
    local flops = 7 * B * H * T * T * D
    print(string.format("# mpengine attention %s B%d H%d T%d d%d causal, forward + backward: %.3f ms (median of %d "
      .. "trials x %d), %.1f TFLOP/s", dt, B, H, T, D, sec * 1e3, TRIALS, STEPS, flops / sec / 1e12))
    row("attention_" .. dt, flops / sec / 1e12, "TFLOP/s")
  end
end

if mode == "matmul" then
  bench_matmul()
elseif mode == "mlp" then
  bench_mlp()
elseif mode == "gpt" then
  bench_gpt()
elseif mode == "cnn" then
  bench_cnn()
elseif mode == "attention" then
  bench_attention()
else
  io.stderr:write("bench_gpu.lua: mode must be matmul, mlp, gpt, cnn or attention (got " .. tostring(mode) .. ")\n")
  os.exit(2)
end
