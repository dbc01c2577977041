-- mp.pretty(v [, depth]): a readable one- or few-line rendering of a Lua value,
-- used by the REPL's auto-print for plain tables (as Torch's trepl did):
--   mp> mp.memory()
--   {in_use = 4194304, limit = 22748862870, peak = 8388608, storages = 2}
-- Lists print as {1, 2, 3}; keys sort; nesting and length are capped; tensors
-- print as their one-line summary inside tables; functions of mp as
-- `function: mp.matmul` (their documented names, from mp.help).
local MAX_ITEMS, MAX_DEPTH = 24, 3

local function key_str(k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then return k end
  if type(k) == "string" then return string.format("[%q]", k) end
  return "[" .. tostring(k) .. "]"
end

local function summary(v)
  -- a tensor's tostring ends with its summary line, e.g. [f16 2x3 cpu]
  local s = tostring(v)
  return s:match("(%[[^%]\n]*%])%s*$") or s
end

local function render(v, depth, seen)
  local t = type(v)
  if t == "string" then return string.format("%q", v) end
  if t ~= "table" then
    if t == "userdata" then return summary(v) end
    if t == "function" then
      -- mp's functions by their documented names (mp.help's map)
      local ok, name = pcall(function() return require("mp.help").name_of(v) end)
      if ok and name then return "function: " .. name end
    end
    return tostring(v)
  end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return summary(v) end
  if seen[v] then return "{...cycle}" end
  if depth >= MAX_DEPTH then return "{...}" end
  seen[v] = true
  local parts, n = {}, #v
  for i = 1, math.min(n, MAX_ITEMS) do parts[#parts + 1] = render(v[i], depth + 1, seen) end
  local keys = {}
  for k in pairs(v) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b)
    if type(a) == type(b) and (type(a) == "string" or type(a) == "number") then return a < b end
    return type(a) < type(b)
  end)
  for _, k in ipairs(keys) do
    if #parts >= MAX_ITEMS then break end
    parts[#parts + 1] = key_str(k) .. " = " .. render(v[k], depth + 1, seen)
  end
  local total = n + #keys
  if total > #parts then parts[#parts + 1] = string.format("... (%d more)", total - #parts) end
  seen[v] = nil
  return "{" .. table.concat(parts, ", ") .. "}"
end

return function(v, depth) return render(v, depth or 0, {}) end
