-- cli.lua: what the training scripts share on their command lines: --key value
-- (or --key=value) options checked against a table of kinds, and --policy's
-- NAME[:k=v,...]|PATH turned into a loss-scaling policy. Each function takes
-- the script's usage(msg), which prints the message and the usage and exits.
local mp = mp or require "mp"
local cli = {}

-- kinds: {name = "int" | "num" | "str" | "flag"} (a flag takes no value: true
-- when given); returns opts filled over defaults.
-- Numbers must be positive, except those named in `signed`.
function cli.parse(argv, kinds, defaults, usage, signed)
  local opts = {}
  for k, v in pairs(defaults) do opts[k] = v end
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local key, val = a:match("^%-%-([%w-]+)=(.*)$")
    if not key then key = a:match("^%-%-([%w-]+)$"); val = argv[i + 1]; i = i + 1 end
    if not key or not kinds[key] then usage("unknown option " .. a) end
    if kinds[key] == "flag" then
      if a:find("=", 1, true) then usage("option --" .. key .. " takes no value") end
      opts[key], i, val = true, i - 1, true
    end
    if val == nil then usage("option --" .. key .. " needs a value") end
    local kind = kinds[key]
    if kind == "flag" then
      -- set above
    elseif kind == "int" or kind == "num" then
      local n = tonumber(val)
      if not n or (kind == "int" and math.type(n) ~= "integer") or (n <= 0 and not (signed and signed[key])) then
        usage(string.format("--%s must be a positive %s (got %s)", key, kind == "int" and "integer" or "number", val))
      end
      opts[key] = n
    else
      opts[key] = val
    end
    i = i + 1
  end
  return opts
end

-- "2^20", "1024", "1e4" -> number
local function number_of(v)
  local b, e = v:match("^(%d+)%^(%-?%d+)$")
  if b then return tonumber(b) ^ tonumber(e) end
  return tonumber(v)
end

local builtin_names = {static = true, none = true, dynamic = true, hysteresis = true, amax = true}

-- static[:S] | none | dynamic|hysteresis|amax[:k=v,...] | a .lua file returning a policy
function cli.policy(spec, usage)
  if spec:find("/", 1, true) or spec:match("%.lua$") then
    local ok, p = pcall(dofile, spec)
    if not ok then usage("--policy " .. spec .. ": " .. tostring(p)) end
    if type(p) ~= "table" or not (getmetatable(p) and getmetatable(p).__name == "mp.amp.policy" or type(p.update) == "function") then
      usage("--policy " .. spec .. ": the file must return a policy (a table with update(self, info)), got " .. type(p))
    end
    return p
  end
  local name, args = spec:match("^(%a+):(.*)$")
  name = name or spec
  if not builtin_names[name] then
    usage("--policy must be static, none, dynamic, hysteresis, amax (optionally NAME:ARGS) or the path of a .lua file (got " .. spec .. ")")
  end
  local P = mp.amp.policy
  if name == "none" then
    if args then usage("--policy none takes no arguments") end
    return P.none()
  end
  if name == "static" then
    local s = 65536
    if args then
      s = number_of(args)
      if not s or not (s > 0) or s == math.huge then usage("--policy static:S needs a finite number S > 0 (got " .. args .. ")") end
    end
    return P.static(s)
  end
  local o = {}
  if args then
    for kv in args:gmatch("[^,]+") do
      local k, v = kv:match("^%s*([%w_]+)%s*=%s*(.-)%s*$")
      if not k then usage("--policy " .. spec .. ": expected key=value, got " .. kv) end
      o[k] = (k == "on_min") and v or number_of(v)
      if o[k] == nil then usage("--policy " .. spec .. ": " .. k .. " must be a number (got " .. v .. ")") end
    end
  end
  local ok, p = pcall(P[name], o)
  if not ok then usage("--policy " .. spec .. ": " .. tostring(p):gsub("^.-:%d+: ", "")) end
  return p
end

-- a script's sibling file, whatever the working directory
function cli.here(level)
  local src = debug.getinfo((level or 1) + 1, "S").source
  return src:match("^@(.*/)") or "./"
end

-- At program start: the temporary files that saves to the checkpoint paths
-- left when a run was killed mid-save (the engine's own `<path>.tmp-XXXXXX`
-- names, last written before this process started and locked by no running
-- save) are removed, and said so. mp.save and mp.load also clear their path's.
function cli.clear_stale_saves(print_fn, ...)
  for _, path in pairs{...} do
    local gone = mp.stale_saves(path, {remove = true, before_start = true})
    if #gone > 0 then
      (print_fn or print)(string.format("removed %d temporary file%s an interrupted save to %s left",
                                        #gone, #gone == 1 and "" or "s", path))
    end
  end
end

return cli
