-- api_names_spec.lua: docs/API.md against the names the code has.
--
-- (a) every public name has an entry: the functions, constants and classes of `mp`
--     and its submodules (walked recursively), the tensor methods (the method table
--     a tensor's __index reads) and fields, the methods of nn modules, optimizers,
--     schedules and the GradScaler, the mpengine command's options and the
--     environment variables the C code reads;
-- (b) every entry names something that exists (no stale docs);
-- (c) pairing, as issue 27 asks: every tensor method has an mp.<name> function and
--     every mp function whose first argument is a tensor has a t:<name> method, but
--     for the exemptions listed (each with its reason).
--
-- An entry is a `### ` heading holding signatures in backticks; a signature's name
-- is its text before the first "(", " ", "[" or "{" (the rule of docs/API.md that
-- the REPL's help shares): `mp.gather(x, dim, index) -> tensor` names mp.gather,
-- `t:gather(dim, index)` the tensor method, `opt:step()` an optimizer's method.
local H = dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "helpers.lua")
local mp = require "mp"
local core = require "mp.core"

local function read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

-- ---------------------------------------------------------------- the docs

-- name -> the heading that documents it; and the body text of each name's entry
local function parse_docs(text)
  local names, bodies, fenced, current = {}, {}, false, nil
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if line:match("^```") then fenced = not fenced end
    if not fenced and line:match("^### ") then
      current = {}
      for sig in line:gmatch("`([^`]+)`") do
        local name = sig:match("^[^%(%s%[{]+")
        if name then
          names[name] = names[name] or line
          bodies[name] = bodies[name] or current
        end
      end
    elseif not fenced and line:match("^##? ") then
      current = nil
    elseif current then
      current[#current + 1] = line
    end
  end
  for k, v in pairs(bodies) do bodies[k] = table.concat(v, "\n") end
  return names, bodies
end

local DOC_NAMES, DOC_BODIES = parse_docs(read(H.root .. "/docs/API.md"))

-- ---------------------------------------------------------------- the code

local function public(k) return type(k) == "string" and k:sub(1, 1) ~= "_" end

local function sorted_keys(t)
  local r = {}
  for k in pairs(t) do if public(k) then r[#r + 1] = k end end
  table.sort(r)
  return r
end

-- the tensor methods: the table a tensor's __index looks names up in (its first
-- upvalue, lua/ltensor.c), which mp.Tensor also is
local T = mp.zeros { 2 }
local METHODS = select(2, debug.getupvalue(getmetatable(T).__index, 1))
-- the fields __index answers besides methods (lua/ltensor.c, t_index): C code
-- that a walk cannot see, so listed here; each is checked to be readable below
local TENSOR_FIELDS = { "shape", "dtype", "device", "grad", "grad_fn", "is_leaf" }

local Module = mp.nn.Module
-- nn classes whose own methods (beyond Module's) are documented as <word>:name
local CLASS_WORD = { Sequential = "seq", ModuleList = "list" }
-- what every layer redefines of Module's: documented once, as m:init and so on
local REDEFINED = { init = true, forward = true, extra_repr = true }
-- called on a class, not an instance: documented as mp.nn.Module:extend
local CLASS_METHODS = { extend = true }

local OPT_METHODS = core._optim_methods
local OPT_FIELDS = { "lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps", "nesterov",
                     "step_count", "numel", "ngroups" }
local function new_opt()
  return mp.optim.SGD({ mp.zeros({ 2 }, { requires_grad = true, device = "cpu" }) }, { lr = 0.1 })
end

-- the schedule methods: of every schedule a constructor of mp.optim.schedule
-- makes from {total = 10} or from nothing (one that needs other options is
-- skipped: its class is most likely the same)
local SCHED_METHODS = {}
for _, name in ipairs(sorted_keys(mp.optim.schedule)) do
  local ctor = mp.optim.schedule[name]
  local ok, s = pcall(ctor, { total = 10 })
  if not ok then ok, s = pcall(ctor) end
  local mt = ok and getmetatable(s)
  if type(mt) == "table" then
    for k, v in pairs(mt) do if public(k) and type(v) == "function" then SCHED_METHODS[k] = true end end
  end
end

local SCALER = getmetatable(mp.amp.GradScaler())
-- fields a scaler answers besides methods (GradScaler.__index, plain fields)
local SCALER_FIELDS = { "enabled", "on_skip", "stats" }

-- every public name of mp, walked: {name = kind}; a table without a metatable is
-- a submodule (walked, no entry of its own), one with a metatable a class (an
-- entry); mp.Tensor is the method table (an entry, its methods are t:name)
local function walk_mp()
  local out, seen = {}, {}
  local function walk(t, prefix)
    if seen[t] then return end
    seen[t] = true
    for _, k in ipairs(sorted_keys(t)) do
      local v, name = t[k], prefix .. "." .. k
      if v == METHODS then out[name] = "method table"
      elseif type(v) == "table" and getmetatable(v) == nil then walk(v, name)
      else out[name] = type(v) == "table" and "class" or type(v) end
    end
  end
  walk(mp, "mp")
  return out
end
local MP_NAMES = walk_mp()

-- every name (a) asks an entry for, with where it comes from
local function expected_names()
  local want = {}
  for name, kind in pairs(MP_NAMES) do want[name] = kind end
  for _, k in ipairs(sorted_keys(METHODS)) do want["t:" .. k] = "tensor method" end
  for _, f in ipairs(TENSOR_FIELDS) do want["t." .. f] = "tensor field" end
  for _, k in ipairs(sorted_keys(Module)) do
    if type(Module[k]) == "function" then
      want[(CLASS_METHODS[k] and "mp.nn.Module:" or "m:") .. k] = "module method"
    end
  end
  for _, cname in ipairs(sorted_keys(mp.nn)) do
    local cls = mp.nn[cname]
    if type(cls) == "table" and cls ~= Module then
      for k, v in pairs(cls) do
        if public(k) and type(v) == "function" and v ~= Module[k] and not REDEFINED[k] then
          local word = CLASS_WORD[cname] or ("<no doc word for mp.nn." .. cname .. ": add it to CLASS_WORD>")
          want[word .. ":" .. k] = "method of mp.nn." .. cname
        end
      end
    end
  end
  for _, k in ipairs(sorted_keys(OPT_METHODS)) do want["opt:" .. k] = "optimizer method" end
  for _, f in ipairs(OPT_FIELDS) do want["opt." .. f] = "optimizer field" end
  for k in pairs(SCHED_METHODS) do want["sched:" .. k] = "schedule method" end
  for k, v in pairs(SCALER) do
    if public(k) and type(v) == "function" then want["scaler:" .. k] = "GradScaler method" end
  end
  for _, f in ipairs(SCALER_FIELDS) do want["scaler." .. f] = "GradScaler field" end
  return want
end

-- the environment variables the C code reads: getenv("X") and the modules'
-- override variables (mp_module_open(file, "X")), but the launcher's own, which a
-- user does not set, and HOME
local NOT_USER_ENV = { OMPI_COMM_WORLD_SIZE = true, PMI_SIZE = true, HOME = true }
local function env_names()
  local p = assert(io.popen("cd " .. H.q(H.root) .. " && grep -rhoE "
    .. H.q([[getenv\("[A-Za-z_0-9]+"\)|mp_module_open\("[^"]+", "[A-Za-z_0-9]+"]]) .. " engine lua kernels"))
  local out = {}
  for line in p:lines() do
    local name = line:match('"([A-Za-z_0-9]+)"%)?$')
    if name and not NOT_USER_ENV[name] then out[name] = true end
  end
  p:close()
  return out
end

-- the options mpengine's usage text lists (lua/mpengine.c, print_usage)
local function cli_options()
  local out = {}
  for opt in read(H.root .. "/lua/mpengine.c"):gmatch('\n%s*"  (%-%-?[%w-]*)') do out[#out + 1] = opt end
  return out
end

-- ---------------------------------------------------------------- (b): does a name exist

local function resolve_mp(name)
  local path, method = name:match("^(mp[%w_.]*):([%w_]+)$")
  local v = mp
  for part in (path or name):gmatch("[^.]+") do
    if part ~= "mp" then
      if type(v) ~= "table" then return nil end
      v = v[part]
    end
  end
  if method then v = type(v) == "table" and v[method] or nil end
  return v
end

local WORD_CLASS = {}
for cname, word in pairs(CLASS_WORD) do WORD_CLASS[word] = mp.nn[cname] end

-- names that are not Lua names: operators, indexing, tostring, the command, and
-- objects that have no class table to look in (a Lua policy, a hook's handle)
local FREE = { ["t"] = "operators and t[i]", ["-t"] = "unary minus", ["a"] = "a ^ b", ["tostring"] = "tostring(t)",
               ["print"] = "print(t)", ["mpengine"] = "the command", ["policy:update"] = "a Lua policy",
               ["policy:init"] = "a Lua policy", ["help"] = "the REPL's global (mp.help)",
               ["?name"] = "the REPL's ?name syntax" }

-- true when the documented name exists, else false and why not
local function exists(name, env)
  if name:match("^mp[.:]") then
    if resolve_mp(name) == nil then return false, "not in mp" end
    return true
  end
  local obj, sep, k = name:match("^(%a+)([:.])([%w_]+)$")
  if obj == "t" and sep == ":" then return METHODS[k] ~= nil, "no such tensor method" end
  if obj == "t" then
    for _, f in ipairs(TENSOR_FIELDS) do if f == k then return pcall(function() return T[k] end) end end
    return false, "not a tensor field (TENSOR_FIELDS)"
  end
  if obj == "m" and sep == ":" then return type(Module[k]) == "function", "no such Module method" end
  if WORD_CLASS[obj] and sep == ":" then return type(WORD_CLASS[obj][k]) == "function", "no such method" end
  if obj == "opt" and sep == ":" then return OPT_METHODS[k] ~= nil, "no such optimizer method" end
  if obj == "opt" then
    local opt = new_opt()
    local v = opt[k]
    opt:free()
    return v ~= nil, "no such optimizer field"
  end
  if obj == "sched" and sep == ":" then return SCHED_METHODS[k] ~= nil, "no such schedule method" end
  if obj == "scaler" and sep == ":" then return type(SCALER[k]) == "function", "no such GradScaler method" end
  if obj == "scaler" then
    for _, f in ipairs(SCALER_FIELDS) do if f == k then return true end end
    return false, "not a GradScaler field (SCALER_FIELDS)"
  end
  if name:match("^LUA_") then return true end   -- Lua's own variables (lua.c's, mpengine's)
  if name:match("^[A-Z][A-Z0-9_]+$") then return env[name] == true, "no C code reads this variable" end
  if FREE[name] then return true end
  return false, "a name of no known kind (mp.*, t:, t., m:, opt:, sched:, scaler:, seq:, list:, env var)"
end

-- ---------------------------------------------------------------- (c): pairing

-- tensor methods with no mp.<name> function, and why
local METHOD_ONLY = {
  -- about the tensor object rather than an op on values
  size = "a property", dim = "a property", numel = "a property",
  item = "reads the value back to Lua", totable = "reads the values back to Lua",
  to = "a conversion", f32 = "a conversion", f16 = "a conversion", bf16 = "a conversion", f64 = "a conversion",
  cpu = "a move", cuda = "a move",
  clone = "a copy of the object", detach = "a new object outside the graph",
  free = "ends the object's life",
  -- autograd on this tensor
  backward = "autograd's entry", requires_grad = "a flag of the tensor", register_hook = "a hook on the tensor",
}
-- and every in-place method (a name ending in "_"): it changes its tensor, as
-- PyTorch's in-place methods, and has no function form

-- mp functions whose first argument is not a tensor: no method
local NOT_TENSOR_FIRST = {
  -- constructors and random numbers
  tensor = true, zeros = true, ones = true, full = true, arange = true, rand = true, randn = true, randint = true,
  manual_seed = true, get_rng_state = true, set_rng_state = true,
  -- over a list of tensors
  cat = true, stack = true,
  -- grad mode
  no_grad = true, set_grad_enabled = true, is_grad_enabled = true,
  -- devices, memory, files and utilities
  set_default_device = true, default_device = true, memory = true, counters = true, empty_cache = true,
  reset_peak_memory = true, save = true, load = true, stale_saves = true, clock = true, isatty = true,
  pretty = true, help = true,
}
-- mp functions whose first argument is a tensor but which have no method, and why
local FUNCTION_ONLY = {
  -- torch.nn.functional's: the first argument is a layer's input, and PyTorch has no
  -- Tensor method for them either; the layer (mp.nn) is their other form
  linear = "nn functional", linear_gelu = "nn functional (linear then gelu as one op)", layer_norm = "nn functional", rms_norm = "nn functional", batch_norm = "nn functional",
  embedding = "nn functional (its first argument is the indices)", dropout = "nn functional",
  cross_entropy = "nn functional (a loss)", mse_loss = "nn functional (a loss)",
  attention = "nn functional", conv2d = "nn functional", max_pool2d = "nn functional",
  avg_pool2d = "nn functional", adaptive_avg_pool2d = "nn functional",
  lstm_cell = "nn functional (nn.LSTM's fused cell)", gru_cell = "nn functional (nn.GRU's fused cell)",
  -- its first argument is the condition: cond:where(a, b) would read wrongly
  -- (PyTorch's Tensor.where takes the condition second)
  where = "the condition comes first",
}

-- ---------------------------------------------------------------- the specs

describe("docs/API.md", function()
  it("parses into entries", function()
    local n = 0
    for _ in pairs(DOC_NAMES) do n = n + 1 end
    assert.is_true(n > 100, "only " .. n .. " names parsed from docs/API.md")
  end)

  it("has an entry for every public name (a)", function()
    local missing = {}
    for name, kind in pairs(expected_names()) do
      if not DOC_NAMES[name] then missing[#missing + 1] = name .. " (" .. kind .. ")" end
    end
    for name in pairs(env_names()) do
      if not DOC_NAMES[name] then missing[#missing + 1] = name .. " (environment variable)" end
    end
    table.sort(missing)
    assert.are.same({}, missing, "names without an entry in docs/API.md")
  end)

  it("describes every option of mpengine in its entry (a)", function()
    local body = DOC_BODIES["mpengine"]
    assert.is_truthy(body, "no `mpengine ...` entry")
    local opts = cli_options()
    assert.is_true(#opts >= 8, "read only " .. #opts .. " options from lua/mpengine.c")
    local missing = {}
    for _, opt in ipairs(opts) do
      if not body:find("`" .. opt, 1, true) then missing[#missing + 1] = opt end
    end
    assert.are.same({}, missing, "mpengine options not described in its entry")
  end)

  it("names only what exists (b)", function()
    local env, stale = env_names(), {}
    for name, heading in pairs(DOC_NAMES) do
      local ok, why = exists(name, env)
      if not ok then stale[#stale + 1] = name .. ": " .. tostring(why) .. "  [" .. heading .. "]" end
    end
    table.sort(stale)
    assert.are.same({}, stale, "entries of docs/API.md that name nothing")
  end)

  it("lists readable tensor fields", function()
    for _, f in ipairs(TENSOR_FIELDS) do
      assert.is_true(pcall(function() return T[f] end), "t." .. f)
    end
    assert.are.equal(mp.Tensor, METHODS)
  end)
end)

describe("mp functions and tensor methods", function()
  it("pair up (c)", function()
    local missing = {}
    for _, k in ipairs(sorted_keys(METHODS)) do
      if not METHOD_ONLY[k] and not k:match("_$") and type(mp[k]) ~= "function" then
        missing[#missing + 1] = "mp." .. k .. " (for t:" .. k .. ")"
      end
    end
    for _, k in ipairs(sorted_keys(mp)) do
      if type(mp[k]) == "function" and not NOT_TENSOR_FIRST[k] and not FUNCTION_ONLY[k] and METHODS[k] == nil then
        missing[#missing + 1] = "t:" .. k .. " (for mp." .. k .. ")"
      end
    end
    table.sort(missing)
    assert.are.same({}, missing, "unpaired names")
  end)

  it("keeps its exemption lists to names that exist", function()
    for k in pairs(METHOD_ONLY) do assert.is_truthy(METHODS[k], "METHOD_ONLY." .. k) end
    for k in pairs(FUNCTION_ONLY) do assert.are.equal("function", type(mp[k]), "FUNCTION_ONLY." .. k) end
  end)
end)
