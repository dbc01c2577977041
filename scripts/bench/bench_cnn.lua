-- bench_cnn.lua: training throughput of the CNN of scripts/train_cnn.lua (two blocks
-- of conv 3x3, batch norm, ReLU, max pool; 3136-128-10; Adam; batch 128 of 1 x 28 x 28)
-- in mpengine and in PyTorch (scripts/bench/bench_cnn_torch.py, the same model at its
-- fastest thread setting), in one run: samples/s (median step after a warm-up) and
-- peak RSS, in f32 and under bf16 and f16 autocast (PyTorch 1.13's CPU autocast has
-- bf16 only), each configuration in its own process.
-- Figures, not tests: nothing here fails on speed.
local mp = mp or require "mp"

local STEPS, WARMUP, BATCH = tonumber(os.getenv("MP_BENCH_STEPS") or 30), 5, 128
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local exe = arg and arg[-1] or "build/mpengine"

-- one configuration in this process (a child run): prints median_ms and peak RSS
local mode = os.getenv("MP_BENCH_CNN_MODE")
if mode then
  local CNN = dofile(here .. "../models/cnn.lua")
  mp.manual_seed(0)
  local model = CNN {}
  local opt = mp.optim.Adam(model:parameters(), { lr = 1e-3 })
  local scaler = mode == "f16" and mp.amp.GradScaler {} or nil
  local xs, ys = mp.rand { 8, BATCH, 1, 28, 28 }, mp.randint(0, 10, { 8, BATCH })
  local times = {}
  for s = 1, WARMUP + STEPS do
    local x, y = xs:select(1, (s - 1) % 8 + 1), ys:select(1, (s - 1) % 8 + 1)
    local t0 = mp.clock()
    opt:zero_grad()
    local loss
    do
      local _ <close> = mode ~= "f32" and mp.amp.autocast(mode) or nil
      loss = mp.cross_entropy(model(x), y)
    end
    if scaler then
      scaler:scale(loss):backward()
      scaler:step(opt)
      scaler:update()
    else
      loss:backward()
      opt:step()
    end
    loss:item()
    if s > WARMUP then times[#times + 1] = mp.clock() - t0 end
  end
  table.sort(times)
  local rss = 0
  for line in io.lines("/proc/self/status") do
    local kb = line:match("^VmHWM:%s+(%d+) kB")
    if kb then rss = tonumber(kb) / 1024 end
  end
  print(string.format("mode=%s median_ms=%.3f peak_rss_mib=%.1f", mode, times[(#times + 1) // 2] * 1000, rss))
  return
end

local function child(m)
  local p = io.popen(string.format("MP_BENCH_CNN_MODE=%s MP_BENCH_STEPS=%d %s %sbench_cnn.lua 2>&1", m, STEPS, exe, here))
  local out = p:read("a")
  p:close()
  return tonumber(out:match("median_ms=([%d.]+)")), tonumber(out:match("peak_rss_mib=([%d.]+)")), out
end

local function torch(m)
  local best, rss, threads
  for _, th in ipairs { 1, 2 } do
    local p = io.popen(string.format("/usr/bin/python3 %sbench_cnn_torch.py %d %d %d %s %d 2>&1", here, STEPS, WARMUP,
                                     th, m, BATCH))
    local out = p:read("a")
    p:close()
    local ms = tonumber(out:match("median_ms=([%d.]+)"))
    if ms and (not best or ms < best) then best, rss, threads = ms, tonumber(out:match("peak_rss_mib=([%d.]+)")), th end
    if not ms then return nil, nil, nil, out end
  end
  return best, rss, threads
end

print(string.format("cnn train step (conv 1-32-64 with batch norm and pooling, 3136-128-10, batch %d of 1x28x28, Adam)",
  BATCH))
for _, m in ipairs { "f32", "bf16", "f16" } do
  local ms, rss, out = child(m)
  local tms, trss, th = nil, nil, nil
  if m ~= "f16" then tms, trss, th = torch(m) end
  if not ms then
    print("cnn " .. m .. ": mpengine run failed: " .. tostring(out))
  elseif tms then
    print(string.format("cnn %-4s  mpengine %.1f ms %6.0f samples/s %5.0f MiB | pytorch %.1f ms %6.0f samples/s %5.0f MiB (threads=%d) | speed %.2fx (target >= 1.0x)",
      m, ms, BATCH / ms * 1000, rss, tms, BATCH / tms * 1000, trss, th, tms / ms))
  else
    print(string.format("cnn %-4s  mpengine %.1f ms %6.0f samples/s %5.0f MiB | pytorch: %s", m, ms, BATCH / ms * 1000, rss,
      m == "f16" and "no f16 CPU autocast in 1.13" or "not available"))
  end
end
