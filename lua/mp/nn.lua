-- mp.nn: neural-network modules after torch.nn (docs/API.md "nn: modules").
--
-- A module is a Lua table whose metatable is its class. Parameters and child
-- modules live in two registries per instance (_parameters, _modules) with
-- their names in definition order, so that naming and ordering follow
-- PyTorch: m:named_parameters() gives "0.weight", "0.bias", "2.weight", ...
-- for Sequential(Linear, ReLU, Linear), a module's own parameters first, then
-- its children's, depth first.
--
-- Declaring: inside init, `self.fc = nn.Linear(...)` registers a child module
-- and `self.w = t` registers t as a parameter when t is a leaf tensor that
-- requires grad; any other value is a plain field. self:add_module(name, m)
-- and self:add_parameter(name, t) do the same explicitly.
--
--   local Net = mp.nn.Module:extend("Net")
--   function Net:init(d) self.fc = mp.nn.Linear(d, 10) end
--   function Net:forward(x) return mp.relu(self.fc(x)) end
--   local net = Net(784)
--
-- One file per job under lua/mp/nn/: module.lua (Module: registration,
-- parameters, state dicts, train/eval, printing), containers.lua (Sequential,
-- ModuleList), layers.lua and conv.lua (the layers), common.lua (argument
-- checks and init shared by them). A new layer is a class in layers.lua (or
-- conv.lua): every class there becomes mp.nn.<Name> here.
-- These files need only mp.core, so lua/mp/init.lua can `mp.nn = require "mp.nn"`.
local module = require "mp.nn.module"

local nn = {}

nn.Module = module.Module
nn.is_module = module.is_module
for _, file in ipairs{"mp.nn.containers", "mp.nn.layers", "mp.nn.conv", "mp.nn.rnn", "mp.nn.attention"} do
  local part = require(file)
  for name, cls in pairs(part) do
    assert(nn[name] == nil, "mp.nn: two classes named " .. name)
    nn[name] = cls
  end
end

return nn
