-- mp.errors: errors at the user's line, for every file of the library.
--
--   local errors = require "mp.errors"
--   errors.raise("mp.nn.LSTM: hidden_size must be a positive integer (got 0)")
--
-- raises the message prefixed with the position of the first Lua frame outside
-- the library (lua/mp/**: any file that `require "mp...."` resolves to), however
-- deep inside the library the check sits, so no `error(msg, level)` has to count
-- its callers. C functions of the binding raise the same way (lua/lerror.h
-- makes luaL_error walk the same frames), so a failing op called from library
-- code (an nn module's forward, an optimizer's step) also reports the script's
-- line. errors.where() is that prefix ("file:line: ", or "" when there is no such
-- frame), for a message built elsewhere; errors.strip(msg) drops a leading
-- "file:line: " from a caught message before it is raised again.
local core = require "mp.core"

local errors = {}

function errors.where() return core._where(1) end

function errors.raise(msg) error(core._where(1) .. tostring(msg), 0) end

function errors.strip(msg) return (tostring(msg):gsub("^[^\n]-:%d+: ", "", 1)) end

return errors
