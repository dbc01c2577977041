-- cross_entropy_lowp_spec.lua: mp.cross_entropy under autocast takes f16/bf16
-- logits as they are (its kernels widen them and sum in f32: the op's
-- widens_itself, engine/op.h) instead of an f32 copy, and gives their gradient
-- in their dtype: the loss and the gradient of the f32 cast it replaced, bit
-- for bit (CUDA's forward sums a 16-bit row in its f32 cast's order), and no
-- {rows, vocab} f32 tensor is made, forward or backward. On the default device.
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function case(low, rows, vocab)
  mp.manual_seed(4)
  local logits = (mp.randn { rows, vocab } * 3):to(low):requires_grad(true)
  local y = mp.randint(0, vocab, { rows }, { dtype = "i32" })
  return logits, y
end

describe("mp.cross_entropy under autocast", function()
  -- vocab 52: whole runs of 4 (CUDA's vector loads); 50: a partial run
  for _, low in ipairs { "f16", "bf16" } do
    for _, vocab in ipairs { 52, 50 } do
    it(("%s logits, vocab %d: the f32 cast's loss and gradient, the gradient in %s"):format(low, vocab, low), function()
      local logits, y = case(low, 24, vocab)
      local loss
      do
        local _ <close> = mp.amp.autocast(low)
        loss = mp.cross_entropy(logits, y)
      end
      assert.are.equal("f32", loss.dtype)
      loss:backward()
      local got = logits.grad
      logits.grad = nil
      local want_loss = mp.cross_entropy(logits:f32(), y)   -- the cast autocast made before
      want_loss:backward()
      assert.are.equal(low, got.dtype)
      local g, w = H.flat(got:f32():totable()), H.flat(logits.grad:f32():totable())
      assert.are.equal(want_loss:item(), loss:item())
      H.assert_same(g, w, "dlogits")
    end)
    end
  end

  it("makes no f32 copy of the logits, forward or backward", function()
    local rows, vocab = 256, 2048   -- f16 logits 1 MiB; an f32 copy 2 MiB
    local logits, y = case("f16", rows, vocab)
    local dev = mp.default_device()
    collectgarbage()
    local before = mp.memory(dev).in_use
    mp.reset_peak_memory(dev)
    do
      local _ <close> = mp.amp.autocast("f16")
      mp.cross_entropy(logits, y):backward()
    end
    local grown = mp.memory(dev).peak - before
    -- at most two f16 {rows, vocab} tensors (the kernel's gradient and the
    -- leaf's .grad, 1 MiB each) and the rows' statistics: an f32 copy would
    -- add 2 MiB (before this change the peak grew by 5 MiB: the cast and its
    -- f32 gradient)
    local f16_size = rows * vocab * 2
    assert(grown <= 2 * f16_size + 65536, string.format("the peak grew by %d bytes (two f16 copies are %d, an f32 "
                                                        .. "copy %d)", grown, 2 * f16_size, 2 * f16_size))
    assert(grown >= f16_size, "the f16 gradient is counted: " .. grown)
  end)
end)
