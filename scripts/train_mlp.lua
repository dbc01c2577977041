-- train_mlp.lua: Fashion-MNIST with an MLP 784-512-256-10 (ReLU), Adam, batch 128.
--
--   build/mpengine scripts/train_mlp.lua [--epochs N] [--batch B] [--lr LR] [--seed S]
--       [--save PATH] [--resume PATH] [--metrics FILE] [--max-steps K]
--       [--amp off|f16|bf16|fp8] [--recipe delayed|current|block|mx|FILE.lua]
--       [--policy NAME[:ARGS]|PATH] [--trace FILE] [--tiny K]
--       [--inject-overflow N]
--
-- The same seed gives bit-identical weights on the CPU. --save writes a checkpoint
-- (model, optimizer, data position, random state, and with --amp the loss scaler's
-- state) at the end of each epoch and at the end of the run; --resume continues from
-- one exactly where it stopped, mid-epoch included (the checkpoint's --amp and
-- --policy must match this run's). --max-steps stops early (after K optimizer steps
-- in all, skipped steps included).
--
-- Mixed precision (docs/DESIGN.md section 6): --amp f16|bf16 runs the forward pass and
-- the loss under mp.amp.autocast (matmuls in f16/bf16 with f32 accumulation, softmax
-- and the loss in f32); the model keeps its FP32 master weights and Adam updates
-- them. The loss goes through a GradScaler: a step whose gradients hold inf/NaN is
-- skipped (weights and optimizer state untouched). The test set is evaluated in batches
-- of --batch under the same autocast. --policy picks how the loss scale moves:
--
--   static             a fixed scale of 2^16; static:S fixes S instead (static:1024,
--                      static:2^20)
--   none               no scaling (scale 1); the default for --amp bf16, whose exponent
--                      range is f32's (PyTorch's bf16 autocast uses no scaler either)
--   dynamic            PyTorch GradScaler's rule (init 2^16, x2 after 2000 clean steps,
--                      x0.5 on overflow); the default for --amp f16
--   hysteresis         DeepSpeed's rule (back off after 2 overflows, grow after 1000)
--   amax               proactive: from the recent gradient amax history
--   NAME:k=v,k=v       a built-in with options, e.g. dynamic:init=1024,interval=500
--                      (the names of mp.amp.policy.NAME{...}; values are numbers or
--                      2^N, on_min=warn|error)
--   PATH               a Lua file (anything with a '/' or ending in .lua) that returns
--                      a policy: a table with update(self, info) -> new scale and
--                      optionally init(self) (see scripts/policies/); a policy that
--                      has state_dict()/load_state_dict(sd) is saved in checkpoints,
--                      one with `telemetry = true` turns on scaler:telemetry so its
--                      info carries zero/underflow/overflow fractions
--
-- --trace FILE (with --amp) records the loss scaler's view of every step into FILE
-- (JSON lines, gzip'd when FILE ends in .gz; scaler:trace in lua/mp/amp/trace.lua says what a
-- line holds), read back by mp.amp.load_trace. A resumed run's trace starts at the
-- resume.
--
-- Two lab settings for traces (scripts/policy_lab.lua): --tiny K multiplies the loss
-- by 2^-K and Adam's eps by the same (scripts/underflow.lua's small-loss setting:
-- Adam's steps then do not depend on the loss's scale, so the run is the ordinary
-- one in f32, but its gradients
-- sit 2^K lower, where f16 flushes them without enough loss scale; the progress
-- and metrics show the true loss); --inject-overflow N (with --amp) multiplies the
-- loss of every N-th step by 2^12 before scaling, a spike as a rare bad batch makes:
-- at the usual scales (2^16) its backward overflows f16, at 2^3 and below it fits.
--
-- --amp fp8 runs every nn.Linear in FP8 under mp.fp8.autocast (the rest as --amp
-- bf16, policy none unless --policy) with the scaling recipe --recipe (default
-- delayed; a FILE.lua returns a recipe table); the first line names the recipe and
-- its layout, and checkpoints hold its state (mp.fp8.Scaler:state_dict).
--
-- --policy needs --amp f16, bf16 or fp8. With --amp, the metrics lines carry "scale" (the
-- scale for the next step) and "skipped" (skipped steps so far), each epoch line shows
-- the same two, and the run ends with
--   skipped steps: S of N (overflow a, nan b, forward c)
--   final test accuracy: 0.XXXX
-- (the last line is always the accuracy).
local mp = mp or require "mp"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
dofile(here .. "lib/train_classifier.lua") {
  name = "train_mlp.lua",
  shape = { -1, 784 },
  model = function()
    local nn = mp.nn
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
  end,
}
