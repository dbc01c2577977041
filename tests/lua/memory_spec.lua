-- memory_spec.lua: engine memory from Lua (docs/DESIGN.md section 4): the binding
-- paces Lua's collector with the engine's bytes so that scripts never need
-- collectgarbage(); __gc, __close and t:free() release tensors.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/memory_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local MiB = 1024 * 1024

local function in_use() return mp.memory().in_use end

-- a full collection (twice: a finalizer may free what another held)
local function full_gc()
  collectgarbage()
  collectgarbage()
end

describe("memory", function()
  it("mp.memory() reports in_use, peak, limit, storages and cached as integers, for the default device", function()
    full_gc()
    collectgarbage("stop")   -- no finalizer may free a tensor between the two readings
    local m = mp.memory()
    for _, k in ipairs { "in_use", "peak", "limit", "storages", "cached" } do
      assert.are.equal("integer", math.type(m[k]), k)
      assert.is_true(m[k] >= 0, k)
    end
    assert.is_true(m.limit > 0)
    assert.are.equal(mp.default_device(), m.device)
    local m2 = mp.memory(mp.default_device())
    collectgarbage("restart")
    assert.are.same(m, m2)
    assert.are.equal("cpu", mp.memory("cpu").device)
    H.raises(function() mp.memory("tpu") end, { "mp.memory", "tpu" })
  end)

  it("counts exactly the bytes of each dtype", function()
    full_gc()
    local base = in_use()
    local sizes = { f32 = 4, f16 = 2, bf16 = 2, i32 = 4, u8 = 1 }
    for dt, es in pairs(sizes) do
      local t = mp.zeros({ 10, 100 }, { dtype = dt })
      assert.are.equal(base + 1000 * es, in_use(), dt)
      t:free()
      assert.are.equal(base, in_use(), dt)
    end
  end)

  it("50,000 tensors of 1 MiB in a loop without collectgarbage() stay bounded", function()
    local rss0 = H.rss()
    if not rss0 then
      pending("no /proc/self/status on this system")
      return
    end
    full_gc()
    local use0 = in_use()
    local peak_rss, peak_use = rss0, use0
    for i = 1, 50000 do
      local t = mp.zeros { 262144 } -- 1 MiB of f32
      if i % 5000 == 0 then
        local r, u = H.rss(), in_use()
        if r > peak_rss then peak_rss = r end
        if u > peak_use then peak_use = u end
        assert.is_true(t:numel() == 262144)
      end
    end
    local r, u = H.rss(), in_use()
    if r > peak_rss then peak_rss = r end
    if u > peak_use then peak_use = u end
    local grew = (peak_rss - rss0) / MiB
    assert.is_true(grew < 1024, string.format("resident size grew by %.0f MiB (limit 1024)", grew))
    local held = (peak_use - use0) / MiB
    assert.is_true(held < 512, string.format("engine held up to %.0f MiB at once (limit 512)", held))
  end)

  -- A full collection traverses the whole Lua heap, so the pacing collects at most
  -- once per (twice) the heap's bytes of tensors handed. Before that bound, a heap
  -- larger than what the device held was traversed every second 1 MiB tensor: with
  -- a 44 MB heap, 20,000 of them took 168 s instead of 0.8 s.
  it("a large Lua heap is not traversed at every few tensors handed", function()
    local heap = {}
    for i = 1, 150000 do heap[i] = { i } end   -- about 9 MB of small tables
    full_gc()
    local heap_bytes = collectgarbage("count") * 1024
    local collections = 0
    -- a finalized object made anew at each collection counts the full ones (Lua's
    -- own collector is stopped; the binding's full collections still run)
    local function sentinel() setmetatable({}, { __gc = function() collections = collections + 1; sentinel() end }) end
    collectgarbage("stop")
    local ok, err = pcall(function()
      sentinel()
      for _ = 1, 1000 do local t = mp.zeros { 262144 } end   -- 1000 MiB handed
    end)
    collectgarbage("restart")
    assert(ok, err)
    local most = math.ceil(1000 * MiB / heap_bytes) + 2
    assert.is_true(collections >= 1, "the pacing never collected")
    assert.is_true(collections <= most, string.format("%d full collections of a %.1f MB heap for 1000 MiB of tensors (at most %d)",
                                                      collections, heap_bytes / 1e6, most))
    heap = nil
    full_gc()
  end)

  it("a loop of changing sizes holds within a small factor of the engine's peak (the caching allocator's bound)", function()
    local rss0 = H.rss()
    if not rss0 then
      pending("no /proc/self/status on this system")
      return
    end
    full_gc()
    mp.empty_cache("cpu")
    mp.reset_peak_memory("cpu")
    local m0 = mp.memory("cpu")
    local peak_rss, kept = rss0, {}
    -- glibc alone kept ~30x the engine's peak resident in this loop (scripts/bench/bench_memory.lua)
    for i = 1, 600 do
      local t = mp.zeros({(1 + (i * 7919) % 2048) * 4096}, {device = "cpu"})
      kept[#kept + 1] = t:sum()
      if i % 20 == 0 then peak_rss = math.max(peak_rss, H.rss()) end
    end
    local m = mp.memory("cpu")
    local grew, peak = (peak_rss - rss0) / MiB, (m.peak - m0.in_use) / MiB
    assert.is_true(grew < 3 * peak + 64, string.format("resident size grew by %.0f MiB; the engine's peak was %.0f MiB", grew, peak))
    assert.is_true(m.in_use + m.cached <= 2 * m.peak + 32 * MiB, "the cache holds more than twice the peak")
    mp.empty_cache("cpu")
    assert.are.equal(0, mp.memory("cpu").cached)
  end)

  -- Issue 24: a stream of tensors of scattered sizes (4 bytes to 16 MiB), at most
  -- 50 kept, the rest dropped to the collector, on the run's device. Lua's
  -- generational collector freed a dropped tensor that had lived through two young
  -- collections only in a major one, which the small Lua heap never started: for
  -- 99 MiB kept the engine had 1039 MiB in use and the RSS grew 1217 MiB. With the
  -- collector paced, the cache still kept what the stream left (283 MiB) through a
  -- loop of one size, until mp.empty_cache(). In a child: a fresh process
  -- measures its own growth.
  it("a stream of scattered sizes, 50 tensors kept, holds within 3x the bytes kept", function()
    local r = H.child([[
      local function rss()
        local f = io.open("/proc/self/statm")
        if not f then return nil end
        local s = f:read("l")
        f:close()
        return tonumber(s:match("^%d+%s+(%d+)")) * 4096
      end
      math.randomseed(24)
      collectgarbage()
      collectgarbage()
      local dev = mp.default_device()
      local m0, rss0 = mp.memory(), rss()
      mp.reset_peak_memory()
      local alive, live, peak_live, peak_held, peak_rss = {}, 0, 0, 0, 0
      for i = 1, 6000 do
        local n = math.floor(2 ^ (math.random() * 22))
        local k = math.random(50)
        if alive[k] then live = live - alive[k]:numel() * 4 end
        alive[k] = mp.zeros { n }
        live = live + n * 4
        peak_live = math.max(peak_live, live)
        local m = mp.memory()
        peak_held = math.max(peak_held, m.in_use + m.cached - m0.in_use - m0.cached)
        if rss0 and i % 10 == 0 then peak_rss = math.max(peak_rss, rss() - rss0) end
      end
      local use = mp.memory().peak - m0.in_use
      -- then a loop of one size: what the stream left in the cache goes unused, and back
      alive = nil
      for _ = 1, 1000 do local t = mp.zeros { 262144 } end
      return string.format("%d %d %d %d %s %d", peak_live, use, peak_held,
                           rss0 and dev == "cpu" and peak_rss or -1, dev, mp.memory().cached)]], false,
      { MP_DEVICE = mp.default_device() })
    local live, use, held, grew, dev, cached = r.out:match("^OK:(%d+) (%d+) (%d+) (%-?%d+) (%S+) (%d+)$")
    assert.is_truthy(live, r.out .. r.err)
    live, use, held, grew, cached = tonumber(live), tonumber(use), tonumber(held), tonumber(grew), tonumber(cached)
    assert.are.equal(mp.default_device(), dev)
    local what = string.format("kept at most %.0f MiB; in use at most %.0f MiB, held %.0f MiB, RSS grew %.0f MiB",
                               live / MiB, use / MiB, held / MiB, grew / MiB)
    assert.is_true(use <= 3 * live, "garbage waited for the collector: " .. what)
    assert.is_true(held <= 3 * live, "the cache held too much: " .. what)
    if grew >= 0 then assert.is_true(grew <= 3 * live + 16 * MiB, "the process grew too much: " .. what) end
    assert.is_true(cached <= 16 * MiB, string.format("%.0f MiB stayed cached through 1000 MiB of 1 MiB tensors", cached / MiB))
  end)

  it("after dropping references and a full collection, in_use returns to its start", function()
    full_gc()
    local base = mp.memory()
    do
      local keep = {}
      for i = 1, 100 do keep[i] = mp.randn { 1000 } end
      local a = mp.ones { 300, 300 }
      local b = a:reshape { 900, 100 }
      local c = a:transpose(1, 2)
      local d = mp.matmul(a, c) + 1
      local e = d:sum(1):f16()
      assert.is_true(in_use() > base.in_use + 100 * 4000)
      keep, a, b, c, d, e = nil, nil, nil, nil, nil, nil
    end
    full_gc()
    local now = mp.memory()
    assert.are.equal(base.in_use, now.in_use)
    assert.are.equal(base.storages, now.storages)
  end)

  it("t:free() releases at once, without the collector", function()
    full_gc()
    local base = mp.memory()
    collectgarbage("stop")
    local ok, err = pcall(function()
      local t = mp.zeros { 262144 }
      assert.are.equal(base.in_use + MiB, in_use())
      assert.are.equal(base.storages + 1, mp.memory().storages)
      t:free()
      assert.are.equal(base.in_use, in_use())
      assert.are.equal(base.storages, mp.memory().storages)
    end)
    collectgarbage("restart")
    assert(ok, err)
  end)

  it("free() of one of two tensors sharing storage keeps the storage", function()
    full_gc()
    local base = in_use()
    local t = mp.zeros { 262144 }
    local v = t:reshape { 512, 512 }
    local n = t:narrow(1, 1, 1000)
    assert.are.equal(base + MiB, in_use())
    t:free()
    assert.are.equal(base + MiB, in_use())
    v:free()
    assert.are.equal(base + MiB, in_use())
    local s = n:sum()
    assert.are.equal(0, s:item())
    s:free()
    n:free()
    assert.are.equal(base, in_use())
  end)

  it("a <close> variable releases its tensor at the end of the scope", function()
    full_gc()
    local base = in_use()
    do
      local t <close> = mp.ones { 1000 }
      assert.are.equal(base + 4000, in_use())
      local s <close> = t:sum()
      assert.are.equal(1000, s:item())
    end
    assert.are.equal(base, in_use())
  end)

  it("a <close> variable releases its tensor when an error unwinds the scope", function()
    full_gc()
    local base = in_use()
    local ok = pcall(function()
      local t <close> = mp.ones { 1000 }
      error("boom")
    end)
    assert.is_false(ok)
    assert.are.equal(base, in_use())
  end)

  it("a <close> on a tensor already freed is harmless", function()
    full_gc()
    local base = in_use()
    do
      local t <close> = mp.ones { 1000 }
      t:free()
    end
    assert.are.equal(base, in_use())
  end)

  it("__gc releases a dropped tensor", function()
    full_gc()
    local base = in_use()
    local t = mp.zeros { 262144 }
    assert.are.equal(base + MiB, in_use())
    t = nil
    full_gc()
    assert.are.equal(base, in_use())
  end)

  it("freed blocks stay cached for the next tensor of their size until mp.empty_cache()", function()
    full_gc()
    local dev = mp.default_device()
    local t = mp.zeros { 262144 }
    local before = mp.counters(dev).device_mallocs
    t:free()
    assert.is_true(mp.memory().cached >= MiB, "a freed MiB is cached")
    local u = mp.zeros { 262144 }   -- the same size class: the cached block, no system allocation
    assert.are.equal(before, mp.counters(dev).device_mallocs)
    u:free()
    mp.empty_cache()
    assert.are.equal(0, mp.memory().cached)
    local w = mp.zeros { 262144 }   -- now from the system again
    assert.are.equal(before + 1, mp.counters(dev).device_mallocs)
    w:free()
    mp.empty_cache("cpu")
    assert.are.equal(0, mp.memory("cpu").cached)
    H.raises(function() mp.empty_cache("tpu") end, { "mp.empty_cache", "tpu" })
    if not mp.cuda.is_available() then
      H.raises(function() mp.cuda.empty_cache() end, { "mp.cuda.empty_cache", "not available" })
    else
      mp.cuda.empty_cache()
      assert.are.equal(0, mp.cuda.memory().cached)
    end
  end)

  it("peak is at least in_use and records the high-water mark", function()
    full_gc()
    local m0 = mp.memory()
    assert.is_true(m0.peak >= m0.in_use)
    local t = mp.zeros { 4 * 262144 } -- 4 MiB
    local m1 = mp.memory()
    assert.is_true(m1.peak >= m1.in_use)
    assert.is_true(m1.peak >= m0.in_use + 4 * MiB)
    t:free()
    local m2 = mp.memory()
    assert.is_true(m2.peak >= m2.in_use)
    assert.is_true(m2.peak >= m1.peak, "peak never goes down")
    assert.are.equal(m0.in_use, m2.in_use)
  end)
end)
