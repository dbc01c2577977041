-- arguments_spec.lua: no argument is silently reinterpreted. A value that an
-- integer tensor cannot hold is refused (not saturated or truncated), a NaN
-- never stands for "the default", a NUL byte never cuts a safetensors name
-- short, and every Lua number that becomes a C integer goes through one
-- checked conversion (lua/lbind.c, lb_integer): no cast of an out-of-range
-- double (undefined behaviour in C; `make test SAN=1` halts on the ones UBSan
-- sees) and an error that shows the value as given.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

describe("values written into integer tensors", function()
  local m = mp.tensor({1, 0}):gt(0)

  it("masked_fill refuses what i32 or u8 cannot hold, and keeps the tensor", function()
    local t = mp.tensor({7, 8}, {dtype = "i32"})
    H.raises(function() t:masked_fill(m, 1e20) end, {"masked_fill", "1e+20", "i32"})
    H.raises(function() t:masked_fill(m, -2 ^ 31 - 1) end, {"masked_fill", "i32"})
    H.raises(function() mp.masked_fill(t, m, 2.7) end, {"masked_fill", "2.7"})
    H.raises(function() mp.masked_fill(t, m, 0 / 0) end, {"masked_fill", "nan"})
    local u = mp.tensor({1, 2}, {dtype = "u8"})
    H.raises(function() u:masked_fill(m, -5) end, {"masked_fill", "-5", "u8"})
    H.raises(function() u:masked_fill(m, 256) end, {"masked_fill", "256", "u8"})
    assert.same({7, 8}, t:totable())
    -- the edges of the range are whole numbers that fit
    assert.same({2147483647, 8}, t:masked_fill(m, 2 ^ 31 - 1):totable())
    assert.same({-2147483648, 8}, t:masked_fill(m, -2 ^ 31):totable())
    assert.same({255, 2}, u:masked_fill(m, 255):totable())
  end)

  it("mp.full and mp.tensor refuse them too (no saturation, no truncation)", function()
    H.raises(function() mp.full({2}, 1e20, {dtype = "i32"}) end, {"mp.full", "i32"})
    H.raises(function() mp.full({2}, -5, {dtype = "u8"}) end, {"mp.full", "-5", "u8"})
    H.raises(function() mp.full({2}, 2.5, {dtype = "i32"}) end, {"mp.full", "2.5"})
    H.raises(function() mp.tensor({1, 1e20}, {dtype = "i32"}) end, {"mp.tensor", "element 2", "i32"})
    H.raises(function() mp.tensor({{0, 1}, {2, 300}}, {dtype = "u8"}) end, {"mp.tensor", "element 4", "300"})
    H.raises(function() mp.tensor({2.5}, {dtype = "i32"}) end, {"mp.tensor", "2.5"})
    assert.same({3, -3}, mp.tensor({3.0, -3}, {dtype = "i32"}):totable())
    -- floats keep rounding as their dtype does
    assert.equal(math.huge, mp.full({1}, 1e20, {dtype = "f16"}):item())
  end)
end)

describe("options that mean a default when absent", function()
  it("attention refuses a NaN scale (it used to stand for 1/sqrt(d))", function()
    local q = mp.randn({1, 1, 2, 4})
    H.raises(function() mp.attention(q, q, q, {scale = 0 / 0}) end, {"mp.attention", "scale", "nan"})
    H.raises(function() mp.attention(q, q, q, {scale = math.huge}) end, {"mp.attention", "scale", "inf"})
    -- no scale: 1/sqrt(d), the same as giving it
    local a, b = mp.attention(q, q, q), mp.attention(q, q, q, {scale = 0.5})
    H.assert_same(a:totable(), b:totable())
  end)
end)

describe("safetensors names", function()
  it("a header with a \\u0000 escape is refused, not cut short", function()
    local path = os.tmpname()
    local hdr = '{"a\\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},' ..
                '"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}'
    local f = assert(io.open(path, "wb"))
    f:write(string.pack("<I8", #hdr), hdr, string.rep("\0", 16))
    f:close()
    H.raises(function() mp.load(path) end, {"mp.load", "\\u0000"})
    -- an escaped backslash followed by the text u0000 is not a NUL
    hdr = '{"a\\\\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    f = assert(io.open(path, "wb"))
    f:write(string.pack("<I8", #hdr), hdr, string.rep("\0", 8))
    f:close()
    assert.is_not_nil(mp.load(path)["a\\u0000b"])
    os.remove(path)
  end)

  it("a key with a NUL byte round-trips through mp.save / mp.load", function()
    local path = os.tmpname()
    mp.save(path, {["a\0b"] = mp.tensor({1, 2}), a = mp.tensor({3})})
    local r = mp.load(path)
    assert.same({1, 2}, r["a\0b"]:totable())
    assert.same({3}, r.a:totable())
    os.remove(path)
  end)
end)

describe("Lua numbers converted to C integers", function()
  it("randint over the whole int64 range is refused without overflow", function()
    H.raises(function() mp.randint(math.mininteger, math.maxinteger, {3}) end, {"mp.randint", "2^24"})
    H.raises(function() mp.randint(-1, math.maxinteger, {3}) end, {"mp.randint", "2^24"})
  end)

  it("conv2d groups: a huge, fractional or infinite value is named as given", function()
    local x, w = mp.randn({1, 2, 4, 4}), mp.randn({2, 2, 3, 3})
    H.raises(function() mp.conv2d(x, w, nil, {groups = 1e300}) end, {"mp.conv2d", "groups", "1e+300"})
    H.raises(function() mp.conv2d(x, w, nil, {groups = math.huge}) end, {"mp.conv2d", "groups", "inf"})
    H.raises(function() mp.conv2d(x, w, nil, {groups = 2.5}) end, {"mp.conv2d", "groups", "2.5"})
    H.raises(function() mp.conv2d(x, w, nil, {groups = math.maxinteger}) end, {"mp.conv2d", "groups", "9223372036854775807"})
    H.raises(function() mp.conv2d(x, w, nil, {groups = 0}) end, {"mp.conv2d", "groups"})
    assert.same({1, 2, 2, 2}, mp.conv2d(x, mp.randn({2, 1, 3, 3}), nil, {groups = 2.0}).shape)
  end)

  it("integer options are whole numbers within int64 (1e300 and inf are not)", function()
    H.raises(function() mp.amp.policy.dynamic{interval = math.huge} end, {"interval", "inf"})
    H.raises(function() mp.amp.policy.dynamic{interval = 1e300} end, {"interval", "1e+300"})
  end)

  it("a tensor index of 1e300 is refused as given", function()
    H.raises(function() return mp.zeros({3})[1e300] end, {"Tensor[]", "index", "1e+300"})
    H.raises(function() return mp.zeros({3})[2.5] end, {"Tensor[]", "index", "2.5"})
    assert.equal(0, mp.zeros({3})[2.0]:item())
  end)

  it("mp.isatty takes a file descriptor in int's range", function()
    H.raises(function() mp.isatty(2 ^ 32 + 1) end, {"mp.isatty", "fd", "4294967297"})
    H.raises(function() mp.isatty(-1) end, {"mp.isatty", "fd"})
    assert.is_boolean(mp.isatty(1))
  end)
end)
