-- anomaly_spec.lua: mp.autograd.detect_anomaly (PyTorch's detect_anomaly): the
-- first backward op that turns a finite gradient into inf or NaN raises,
-- naming the op and the script line of its forward; off, nothing is checked
-- and the inf flows on; the guard restores the mode it found.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local function leaf(values) return mp.tensor(values, { requires_grad = true }) end
local function line() return "anomaly_spec.lua:" .. debug.getinfo(2, "l").currentline end

describe("mp.autograd.detect_anomaly", function()
  it("raises at log(0)'s backward, naming the op and the line of its forward", function()
    local _ <close> = mp.autograd.detect_anomaly()
    local a = leaf({ 0, 1 })
    local y, where = a:log(), line()
    local l = (y + 1):sum()
    H.raises(function() l:backward() end,
      { "Tensor:backward", "anomaly", "backward of log", "forward at ", where, "produced inf from finite inputs" })
  end)

  it("tells NaN: 0 * inf in sqrt(0)'s backward", function()
    local _ <close> = mp.autograd.detect_anomaly()
    local a = leaf({ 0, 4 })
    local s, where = a:sqrt(), line()
    local l = (s * 0):sum()   -- sqrt's node gets a zero gradient: 0 / (2 sqrt(0)) is NaN
    H.raises(function() l:backward() end, { "backward of sqrt", where, "produced NaN" })
  end)

  it("names the script's line when the op ran inside the mp library (nn.Linear)", function()
    local _ <close> = mp.autograd.detect_anomaly()
    local lin = mp.nn.Linear(2, 1)
    do
      local _ <close> = mp.no_grad()
      lin.weight:copy_(mp.tensor({ { math.huge, 1 } }))
    end
    local x = leaf({ { 1, 2 } })
    local y, where = lin(x), line()
    local msg = H.raises(function() y:sum():backward() end, { "anomaly", "forward at ", where })
    assert.is_nil(msg:find("/mp/", 1, true), msg)
  end)

  it("raises in mp.autograd.grad too", function()
    local _ <close> = mp.autograd.detect_anomaly()
    local a = leaf({ 0 })
    local l = a:log():sum()
    H.raises(function() mp.autograd.grad(l, a) end, { "mp.autograd.grad", "backward of log" })
  end)

  it("raises nothing for a finite run, and does not blame an op for a non-finite gradient it was given", function()
    local _ <close> = mp.autograd.detect_anomaly()
    local a = leaf({ 1, 2 })
    local l = (a:log() * a):sum()
    l:backward()
    H.assert_close(a.grad:totable(), { 1, math.log(2) + 1 }, 1e-6, 1e-6)
    local b = leaf({ 1, 2 })
    local y = b * 2
    y:backward(mp.tensor({ math.huge, 1 }))   -- inf came in: not mul's doing
    assert.are.equal(math.huge, b.grad:totable()[1])
  end)

  it("off: no error, and the inf propagates into .grad", function()
    assert.is_false(mp.autograd.is_anomaly_enabled())
    local a = leaf({ 0, 1 })
    local l = a:log():sum()
    l:backward()
    assert.are.equal(math.huge, a.grad:totable()[1])
  end)

  it("a graph recorded before the mode raises without a line, saying why", function()
    local a = leaf({ 0 })
    local l = a:log():sum()
    local _ <close> = mp.autograd.detect_anomaly()
    H.raises(function() l:backward() end, { "backward of log", "before anomaly mode was on" })
  end)

  it("the guard restores the mode it found; set_detect_anomaly returns the previous one", function()
    assert.is_false(mp.autograd.is_anomaly_enabled())
    do
      local _ <close> = mp.autograd.detect_anomaly()
      assert.is_true(mp.autograd.is_anomaly_enabled())
      do
        local _ <close> = mp.autograd.detect_anomaly()
      end
      assert.is_true(mp.autograd.is_anomaly_enabled(), "the inner guard leaves the outer's mode")
    end
    assert.is_false(mp.autograd.is_anomaly_enabled())
    local g = mp.autograd.detect_anomaly()
    g:close()
    g:close()
    assert.is_false(mp.autograd.is_anomaly_enabled())
    assert.is_false(mp.autograd.set_detect_anomaly(true))
    assert.is_true(mp.autograd.set_detect_anomaly(false))
    assert.is_false(mp.autograd.is_anomaly_enabled())
    H.raises(function() mp.autograd.set_detect_anomaly(1) end,
      { "mp.autograd.set_detect_anomaly", "boolean", "number" })
  end)

  it("a failed check frees the graph's memory like any failed backward", function()
    local function in_use() collectgarbage(); collectgarbage(); return mp.memory().in_use end
    local before = in_use()
    do
      local _ <close> = mp.autograd.detect_anomaly()
      local a = mp.tensor({ 0, 1, 2, 3 }, { requires_grad = true })
      local l = (a:log() * mp.randn({ 4 })):sum()
      H.raises(function() l:backward() end, { "anomaly" })
      a:free(); l:free()
    end
    assert.are.equal(before, in_use())
  end)
end)
