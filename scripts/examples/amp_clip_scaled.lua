-- AMP recipe: gradient clipping on the scaled gradients (PyTorch's
-- test_grad_scaling_clipping; amp_examples.html clips after unscale instead,
-- which is amp_clip_unscaled.lua).
--
--   build/mpengine scripts/examples/amp_clip_scaled.lua
--
-- After scaler:scale(loss):backward() every gradient is multiplied by the scale,
-- and so is their norm. Clipping them at max_norm * scale clips the true gradients
-- at max_norm, with no unscale pass of its own; scaler:step unscales afterwards.
-- An inf or NaN gradient makes the norm inf/NaN: the clip spreads it over every
-- gradient, and scaler:step skips the step as it would have anyway.
--
-- Differences from PyTorch: clip_grad_norm_ is mp.optim.clip_grad_norm (same rule:
-- multiply by max_norm / (norm + 1e-6) when that is < 1; returns the norm).
local mp = mp or require "mp"

local recipe = {}

-- as amp_plain.lua's train, clipping the gradients' total norm at max_norm
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
    -- the gradients are still scaled: so is the bound
    mp.optim.clip_grad_norm(model:parameters(), max_norm * scaler:get_scale())
    scaler:step(opt)
    scaler:update()
    losses[i] = loss:item()
  end
  return losses
end

-- run as a script: the demo of demo.lua
if arg and arg[0] and arg[0]:match("amp_clip_scaled%.lua$") then
  local demo = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "demo.lua")
  local d = demo.setup()
  demo.report(d.scaler, #d.batches, "loss", recipe.train(d.model, d.opt, d.scaler, d.batches, 1.0, "f16"))
end

return recipe
