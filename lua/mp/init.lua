-- mp: the Lua face of mpengine. The C module mp.core holds tensors, ops,
-- autograd and optimizers; this file gathers the Lua libraries around it
-- (nn, optim, data, ...) and picks the default device.
local core = require "mp.core"

local mp = {}
for k, v in pairs(core) do
  if type(k) ~= "string" or k:sub(1, 1) ~= "_" then mp[k] = v end
end
-- the submodules may require "mp" themselves: let them see this table
package.loaded["mp"] = mp

mp.optim = require "mp.optim"
mp.data = require "mp.data"
mp.nn = require "mp.nn"
mp.amp = require "mp.amp"
mp.pretty = require "mp.pretty"
mp.help = require("mp.help").help
mp.dist = require "mp.dist"
mp.autograd = require "mp.autograd"
mp.fp8 = require "mp.fp8"

-- default device: MP_DEVICE, else cuda when present, else cpu
local env = os.getenv("MP_DEVICE")
if env and env ~= "" then
  mp.set_default_device(env)
elseif mp.cuda.is_available() then
  mp.set_default_device("cuda")
end

return mp
