-- fp8_recipe.lua: an FP8 scaling recipe from a command line's spec, for the FP8
-- scripts (fp8_lab.lua, fp8_spike.lua):
--   delayed[:history=1024,margin=0,algo=max,format=hybrid] | current[:...] |
--   block[:tile=128] | mx[:block=32] | a .lua file returning a recipe
-- A built-in is mp.fp8.<name>{k = v, ...} (docs/API.md "FP8 training"); values
-- that read as numbers are numbers ("2^4" included), the rest strings.
-- recipe(spec, usage) -> recipe, its label; usage(msg) reports a bad spec and exits.
local mp = mp or require "mp"

local BUILTIN = {delayed = true, current = true, block = true, mx = true}

local function number_of(v)
  local b, e = v:match("^(%d+)%^(%-?%d+)$")
  if b then return tonumber(b) ^ tonumber(e) end
  return tonumber(v)
end

local METHODS = {"layout", "init", "scale", "observe"}

return function(spec, usage)
  if spec:find("/", 1, true) or spec:match("%.lua$") then
    local ok, r = pcall(dofile, spec)
    if not ok then usage("recipe " .. spec .. ": " .. tostring(r)) end
    if type(r) ~= "table" then usage("recipe " .. spec .. ": the file must return a recipe (a table), got " .. type(r)) end
    for _, m in ipairs(METHODS) do
      if type(r[m]) ~= "function" then
        usage("recipe " .. spec .. ": the recipe has no method '" .. m .. "' (a recipe has layout, init, scale and observe)")
      end
    end
    return r, spec:match("([^/]+)$")
  end
  local name, args = spec:match("^(%a+):(.*)$")
  name = name or spec
  if not BUILTIN[name] then
    usage("a recipe must be delayed, current, block or mx (optionally NAME:k=v,...) or the path of a .lua file (got "
          .. spec .. ")")
  end
  if type(mp.fp8[name]) ~= "function" then usage("recipe " .. spec .. ": mp.fp8." .. name .. " is not in this build") end
  local o = {}
  if args then
    for kv in args:gmatch("[^,]+") do
      local k, v = kv:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
      if not k then usage("recipe " .. spec .. ": expected key=value, got " .. kv) end
      o[k] = number_of(v) or v
    end
  end
  local ok, r = pcall(mp.fp8[name], o)
  if not ok then usage("recipe " .. spec .. ": " .. tostring(r):gsub("^.-:%d+: ", "")) end
  return r, spec
end
