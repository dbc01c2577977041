-- train_cnn.lua: Fashion-MNIST with the CNN of scripts/models/cnn.lua (two blocks of
-- 3x3 convolution, batch norm, ReLU and 2x2 max pooling; then 3136-128-10 with ReLU),
-- Adam, batch 128.
--
--   build/mpengine scripts/train_cnn.lua [--epochs N] [--batch B] [--lr LR] [--seed S]
--       [--save PATH] [--resume PATH] [--metrics FILE] [--max-steps K]
--       [--amp off|f16|bf16|fp8] [--recipe delayed|current|block|mx|FILE.lua]
--       [--policy NAME[:ARGS]|PATH] [--trace FILE]
--
-- Options, checkpoints (which hold the batch norms' running statistics), mixed
-- precision and output are train_mlp.lua's (see its header): the two scripts share
-- scripts/lib/train_classifier.lua. Under --amp the convolutions and linear layers
-- run in f16/bf16 and batch norm in f32, as PyTorch's autocast does (--amp fp8: the
-- linear layers in FP8, the convolutions in bf16); evaluation uses
-- the running statistics. The run ends with
--   final test accuracy: 0.XXXX
local mp = mp or require "mp"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local CNN = dofile(here .. "models/cnn.lua")
dofile(here .. "lib/train_classifier.lua") {
  name = "train_cnn.lua",
  shape = { -1, 1, 28, 28 },
  model = function() return CNN {} end,
}
