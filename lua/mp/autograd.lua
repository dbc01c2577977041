-- mp.autograd: gradients beyond Tensor:backward. The C functions of mp.core
-- named _autograd_<x> appear here as <x> (grad, ...).
local core = require "mp.core"
local autograd = {}
for k, v in pairs(core) do
  local name = type(k) == "string" and k:match("^_autograd_(.+)$")
  if name then autograd[name] = v end
end
local check = require "mp.autograd.gradcheck"
autograd.gradcheck, autograd.gradgradcheck = check.gradcheck, check.gradgradcheck
return autograd
