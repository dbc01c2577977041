-- AMP recipe: gradient accumulation (PyTorch's amp_examples.html, "Gradient
-- accumulation"; test_grad_scaling_accumulation).
--
--   build/mpengine scripts/examples/amp_accumulate.lua
--
-- One optimizer step per `every` micro-batches: each micro-batch's loss is divided
-- by `every` (the step sees the mean gradient) and backwarded scaled; the scaled
-- gradients add up in .grad. The scale must stay the same over the micro-batches
-- of one step, so scaler:step and scaler:update come only at the step, and the
-- gradients are zeroed after it. An inf/NaN in any micro-batch's gradient stays in
-- the sum and skips the whole step.
--
-- Differences from PyTorch: none in the calls (unscale is spelled without `_`).
local mp = mp or require "mp"

local recipe = {}

-- batches: #batches must be a multiple of `every`; returns the micro-batches' losses
function recipe.train(model, opt, scaler, batches, every, dtype)
  assert(#batches % every == 0, "amp_accumulate: #batches must be a multiple of every")
  local losses = {}
  opt:zero_grad()
  for i, b in ipairs(batches) do
    local loss
    do
      local _ <close> = mp.amp.autocast(dtype or false)
      loss = mp.mse_loss(model(b[1]), b[2]) / every
    end
    scaler:scale(loss):backward()   -- adds to the gradients of the earlier micro-batches
    if i % every == 0 then
      scaler:step(opt)
      scaler:update()                -- a new scale only between steps
      opt:zero_grad()
    end
    losses[i] = loss:item()
  end
  return losses
end

-- run as a script: the demo of demo.lua
if arg and arg[0] and arg[0]:match("amp_accumulate%.lua$") then
  local demo = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "demo.lua")
  local d = demo.setup{batches = 80, rows = 4}   -- 40 steps of two micro-batches
  local losses = recipe.train(d.model, d.opt, d.scaler, d.batches, 2, "f16")
  for i, l in ipairs(losses) do losses[i] = l * 2 end   -- each micro-batch's own loss, undivided
  demo.report(d.scaler, #d.batches // 2, "micro-batch loss", losses)
end

return recipe
