-- bench_amp.lua: mixed precision on the CPU, in one run (issue 4, item 10).
--
--   1. the Fashion-MNIST MLP (784-512-256-10, ReLU, Adam lr 1e-3, batch 128) as
--      FP32, f16 autocast + dynamic loss scaler, and bf16 autocast (policy none,
--      PyTorch's bf16 recipe): ms/step, samples/s, AMP rate / FP32 rate;
--   2. bf16 AMP against PyTorch CPU's bf16 autocast on the same model
--      (scripts/bench/bench_amp_torch.py, its fastest thread setting);
--   3. the scaler's unscale + inf/NaN check + statistics pass over the gradient
--      arena (kernels/cpu/cpu_scaler.c via scaler:unscale(opt)) as GB/s, bytes
--      read + written, against a plain copy of the same bytes, with telemetry off
--      and on, and its share of an f16 AMP step;
--   4. the f16 step with scaler:trace recording every step (telemetry on, a JSON
--      line written and flushed per step) against the same step without, in the
--      same run (target: tracing costs at most 10% of the step), and the trace's
--      bytes per step, plain and gzip'd.
--
-- Figures are medians of per-step wall times (mp.clock) after a warm-up. The
-- three step variants alternate every BLOCK steps, so that a noisy neighbour
-- slows all of them alike; the p10..p90 line shows how noisy the run was (on a
-- busy machine all three slow down, and the AMP ratios read too high, because
-- the FP32 step loses its second BLAS thread while AMP's extra work is serial).
-- Figures, not tests: nothing here fails on speed.
--
-- MP_BENCH_STEPS (default 300) sets the measured steps per variant.
local mp = mp or require "mp"

local STEPS, WARMUP, BATCH = tonumber(os.getenv("MP_BENCH_STEPS") or 300), 30, 128
local BLOCK = 10        -- steps per variant in a row: the variants alternate this often
local PASSES = 300      -- timed repetitions of the scaler pass and of the copy

local function quantile(t, q)
  local c = {}
  for i = 1, #t do c[i] = t[i] end
  table.sort(c)
  return c[math.max(1, math.min(#c, math.floor(q * #c + 0.5)))]
end
local function median(t) return quantile(t, 0.5) end

local nn = mp.nn

local batches = {}
do
  local train = mp.data.fashion_mnist("train")
  for x, y in mp.data.loader(train, {batch = BATCH, shuffle = true, seed = 1}) do
    batches[#batches + 1] = {x:reshape{-1, 784}, y}
    if #batches == 64 then break end
  end
end

-- one training run: mode "f32", "f16" (autocast + dynamic scaler) or "bf16"
-- (autocast, policy none); run:step() does and times one step
local function new_run(mode)
  mp.manual_seed(0)
  local model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
  local r = {mode = mode, model = model, opt = mp.optim.Adam(model:parameters(), {lr = 1e-3}),
             s = 0, times = {}, unscale_times = {}}
  if mode == "f16" or mode == "f16trace" then
    r.scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}}
    if mode == "f16trace" then
      r.trace_path = os.tmpname() .. ".jsonl"
      local _, names = model:named_parameters()
      r.scaler:trace(r.trace_path, {names = names})
    end
  elseif mode == "bf16" then
    r.scaler = mp.amp.GradScaler{policy = mp.amp.policy.none()}
  end
  return r
end

local function step(r, keep)
  r.s = r.s + 1
  local b = batches[(r.s - 1) % #batches + 1]
  local opt, scaler = r.opt, r.scaler
  local t0 = mp.clock()
  opt:zero_grad()
  if not scaler then
    local loss = mp.cross_entropy(r.model(b[1]), b[2])
    loss:backward()
    opt:step()
    loss:item()
    if keep then r.times[#r.times + 1] = mp.clock() - t0 end
    return
  end
  local loss
  do
    local _ <close> = mp.amp.autocast(r.mode == "f16trace" and "f16" or r.mode)
    loss = mp.cross_entropy(r.model(b[1]), b[2])
  end
  scaler:scale(loss):backward()
  -- step() would unscale by itself; calling it first times the pass inside a real step
  local u0 = mp.clock()
  scaler:unscale(opt)
  local u1 = mp.clock()
  scaler:step(opt)
  scaler:update()
  loss:item()
  if keep then
    r.times[#r.times + 1] = mp.clock() - t0
    r.unscale_times[#r.unscale_times + 1] = u1 - u0
  end
end

-- the variants alternate in blocks; the traced one runs in a second phase, since a
-- trace turns telemetry on, and with it the flush counting of every low-precision
-- rounding in the process (cpu_store counts; the fused kernels step aside): in
-- one phase the plain f16 step would be timed with the counting on
local function alternate(runs)
  for _, r in ipairs(runs) do
    for _ = 1, WARMUP do step(r, false) end
  end
  for _ = 1, math.max(1, STEPS // BLOCK) do
    for _, r in ipairs(runs) do
      for _ = 1, BLOCK do step(r, true) end
    end
  end
end
local f32, f16, bf16 = new_run("f32"), new_run("f16"), new_run("bf16")
alternate {f32, f16, bf16}
local f16c, f16t = new_run("f16"), new_run("f16trace")
alternate {f16c, f16t}
local ms32, ms16, msbf = median(f32.times) * 1000, median(f16.times) * 1000, median(bf16.times) * 1000

print(string.format("amp mlp step (batch %d, Adam)  f32 %.2f ms  f16 %.2f ms (%.2fx)  bf16 %.2f ms (%.2fx)",
  BATCH, ms32, ms16, ms32 / ms16, msbf, ms32 / msbf))
print(string.format("amp mlp samples/s  f32 %.0f  f16 %.0f  bf16 %.0f  (AMP rate / FP32 rate, target >= 0.7x: f16 %s, bf16 %s)",
  BATCH / ms32 * 1000, BATCH / ms16 * 1000, BATCH / msbf * 1000,
  ms32 / ms16 >= 0.7 and "met" or "MISSED", ms32 / msbf >= 0.7 and "met" or "MISSED"))
print(string.format("amp mlp f16 step / f32 step  %.2fx (target <= 1.1x on a CPU without f16 arithmetic: %s)",
  ms16 / ms32, ms16 / ms32 <= 1.1 and "met" or "MISSED"))
local function spread(r) return string.format("%.2f..%.2f", quantile(r.times, 0.1) * 1000, quantile(r.times, 0.9) * 1000) end
print(string.format("amp mlp step p10..p90 ms  f32 %s  f16 %s  bf16 %s  (f16: %d of %d steps skipped, loss scale %g)",
  spread(f32), spread(f16), spread(bf16), f16.scaler.stats.skipped, f16.scaler.stats.steps, f16.scaler:get_scale()))

-- ---- 2. bf16 against PyTorch's bf16 autocast ----

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"

-- runs bench_amp_torch.py; the fastest thread setting, its label, all of them, the output
local function bench_torch(env, steps, warmup, rounds, flag, tag)
  local p = io.popen(string.format("%s/usr/bin/python3 %sbench_amp_torch.py %d %d %d %s 2>&1", env, here, steps,
    warmup, rounds, flag))
  local out = p:read("a")
  p:close()
  local best, label, all = nil, nil, {}
  for th, ms in out:gmatch(tag .. " threads=(%d+) median_ms=([%d.]+)") do
    ms = tonumber(ms)
    all[#all + 1] = string.format("threads=%s %.2f ms", th, ms)
    if not best or ms < best then best, label = ms, th end
  end
  return best, label, table.concat(all, ", "), out
end

local tms, threads, all, out = bench_torch("", STEPS, WARMUP, 3, "", "torch bf16")
if not tms then
  print("amp mlp bf16 vs pytorch: PyTorch not available, row skipped (" .. (out:match("[^\n]*") or "") .. ")")
else
  print(string.format("amp mlp bf16 step  mpengine %.2f ms  %.0f samples/s  pytorch autocast %.2f ms  %.0f samples/s  (%s; %s)",
    msbf, BATCH / msbf * 1000, tms, BATCH / tms * 1000, out:match("torch [^\n]-default threads=%d+") or "torch", all))
  print(string.format("amp mlp bf16: mpengine / pytorch speed = %.2fx (target >= 5x: %s)  pytorch's bf16 path here: %s",
    tms / msbf, tms / msbf >= 5 and "met" or "MISSED", out:match("torch bf16 path: ([^\n]*)") or "?"))
  -- The target assumes an AVX2-only machine, where PyTorch 1.13 cannot use oneDNN
  -- for bf16 and falls back to ATen's non-BLAS kernels. On an AVX-512 machine, take
  -- that fallback on purpose too, for the figure such a machine would give.
  if (out:match("torch bf16 path: ([^\n]*)") or ""):match("^oneDNN") then
    local ems, eth, eall = bench_torch("ATEN_CPU_CAPABILITY=avx2 ", 20, 3, 1, "--no-onednn", "torch bf16 no%-onednn")
    if ems then
      print(string.format("amp mlp bf16 vs pytorch as on an AVX2-only machine (oneDNN off, ATEN_CPU_CAPABILITY=avx2): "
        .. "pytorch %.2f ms (%s)  mpengine / pytorch = %.1fx (for information)", ems, eall, ems / msbf))
    end
  end
end

-- ---- 3. the scaler's pass over the gradient arena against a plain copy ----

-- Real gradients in the arena: one more f16 backward, then the pass runs PASSES
-- times through a scaler with scale 1, so that every pass sees the same values
-- (an unscale by 1/65536 each time would drift them into subnormals).
local opt = f16.opt
do
  local b = batches[1]
  opt:zero_grad()
  local loss
  do
    local _ <close> = mp.amp.autocast("f16")
    loss = mp.cross_entropy(f16.model(b[1]), b[2])
  end
  f16.scaler:scale(loss):backward()
end
local n = opt.numel
local bytes = 2 * 4 * n   -- f32 read + f32 written, for the pass and for the copy

local function time_pass(telemetry)
  local sc = mp.amp.GradScaler{policy = mp.amp.policy.static(1)}
  sc:telemetry(telemetry)
  local t = {}
  for i = 1, PASSES + 10 do
    local t0 = mp.clock()
    sc:unscale(opt)
    local t1 = mp.clock()
    sc:update()
    if i > 10 then t[#t + 1] = t1 - t0 end
  end
  sc:telemetry(false)
  return median(t)
end

local src = mp.randn{n}
local dst = mp.zeros{n}
local function time_copy(clone)
  local t = {}
  for i = 1, PASSES + 10 do
    local t0 = mp.clock()
    local c
    if clone then c = src:clone() else dst:copy_(src) end
    local t1 = mp.clock()
    if c then c:free() end
    if i > 10 then t[#t + 1] = t1 - t0 end
  end
  return median(t)
end

-- interleaved, twice, best of the two medians each: the same conditions for all four
local tp, tt, tc, tk = math.huge, math.huge, math.huge, math.huge
for _ = 1, 2 do
  tp = math.min(tp, time_pass(false))
  tc = math.min(tc, time_copy(false))
  tk = math.min(tk, time_copy(true))
  tt = math.min(tt, time_pass(true))
end
local copy = math.min(tc, tk)
local function gbs(t) return bytes / t / 1e9 end
print(string.format("amp scaler pass (%d f32 grads, %.1f MB r+w)  %.2f GB/s (%.3f ms)  copy %.2f GB/s (%.3f ms; copy_ %.2f, clone %.2f GB/s)  pass/copy %.2fx (target >= 0.5x: %s)",
  n, bytes / 1e6, gbs(tp), tp * 1000, gbs(copy), copy * 1000, gbs(tc), gbs(tk), copy / tp,
  copy / tp >= 0.5 and "met" or "MISSED"))
print(string.format("amp scaler pass, telemetry on  %.2f GB/s (%.3f ms)  pass/copy %.2fx  (%.1fx the pass with telemetry off)",
  gbs(tt), tt * 1000, copy / tt, tt / tp))
local u16 = median(f16.unscale_times) * 1000
print(string.format("amp scaler pass in an f16 step  %.3f ms of %.2f ms = %.1f%% of the step (%.2f GB/s in place)",
  u16, ms16, 100 * u16 / ms16, bytes / (u16 / 1000) / 1e9))

-- ---- 4. tracing: the f16 step with scaler:trace on, against the same step without ----
f16t.scaler:trace(false)
local ms16t, ms16c = median(f16t.times) * 1000, median(f16c.times) * 1000
local fsize = function(p) local f = io.open(p, "rb"); local n = f and f:seek("end") or 0; if f then f:close() end; return n end
local plain = fsize(f16t.trace_path)
local recorded = #mp.amp.load_trace(f16t.trace_path).steps
-- the same records gzip'd, for the size: rewritten through a .gz line file
local gz = f16t.trace_path .. ".gz"
do
  local core = require "mp.core"
  local r, w = core._lines_open(f16t.trace_path, "r"), core._lines_open(gz, "w")
  for line in function() return r:read() end do w:write(line) end
  r:close(); w:close()
end
print(string.format("amp f16 step with scaler:trace  %.2f ms against %.2f ms without: +%.1f%% (target <= 10%%: %s)  "
  .. "trace %.0f bytes/step plain, %.0f gzip'd (%d steps, MLP's 6 parameters)", ms16t, ms16c, 100 * (ms16t / ms16c - 1),
  ms16t / ms16c <= 1.10 and "met" or "MISSED", plain / recorded, fsize(gz) / recorded, recorded))
os.remove(f16t.trace_path); os.remove(gz)
