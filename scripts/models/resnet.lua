-- resnet.lua: a small ResNet of basic blocks for 3 x 32 x 32 inputs (CIFAR-like):
-- a 3x3 stem convolution, batch norm and ReLU, then three stages of basic blocks
-- (3x3 conv, batch norm, ReLU, 3x3 conv, batch norm, plus the identity or a 1x1
-- stride-2 projection with batch norm, ReLU); each stage after the first starts
-- with a stride-2 3x3 convolution; then adaptive average pooling to 1 x 1 and a
-- linear layer to the classes. Convolutions have no bias (the batch norm after each
-- has one). Parameter names, layouts and initialisation are PyTorch's defaults for
-- the same modules (scripts/bench/bench_resnet_torch.py mirrors it).
--
--   local ResNet = dofile("scripts/models/resnet.lua")
--   local model = ResNet{}                            -- 16/32/64 channels, 1 block a stage
--   local wide = ResNet{ widths = {32, 64, 128}, blocks = 2 }
--   local logits = model(x)                           -- x {n, 3, 32, 32} -> {n, 10}
--   ResNet.macs{ widths = ..., blocks = ... }         -- forward multiply-adds of the
--                                                     -- convolutions and the linear layer, per sample
local mp = mp or require "mp"
local nn = mp.nn

local BasicBlock = nn.Module:extend("BasicBlock")

function BasicBlock:init(cin, cout, stride)
  self.conv1 = nn.Conv2d(cin, cout, 3, { stride = stride, padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(cout)
  self.conv2 = nn.Conv2d(cout, cout, 3, { padding = 1, bias = false })
  self.bn2 = nn.BatchNorm2d(cout)
  if stride ~= 1 or cin ~= cout then
    self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, { stride = stride, bias = false }), nn.BatchNorm2d(cout))
  end
end

-- relu(bn1(conv1(x))), then relu(bn2(conv2(.)) + shortcut): each batch norm with
-- what follows it as one op (BatchNorm2d's residual and activation options, the
-- values of the separate ops bit for bit, in fewer passes over memory)
function BasicBlock:forward(x)
  local out = self.conv2(self.bn1(self.conv1(x), { activation = "relu" }))
  local shortcut = self.downsample and self.downsample(x) or x
  return self.bn2(out, { residual = shortcut, activation = "relu" })
end

local ResNet = nn.Module:extend("ResNet")

local function config(cfg)
  cfg = cfg or {}
  return cfg.channels or 3, cfg.widths or { 16, 32, 64 }, cfg.blocks or 1, cfg.classes or 10
end

-- cfg: channels (3), widths ({16, 32, 64}: one stage each), blocks (1, per stage), classes (10)
function ResNet:init(cfg)
  local channels, widths, blocks, classes = config(cfg)
  self.conv1 = nn.Conv2d(channels, widths[1], 3, { padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(widths[1])
  local cin = widths[1]
  for s, w in ipairs(widths) do
    local stage = nn.Sequential()
    for b = 1, blocks do
      stage:add(BasicBlock(cin, w, (s > 1 and b == 1) and 2 or 1))
      cin = w
    end
    self["layer" .. s] = stage
  end
  self.nstages = #widths
  self.pool = nn.AdaptiveAvgPool2d(1)
  self.flatten = nn.Flatten()
  self.fc = nn.Linear(cin, classes)
end

function ResNet:forward(x)
  x = self.bn1(self.conv1(x), { activation = "relu" })
  for s = 1, self.nstages do x = self["layer" .. s](x) end
  return self.fc(self.flatten(self.pool(x)))
end

-- forward multiply-adds per sample of the convolutions and the linear layer (the
-- GEMM work), from the shapes; size: the input's height and width (32)
function ResNet.macs(cfg, size)
  local channels, widths, blocks, classes = config(cfg)
  local hw = (size or 32) * (size or 32)
  local total = hw * channels * widths[1] * 9
  local cin = widths[1]
  for s, w in ipairs(widths) do
    for b = 1, blocks do
      local stride = (s > 1 and b == 1) and 2 or 1
      hw = hw // (stride * stride)
      total = total + hw * cin * w * 9 + hw * w * w * 9
      if stride ~= 1 or cin ~= w then total = total + hw * cin * w end
      cin = w
    end
  end
  return total + cin * classes
end

return ResNet
