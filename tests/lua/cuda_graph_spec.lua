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
-- (nothing read on the host) reading a fixed input buffer x; dropout: an
-- nn.Dropout of that p after the ReLU
-- the captured step of every rig: f16 autocast forward (forward(r) -> loss), scaled
-- backward, the scaler's step and update; returns the loss
local function amp_step(r, forward)
  return function()
    r.opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast("f16")
      loss = forward(r)
    end
    r.scaler:scale(loss):backward()
    r.scaler:step(r.opt)
    r.scaler:update()
    return loss
  end
end

local function rig(hidden, dropout)
  mp.manual_seed(7)
  local nin, nc, b = 20, 5, 16
  local r = {}
  if dropout then
    r.model = nn.Sequential(nn.Linear(nin, hidden or 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden or 32, nc))
  else
    r.model = nn.Sequential(nn.Linear(nin, hidden or 32), nn.ReLU(), nn.Linear(hidden or 32, nc))
  end
  r.model:to("cuda")
  r.opt = mp.optim.Adam(r.model:parameters(), {lr = 1e-2})
  r.scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{interval = 2}, sync = false}
  r.x = mp.zeros({b, nin}, {device = "cuda"})
  local labels = {}
  for i = 1, b do labels[i] = (i - 1) % nc end
  r.y = mp.tensor(labels, {dtype = "i32", device = "cuda"})
  r.step = amp_step(r, function() return mp.cross_entropy(r.model(r.x), r.y) end)
  return r
end

local function batches(n)
  mp.manual_seed(99)
  local t = {}
  for i = 1, n do t[i] = mp.randn({16, 20}, {device = "cpu"}) end
  return t
end

-- four batches of B x T tokens (and their next-token targets) for a rig with idx and tgt
-- input buffers; feed(r, i) copies batch i in. No token twice in a batch: the embedding's
-- backward adds a repeated token's rows with float atomics, whose order (shuffled on the
-- emulated device) changes the last bits between any two runs, eager or replayed.
local function token_feed(B, T, V, seed)
  local data = {}
  for i = 1, 4 do
    local ids = {}
    for j = 1, V do ids[j] = j - 1 end
    for j = V, 2, -1 do
      seed = (seed * 1103515245 + 12345) % 2147483648
      local k = seed % j + 1
      ids[j], ids[k] = ids[k], ids[j]
    end
    data[i] = mp.tensor({table.unpack(ids, 1, B * T + 1)}, {dtype = "i32", device = "cpu"})
  end
  return function(r, i)
    r.idx:copy_(data[i]:narrow(1, 1, B * T):reshape({B, T}))
    r.tgt:copy_(data[i]:narrow(1, 2, B * T))
  end
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
      r.step = amp_step(r, function() return mp.cross_entropy(r.model(r.idx):reshape({B * T, V}), r.tgt) end)
      return r
    end
    local feed = token_feed(B, T, V, 12345)
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

  it("refuses a host copy, synchronize, random numbers on the cpu and setting the seed inside the capture", function()
    if not needs_graphs() then return end
    local r = rig()
    r.step()
    local host = mp.randn({16, 20}, {device = "cpu"})
    refused(function() r.x:copy_(host); return r.step() end, {"mp.cuda.graph", "copy host memory", "copy_"}, r)
    refused(function() r.step(); mp.cuda.synchronize() end, {"mp.cuda.graph", "synchronize"}, r)
    refused(function() r.step(); return mp.rand({4}, {device = "cpu"}) end,
            {"mp.cuda.graph", "random numbers on the cpu", "no replay would repeat it"}, r)
    local s0 = mp.get_rng_state()
    refused(function() r.step(); mp.manual_seed(1) end, {"mp.cuda.graph", "mp.manual_seed", "set the random seed"}, r)
    refused(function() r.step(); mp.set_rng_state({seed = 1, offset = 0}) end,
            {"mp.cuda.graph", "mp.set_rng_state", "random generator's state"}, r)
    local s1 = mp.get_rng_state()   -- neither was set (and the step draws nothing)
    assert.are.same({s0.seed, s0.offset}, {s1.seed, s1.offset})
    refused(function() return r.x:totable() end, {"mp.cuda.graph", "read device memory"}, r)
    -- GradScaler{sync = true} reads the step's outcome on the host
    local s = rig()
    s.scaler = mp.amp.GradScaler{sync = true}
    s.step()
    refused(function() return s.step() end, {"mp.cuda.graph", "read device memory"}, s)
  end)

  -- random numbers in a capture (cuda_graph.cu, capture.c): each replay draws
  -- what the eager step would draw at the generator's state when the replay is
  -- queued, and moves the state on as that step would; the capture itself
  -- draws nothing and leaves the state where it was (as PyTorch's graphs)
  local function state() local s = mp.get_rng_state(); return {s.seed, s.offset} end

  it("draws random numbers anew at each replay, those eager draws give at the generator's state", function()
    if not needs_graphs() then return end
    local x = mp.zeros({1000}, {device = "cuda"})
    local function step()   -- two draws: the second's offset is relative to the first's
      x:copy_(mp.rand({1000}, {device = "cuda"}))
      return mp.randn({37}, {device = "cuda"}) * 2
    end
    step()   -- the warm-up: the cache has the step's blocks
    mp.manual_seed(5)
    local s0 = state()
    local g = mp.cuda.graph(step)
    assert.are.same(s0, state(), "the capture draws nothing from the generator")
    local rx, ry = {}, {}
    collectgarbage()
    local c0 = mp.counters()
    for i = 1, 3 do
      local y = g:replay()
      rx[i], ry[i] = x:totable(), y:totable()
    end
    assert.are.equal(c0.device_mallocs, mp.counters().device_mallocs, "device mallocs in the replays")
    local s3 = state()
    assert.are.same({s0[1], s0[2] + 3 * 1037}, s3, "each replay takes the step's 1037 draws")
    assert.are_not.same(rx[1], rx[2], "two replays, two draws")
    assert.are_not.same(ry[2], ry[3], "two replays, two draws")
    mp.set_rng_state({seed = s0[1], offset = s0[2]})
    for i = 1, 3 do
      local y = step()
      H.assert_same(rx[i], x:totable(), "rand of replay " .. i)
      H.assert_same(ry[i], y:totable(), "randn of replay " .. i)
    end
    assert.are.same(s3, state(), "the generator after the eager steps")
    -- a seed set between replays is the replay's, as the eager step's
    mp.manual_seed(77)
    local y = g:replay()
    local gx, gy = x:totable(), y:totable()
    mp.manual_seed(77)
    y = step()
    H.assert_same(gx, x:totable(), "rand after manual_seed")
    H.assert_same(gy, y:totable(), "randn after manual_seed")
    assert.are_not.same(gx, rx[1])
    g:free()
  end)

  it("replays an MLP step with nn.Dropout as eager steps, masks, losses, parameters and generator", function()
    if not needs_graphs() then return end
    local N, bs = 4, batches(4)
    local eager, le, se = rig(32, 0.3), {}, {}
    for i = 1, N do
      eager.x:copy_(bs[i])
      le[i] = eager.step():item()
      se[i] = state()
    end
    assert.is_true(se[3][2] - se[2][2] == 16 * 32, "each step draws its dropout mask")
    local r = rig(32, 0.3)
    r.x:copy_(bs[1])
    local lg = {r.step():item()}   -- the warm-up
    assert.are.same(se[1], state())
    local g = mp.cuda.graph(r.step)
    assert.are.same(se[1], state(), "the capture draws nothing from the generator")
    collectgarbage()
    local c0 = mp.counters()
    for i = 2, N do
      r.x:copy_(bs[i])
      lg[i] = g:replay():item()
      assert.are.same(se[i], state(), "the generator after replay " .. (i - 1))
    end
    assert.are.equal(c0.device_mallocs, mp.counters().device_mallocs, "device mallocs in the replays")
    H.assert_same(lg, le, "losses")
    local pe, pr = eager.model:parameters(), r.model:parameters()
    for i = 1, #pe do H.assert_same(pr[i]:totable(), pe[i]:totable(), "parameter " .. i) end
    for i = 1, #pe do H.assert_same(pr[i].grad:totable(), pe[i].grad:totable(), "gradient " .. i) end
    -- the masks matter: the same batch and weights with another mask give another loss
    local w = {}
    for i = 1, #pr do w[i] = pr[i]:clone() end
    mp.manual_seed(1)
    r.x:copy_(bs[1])
    local l1 = g:replay():item()
    do
      local _ <close> = mp.no_grad()
      for i = 1, #pr do pr[i]:copy_(w[i]) end
    end
    mp.manual_seed(2)
    local l2 = g:replay():item()
    assert.are_not.equal(l1, l2, "two seeds, two masks, two losses")
    g:free()
  end)

  it("replays a tiny GPT step with mp.attention dropout (tensor-core kernels) and nn.Dropout as eager steps", function()
    if not needs_graphs() then return end
    local V, T, B, D = 32, 8, 2, 64   -- one head of dim 64 in f16: the flash kernels
    local function gpt_rig()
      mp.manual_seed(13)
      local r = {wte = nn.Embedding(V, D), wpe = nn.Embedding(T, D), qkv = nn.Linear(D, 3 * D),
                 proj = nn.Linear(D, D), drop = nn.Dropout(0.1), head = nn.Linear(D, V)}
      r.params = {}
      for _, m in ipairs{r.wte, r.wpe, r.qkv, r.proj, r.head} do
        m:to("cuda")
        for _, p in ipairs(m:parameters()) do r.params[#r.params + 1] = p end
      end
      r.opt = mp.optim.Adam(r.params, {lr = 1e-2})
      r.scaler = mp.amp.GradScaler{sync = false}
      r.idx = mp.zeros({B, T}, {dtype = "i32", device = "cuda"})
      r.tgt = mp.zeros({B * T}, {dtype = "i32", device = "cuda"})
      r.pos = mp.arange(T, {dtype = "i32", device = "cuda"})
      r.step = amp_step(r, function()
        local h = r.wte(r.idx) + r.wpe(r.pos)
        local q, k, v = r.qkv(h):chunk(3, 3)
        local function head(t) return t:reshape{B, 1, T, D} end
        local y = mp.attention(head(q), head(k), head(v), {causal = true, dropout = 0.2})
        h = h + r.drop(r.proj(y:reshape{B, T, D}))
        return mp.cross_entropy(r.head(h):reshape{B * T, V}, r.tgt)
      end)
      return r
    end
    local feed = token_feed(B, T, V, 4242)
    local eager, le, se = gpt_rig(), {}, {}
    for i = 1, 4 do feed(eager, i); le[i] = eager.step():item(); se[i] = state() end
    assert.are.equal(B * T * T + B * T * D, se[3][2] - se[2][2], "a step draws the attention's and the dropout's")
    local r = gpt_rig()
    feed(r, 1)
    local lg = {r.step():item()}
    local g = mp.cuda.graph(r.step)
    assert.are.same(se[1], state(), "the capture draws nothing from the generator")
    for i = 2, 4 do
      feed(r, i)
      lg[i] = g:replay():item()
      assert.are.same(se[i], state(), "the generator after replay " .. (i - 1))
    end
    H.assert_same(lg, le, "losses")
    for i = 1, #eager.params do
      H.assert_same(r.params[i]:totable(), eager.params[i]:totable(), "parameter " .. i)
    end
    g:free()
  end)

  it("records mp.attention's dropout; a captured forward's backward only in its capture", function()
    if not needs_graphs() then return end
    mp.manual_seed(3)
    local q, k, v = mp.randn({1, 2, 16, 16}, {device = "cuda"}), mp.randn({1, 2, 16, 16}, {device = "cuda"}),
                    mp.randn({1, 2, 16, 16}, {device = "cuda"})
    local out = mp.zeros({1, 2, 16, 16}, {device = "cuda"})
    local function step() out:copy_(mp.attention(q, k, v, {causal = true, dropout = 0.3})) end
    step()
    local s0 = state()
    local g = mp.cuda.graph(step)   -- f32, head dim 16: the simple fused kernel
    local got = {}
    for i = 1, 3 do g:replay(); got[i] = out:totable() end
    local s3 = state()
    assert.are_not.same(got[1], got[2], "two replays, two masks")
    mp.set_rng_state({seed = s0[1], offset = s0[2]})
    for i = 1, 3 do step(); H.assert_same(got[i], out:totable(), "replay " .. i) end
    assert.are.same(s3, state())
    g:free()
    -- the backward of a captured forward outside the capture: its masks are the replays'
    local qg = mp.randn({1, 2, 16, 16}, {device = "cuda"}):requires_grad(true)
    local o
    local g2 = mp.cuda.graph(function() o = mp.attention(qg, k, v, {dropout = 0.3}); return o end)
    g2:replay()
    H.raises(function() o:sum():backward() end, {"attention", "dropout", "captured in a CUDA graph", "same graph"})
    g2:free()
  end)

  it("captures the backward of an eager attention dropout: the forward's masks, at every replay", function()
    if not needs_graphs() then return end
    mp.manual_seed(8)
    local q = mp.randn({1, 2, 16, 16}, {device = "cuda"}):requires_grad(true)
    local k, v = mp.randn({1, 2, 16, 16}, {device = "cuda"}), mp.randn({1, 2, 16, 16}, {device = "cuda"})
    local s0 = state()
    local o = mp.attention(q, k, v, {causal = true, dropout = 0.3})
    local s1 = state()
    local g = mp.cuda.graph(function() o:sum():backward(); return q.grad end)
    local gq = g:replay()
    local got = gq:totable()
    g:replay()
    H.assert_same(gq:totable(), got, "the second replay")
    assert.are.same(s1, state(), "the graph draws nothing")
    -- the same forward, eagerly, and its backward (dq: one thread per row, no atomics)
    mp.set_rng_state({seed = s0[1], offset = s0[2]})
    local q2 = q:detach():clone():requires_grad(true)
    mp.attention(q2, k, v, {causal = true, dropout = 0.3}):sum():backward()
    H.assert_same(got, q2.grad:totable(), "dq")
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
