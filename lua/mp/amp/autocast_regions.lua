-- mp.amp's autocast half: regions that run ops in f16/bf16 (lua/lautocast.c over
-- engine/autocast.c) and the op classes that decide what each op casts to.
--
--   local _ <close> = mp.amp.autocast("f16")   -- or "bf16", or false inside a region
--   mp.amp.register("my_op", "f32")            -- "low" | "f32" | "promote" | "none"
--   mp.amp.classes() -> {op = class}
local core = require "mp.core"

local autocast = {}

function autocast.autocast(dtype) return core._autocast(dtype) end

function autocast.register(op, class)
  if type(op) ~= "string" or op == "" then error("mp.amp.register: op must be a name like \"gelu\"", 2) end
  core._register(op, class)
end

function autocast.classes() return core._classes() end

return autocast
