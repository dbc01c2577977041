-- bench_memory.lua: what the process holds against what the engine holds, in
-- loops that make and drop tensors of many sizes. Two lines:
--
-- 1. "memory churn" (issue 10, item 4): 3000 tensors of 16 KiB-32 MiB in a
--    scattered order, each dropped to the collector, a small result kept.
--    Before the CPU caching allocator, glibc kept the freed large blocks: the
--    resident size reached several times the engine's peak in-use bytes.
-- 2. "scattered sizes, 50 kept" (issue 24, item 5): 20000 mp.zeros{n}, n drawn
--    log-uniformly up to 2^22 (4 bytes to 16 MiB), each stored in one of 50
--    slots so that the one it replaces goes to the collector. The figure is the
--    RSS growth against the most bytes the loop keeps at once (what PyTorch's
--    reference counting would hold). Here (2 cores, 59d1957 against issue 24's
--    pacing and cache): RSS grew 1705 MiB for 119 MiB kept (14.3x), the
--    collector's young collections leaving dropped tensors to pile up, 1126
--    system allocations, 104 us per tensor; now 198 MiB (1.66x), 571, 75 us.
--    Line 1 went from 198 MiB for an engine peak of 96 MiB (2.07x) to 157 MiB
--    for 98 MiB (1.61x).
--
-- Each prints the peak RSS growth, the bytes kept or the engine's peak, the
-- ratio, what the cache holds at the end, the requests to the system and the
-- time per tensor. The same script runs on older builds for the comparison.
-- mpengine scripts/bench/bench_memory.lua [iterations of 1] [iterations of 2]
local mp = require "mp"

local function rss_mib()
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)")) / 1024
end

local MiB = 1024 * 1024
local function mallocs() return mp.counters("cpu").device_mallocs or 0 end

-- ---- 1: 3000 tensors of 16 KiB-32 MiB, each dropped ----
do
  local iters = tonumber(arg and arg[1]) or 3000
  collectgarbage()
  local rss0 = rss_mib()
  local peak_rss, peak_use = rss0, 0
  local kept = {}
  local a0, wall0 = mallocs(), mp.clock()
  for i = 1, iters do
    -- sizes from 16 KiB to 32 MiB in a scattered order; each tensor dropped to the
    -- collector, a small result of it kept (as a loss history is)
    local n = (1 + (i * 7919) % 2048) * 4096
    local t = mp.zeros{n}
    kept[#kept + 1] = t:sum()
    if i % 25 == 0 then
      local r, u = rss_mib(), mp.memory().in_use / MiB
      if r > peak_rss then peak_rss = r end
      if u > peak_use then peak_use = u end
    end
  end
  local wall = mp.clock() - wall0
  local m = mp.memory()
  peak_use = math.max(peak_use, m.peak / MiB)   -- the engine's own high-water mark, between samples too
  print(string.format("memory churn: %d tensors of 16 KiB-32 MiB: peak RSS growth %.0f MiB, engine peak in use %.0f MiB "
                      .. "(ratio %.2f), cached at the end %.0f MiB, %d system allocations, %.0f us per tensor",
                      iters, peak_rss - rss0, peak_use, (peak_rss - rss0) / peak_use, (m.cached or 0) / MiB,
                      mallocs() - a0, wall * 1e6 / iters))
end

-- ---- 2: scattered sizes, 50 kept ----
do
  local iters = tonumber(arg and arg[2]) or 20000
  mp.empty_cache()
  collectgarbage()
  math.randomseed(24)
  local rss0 = rss_mib()
  local peak_rss, peak_live, live, alive = rss0, 0, 0, {}
  if mp.reset_peak_memory then mp.reset_peak_memory() end
  local use0 = mp.memory().in_use
  local a0, wall0 = mallocs(), mp.clock()
  for i = 1, iters do
    local n = math.floor(2 ^ (math.random() * 22))
    local k = math.random(50)
    if alive[k] then live = live - alive[k]:numel() * 4 end
    alive[k] = mp.zeros{n}
    live = live + n * 4
    if live > peak_live then peak_live = live end
    if i % 25 == 0 then
      local r = rss_mib()
      if r > peak_rss then peak_rss = r end
    end
  end
  local wall = mp.clock() - wall0
  local m = mp.memory()
  local kept = peak_live / MiB
  print(string.format("scattered sizes, 50 kept: %d tensors of 4 B-16 MiB: peak RSS growth %.0f MiB, at most %.0f MiB kept "
                      .. "(ratio %.2f), engine peak in use %.0f MiB, cached at the end %.0f MiB, %d system allocations, "
                      .. "%.0f us per tensor", iters, peak_rss - rss0, kept, (peak_rss - rss0) / kept,
                      (m.peak - use0) / MiB, (m.cached or 0) / MiB, mallocs() - a0, wall * 1e6 / iters))
end
