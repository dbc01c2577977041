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

local function rig(device, policy, sync)
  mp.manual_seed(7)
  local model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 5))
  model:to(device)
  local opt = mp.optim.Adam(model:parameters(), {lr = 1e-3})
  local scaler = mp.amp.GradScaler{policy = policy or mp.amp.policy.dynamic{interval = 2}, sync = sync}
  local x = mp.randn({16, 20}):to(device)
  local y = mp.tensor({0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0}, {dtype = "i32"}):to(device)
  return {model = model, opt = opt, scaler = scaler, x = x, y = y}
end

-- one f16 AMP training step, touching nothing on the host
local function step(r, poison)
  r.opt:zero_grad()
  local loss
  do
    local _ <close> = mp.amp.autocast("f16")
    loss = mp.cross_entropy(r.model(r.x), r.y)
  end
  if poison then loss = loss * math.huge end   -- an inf loss: the step must be skipped
  r.scaler:scale(loss):backward()
  local applied = r.scaler:step(r.opt)
  r.scaler:update()
  return applied
end

local function delta(before)
  local now = mp.counters()
  local d = {}
  for k, v in pairs(now) do d[k] = v - before[k] end
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
  end)

  it("on a GPU: no copy to the host, no wait, no cudaMalloc in a warm step", function()
    if not mp.cuda.is_available() then return pending("no CUDA device on this machine") end
    local r = rig("cuda", nil, false)
    for _ = 1, 3 do step(r) end   -- warm: the caching allocator holds every block a step needs
    mp.cuda.synchronize()
    local before = mp.counters()
    for _ = 1, 3 do step(r) end
    local d = delta(before)
    assert.are.same({host_reads = 0, device_to_host = 0, device_waits = 0, device_mallocs = 0}, d)
    -- and it computed what the CPU computes
    local c = rig("cpu", nil, false)
    for _ = 1, 6 do step(c) end
    mp.cuda.synchronize()
    local pc, pg = c.model:parameters(), r.model:parameters()
    for i = 1, #pc do H.assert_close(pg[i]:cpu():totable(), pc[i]:totable(), 1e-3, 1e-4, "param " .. i) end
    assert.are.equal(c.scaler:get_scale(), r.scaler:get_scale())
  end)
end)
