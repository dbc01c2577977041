-- narrow_grad_spec.lua: a narrow's gradient added in place into its input's sum.
--
-- chunk(3)'s backward padded each piece's gradient to the input's shape
-- (zeros, then the piece) and added the padded tensors out of place. Now the
-- second and later pieces are added into the sum the input's node already
-- holds (engine/backward.c narrow_into_node, backend narrow_pad): sum + 0
-- outside the slice and sum + g inside, the same additions element by
-- element, so the same bits, the sign of zero included (-0 + 0 is +0 both
-- ways; a lone narrow's -0 stays -0 both ways). mp.autograd.grad takes the old
-- way (its walk declines the shortcut), so the two must agree bit for bit,
-- -0 and +0 told apart.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/narrow_grad_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

-- bit for bit, with -0 and +0 told apart
local function assert_bits(got, want, what)
  local g, w = H.flat(got), H.flat(want)
  assert(#g == #w, what .. ": " .. #g .. " elements, expected " .. #w)
  for i = 1, #w do
    local same = (g[i] == w[i] and (g[i] ~= 0 or 1 / g[i] == 1 / w[i])) or (H.isnan(g[i]) and H.isnan(w[i]))
    if not same then
      error(string.format("%s: element %d is %.17g (1/x %g), expected %.17g (1/x %g)", what, i, g[i], 1 / g[i],
                          w[i], 1 / w[i]), 2)
    end
  end
end

-- weights for the pieces: -0, +0, infinities and ordinary values, so that
-- the gradients hold -0 (1 * -0) where the sums' signs of zero matter
local function weights(shape, dt, seed)
  mp.manual_seed(seed)
  local r = mp.randn(shape)
  local flat = H.flat(r:totable())
  for i = 1, #flat do
    local k = i % 7
    if k == 0 then flat[i] = -0.0 elseif k == 3 then flat[i] = 0.0 elseif k == 5 and i % 3 == 0 then
      flat[i] = (i % 2 == 0) and math.huge or -math.huge
    end
  end
  return mp.tensor(H.nest(flat, shape)):to(dt)
end

-- x's gradient through y = x * 1 and pieces of y (each piece weighted),
-- by backward() (the in-place way) and by mp.autograd.grad (the old way)
local function both_ways(dt, shape, pieces_of, seed)
  mp.manual_seed(seed)
  local x0 = mp.randn(shape):to(dt)
  local function loss(x)
    local y = x * 1
    local total
    for i, p in ipairs(pieces_of(y)) do
      local s = (p * weights(p.shape, dt, seed + i)):f32():sum()
      total = total and total + s or s
    end
    return total
  end
  local x = x0:detach():clone():requires_grad(true)
  loss(x):backward()
  local xr = x0:detach():clone():requires_grad(true)
  local gr = mp.autograd.grad(loss(xr), { xr })[1]
  return x.grad:f32():totable(), gr:f32():totable()
end

describe("a narrow's gradient added into its input's sum in place", function()
  local cases = {
    { "chunk(3) on the last dim", { 4, 5, 12 }, function(y) return { y:chunk(3, 3) } end },
    { "chunk(3) on the middle dim", { 3, 9, 5 }, function(y) return { y:chunk(3, 2) } end },
    { "chunk(2) on the first dim (views)", { 6, 7 }, function(y) return { y:chunk(2, 1) } end },
    { "overlapping narrows", { 5, 11 }, function(y)
      return { y:narrow(2, 1, 6), y:narrow(2, 4, 6), y:narrow(2, 2, 3), y:narrow(2, 11, 1) } end },
    { "narrows taken right to left", { 5, 11 }, function(y)
      local c, b, a = y:narrow(2, 8, 4), y:narrow(2, 4, 4), y:narrow(2, 1, 3)
      return { c, b, a } end },
    { "one narrow (its -0 kept)", { 5, 11 }, function(y) return { y:narrow(2, 3, 4) } end },
    { "a piece used twice", { 4, 9 }, function(y)
      local a, b, c = y:chunk(3, 2)
      return { a, b, c, b } end },
  }
  for _, dt in ipairs { "f32", "bf16", "f16" } do
    for _, c in ipairs(cases) do
      it(dt .. ": " .. c[1] .. " gives the old way's bits", function()
        local got, want = both_ways(dt, c[2], c[3], 3)
        assert_bits(got, want, dt .. " " .. c[1])
      end)
    end
  end

  it("past the thread split (2^16 elements), bf16", function()
    local got, want = both_ways("bf16", { 64, 64, 48 }, function(y) return { y:chunk(3, 3) } end, 9)
    assert_bits(got, want, "bf16 {64,64,48}")
  end)

  it("leaves a hook on the input's sum seeing the whole sum", function()
    local x = mp.randn({ 4, 6 }):requires_grad(true)
    local y = x * 1
    local seen
    y:register_hook(function(g) seen = g:totable() end)
    local a, b, c = y:chunk(3, 2)
    local l = (a * 2):sum() + (b * 3):sum() + (c * 4):sum()
    l:backward()
    for i = 1, 4 do
      assert.are.same({ 2, 2, 3, 3, 4, 4 }, seen[i])
    end
  end)
end)
