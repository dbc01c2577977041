-- cnn.lua: the convolutional network of scripts/train_cnn.lua: two blocks of
-- 3x3 convolution (padding 1, no bias: the batch norm after it has one), batch
-- norm, ReLU and 2x2 max pooling, then two linear layers with a ReLU between.
-- Parameter and buffer names, layouts and initialisation are PyTorch's defaults
-- for the same modules, so a PyTorch state dict of the same definition loads
-- one to one.
--
--   local CNN = dofile("scripts/models/cnn.lua")
--   local model = CNN{}                  -- Fashion-MNIST: 1 x 28 x 28 -> 10 classes
--   local logits = model(x)              -- x {n, 1, 28, 28} -> {n, 10}
local mp = mp or require "mp"
local nn = mp.nn

local CNN = nn.Module:extend("CNN")

-- cfg: channels (1), size (28, the input's height and width: a multiple of 4),
-- c1 (32), c2 (64), hidden (128), classes (10)
function CNN:init(cfg)
  cfg = cfg or {}
  local channels, size = cfg.channels or 1, cfg.size or 28
  local c1, c2, hidden, classes = cfg.c1 or 32, cfg.c2 or 64, cfg.hidden or 128, cfg.classes or 10
  assert(size % 4 == 0, "cnn: size must be a multiple of 4")
  self.conv1 = nn.Conv2d(channels, c1, 3, { padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(c1)
  self.conv2 = nn.Conv2d(c1, c2, 3, { padding = 1, bias = false })
  self.bn2 = nn.BatchNorm2d(c2)
  self.pool = nn.MaxPool2d(2)
  self.flatten = nn.Flatten()
  self.fc1 = nn.Linear(c2 * (size // 4) * (size // 4), hidden)
  self.fc2 = nn.Linear(hidden, classes)
end

function CNN:forward(x)
  x = self.pool(mp.relu(self.bn1(self.conv1(x))))
  x = self.pool(mp.relu(self.bn2(self.conv2(x))))
  return self.fc2(mp.relu(self.fc1(self.flatten(x))))
end

return CNN
