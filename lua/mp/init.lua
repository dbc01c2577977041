-- mp: the Lua face of mpengine. The C module mp.core holds tensors and ops;
-- this file adds what is easier to write in Lua and picks the default device.
local core = require "mp.core"

local mp = {}
for k, v in pairs(core) do mp[k] = v end

-- default device: MP_DEVICE, else cuda when present, else cpu
local env = os.getenv("MP_DEVICE")
if env and env ~= "" then
  mp.set_default_device(env)
elseif mp.cuda.is_available() then
  mp.set_default_device("cuda")
end

return mp
