-- mp.amp's autocast half: regions that run ops in f16/bf16 (lua/lautocast.c over
-- engine/autocast.c) and the op classes that decide what each op casts to.
--
--   local _ <close> = mp.amp.autocast("f16")   -- or "bf16", or false inside a region
--   local y = mp.amp.autocast("f16", function() return model(x) end)   -- fn in a region
--   mp.amp.register("my_op", "f32")            -- "low" | "f32" | "promote" | "none"
--   mp.amp.classes() -> {op = class}
local core = require "mp.core"
local errors = require "mp.errors"

local autocast = {}

-- autocast(dtype) -> a guard that ends the region when closed (<close> or
-- :close(); one collected while still open warns, lua/lautocast.c);
-- autocast(dtype, fn, ...) -> fn(...)'s results, run inside a region that ends
-- when fn returns or raises (the error passes through unchanged)
function autocast.autocast(dtype, fn, ...)
  if fn == nil and select("#", ...) == 0 then return core._autocast(dtype) end
  if type(fn) ~= "function" then
    errors.raise("mp.amp.autocast: fn must be a function (got " .. type(fn) .. ")")
  end
  local guard <close> = core._autocast(dtype)
  return fn(...)
end

function autocast.register(op, class)
  if type(op) ~= "string" or op == "" then error("mp.amp.register: op must be a name like \"gelu\"", 2) end
  core._register(op, class)
end

function autocast.classes() return core._classes() end

return autocast
