-- nosync_spec.lua: a training step with a built-in policy never waits for the
-- device (issue: "the skip decision, found_inf and the built-in policies' scale
-- update stay on the device").
--
-- mp.counters() counts every read of a backend's memory by the host (on any
-- device: item(), a scaler or optimizer state read, indices checked on the host)
-- and, on a GPU, the backend's own copies to the host, waits and cudaMallocs. The
-- CPU part runs everywhere: the engine must take no decision on the host in an
-- f16 AMP step with GradScaler{sync = false}. The CUDA part runs where a GPU is
-- present (else pending) and also asserts zero device-to-host copies, zero waits
-- and zero device allocations after warm-up.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/nosync_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local R = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "train_rig.lua")
local rig, step = R.rig, R.step

local function delta(before)
  local now = mp.counters(before.device)
  local d = {}
  for k, v in pairs(now) do if k ~= "device" then d[k] = v - before[k] end end
  return d
end

describe("a training step without waiting for the device", function()
  it("reads nothing back on the host with a built-in policy and sync = false (cpu)", function()
    for _, policy in ipairs{mp.amp.policy.dynamic{interval = 2}, mp.amp.policy.hysteresis{window = 2},
                            mp.amp.policy.amax{}, mp.amp.policy.static(1024)} do
      local r = rig("cpu", policy, false)
      step(r)
      local before = mp.counters()
      for _ = 1, 3 do assert.is_nil(step(r)) end   -- the outcome stays with the kernels
      local d = delta(before)
      assert.are.equal(0, d.host_reads, tostring(policy))
    end
  end)

  it("counts the one read that sync = true costs, so the counter can fail", function()
    local r = rig("cpu", nil, true)
    step(r)
    local before = mp.counters()
    assert.is_true(step(r))
    assert.are.equal(1, delta(before).host_reads)
    before = mp.counters()
    local _ = r.scaler.stats   -- reading the state is a read too
    assert.are.equal(1, delta(before).host_reads)
  end)

  it("skips on the device: a poisoned step leaves the weights and the step count alone", function()
    local r = rig("cpu", mp.amp.policy.dynamic{init = 1024, interval = 100}, false)
    step(r)
    local w0 = r.model:parameters()[1]:clone()
    assert.is_nil(step(r, true))
    H.assert_same(r.model:parameters()[1]:totable(), w0:totable(), "weights after a skipped step")
    local st = r.scaler.stats
    assert.are.equal(2, st.steps)
    assert.are.equal(1, st.skipped)
    assert.are.equal(512, r.scaler:get_scale())
    assert.are.equal(1, r.opt.step_count)
    assert.is_nil(step(r))
    assert.are.equal(2, r.opt.step_count)
  end)

  it("gives the same weights as sync = true", function()
    local a, b = rig("cpu", nil, true), rig("cpu", nil, false)
    for i = 1, 5 do
      step(a, i == 3)
      step(b, i == 3)
    end
    local pa, pb = a.model:parameters(), b.model:parameters()
    for i = 1, #pa do H.assert_same(pb[i]:totable(), pa[i]:totable(), "param " .. i) end
    assert.are.equal(a.scaler:get_scale(), b.scaler:get_scale())
    assert.are.same(a.scaler.stats, b.scaler.stats)
  end)

  it("refuses on_skip without sync: the callback needs the outcome on the host", function()
    local r = rig("cpu", nil, false)
    r.scaler.on_skip = function() end
    H.raises(function() step(r) end, {"GradScaler:step", "on_skip", "sync = true"})
  end)

  it("rejects a sync option that is not a boolean, naming it", function()
    H.raises(function() mp.amp.GradScaler{sync = 0} end, {"mp.amp.GradScaler", "sync", "boolean"})
    H.raises(function() mp.amp.GradScaler{sync = "no"} end, {"mp.amp.GradScaler", "sync", "boolean"})
    local c = mp.counters()
    for _, k in ipairs{"host_reads", "device_to_host", "device_waits", "device_mallocs"} do
      assert.are.equal("integer", math.type(c[k]), k)
    end
    assert.are.equal(mp.default_device(), c.device)
    H.raises(function() mp.counters("tpu") end, {"mp.counters", "tpu"})
  end)

  -- in a child: how soon steps are warm depends on what the process holds
  -- (lua/lbind.c paces collections by it), so a fresh process measures
  local RIG = H.q(H.root .. "/tests/lua/train_rig.lua")

  it("allocates nothing new in a warm step: the MLP at batch 128 on the cpu", function()
    local r = H.child([[
      local R = dofile(]] .. RIG .. [[)
      local r = R.rig("cpu", nil, false, R.MLP128)
      for _ = 1, R.WARM do R.step(r) end
      local b = mp.counters("cpu").device_mallocs
      for _ = 1, R.MEASURE do R.step(r) end
      local warm = mp.counters("cpu").device_mallocs - b
      local t = mp.zeros({12345}, {device = "cpu"})   -- the counter counts: a new size is a new allocation
      return warm .. " " .. (mp.counters("cpu").device_mallocs - b - warm)]])
    assert.are.equal("OK:0 1", r.out, r.err)
  end)

  it("on a GPU: no copy to the host, no wait, no cudaMalloc in a warm step, and the CPU's weights", function()
    if not mp.cuda.is_available() then return pending("no CUDA device on this machine") end
    local r = H.child([[
      local R = dofile(]] .. RIG .. [[)
      local r = R.rig("cuda", nil, false, R.MLP128)
      for _ = 1, R.WARM do R.step(r) end
      mp.cuda.synchronize()
      local b = mp.counters("cuda")
      for _ = 1, R.MEASURE do R.step(r) end
      local a = mp.counters("cuda")
      local out = {}
      for _, k in ipairs{"host_reads", "device_to_host", "device_waits", "device_mallocs"} do
        out[#out + 1] = k .. "=" .. (a[k] - b[k])
      end
      -- and it computes what the CPU computes: 6 steps from the same start. Not
      -- every element: the GPU's f16 GEMMs sum in another order, so a weight
      -- gradient near zero can differ in sign, and Adam's first steps move such a
      -- weight by about lr either way whatever the gradient's size (1e-3, ten
      -- times the bound below). So per parameter, at most 1% of its elements may
      -- be off; a wrong kernel is off in far more (a bias of 10 allows none).
      local c, d = R.rig("cpu", nil, false, R.MLP128), R.rig("cuda", nil, false, R.MLP128)
      for _ = 1, 6 do R.step(c); R.step(d) end
      local pc, pg, bad = c.model:parameters(), d.model:parameters(), {}
      for i = 1, #pc do
        local x, y = pg[i]:cpu():reshape{-1}:totable(), pc[i]:reshape{-1}:totable()
        local off, worst = 0, 0
        for j = 1, #y do
          local e = math.abs(x[j] - y[j])
          if e > 1e-4 + 1e-3 * math.abs(y[j]) then off = off + 1 end
          worst = math.max(worst, e)
        end
        if off > #y // 100 then bad[#bad + 1] = ("param %d: %d of %d off, worst %.3g"):format(i, off, #y, worst) end
      end
      out[#out + 1] = "close=" .. (#bad == 0 and "true" or "false(" .. table.concat(bad, "; ") .. ")")
      out[#out + 1] = "same_scale=" .. tostring(c.scaler:get_scale() == d.scaler:get_scale())
      return table.concat(out, " ")]], false, { MP_DEVICE = "cuda" })
    assert.are.equal("OK:host_reads=0 device_to_host=0 device_waits=0 device_mallocs=0 close=true same_scale=true",
                     r.out, r.err)
  end)
end)
