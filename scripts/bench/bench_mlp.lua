-- bench_mlp.lua: training throughput of the Fashion-MNIST MLP (784-512-256-10,
-- ReLU, Adam, batch 128) in mpengine, side by side with the same model, batch and
-- optimizer in PyTorch (scripts/bench/bench_mlp_torch.py), in one run.
-- Figures are medians of per-step wall times after a warm-up.
local mp = mp or require "mp"

local STEPS, WARMUP, BATCH = tonumber(os.getenv("MP_BENCH_STEPS") or 300), 30, 128

local function median(t)
  table.sort(t)
  return t[(#t + 1) // 2]
end

local function bench_mpengine()
  mp.manual_seed(0)
  local nn = mp.nn
  local model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
  local opt = mp.optim.Adam(model:parameters(), {lr = 1e-3})
  local train = mp.data.fashion_mnist("train")
  local batches = {}
  for x, y in mp.data.loader(train, {batch = BATCH, shuffle = true, seed = 1}) do
    local dev = mp.default_device()   -- MP_DEVICE=cuda measures the GPU
    batches[#batches + 1] = {x:reshape{-1, 784}:to(dev), y:to(dev)}
    if #batches == 64 then break end
  end
  local times = {}
  for s = 1, WARMUP + STEPS do
    local b = batches[(s - 1) % #batches + 1]
    local t0 = mp.clock()
    opt:zero_grad()
    local loss = mp.cross_entropy(model(b[1]), b[2])
    loss:backward()
    opt:step()
    loss:item()
    if s > WARMUP then times[#times + 1] = mp.clock() - t0 end
  end
  return median(times)
end

local function bench_torch()
  local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
  local p = io.popen(string.format("/usr/bin/python3 %sbench_mlp_torch.py %d %d 2>&1", here, STEPS, WARMUP))
  local out = p:read("a")
  p:close()
  local best, label = nil, nil
  for threads, ms in out:gmatch("torch threads=(%d+) median_ms=([%d.]+)") do
    ms = tonumber(ms)
    if not best or ms < best then best, label = ms, threads end
  end
  return best, label, out
end

local ms = bench_mpengine() * 1000
print(string.format("mlp train step (batch %d, Adam, f32)  mpengine %.2f ms  %.0f samples/s", BATCH, ms, BATCH / ms * 1000))
local tms, threads, out = bench_torch()
if not tms then
  print("mlp train step: PyTorch not available, row skipped (" .. (out:match("[^\n]*") or "") .. ")")
else
  print(string.format("mlp train step (batch %d, Adam, f32)  pytorch %.2f ms  %.0f samples/s  (torch threads=%s, its fastest)",
    BATCH, tms, BATCH / tms * 1000, threads))
  print(string.format("mlp train step: mpengine / pytorch speed = %.2fx (target >= 1.5x)", tms / ms))
end
