-- bench_cnn.lua: training throughput of the CNN of scripts/train_cnn.lua (two blocks
-- of conv 3x3, batch norm, ReLU, max pool; 3136-128-10; Adam; batch 128 of 1 x 28 x 28)
-- in mpengine and in PyTorch (scripts/bench/bench_cnn_torch.py, the same model at its
-- fastest thread setting), in one run: samples/s (median step after a warm-up) and
-- peak RSS, in f32 and under bf16 and f16 autocast (PyTorch 1.13's CPU autocast has
-- bf16 only), each configuration in its own process. Also the GEMM floor: the
-- step's conv and linear FLOPs (forward multiply-adds x 2 x 3) at the GEMM rate
-- measured in the same run (f32; bf16 for bf16 autocast), and the step's ratio to it.
-- MP_BENCH_ROUNDS=N alternates mpengine's and PyTorch's runs N times and reports
-- medians and the per-round speed's spread (for a noisy machine); PyTorch's bf16
-- runs 2 steps where the processor has no AVX512-BF16 (seconds a step there).
-- The f16 / f32 step ratio (target <= 1.1x) is also measured with both in one process,
-- their steps alternating (bc.f16_vs_f32), which this VM's noise moves far less.
-- Figures, not tests: nothing here fails on speed.
local mp = mp or require "mp"

local STEPS, WARMUP, BATCH = tonumber(os.getenv("MP_BENCH_STEPS") or 30), 5, 128
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local exe = arg and arg[-1] or "build/mpengine"
local bc = dofile(here .. "../lib/bench_child.lua")

-- one configuration in this process (a child run): prints median_ms and peak RSS
local mode = os.getenv("MP_BENCH_CNN_MODE")
if mode then
  local CNN = dofile(here .. "../models/cnn.lua")
  local xs, ys = mp.rand { 8, BATCH, 1, 28, 28 }, mp.randint(0, 10, { 8, BATCH })
  local function setup(m)
    mp.manual_seed(0)
    local model = CNN {}
    return { model = model, opt = mp.optim.Adam(model:parameters(), { lr = 1e-3 }), xs = xs, ys = ys, mode = m,
             scaler = m == "f16" and mp.amp.GradScaler {} or nil, steps = STEPS, warmup = WARMUP }
  end
  if mode == "f16_vs_f32" then   -- both in this process, alternating (bc.alternate)
    local a, b = setup("f32"), setup("f16")
    local ta, tb = bc.alternate(function(s) return bc.step(a, s) end, function(s) return bc.step(b, s) end, WARMUP, STEPS)
    print(string.format("f32_ms=%.3f f16_ms=%.3f", ta * 1000, tb * 1000))
    return
  end
  bc.report(mode, bc.time_steps(setup(mode)))
  return
end

local function child(m) return bc.mpengine("MP_BENCH_CNN_MODE", m, STEPS, exe, here .. "bench_cnn.lua") end
local function torch(m)
  local steps, warmup, capped = bc.torch_steps(m, STEPS, WARMUP)
  return string.format("/usr/bin/python3 %sbench_cnn_torch.py %d %d %%d %s %d", here, steps, warmup, m, BATCH), capped and steps
end

-- forward multiply-adds per sample: conv 1->32 at 28x28, conv 32->64 at 14x14, 3136x128, 128x10
local MACS = 28 * 28 * 1 * 32 * 9 + 14 * 14 * 32 * 64 * 9 + 3136 * 128 + 128 * 10
local gflops, gflopsb = bc.gemm_gflops("f32"), bc.gemm_gflops("bf16")
local fl, flb = 6 * BATCH * MACS / (gflops * 1e9) * 1000, 6 * BATCH * MACS / (gflopsb * 1e9) * 1000
print(string.format("cnn train step (conv 1-32-64 with batch norm and pooling, 3136-128-10, batch %d of 1x28x28, Adam): GEMM f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s here; conv/linear floor f32 %.2f ms, bf16 %.2f ms",
  BATCH, gflops, gflopsb, fl, flb))
for _, m in ipairs { "f32", "bf16", "f16" } do
  local floor = m == "bf16" and flb or fl   -- f16 autocast: no f16 GEMM rate measured, the f32 floor
  local cmd, capped = nil, nil
  if m ~= "f16" then cmd, capped = torch(m) end
  local ms, rss, tms, trss, th, spread, out = bc.side_by_side(function() return child(m) end, cmd)
  if not ms then
    print("cnn " .. m .. ": mpengine run failed: " .. tostring(out))
  elseif tms then
    print(string.format("cnn %-4s  mpengine %.1f ms %6.0f samples/s %5.0f MiB | pytorch %.1f ms %6.0f samples/s %5.0f MiB (threads=%d%s) | speed %.2fx%s (target >= 1.2x) | x floor: mpengine %.2fx, pytorch %.2fx (target <= 1.5x)",
      m, ms, BATCH / ms * 1000, rss, tms, BATCH / tms * 1000, trss, th, capped and string.format(", %d steps", capped) or "",
      tms / ms, spread and " (rounds " .. spread .. ")" or "", ms / floor, tms / floor))
  else
    print(string.format("cnn %-4s  mpengine %.1f ms %6.0f samples/s %5.0f MiB | pytorch: %s | %.2fx %s floor", m, ms, BATCH / ms * 1000, rss,
      m == "f16" and "no f16 CPU autocast in 1.13" or "not available", ms / floor, m == "f16" and "the f32" or "its"))
  end
end
print(bc.f16_vs_f32("cnn", "MP_BENCH_CNN_MODE", STEPS, exe, here .. "bench_cnn.lua"))
