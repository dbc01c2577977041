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

if arg and arg[0] and arg[0]:match("amp_two_models%.lua$") then
  mp.manual_seed(0)
  local nn = mp.nn
  local models = {nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8)),
                  nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))}
  local opts = {mp.optim.SGD(models[1]:parameters(), {lr = 0.1}), mp.optim.Adam(models[2]:parameters(), {lr = 1e-2})}
  local scaler = mp.amp.GradScaler()
  local teacher = mp.randn{8, 8}   -- the targets: a linear map of the inputs, to be learned
  local batches = {}
  for i = 1, 40 do local x = mp.randn{8, 8}; batches[i] = {x, mp.matmul(x, teacher)} end
  local losses = recipe.train(models, opts, scaler, batches, "f16")
  local first, last = losses[1], losses[#losses]
  print(string.format("loss0 %.4f -> %.4f, loss1 %.4f -> %.4f, scale %g, skipped %d of %d steps",
    first[1], last[1], first[2], last[2], scaler:get_scale(), scaler.stats.skipped, #losses))
end

return recipe
