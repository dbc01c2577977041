-- AMP recipe: several models, losses and optimizers with one scaler (PyTorch's
-- amp_examples.html, "Working with Multiple Models, Losses, and Optimizers";
-- test_grad_scaling_multiple).
--
--   build/mpengine scripts/examples/amp_two_models.lua
--
-- Both losses read both models' outputs, so their graphs share the models' parts:
-- the first backward keeps the graph (retain_graph) for the second, and each
-- model's gradients are the sum of the two losses' contributions. One scaler
-- serves every optimizer: scale each loss, step each optimizer through it, update
-- once at the end. unscale may be called for some optimizers only (here opt0, to
-- read or change its gradients before its step). Each optimizer's step is skipped
-- only when its own gradients hold an inf/NaN; the scale backs off when any did.
--
-- Differences from PyTorch: backward takes (grad, opts): retain_graph goes in the
-- options table after a nil gradient.
local mp = mp or require "mp"

local recipe = {}

-- models, opts: two each (opts[k] owns models[k]'s parameters); returns the
-- losses, {loss0, loss1} per iteration
function recipe.train(models, opts, scaler, batches, dtype)
  local losses = {}
  for i, b in ipairs(batches) do
    opts[1]:zero_grad()
    opts[2]:zero_grad()
    local loss0, loss1
    do
      local _ <close> = mp.amp.autocast(dtype or false)
      local out0, out1 = models[1](b[1]), models[2](b[1])
      loss0 = mp.mse_loss(out0 * 0.3 + out1 * 0.7, b[2])
      loss1 = mp.mse_loss(out0 * 0.6 - out1 * 0.4, b[2])
    end
    scaler:scale(loss0):backward(nil, {retain_graph = true})   -- loss1 walks out0's and out1's graph again
    scaler:scale(loss1):backward()
    scaler:unscale(opts[1])   -- opts[1]'s gradients are the true ones from here (clip or read them)
    scaler:step(opts[1])
    scaler:step(opts[2])
    scaler:update()
    losses[i] = {loss0:item(), loss1:item()}
  end
  return losses
end

-- run as a script: the demo of demo.lua
if arg and arg[0] and arg[0]:match("amp_two_models%.lua$") then
  local demo = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "demo.lua")
  local d = demo.setup()   -- the first model, with SGD; the second gets Adam
  local models = {d.model, demo.model()}
  local opts = {d.opt, mp.optim.Adam(models[2]:parameters(), {lr = 1e-2})}
  local losses = recipe.train(models, opts, d.scaler, d.batches, "f16")
  local loss0, loss1 = {}, {}
  for i, l in ipairs(losses) do loss0[i], loss1[i] = l[1], l[2] end
  demo.report(d.scaler, #d.batches, "loss0", loss0, "loss1", loss1)
end

return recipe
