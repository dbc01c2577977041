-- bench_trace.lua: what reading a long loss-scaler trace back costs (issue 24,
-- item 3): a gzip'd trace of MP_BENCH_STEPS steps (default 2,000,000) of two
-- parameters with a dozen non-empty histogram bins, written through the engine's
-- line files, then mp.amp.load_trace and an mp.amp.replay under the dynamic policy:
-- seconds of each, the Lua heap after each (the packed records are userdata: the
-- heap counts them), the records' own bytes a step, and the process's peak RSS.
-- Before the records were held packed, a table per record took 3.5 KB a step
-- (7 GB for these 2 million steps); see docs/ARCHITECTURE.md, "Traces".
-- Figures, not tests.
--
--   build/mpengine scripts/bench/bench_trace.lua      (or lua5.4 with LUA_PATH/LUA_CPATH set)
local mp = mp or require "mp"
local core = require "mp.core"

local STEPS = tonumber(os.getenv("MP_BENCH_STEPS") or 2000000)
local HEADER = '{"bins":64,"hist_lo":-48,"meta":{},"params":["0.weight","0.bias"],"policy":{"kind":"dynamic"},'
  .. '"trace":"mpengine.scaler","version":1}'
local RECORD = '{"step":%d,"scale":65536,"applied":true,"reason":null,"loss":2.30258512,"params":['
  .. '{"n":120,"amax":0.0123456789,"nan":0,"inf":0,"zeros":0,"underflow":0,"overflow":0,"lo":30,'
  .. '"hist":[1,3,9,20,40,30,12,5]},'
  .. '{"n":10,"amax":0.00234567891,"nan":0,"inf":0,"zeros":0,"underflow":0,"overflow":0,"lo":28,"hist":[1,2,4,3]}]}'

local function peak_rss_mb()
  local f = io.open("/proc/self/status", "r")
  if not f then return 0 / 0 end
  local kb = f:read("a"):match("VmHWM:%s*(%d+)")
  f:close()
  return kb and tonumber(kb) / 1024 or 0 / 0
end
local function heap_mb() collectgarbage("collect"); return collectgarbage("count") / 1024 end

local path = os.tmpname() .. "-bench.jsonl.gz"
local t0 = mp.clock()
do
  local f = assert(core._lines_open(path, "w"))
  f:write(HEADER)
  for s = 1, STEPS do f:write(string.format(RECORD, s)) end
  f:close()
end
local size = io.open(path, "rb"):seek("end")
print(string.format("trace: %d steps, %.1f MB gzip'd, written in %.1f s", STEPS, size / 1e6, mp.clock() - t0))

t0 = mp.clock()
local tr = mp.amp.load_trace(path)
local t_load = mp.clock() - t0
print(string.format("load_trace: %.1f s, Lua heap %.0f MB, records %.0f bytes a step, peak RSS %.0f MB", t_load,
  heap_mb(), core._trace_bytes(tr.steps) / #tr.steps, peak_rss_mb()))
t0 = mp.clock()
local traj = mp.amp.replay(tr, mp.amp.policy.dynamic {})
print(string.format("replay (dynamic): %.1f s for %d steps, Lua heap %.0f MB, peak RSS %.0f MB", mp.clock() - t0, #traj,
  heap_mb(), peak_rss_mb()))
os.remove(path)
