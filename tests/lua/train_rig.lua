-- train_rig.lua: a small training setup shared by the specs that count what a
-- step costs (nosync_spec.lua), and by the child processes they start
-- (loaded with dofile: not a spec itself).
local mp = require "mp"
local nn = mp.nn
local R = {}

-- a model, its optimizer and scaler, and one batch on `device`; size: nil for a
-- small net on 16 examples, or {inputs, hidden, classes, batch}
function R.rig(device, policy, sync, size)
  local nin, nh, nc, b = table.unpack(size or {20, 32, 5, 16})
  mp.manual_seed(7)
  local model = nn.Sequential(nn.Linear(nin, nh), nn.ReLU(), nn.Linear(nh, nc))
  model:to(device)
  local opt = mp.optim.Adam(model:parameters(), {lr = 1e-3})
  local scaler = mp.amp.GradScaler{policy = policy or mp.amp.policy.dynamic{interval = 2}, sync = sync}
  local x = mp.randn({b, nin}, {device = "cpu"}):to(device)
  local labels = {}
  for i = 1, b do labels[i] = (i - 1) % nc end
  local y = mp.tensor(labels, {dtype = "i32", device = device})
  return {model = model, opt = opt, scaler = scaler, x = x, y = y}
end

-- the MLP of train_mlp.lua at batch 128
R.MLP128 = {784, 512, 10, 128}
-- Warm: the binding collects the garbage of finished steps when a device has been
-- handed as many bytes as it holds (lua/lbind.c); for MLP128 that is every ~30
-- steps. After the first such collection the caching allocator holds every
-- block a step needs; each collection ends a window of the allocator, and two
-- windows later (step ~91) it gives back the blocks only the first steps used
-- (kernels/block_cache.h): on a GPU that is cudaFree, a wait. From then on a
-- step asks the system for nothing and gives it nothing back.
R.WARM = 120
R.MEASURE = 80   -- the warm steps measured

-- one f16 AMP training step, touching nothing on the host
function R.step(r, poison)
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

return R
