-- amp_wide_spec.lua: the AMP step's shortcuts around widening (f16, and bf16 where its
-- products widen too).
--
-- 1. An autocast weight (a cast the cast cache made) is widened to f32 once per
--    version of its values and handed to the GEMMs widened (engine/ops_matmul.c,
--    backend gemm_wide), where the forward and the backward GEMM each widened
--    it before. The products must be bit for bit those of the same f16 weight
--    that is not kept widened (a detached weight's cast, which the cache does
--    not hold), before and after every kind of write to the weight: an
--    optimizer step, an in-place write inside the region and outside it.
--    The optimizer's step writes that widened copy too, with the working copy
--    (kernels/cpu/cpu_optim.c), so that the next forward finds it current: for
--    every kind of step, a skipped one and a parameter whose gradient was
--    dropped, the products must stay those of an unkept weight.
-- 2. The gradient of a cast f32 leaf is widened and added into .grad in one
--    pass (engine/ops_create.c mp_cast_backward_into). A hook on the leaf
--    takes the old way (a widened tensor, then an add), so two runs, one with
--    no-op hooks, must give the same .grad and parameters bit for bit.
-- 3. A linear layer's weight gradient goes straight into the f32 .grad of the
--    master weight it was cast from, rounded and added in the GEMM's last pass
--    (engine/backward.h mp_backward_sink, backend gemm_wide's acc), when that
--    cast feeds nothing else in the walk; its bias in the GEMM's sums (gemm_wide's
--    bias). Against anomaly mode (the old way), with a weight used twice in one
--    region, weights cast in two regions, and .grad holding a sum.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/amp_wide_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

-- Both low-precision dtypes: f16's products are widened whole everywhere; bf16's
-- where oneDNN has no bf16 kernels (below AVX512-core), else the checks hold
-- with nothing kept widened.
for _, dt in ipairs{"f16", "bf16"} do
  -- y and x's gradient for relu(x @ w1^T + b) @ w2^T under dt autocast
  local function forward_backward(x, w1, b, w2)
    local xg = x:detach():clone():requires_grad(true)
    local y
    do
      local _ <close> = mp.amp.autocast(dt)
      y = mp.linear(mp.relu(mp.linear(xg, w1, b)), w2)
    end
    (y:f32() * y:f32()):sum():backward()
    return y:f32():totable(), xg.grad:totable()
  end

  -- the same with the weights detached: casts the cache does not keep, so the
  -- GEMMs widen them as they always did
  local function reference(x, w1, b, w2)
    return forward_backward(x, w1:detach(), b:detach(), w2:detach())
  end

  local function same_as_reference(x, w1, b, w2, what)
    local y, gx = forward_backward(x, w1, b, w2)
    local ry, rgx = reference(x, w1, b, w2)
    H.assert_same(y, ry, what .. ": y")
    H.assert_same(gx, rgx, what .. ": x's gradient")
  end

  describe(dt .. " autocast weights widened once", function()
    it("give the GEMMs' results bit for bit, and follow every write", function()
      mp.manual_seed(11)
      -- past the conversions' thread split (2^18), lengths no multiple of 16
      local w1 = mp.randn({300, 907}, {requires_grad = true})
      local b = (mp.randn({300}) * 0.1):requires_grad(true)
      local w2 = mp.randn({37, 300}, {requires_grad = true})
      local x = mp.randn({29, 907})
      same_as_reference(x, w1, b, w2, "without an optimizer")
      -- in an optimizer's arena: views of its working copy at offsets
      local opt = mp.optim.Adam({w1, b, w2}, {lr = 0.01})
      local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{init = 256}}
      for i = 1, 3 do
        same_as_reference(x, w1, b, w2, "before step " .. i)
        opt:zero_grad()
        local loss
        do
          local _ <close> = mp.amp.autocast(dt)
          local y = mp.linear(mp.relu(mp.linear(x, w1, b)), w2):f32()
          loss = y:mean()
        end
        scaler:scale(loss):backward()
        scaler:step(opt)
        scaler:update()
      end
      assert(scaler.stats.skipped == 0, "every step was taken")
      same_as_reference(x, w1, b, w2, "after the steps")
      do
        local _ <close> = mp.no_grad()
        w1:add_(0.25)                               -- written in place outside the optimizer
      end
      same_as_reference(x, w1, b, w2, "after an in-place write")
      -- written inside one region, between two uses: the second must see it
      local y2
      do
        local _ <close> = mp.amp.autocast(dt)
        local y1 = mp.linear(x, w1)
        do
          local _ <close> = mp.no_grad()
          w1:mul_(-0.5)
        end
        y2 = mp.linear(x, w1)
        assert(H.flat(y1:f32():totable())[1] ~= H.flat(y2:f32():totable())[1], "the write changed y")
      end
      local want
      do
        local _ <close> = mp.no_grad()
        want = mp.linear(x:to(dt), w1:detach():to(dt))
      end
      H.assert_same(y2:f32():totable(), want:f32():totable(), "after a write inside the region")
    end)
  end)

  describe(dt .. ": the widened copy the optimizer step writes", function()
    local kinds = H.optimizer_kinds
    for _, kind in ipairs(H.optimizer_kind_names) do
      it(kind .. ": is the working copy widened, step after step", function()
        mp.manual_seed(12)
        -- past the step's thread split, lengths no multiple of its blocks (1024)
        local w1 = mp.randn({300, 907}, {requires_grad = true})
        local b = (mp.randn({300}) * 0.1):requires_grad(true)
        local w2 = mp.randn({37, 300}, {requires_grad = true})
        local x = mp.randn({29, 907})
        local opt = kinds[kind]{w1, b, w2}
        local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{init = 256}}
        -- step 3 is skipped (an inf loss), step 4 drops w2's gradient
        for i = 1, 5 do
          same_as_reference(x, w1, b, w2, kind .. " before step " .. i)
          opt:zero_grad()
          local loss
          do
            local _ <close> = mp.amp.autocast(dt)
            loss = mp.linear(mp.relu(mp.linear(x, w1, b)), w2):f32():mean()
          end
          if i == 3 then loss = loss * math.huge end
          scaler:scale(loss):backward()
          if i == 4 then w2.grad = nil end
          scaler:step(opt)
          scaler:update()
        end
        assert(scaler.stats.skipped == 1, "one step was skipped")
        same_as_reference(x, w1, b, w2, kind .. " after the steps")
      end)
    end
  end)

  -- a parameter's hook that changes nothing: its gradient takes the old way
  local function hook_all(ps)
    for _, p in ipairs(ps) do p:register_hook(function() end) end
  end

  local function mlp(hooked)
    mp.manual_seed(5)
    local nn = mp.nn
    local model = nn.Sequential(nn.Linear(301, 260), nn.ReLU(), nn.Linear(260, 10))
    local ps = model:parameters()
    if hooked then hook_all(ps) end
    return model, ps, mp.optim.Adam(ps, {lr = 1e-3}), mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}}
  end

  describe(dt .. ": the gradient of a cast f32 leaf added into .grad in one pass", function()
    it("is the cast-then-add bit for bit, step after step", function()
      local m1, p1, o1, s1 = mlp(false)
      local m2, p2, o2, s2 = mlp(true)
      mp.manual_seed(9)
      local x, y = mp.randn({64, 301}), mp.randint(0, 10, {64})
      for step = 1, 3 do
        for _, r in ipairs{{m1, o1, s1}, {m2, o2, s2}} do
          r[2]:zero_grad()
          local loss
          do
            local _ <close> = mp.amp.autocast(dt)
            loss = mp.cross_entropy(r[1](x), y)
          end
          r[3]:scale(loss):backward()
        end
        for i = 1, #p1 do
          H.assert_same(p1[i].grad:totable(), p2[i].grad:totable(), "step " .. step .. ": gradient " .. i)
        end
        s1:step(o1); s1:update()
        s2:step(o2); s2:update()
        for i = 1, #p1 do
          H.assert_same(p1[i]:totable(), p2[i]:totable(), "step " .. step .. ": parameter " .. i)
        end
      end
    end)

    it("adds into a .grad that is there already, outside an arena, as an add would", function()
      mp.manual_seed(8)
      local w = mp.randn({40, 33}, {requires_grad = true})
      local v = mp.randn({40, 33}, {requires_grad = true})
      v:register_hook(function() end)
      do
        local _ <close> = mp.no_grad()
        v:copy_(w)
      end
      local x = mp.randn({7, 33})
      for _ = 1, 2 do                               -- the second backward adds into .grad
        for _, p in ipairs{w, v} do
          local _ <close> = mp.amp.autocast(dt)
          local out = mp.linear(x, p)
          out:f32():sum():backward()
        end
      end
      H.assert_same(w.grad:totable(), v.grad:totable(), "accumulated .grad")
      -- and the leaf's other uses of the same gradient still see it (anomaly mode
      -- takes the old way; the sums are the same)
      w.grad, v.grad = nil, nil
      do
        local _ <close> = mp.autograd.detect_anomaly()
        local _a <close> = mp.amp.autocast(dt)
        mp.linear(x, w):f32():sum():backward()
      end
      local _a <close> = mp.amp.autocast(dt)
      mp.linear(x, v):f32():sum():backward()
      H.assert_same(w.grad:totable(), v.grad:totable(), "under anomaly mode")
    end)
  end)

  describe(dt .. ": a weight gradient added into .grad by the GEMM", function()
    -- y for x through w (one cast used twice in one region: the linear's turn
    -- comes first in the backward, before the cast has the other use's gradient),
    -- then u and v each cast in two regions, and z once (straight into .grad)
    local function run(anomaly)
      mp.manual_seed(21)
      local w = (mp.randn({64, 300}) * 0.1):requires_grad(true)
      local v = (mp.randn({300, 64}) * 0.1):requires_grad(true)
      local u = (mp.randn({64, 300}) * 0.1):requires_grad(true)
      local b = (mp.randn({300}) * 0.1):requires_grad(true)
      local z = (mp.randn({40, 300}) * 0.1):requires_grad(true)
      local x = mp.randn({129, 64})
      for _, p in ipairs{w, v, u, b, z} do   -- .grad holding a sum already
        p.grad = mp.randn(p.shape) * 1e-3
      end
      for _ = 1, 2 do
        local h, k
        do
          local _ <close> = mp.amp.autocast(dt)
          h = mp.linear(mp.relu(mp.matmul(x, w)), w)   -- w twice: one cast, the linear's use last
          h = mp.linear(h, v, b):f32()
        end
        do
          local _ <close> = mp.amp.autocast(dt)
          k = mp.linear(h, u)
        end
        local y
        do
          local _ <close> = mp.amp.autocast(dt)
          y = mp.linear(mp.linear(mp.linear(h, u) + k, v), z)   -- second casts of u and v; z's only
        end
        local _ <close> = anomaly and mp.autograd.detect_anomaly() or nil
        (y:f32() * y:f32()):mean():backward()
      end
      return {w.grad:totable(), v.grad:totable(), u.grad:totable(), b.grad:totable(), z.grad:totable()}
    end

    -- anomaly mode takes the old way: each cast's gradient widened, then added
    it("is the cast's widened add bit for bit, with shared casts and casts in several regions", function()
      local got, want = run(false), run(true)
      for i, name in ipairs{"w", "v", "u", "b", "z"} do H.assert_same(got[i], want[i], name .. ".grad") end
    end)
  end)
end
