-- cuda_graph_spec.lua: a whole training step captured as a CUDA graph and
-- replayed (mp.cuda.graph; issue 29 item 3).
--
-- The capture records the step's kernels, copies and cuBLAS calls on the
-- backend's stream; each replay re-issues them. A replayed step must give the
-- eager step's losses and parameters bit for bit (the same kernels on the same
-- data in the same order), allocate nothing, wait for nothing, and what a
-- replay cannot repeat must be refused inside the capture with an error naming
-- mp.cuda.graph and the operation, leaving the engine usable.
--
-- Runs where the CUDA device can capture: make test's pass on the emulated
-- device (MP_DEVICE=cuda, tests/emu, which learned stream capture), or a GPU.
-- On the CPU-backed fake device (tests/device/fake_cuda.c), which cannot
-- capture, and without CUDA, only the refusals run.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" MP_DEVICE=cuda \
--   MP_CUDA_BACKEND=build/tests/emu_cuda.so busted --no-auto-insulate tests/lua/cuda_graph_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local cuda = mp.cuda.is_available()
-- whether this CUDA backend captures graphs: an empty capture says "nothing was queued" where it does
local graphs, why_not = false, "no CUDA device on this machine"
if cuda then
  local ok, err = pcall(mp.cuda.graph, function() end)
  graphs = not ok and tostring(err):find("nothing was queued", 1, true) ~= nil
  why_not = "this CUDA backend cannot capture graphs (" .. tostring(err) .. ")"
end

-- a small MLP, Adam, an f16 autocast step through GradScaler{sync = false}
-- (nothing read on the host) reading a fixed input buffer x
local function rig(hidden)
  mp.manual_seed(7)
  local nin, nc, b = 20, 5, 16
  local r = {}
  r.model = nn.Sequential(nn.Linear(nin, hidden or 32), nn.ReLU(), nn.Linear(hidden or 32, nc))
  r.model:to("cuda")
  r.opt = mp.optim.Adam(r.model:parameters(), {lr = 1e-2})
  r.scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{interval = 2}, sync = false}
  r.x = mp.zeros({b, nin}, {device = "cuda"})
  local labels = {}
  for i = 1, b do labels[i] = (i - 1) % nc end
  r.y = mp.tensor(labels, {dtype = "i32", device = "cuda"})
  function r.step()
    r.opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast("f16")
      loss = mp.cross_entropy(r.model(r.x), r.y)
    end
    r.scaler:scale(loss):backward()
    r.scaler:step(r.opt)
    r.scaler:update()
    return loss
  end
  return r
end

local function batches(n)
  mp.manual_seed(99)
  local t = {}
  for i = 1, n do t[i] = mp.randn({16, 20}, {device = "cpu"}) end
  return t
end

local function needs_graphs()
  if not graphs then pending(why_not) end
  return graphs
end

describe("mp.cuda.graph", function()
  it("refuses what is not a function, naming it", function()
    H.raises(function() mp.cuda.graph(42) end, {"mp.cuda.graph", "fn must be a function", "number"})
  end)

  it("without a CUDA device says so", function()
    if cuda then return pending("a CUDA device is present") end
    H.raises(function() mp.cuda.graph(function() end) end, {"mp.cuda.graph", "cuda", "not available"})
  end)

  it("on a CUDA backend that cannot capture says so", function()
    if not cuda or graphs then return pending("the CUDA backend here captures graphs, or there is none") end
    H.raises(function() mp.cuda.graph(function() end) end, {"mp.cuda.graph", "cannot capture graphs"})
  end)

  it("replays an f16 AMP step (GradScaler sync = false, Adam) bit for bit as eager steps", function()
    if not needs_graphs() then return end
    local N, bs = 6, batches(6)
    local eager, le = rig(), {}
    for i = 1, N do
      eager.x:copy_(bs[i])
      le[i] = eager.step():item()
    end
    local r = rig()
    r.x:copy_(bs[1])
    local lg = {r.step():item()}   -- the warm-up: the optimizer's and scaler's state exist
    local out = r.step
    local g = mp.cuda.graph(out)
    assert.is_truthy(tostring(g):find("mp.cuda.graph (1 output)", 1, true))
    local first
    for i = 2, N do
      r.x:copy_(bs[i])
      local loss = g:replay()
      first = first or loss
      assert.are.equal(first, loss)   -- the same output tensor, rewritten by each replay
      lg[i] = loss:item()
    end
    H.assert_same(lg, le, "losses")
    local pe, pr = eager.model:parameters(), r.model:parameters()
    for i = 1, #pe do H.assert_same(pr[i]:totable(), pe[i]:totable(), "parameter " .. i) end
    for i = 1, #pe do H.assert_same(pr[i].grad:totable(), pe[i].grad:totable(), "gradient " .. i) end
    assert.are.equal(eager.scaler:get_scale(), r.scaler:get_scale())
    assert.are.equal(eager.opt.step_count, r.opt.step_count)
    g:free()
  end)

  it("replays a tiny GPT step (tensor-core attention, layer norm, embeddings, tied output) bit for bit", function()
    if not needs_graphs() then return end
    local GPT = dofile(H.root .. "/scripts/models/gpt.lua")
    local V, T, B = 32, 8, 2
    local function gpt_rig()
      mp.manual_seed(11)
      local r = {model = GPT{vocab = V, ctx = T, layers = 1, dim = 64, heads = 1}}   -- head dim 64: the flash kernels
      r.model:to("cuda")
      r.opt = mp.optim.Adam(r.model:parameters(), {lr = 1e-2})
      r.scaler = mp.amp.GradScaler{sync = false}
      r.idx = mp.zeros({B, T}, {dtype = "i32", device = "cuda"})
      r.tgt = mp.zeros({B * T}, {dtype = "i32", device = "cuda"})
      function r.step()
        r.opt:zero_grad()
        local loss
        do
          local _ <close> = mp.amp.autocast("f16")
          loss = mp.cross_entropy(r.model(r.idx):reshape({B * T, V}), r.tgt)
        end
        r.scaler:scale(loss):backward()
        r.scaler:step(r.opt)
        r.scaler:update()
        return loss
      end
      return r
    end
    -- no token twice in a batch: the embedding's backward adds a repeated token's rows with
    -- float atomics, whose order (shuffled on the emulated device) changes the last bits
    -- between any two runs, eager or replayed
    local data, rng = {}, 12345
    for i = 1, 4 do
      local ids = {}
      for j = 1, V do ids[j] = j - 1 end
      for j = V, 2, -1 do
        rng = (rng * 1103515245 + 12345) % 2147483648
        local k = rng % j + 1
        ids[j], ids[k] = ids[k], ids[j]
      end
      data[i] = mp.tensor({table.unpack(ids, 1, B * T + 1)}, {dtype = "i32", device = "cpu"})
    end
    local function feed(r, i)
      r.idx:copy_(data[i]:narrow(1, 1, B * T):reshape({B, T}))
      r.tgt:copy_(data[i]:narrow(1, 2, B * T))
    end
    local eager, le = gpt_rig(), {}
    for i = 1, 4 do feed(eager, i); le[i] = eager.step():item() end
    local r = gpt_rig()
    feed(r, 1)
    local lg = {r.step():item()}
    local g = mp.cuda.graph(r.step)
    for i = 2, 4 do feed(r, i); lg[i] = g:replay():item() end
    H.assert_same(lg, le, "losses")
    local pe, pr = eager.model:parameters(), r.model:parameters()
    for i = 1, #pe do H.assert_same(pr[i]:totable(), pe[i]:totable(), "parameter " .. i) end
    g:free()
  end)

  it("allocates, copies back and waits for nothing while it replays; its pool stays reserved until freed", function()
    if not needs_graphs() then return end
    local r, bs = rig(), batches(4)
    r.x:copy_(bs[1])
    r.step()
    local g = mp.cuda.graph(r.step)
    for i = 1, 2 do r.x:copy_(bs[i]); g:replay() end
    collectgarbage()
    local m0, c0 = mp.cuda.memory(), mp.counters()
    assert.is_true(m0.graphs > 0)
    for _ = 1, 5 do g:replay() end
    local m1, c1 = mp.cuda.memory(), mp.counters()
    for _, k in ipairs{"host_reads", "device_to_host", "device_waits", "device_mallocs"} do
      assert.are.equal(c0[k], c1[k], k)
    end
    for _, k in ipairs{"in_use", "storages", "cached", "graphs"} do assert.are.equal(m0[k], m1[k], k) end
    -- freed: the pool's free blocks go back to the cache, nothing stays reserved
    g:free()
    collectgarbage()
    local m2 = mp.cuda.memory()
    assert.are.equal(0, m2.graphs)
    assert.is_true(m2.cached >= m0.cached)
    H.raises(function() g:replay() end, {"mp.cuda.graph", "replay", "freed"})
    g:free()   -- twice is harmless
    assert.are.equal("mp.cuda.graph (freed)", tostring(g))
  end)

  -- lcuda_graph.c: the warm-up's garbage, collected before the capture, is the
  -- pool the capture takes its blocks from (kernels/cuda/cuda_graph.cu pool_alloc:
  -- the pool's own free blocks, then the cache's exact size class, a cudaMalloc
  -- only on a miss)
  it("needs no new device memory for a capture after warm-up steps", function()
    if not needs_graphs() then return end
    for _, warm in ipairs{1, 2} do
      local r, bs = rig(), batches(1)
      r.x:copy_(bs[1])
      for _ = 1, warm do r.step() end
      collectgarbage()
      local c0 = mp.counters()
      local g = mp.cuda.graph(r.step)
      local c1 = mp.counters()
      assert.are.equal(c0.device_mallocs, c1.device_mallocs, warm .. " warm-up step(s): device mallocs in the capture")
      assert.is_true(mp.cuda.memory().graphs > 0)
      g:free()
    end
  end)

  -- a failed capture: the error names mp.cuda.graph and the operation, and the
  -- engine goes on as if the capture had not been tried
  local function refused(fn, words, r)
    collectgarbage()
    local before = mp.cuda.memory()
    H.raises(function() mp.cuda.graph(fn) end, words)
    if os.getenv("MP_GRAPH_SPEC_SHOW") then print(select(2, pcall(mp.cuda.graph, fn))) end
    collectgarbage()
    local after = mp.cuda.memory()
    assert.are.equal(0, after.graphs, "no pool kept")
    assert.are.equal(before.in_use, after.in_use, "no tensor kept")
    if r then   -- and an eager step still runs and reads its loss
      local loss = r.step():item()
      assert.is_true(loss == loss and loss > 0)
    end
  end

  it("refuses :item() inside the capture, and the engine goes on", function()
    if not needs_graphs() then return end
    local r = rig()
    r.step()
    refused(function() return r.step():item() end, {"mp.cuda.graph", "capture", "item", "read device memory"}, r)
  end)

  it("refuses a host copy, synchronize and random numbers inside the capture", function()
    if not needs_graphs() then return end
    local r = rig()
    r.step()
    local host = mp.randn({16, 20}, {device = "cpu"})
    refused(function() r.x:copy_(host); return r.step() end, {"mp.cuda.graph", "copy host memory", "copy_"}, r)
    refused(function() r.step(); mp.cuda.synchronize() end, {"mp.cuda.graph", "synchronize"}, r)
    refused(function() return mp.rand({4}, {device = "cuda"}) end, {"mp.cuda.graph", "random numbers"}, r)
    refused(function() return r.x:totable() end, {"mp.cuda.graph", "read device memory"}, r)
    -- GradScaler{sync = true} reads the step's outcome on the host
    local s = rig()
    s.scaler = mp.amp.GradScaler{sync = true}
    s.step()
    refused(function() return s.step() end, {"mp.cuda.graph", "read device memory"}, s)
  end)

  it("refuses mp.attention with dropout inside the capture, saying what to do instead", function()
    if not needs_graphs() then return end
    local r = rig()
    r.step()
    mp.manual_seed(3)
    local q, k, v = mp.randn({1, 2, 16, 16}, {device = "cuda"}), mp.randn({1, 2, 16, 16}, {device = "cuda"}),
                    mp.randn({1, 2, 16, 16}, {device = "cuda"})
    refused(function() r.step(); return mp.attention(q, k, v, {causal = true, dropout = 0.1}) end,
            {"mp.cuda.graph", "attention dropout", "random numbers", "dropout = 0", "eagerly"}, r)
    -- the error's advice holds: dropout = 0 captures, and the replay is the eager value
    local out = mp.zeros({1, 2, 16, 16}, {device = "cuda"})
    local g = mp.cuda.graph(function() out:copy_(mp.attention(q, k, v, {causal = true, dropout = 0})) end)
    g:replay()
    H.assert_same(out:totable(), mp.attention(q, k, v, {causal = true}):totable(), "replayed attention")
    g:free()
  end)

  it("refuses an op on a cpu tensor, and a capture that queued nothing on the device", function()
    if not needs_graphs() then return end
    local a = mp.ones({3}, {device = "cpu"})
    refused(function() return a + a end, {"mp.cuda.graph", "cpu tensor", "add"})
    refused(function() return 1 + 1 end, {"mp.cuda.graph", "nothing was queued"})
  end)

  it("cannot nest, and cannot replay inside a capture", function()
    if not needs_graphs() then return end
    local x = mp.zeros({4}, {device = "cuda"})
    local g = mp.cuda.graph(function() x:add_(1) end)
    refused(function() x:add_(1); mp.cuda.graph(function() x:add_(1) end) end, {"mp.cuda.graph", "open already"})
    refused(function() x:add_(1); g:replay() end, {"mp.cuda.graph", "replay", "capture is open"})
    -- the graph adds 1 at each replay, not at the capture
    H.assert_same(x:totable(), {0, 0, 0, 0}, "after the capture")
    g:replay(); g:replay()
    H.assert_same(x:totable(), {2, 2, 2, 2}, "after two replays")
    g:free()
  end)
end)
