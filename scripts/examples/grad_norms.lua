-- grad_norms.lua: a layerwise gradient statistic written with
-- Module:register_full_backward_hook: the norm of the gradient flowing out of
-- each Linear layer (grad_output, what the layer receives from above) and into
-- its input (grad_input), per training step, as a table by layer name.
--
--   build/mpengine scripts/examples/grad_norms.lua [steps]
--
-- A hook sees the gradients when the backward reaches the layer; it returns
-- nothing, so the gradients go on unchanged (returning a table would replace
-- grad_input). The handles remove the hooks when the statistic is no longer
-- wanted. tests/lua/module_hooks_spec.lua runs this script.
local mp = require "mp"
local nn = mp.nn

local function norm(t) return t and math.sqrt((t * t):sum():item()) or 0 end

-- hooks on every Linear of model: returns stats ({[name] = {grad_output = {...}, grad_input = {...}}},
-- a value per step) and a function that removes the hooks
local function watch(model)
  local stats, handles = {}, {}
  local map, names = model:named_children()
  for _, name in ipairs(names) do
    local m = map[name]
    if m:type_name() == "Linear" then
      local s = { grad_output = {}, grad_input = {} }
      stats[name] = s
      handles[#handles + 1] = m:register_full_backward_hook(function(_, grad_input, grad_output)
        s.grad_output[#s.grad_output + 1] = norm(grad_output[1])
        s.grad_input[#s.grad_input + 1] = norm(grad_input[1])
      end)
    end
  end
  return stats, function() for _, h in ipairs(handles) do h:remove() end end, names
end

local steps = tonumber(arg and arg[1]) or 3
mp.manual_seed(0)
local model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
local opt = mp.optim.SGD(model:parameters(), { lr = 0.1 })
local stats, unwatch, names = watch(model)
for _ = 1, steps do
  local x = mp.randn({ 32, 8 }):requires_grad(true)   -- so that the first layer has a grad_input too
  local y = mp.randn { 32, 4 }
  local loss = mp.mse_loss(model(x), y)
  opt:zero_grad()
  loss:backward()
  opt:step()
end
unwatch()
print(string.format("%-6s %5s %14s %14s", "layer", "step", "|grad_output|", "|grad_input|"))
for _, name in ipairs(names) do
  local s = stats[name]
  if s then
    for i = 1, #s.grad_output do
      print(string.format("%-6s %5d %14.6g %14.6g", name, i, s.grad_output[i], s.grad_input[i]))
    end
  end
end
