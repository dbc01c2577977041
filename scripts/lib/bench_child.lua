-- bench_child.lua: what the training benchmarks of scripts/bench/ share: each
-- configuration runs in a process of its own (its own peak RSS), mpengine's and
-- PyTorch's alike, and prints one line `... median_ms=X peak_rss_mib=Y`.
--
--   local bc = dofile("scripts/lib/bench_child.lua")
--   bc.report(mode, times)                     -- in the child: the median and VmHWM
--   bc.mpengine(env_var, mode, steps, exe, script) -> ms, rss, output
--   bc.torch(command_without_threads, threads_list) -> best ms, its rss, its threads, output
--   bc.side_by_side(run_mpengine, torch_command) -> ms, rss, torch ms, rss, threads, speed spread, output
--   bc.cpu_flag(flag), bc.torch_steps(dtype, steps, warmup) -> PyTorch's steps, warm-up, capped
--   bc.gemm_gflops(dtype) -> the GEMM rate here (mp.matmul 2048x512 by 512x512, best of 5)
--   bc.step(o, s), bc.time_steps(o) -> a classifier's training step, timed
--   bc.alternate(step_a, step_b, warmup, steps, block) -> two configurations' median
--     step times, their steps alternating in blocks in this process
--   bc.f16_vs_f32(name, env_var, steps, exe, script) -> the f16 / f32 ratio's line
local mp = mp or require "mp"
local bc = {}

-- the median of times (seconds) and the process's peak RSS, as the parent reads them
function bc.report(mode, times)
  table.sort(times)
  local rss = 0
  for line in io.lines("/proc/self/status") do
    local kb = line:match("^VmHWM:%s+(%d+) kB")
    if kb then rss = tonumber(kb) / 1024 end
  end
  print(string.format("mode=%s median_ms=%.3f peak_rss_mib=%.1f", mode, times[(#times + 1) // 2] * 1000, rss))
end

local function figures(out) return tonumber(out:match("median_ms=([%d.]+)")), tonumber(out:match("peak_rss_mib=([%d.]+)")) end

-- the script again in a child process with env_var=mode
function bc.mpengine(env_var, mode, steps, exe, script)
  local p = io.popen(string.format("%s=%s MP_BENCH_STEPS=%d %s %s 2>&1", env_var, mode, steps, exe, script))
  local out = p:read("a")
  p:close()
  local ms, rss = figures(out)
  return ms, rss, out
end

-- a PyTorch command (its thread count appended as %d in `fmt`) at each thread
-- setting: the fastest; nil and the output when one fails
function bc.torch(fmt, threads)
  local best, rss, th
  for _, t in ipairs(threads or {1, 2}) do
    local p = io.popen(string.format(fmt, t) .. " 2>&1")
    local out = p:read("a")
    p:close()
    local ms, r = figures(out)
    if not ms then return nil, nil, nil, out end
    if not best or ms < best then best, rss, th = ms, r, t end
  end
  return best, rss, th
end

local function median(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c[(#c + 1) // 2]
end

-- mpengine's child (run_mpengine() -> ms, rss, output) and a PyTorch command (as
-- bc.torch's) side by side, MP_BENCH_ROUNDS times (default 1) in turn, so that a
-- neighbour that slows the machine for a while slows both sides alike: each side's
-- figure is its median over the rounds (PyTorch's at each thread setting, then the
-- fastest), peak RSS the largest; also the spread of the per-round speed
-- (PyTorch's fastest / mpengine's) as "lo..hi" (nil with one round). torch_command
-- nil: mpengine's figures only. nil and the output when mpengine's run fails.
function bc.side_by_side(run_mpengine, torch_command, threads)
  local rounds = math.max(1, tonumber(os.getenv("MP_BENCH_ROUNDS")) or 1)
  local ms, rss, tms, trss, speeds = {}, 0, {}, {}, {}
  for _ = 1, rounds do
    local m, r, out = run_mpengine()
    if not m then return nil, nil, nil, nil, nil, nil, out end
    ms[#ms + 1], rss = m, math.max(rss, r or 0)
    local best
    for _, t in ipairs(torch_command and (threads or {1, 2}) or {}) do
      local tm, tr = bc.torch(torch_command, {t})
      if tm then
        tms[t] = tms[t] or {}
        table.insert(tms[t], tm)
        trss[t] = math.max(trss[t] or 0, tr or 0)
        best = math.min(best or math.huge, tm)
      end
    end
    if best then speeds[#speeds + 1] = best / m end
  end
  local tbest, tth
  for t, list in pairs(tms) do
    if not tbest or median(list) < tbest then tbest, tth = median(list), t end
  end
  table.sort(speeds)
  local spread = #speeds > 1 and string.format("%.2f..%.2f", speeds[1], speeds[#speeds]) or nil
  return median(ms), rss, tbest, tth and trss[tth], tth, spread
end

-- true when the processor lists flag (as /proc/cpuinfo spells it, e.g. "avx512_bf16")
function bc.cpu_flag(flag)
  local f = io.open("/proc/cpuinfo")
  if not f then return false end
  local text = f:read("a")
  f:close()
  local flags = text:match("\nflags%s*:([^\n]*)") or ""
  return (" " .. flags .. " "):find(" " .. flag .. " ", 1, true) ~= nil
end

-- PyTorch's steps for a dtype: bf16 autocast without AVX512-BF16 runs ATen's
-- scalar bf16 kernels, tens of times slower than its f32 (seconds a step), so
-- 2 steps after 1 of warm-up are plenty to place it
function bc.torch_steps(dtype, steps, warmup)
  if dtype == "bf16" and not bc.cpu_flag("avx512_bf16") then return math.min(steps, 2), math.min(warmup, 1), true end
  return steps, warmup, false
end

-- the GEMM rate measured here for dtype ("f32", "bf16"), in GFLOP/s: the best of 5
-- trials of 10 products 2048x512 by 512x512 (the rate the GEMM reaches here); a
-- model's floor is its step's GEMM FLOPs at this rate
function bc.gemm_gflops(dtype)
  local a, b = mp.randn { 2048, 512 }:to(dtype), mp.randn { 512, 512 }:to(dtype)
  mp.matmul(a, b)
  local n, best = 10, math.huge
  for _ = 1, 5 do
    local t0 = mp.clock()
    for _ = 1, n do mp.matmul(a, b):free() end
    best = math.min(best, mp.clock() - t0)
  end
  return 2 * 2048 * 512 * 512 * n / best / 1e9
end

-- One training step of a classifier bench's child (bench_cnn.lua, bench_resnet.lua)
-- on batch s: zero_grad, the forward and cross-entropy (under autocast when o.mode is
-- not f32), backward (through the scaler when o.scaler), the optimizer step and a
-- read of the loss; batches cycle through the first dim of o.xs/o.ys. Its seconds.
function bc.step(o, s)
  local mp = mp or require "mp"
  local n = o.xs.shape[1]
  local x, y = o.xs:select(1, (s - 1) % n + 1), o.ys:select(1, (s - 1) % n + 1)
  local t0 = mp.clock()
  o.opt:zero_grad()
  local loss
  do
    local _ <close> = o.mode ~= "f32" and mp.amp.autocast(o.mode) or nil
    loss = mp.cross_entropy(o.model(x), y)
  end
  if o.scaler then
    o.scaler:scale(loss):backward()
    o.scaler:step(o.opt)
    o.scaler:update()
  else
    loss:backward()
    o.opt:step()
  end
  loss:item()
  return mp.clock() - t0
end

-- The timed loop of a classifier bench's child: o.warmup + o.steps steps (bc.step),
-- the step times after the warm-up, in seconds.
function bc.time_steps(o)
  local times = {}
  for s = 1, o.warmup + o.steps do
    local t = bc.step(o, s)
    if s > o.warmup then times[#times + 1] = t end
  end
  return times
end

-- Two configurations of one model in one process, their steps alternating in blocks
-- (a: step_a(s) -> seconds, b likewise), for a ratio of their step times that this
-- VM's noise does not move: a neighbour that slows the machine for a while slows
-- both alike, where two processes run one after the other can each meet another
-- phase of it (the f16 / f32 ratio of the CNN ran 0.78x..1.19x between pairs of
-- runs). Each block's first step is not counted (the other configuration's data
-- has left the caches by then). The medians of a's and b's counted steps, seconds.
function bc.alternate(step_a, step_b, warmup, steps, block)
  block = block or 6
  for s = 1, warmup do step_a(s); step_b(s) end
  local ta, tb, s = {}, {}, warmup
  while #ta < steps do
    for j = 1, block do
      local t = step_a(s + j)
      if j > 1 then ta[#ta + 1] = t end
    end
    for j = 1, block do
      local t = step_b(s + j)
      if j > 1 then tb[#tb + 1] = t end
    end
    s = s + block
  end
  return median(ta), median(tb)
end

-- The line of a bench's f16 / f32 ratio: the script's child in mode f16_vs_f32
-- (bc.alternate over the f32 and the f16 AMP step, printing f32_ms=X f16_ms=Y),
-- MP_BENCH_ROUNDS times; the medians and, over rounds, the ratios' spread.
function bc.f16_vs_f32(name, env_var, steps, exe, script)
  local rounds = math.max(1, tonumber(os.getenv("MP_BENCH_ROUNDS")) or 1)
  local a, b, r = {}, {}, {}
  for _ = 1, rounds do
    local p = io.popen(string.format("%s=f16_vs_f32 MP_BENCH_STEPS=%d %s %s 2>&1", env_var, steps, exe, script))
    local out = p:read("a")
    p:close()
    local f32, f16 = tonumber(out:match("f32_ms=([%d.]+)")), tonumber(out:match("f16_ms=([%d.]+)"))
    if not f32 or not f16 then return name .. " f16 / f32 in one process: run failed: " .. out end
    a[#a + 1], b[#b + 1], r[#r + 1] = f32, f16, f16 / f32
  end
  table.sort(r)
  local ratio = median(r)
  return string.format("%s f16 step / f32 step in one process, alternating blocks: f32 %.1f ms  f16 %.1f ms  %.2fx%s (target <= 1.1x: %s)",
    name, median(a), median(b), ratio, #r > 1 and string.format(" (rounds %.2f..%.2f)", r[1], r[#r]) or "",
    ratio <= 1.1 and "met" or "MISSED")
end

return bc
