-- working_copy_spec.lua: the f16/bf16 working copy of an optimizer's parameters.
--
-- Under autocast a parameter in an optimizer's arena is used through the arena's
-- low-precision copy, which the optimizer step writes in the same pass as the
-- f32 masters (engine/ops_create.c mp_arena_cast, backend optim_step's lowp).
-- Whatever writes the masters, the f16 weights autocast hands to an op must be
-- exactly the masters rounded: after plain steps, after a step the scaler skips,
-- after a copy_ into a parameter, after a switch from f16 to bf16, and for a
-- parameter whose gradient was dropped.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/working_copy_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

-- x @ w^T under autocast against the same product with w rounded by hand
local function check(w, x, dtype, what)
  local got
  do
    local _ <close> = mp.amp.autocast(dtype)
    got = mp.linear(x, w)
  end
  local want
  do
    local _ <close> = mp.no_grad()
    want = mp.linear(x:to(dtype), w:detach():to(dtype))
  end
  H.assert_same(got:f32():totable(), want:f32():totable(), what)
end

local function train_step(w, b, x, opt, scaler, dtype, poison)
  opt:zero_grad()
  local loss
  do
    local _ <close> = mp.amp.autocast(dtype)
    loss = (mp.linear(x, w, b) * mp.linear(x, w, b)):mean()
  end
  if poison then loss = loss * math.huge end
  scaler:scale(loss):backward()
  scaler:step(opt)
  scaler:update()
end

describe("the working copy autocast uses for an optimizer's parameters", function()
  for _, sync in ipairs{true, false} do
    it("is the masters rounded after every kind of write (sync = " .. tostring(sync) .. ")", function()
      mp.manual_seed(3)
      local w = mp.randn({6, 5}, {requires_grad = true})
      local b = mp.randn({6}, {requires_grad = true})
      local x = mp.randn({4, 5})
      local opt = mp.optim.AdamW({w, b}, {lr = 0.05})
      local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{init = 256}, sync = sync}
      check(w, x, "f16", "before any step")
      for i = 1, 3 do
        train_step(w, b, x, opt, scaler, "f16")
        check(w, x, "f16", "after step " .. i)
      end
      local before = w:detach():clone()
      train_step(w, b, x, opt, scaler, "f16", true)                 -- skipped on the device
      H.assert_same(w:totable(), before:totable(), "masters after a skipped step")
      check(w, x, "f16", "after a skipped step")
      do
        local _ <close> = mp.no_grad()
        w:copy_(mp.full({6, 5}, 0.125))                               -- written outside the optimizer
      end
      check(w, x, "f16", "after copy_")
      train_step(w, b, x, opt, scaler, "f16")
      check(w, x, "f16", "after a step that followed copy_")
      check(w, x, "bf16", "switching to bf16")
      train_step(w, b, x, opt, scaler, "bf16")
      check(w, x, "bf16", "after a bf16 step")
      check(w, x, "f16", "and back to f16")
    end)
  end

  -- the kernels round the copy block by block inside the step's pass
  -- (kernels/cpu/cpu_optim.c): a parameter past the size that splits the pass
  -- over threads, whose length is no multiple of the block, checked element by
  -- element (x = I makes linear(x, w) = w^T exactly), for every kind of step
  local kinds = H.optimizer_kinds
  for _, kind in ipairs(H.optimizer_kind_names) do
    it(kind .. ": is the masters rounded, element by element, in a large parameter", function()
      mp.manual_seed(6)
      local w = mp.randn({300, 1001}, {requires_grad = true})   -- 300300 elements
      local b = mp.randn({300}, {requires_grad = true})
      local i = mp.arange(1001)
      local x, eye = mp.randn({4, 1001}), mp.eq(i:reshape{-1, 1}, i:reshape{1, -1}):f32()
      local opt = kinds[kind]{w, b}
      local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{init = 256}}
      for i, dtype in ipairs{"f16", "f16", "bf16"} do
        train_step(w, b, x, opt, scaler, dtype)
        check(w, eye, dtype, kind .. " after step " .. i)
      end
    end)
  end

  it("leaves a parameter without a gradient as it was, in both copies", function()
    mp.manual_seed(4)
    local w = mp.randn({3, 4}, {requires_grad = true})
    local v = mp.randn({3, 4}, {requires_grad = true})
    local x = mp.randn({2, 4})
    local opt = mp.optim.SGD({w, v}, {lr = 0.1, momentum = 0.9})
    check(v, x, "f16", "v at first")
    local v0 = v:detach():clone()
    for _ = 1, 2 do
      opt:zero_grad()
      local loss
      do
        local _ <close> = mp.amp.autocast("f16")
        loss = mp.linear(x, w):sum()
      end
      loss:backward()
      v.grad = nil
      opt:step()
      check(w, x, "f16", "w after a step")
      check(v, x, "f16", "v after a step without its gradient")
    end
    H.assert_same(v:totable(), v0:totable(), "v's masters")
  end)
end)
