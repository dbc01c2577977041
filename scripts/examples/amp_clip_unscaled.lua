-- AMP recipe: gradient clipping after unscale (PyTorch's amp_examples.html,
-- "Gradient clipping"; test_grad_scaling_clipping_separate_unscale).
--
--   build/mpengine scripts/examples/amp_clip_unscaled.lua
--
-- scaler:unscale(opt) divides opt's gradients by the scale in place and notes
-- whether any is inf/NaN; the gradients are then the true ones, to clip (or
-- inspect) at max_norm. scaler:step(opt) knows they are unscaled already and does
-- not unscale them again; it still skips the step when unscale found an inf/NaN.
-- unscale may be called once per optimizer per step (between scale and update).
--
-- Differences from PyTorch: `unscale_` is `unscale`; clip_grad_norm_ is
-- mp.optim.clip_grad_norm, which never raises on a non-finite norm
-- (error_if_nonfinite = False, PyTorch's default).
local mp = mp or require "mp"

local recipe = {}

-- as amp_plain.lua's train, clipping the true gradients' total norm at max_norm
function recipe.train(model, opt, scaler, batches, max_norm, dtype)
  local losses = {}
  for i, b in ipairs(batches) do
    opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast(dtype or false)
      loss = mp.mse_loss(model(b[1]), b[2])
    end
    scaler:scale(loss):backward()
    scaler:unscale(opt)   -- opt's gradients are now the true ones
    mp.optim.clip_grad_norm(model:parameters(), max_norm)
    scaler:step(opt)      -- does not unscale again
    scaler:update()
    losses[i] = loss:item()
  end
  return losses
end

-- run as a script: the demo of demo.lua
if arg and arg[0] and arg[0]:match("amp_clip_unscaled%.lua$") then
  local demo = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "demo.lua")
  local d = demo.setup()
  demo.report(d.scaler, #d.batches, "loss", recipe.train(d.model, d.opt, d.scaler, d.batches, 1.0, "f16"))
end

return recipe
