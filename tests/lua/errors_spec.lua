-- errors_spec.lua: every bad input raises a Lua error naming the function and
-- what was expected, and never crashes the process (docs/DESIGN.md section 7).
-- Each bad call runs in a child lua5.4 (see helpers.lua: H.child), so that a
-- crash fails one test instead of killing the whole run; the child reports the
-- error message, which is checked here.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/errors_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

-- run a list of {code, {words...}} cases, collecting every failure into one report
local function cases(list)
  local bad = {}
  for _, c in ipairs(list) do
    local ok, err = pcall(H.child_error, c[1], c[2])
    if not ok then bad[#bad + 1] = tostring(err) end
  end
  assert(#bad == 0, #bad .. " of " .. #list .. " cases failed:\n\n" .. table.concat(bad, "\n\n"))
end

describe("bad input", function()
  setup(function()
    local r = H.child("return 1")
    assert(r.out == "OK:1", "child lua with mp does not run: " .. r.out .. r.err)
  end)

  it("wrong argument types to the constructors", function()
    cases {
      { "mp.tensor()", { "mp.tensor", "number" } },
      { "mp.tensor('x')", { "mp.tensor", "number" } },
      { "mp.tensor(true)", { "mp.tensor", "number" } },
      { "mp.tensor(print)", { "mp.tensor", "number" } },
      { "mp.tensor({1}, 'f16')", { "mp.tensor", "table" } },
      { "mp.tensor({1}, {dtype=true})", { "mp.tensor", "dtype" } },
      { "mp.zeros()", { "mp.zeros", "shape" } },
      { "mp.zeros('x')", { "mp.zeros", "shape" } },
      { "mp.zeros(true)", { "mp.zeros", "shape" } },
      { "mp.zeros({'a'})", { "mp.zeros", "integer" } },
      { "mp.zeros({2, {}})", { "mp.zeros", "integer" } },
      { "mp.zeros({2.5})", { "mp.zeros", "integer" } },
      { "mp.zeros({2}, 'f16')", { "mp.zeros", "table" } },
      { "mp.zeros({2}, {device=3})", { "mp.zeros", "device" } },
      { "mp.ones('x')", { "mp.ones", "shape" } },
      { "mp.ones({1.5})", { "mp.ones", "integer" } },
      { "mp.full('x', 1)", { "mp.full", "shape" } },
      { "mp.full({2}, 'x')", { "mp.full", "number" } },
      { "mp.full({2}, '3')", { "mp.full", "number" } },
      { "mp.full({2})", { "mp.full", "number" } },
      { "mp.full({2}, {})", { "mp.full", "number" } },
      { "mp.full({2}, 1, 'f16')", { "mp.full", "table" } },
      { "mp.arange('x')", { "mp.arange", "integer" } },
      { "mp.arange({})", { "mp.arange", "integer" } },
      { "mp.arange()", { "mp.arange", "integer" } },
      { "mp.arange(2.5)", { "mp.arange", "integer" } },
      { "mp.rand('x')", { "mp.rand", "shape" } },
      { "mp.rand({2}, 5)", { "mp.rand", "table" } },
      { "mp.randn(true)", { "mp.randn", "shape" } },
      { "mp.randn({-1.5})", { "mp.randn", "integer" } },
      { "mp.manual_seed('x')", { "mp.manual_seed", "integer" } },
      { "mp.manual_seed()", { "mp.manual_seed", "integer" } },
      { "mp.manual_seed(1.5)", { "mp.manual_seed", "integer" } },
      { "mp.manual_seed({})", { "mp.manual_seed", "integer" } },
      { "mp.matmul(1, 2)", { "matmul", "tensor" } },
      { "mp.matmul(mp.ones{2,2})", { "matmul", "tensor" } },
      { "mp.matmul(mp.ones{2,2}, {})", { "matmul", "tensor" } },
      { "mp.matmul({}, mp.ones{2,2})", { "matmul", "tensor" } },
      { "mp.set_default_device(3)", { "mp.set_default_device", "device" } },
      { "mp.set_default_device()", { "mp.set_default_device", "device" } },
      { "mp.memory('tpu')", { "mp.memory", "device" } },
    }
  end)

  it("wrong argument types to the tensor methods", function()
    cases {
      { "mp.ones{2,3}:size('a')", { "size", "integer" } },
      { "mp.ones{2,3}:size(1.5)", { "size", "integer" } },
      { "mp.ones{2,3}:size({})", { "size" } },
      { "mp.ones{2,3}:sum('a')", { "sum", "integer" } },
      { "mp.ones{2,3}:sum(1.5)", { "sum", "integer" } },
      { "mp.ones{2,3}:mean({})", { "mean", "integer" } },
      { "mp.ones{2,3}:max('x')", { "max", "integer" } },
      { "mp.ones{2,3}:argmax('x')", { "argmax", "integer" } },
      { "mp.ones{2,3}:transpose('a', 1)", { "transpose", "integer" } },
      { "mp.ones{2,3}:transpose(1)", { "transpose", "integer" } },
      { "mp.ones{2,3}:transpose()", { "transpose", "integer" } },
      { "mp.ones{2,3}:narrow('a', 1, 1)", { "narrow", "integer" } },
      { "mp.ones{2,3}:narrow(1, 'a', 1)", { "narrow", "integer" } },
      { "mp.ones{2,3}:narrow(1, 1, 'a')", { "narrow", "integer" } },
      { "mp.ones{2,3}:narrow(1, 1)", { "narrow", "integer" } },
      { "mp.ones{2,3}:narrow(1, 1.5, 1)", { "narrow", "integer" } },
      { "mp.ones{2,3}:reshape('x')", { "reshape", "integer" } },
      { "mp.ones{2,3}:reshape{'a', 3}", { "reshape", "integer" } },
      { "mp.ones{2,3}:reshape{2.5, 2}", { "reshape", "integer" } },
      { "mp.ones{2,3}:reshape(true)", { "reshape", "integer" } },
      { "mp.ones{2,3}:view('x')", { "view", "unknown dtype 'x'" } },
      { "mp.ones{2,3}:view(true)", { "view", "integer" } },
      { "mp.ones{2,3}:view{{}}", { "view", "integer" } },
      { "mp.ones{2,3}:to()", { "to", "dtype" } },
      { "mp.ones{2,3}:to({})", { "to", "string" } },
      { "mp.ones{2,3}:to(nil)", { "to" } },
      { "mp.ones{2,3}:pow()", { "pow", "number" } },
      { "mp.ones{2,3}:pow('a')", { "pow", "number" } },
      { "mp.ones{2,3}:matmul(3)", { "matmul", "tensor" } },
      { "mp.ones{2,3}:matmul()", { "matmul", "tensor" } },
    }
  end)

  it("every method called on something that is not a tensor", function()
    local list = {}
    local names = {}
    for name in pairs(mp.Tensor) do names[#names + 1] = name end
    table.sort(names)
    assert.is_true(#names >= 28, "mp.Tensor has " .. #names .. " methods")
    for _, name in ipairs(names) do
      for _, self in ipairs { "42", "'x'", "{}", "nil" } do
        list[#list + 1] = { "mp.Tensor." .. name .. "(" .. self .. ", 1, 1, 1)", { name, "tensor" } }
      end
    end
    cases(list)
  end)

  it("arithmetic with things that are not tensors or numbers", function()
    cases {
      { "return mp.ones{2} + 'a'", { "add", "tensors or numbers" } },
      { "return 'a' + mp.ones{2}", { "add" } },
      { "return mp.ones{2} - {}", { "sub", "tensors or numbers" } },
      { "return {} - mp.ones{2}", { "sub", "tensors or numbers" } },
      { "return mp.ones{2} * true", { "mul", "tensors or numbers" } },
      { "return print * mp.ones{2}", { "mul", "tensors or numbers" } },
      { "return mp.ones{2} / io.stdout", { "div", "tensors or numbers" } },
      { "return mp.ones{2} / nil", { "div", "tensors or numbers" } },
    }
  end)

  it("ragged nested tables, non-number leaves and empty tables in mp.tensor", function()
    cases {
      { "mp.tensor{{1,2},{3}}", { "mp.tensor", "ragged" } },
      { "mp.tensor{{1,2},{3,4,5}}", { "mp.tensor", "ragged" } },
      { "mp.tensor{{1},{2,3}}", { "mp.tensor", "ragged" } },
      { "mp.tensor{{1,2},3}", { "mp.tensor", "ragged" } },
      { "mp.tensor{{{1},{2}},{{3}}}", { "mp.tensor", "ragged" } },
      { "mp.tensor{{1},{}}", { "mp.tensor", "ragged" } },
      { "mp.tensor{1,{2}}", { "mp.tensor", "number" } },
      { "mp.tensor{1,'a'}", { "mp.tensor", "number" } },
      { "mp.tensor{1,'2'}", { "mp.tensor", "number" } },
      { "mp.tensor{1,true}", { "mp.tensor", "number" } },
      { "mp.tensor{{1,2},{3,print}}", { "mp.tensor", "number" } },
      { "mp.tensor{1,nil,3}", { "mp.tensor", "number" } },
      { "mp.tensor{}", { "mp.tensor", "empty" } },
      { "mp.tensor{{}}", { "mp.tensor", "empty" } },
      { "mp.tensor{{{}}}", { "mp.tensor", "empty" } },
      { "local t = {}; t[1] = t; mp.tensor(t)", { "mp.tensor", "8" } },
      -- a table that claims more elements than memory can hold must not overflow the
      -- element count (2^61 doubles wrap the byte count to 0: a heap overflow)
      { "mp.tensor(setmetatable({}, {__len = function() return 1 << 61 end, __index = function() return 1 end}))",
        { "mp.tensor" } },
      { "mp.tensor(setmetatable({}, {__len = function() return 1 << 40 end, __index = function() return 1 end}))",
        { "memory" } },
    }
  end)

  it("negative or zero sizes", function()
    cases {
      { "mp.zeros{0}", { "mp.zeros", "positive" } },
      { "mp.zeros{2,0}", { "mp.zeros", "positive" } },
      { "mp.zeros{-1}", { "mp.zeros", "positive" } },
      { "mp.zeros{3,-2}", { "mp.zeros", "positive" } },
      { "mp.zeros(0)", { "mp.zeros", "positive" } },
      { "mp.zeros(-2)", { "mp.zeros", "positive" } },
      { "mp.ones{0}", { "mp.ones", "positive" } },
      { "mp.ones(0)", { "mp.ones", "positive" } },
      { "mp.full({0}, 1)", { "mp.full", "positive" } },
      { "mp.full(-3, 1)", { "mp.full", "positive" } },
      { "mp.rand{0}", { "mp.rand", "positive" } },
      { "mp.randn{-1}", { "mp.randn", "positive" } },
      { "mp.randn(0)", { "mp.randn", "positive" } },
    }
  end)

  it("too many dims", function()
    cases {
      { "mp.zeros{1,1,1,1,1,1,1,1,1}", { "mp.zeros", "8" } },
      { "mp.ones{1,1,1,1,1,1,1,1,1,1,1,1}", { "mp.ones", "8" } },
      { "mp.randn{1,1,1,1,1,1,1,1,1}", { "mp.randn", "8" } },
      { "mp.tensor{{{{{{{{{1}}}}}}}}}", { "mp.tensor", "8" } },
      { "mp.ones{2}:reshape{1,1,1,1,1,1,1,1,2}", { "reshape", "8" } },
      { "mp.ones{2}:view(1,1,1,1,1,1,1,1,2)", { "view", "8" } },
      -- a shape whose length does not fit an int is not a short shape
      { "mp.zeros(setmetatable({3, 4}, {__len = function() return (1 << 32) + 2 end}))", { "mp.zeros", "8" } },
      { "mp.ones{12}:reshape(setmetatable({3, 4}, {__len = function() return (1 << 32) + 2 end}))",
        { "reshape", "8" } },
    }
  end)

  it("dims out of range: 0, ndim+1, -ndim-1 and huge", function()
    local list = {}
    local calls = {
      size = "t:size(%s)", sum = "t:sum(%s)", mean = "t:mean(%s)", max = "t:max(%s)",
      argmax = "t:argmax(%s)", transpose = "t:transpose(%s, 1)", transpose2 = "t:transpose(1, %s)",
      narrow = "t:narrow(%s, 1, 1)",
    }
    for name, fmt in pairs(calls) do
      local fname = name:gsub("%d$", "")
      for _, d in ipairs { "0", "3", "-3", "4294967297", "-4294967297", "math.mininteger" } do
        list[#list + 1] = { "local t = mp.ones{2,3}; return " .. fmt:format(d), { fname, "dim" } }
      end
    end
    -- 0-d and 1-d tensors
    list[#list + 1] = { "return mp.tensor(5):sum(1)", { "sum", "dim" } }
    list[#list + 1] = { "return mp.tensor(5):size(1)", { "size", "dim" } }
    list[#list + 1] = { "return mp.ones{4}:max(2)", { "max", "dim" } }
    list[#list + 1] = { "return mp.ones{4}:transpose(1, -2)", { "transpose", "dim" } }
    list[#list + 1] = { "return mp.ones{2,3}:argmax(3)", { "argmax", "dim" } }
    cases(list)
  end)

  it("unknown dtype and device names and option keys", function()
    cases {
      { "mp.zeros({2}, {dtype='f128'})", { "mp.zeros", "unknown dtype", "f32", "f64" } },
      { "mp.zeros({2}, {dtype='float128'})", { "mp.zeros", "unknown dtype" } },
      { "mp.zeros({2}, {dtype=''})", { "mp.zeros", "unknown dtype" } },
      { "mp.ones({2}, {dtype='int64'})", { "mp.ones", "unknown dtype" } },
      { "mp.full({2}, 1, {dtype='q8'})", { "mp.full", "unknown dtype" } },
      { "mp.tensor({2}, {dtype='long double'})", { "mp.tensor", "unknown dtype" } },
      { "mp.rand({2}, {dtype='i64'})", { "mp.rand", "unknown dtype" } },
      { "mp.randn({2}, {dtype='f8'})", { "mp.randn", "unknown dtype" } },
      { "mp.arange(3, {dtype='int64'})", { "mp.arange", "unknown dtype" } },
      { "mp.zeros({2}, {device='tpu'})", { "mp.zeros", "unknown device", "cpu" } },
      { "mp.tensor({2}, {device='gpu'})", { "mp.tensor", "unknown device" } },
      { "mp.arange(3, {device='npu'})", { "mp.arange", "unknown device" } },
      { "mp.set_default_device('tpu')", { "mp.set_default_device", "unknown device" } },
      { "mp.ones{2}:to('f8')", { "to", "f8", "dtype" } },
      { "mp.ones{2}:to('tpu')", { "to", "tpu", "device" } },
      { "mp.ones{2}:to('f16', 'tpu')", { "to", "tpu" } },
      { "mp.ones{2}:to('')", { "to", "dtype" } },
      { "mp.zeros({2}, {dtypo='f16'})", { "mp.zeros", "unknown option", "dtypo" } },
      { "mp.ones({2}, {devices='cpu'})", { "mp.ones", "unknown option", "devices" } },
      { "mp.full({2}, 1, {value=3})", { "mp.full", "unknown option", "value" } },
      { "mp.tensor({2}, {type='f16'})", { "mp.tensor", "unknown option", "type" } },
      { "mp.rand({2}, {seed=1})", { "mp.rand", "unknown option", "seed" } },
      { "mp.randn({2}, {shape=1})", { "mp.randn", "unknown option", "shape" } },
      { "mp.arange(3, {step=2})", { "mp.arange", "unknown option", "step" } },
      { "mp.zeros({2}, {'f16'})", { "mp.zeros", "unknown option" } },
    }
  end)

  it("CUDA is reported as not available where it is not (and works where it is)", function()
    if mp.cuda.is_available() then   -- a GPU machine: the same calls succeed
      assert.are.equal("number", math.type(mp.cuda.memory().in_use) and "number")
      mp.cuda.synchronize()
      for _, f in ipairs { mp.zeros, mp.ones, mp.randn } do assert.are.equal("cuda", f({ 2 }, { device = "cuda" }).device) end
      assert.are.equal("cuda", mp.tensor({ 2 }, { device = "cuda" }).device)
      assert.are.equal("cuda", mp.ones { 2 }:cuda().device)
      assert.are.equal("cuda", mp.ones { 2 }:to("cuda").device)
      assert.are.equal("f16", mp.ones { 2 }:to("f16", "cuda").dtype)
      return
    end
    cases {
      { "mp.cuda.memory()", { "mp.cuda.memory", "not available" } },
      { "mp.cuda.synchronize()", { "mp.cuda.synchronize", "not available" } },
      { "mp.zeros({2}, {device='cuda'})", { "mp.zeros", "not available" } },
      { "mp.ones({2}, {device='cuda'})", { "mp.ones", "not available" } },
      { "mp.tensor({2}, {device='cuda'})", { "mp.tensor", "not available" } },
      { "mp.randn({2}, {device='cuda'})", { "mp.randn", "not available" } },
      { "mp.ones{2}:cuda()", { "cuda", "not available" } },
      { "mp.ones{2}:to('cuda')", { "to", "not available" } },
      { "mp.ones{2}:to('f16', 'cuda')", { "to", "not available" } },
      { "mp.set_default_device('cuda')", { "mp.set_default_device", "not available" } },
    }
  end)

  it("shape mismatches in + - * /", function()
    local list = {}
    for op, name in pairs { ["+"] = "add", ["-"] = "sub", ["*"] = "mul", ["/"] = "div" } do
      for _, sh in ipairs { { "{2,3}", "{3,2}" }, { "{2,3}", "{2}" }, { "{4}", "{3}" }, { "{2,1,3}", "{4,2}" },
                            { "{5,2}", "{2,5,4}" } } do
        list[#list + 1] = { ("return mp.ones%s %s mp.ones%s"):format(sh[1], op, sh[2]),
                            { name, "broadcast", sh[1], sh[2] } }
      end
      list[#list + 1] = { ("return mp.ones({2,3}, {dtype='f16'}) %s mp.ones({3,3}, {dtype='i32'})"):format(op),
                          { name, "broadcast" } }
    end
    cases(list)
  end)

  it("bad matmul operands", function()
    cases {
      { "mp.matmul(mp.ones{2,3}, mp.ones{4,5})", { "mp.matmul", "{2,3}", "{4,5}", "3 vs 4" } },
      { "mp.ones{2,3}:matmul(mp.ones{2,3})", { "matmul", "match" } },
      { "mp.matmul(mp.ones{3}, mp.ones{4})", { "matmul", "match" } },
      { "mp.matmul(mp.ones{2,3}, mp.ones{2})", { "matmul", "match" } },
      { "mp.matmul(mp.ones{4}, mp.ones{2,3})", { "matmul", "match" } },
      { "mp.matmul(mp.ones{2,2,3}, mp.ones{3,3,5})", { "matmul", "batch", "broadcast", "2 vs 3" } },
      { "mp.matmul(mp.ones{4,1,2,3}, mp.ones{2,3,3,5})", { "matmul", "batch", "broadcast", "4 vs 2" } },
      { "mp.matmul(mp.ones{2,2,3}, mp.ones{2,4,5})", { "matmul", "match" } },
      { "mp.matmul(mp.ones{1,2,2,3}, mp.ones{4,5})", { "matmul", "3 vs 4" } },
      { "mp.matmul(mp.tensor(2), mp.ones{1})", { "matmul", "0-d" } },
      { "mp.matmul(mp.ones{2,3}, mp.ones({3,5},{dtype='f16'}))", { "matmul", "f32", "f16" } },
      { "mp.matmul(mp.ones({2,3},{dtype='bf16'}), mp.ones({3,5},{dtype='f16'}))", { "matmul", "bf16", "f16" } },
      { "mp.matmul(mp.ones({2,3},{dtype='i32'}), mp.ones({3,5},{dtype='i32'}))", { "matmul", "float", "i32" } },
      { "mp.matmul(mp.ones({2,3},{dtype='u8'}), mp.ones({3,5},{dtype='u8'}))", { "matmul", "float", "u8" } },
    }
  end)

  it("narrow out of range", function()
    cases {
      { "mp.ones{4,3}:narrow(1, 0, 1)", { "narrow", "start", "out of range" } },
      { "mp.ones{4,3}:narrow(1, -1, 1)", { "narrow", "start", "out of range" } },
      { "mp.ones{4,3}:narrow(1, 5, 1)", { "narrow", "start", "out of range" } },
      { "mp.ones{4,3}:narrow(2, 4, 1)", { "narrow", "start", "out of range" } },
      { "mp.ones{4,3}:narrow(1, 2, 4)", { "narrow", "length", "out of range" } },
      { "mp.ones{4,3}:narrow(2, 1, 4)", { "narrow", "length", "out of range" } },
      { "mp.ones{4,3}:narrow(1, 1, 0)", { "narrow", "length", "out of range" } },
      { "mp.ones{4,3}:narrow(2, 1, -1)", { "narrow", "length", "out of range" } },
      { "mp.ones{4,3}:narrow(1, 2, math.maxinteger)", { "narrow", "length", "out of range" } },
      { "mp.ones{4,3}:narrow(2, 3, math.maxinteger)", { "narrow", "length", "out of range" } },
      { "mp.ones{4,3}:narrow(1, math.maxinteger, 1)", { "narrow", "start", "out of range" } },
      { "mp.ones{4,3}:narrow(1, math.mininteger, 2)", { "narrow", "start", "out of range" } },
    }
  end)

  it("reshape to a different element count, two -1, zero or negative sizes", function()
    cases {
      { "mp.ones{2,3}:reshape{4}", { "reshape", "{2,3}", "{4}" } },
      { "mp.ones{2,3}:reshape{7}", { "reshape", "6 elements" } },
      { "mp.ones{2,3}:reshape(4, -1)", { "reshape", "cannot reshape" } },
      { "mp.ones{2,3}:reshape{-1, -1}", { "reshape", "-1" } },
      { "mp.ones{2,3}:view{-1, 3, -1}", { "view", "-1" } },
      { "mp.ones{2,3}:reshape{0, 6}", { "reshape", "positive" } },
      { "mp.ones{2,3}:reshape{-2, -3}", { "reshape", "positive" } },
      { "mp.ones{2,3}:reshape{}", { "reshape", "cannot reshape" } },
      { "mp.ones{2,3}:reshape(3, math.maxinteger)", { "reshape", "cannot reshape" } },
      { "mp.ones{8}:reshape(4, (1 << 62) + 2)", { "reshape", "cannot reshape" } },
    }
  end)

  it("item() on anything but one element", function()
    cases {
      { "mp.ones{2}:item()", { "item", "2 elements" } },
      { "mp.ones{2,3}:item()", { "item", "6 elements" } },
      { "mp.ones({3},{dtype='i32'}):item()", { "item", "element" } },
    }
  end)

  it("random values in an integer dtype", function()
    cases {
      { "mp.rand({2}, {dtype='i32'})", { "mp.rand", "float" } },
      { "mp.randn({2}, {dtype='u8'})", { "mp.randn", "float" } },
    }
  end)

  it("mp.arange of non-positive n or beyond u8", function()
    cases {
      { "mp.arange(0)", { "mp.arange", "positive" } },
      { "mp.arange(-3)", { "mp.arange", "positive" } },
      { "mp.arange(math.mininteger)", { "mp.arange", "positive" } },
      { "mp.arange(257, {dtype='u8'})", { "mp.arange", "u8" } },
    }
  end)

  it("allocations too large to satisfy raise 'out of memory'", function()
    cases {
      { "mp.zeros{1e6, 1e6}", { "mp.zeros", "out of memory" } },
      { "mp.ones({1e6, 1e6}, {dtype='f16'})", { "mp.ones", "out of memory" } },
      { "mp.full({1e6, 1e6}, 3)", { "mp.full", "out of memory" } },
      { "mp.rand{1e6, 1e6}", { "mp.rand", "out of memory" } },
      { "mp.randn{1e6, 1e6}", { "mp.randn", "out of memory" } },
      { "mp.zeros{math.maxinteger}", { "mp.zeros", "out of memory" } },
      { "mp.zeros{2^31, 2^31, 2^31}", { "mp.zeros", "out of memory" } },
      { "mp.zeros{65536, 65536, 65536, 65536}", { "mp.zeros", "out of memory" } },
      { "mp.arange(1000000000000)", { "mp.arange", "out of memory" } },
    }
  end)

  it("out of memory leaves the engine usable and leaks nothing", function()
    collectgarbage()
    local before = mp.memory()
    for _ = 1, 3 do
      H.raises(function() return mp.zeros { 1e6, 1e6 } end, { "out of memory" })
    end
    local after = mp.memory()
    assert.are.equal(before.in_use, after.in_use)
    assert.are.equal(before.storages, after.storages)
    assert.are.same({ 1, 1 }, mp.ones { 2 }:totable())
  end)

  it("use after free raises a clear error for every method", function()
    local list = {}
    local names = {}
    for name in pairs(mp.Tensor) do if name ~= "free" then names[#names + 1] = name end end
    table.sort(names)
    for _, name in ipairs(names) do
      list[#list + 1] = { "local t = mp.ones{2,2}; t:free(); return t:" .. name .. "(1, 1, 1)", { "freed" } }
    end
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return t + 1", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return 1 - t", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return mp.ones{2} * t", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return t / t", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return -t", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return t.shape", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return t.dtype", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return t.device", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2,2}; t:free(); return mp.matmul(t, t)", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2,2}; t:free(); return mp.matmul(mp.ones{2,2}, t)", { "freed" } }
    list[#list + 1] = { "local t = mp.ones{2}; t:free(); return mp.tensor(t)", { "freed" } }
    cases(list)
  end)

  it("double free raises, and free of a view leaves the source alive", function()
    cases {
      { "local t = mp.ones{2}; t:free(); t:free()", { "free", "already freed" } },
      { "local t = mp.ones{2}; local v = t:reshape{2,1}; t:free(); v:free(); t:free()", { "already freed" } },
    }
    local t = mp.tensor { 1, 2, 3, 4 }
    local v = t:reshape { 2, 2 }
    v:free()
    assert.are.same({ 1, 2, 3, 4 }, t:totable())
  end)

  it("use after free does not crash: tostring, ==, <close> and __gc after free", function()
    local r = H.child([[
      local t = mp.ones{2}
      t:free()
      local s = tostring(t)
      local same = (t == t)
      do local u <close> = mp.ones{3}; u:free() end
      local w = mp.ones{4}; w:free(); w = nil
      collectgarbage(); collectgarbage()
      return s .. "|" .. tostring(same)
    ]])
    assert.is_nil(r.signal, "killed by signal " .. tostring(r.signal))
    assert.are.equal(0, r.rc, r.out .. r.err)
    local s = r.out:match("^OK:(.*)$")
    assert.is_truthy(s, r.out)
    assert.is_truthy(s:lower():find("freed", 1, true), "tostring of a freed tensor is " .. s)
  end)

  it("bad calls leave no engine memory behind", function()
    collectgarbage()
    local before = mp.memory().in_use
    for _ = 1, 20 do
      pcall(function() return mp.ones { 2, 3 } + mp.ones { 3, 2 } end)
      pcall(function() return mp.matmul(mp.ones { 2, 3 }, mp.ones { 4, 5 }) end)
      pcall(function() return mp.tensor { { 1, 2 }, { 3 } } end)
      pcall(function() return mp.tensor({ 1, 2 }, { dtype = "x" }) end)
      pcall(function() return mp.ones { 2, 3 }:narrow(1, 1, 5) end)
      pcall(function() return mp.ones { 2, 3 }:reshape { 5 } end)
    end
    collectgarbage()
    collectgarbage()
    assert.are.equal(before, mp.memory().in_use)
  end)

  it("metamethods called directly with junk raise errors", function()
    local list = {}
    -- (__eq is left out: like Lua's own equality it answers false for non-tensors)
    for _, k in ipairs { "__gc", "__close", "__tostring", "__add", "__sub", "__mul", "__div", "__unm" } do
      for _, args in ipairs { "5", "nil, nil", "{}, 'x'", "io.stdout, io.stdout" } do
        list[#list + 1] = { "return getmetatable(mp.ones{1})." .. k .. "(" .. args .. ")", {} }
      end
    end
    cases(list)
  end)

  it("__eq answers false for anything that is not the same tensor", function()
    local t = mp.ones{1}
    local eq = getmetatable(t).__eq
    assert.is_false(eq(5))
    assert.is_false(eq(nil, nil))
    assert.is_false(eq({}, "x"))
    assert.is_false(eq(io.stdout, io.stdout))
    assert.is_false(t == mp.ones{1})
    assert.is_true(eq(t, t))
  end)

  it("a script that used the threaded kernels exits normally (no crash in lua_close)", function()
    -- With OpenMP threads (OMP_NUM_THREADS=2, as a user sets it for more speed), 1 MiB
    -- fills and adds take the parallel path; the process then exits through lua_close,
    -- which unloads mp/core.so and the libraries it brought in. Repeated because the
    -- crash, where present, is intermittent.
    local crashes, last, runs = 0, nil, 0
    local script = "local mp = require 'mp'\nlocal t = mp.zeros{262144} + 1\nprint(t:sum():item())\n"
    for _, env in ipairs { { OMP_NUM_THREADS = "2" }, {} } do
      for _ = 1, (env.OMP_NUM_THREADS and 60 or 10) do
        runs = runs + 1
        local r = H.child(script, true, env)
        if r.signal then crashes, last = crashes + 1, r end
      end
    end
    assert.are.equal(0, crashes, crashes .. " of " .. runs .. " runs of a plain script died with signal "
                                 .. tostring(last and last.signal) .. " at exit")
  end)

end)
