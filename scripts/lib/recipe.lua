-- recipe.lua: --recipe of the training scripts (--amp fp8), loaded only then
-- (scripts/lib/cli.lua stays as small as it was: the Lua heap's size moves where
-- the collector runs, and with it the peak memory train_cnn_spec compares).
local mp = mp or require "mp"

local cli = {}

-- --recipe delayed|current|block|mx | a .lua file returning an FP8 recipe -> the recipe
function cli.recipe(spec, usage)
  if spec:find("/", 1, true) or spec:match("%.lua$") then
    local ok, r = pcall(dofile, spec)
    if not ok then usage("--recipe " .. spec .. ": " .. tostring(r)) end
    local fine, err = pcall(mp.fp8.Scaler, {recipe = r})
    if not fine then usage("--recipe " .. spec .. ": the file must return an FP8 recipe: " .. tostring(err):gsub("^.-:%d+: ", "")) end
    return r
  end
  if spec ~= "delayed" and spec ~= "current" and spec ~= "block" and spec ~= "mx" then
    usage("--recipe must be delayed, current, block, mx or the path of a .lua file (got " .. spec .. ")")
  end
  return mp.fp8[spec]{}
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
