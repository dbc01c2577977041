-- AMP recipe: typical mixed precision training (PyTorch's amp_examples.html,
-- "Typical Mixed Precision Training").
--
--   build/mpengine scripts/examples/amp_plain.lua
--
-- Each iteration runs the forward under autocast, multiplies the loss by the scale
-- before backward (so that small f16 gradients do not flush to zero), and lets the
-- scaler step the optimizer: scaler:step unscales the gradients and skips the step
-- when one of them is inf or NaN; scaler:update grows the scale after clean steps
-- and backs it off after a skipped one.
--
-- Differences from PyTorch: autocast is a to-be-closed guard (`local _ <close>`)
-- rather than a `with` block; `unscale_` is `unscale`; scaler:step returns whether
-- the step was applied. tests/lua/amp_recipes_spec.lua runs train() against an
-- unscaled control, as PyTorch's test_grad_scaling_* tests do.
local mp = mp or require "mp"

local recipe = {}

-- model: a module; opt: its optimizer; scaler: an mp.amp.GradScaler;
-- batches: a list of {input, target}; dtype: the autocast dtype ("f16", "bf16"),
-- nil for none (f32). Returns the losses, one per iteration.
function recipe.train(model, opt, scaler, batches, dtype)
  local losses = {}
  for i, b in ipairs(batches) do
    opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast(dtype or false)   -- with torch.autocast(...):
      loss = mp.mse_loss(model(b[1]), b[2])
    end                                                   -- backward runs outside the region
    scaler:scale(loss):backward()
    scaler:step(opt)      -- unscales opt's gradients, then steps unless one is inf/NaN
    scaler:update()
    losses[i] = loss:item()
  end
  return losses
end

-- run as a script: the demo of demo.lua
if arg and arg[0] and arg[0]:match("amp_plain%.lua$") then
  local demo = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "demo.lua")
  local d = demo.setup()
  demo.report(d.scaler, #d.batches, "loss", recipe.train(d.model, d.opt, d.scaler, d.batches, "f16"))
end

return recipe
