-- io_spec.lua: mp.save and mp.load (lua/lio.c over engine/io_safetensors.c).
-- Nested tables of tensors, numbers, strings and booleans come back exactly as
-- saved; files of other tools load flat; bad arguments and bad files raise errors
-- naming the function; and, where Python's safetensors is installed (make pydeps),
-- files go both ways between mpengine and the reference implementation.
--   busted tests/lua/io_spec.lua   (LUA_PATH/LUA_CPATH as in tests/run.sh)

local mp = require "mp"

local here = debug.getinfo(1, "S").source:gsub("^@", "")
local root = (here:match("^(.*)/[^/]*$") or ".") .. "/../.."
local build = os.getenv("MP_TEST_BUILD") or (root .. "/build")

local function q(s) return "'" .. tostring(s):gsub("'", [['\'']]) .. "'" end

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function spit(path, bytes)
  local f = assert(io.open(path, "wb"))
  f:write(bytes)
  f:close()
end

local tmpdir
local function tmp(name) return tmpdir .. "/" .. name end

-- a safetensors file built by hand: header text (padded to 8) and data bytes
local function raw_file(path, header, data)
  header = header .. string.rep(" ", (8 - #header % 8) % 8)
  spit(path, string.pack("<I8", #header) .. header .. (data or ""))
end

local function header_of(path)
  local b = slurp(path)
  local n = string.unpack("<I8", b)
  return b:sub(9, 8 + n)
end

-- deep equality with Lua types kept apart (3 ~= 3.0 here), NaN equal to NaN,
-- -0.0 apart from 0.0, tensors by dtype, shape and values
local function same(a, b, path)
  path = path or "tbl"
  local ta, tb = type(a), type(b)
  if getmetatable(a) == getmetatable(mp.tensor(0)) then
    if getmetatable(b) ~= getmetatable(a) then return false, path .. ": not a tensor" end
    if a.dtype ~= b.dtype then return false, path .. ": dtype " .. b.dtype .. " vs " .. a.dtype end
    if table.concat(a.shape, ",") ~= table.concat(b.shape, ",") then return false, path .. ": shape" end
    return same(a:totable(), b:totable(), path .. ":values")
  end
  if ta ~= tb then return false, path .. ": " .. tb .. " instead of " .. ta end
  if ta == "number" then
    if math.type(a) ~= math.type(b) then return false, path .. ": " .. math.type(b) .. " instead of " .. math.type(a) end
    if a ~= a then return b ~= b, path .. ": NaN lost" end
    if a == 0 and b == 0 and 1 / a ~= 1 / b then return false, path .. ": sign of zero" end
    return a == b, path .. ": " .. tostring(b) .. " instead of " .. tostring(a)
  end
  if ta ~= "table" then return a == b, path .. ": " .. tostring(b) .. " instead of " .. tostring(a) end
  for k, v in pairs(a) do
    local ok, why = same(v, b[k], path .. "[" .. tostring(k) .. "]")
    if not ok then return false, why end
  end
  for k in pairs(b) do
    if a[k] == nil then return false, path .. ": extra key " .. tostring(k) end
  end
  return true
end

local function assert_same(a, b)
  local ok, why = same(a, b)
  assert(ok, why)
end

local function assert_error(fn, fragment)
  local ok, err = pcall(fn)
  assert.is_false(ok, "no error (expected '" .. fragment .. "')")
  err = tostring(err)
  assert(err:find(fragment, 1, true), "error '" .. err .. "' lacks '" .. fragment .. "'")
  return err
end

describe("mp.save / mp.load", function()
  setup(function()
    tmpdir = os.tmpname()
    os.remove(tmpdir)
    assert(os.execute("mkdir -p " .. q(tmpdir)))
  end)
  teardown(function() os.execute("rm -rf " .. q(tmpdir)) end)

  it("round-trips nested tables of tensors, numbers, strings and booleans exactly", function()
    local w = mp.tensor({{1, -2.5}, {3e-8, 65504}})
    local t = {
      model = {["0.weight"] = w, ["0.bias"] = mp.tensor({0.5, -0.25}, {dtype = "bf16"}),
               ["2.weight"] = mp.tensor({{1, 2}, {3, 4}}, {dtype = "f16"})},
      labels = mp.tensor({0, 1, -7, 2147483647, -2147483648}, {dtype = "i32"}),
      pixels = mp.tensor({{0, 255}, {128, 7}}, {dtype = "u8"}),
      scalar = mp.tensor(math.pi),
      step = 1000, big = math.maxinteger, small = math.mininteger, zero = 0,
      lr = 0.1, third = 1 / 3, huge = 1e308, tiny = 5e-324, negzero = -0.0, whole = 2.0,
      inf = math.huge, ninf = -math.huge, nan = 0 / 0,
      name = 'quotes " \' and \\ backslash\nnewline\ttab', utf8 = "ünïcødé ✓ 日本語",
      binary = "nul\0byte \255\254 invalid utf-8", empty = "",
      yes = true, no = false,
      [1] = "first", [2] = {nested = {deeper = {deepest = mp.tensor({1, 2, 3})}}}, [-5] = "negative",
      [0.5] = "float key", [true] = "boolean key", [""] = "empty key",
      ["a.b"] = mp.tensor(1), a = {b = mp.tensor(2), ["c.d"] = {e = 3}},
      emptytable = {}, list = {10, 20, 30.5, "x", false},
    }
    mp.save(tmp("nested.safetensors"), t)
    local r, meta = mp.load(tmp("nested.safetensors"))
    assert_same(t, r)
    assert.equal("1", meta["mpengine.format"])
    assert.is_string(meta["mpengine.structure"])
  end)

  it("keeps each tensor's bits in every dtype, NaN and infinities included", function()
    local v = {0, -0.0, 1, -1.5, math.huge, -math.huge, 0 / 0, 2 ^ -24, 2 ^ -133, 0.1}
    local t = {}
    for _, dt in ipairs{"f32", "f16", "bf16"} do t[dt] = mp.tensor(v, {dtype = dt}) end
    t.i32 = mp.tensor({0, 1, -1, 2147483647, -2147483648}, {dtype = "i32"})
    t.u8 = mp.tensor({0, 1, 127, 128, 255}, {dtype = "u8"})
    mp.save(tmp("bits.safetensors"), t)
    local r = mp.load(tmp("bits.safetensors"))
    assert_same(t, r)
    -- and saving what was loaded gives the same bytes again
    mp.save(tmp("bits2.safetensors"), r)
    assert.equal(slurp(tmp("bits.safetensors")), slurp(tmp("bits2.safetensors")))
  end)

  it("stores tensors under their dotted paths, which other tools see", function()
    local sd = {model = {["0.weight"] = mp.zeros{2, 2}, ["0.bias"] = mp.zeros{2}}, layers = {mp.ones{1}}}
    mp.save(tmp("names.safetensors"), sd)
    local h = header_of(tmp("names.safetensors"))
    assert.truthy(h:find('"model.0.weight":{"dtype":"F32","shape":[2,2],', 1, true), h)
    assert.truthy(h:find('"model.0.bias":{', 1, true))
    assert.truthy(h:find('"layers.1":{"dtype":"F32","shape":[1],', 1, true))
    assert.truthy(h:find('"__metadata__":{', 1, true))
    assert_same(sd, (mp.load(tmp("names.safetensors"))))
  end)

  it("keeps apart keys whose dotted paths collide", function()
    local t = {["a.b"] = mp.tensor(1), a = {b = mp.tensor(2)}, ["1"] = mp.tensor(3), [1] = mp.tensor(4)}
    mp.save(tmp("collide.safetensors"), t)
    local r = mp.load(tmp("collide.safetensors"))
    assert_same(t, r)
    assert.equal(1, r["a.b"]:item())
    assert.equal(2, r.a.b:item())
    assert.equal(3, r["1"]:item())
    assert.equal(4, r[1]:item())
  end)

  it("stores a tensor that occurs twice once, and gives back one tensor", function()
    local w = mp.randn{3, 3}
    mp.save(tmp("shared.safetensors"), {enc = {w = w}, dec = {w = w}})
    local r = mp.load(tmp("shared.safetensors"))
    assert.equal(r.enc.w, r.dec.w)
    local h = header_of(tmp("shared.safetensors"))
    local _, n = h:gsub('"dtype"', "")
    assert.equal(1, n)
  end)

  it("writes the same bytes for the same table", function()
    local t = {}
    for i = 1, 50 do t["k" .. i] = i % 3 == 0 and mp.tensor(i) or i end
    mp.save(tmp("d1.safetensors"), t)
    mp.save(tmp("d2.safetensors"), t)
    assert.equal(slurp(tmp("d1.safetensors")), slurp(tmp("d2.safetensors")))
  end)

  it("gives tensors that work like any other", function()
    mp.save(tmp("use.safetensors"), {x = mp.tensor({1, 2, 3}, {dtype = "f16"})})
    local r = mp.load(tmp("use.safetensors"))
    assert.same({2, 3, 4}, (r.x + 1):totable())
    assert.equal("cpu", r.x.device)
  end)

  it("overwrites an existing file", function()
    mp.save(tmp("over.safetensors"), {a = 1})
    mp.save(tmp("over.safetensors"), {b = "two"})
    assert_same({b = "two"}, (mp.load(tmp("over.safetensors"))))
  end)

  it("loads another tool's file as a flat table, with its metadata", function()
    local header = '{"__metadata__":{"format":"pt"},'
      .. '"encoder.layer.0.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
      .. '"ids":{"dtype":"I32","shape":[],"data_offsets":[8,12]},'
      .. '"mask":{"dtype":"U8","shape":[3],"data_offsets":[12,15]},'
      .. '"h":{"dtype":"F16","shape":[1],"data_offsets":[15,17]},'
      .. '"b":{"dtype":"BF16","shape":[1],"data_offsets":[17,19]}}'
    local data = string.pack("<f<f<i4BBB<I2<I2", 1.5, -2, 42, 0, 1, 255, 0x3c00, 0xc000)
    raw_file(tmp("foreign.safetensors"), header, data)
    local r, meta = mp.load(tmp("foreign.safetensors"))
    assert.same({"b", "encoder.layer.0.weight", "h", "ids", "mask"}, (function()
      local ks = {}
      for k in pairs(r) do ks[#ks + 1] = k end
      table.sort(ks)
      return ks
    end)())
    assert.same({1.5, -2}, r["encoder.layer.0.weight"]:totable())
    assert.equal("i32", r.ids.dtype)
    assert.equal(0, r.ids:dim())
    assert.equal(42, r.ids:item())
    assert.same({0, 1, 255}, r.mask:totable())
    assert.same({1}, r.h:totable())
    assert.same({-2}, r.b:totable())
    assert.same({format = "pt"}, meta)
  end)

  describe("errors", function()
    it("names mp.save and the argument for bad arguments", function()
      assert_error(function() mp.save(nil, {}) end, "mp.save: path must be a string (got nil)")
      assert_error(function() mp.save(tmp("x"), 5) end, "mp.save: tbl must be a table (got number)")
      assert_error(function() mp.save(tmp("x"), mp.zeros{1}) end, "mp.save: tbl must be a table (got userdata)")
      assert_error(function() mp.load(42) end, "mp.load: path must be a string (got number)")
    end)

    it("names the key path of a value that cannot be saved, before writing anything", function()
      assert_error(function() mp.save(tmp("bad.safetensors"), {model = {layer = {f = print}}}) end,
                   "mp.save: tbl.model.layer.f is a function (expected tensors, numbers, strings, booleans or tables)")
      assert_error(function() mp.save(tmp("bad.safetensors"), {["0.weight"] = io.stdout}) end,
                   'mp.save: tbl["0.weight"] is a userdata')
      assert_error(function() mp.save(tmp("bad.safetensors"), {list = {1, 2, coroutine.create(print)}}) end,
                   "mp.save: tbl.list[3] is a thread")
      assert_error(function() mp.save(tmp("bad.safetensors"), {m = {[{}] = 1}}) end,
                   "mp.save: tbl.m has a key that is a table")
      local t = mp.zeros{2}
      t:free()
      assert_error(function() mp.save(tmp("bad.safetensors"), {w = t}) end, "mp.save: tbl.w is a freed tensor")
      assert.is_nil(slurp(tmp("bad.safetensors")))
    end)

    it("refuses cycles, naming where the table comes back", function()
      local a = {x = mp.zeros{1}}
      a.inner = {back = a}
      assert_error(function() mp.save(tmp("cycle.safetensors"), {a = a}) end,
                   "mp.save: tbl.a.inner.back refers back to a table that contains it (a cycle)")
      assert.is_nil(slurp(tmp("cycle.safetensors")))
      -- the same table twice without a cycle is fine
      local s = {v = 1}
      mp.save(tmp("dag.safetensors"), {s, s})
      assert_same({{v = 1}, {v = 1}}, (mp.load(tmp("dag.safetensors"))))
    end)

    it("refuses tables nested absurdly deep", function()
      local t = {}
      local leaf = t
      for _ = 1, 300 do leaf.x = {}; leaf = leaf.x end
      assert_error(function() mp.save(tmp("deep.safetensors"), t) end, "nests tables more than 200 deep")
      leaf = t
      for _ = 1, 150 do leaf = leaf.x end
      leaf.x = nil
      mp.save(tmp("deep.safetensors"), t)
      assert_same(t, (mp.load(tmp("deep.safetensors"))))
    end)

    it("leaves an existing file untouched when the table is bad", function()
      mp.save(tmp("keep.safetensors"), {a = mp.ones{3}})
      local before = slurp(tmp("keep.safetensors"))
      assert_error(function() mp.save(tmp("keep.safetensors"), {a = mp.ones{3}, f = print}) end, "tbl.f is a function")
      assert.equal(before, slurp(tmp("keep.safetensors")))
    end)

    it("names the path for file system errors", function()
      local p = tmp("no/such/dir/x.safetensors")
      assert_error(function() mp.save(p, {}) end, "mp.save: '" .. p .. "': cannot create a file there: No such file or directory")
      assert_error(function() mp.save(tmpdir, {}) end, "mp.save: '" .. tmpdir .. "': is a directory")
      assert_error(function() mp.load(tmp("absent")) end, "mp.load: '" .. tmp("absent") .. "': cannot open: No such file or directory")
    end)

    it("rejects malformed files with the path and the problem", function()
      spit(tmp("short"), "abc")
      assert_error(function() mp.load(tmp("short")) end, "mp.load: '" .. tmp("short") .. "': too short")
      spit(tmp("long"), string.pack("<I8", 1000) .. "{}")
      assert_error(function() mp.load(tmp("long")) end, "header length 1000 runs past the end of the file")
      -- a text (or any other) file is not read as a safetensors file with an
      -- absurd header length; a real one cut short keeps the specific errors
      spit(tmp("text.txt"), "hello, this is a text file\nwith two lines\n")
      assert_error(function() mp.load(tmp("text.txt")) end,
                   "mp.load: '" .. tmp("text.txt") .. "': not a safetensors file (bad header)")
      spit(tmp("text8"), "12345678")
      assert_error(function() mp.load(tmp("text8")) end, "not a safetensors file (bad header)")
      spit(tmp("png"), "\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
      assert_error(function() mp.load(tmp("png")) end, "not a safetensors file (bad header)")
      mp.save(tmp("cut.safetensors"), {x = mp.zeros{4}})
      spit(tmp("cut"), slurp(tmp("cut.safetensors")):sub(1, 20))
      assert_error(function() mp.load(tmp("cut")) end, "runs past the end of the file")
      raw_file(tmp("json"), '{"x": ')
      assert_error(function() mp.load(tmp("json")) end, "invalid JSON in the header")
      raw_file(tmp("i16"), '{"x":{"dtype":"I16","shape":[1],"data_offsets":[0,2]}}', string.rep("\0", 2))
      assert_error(function() mp.load(tmp("i16")) end, "unsupported dtype I16 for tensor 'x'")
      raw_file(tmp("size"), '{"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', string.rep("\0", 8))
      assert_error(function() mp.load(tmp("size")) end, "takes 12 bytes but data_offsets [0, 8] span 8")
    end)

    it("rejects a damaged structure description", function()
      local function with_structure(s)
        raw_file(tmp("st"), '{"__metadata__":{"mpengine.structure":' .. s .. '},'
          .. '"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', "\7")
        return function() return mp.load(tmp("st")) end
      end
      assert.equal(7, with_structure('"[[\\"s:w\\",\\"t:w\\"]]"')().w:item())
      assert_error(with_structure('"not json"'), "bad mpengine.structure metadata: not a JSON array")
      assert_error(with_structure('"[[\\"s:w\\",\\"t:v\\"]]"'), "tensor 'v' is not in the file")
      assert_error(with_structure('"[[\\"s:w\\",\\"i:1\\"]]"'), "tensor 'w' is in the file but not in the structure")
      assert_error(with_structure('"[[\\"q:w\\",\\"t:w\\"]]"'), "unknown atom type")
      assert_error(with_structure('"[[\\"s:w\\",\\"t:w\\"],[\\"s:w\\",\\"i:2\\"]]"'), "a key occurs twice")
      assert_error(with_structure('"[[\\"f:nan\\",\\"t:w\\"]]"'), "bad float")
      assert_error(with_structure('"[[\\"s:w\\"]]"'), "not a [key, value] pair")
    end)
  end)
end)

-- ---- interop with the reference implementation (Python safetensors) ----

local function find_python()
  local candidates = {build .. "/pyenv/bin/python3", "python3"}
  local env = os.getenv("MP_TEST_PYTHON")
  if env and env ~= "" then table.insert(candidates, 1, env) end
  for _, py in ipairs(candidates) do
    if os.execute("env -u LD_PRELOAD " .. q(py) .. ' -c "import safetensors, numpy, ml_dtypes" >/dev/null 2>&1') then
      return py
    end
  end
  local log = slurp(build .. "/pydeps.log")
  local last = log and log:match("([^\n]+)\n*$")
  return nil, "no python3 with safetensors, numpy and ml_dtypes (make pydeps installs them into "
    .. build .. "/pyenv" .. (last and ("; it said: " .. last) or "") .. ")"
end

local SCRIPT = root .. "/tests/reference/interop_safetensors.py"

-- runs the script; returns its output and whether it exited 0
local function script(py, args)
  -- never under a sanitizer's preloaded runtime (make test SAN=1): Python is not the code under test
  local p = io.popen("env -u LD_PRELOAD " .. q(py) .. " " .. q(SCRIPT) .. " " .. args .. " 2>&1")
  local out = p:read("a")
  local ok = p:close()
  return out, ok
end

describe("interop with Python safetensors", function()
  local py, why = find_python()
  if not py then
    pending("interop skipped: " .. why)
    return
  end
  local dir
  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. q(dir)))
  end)
  teardown(function() os.execute("rm -rf " .. q(dir)) end)

  local ref
  it("loads a file written by safetensors.numpy.save_file, values and metadata", function()
    local out, ok = script(py, "write " .. q(dir .. "/py.safetensors") .. " " .. q(dir .. "/values.lua"))
    assert(ok, out)
    ref = dofile(dir .. "/values.lua")
    local r, meta = mp.load(dir .. "/py.safetensors")
    assert.equal("safetensors.numpy", meta.origin)
    for name, want in pairs(ref) do
      local t = r[name]
      assert(t, name .. " missing")
      assert.equal(want.dtype, t.dtype)
      assert.same(want.shape, t.shape)
      local got = t:dim() == 0 and {t:item()} or t:reshape{-1}:totable()
      local ok2, why2 = same(want.values, got, name)
      assert(ok2, why2)
    end
  end)

  it("writes back what it loaded bit for bit (NaN payloads included)", function()
    assert(ref, "the previous test did not run")
    local r = mp.load(dir .. "/py.safetensors")
    mp.save(dir .. "/back.safetensors", r)
    local out, ok = script(py, "check " .. q(dir .. "/back.safetensors") .. " exact")
    assert(ok, out)
  end)

  it("writes tensors made from Lua values that safetensors reads bit for bit", function()
    assert(ref, "the first interop test did not run")
    -- flat keys with dots, so that the file's names are the reference's names
    local t = {}
    -- f64 on the CPU where the default device holds none (CUDA declines f64)
    local f64_dev = pcall(mp.zeros, {1}, {dtype = "f64"}) and mp.default_device() or "cpu"
    for name, want in pairs(ref) do
      if not want.payload_only then
        local o = {dtype = want.dtype, device = want.dtype == "f64" and f64_dev or nil}
        t[name] = #want.shape == 0 and mp.tensor(want.values[1], o)
          or mp.tensor(want.values, o):reshape(want.shape)
      end
    end
    mp.save(dir .. "/lua.safetensors", t)
    local out, ok = script(py, "check " .. q(dir .. "/lua.safetensors") .. " values")
    assert(ok, out)
  end)
end)
