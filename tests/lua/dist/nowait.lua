-- nowait.lua: a data-parallel f16 step on a device with collectives of its own
-- (the fake device's, MP_FAKE_CUDA_COLL=1: a world of one, as NCCL with one
-- rank) for dist_spec.lua: the gradient average and the scaler's shared
-- findings go through the device's collectives, and after warm-up a step
-- reads nothing back on the host. Prints "steps S reads R copies C waits W",
-- then ends the group.
local mp = require "mp"
mp.dist.init{device_collectives = true}
mp.manual_seed(0)
local nn = mp.nn
local model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
-- buckets of 512 bytes: four (the last bias, the last weight, the first bias,
-- the first weight), each reduced as backward finishes it
local opt = mp.optim.Adam(model:parameters(), {lr = 1e-3, dist = {bucket_mb = 512 / 1048576}})
local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{interval = 2}, sync = false}
local x, y = mp.randn({8, 16}), mp.randint(0, 4, {8})
local function step()
  opt:zero_grad()
  local loss
  do
    local _ <close> = mp.amp.autocast("f16")
    loss = mp.cross_entropy(model(x), y)
  end
  scaler:scale(loss):backward()
  scaler:step(opt)
  scaler:update()
end
step()
local before = mp.counters()
for _ = 1, 4 do step() end
local now = mp.counters()
print(string.format("steps 5 reads %d copies %d waits %d", now.host_reads - before.host_reads,
  now.device_to_host - before.device_to_host, now.device_waits - before.device_waits))
mp.dist.finalize()   -- the group ends, and what the device kept for it (the emulated device counts it)
