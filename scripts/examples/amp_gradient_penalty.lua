-- AMP recipe: a gradient penalty (PyTorch's amp_examples.html, "Gradient
-- penalty"; test_grad_scaling_penalty).
--
--   build/mpengine scripts/examples/amp_gradient_penalty.lua
--
-- The loss gets the norm of its own gradients added: the gradients come from
-- mp.autograd.grad with create_graph, so that they are differentiable again and the
-- final backward reaches the parameters through them (second derivatives). The
-- first gradients must be taken of the scaled loss too (f16 gradients would
-- underflow otherwise), and unscaled before the penalty is formed: they belong to
-- no optimizer, so scaler:unscale cannot do it; multiply by 1 / scale by hand.
-- mp.autograd.grad leaves .grad alone; the final scaled backward fills it, and
-- scaler:step unscales that as usual.
--
-- Differences from PyTorch: mp.autograd.grad(outputs, inputs, {create_graph = true})
-- takes its options in a table and returns a list.
local mp = mp or require "mp"

local recipe = {}

-- as amp_plain.lua's train, the loss plus the norm of its gradients
function recipe.train(model, opt, scaler, batches, dtype)
  local losses = {}
  for i, b in ipairs(batches) do
    opt:zero_grad()
    local params = model:parameters()
    local loss
    do
      local _ <close> = mp.amp.autocast(dtype or false)
      loss = mp.mse_loss(model(b[1]), b[2])
    end
    -- the scaled loss's gradients, themselves differentiable (create_graph)
    local scaled = mp.autograd.grad(scaler:scale(loss), params, {create_graph = true})
    local inv_scale = 1 / scaler:get_scale()
    local norm2 = 0
    do
      local _ <close> = mp.amp.autocast(dtype or false)
      for _, g in ipairs(scaled) do
        local u = g * inv_scale      -- unscaled by hand: these gradients have no optimizer
        norm2 = norm2 + (u * u):sum()
      end
      loss = loss + norm2:sqrt()     -- the penalty
    end
    scaler:scale(loss):backward()    -- through the gradients' graph: second derivatives
    scaler:step(opt)
    scaler:update()
    losses[i] = loss:item()
  end
  return losses
end

-- run as a script: the demo of demo.lua
if arg and arg[0] and arg[0]:match("amp_gradient_penalty%.lua$") then
  local demo = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "demo.lua")
  local d = demo.setup{hidden = mp.nn.Tanh()}   -- smooth: ReLU's second derivative is 0
  demo.report(d.scaler, #d.batches, "loss + penalty", recipe.train(d.model, d.opt, d.scaler, d.batches, "f16"))
end

return recipe
