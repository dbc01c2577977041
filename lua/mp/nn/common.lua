-- What the files of mp.nn share: the argument checks, which raise at the user's
-- line (not inside mp.nn), and PyTorch's default uniform initialisation.
local core = require "mp.core"

local common = {}

local tensor_mt
local function is_tensor(x)
  if type(x) ~= "userdata" then return false end
  if not tensor_mt then
    tensor_mt = debug.getregistry()["mp.Tensor"] or getmetatable(core.zeros { 1 })
  end
  return getmetatable(x) == tensor_mt
end

-- error(msg) at the first caller outside the library (lua/mp/errors.lua), so
-- the message points at the user's line; own_file is kept for the files that
-- still name themselves (every library file is recognised without it)
local errors = require "mp.errors"
function common.own_file() end

local raise = errors.raise

local function show(v)
  if type(v) == "string" then return string.format("%q", v) end
  if type(v) == "number" or type(v) == "boolean" or v == nil then return tostring(v) end
  return type(v)
end

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

-- a positive integer (784 or 784.0), else an error naming the function and argument
local function check_size(fname, what, v)
  local n = type(v) == "number" and math.tointeger(v)
  if not n or n < 1 then
    raise(string.format("%s: %s must be a positive integer (got %s)", fname, what, show(v)))
  end
  return n
end

-- an option table with only known keys, each of its default's type (the
-- binding's one checker, lua/lbind.c), defaults filled in
local function check_opts(fname, opts, defaults)
  local keys = {}
  for k in pairs(defaults) do keys[#keys + 1] = k end
  table.sort(keys)
  for i, k in ipairs(keys) do keys[i] = k .. ":" .. type(defaults[k]) end
  local ok, checked = pcall(core._options, fname, opts, table.concat(keys, " "), 0)
  if not ok then raise(tostring(checked)) end
  opts = checked
  local r = {}
  for k, v in pairs(defaults) do r[k] = v end
  for k, v in pairs(opts) do r[k] = v end
  return r
end

-- an integer or a pair {rows, columns} of integers >= lo, as a pair
local function check_pair(fname, what, v, lo)
  local function ok(x) x = type(x) == "number" and math.tointeger(x); return x and x >= lo and x end
  if type(v) == "number" and ok(v) then return { ok(v), ok(v) } end
  if type(v) == "table" and #v == 2 and ok(v[1]) and ok(v[2]) then return { ok(v[1]), ok(v[2]) } end
  raise(string.format("%s: %s must be an integer >= %d or a pair {rows, columns} of them (got %s)", fname, what, lo,
                      type(v) == "table" and "a table" or show(v)))
end


local function checked_options(fname, opts, spec)
  local ok, r = pcall(core._options, fname, opts, spec, 0)
  if not ok then raise(tostring(r)) end
  return r or {}
end

-- U(-bound, bound) in f32: PyTorch's default init of Linear and Conv2d
local function uniform(shape, bound)
  return core.rand(shape, { dtype = "f32" }) * (2 * bound) - bound
end

common.is_tensor, common.raise, common.show, common.shape_str = is_tensor, raise, show, shape_str
common.check_size, common.check_opts, common.check_pair, common.checked_options = check_size, check_opts, check_pair,
  checked_options
common.uniform = uniform

return common
