-- bench_resnet.lua: training throughput of the ResNets of scripts/models/resnet.lua
-- (basic blocks, 3x3 stem, stride-2 3x3 convs and 1x1 projections between stages,
-- adaptive average pool, linear to 10 classes; SGD with momentum; random 3 x 32 x 32
-- batches): the small one (16/32/64 channels, one block a stage) and a wider, deeper
-- one (32/64/128 channels, two blocks a stage), at batch 32 and 128, in f32 and under
-- bf16 autocast, in mpengine and in PyTorch (scripts/bench/bench_resnet_torch.py, the
-- same model at its fastest thread setting), in one run: ms per step (median step
-- after a warm-up) and peak RSS, each configuration in its own process. Also each
-- configuration's GEMM floor: its convolutions' and linear layer's FLOPs (forward
-- multiply-adds x 2 x 3 for forward and backward) at the GEMM rate measured in the
-- same run (f32; bf16 for bf16 autocast), and the step's ratio to it.
-- MP_BENCH_STEPS=N runs N steps in every configuration (the defaults: fewer for the
-- bigger ones, so that the whole run stays within a few minutes on 2 cores).
-- MP_BENCH_ROUNDS=N alternates mpengine's and PyTorch's runs N times and reports
-- medians and the per-round speed's spread (for a noisy machine). PyTorch's bf16
-- runs 2 steps where the processor has no AVX512-BF16 (seconds a step there).
-- Figures, not tests: nothing here fails on speed.
local mp = mp or require "mp"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local exe = arg and arg[-1] or "build/mpengine"
local bc = dofile(here .. "../lib/bench_child.lua")
local ResNet = dofile(here .. "../models/resnet.lua")

-- one configuration in this process (a child run): MODE_W1-W2-W3_BLOCKS_BATCH_WARMUP;
-- prints median_ms and peak RSS
local spec = os.getenv("MP_BENCH_RESNET_MODE")
if spec then
  local mode, widths, blocks, batch, warmup = spec:match("^(%w+)_([%d%-]+)_(%d+)_(%d+)_(%d+)$")
  local w = {}
  for d in widths:gmatch("%d+") do w[#w + 1] = tonumber(d) end
  blocks, batch, warmup = tonumber(blocks), tonumber(batch), tonumber(warmup)
  local steps = tonumber(os.getenv("MP_BENCH_STEPS"))
  mp.manual_seed(0)
  local model = ResNet { widths = w, blocks = blocks }
  local opt = mp.optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
  local xs, ys = mp.rand { 4, batch, 3, 32, 32 }, mp.randint(0, 10, { 4, batch })
  local times = bc.time_steps { model = model, opt = opt, xs = xs, ys = ys, mode = mode, steps = steps,
                                warmup = warmup }
  bc.report(mode, times)
  return
end

local STEPS = tonumber(os.getenv("MP_BENCH_STEPS"))
local configs = {   -- default steps and warm-up per configuration
  { name = "resnet",      widths = { 16, 32, 64 },  blocks = 1, batch = 32,  steps = 20, warmup = 3 },
  { name = "resnet",      widths = { 16, 32, 64 },  blocks = 1, batch = 128, steps = 10, warmup = 2 },
  { name = "resnet-wide", widths = { 32, 64, 128 }, blocks = 2, batch = 32,  steps = 10, warmup = 2 },
  { name = "resnet-wide", widths = { 32, 64, 128 }, blocks = 2, batch = 128, steps = 5,  warmup = 1 },
}

local gflops = { f32 = bc.gemm_gflops("f32"), bf16 = bc.gemm_gflops("bf16") }
print(string.format("resnet train steps (basic blocks, 3x32x32 inputs, 10 classes, SGD momentum): GEMM f32 %.1f GFLOP/s, bf16 %.1f GFLOP/s here",
  gflops.f32, gflops.bf16))
print("floor: the step's conv/linear FLOPs (forward MACs x 2 x 3) at that GEMM rate; x floor: step time / floor (target <= 1.5x); speed: PyTorch / mpengine (target >= 1.2x)")
for _, c in ipairs(configs) do
  local steps, wl = STEPS or c.steps, table.concat(c.widths, "-")
  local label = string.format("%-11s %s x%d b%-3d", c.name, wl, c.blocks, c.batch)
  for _, m in ipairs { "f32", "bf16" } do
    local tsteps, twarm, capped = bc.torch_steps(m, steps, c.warmup)
    local ms, rss, tms, trss, th, spread, out = bc.side_by_side(function()
        return bc.mpengine("MP_BENCH_RESNET_MODE", string.format("%s_%s_%d_%d_%d", m, wl, c.blocks, c.batch, c.warmup),
          steps, exe, here .. "bench_resnet.lua")
      end, string.format("/usr/bin/python3 %sbench_resnet_torch.py %d %d %%d %s %d %s %d", here, tsteps, twarm, m, c.batch,
        table.concat(c.widths, ","), c.blocks))
    local flops = 6 * c.batch * ResNet.macs({ widths = c.widths, blocks = c.blocks }, 32)
    local floor = flops / (gflops[m] * 1e9) * 1000
    if not ms then
      print(label .. " " .. m .. ": mpengine run failed: " .. tostring(out))
    elseif tms then
      print(string.format("%s %-4s  mpengine %7.1f ms %5.0f MiB | pytorch %7.1f ms %5.0f MiB (threads=%d%s) | speed %.2fx%s | floor %6.1f ms (%.2f GFLOP): mpengine %.2fx, pytorch %.2fx",
        label, m, ms, rss, tms, trss, th, capped and string.format(", %d steps", tsteps) or "", tms / ms,
        spread and " (rounds " .. spread .. ")" or "", floor, flops / 1e9, ms / floor, tms / floor))
    else
      print(string.format("%s %-4s  mpengine %7.1f ms %5.0f MiB | pytorch: not available | floor %6.1f ms (%.2f GFLOP): mpengine %.2fx",
        label, m, ms, rss, floor, flops / 1e9, ms / floor))
    end
  end
end
