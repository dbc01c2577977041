-- dist_spec.lua: mp.dist and data-parallel training (issue 15).
--
-- In this process: a world of one (no launcher): every collective leaves its
-- tensor as it is, and the arguments are checked. In child processes under
-- `mpirun -np 2` (Open MPI, with its flags for running as root and for two
-- processes on two cores): the collectives on every dtype, on the CPU and
-- through the fake CUDA device's memory (staged through the host); two ranks
-- with batch B against one process with batch 2B over 50 steps of the MLP, in
-- f32 and in f16 AMP with an overflow on one rank only; a checkpoint written
-- by rank 0 and resumed by both; train_mlp.lua --dist; a failing rank ending
-- the job; the ranks' rendezvous before every collective (issue 24): ranks that
-- call different collectives or shapes, a rank that leaves while the other
-- waits (os.exit, the script's end, a caught error, mp.dist.finalize, a
-- training with one batch less), and a rank that does not come within the
-- timeout, each an error on both ranks instead of a wait without end.
-- Pending where mpirun or build/mp/mpi.so is missing.
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local DIR = H.root .. "/tests/lua/dist/"
local has_mpirun = os.execute("command -v mpirun >/dev/null 2>&1")
local has_mpi_so = io.open(H.build .. "/mp/mpi.so", "rb")
if has_mpi_so then has_mpi_so:close() end
local why_not = not has_mpirun and "mpirun not found (Debian's openmpi-bin)"
  or not has_mpi_so and (H.build .. "/mp/mpi.so not built (mpicc: Debian's libopenmpi-dev)") or nil

local function tmp(name) return os.tmpname() .. "-" .. name end

-- a command run by mpirun with n processes (one OpenMP thread each: two ranks on
-- two cores), its output and exit status; a hang ends after 240 s (timeout)
local function mpirun(n, cmd, envvars, mpi_opts)
  local vars = {OMP_NUM_THREADS = "1"}
  -- make test SAN=1: Open MPI's components, unloaded at MPI_Finalize, leave
  -- allocations LeakSanitizer can only call "<unknown module>" (no suppression
  -- names them): under mpirun the children keep ASan and UBSan, not the leak
  -- check (the world of one above keeps all three)
  local asan = os.getenv("ASAN_OPTIONS")
  if asan then vars.ASAN_OPTIONS = asan:gsub("detect_leaks=1", "detect_leaks=0") end
  for k, v in pairs(envvars or {}) do vars[k] = v end
  local xs = {}
  for k in pairs(vars) do xs[#xs + 1] = "-x " .. k end
  table.sort(xs)
  -- LD_PRELOAD (make test SAN=1's sanitizer runtimes for lua5.4) stays out of
  -- mpirun itself; the children are the sanitized build's own mpengine
  local line = string.format("%s timeout 240 mpirun --allow-run-as-root --oversubscribe --bind-to none %s %s -np %d %s 2>&1; echo \"exit=$?\"",
    H.env(vars, {"LD_PRELOAD"}), mpi_opts or "", table.concat(xs, " "), n, cmd)
  local p = io.popen(line)
  local out = p:read("a")
  p:close()
  return out, tonumber(out:match("exit=(%d+)%s*$"))
end

local function one(cmd, envvars)
  local p = io.popen(string.format("%s%s 2>&1; echo \"exit=$?\"", H.env(envvars), cmd))
  local out = p:read("a")
  p:close()
  return out, tonumber(out:match("exit=(%d+)%s*$"))
end

local DP = H.mpengine .. " " .. DIR .. "dp_mlp.lua"

-- the largest absolute difference over two runs' weights, and how many
-- elements differ by more than 1e-7
local function weight_diff(a, b)
  local ma, mb = mp.load(a).model, mp.load(b).model
  local worst, n_off, n = 0, 0, 0
  for k, w in pairs(ma) do
    local d = (w - assert(mb[k], k)):abs()
    worst = math.max(worst, d:max():item())
    n_off = n_off + d:gt(1e-7):sum():item()
    n = n + 1
  end
  assert.are.equal(6, n)
  return worst, n_off
end

describe("mp.dist in a world of one (no launcher)", function()
  it("is rank 0 of 1, and its collectives leave their tensors as they are", function()
    local r, n = mp.dist.init()
    assert.are.same({0, 1}, {r, n})
    assert.is_true(mp.dist.is_initialized())
    assert.are.equal(0, mp.dist.rank())
    assert.are.equal(1, mp.dist.size())
    assert.are.equal(0, mp.dist.local_rank())
    assert.truthy(mp.dist.backend():find("world of one", 1, true))
    for _, op in ipairs{"sum", "mean", "max", "min"} do
      local t = mp.tensor({1.5, -2, 3}, {dtype = "bf16"})
      assert.are.equal(t, mp.dist.all_reduce(t, op))
      assert.are.same({1.5, -2, 3}, t:totable())
    end
    local b = mp.tensor({4, 5})
    mp.dist.broadcast(b, 0)
    assert.are.same({4, 5}, b:totable())
    local g = mp.dist.all_gather(mp.tensor({{1, 2}}, {dtype = "i32"}))
    assert.are.same({1, 1, 2}, g.shape)
    assert.are.same({{{1, 2}}}, g:totable())
    mp.dist.barrier()
    assert.are.same({0, 1}, {mp.dist.init()})   -- again: the same world
  end)

  it("refuses bad arguments, naming the function", function()
    mp.dist.init()
    H.raises(function() mp.dist.all_reduce(mp.zeros(2), "avg") end, {"mp.dist.all_reduce", "op must be", "avg"})
    H.raises(function() mp.dist.all_reduce(mp.zeros(2), 3) end, {"mp.dist.all_reduce", "op must be"})
    H.raises(function() mp.dist.all_reduce(mp.zeros(2, {dtype = "u8"})) end, {"mp.dist.all_reduce", "u8"})
    H.raises(function() mp.dist.all_reduce(mp.zeros(2, {dtype = "i32"}), "mean") end, {"mp.dist.all_reduce", "i32"})
    H.raises(function() mp.dist.all_reduce({1, 2}) end, {"all_reduce"})
    H.raises(function() mp.dist.broadcast(mp.zeros(2), 1) end, {"mp.dist.broadcast", "root 1 is not a rank (0..0)"})
    H.raises(function() mp.dist.broadcast(mp.zeros(2), -1) end, {"mp.dist.broadcast", "root -1"})
    H.raises(function() mp.dist.broadcast(mp.zeros(2), 0.5) end, {"mp.dist.broadcast", "root"})
    H.raises(function() mp.dist.all_gather(mp.zeros({1, 1, 1, 1, 1, 1, 1, 1})) end, {"mp.dist.all_gather", "8 dims"})
    H.raises(function() mp.dist.init{devices = true} end, {"mp.dist.init", "devices"})
    -- the collective timeout: seconds > 0 (math.huge: none); 30 minutes unless told
    assert.are.equal(1800, mp.dist.timeout())
    H.raises(function() mp.dist.init{timeout = 0} end, {"mp.dist.init", "option timeout must be a number of seconds > 0 (got 0"})
    H.raises(function() mp.dist.init{timeout = -5} end, {"mp.dist.init", "timeout", "-5"})
    H.raises(function() mp.dist.init{timeout = 0 / 0} end, {"mp.dist.init", "timeout", "nan"})
    H.raises(function() mp.dist.init{timeout = "60"} end, {"mp.dist.init", "option timeout must be a number (got string)"})
    assert.are.equal(1800, mp.dist.timeout())   -- nothing taken from the refused values
    mp.dist.init{timeout = 2.5}
    assert.are.equal(2.5, mp.dist.timeout())
    mp.dist.init{timeout = math.huge}
    assert.are.equal(math.huge, mp.dist.timeout())
    mp.dist.init{timeout = 1800}
    H.raises(function() mp.dist.rank_seed(1.5) end, {"mp.dist.rank_seed", "integer"})
    assert.are.equal(7, mp.dist.rank_seed(7))   -- rank 0 keeps the run's seed
  end)

  it("makes optimizers data parallel with dist = true, and refuses bad values", function()
    mp.dist.init()
    local m = mp.nn.Linear(3, 2)
    local opt = mp.optim.SGD(m:parameters(), {lr = 0.1, dist = {bucket_mb = 0.001}})
    m(mp.ones({4, 3})):sum():backward()   -- a world of one: the gradients stay as they are
    H.assert_close(m.bias.grad:totable(), {4, 4}, 0, 0, "bias grad")
    opt:step()
    H.raises(function() mp.optim.Adam(mp.nn.Linear(2, 2):parameters(), {dist = "yes"}) end,
             {"mp.optim.Adam", "dist must be true, false or {bucket_mb = N}"})
    H.raises(function() mp.optim.AdamW(mp.nn.Linear(2, 2):parameters(), {dist = {bucket_mb = -1}}) end,
             {"mp.optim.AdamW", "bucket_mb"})
    H.raises(function() mp.optim.AdamW(mp.nn.Linear(2, 2):parameters(), {dist = {buckets = 2}}) end,
             {"mp.optim.AdamW", "buckets"})
    local _ <close> = mp.dist.no_sync()   -- a guard; nothing to keep local in a world of one
  end)

  it("saves a checkpoint once with mp.dist.save, and fails on every rank alike when it cannot", function()
    mp.dist.init()
    local path = tmp("dist_save.safetensors")
    mp.dist.save(path, {w = mp.tensor({1, 2}), step = 3})
    local c = mp.load(path)
    assert.are.equal(3, c.step)
    assert.are.same({1, 2}, c.w:totable())
    os.remove(path)
    H.raises(function() mp.dist.save("/nonexistent-dir/x.safetensors", {step = 1}) end,
             {"mp.dist.save", "/nonexistent-dir/x.safetensors"})
    H.raises(function() mp.dist.save(path, {f = print}) end, {"mp.dist.save"})
    assert.is_nil(io.open(path, "rb"))   -- nothing half-written
  end)

  it("needs mp.dist.init() before a collective (in a fresh process), and none after finalize", function()
    local code = [[
      local ok, e = pcall(mp.dist.all_reduce, mp.zeros(1)); print(e)
      ok, e = pcall(mp.optim.SGD, mp.nn.Linear(2, 2):parameters(), {lr = 1, dist = true}); print(e)
      mp.dist.init(); mp.dist.finalize(); mp.dist.finalize()
      ok, e = pcall(mp.dist.barrier); print(e)
      ok, e = pcall(mp.dist.init); print(e)
    ]]
    local r = H.child(code)
    local out = r.out .. r.err
    assert.truthy(out:find("OK:", 1, true), out)
    assert.truthy(out:find("mp.dist.all_reduce: call mp.dist.init() first", 1, true), out)
    assert.truthy(out:find("mp.optim.SGD: dist: call mp.dist.init() first", 1, true), out)
    assert.truthy(out:find("mp.dist.barrier: mp.dist was finalized", 1, true), out)
    assert.truthy(out:find("mp.dist.init: mp.dist was finalized", 1, true), out)
  end)

  it("shards the loader: size ranks' batches are one process's global batches", function()
    local ds = {images = mp.arange(11, {dtype = "f32", device = "cpu"}):reshape{11, 1},
                labels = mp.arange(11, {dtype = "i32", device = "cpu"})}
    local function batches(opts)
      local out = {}
      for _, y in mp.data.loader(ds, opts) do out[#out + 1] = y:totable() end
      return out
    end
    local whole = batches{batch = 6, shuffle = true, seed = 3}
    local r0 = batches{batch = 3, shuffle = true, seed = 3, shard = {0, 2}}
    local r1 = batches{batch = 3, shuffle = true, seed = 3, shard = {1, 2}}
    assert.are.equal(2, #r0)
    assert.are.equal(2, #r1)
    for k = 1, 2 do   -- global batch k: rank 0's then rank 1's
      local joined = {}
      for _, v in ipairs(r0[k]) do joined[#joined + 1] = v end
      for _, v in ipairs(r1[k]) do joined[#joined + 1] = v end
      if k == 1 then assert.are.same(whole[1], joined)
      else   -- 5 examples padded with the order's first to 6, split 3 and 3
        local want = {}
        for _, v in ipairs(whole[2]) do want[#want + 1] = v end
        want[#want + 1] = whole[1][1]
        assert.are.same(want, joined)
      end
    end
    assert.are.same({{0, 1}, {6, 7}}, batches{batch = 2, shard = {0, 3}})
    assert.are.same({{4, 5}}, batches{batch = 2, shard = {2, 3}, drop_last = true})
    H.raises(function() mp.data.loader(ds, {batch = 2, shuffle = true, shard = {0, 2}}) end,
             {"mp.data.loader", "needs seed="})
    H.raises(function() mp.data.loader(ds, {batch = 2, shard = {2, 2}}) end, {"mp.data.loader", "shard must be {rank, size}"})
    H.raises(function() mp.data.loader(ds, {batch = 2, shard = 1}) end, {"mp.data.loader", "shard must be"})
  end)

  it("checks a world of one's device collectives on the fake device: no host wait in a step", function()
    local out, code = one(H.mpengine .. " " .. DIR .. "nowait.lua",
      {MP_DEVICE = "cuda", MP_CUDA_BACKEND = H.build .. "/tests/fake_cuda.so", MP_FAKE_CUDA_COLL = "1",
       MP_FAKE_CUDA_STATS = "1"})
    assert.are.equal(0, code, out)
    assert.truthy(out:find("steps 5 reads 0 copies 0 waits 0", 1, true), out)
    -- rank 0's parameters broadcast once, then per step the gradients' four buckets, each on the
    -- second stream (a fork) as backward finishes it, and the scaler's findings; every fork merged
    assert.truthy(out:find(" 26 collectives, 20 forks (0 unmerged at exit)", 1, true), out)
  end)

  it("runs them through the CUDA backend's own NCCL code on the emulated device, and ends the group cleanly", function()
    if not H.emu then return pending(H.no_emu) end
    local out, code = one(H.mpengine .. " " .. DIR .. "device_one.lua", H.emu_env())
    assert.are.equal(0, code, out)
    assert.truthy(out:find("device collectives ok", 1, true), out)
    out, code = one(H.mpengine .. " " .. DIR .. "nowait.lua", H.emu_env { MP_EMU_STATS = "1" })
    assert.are.equal(0, code, out)
    assert.truthy(out:find("steps 5 reads 0 copies 0 waits 0", 1, true), out)
    -- mp.dist.finalize ends the group with its second stream and event: what is left is the
    -- backend's own stream and staging events (the NCCL stream and its event used to stay)
    assert.truthy(out:find("live at exit: 1 streams, 4 events", 1, true), out)
    assert.truthy(out:find(", 0 NCCL communicators", 1, true), out)
    -- MP_NCCL_LIBRARY naming no library: the collective's error says which, and why
    out, code = one(H.mpengine .. " " .. DIR .. "device_one.lua", H.emu_env { MP_NCCL_LIBRARY = "/nonexistent/libnccl.so" })
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("mp.dist.all_reduce: cuda: NCCL cannot be loaded (/nonexistent/libnccl.so)", 1, true), out)
  end)
end)

describe("mp.dist under mpirun -np 2", function()
  if why_not then
    pending(why_not)
    return
  end

  it("reduces, broadcasts and gathers every dtype, and refuses what the ranks disagree on", function()
    -- collectives.lua: besides the values, each disagreement is an error on both ranks naming
    -- what each called (all_reduce against broadcast, barrier against all_gather, {2,4} against
    -- {8} and {4,2}, a public all_reduce against a data-parallel backward's bucket), after which
    -- the collectives line up again
    local out, code = mpirun(2, H.mpengine .. " " .. DIR .. "collectives.lua")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 ok", 1, true) and out:find("rank 1 ok", 1, true), out)
  end)

  it("runs the CUDA backend's NCCL code for two ranks on the emulated device: collectives, and f16 training", function()
    if not H.emu then return pending(H.no_emu) end
    if os.getenv("MP_DEVICE") == "cuda" then return pending("runs in the default device's pass (it starts its own processes)") end
    local out, code = mpirun(2, H.mpengine .. " " .. DIR .. "collectives.lua", H.emu_env())
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 ok", 1, true) and out:find("rank 1 ok", 1, true), out)
    -- the gradient buckets reduced on the second stream as backward finishes each (a
    -- missing event wait there gives the ranks different weights), an overflow on rank 1
    local acc_out, two_out = tmp("emu_acc"), tmp("emu_two")
    out, code = one(DP .. " --batch 64 --steps 20 --accum 2 --amp f16 --poison 10 --out " .. acc_out, H.emu_env())
    assert.are.equal(0, code, out)
    out, code = mpirun(2, DP .. " --batch 32 --steps 20 --amp f16 --poison 10 --out " .. two_out, H.emu_env())
    assert.are.equal(0, code, out)
    local r0, r1 = two_out .. ".rank0.safetensors", two_out .. ".rank1.safetensors"
    assert.is_true(H.same_model(r0, r1))
    local ref, s0 = mp.load(acc_out .. ".rank0.safetensors").scaler, mp.load(r0).scaler
    assert.are.same({20, 1}, {s0.steps, s0.skipped})
    assert.are.equal(ref.scale, s0.scale)
    local worst = weight_diff(acc_out .. ".rank0.safetensors", r0)
    assert.is_true(worst < 1e-6, "largest difference " .. worst)
    for _, f in ipairs{acc_out .. ".rank0.safetensors", r0, r1} do os.remove(f) end
  end)

  it("does the same with tensors in a device's memory, staged through the host (the fake device)", function()
    local out, code = mpirun(2, H.mpengine .. " " .. DIR .. "collectives.lua",
      {MP_DEVICE = "cuda", MP_CUDA_BACKEND = H.build .. "/tests/fake_cuda.so", MP_FAKE_CUDA_PROTECT = "1"})
    assert.are.equal(0, code, out)
    assert.truthy(out:find("rank 0 ok", 1, true) and out:find("rank 1 ok", 1, true), out)
  end)

  it("trains the MLP in f32: two ranks with batch 32 give one process's weights with batch 64", function()
    local one_out, two_out, acc_out = tmp("one"), tmp("two"), tmp("acc")
    local out, code = one(DP .. " --batch 64 --steps 50 --out " .. one_out)
    assert.are.equal(0, code, out)
    out, code = one(DP .. " --batch 64 --steps 50 --accum 2 --out " .. acc_out)
    assert.are.equal(0, code, out)
    out, code = mpirun(2, DP .. " --batch 32 --steps 50 --out " .. two_out)
    assert.are.equal(0, code, out)
    local r0, r1 = two_out .. ".rank0.safetensors", two_out .. ".rank1.safetensors"
    assert.is_true(H.same_model(r0, r1))   -- the ranks hold the same weights, bit for bit
    assert.are.equal(1, mp.load(r0).world == 2 and 1 or 0)
    -- against one process with batch 64: f32 rounding (the sums are grouped
    -- differently); Adam turns it into at most ~1e-6 on a handful of weights
    -- whose gradient is near zero, where one step is 1e-3
    local worst, off = weight_diff(one_out .. ".rank0.safetensors", r0)
    assert.is_true(worst < 1e-5, "largest difference " .. worst)
    assert.is_true(off < 100, off .. " of 535818 weights differ by more than 1e-7")
    -- against its two micro-batches of 32 accumulated (each rank's sum): the same bits
    worst = weight_diff(acc_out .. ".rank0.safetensors", r0)
    assert.is_true(worst <= 1e-7, "largest difference " .. worst)
    -- small buckets (about 0.2 MB: five, reduced one by one as backward finishes them) give the same bits
    local small = tmp("small")
    out, code = mpirun(2, DP .. " --batch 32 --steps 50 --bucket-mb 0.2 --out " .. small)
    assert.are.equal(0, code, out)
    assert.is_true(H.same_model(r0, small .. ".rank0.safetensors"))
    os.remove(small .. ".rank0.safetensors"); os.remove(small .. ".rank1.safetensors")
    for _, f in ipairs{one_out .. ".rank0.safetensors", acc_out .. ".rank0.safetensors", r0, r1} do os.remove(f) end
  end)

  it("trains it in f16 AMP with an overflow on rank 1 only: both ranks skip that step", function()
    local acc_out, two_out = tmp("acc16"), tmp("two16")
    -- the reference: one process, batch 64 as two micro-batches of 32, whose
    -- backwards round their gradients to f16 as each rank's does
    local out, code = one(DP .. " --batch 64 --steps 50 --accum 2 --amp f16 --poison 20 --out " .. acc_out)
    assert.are.equal(0, code, out)
    out, code = mpirun(2, DP .. " --batch 32 --steps 50 --amp f16 --poison 20 --out " .. two_out)
    assert.are.equal(0, code, out)
    local ref, r0, r1 = mp.load(acc_out .. ".rank0.safetensors"), two_out .. ".rank0.safetensors", two_out .. ".rank1.safetensors"
    assert.is_true(H.same_model(r0, r1))
    local s0, s1 = mp.load(r0).scaler, mp.load(r1).scaler
    assert.are.same({50, 1}, {s0.steps, s0.skipped})   -- rank 0 found nothing, and skipped with rank 1
    assert.are.same({50, 1}, {s1.steps, s1.skipped})
    assert.are.same({50, 1}, {ref.scaler.steps, ref.scaler.skipped})
    assert.are.equal(ref.scaler.scale, s0.scale)
    assert.are.equal(s0.scale, s1.scale)
    local worst = weight_diff(acc_out .. ".rank0.safetensors", r0)
    assert.is_true(worst < 1e-6, "largest difference " .. worst)
    for _, f in ipairs{acc_out .. ".rank0.safetensors", r0, r1} do os.remove(f) end
  end)

  it("gives a Lua policy the world's finding: rank 0's info says found_inf at rank 1's overflow", function()
    local out_p = tmp("lua_policy")
    local out, code = mpirun(2, DP .. " --batch 32 --steps 30 --amp f16 --poison 20 --policy lua --out " .. out_p)
    assert.are.equal(0, code, out)
    for r = 0, 1 do
      local s = mp.load(out_p .. ".rank" .. r .. ".safetensors").scaler
      assert.are.equal("20", s.seen, "rank " .. r)
      assert.are.equal(1, s.skipped, "rank " .. r)
      os.remove(out_p .. ".rank" .. r .. ".safetensors")
    end
  end)

  it("resumes on every rank from rank 0's checkpoint, as a run that never stopped", function()
    local straight, first, ck, resumed = tmp("s"), tmp("p"), tmp("ck.safetensors"), tmp("r")
    local args = " --batch 32 --amp f16 --poison 12 "
    local out, code = mpirun(2, DP .. args .. "--steps 30 --out " .. straight)
    assert.are.equal(0, code, out)
    out, code = mpirun(2, DP .. args .. "--steps 15 --save-at 15 " .. ck .. " --out " .. first)
    assert.are.equal(0, code, out)
    out, code = mpirun(2, DP .. args .. "--steps 30 --resume " .. ck .. " --out " .. resumed)
    assert.are.equal(0, code, out)
    assert.is_true(H.same_model(straight .. ".rank0.safetensors", resumed .. ".rank0.safetensors"))
    local a, b = mp.load(resumed .. ".rank0.safetensors"), mp.load(resumed .. ".rank1.safetensors")
    assert.are.same(a.scaler.state, b.scaler.state)   -- the scaler's state, the same on both ranks
    for i = 0, 5 do   -- and Adam's (PyTorch's 0-based ids)
      H.assert_same(a.optim.state[i].exp_avg:totable(), b.optim.state[i].exp_avg:totable(), "exp_avg " .. i)
      H.assert_same(a.optim.state[i].exp_avg_sq:totable(), b.optim.state[i].exp_avg_sq:totable(), "exp_avg_sq " .. i)
    end
    assert.are.equal(a.optim.param_groups[1].step, 29)   -- 30 steps, one skipped
    for _, f in ipairs{straight, first, resumed} do
      os.remove(f .. ".rank0.safetensors"); os.remove(f .. ".rank1.safetensors")
    end
    os.remove(ck)
  end)

  it("runs scripts/train_mlp.lua --dist: one output, rank 0's checkpoint, the skips of rank 1's spikes", function()
    local ck = tmp("mlp.safetensors")
    local out, code = mpirun(2, H.mpengine .. " " .. H.root .. "/scripts/train_mlp.lua --dist --batch 32 --max-steps 40"
      .. " --amp f16 --inject-overflow 10 --inject-rank 1 --save " .. ck)
    assert.are.equal(0, code, out)
    local _, lines = out:gsub("final test accuracy: 0%.%d%d%d%d", "")
    assert.are.equal(1, lines, out)   -- rank 0 prints; rank 1 is quiet
    assert.truthy(out:find("skipped steps: 4 of 40", 1, true), out)   -- steps 10, 20, 30, 40
    local c = mp.load(ck)
    assert.are.equal(40, c.step)
    assert.are.equal(4, c.scaler.skipped)
    out, code = mpirun(2, H.mpengine .. " " .. H.root .. "/scripts/train_mlp.lua --dist --batch 32 --max-steps 50"
      .. " --amp f16 --inject-overflow 10 --inject-rank 1 --resume " .. ck)
    assert.are.equal(0, code, out)
    assert.truthy(out:find("resumed from .- at step 40", 1), out)
    assert.truthy(out:find("skipped steps: 5 of 50", 1, true), out)
    out = mpirun(2, H.mpengine .. " " .. H.root .. "/scripts/train_mlp.lua --dist --inject-overflow 3 --inject-rank 2 --amp f16")
    assert.truthy(out:find("--inject-rank must be a rank, 0..1 (got 2)", 1, true), out)
    os.remove(ck)
  end)

  it("runs scripts/train_cnn.lua --dist, its batch norms' running statistics rank 0's in the checkpoint", function()
    local ck = tmp("cnn.safetensors")
    local out, code = mpirun(2, H.mpengine .. " " .. H.root .. "/scripts/train_cnn.lua --dist --batch 16 --max-steps 6 --save " .. ck)
    assert.are.equal(0, code, out)
    local _, lines = out:gsub("final test accuracy: 0%.%d%d%d%d", "")
    assert.are.equal(1, lines, out)
    local c = mp.load(ck)
    assert.are.equal(6, c.step)
    assert.are.equal(6, c.model["bn1.num_batches_tracked"]:item())
    os.remove(ck)
  end)

  it("ends the whole job when a script fails on one rank, instead of leaving the other waiting", function()
    local script = tmp("fail.lua")
    H.spit(script, [[
      local mp = require "mp"
      local r = mp.dist.init()
      if r == 1 then error("rank 1 fails here") end
      mp.dist.barrier()   -- rank 0 would wait here for ever
      print("rank 0 passed the barrier")
    ]])
    local out, code = mpirun(2, H.mpengine .. " " .. script)
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("rank 1 fails here", 1, true), out)
    assert.falsy(out:find("passed the barrier", 1, true), out)
    assert.are_not.equal(124, code, "timed out: " .. out)
    os.remove(script)
  end)

  -- leave.lua: rank 1 leaves at once, rank 0 calls all_reduce (each wait bounded by a 60 s
  -- timeout, and the whole run by mpirun's 240 s); before, rank 0 waited in MPI_Allreduce and
  -- rank 1 in MPI_Finalize, for ever
  local left = "rank 1 finalized while rank 0 waits in all_reduce (sum) of f32 {4} on cpu"
  for _, how in ipairs{"exit", "end", "caught", "finalize"} do
    it("gives rank 0 an error naming rank 1 when rank 1 leaves (" .. how .. ") while rank 0 waits", function()
      local out, code = mpirun(2, H.mpengine .. " " .. DIR .. "leave.lua " .. how)
      assert.are.equal(0, code, out)   -- rank 0 caught its error, rank 1 left as it chose
      assert.truthy(out:find("rank 0 all_reduce: mp.dist.all_reduce: " .. left, 1, true), out)
      -- a rank left: no collective can complete after, and each says why at once
      assert.truthy(out:find("rank 0 barrier: mp.dist.barrier: no collective can run any more: " .. left, 1, true), out)
      -- rank 1's own words: from its mp.dist.finalize(), or at its exit
      local own = how == "finalize" and "rank 1 finalize: mp.dist.finalize: " or "mp.dist.finalize at exit: "
      assert.truthy(out:find(own .. left, 1, true), out)
      if how == "caught" then assert.truthy(out:find("rank 1 caught: a failure of its own", 1, true), out) end
    end)
  end

  it("ends the job when rank 0 does not catch that error, with both ranks' words", function()
    -- rank 1's words come at its exit, which may be after rank 0's error: mpirun
    -- must not kill it first (by default it ends the job at the first non-zero
    -- exit, and under load rank 1 had not yet spoken). mpirun then exits 0, so
    -- each rank says its own exit status
    local cmd = "sh -c '" .. H.mpengine .. " " .. DIR .. "leave.lua end uncaught; " ..
                "echo \"rank $OMPI_COMM_WORLD_RANK exited $?\"'"
    local out, code = mpirun(2, cmd, nil, "--mca orte_abort_on_non_zero_status 0")
    assert.are_not.equal(124, code, "timed out: " .. out)
    assert.truthy(out:find("rank 0 exited 1", 1, true), out)   -- the uncaught error ended it
    assert.truthy(out:find("mp.dist.all_reduce: " .. left, 1, true), out)
    assert.truthy(out:find("mp.dist.finalize at exit: " .. left, 1, true), out)
    assert.falsy(out:find("rank 0 all_reduce:", 1, true), out)
  end)

  it("gives rank 0's backward an error when rank 1 runs out of batches first (the buckets' rendezvous)", function()
    local envs = {cpu = {}, cuda = H.emu and os.getenv("MP_DEVICE") ~= "cuda" and H.emu_env() or nil}
    for dev, env in pairs(envs) do   -- on the emulated device, before the bucket's NCCL call
      -- rank 0 ends at the script's end, then by os.exit: each leaves with step 3's
      -- queued work still to run (the emulated device ran it in C's exit handlers,
      -- after oneDNN's JIT kernels were destroyed: a segfault)
      for _, ending in ipairs{"", " exit"} do
        local out, code = mpirun(2, H.mpengine .. " " .. DIR .. "leave.lua uneven" .. ending, env)
        assert.are.equal(0, code, out)
        local why = "rank 1 finalized while rank 0 waits in the gradient average (a bucket of f32 {8} on " .. dev .. ")"
        assert.truthy(out:find("rank 0 step 3: .-Tensor:backward: " .. why:gsub("%p", "%%%0")), out)
        assert.truthy(out:find("mp.dist.finalize at exit: " .. why, 1, true), out)
      end
    end
  end)

  it("turns a wait past mp.dist.init{timeout = 1} into an error naming the collective and the rank that did not come", function()
    -- timeout.lua: rank 1 stays away until rank 0 has timed out, then calls all_reduce
    local mark = tmp("mark")
    local out, code = mpirun(2, H.mpengine .. " " .. DIR .. "timeout.lua " .. mark)
    os.remove(mark .. ".0"); os.remove(mark .. ".1")
    local said = "rank 0 timed out after 1 s waiting in all_reduce (sum) of f32 {4} on cpu: rank 1 did not arrive"
    assert.truthy(out:find("rank 0 all_reduce: mp.dist.all_reduce: " .. said .. " (mp.dist.init{timeout = seconds})", 1, true), out)
    assert.truthy(out:find("rank 0 barrier: mp.dist.barrier: no collective can run any more: " .. said, 1, true), out)
    -- rank 1, late: rank 0's notice, at once (not a wait of its own, nor a match with rank 0's abandoned part)
    assert.truthy(out:find("rank 1 all_reduce: mp.dist.all_reduce: " .. said, 1, true), out)
    assert.truthy(out:find("rank 1 barrier: mp.dist.barrier: no collective can run any more: " .. said, 1, true), out)
    -- a rank may never come: MPI cannot finalize, and the job ends with MPI_Abort at exit
    assert.truthy(out:find("mp.dist.finalize at exit: MPI cannot finalize after a collective failed (" .. said, 1, true), out)
    assert.are_not.equal(0, code, out)
    assert.are_not.equal(124, code, "timed out: " .. out)
  end)
end)
