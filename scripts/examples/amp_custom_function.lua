-- AMP recipe: a custom autograd Function under autocast (PyTorch's
-- amp_examples.html, "Autocast and Custom Autograd Functions": custom_fwd /
-- custom_bwd, "Functions that need a particular dtype").
--
--   build/mpengine scripts/examples/amp_custom_function.lua
--
-- An op written in Lua with its own backward, that wants f32 whatever the region
-- (here swish, x * sigmoid(beta x), whose hand-written gradient would lose digits
-- in f16). cast_inputs = "f32" is PyTorch's @custom_fwd(cast_inputs=torch.float32):
-- inside an autocast region its floating inputs are cast to f32 and its forward
-- runs with autocast off; its backward runs in the forward's autocast state
-- (@custom_bwd), so off too. Outside a region cast_inputs changes nothing. The
-- rest of the model stays under autocast, the scaler is used as in amp_plain.lua.
--
-- Differences from PyTorch: the Function is a table {name, forward, backward,
-- cast_inputs} rather than a class with decorated static methods; non-tensor
-- arguments (beta) get a nil gradient, as PyTorch's None.
local mp = mp or require "mp"

local recipe = {}

recipe.swish = mp.autograd.Function{
  name = "swish",
  cast_inputs = "f32",            -- @custom_fwd(cast_inputs=torch.float32)
  forward = function(ctx, x, beta)
    local s = mp.sigmoid(x * beta)
    ctx:save_for_backward(x, s)
    ctx.beta = beta
    return x * s
  end,
  backward = function(ctx, gy)    -- @custom_bwd: the forward's autocast state (off)
    local x, s = table.unpack(ctx.saved_tensors)
    return gy * s * (1 + ctx.beta * x * (1 - s)), nil   -- d/dx, and nothing for beta
  end,
}

-- the Function as a layer
recipe.Swish = mp.nn.Module:extend("Swish")
function recipe.Swish:init(beta) self.beta = beta end
function recipe.Swish:forward(x) return recipe.swish(x, self.beta) end

-- as amp_plain.lua's train; dtype: the autocast dtype ("f16" in the demo and the spec)
function recipe.train(model, opt, scaler, batches, dtype)
  local losses = {}
  for i, b in ipairs(batches) do
    opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast(dtype or false)
      loss = mp.mse_loss(model(b[1]), b[2])   -- Linear in f16, swish in f32, Linear in f16
    end
    scaler:scale(loss):backward()             -- swish's backward gets the scaled gradient, in f32
    scaler:step(opt)
    scaler:update()
    losses[i] = loss:item()
  end
  return losses
end

-- run as a script: the demo of demo.lua
if arg and arg[0] and arg[0]:match("amp_custom_function%.lua$") then
  local demo = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "demo.lua")
  local d = demo.setup{hidden = recipe.Swish(1.5)}
  demo.report(d.scaler, #d.batches, "loss", recipe.train(d.model, d.opt, d.scaler, d.batches, "f16"))
end

return recipe
