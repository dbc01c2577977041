-- bench_gpt.lua: training throughput of the default GPT of scripts/train_gpt.lua
-- (2 layers, d 128, 4 heads, ctx 64, batch 32, AdamW with decay groups, clipping)
-- in mpengine and in PyTorch (scripts/bench/bench_gpt_torch.py, the same model at
-- its fastest thread setting), in one run: tokens/s (median step after a warm-up)
-- and peak RSS, in f32 and under bf16 and f16 autocast (PyTorch 1.13's CPU autocast
-- has bf16 only), each configuration in its own process. Also the floor no engine
-- passes: the step's matmul FLOPs over the GEMM rate (f32 and bf16) measured in the same run.
-- MP_BENCH_ROUNDS=N alternates mpengine's and PyTorch's runs N times and reports
-- medians and the per-round speed's spread (for a noisy machine); PyTorch's bf16
-- runs 2 steps where the processor has no AVX512-BF16 (seconds a step there).
-- The f16 / f32 step ratio (target <= 1.1x) is also measured with both in one process,
-- their steps alternating (bc.f16_vs_f32), which this VM's noise moves far less.
-- Figures, not tests: nothing here fails on speed.
local mp = mp or require "mp"

local STEPS, WARMUP = tonumber(os.getenv("MP_BENCH_STEPS") or 40), 5
local B, T, D, L, V, H = 32, 64, 128, 2, 114, 4
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local exe = arg and arg[-1] or "build/mpengine"
local bc = dofile(here .. "../lib/bench_child.lua")

-- one configuration in this process (a child run): prints median_ms and peak RSS
local mode = os.getenv("MP_BENCH_GPT_MODE")
if mode then
  local GPT = dofile(here .. "../models/gpt.lua")
  mp.manual_seed(0)
  local ids = mp.randint(0, V, { 2300000 }, { device = "cpu" })
  -- a model of its own for mode m, and its timed step (seconds)
  local function setup(m)
    mp.manual_seed(0)
    local model = GPT { vocab = V, ctx = T, layers = L, dim = D, heads = H }
    local opt = mp.optim.AdamW(mp.optim.decay_groups(model, 0.1), { lr = 3e-3 })
    local scaler = m == "f16" and mp.amp.GradScaler {} or nil
    return function()
      local x, y = mp.data.windows(ids, B, T)
      local t0 = mp.clock()
      opt:zero_grad()
      local loss
      do
        local _ <close> = m ~= "f32" and mp.amp.autocast(m) or nil
        loss = mp.cross_entropy(model(x):reshape { -1, V }, y:reshape { -1 })
      end
      if scaler then
        scaler:scale(loss):backward()
        scaler:unscale(opt)
        mp.optim.clip_grad_norm(model:parameters(), 1.0)
        scaler:step(opt)
        scaler:update()
      else
        loss:backward()
        mp.optim.clip_grad_norm(model:parameters(), 1.0)
        opt:step()
      end
      loss:item()
      return mp.clock() - t0
    end
  end
  if mode == "f16_vs_f32" then   -- both in this process, alternating (bc.alternate)
    local a, b = bc.alternate(setup("f32"), setup("f16"), WARMUP, STEPS)
    print(string.format("f32_ms=%.3f f16_ms=%.3f", a * 1000, b * 1000))
    return
  end
  local step, times = setup(mode), {}
  for s = 1, WARMUP + STEPS do
    local t = step()
    if s > WARMUP then times[#times + 1] = t end
  end
  bc.report(mode, times)
  return
end

local function child(m) return bc.mpengine("MP_BENCH_GPT_MODE", m, STEPS, exe, here .. "bench_gpt.lua") end
local function torch(m)
  local steps, warmup, capped = bc.torch_steps(m, STEPS, WARMUP)
  return string.format("/usr/bin/python3 %sbench_gpt_torch.py %d %d %%d %s", here, steps, warmup, m), capped and steps
end

-- the floor: forward + backward matmul FLOPs (3x the forward's) at the GEMM rate
-- measured here for the dtype (f32; bf16 for bf16 autocast, whose products are bf16)
local function floor_ms(dtype)
  local gflops = bc.gemm_gflops(dtype)
  local tok = B * T
  local per_layer = 2 * tok * D * (3 * D) + 2 * tok * D * D + 2 * 2 * tok * D * (4 * D) + 2 * 2 * B * H * T * T * (D // H)
  local fwd = L * per_layer + 2 * tok * D * V
  return 3 * fwd / (gflops * 1e9) * 1000, gflops
end

local tokens = B * T
local fl, gflops = floor_ms("f32")
local flb, gflopsb = floor_ms("bf16")
print(string.format("gpt train step (2 layers, d %d, ctx %d, batch %d = %d tokens): GEMM f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s here; matmul floor f32 %.2f ms, bf16 %.2f ms",
  D, T, B, tokens, gflops, gflopsb, fl, flb))
for _, m in ipairs { "f32", "bf16", "f16" } do
  local floor = m == "bf16" and flb or fl   -- f16 autocast: no f16 GEMM rate measured, the f32 floor
  local cmd, capped = nil, nil
  if m ~= "f16" then cmd, capped = torch(m) end
  local ms, rss, tms, trss, th, spread = bc.side_by_side(function() return child(m) end, cmd)
  if not ms then
    print("gpt " .. m .. ": mpengine run failed")
  elseif tms then
    print(string.format("gpt %-4s  mpengine %.1f ms %6.0f tokens/s %5.0f MiB | pytorch %.1f ms %6.0f tokens/s %5.0f MiB (threads=%d%s) | speed %.2fx%s (target >= 1.2x) | x floor: mpengine %.2fx, pytorch %.2fx (target <= 1.5x)",
      m, ms, tokens / ms * 1000, rss, tms, tokens / tms * 1000, trss, th, capped and string.format(", %d steps", capped) or "",
      tms / ms, spread and " (rounds " .. spread .. ")" or "", ms / floor, tms / floor))
  else
    print(string.format("gpt %-4s  mpengine %.1f ms %6.0f tokens/s %5.0f MiB | pytorch: %s | %.2fx %s floor", m, ms, tokens / ms * 1000, rss,
      m == "f16" and "no f16 CPU autocast in 1.13" or "not available", ms / floor, m == "f16" and "the f32" or "its"))
  end
end
print(bc.f16_vs_f32("gpt", "MP_BENCH_GPT_MODE", STEPS, exe, here .. "bench_gpt.lua"))
