-- thread_bits_child.lua MODEL MODE OUT: a few training steps of MODEL (gpt, resnet,
-- mlp) in MODE (f32, or bf16/f16 autocast, f16 with a loss scaler) from seed 0,
-- then the model's and optimizer's state saved to OUT. thread_bits_spec.lua runs
-- it in child processes and compares the files byte for byte.
local mp = require "mp"
local kind, mode, out = arg[1], arg[2], arg[3]
local root = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "../../"
mp.manual_seed(0)
local model, opt, batch
if kind == "gpt" then
  local GPT = dofile(root .. "scripts/models/gpt.lua")
  model = GPT { vocab = 114, ctx = 64, layers = 2, dim = 128, heads = 4 }
  opt = mp.optim.AdamW(mp.optim.decay_groups(model, 0.1), { lr = 3e-3 })
  local ids = mp.randint(0, 114, { 100000 })
  batch = function()
    local x, y = mp.data.windows(ids, 32, 64)
    return x, y:reshape { -1 }, function(o) return o:reshape { -1, 114 } end
  end
elseif kind == "resnet" then
  local ResNet = dofile(root .. "scripts/models/resnet.lua")
  model = ResNet { widths = { 16, 32, 64 }, blocks = 1 }
  opt = mp.optim.SGD(model:parameters(), { lr = 0.05, momentum = 0.9 })
  batch = function() return mp.randn { 16, 3, 32, 32 }, mp.randint(0, 10, { 16 }) end
elseif kind == "mlp" then
  local nn = mp.nn
  model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
  opt = mp.optim.Adam(model:parameters(), { lr = 1e-3 })
  batch = function() return mp.randn { 128, 784 }, mp.randint(0, 10, { 128 }) end
else
  error("thread_bits_child.lua: unknown model '" .. tostring(kind) .. "'")
end
local scaler = mode == "f16" and mp.amp.GradScaler {} or nil
for _ = 1, 3 do
  local x, y, shape = batch()
  opt:zero_grad()
  local loss
  do
    local _ <close> = mode ~= "f32" and mp.amp.autocast(mode) or nil
    local o = model(x)
    loss = mp.cross_entropy(shape and shape(o) or o, y)
  end
  if scaler then
    scaler:scale(loss):backward()
    scaler:step(opt)
    scaler:update()
  else
    loss:backward()
    opt:step()
  end
end
mp.save(out, { model = model:state_dict(), optim = opt:state_dict() })
