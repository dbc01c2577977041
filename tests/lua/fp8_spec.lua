-- fp8_spec.lua: the FP8 dtypes e4m3 and e5m2 (issue 30, item 1) from Lua, on the
-- default device (the CPU, and the fake and emulated CUDA devices under
-- MP_DEVICE=cuda): every code decoded as its fields say, casts from f32, f16 and
-- bf16 with and without saturation on boundary values, the same bits on the CPU
-- and the device, views of the bytes as another dtype of the same size, the
-- layout ops moving bytes, the ops that compute refusing FP8 with the engine's
-- message, no gradients, printing, and safetensors round trips.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/fp8_spec.lua
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local DEV = mp.default_device()

-- bytes as a u8 tensor on the default device
local function U8(codes) return mp.tensor(codes, { dtype = "u8" }) end
local function codes_of(t) return t:view("u8"):cpu():totable() end

-- a code's value from its fields (OCP: e4m3 has NaN S.1111.111 and no inf;
-- e5m2 is IEEE-like), written here independently of the engine
local FMT = { e4m3 = { m = 3, bias = 7 }, e5m2 = { m = 2, bias = 15 } }
local function field_value(dt, c)
  local f = FMT[dt]
  local s, e, m = c >> 7, (c >> f.m) & ((1 << (7 - f.m)) - 1), c & ((1 << f.m) - 1)
  local emax = (1 << (7 - f.m)) - 1
  local v
  if e == emax and dt == "e4m3" and m == 7 then v = 0 / 0
  elseif e == emax and dt == "e5m2" then v = m == 0 and math.huge or 0 / 0
  elseif e == 0 then v = m * 2.0 ^ (1 - f.bias - f.m)
  else v = (1 + m / (1 << f.m)) * 2.0 ^ (e - f.bias) end
  return s == 1 and -v or v
end

local function f32_bits(b) return (string.unpack("<f", string.pack("<I4", b))) end

-- inputs with their expected codes: {value, e4m3, e4m3 saturating, e5m2, e5m2 saturating}
local CASES = {
  { 0.0, 0x00, 0x00, 0x00, 0x00 }, { -0.0, 0x80, 0x80, 0x80, 0x80 },
  { 1.0, 0x38, 0x38, 0x3c, 0x3c }, { -1.5, 0xbc, 0xbc, 0xbe, 0xbe },
  { 448, 0x7e, 0x7e, 0x5f, 0x5f }, { 464, 0x7e, 0x7e, 0x5f, 0x5f },     -- 464: e4m3's midpoint, ties to 448
  { 465, 0x7f, 0x7e, 0x5f, 0x5f }, { -500, 0xff, 0xfe, 0xe0, 0xe0 },
  { 57344, 0x7f, 0x7e, 0x7b, 0x7b }, { 61440, 0x7f, 0x7e, 0x7c, 0x7b },  -- 61440: e5m2's midpoint, to inf
  { -1e6, 0xff, 0xfe, 0xfc, 0xfb }, { math.huge, 0x7f, 0x7e, 0x7c, 0x7b }, { -math.huge, 0xff, 0xfe, 0xfc, 0xfb },
  { 2 ^ -9, 0x01, 0x01, 0x18, 0x18 }, { 2 ^ -10, 0x00, 0x00, 0x14, 0x14 }, -- half e4m3's least subnormal: 0
  { 2 ^ -16, 0x00, 0x00, 0x01, 0x01 }, { -2 ^ -17, 0x80, 0x80, 0x80, 0x80 },
  { 1.0625, 0x38, 0x38, 0x3c, 0x3c }, { 1.1875, 0x3a, 0x3a, 0x3d, 0x3d },
}

describe("FP8 dtypes", function()
  it("have their names, size 1, and decode every code as its fields say", function()
    for _, dt in ipairs { "e4m3", "e5m2" } do
      local codes = {}
      for c = 0, 255 do codes[c + 1] = c end
      local t = U8(codes):view(dt)
      assert.equal(dt, t.dtype)
      assert.equal(DEV, t.device)
      local got = t:to("f32"):cpu():totable()
      local got64 = t:cpu():to("f64"):totable()
      for c = 0, 255 do
        local want = field_value(dt, c)
        for _, g in ipairs { got[c + 1], got64[c + 1] } do
          if want ~= want then
            assert(g ~= g, string.format("%s 0x%02x: %s, expected NaN", dt, c, g))
          else
            assert(g == want and (1 / g > 0) == (1 / want > 0),
                   string.format("%s 0x%02x: %s, expected %s", dt, c, g, want))
          end
        end
      end
    end
  end)

  it("are made by casts from f32, f16 and bf16, rounding to nearest even, saturating on request", function()
    local vals = {}
    for i, c in ipairs(CASES) do vals[i] = c[1] end
    local x = mp.tensor(vals, { dtype = "f32" })
    for col, how in ipairs { { "e4m3", false }, { "e4m3", true }, { "e5m2", false }, { "e5m2", true } } do
      local dt, sat = how[1], how[2]
      for _, src in ipairs { "f32", "f16", "bf16" } do
        local xs = x:to(src)
        -- the inputs that f16/bf16 hold exactly: all of CASES but the f16 underflows
        local got = codes_of(xs:to(dt, { saturate = sat }))
        local back = xs:to("f32"):cpu():totable()
        for i, c in ipairs(CASES) do
          if back[i] == c[1] or (c[1] ~= c[1]) then
            assert(got[i] == c[col + 1], string.format("%s %s -> %s saturate=%s: 0x%02x, expected 0x%02x", src,
              tostring(c[1]), dt, tostring(sat), got[i], c[col + 1]))
          end
        end
      end
    end
    -- not saturating is the default, as PyTorch's .to(torch.float8_e4m3fn)
    assert.same(codes_of(x:to("e4m3", { saturate = false })), codes_of(x:to("e4m3")))
    assert.same(codes_of(x:to("e5m2", { saturate = false })), codes_of(mp.to(x, "e5m2")))
    -- a NaN input: 0x7f, whatever its sign (CUDA's host code does the same)
    assert.same({ 0x7f, 0x7f }, codes_of(mp.tensor({ 0 / 0, -(0 / 0) }):to("e4m3")))
    assert.same({ 0x7f, 0x7f }, codes_of(mp.tensor({ 0 / 0, -(0 / 0) }):to("e5m2", { saturate = true })))
  end)

  it("cast on the default device gives the CPU's bits, both ways", function()
    math.randomseed(30)
    local pats = {}
    for i = 1, 4000 do pats[i] = math.random(0, 0xffffffff) - (1 << 31) end   -- as i32: every f32 pattern
    local x = mp.tensor(pats, { dtype = "i32" }):view("f32")
    local xc = x:cpu()
    for _, dt in ipairs { "e4m3", "e5m2" } do
      for _, sat in ipairs { false, true } do
        for _, src in ipairs { "f32", "f16", "bf16" } do
          local a = codes_of(x:to(src):to(dt, { saturate = sat }))
          local b = codes_of(xc:to(src):to(dt, { saturate = sat }))
          assert.same(b, a, src .. " -> " .. dt)
        end
      end
      local codes = {}
      for c = 0, 255 do codes[c + 1] = c end
      local q = U8(codes):view(dt)
      for _, dd in ipairs { "f16", "bf16", "e4m3", "e5m2" } do
        local a = q:to(dd):view(dd == "bf16" and "f16" or dd):cpu()
        local b = q:cpu():to(dd):view(dd == "bf16" and "f16" or dd)
        local av = mp.to(a, "f32"):totable()
        local bv = mp.to(b, "f32"):totable()
        for i = 1, 256 do
          assert(av[i] == bv[i] or (av[i] ~= av[i] and bv[i] ~= bv[i]), dt .. " -> " .. dd .. " at " .. i)
        end
      end
    end
    -- through the host: a cast across devices gives the same bits
    assert.same(codes_of(xc:to("e4m3")), codes_of(xc:to("e4m3", DEV)))
  end)

  it("view reinterprets the bytes of a same-size dtype, sharing storage", function()
    local a = mp.tensor({ 1, 2, -448 }, { dtype = "e4m3" })
    local u = a:view("u8")
    assert.equal("u8", u.dtype)
    assert.same({ 0x38, 0x40, 0xfe }, u:cpu():totable())
    u:copy_(U8 { 0x30, 0x7f, 0x01 })                       -- write through the view
    local v = a:to("f32"):cpu():totable()
    assert.equal(0.5, v[1]); assert(v[2] ~= v[2]); assert.equal(2 ^ -9, v[3])
    assert.same({ 0x30, 0x7f, 0x01 }, codes_of(a:view("e5m2")))   -- e4m3 -> e5m2: the same bytes
    assert.equal(0.125, mp.view(a, "e5m2"):to("f32"):cpu():totable()[1])
    -- 2-byte and 4-byte pairs
    local h = mp.tensor({ 1.0 }, { dtype = "f16" })
    assert.equal("bf16", h:view("bf16").dtype)
    assert.equal(2 ^ -7, h:view("bf16"):to("f32"):cpu():item())   -- f16 1.0 is 0x3c00, bf16 0x3c00 is 2^-7
    assert.equal(1.0, h:view("bf16"):view("f16"):to("f32"):cpu():item())
    local f = mp.tensor({ 1.0, -2.0 }, { dtype = "f32" })
    assert.same({ 0x3f800000, -0x40000000 }, f:view("i32"):cpu():totable())
    assert.equal(f32_bits(0x40490fdb), mp.tensor({ 0x40490fdb }, { dtype = "i32" }):view("f32"):cpu():item())
    -- view with sizes is still reshape
    assert.same({ 3, 1 }, a:view(3, 1).shape)
    H.raises(function() return a:view("f16") end, { "Tensor:view", "e4m3", "1 bytes", "f16", "2" })
    H.raises(function() return mp.view(f, "f16") end, { "mp.view", "f32", "f16" })
    H.raises(function() return a:view("int8") end, { "Tensor:view", "int8" })
  end)

  it("move through copies and the layout ops byte for byte", function()
    local codes = {}
    for i = 1, 24 do codes[i] = (i * 37) % 256 end
    for _, dt in ipairs { "e4m3", "e5m2" } do
      local u = U8(codes):reshape(2, 3, 4)
      local q = u:view(dt)
      local function same(f) assert.same(codes_of(f(u)), codes_of(f(q))) end
      same(function(t) return t:transpose(1, 3):contiguous() end)
      same(function(t) return t:permute(3, 1, 2):contiguous() end)
      same(function(t) return t:reshape(6, 4):narrow(1, 2, 3):clone() end)
      same(function(t) return t:select(2, 3) end)
      same(function(t) return t:reshape(24):index_select(1, mp.tensor({ 5, 0, 23, 5 }, { dtype = "i32" })) end)
      same(function(t) return t:narrow(1, 1, 1):expand(3, 3, 4):contiguous() end)
      same(function(t) return t:cpu() end)
      local z = mp.zeros({ 2, 3, 4 }, { dtype = dt })
      assert.equal(dt, z.dtype)
      z:copy_(q)
      assert.same(codes, codes_of(z:reshape(24)))
      -- copy_ from f32 rounds as :to does (not saturating)
      z:reshape(24):narrow(1, 1, 2):copy_(mp.tensor({ 1e9, 1.0 }))
      assert.same({ dt == "e4m3" and 0x7f or 0x7c, dt == "e4m3" and 0x38 or 0x3c },
                  codes_of(z:reshape(24):narrow(1, 1, 2)))
      assert.same({ 0, 0, 0 }, codes_of(mp.zeros({ 3 }, { dtype = dt })))
      -- fills round as :to does: 3.3 to nearest, 1000 overflows (not saturating), -2.5 exact
      local want = dt == "e4m3" and { 0x45, 0x7f, 0xc2 } or { 0x43, 0x64, 0xc1 }
      for i, v in ipairs { 3.3, 1000, -2.5 } do
        assert.equal(want[i], codes_of(mp.full({ 2 }, v, { dtype = dt }))[2], dt .. " full " .. v)
        assert.equal(want[i], codes_of(mp.zeros({ 2 }, { dtype = dt }):fill_(v))[1], dt .. " fill_ " .. v)
      end
      assert.same({ 0x38, 0x38 }, codes_of(mp.ones({ 2 }, { dtype = "e4m3" })))
    end
  end)

  it("hold data only: ops that compute refuse them, naming the op and the dtype", function()
    local a = mp.tensor({ 1, 2, 3, 4 }, { dtype = "e4m3" })
    local b = mp.tensor({ 1, 2, 3, 4 }, { dtype = "e5m2" })
    local f = mp.tensor({ 1, 2, 3, 4 })
    for name, fn in pairs {
      add = function() return a + a end, mul = function() return a * 2 end,
      sum = function() return a:sum() end, max = function() return mp.max(a) end,
      matmul = function() return mp.matmul(a:reshape(2, 2), a:reshape(2, 2)) end,
      exp = function() return a:exp() end, relu = function() return mp.relu(a) end,
      softmax = function() return mp.softmax(a, 1) end, add_ = function() return a:add_(1) end,
      mul_ = function() return a:mul_(2) end, gt = function() return a:gt(1) end,
      where = function() return mp.where(mp.tensor({ 1, 0, 1, 0 }, { dtype = "u8" }), a, a) end,
      cat = function() return mp.cat({ a, a }, 1) end,
    } do
      local msg = H.raises(fn, { "e4m3", "hold data only", ":to('bf16')" })
      assert(msg:find(name:gsub("_$", ""), 1, true), name .. ": " .. msg)
    end
    H.raises(function() return f + b end, { "add", "e5m2", "hold data only", "input 2" })
    H.raises(function() return f:add_(b) end, { "add", "e5m2", "input 2" })
    assert.same({ 1, 2, 3, 4 }, a:to("f32"):cpu():totable())   -- the values are intact
    H.raises(function() return mp.randn({ 2 }, { dtype = "e4m3" }) end, { "mp.randn", "e4m3" })
    H.raises(function() return mp.amp.autocast("e4m3") end, { "f16 or bf16", "e4m3" })
    H.raises(function() return mp.to(a, "e4m3", { saturate = 1 }) end, { "mp.to", "saturate", "boolean" })
    H.raises(function() return a:to("e4m3", { clamp = true }) end, { "Tensor:to", "clamp" })
  end)

  it("carry no gradients: a cast into FP8 cuts the graph, and they cannot require grad", function()
    local w = mp.tensor({ 1, 2, 3 }, { requires_grad = true })
    local q = w:to("e4m3")
    assert.is_nil(q.grad_fn)
    assert.is_false(q:requires_grad())
    H.raises(function() return mp.tensor({ 1 }, { dtype = "e5m2", requires_grad = true }) end,
             { "require grad", "e5m2", "data only" })
    H.raises(function() return q:requires_grad(true) end, { "require grad", "e4m3", "data only" })
    -- back to f32: a new leaf, no history
    local y = q:to("f32")
    assert.is_nil(y.grad_fn)
  end)

  it("print their decoded values and dtype", function()
    local s = tostring(mp.tensor({ 1.5, -448, 0 / 0 }, { dtype = "e4m3" }))
    assert(s:find("1.5", 1, true), s)
    assert(s:find("-448", 1, true), s)
    assert(s:find("nan", 1, true), s)
    assert(s:find("[e4m3 3 " .. DEV .. "]", 1, true), s)
    local e = tostring(mp.tensor({ 57344, 1 / 0 }, { dtype = "e5m2" }))
    assert(e:find("57344", 1, true) and e:find("inf", 1, true) and e:find("e5m2", 1, true), e)
  end)

  it("round-trip through safetensors (F8_E4M3, F8_E5M2) bit for bit", function()
    local codes = {}
    for c = 0, 255 do codes[c + 1] = c end
    local path = os.tmpname()
    local t = { a = U8(codes):view("e4m3"), b = U8(codes):view("e5m2"):reshape(16, 16) }
    mp.save(path, t)
    local f = io.open(path, "rb")
    local head = f:read(4096)
    f:close()
    assert(head:find('"F8_E4M3"', 1, true) and head:find('"F8_E5M2"', 1, true), head:sub(1, 200))
    local r = mp.load(path)
    os.remove(path)
    assert.equal("e4m3", r.a.dtype)
    assert.equal("e5m2", r.b.dtype)
    assert.same({ 16, 16 }, r.b.shape)
    assert.same(codes, codes_of(r.a))
    assert.same(codes, codes_of(r.b:reshape(256)))
  end)
end)

-- ml_dtypes' float8 casts, through files (tests/reference/fp8_ml_dtypes.py): the
-- not-saturating mode on a dense f32 sample and every f16 and bf16 pattern
local function find_python()
  local candidates, env = { H.build .. "/pyenv/bin/python3", "python3" }, os.getenv("MP_TEST_PYTHON")
  if env and env ~= "" then table.insert(candidates, 1, env) end
  for _, py in ipairs(candidates) do
    if os.execute("env -u LD_PRELOAD " .. H.q(py) .. ' -c "import safetensors, numpy, ml_dtypes" >/dev/null 2>&1') then
      return py
    end
  end
end

describe("FP8 casts against ml_dtypes", function()
  local py = find_python()
  if not py then
    pending("skipped: no python3 with safetensors, numpy and ml_dtypes (make pydeps installs them)")
    return
  end
  local script = H.root .. "/tests/reference/fp8_ml_dtypes.py"
  local function run(args)
    local p = io.popen("env -u LD_PRELOAD " .. H.q(py) .. " " .. H.q(script) .. " " .. args .. " 2>&1")
    local out = p:read("a")
    return out, p:close()
  end

  it("agree bit for bit, not saturating, from f32, f16 and bf16 (NaN inputs: NaN)", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. H.q(dir)))
    local out, ok = run("write " .. H.q(dir .. "/in.safetensors"))
    assert(ok, out)
    local r, cast = mp.load(dir .. "/in.safetensors"), {}
    for k, x in pairs(r) do
      cast[k] = x
      cast[k .. ".e4m3"], cast[k .. ".e5m2"] = x:to("e4m3"), x:to("e5m2")
    end
    mp.save(dir .. "/out.safetensors", cast)
    out, ok = run("check " .. H.q(dir .. "/out.safetensors"))
    os.execute("rm -rf " .. H.q(dir))
    assert(ok, out)
    assert(out:find("^ok: %d+ casts match ml_dtypes"), out)
  end)
end)
