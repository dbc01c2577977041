-- bench_memory.lua: what the process holds against what the engine holds, in a
-- loop that makes and drops large tensors of many sizes (issue 10, item 4).
-- Before the CPU caching allocator, glibc kept the freed large blocks: the
-- resident size reached several times the engine's peak in-use bytes.
-- Prints one line: peak RSS growth, the engine's peak in-use bytes, the ratio,
-- what the cache holds at the end, and the time per tensor. The same script
-- runs on builds from before the allocator (436fa95) for the comparison.
-- mpengine scripts/bench/bench_memory.lua [iterations]
local mp = require "mp"

local function rss_mib()
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)")) / 1024
end

local iters = tonumber(arg and arg[1]) or 3000
local MiB = 1024 * 1024

collectgarbage()
local rss0 = rss_mib()
local peak_rss, peak_use = rss0, 0
local kept = {}
local wall0 = mp.clock()
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
                    .. "(ratio %.2f), cached at the end %.0f MiB, %.0f us per tensor",
                    iters, peak_rss - rss0, peak_use, (peak_rss - rss0) / peak_use, (m.cached or 0) / MiB,
                    wall * 1e6 / iters))
