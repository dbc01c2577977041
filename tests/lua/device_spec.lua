-- device_spec.lua: what a script sees when the CUDA device cannot be had, or
-- fails: mp.cuda.is_available() says why not (no driver, the loader's own words
-- about a missing library), so does the error of t:cuda(); and after a device
-- fault every read of device memory by the host (item, totable, tostring, a copy
-- to the cpu, the scaler's state, the optimizer's step count) raises the device's
-- error instead of returning whatever bytes the failed copy left.
--
-- The faults are planted in build/tests/fake_cuda.so (tests/device/fake_cuda.c),
-- the CPU-backed test double of the CUDA backend, in child processes.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/device_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local FAKE = H.build .. "/tests/fake_cuda.so"
local MISSING_DEP = H.build .. "/tests/missing_dep.so"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- runs `code` in a child on the fake device; env: more variables
local function on_fake(code, env)
  local vars = { MP_CUDA_BACKEND = FAKE, MP_DEVICE = "cuda" }
  for k, v in pairs(env or {}) do vars[k] = v end
  return H.child(code, false, vars)
end

describe("the CUDA device", function()
  it("is_available() gives false and why, and t:cuda() says the same", function()
    local r = H.child([[
      local ok, why = mp.cuda.is_available()
      local _, err = pcall(function() return mp.ones{2}:cuda() end)
      return tostring(ok) .. "|" .. tostring(why) .. "|" .. err]], false,
      { MP_CUDA_BACKEND = "/nonexistent/dir/cuda.so" })
    local ok, why, err = r.out:match("^OK:(%a+)|([^|]*)|(.*)$")
    assert.are.equal("false", ok, r.out .. r.err)
    assert.truthy(why:find("cannot load MP_CUDA_BACKEND=/nonexistent/dir/cuda.so", 1, true), why)
    assert.truthy(why:find("No such file", 1, true), why)   -- dlerror()'s words
    assert.truthy(err:find("Tensor:cuda: device 'cuda' is not available on this machine: " .. why, 1, true), err)
  end)

  it("names the library a backend that does not load is missing", function()
    assert(exists(MISSING_DEP), MISSING_DEP .. " is not built (make test builds it)")
    local r = H.child("return select(2, mp.cuda.is_available())", false, { MP_CUDA_BACKEND = MISSING_DEP })
    assert.truthy(r.out:find("libmp_gone.so: cannot open shared object file", 1, true), r.out .. r.err)
  end)

  it("says MP_NO_CUDA turned it off", function()
    local r = H.child("return select(2, mp.cuda.is_available())", false, { MP_NO_CUDA = "1", MP_CUDA_BACKEND = FAKE })
    assert.are.equal("OK:MP_NO_CUDA is set", r.out, r.err)
  end)

  it("without a driver: says so, unless a backend is named", function()
    local avail, why = mp.cuda.is_available()
    if avail or os.getenv("MP_CUDA_BACKEND") then return pending("this process has a CUDA device") end
    local f = io.open("/dev/nvidiactl", "rb")
    if f then f:close() return pending("an NVIDIA driver is installed") end
    assert.truthy(why:find("no NVIDIA driver", 1, true), why)
  end)
end)

describe("after a device fault", function()
  setup(function() assert(exists(FAKE), FAKE .. " is not built (make test builds it)") end)

  it("the fake device works until the fault", function()
    local r = on_fake([[
      local t = mp.tensor({1.5, -2, 3})
      return t.device .. " " .. table.concat(t:totable(), ",") .. " " .. (t * 2):sum():item()]])
    assert.are.equal("OK:cuda 1.5,-2.0,3.0 5.0", r.out, r.err)
  end)

  -- every host read of device memory, each in a child where the first copy to the host faults
  local reads = {
    { "item", "return mp.tensor({7}):item()", "Tensor:item" },
    { "totable", "return mp.ones{2, 3}:totable()", "Tensor:totable" },
    { "tostring", "return tostring(mp.ones{4})", "tostring" },
    { "a copy to the cpu", "return mp.ones{4}:cpu()", "Tensor:cpu" },
    { "to('cpu', dtype)", "return mp.ones{4}:to('cpu', 'f16')", "Tensor:to" },
    { "the optimizer's step count", [[
      local p = mp.randn{3}:requires_grad(true)
      local opt = mp.optim.SGD({p}, {lr = 0.1})
      return opt.step_count]], "step_count" },
    { "the scaler's state", [[
      local s = mp.amp.GradScaler{}
      local p = mp.randn{3}:requires_grad(true)
      local opt = mp.optim.SGD({p}, {lr = 0.1})
      s:scale((p * p):sum()):backward()
      s:step(opt)
      return s:get_scale()]], "GradScaler" },
    { "mp.cuda.synchronize after it", "pcall(function() return mp.ones{1}:item() end); mp.cuda.synchronize()",
      "mp.cuda.synchronize" },
    { "a new op after it", "pcall(function() return mp.ones{1}:item() end); return mp.ones{2} * 2", "mp.ones" },
  }
  for _, c in ipairs(reads) do
    it(c[1] .. " raises the device's error, never returns the bytes", function()
      local r = on_fake(c[2], { MP_FAKE_CUDA_FAULT = "1" })
      assert.is_nil(r.signal, r.err)
      local msg = r.out:match("^ERR:(.*)$")
      assert(msg, c[1] .. " returned " .. r.out .. " after the fault")
      assert.truthy(msg:find("fake device fault", 1, true), msg)
      assert.truthy(msg:find(c[3], 1, true), msg)
    end)
  end

  it("a fault after some good reads: the good values, then the error, then the error again", function()
    local r = on_fake([[
      local t = mp.tensor({3})
      local got = {t:item(), t:item()}
      local ok1, e1 = pcall(t.item, t)
      local ok2, e2 = pcall(t.totable, t)
      return table.concat(got, ",") .. "|" .. tostring(ok1) .. "|" .. tostring(ok2) .. "|" .. e1 .. "|" .. e2]],
      { MP_FAKE_CUDA_FAULT = "3" })
    local good, ok1, ok2, e1, e2 = r.out:match("^OK:([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$")
    assert.are.equal("3.0,3.0", good, r.out .. r.err)
    assert.are.equal("false", ok1)
    assert.are.equal("false", ok2)
    assert.truthy(e1:find("fake device fault", 1, true), e1)
    assert.truthy(e2:find("fake device fault", 1, true), e2)
  end)

  it("a bad index found on the device is raised with the CPU's message, and the op left out", function()
    local r = on_fake([[
      local logits = mp.randn{2, 3}
      local ok, err = pcall(mp.cross_entropy, logits, mp.tensor({0, 5}, {dtype = "i32"}))
      local fine = mp.cross_entropy(logits, mp.tensor({0, 2}, {dtype = "i32"})):item()
      return tostring(ok) .. "|" .. err .. "|" .. tostring(fine == fine)]])
    local ok, err, after = r.out:match("^OK:([^|]*)|([^|]*)|(.*)$")
    assert.are.equal("false", ok, r.out .. r.err)
    assert.truthy(err:find("mp.cross_entropy: target: 5 at position 2 out of range [0, 3)", 1, true), err)
    assert.are.equal("true", after)   -- the device goes on after a reported index error
  end)
end)

-- A backend may decline an op in a dtype (kernels/backend.h: supports); the
-- fake device declines what MP_FAKE_CUDA_DECLINE lists. The engine asks before
-- every op and raises an error naming op, dtype and device; other ops and
-- dtypes run, and so does the same op on the CPU.
describe("an op the backend declines", function()
  it("is an error naming the op, the dtype and the device", function()
    if not exists(FAKE) then return pending("no fake device built") end
    local r = on_fake([[
      local x = mp.randn({ 3, 4 }, { device = "cuda" }):to("f16")
      local ok, err = pcall(mp.silu, x)
      assert(not ok, "declined op ran")
      local y = mp.silu(x:to("f32"))             -- f32: not declined
      local z = mp.silu(x:to("cpu"))             -- the CPU runs it in f16
      local w = mp.softmax(x, 2)                 -- another op in f16: runs
      return err .. "|" .. y.dtype .. "|" .. z.dtype .. "|" .. w.device
    ]], { MP_FAKE_CUDA_DECLINE = "softmax:bf16,silu:f16" })
    assert.are.equal(0, r.rc, r.out .. r.err)
    local err, y, z, w = r.out:match("^OK:(.*)|(.*)|(.*)|(.*)$")
    assert.truthy(err, r.out)
    assert.truthy(err:find("mp.silu: silu is not available for f16 tensors on cuda", 1, true), err)
    assert.are.same({ "f32", "f16", "cuda" }, { y, z, w })
  end)

  -- an op's description names the entries it calls (engine/op.h: needs); a
  -- backend without one of them declines the op with the same error, before
  -- any work (MP_FAKE_CUDA_WITHOUT leaves those entries of the table NULL)
  it("is an error when the backend lacks an entry the op needs", function()
    if not exists(FAKE) then return pending("no fake device built") end
    local r = on_fake([[
      local x = mp.randn({ 1, 2, 5, 5 }, { device = "cuda" })
      local errs = {}
      for _, f in ipairs({
        function() return mp.conv2d(x, mp.randn({ 3, 2, 3, 3 }, { device = "cuda" })) end,
        function() return mp.max_pool2d(x, 2) end,
        function() return x:sort(4) end,
        function() return x:topk(2) end,
      }) do
        local ok, err = pcall(f)
        errs[#errs + 1] = ok and "ran" or err
      end
      local y = mp.avg_pool2d(x, 2)              -- its entries are there: runs
      local z = mp.conv2d(x:to("cpu"), mp.randn({ 3, 2, 3, 3 }, { device = "cpu" }))   -- the CPU has conv2d
      return table.concat(errs, "|") .. "|" .. y.device .. "|" .. z.device
    ]], { MP_FAKE_CUDA_WITHOUT = "conv2d,max_pool2d_grad,topk" })
    assert.are.equal(0, r.rc, r.out .. r.err)
    local got = r.out:match("^OK:(.*)$")
    assert.truthy(got, r.out .. r.err)
    local parts = {}
    for p in (got .. "|"):gmatch("([^|]*)|") do parts[#parts + 1] = p end
    for i, op in ipairs({ "conv2d", "max_pool2d", "sort", "topk" }) do
      assert.truthy(parts[i]:find(op .. " is not available for f32 tensors on cuda (the backend declines it)", 1, true),
        parts[i])
    end
    assert.are.same({ "cuda", "cpu" }, { parts[5], parts[6] })
  end)
end)
