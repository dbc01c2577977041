-- regressions_spec.lua: bugs found in review, one test each, so they stay fixed.
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function bits(t)
  local out = {}
  for i, v in ipairs(t:reshape{-1}:totable()) do out[i] = string.pack("<f", v) end
  return table.concat(out)
end

describe("regressions", function()
  it("where with a condition that requires grad gives an integer result no graph", function()
    local c = mp.randn{24}:requires_grad(true)
    local a = mp.ones({24}, {dtype = "u8"})
    local y = mp.where(c, a, a)
    assert.are.equal("u8", y.dtype)
    assert.is_false(y:requires_grad())
    assert.is_nil(y.grad_fn)
    -- a float where still flows into a and b, never into the condition
    local fa, fb = mp.ones{3}:requires_grad(true), mp.zeros{3}:requires_grad(true)
    local cond = mp.tensor{1, -1, 2}:requires_grad(true)
    mp.where(cond:gt(0), fa, fb):sum():backward()
    assert.are.same({1, 0, 1}, fa.grad:totable())
    assert.are.same({0, 1, 0}, fb.grad:totable())
    assert.is_nil(cond.grad)
  end)

  it("a scaler state dict with counters out of range is rejected, not used", function()
    local s = mp.amp.GradScaler{policy = mp.amp.policy.amax{history = 4}}
    for _, field in ipairs{"amax_pos", "tracker", "hysteresis_left"} do
      for _, bad in ipairs{-1000, 0.5, 1e300} do
        local sd = s:state_dict()
        sd[field] = bad
        local ok, err = pcall(s.load_state_dict, s, sd)
        assert.is_false(ok, field .. "=" .. bad)
        assert.is_truthy(tostring(err):find("GradScaler:load_state_dict", 1, true), err)
      end
    end
    local sd = s:state_dict()
    sd.amax_history = {1, 2, 3, 4, 5}   -- longer than history = 4
    assert.has_error(function() s:load_state_dict(sd) end)
  end)

  it("lists given as proxy tables are read safely", function()
    local made = 0
    local proxy = setmetatable({}, {__len = function() return 3 end, __index = function()
      collectgarbage(); made = made + 1; return mp.ones{2, 2} * made end})
    local c = mp.cat(proxy, 1)
    assert.are.same({6, 2}, c.shape)
    assert.are.equal(2 * 2 * (1 + 2 + 3), c:sum():item())
  end)

  it(".grad must be plain data (no reference cycles)", function()
    local t = mp.randn{4}
    assert.has_error(function() t.grad = t end)
    local w = mp.randn{4}:requires_grad(true)
    assert.has_error(function() w.grad = w * 2 end)
    local a, b = mp.randn{4}, mp.randn{4}
    a.grad = b
    assert.has_error(function() b.grad = a end)
    w.grad = mp.ones{4}
    assert.are.same({1, 1, 1, 1}, w.grad:totable())
  end)

  it("one scaler step drives two optimizers, each unscaled once", function()
    local a = mp.tensor({1}, {requires_grad = true})
    local b = mp.tensor({1}, {requires_grad = true})
    local oa, ob = mp.optim.SGD({a}, {lr = 0.1}), mp.optim.SGD({b}, {lr = 0.1})
    local s = mp.amp.GradScaler{policy = mp.amp.policy.static(2^16)}
    s:scale((a + b):sum()):backward()
    assert.is_true(s:step(oa))
    assert.is_true(s:step(ob))
    s:update()
    assert.are.equal(bits(mp.tensor{0.9}), bits(a))
    assert.are.equal(bits(mp.tensor{0.9}), bits(b))
    -- inf in one optimizer's gradients skips only that one
    oa:zero_grad(); ob:zero_grad()
    s:scale((a + b):sum()):backward()
    b.grad = mp.tensor{math.huge}
    assert.is_true(s:step(oa))
    assert.is_false(s:step(ob))
    s:update()
    assert.is_true(math.abs(a:item() - 0.8) < 1e-6, tostring(a:item()))   -- applied
    assert.are.equal(bits(mp.tensor{0.9}), bits(b))                      -- skipped: untouched
  end)

  it("integer tensors compare exactly with fractional or out-of-range numbers", function()
    assert.are.same({1, 0, 0}, mp.tensor({0, 1, 2}, {dtype = "i32"}):lt(0.5):totable())
    assert.are.same({1, 1, 1}, mp.tensor({0, 1, 2}, {dtype = "u8"}):gt(-1):totable())
    assert.are.same({0, 0}, mp.tensor({255, 7}, {dtype = "u8"}):ge(256):totable())
    local w = mp.where(mp.tensor({1, 0}, {dtype = "u8"}), mp.tensor({3, 4}, {dtype = "i32"}), 0.5)
    assert.are.same({3, 0.5}, w:totable())
  end)

  it("autocast casts a master again after an optimizer step inside the region", function()
    local w = mp.tensor({{1}}, {requires_grad = true})
    local opt = mp.optim.SGD({w}, {lr = 0.5})
    local x = mp.tensor{{1}}
    local losses = {}
    local _ <close> = mp.amp.autocast("f16")
    for i = 1, 3 do
      opt:zero_grad()
      local loss = mp.linear(x, w):f32():pow(2):sum()
      losses[i] = loss:item()
      loss:backward()
      opt:step()
    end
    -- w: 1 -> 0 (grad 2w = 2, lr 0.5) -> 0: the loss must follow it
    assert.are.same({1, 0, 0}, losses)
  end)

  it("mp.tensor(t) is a new leaf without t's graph", function()
    local w = mp.randn{3}:requires_grad(true)
    local y = w * 2
    local c = mp.tensor(y)
    assert.is_nil(c.grad_fn)
    assert.is_false(c:requires_grad())
    local d = mp.tensor(y, {requires_grad = true})
    assert.is_true(d.is_leaf and d:requires_grad())
    assert.is_true(mp.is_grad_enabled())
  end)

  it("found by make fuzz: where with an integer tensor and 2^63 makes an f32 result, no undefined cast", function()
    local c = mp.tensor({1, 0}, {dtype = "u8"})
    local a = mp.tensor({1, 2}, {dtype = "i32"})
    local y = mp.where(c, a, 2 ^ 63)
    assert.are.equal("f32", y.dtype)
    assert.are.same({1, 2 ^ 63}, y:totable())
  end)

  it("found by make fuzz: a safetensors header that is not UTF-8 is refused by name", function()
    local path = os.tmpname()
    local hdr = '{"__metadata__":{"k":"\141\187"},"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    local f = assert(io.open(path, "wb"))
    f:write(string.pack("<I8", #hdr), hdr, string.pack("<f", 1))
    f:close()
    H.raises(function() mp.load(path) end, {"mp.load", "UTF-8"})
    os.remove(path)
  end)

  it("found by make fuzz: comparing an integer tensor with -inf, inf or NaN casts nothing undefined", function()
    local a = mp.tensor({1, 2}, {dtype = "i32"})
    assert.are.same({1, 1}, a:gt(-math.huge):totable())
    assert.are.same({0, 0}, a:gt(math.huge):totable())
    assert.are.same({0, 0}, a:eq(0 / 0):totable())
  end)
end)
