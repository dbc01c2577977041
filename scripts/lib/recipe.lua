-- recipe.lua: --recipe of the training scripts (--amp fp8), loaded only then
-- (scripts/lib/cli.lua stays as small as it was: the Lua heap's size moves where
-- the collector runs, and with it the peak memory train_cnn_spec compares).
local mp = mp or require "mp"

local cli = {}

-- --recipe delayed|current|block|mx[:k=v,...] | a .lua file returning an FP8 recipe
-- -> the recipe (the spec read as the FP8 lab reads it: scripts/lib/fp8_recipe.lua)
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local parse = dofile(here .. "fp8_recipe.lua")
function cli.recipe(spec, usage)
  return (parse(spec, function(msg) usage("--recipe: " .. msg) end))
end

-- the recipe's layout, for a script's header: "delayed (x e4m3/tensor, w e4m3/tensor, g e5m2/tensor)"
function cli.recipe_line(r)
  local parts = {}
  for _, k in ipairs{"x", "w", "g"} do
    local f, g = r:layout(k)
    parts[#parts + 1] = string.format("%s %s/%s", k, f, g)
  end
  return string.format("%s (%s)", r.name, table.concat(parts, ", "))
end

return cli
