-- scaler_spec.lua: mp.amp.GradScaler's policies against hand-computed scale
-- sequences (static, none, dynamic, hysteresis, amax, Lua policies), bad
-- policies and bad options, set_policy, and state_dict/load_state_dict resuming
-- each policy's counters exactly.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/scaler_spec.lua
--
-- The harness: one f32 parameter p under SGD; each step is
--   scaler:scale(loss); p.grad = <the scaled gradient we choose>; scaler:step(opt); scaler:update()
-- so a sequence like {OK, OK, INF, NAN, ...} decides exactly which steps
-- overflow. For the amax policy an entry is the *true* gradient g and the
-- gradient set is g * scale (powers of two throughout, so every value is exact).
-- The expected scales below were worked out by hand from the rules in
-- engine/scaler.h, PyTorch's _amp_update_scale_ and DeepSpeed's
-- DynamicLossScaler.update_scale; the comments show the arithmetic.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local amp = mp.amp
local P = amp.policy

local OK, INF, NAN = 1, math.huge, 0 / 0

-- a fresh parameter + optimizer + scaler
local function rig(policy, opts)
  local p = mp.tensor({0.5}, {requires_grad = true})
  local opt = mp.optim.SGD({p}, {lr = 0})
  local sc = amp.GradScaler{policy = policy}
  return {p = p, opt = opt, sc = sc}
end

-- one step with gradient g (already scaled; `true_grad`: g is the true gradient
-- and the scaled one is g * current scale); returns applied
local function step(r, g, true_grad, loss)
  local s0 = r.sc:get_scale()
  r.sc:scale(mp.tensor(loss or 1.0))
  local v = g
  if true_grad and g == g and g ~= math.huge then v = g * r.sc:get_scale() end
  r.p.grad = mp.tensor({v})
  local applied = r.sc:step(r.opt)
  r.sc:update()
  return applied, s0
end

-- the scale after each update() for a sequence of gradients
local function run(r, seq, true_grad)
  local scales, applied = {}, {}
  for i, g in ipairs(seq) do
    applied[i] = step(r, g, true_grad)
    scales[i] = r.sc:get_scale()
  end
  return scales, applied
end

local function same(got, want, what)
  for i = 1, math.max(#got, #want) do
    if got[i] ~= want[i] then
      error(string.format("%s: after step %d the scale is %s, expected %s\n got  {%s}\n want {%s}",
        what or "scales", i, tostring(got[i]), tostring(want[i]),
        table.concat((function() local t = {} for k, v in ipairs(got) do t[k] = string.format("%.9g", v) end return t end)(), ", "),
        table.concat((function() local t = {} for k, v in ipairs(want) do t[k] = string.format("%.9g", v) end return t end)(), ", ")), 2)
    end
  end
  return true
end

local F32_MAX = 3.4028234663852886e38

describe("mp.amp.policy.static and none", function()
  it("static(s) never moves, and skips inf/NaN steps", function()
    local r = rig(P.static(256))
    assert.equal(256, r.sc:get_scale())
    local scales, applied = run(r, {OK, INF, OK, NAN, OK})
    same(scales, {256, 256, 256, 256, 256})
    assert.same({true, false, true, false, true}, applied)
    assert.equal(2, r.sc.stats.skipped)
    assert.equal(5, r.sc.stats.steps)
  end)

  it("static scales the loss by exactly s", function()
    local r = rig(P.static(2 ^ 20))
    local l = r.sc:scale(mp.tensor(0.75))
    assert.equal(0.75 * 2 ^ 20, l:item())
  end)

  it("none() keeps the scale at 1 and scale(loss) is the loss itself", function()
    local r = rig(P.none())
    assert.equal(1, r.sc:get_scale())
    local l = r.sc:scale(mp.tensor(0.3))
    assert.equal(H.f32(0.3), l:item())
    local scales = run(r, {OK, OK, INF, OK})
    same(scales, {1, 1, 1, 1})
  end)

  it("enabled = false means no scaling", function()
    local sc = amp.GradScaler{enabled = false}
    assert.equal(1, sc:get_scale())
    assert.equal(H.f32(0.3), sc:scale(mp.tensor(0.3)):item())
  end)
end)

describe("mp.amp.policy.dynamic (PyTorch GradScaler rule)", function()
  it("defaults are init 65536, growth 2, backoff 0.5, interval 2000", function()
    local p = P.dynamic()
    assert.equal(65536, p.init)
    assert.equal(2, p.growth)
    assert.equal(0.5, p.backoff)
    assert.equal(2000, p.interval)
    assert.equal(65536, amp.GradScaler{}:get_scale())
  end)

  -- the defaults and the checks are the engine's (mp_policy_defaults,
  -- mp_policy_check): a policy table shows what the engine will run
  it("every built-in policy's table holds the engine's defaults and on_min", function()
    local d, h, a = P.dynamic(), P.hysteresis(), P.amax()
    assert.equal(P.MIN_SCALE, d.min)
    assert.equal(2 ^ -126, P.MIN_SCALE)
    assert.is_nil(d.max)
    assert.equal("warn", d.on_min)
    assert.same({1000, 2, 1}, {h.window, h.hysteresis, h.min})
    assert.same({16, 1, 1, 2 ^ 24}, {a.history, a.margin, a.min, a.max})
    assert.equal("error", P.amax{on_min = "error"}.on_min)
    assert.equal(3, P.dynamic{interval = 3.0}.interval)
    H.raises(function() P.dynamic{interval = 2.5} end, {"mp.amp.policy.dynamic", "interval", "integer"})
    H.raises(function() P.hysteresis{window = 0} end, {"mp.amp.policy.hysteresis", "window", "positive"})
    H.raises(function() P.dynamic{min = -1} end, {"min"})
  end)

  it("grows after interval clean steps and backs off on inf and NaN (interval 3)", function()
    local r = rig(P.dynamic{init = 1024, growth = 2, backoff = 0.5, interval = 3})
    local scales, applied = run(r, {OK, OK, OK, OK, INF, OK, OK, INF, OK, OK, OK, NAN, OK})
    -- tracker:          1     2     0*2  1     0/2   1     2     0/2   1    2    0*2   0/2  1
    same(scales, {1024, 1024, 2048, 2048, 1024, 1024, 1024, 512, 512, 512, 1024, 512, 512})
    assert.same({true, true, true, true, false, true, true, false, true, true, true, false, true}, applied)
    assert.equal(3, r.sc.stats.skipped)
  end)

  it("an overflow resets the growth counter (two clean, inf, two clean does not grow)", function()
    local r = rig(P.dynamic{init = 64, interval = 3})
    same(run(r, {OK, OK, INF, OK, OK, OK}), {64, 64, 32, 32, 32, 64})
  end)

  it("growth up to the f32 limit: 2^126 -> 2^127, then 2^128 would be inf so it stays", function()
    local r = rig(P.dynamic{init = 2 ^ 126, growth = 2, interval = 1})
    same(run(r, {OK, OK, OK}), {2 ^ 127, 2 ^ 127, 2 ^ 127})
    -- and it still backs off from there
    same(run(r, {INF}), {2 ^ 126})
  end)

  it("growth 3 from 2^126 gives 1.5 * 2^127 (finite), then stays", function()
    local r = rig(P.dynamic{init = 2 ^ 126, growth = 3, interval = 1})
    same(run(r, {OK, OK}), {3 * 2 ^ 126, 3 * 2 ^ 126})
    assert.is_true(3 * 2 ^ 126 < F32_MAX)
  end)

  it("min and max clamp the scale", function()
    local r = rig(P.dynamic{init = 4, growth = 2, backoff = 0.5, interval = 1, min = 1, max = 12})
    same(run(r, {OK, OK, OK, INF, INF, INF, INF, INF, OK}), {8, 12, 12, 6, 3, 1.5, 1, 1, 2})
  end)

  it("a non-power-of-two backoff is applied to the f32 scale", function()
    local r = rig(P.dynamic{init = 1000, backoff = 0.25, interval = 2, growth = 4})
    same(run(r, {INF, OK, OK, INF}), {250, 250, 1000, 250})
  end)
end)

describe("mp.amp.policy.hysteresis (DeepSpeed DynamicLossScaler rule)", function()
  it("hysteresis 2, window 3: tolerated overflow, backoff, growth that refills the counter", function()
    local r = rig(P.hysteresis{init = 1024, growth = 2, backoff = 0.5, window = 3, hysteresis = 2, min = 1})
    -- it  seq  rule                                        scale  counter last_overflow
    --  0  ok   (0-(-1))%3=1                                1024   2       -1
    --  1  ok   2%3                                         1024   2
    --  2  ok   3%3==0: grow, counter := 2                  2048   2
    --  3  inf  counter 2 > 1: counter := 1                 2048   1       3
    --  4  ok   (4-3)%3=1 (counter NOT refilled)            2048   1
    --  5  inf  counter 1: back off                         1024   1       5
    --  6  inf  counter 1: back off                          512   1       6
    --  7  ok   1                                            512
    --  8  ok   2                                            512
    --  9  ok   3%3==0: grow, counter := 2                  1024   2
    -- 10  inf  counter 2: counter := 1 (the refill works)  1024   1       10
    -- 11  inf  counter 1: back off                          512   1       11
    -- 12  nan  counter 1: back off                          256   1       12
    local scales, applied = run(r, {OK, OK, OK, INF, OK, INF, INF, OK, OK, OK, INF, INF, NAN})
    same(scales, {1024, 1024, 2048, 2048, 2048, 1024, 512, 512, 512, 1024, 1024, 512, 256})
    assert.same({true, true, true, false, true, false, false, true, true, true, false, false, false}, applied)
  end)

  it("the first growth comes after exactly `window` clean steps from the start", function()
    local r = rig(P.hysteresis{init = 8, window = 4})
    same(run(r, {OK, OK, OK, OK, OK, OK, OK, OK}), {8, 8, 8, 16, 16, 16, 16, 32})
  end)

  it("never backs off below min and warns exactly once at the floor (child process)", function()
    local res = H.child([[
      local mp = require "mp"
      local p = mp.tensor({0.5}, {requires_grad = true})
      local opt = mp.optim.SGD({p}, {lr = 0})
      local sc = mp.amp.GradScaler{policy = mp.amp.policy.hysteresis{init = 4, min = 1, hysteresis = 2, window = 100}}
      local out = {}
      for i = 1, 7 do
        sc:scale(mp.tensor(1.0))
        p.grad = mp.tensor({math.huge})
        sc:step(opt)
        sc:update()
        out[#out + 1] = string.format("%g", sc:get_scale())
      end
      io.write(table.concat(out, ","))
    ]], true)
    assert.equal(0, res.rc, res.err)
    -- counter 2->1 (4), 4->2, 2->1, at the floor (warn) 1, 1, 1, 1
    assert.equal("4,2,1,1,1,1,1", res.out)
    local n = 0
    for _ in res.err:gmatch("[^\n]*minimum[^\n]*") do n = n + 1 end
    assert.equal(1, n, "warnings on stderr:\n" .. res.err)
  end)

  it("min that is not a power of the backoff: the scale lands on min", function()
    local r = rig(P.hysteresis{init = 20, min = 3, hysteresis = 1, window = 100})
    same(run(r, {INF, INF, INF}), {10, 5, 3})
  end)

  it("on_min = \"error\" raises at the floor and the scale stays", function()
    local r = rig(P.hysteresis{init = 2, min = 1, hysteresis = 1, window = 100, on_min = "error"})
    same(run(r, {INF}), {1})
    r.sc:scale(mp.tensor(1.0))
    r.p.grad = mp.tensor({math.huge})
    assert.is_false(r.sc:step(r.opt))
    H.raises(function() r.sc:update() end, {"minimum"})
    assert.equal(1, r.sc:get_scale())
    -- a clean step afterwards still works
    r.sc:scale(mp.tensor(1.0))
    r.p.grad = mp.tensor({1})
    assert.is_true(r.sc:step(r.opt))
    r.sc:update()
    assert.equal(1, r.sc:get_scale())
  end)

  it("growth stays finite at the f32 limit", function()
    local r = rig(P.hysteresis{init = 2 ^ 127, window = 1})
    same(run(r, {OK, OK}), {2 ^ 127, 2 ^ 127})
  end)
end)

describe("mp.amp.policy.amax", function()
  it("history 2, margin 1: scale = 2^floor(log2(65504 / max recent true amax) - 1)", function()
    local r = rig(P.amax{init = 1024, history = 2, margin = 1, backoff = 0.5, min = 1, max = 2 ^ 24})
    -- true gradients (the scaled ones are g * scale):
    -- 1: g=0.5   hist {0.5}          log2(131008)=16.9998-1 -> 15   => 32768
    -- 2: g=4     hist {0.5, 4}       log2(16376)=13.9993-1  -> 12   => 4096
    --    (the scaled gradient is 4*32768 = 131072: finite in the f32 arena, not an overflow)
    -- 3: g=0.25  hist {4, 0.25}      max 4                          => 4096
    -- 4: g=0.25  hist {0.25, 0.25}   log2(262016)=17.9998-1 -> 16   => 65536
    -- 5: inf     backoff                                            => 32768
    -- 6: g=2^-10 hist {0.25, 2^-10}  max 0.25 (the skip added nothing) => 65536
    -- 7: g=2^-12 hist {2^-10,2^-12}  log2(65504*1024)-1 -> 24        => 2^24 (= max)
    -- 8: g=2^-12 hist {2^-12,2^-12}  26, clamped to max             => 2^24
    local seq = {0.5, 4, 0.25, 0.25, INF, 2 ^ -10, 2 ^ -12, 2 ^ -12}
    local scales, applied = run(r, seq, true)
    same(scales, {32768, 4096, 4096, 65536, 32768, 65536, 2 ^ 24, 2 ^ 24})
    assert.same({true, true, true, true, false, true, true, true}, applied)
  end)

  it("margin 0 and a large gradient: the min clamp", function()
    local r = rig(P.amax{init = 1, history = 1, margin = 0, min = 4})
    -- g=3: log2(65504/3)=14.41 -> 14 => 16384; g=2^15 (scaled 2^29): log2(1.999)=0.99 -> 0 => 1, clamped to 4
    same(run(r, {3, 2 ^ 15}, true), {16384, 4})
  end)

  it("overflow backs off without touching the history", function()
    local r = rig(P.amax{init = 2 ^ 10, history = 4, margin = 2})
    -- g=1: log2(65504)-2 = 13.99 -> 13 => 8192; inf => 4096; g=1 again => 8192
    same(run(r, {1, INF, NAN, 1}, true), {8192, 4096, 2048, 8192})
  end)

  it("defaults: history 16, margin 1", function()
    local p = P.amax()
    assert.equal(16, p.history)
    assert.equal(1, p.margin)
  end)
end)

describe("Lua policies", function()
  it("update(self, info) decides the scale and sees what the step found", function()
    local seen = {}
    local pol = {
      init = function(self) return 100 end,
      update = function(self, info)
        seen[#seen + 1] = info
        if info.found_inf then return info.scale / 4 end
        return info.scale + 1
      end,
    }
    local r = rig(pol)
    assert.equal(100, r.sc:get_scale())
    local scales = run(r, {OK, INF, OK, NAN})
    same(scales, {101, 25.25, 26.25, H.f32(26.25 / 4)})
    assert.equal(4, #seen)
    assert.is_false(seen[1].found_inf)
    assert.is_nil(seen[1].reason)
    assert.equal(100, seen[1].scale)
    assert.is_true(seen[2].found_inf)
    assert.equal("overflow", seen[2].reason)
    assert.equal("nan", seen[4].reason)
    assert.equal(2, seen[2].step)
    assert.equal(1, seen[2].skipped)
    assert.equal(2, seen[4].skipped)
    -- grad_amax is the true gradient's: the (scaled) gradient set was 1 at scale 100, then 25.25
    assert.equal(H.f32(1 / 100), H.f32(seen[1].grad_amax))
    assert.equal(25.25, seen[3].scale)
    assert.equal(H.f32(1 / 25.25), H.f32(seen[3].grad_amax))
  end)

  it("info.reason is \"forward\" when the loss itself is not finite", function()
    local reasons = {}
    local pol = {update = function(self, info) reasons[#reasons + 1] = info.reason; return info.scale end}
    local r = rig(pol)
    r.sc:scale(mp.tensor(math.huge))
    r.p.grad = mp.tensor({1})
    assert.is_false(r.sc:step(r.opt))
    r.sc:update()
    assert.same({"forward"}, reasons)
  end)

  it("without init() the first scale is 65536", function()
    local r = rig({update = function(self, info) return info.scale end})
    assert.equal(65536, r.sc:get_scale())
  end)

  it("update(new_scale) forces a scale", function()
    local r = rig(P.dynamic{init = 64})
    step(r, OK)
    r.sc:scale(mp.tensor(1.0))
    r.p.grad = mp.tensor({1})
    r.sc:step(r.opt)
    r.sc:update(8)
    assert.equal(8, r.sc:get_scale())
  end)
end)

describe("bad policies", function()
  local bad = {
    {"nil", nil}, {"nan", 0 / 0}, {"inf", math.huge}, {"0", 0}, {"-1", -1}, {"x", "x"}, {"1e+39", 1e39},
  }
  for _, case in ipairs(bad) do
    it("a Lua policy returning " .. case[1] .. " errors and the scale stays", function()
      local v = case[2]
      local r = rig({init = function() return 512 end, update = function() return v end})
      r.sc:scale(mp.tensor(1.0))
      r.p.grad = mp.tensor({1})
      r.sc:step(r.opt)
      H.raises(function() r.sc:update() end, {case[1] == "nan" and "nan" or ("returned " .. case[1])})
      assert.equal(512, r.sc:get_scale())
      -- and the scaler keeps working afterwards
      r.sc:scale(mp.tensor(1.0))
      r.p.grad = mp.tensor({1})
      assert.is_true(r.sc:step(r.opt))
    end)
  end

  it("a Lua policy whose update raises: the error names the cause, the scale stays", function()
    local r = rig({init = function() return 16 end, update = function() error("boom") end})
    r.sc:scale(mp.tensor(1.0))
    r.p.grad = mp.tensor({1})
    r.sc:step(r.opt)
    H.raises(function() r.sc:update() end, {"boom"})
    assert.equal(16, r.sc:get_scale())
  end)

  it("init() returning a bad value errors at construction", function()
    H.raises(function() amp.GradScaler{policy = {init = function() return -3 end, update = function() return 1 end}} end,
      {"-3"})
    H.raises(function() amp.GradScaler{policy = {init = function() return 0 / 0 end, update = function() return 1 end}} end,
      {"nan"})
  end)

  it("update(new_scale) with a bad value errors and the scale stays", function()
    local r = rig(P.static(32))
    for _, v in ipairs{0, -2, math.huge, 0 / 0} do
      r.sc:scale(mp.tensor(1.0))
      r.p.grad = mp.tensor({1})
      r.sc:step(r.opt)
      H.raises(function() r.sc:update(v) end, {})
      assert.equal(32, r.sc:get_scale())
    end
    H.raises(function() r.sc:update("8") end, {})
  end)

  it("GradScaler{policy = 42} and other non-policies error", function()
    H.raises(function() amp.GradScaler{policy = 42} end, {"policy"})
    H.raises(function() amp.GradScaler{policy = {}} end, {"policy"})
    H.raises(function() amp.GradScaler{policy = {update = 1}} end, {"policy"})
    H.raises(function() amp.GradScaler{bogus = 1} end, {"bogus"})
    H.raises(function() amp.GradScaler{enabled = "yes"} end, {"enabled"})
    H.raises(function() amp.GradScaler(42) end, {})
  end)

  it("unknown options and wrong types are named", function()
    H.raises(function() P.dynamic{intervl = 3} end, {"intervl"})
    H.raises(function() P.hysteresis{interval = 3} end, {"interval"})
    H.raises(function() P.amax{window = 3} end, {"window"})
    H.raises(function() P.dynamic{growth = "2"} end, {"growth"})
    H.raises(function() P.hysteresis{on_min = "explode"} end, {"on_min"})
    H.raises(function() P.hysteresis{on_min = true} end, {"on_min"})
    H.raises(function() P.dynamic(5) end, {"table"})
  end)

  -- a bad value must be refused by the time the policy is used; either the
  -- constructor or GradScaler may refuse it, but one of them must, naming it
  local function refused(make, words)
    H.raises(function() amp.GradScaler{policy = make()} end, words)
    -- set_policy refuses it too, and the scaler keeps its old scale and policy
    local r = rig(P.static(8))
    H.raises(function() r.sc:set_policy(make()) end, words)
    local l = r.sc:scale(mp.tensor(1.0))
    assert.equal(8, l:item())
  end

  it("growth <= 1, backoff outside (0, 1), interval/window/hysteresis/history < 1, margin < 0", function()
    refused(function() return P.dynamic{growth = 1} end, {"growth"})
    refused(function() return P.dynamic{growth = 0.5} end, {"growth"})
    refused(function() return P.hysteresis{growth = 1} end, {"growth"})
    refused(function() return P.dynamic{backoff = 0} end, {"backoff"})
    refused(function() return P.dynamic{backoff = 1} end, {"backoff"})
    refused(function() return P.dynamic{backoff = 1.5} end, {"backoff"})
    refused(function() return P.amax{backoff = -0.5} end, {"backoff"})
    refused(function() return P.dynamic{interval = 0} end, {"interval"})
    refused(function() return P.dynamic{interval = -5} end, {"interval"})
    refused(function() return P.hysteresis{window = 0} end, {"window"})
    refused(function() return P.hysteresis{hysteresis = 0} end, {"hysteresis"})
    refused(function() return P.amax{history = 0} end, {"history"})
    refused(function() return P.amax{margin = -1} end, {"margin"})
    refused(function() return P.dynamic{init = 0} end, {"init"})
    refused(function() return P.dynamic{init = math.huge} end, {"init"})
    refused(function() return P.dynamic{min = 8, max = 4} end, {"min"})
    refused(function() return P.dynamic{growth = 0 / 0} end, {"growth"})
  end)

  it("non-integer interval, window, hysteresis and history are refused (not truncated)", function()
    refused(function() return P.dynamic{interval = 2.5} end, {"interval"})
    refused(function() return P.hysteresis{window = 1.5} end, {"window"})
    refused(function() return P.hysteresis{hysteresis = 2.5} end, {"hysteresis"})
    refused(function() return P.amax{history = 1.5} end, {"history"})
  end)

  it("static() with a bad scale errors", function()
    for _, v in ipairs{0, -1, math.huge, 0 / 0} do
      H.raises(function() P.static(v) end, {"scale"})
    end
    H.raises(function() P.static("8") end, {"scale"})
    H.raises(function() P.static() end, {"scale"})
  end)
end)

describe("set_policy", function()
  it("the new policy's init applies from the next scale() call", function()
    local r = rig(P.dynamic{init = 1024, interval = 1000})
    step(r, OK)
    assert.equal(1024, r.sc:get_scale())
    r.sc:set_policy(P.static(32))
    local l = r.sc:scale(mp.tensor(1.0))
    assert.equal(32, l:item())
    assert.equal(32, r.sc:get_scale())
    r.p.grad = mp.tensor({1})
    r.sc:step(r.opt)
    r.sc:update()
    assert.equal(32, r.sc:get_scale())
  end)

  it("switching to a fresh dynamic policy starts its counter from zero", function()
    local r = rig(P.dynamic{init = 1024, interval = 3})
    run(r, {OK, OK})   -- tracker 2: one more would grow
    r.sc:set_policy(P.dynamic{init = 256, interval = 3})
    same(run(r, {OK, OK, OK, OK}), {256, 256, 512, 512})
  end)

  it("switching to a Lua policy calls its init() and then its update", function()
    local r = rig(P.static(8))
    r.sc:set_policy({init = function() return 3 end, update = function(self, info) return info.scale * 2 end})
    same(run(r, {OK, OK}), {6, 12})
  end)

  it("switching from a Lua policy back to a built-in one", function()
    local r = rig({init = function() return 3 end, update = function(self, info) return info.scale * 2 end})
    same(run(r, {OK}), {6})
    r.sc:set_policy(P.dynamic{init = 16, interval = 1})
    same(run(r, {OK, INF}), {32, 16})
  end)
end)

describe("set_policy: the scale at a swap, the options, the errors", function()
  -- a Lua policy that keeps whatever scale it is given, and one that doubles it
  local function keeper() return {update = function(self, info) return info.scale end} end
  local function doubler(init) return {init = init, update = function(self, info) return info.scale * 2 end} end

  it("takes a Lua policy without init (as the constructor does) and keeps the current scale", function()
    local r = rig(P.dynamic{init = 1024, interval = 1000})
    run(r, {OK, INF})                 -- 1024, then backed off to 512
    r.sc:set_policy(keeper())
    assert.equal(512, r.sc:get_scale())
    same(run(r, {OK, OK}), {512, 512})
    -- and the constructor takes the same table
    assert.equal(65536, amp.GradScaler{policy = keeper()}:get_scale())
  end)

  it("by default keeps the current scale unless the policy fixes its own", function()
    local r = rig(P.dynamic{init = 1024, interval = 1000})
    run(r, {INF, INF})                -- 256
    r.sc:set_policy(P.dynamic{interval = 2})       -- no init given: keeps 256 (not 65536)
    assert.equal(256, r.sc:get_scale())
    same(run(r, {OK, OK}), {256, 512})             -- a fresh tracker: two steps to grow
    r.sc:set_policy(P.hysteresis{init = 64})       -- an explicit init fixes its own
    assert.equal(64, r.sc:get_scale())
    r.sc:set_policy(P.amax{})                      -- no init: keeps 64
    assert.equal(64, r.sc:get_scale())
    r.sc:set_policy(P.static(8))                   -- a static policy's scale is its own
    assert.equal(8, r.sc:get_scale())
    r.sc:set_policy(doubler(function() return 3 end))   -- a Lua policy's init()
    assert.equal(3, r.sc:get_scale())
    r.sc:set_policy(doubler(12))                   -- a Lua policy's init number
    assert.equal(12, r.sc:get_scale())
    r.sc:set_policy(P.none())                      -- none runs at 1
    assert.equal(1, r.sc:get_scale())
  end)

  it('scale = "init", "keep" or a number overrides the default', function()
    local r = rig(P.static(8))
    r.sc:set_policy(P.dynamic{interval = 1}, {scale = "init"})   -- the engine's default first scale
    assert.equal(65536, r.sc:get_scale())
    r.sc:set_policy(keeper(), {scale = "init"})
    assert.equal(65536, r.sc:get_scale())
    r.sc:set_policy(P.static(4), {scale = 32})
    assert.equal(32, r.sc:get_scale())
    r.sc:set_policy(P.dynamic{init = 2, interval = 1}, {scale = "keep"})
    assert.equal(32, r.sc:get_scale())
    same(run(r, {OK, INF}), {64, 32})
    r.sc:set_policy(doubler(function() return 5 end), {scale = "keep"})
    same(run(r, {OK}), {64})
  end)

  it("the state the new policy starts from: tracker 0, full hysteresis, empty amax history", function()
    local r = rig(P.hysteresis{init = 1024, window = 100, hysteresis = 2})
    run(r, {INF})                                  -- tolerated: counter 1
    r.sc:set_policy(P.hysteresis{window = 100, hysteresis = 2})
    same(run(r, {INF, INF}), {1024, 512})          -- the counter is full again: one more tolerated
    local a = rig(P.amax{init = 1024, history = 4, margin = 0})
    run(a, {64}, true)                             -- history {64}: 2^floor(log2(65504 / 64)) = 512
    a.sc:set_policy(P.amax{history = 4, margin = 0})
    same(run(a, {1}, true), {32768})               -- 64 forgotten: 2^floor(log2(65504))
  end)

  it("a swap inside a step applies from the next step", function()
    local r = rig(P.static(16))
    r.sc:scale(mp.tensor(1.0))
    r.sc:set_policy(P.static(2))
    assert.equal(16, r.sc:get_scale())
    r.p.grad = mp.tensor({1})
    r.sc:step(r.opt)
    r.sc:update()
    assert.equal(2, r.sc:scale(mp.tensor(1.0)):item())
  end)

  it("refusals name GradScaler:set_policy and the field, and change nothing", function()
    local r = rig(P.dynamic{init = 64, interval = 1000})
    local bad = {
      {function() r.sc:set_policy({init = "x", update = keeper().update}) end, {"GradScaler:set_policy", "policy.init", "string"}},
      {function() r.sc:set_policy({init = -2, update = keeper().update}) end, {"GradScaler:set_policy", "policy.init", "-2"}},
      {function() r.sc:set_policy({init = function() return 0 / 0 end, update = keeper().update}) end, {"GradScaler:set_policy", "policy:init()"}},
      {function() r.sc:set_policy({min = "1", update = keeper().update}) end, {"GradScaler:set_policy", "policy.min"}},
      {function() r.sc:set_policy({update = keeper().update, on_min = "loud"}) end, {"GradScaler:set_policy", "on_min"}},
      {function() r.sc:set_policy({}) end, {"GradScaler:set_policy", "update(self, info)"}},
      {function() r.sc:set_policy(P.static(2), {scale = "bogus"}) end, {"GradScaler:set_policy", "scale", "string"}},
      {function() r.sc:set_policy(P.static(2), {scale = -1}) end, {"GradScaler:set_policy", "scale", "-1"}},
      {function() r.sc:set_policy(P.static(2), {scale = 0 / 0}) end, {"GradScaler:set_policy", "scale"}},
      {function() r.sc:set_policy(P.static(2), {scael = 1}) end, {"GradScaler:set_policy", "scael"}},
      {function() r.sc:set_policy(P.static(2), 5) end, {"GradScaler:set_policy", "table"}},
      {function() r.sc:set_policy(P.dynamic{min = 16}, {scale = 4}) end, {"GradScaler:set_policy", "scale 4", "min 16"}},
      {function() r.sc:set_policy(P.none(), {scale = "keep"}) end, {"GradScaler:set_policy", "scale", "none"}},
    }
    for _, b in ipairs(bad) do
      H.raises(b[1], b[2])
      assert.equal(64, r.sc:get_scale())
    end
    same(run(r, {OK, INF}), {64, 32})   -- still the dynamic policy it had
    -- the constructor refuses the same Lua policy fields with its own name
    H.raises(function() amp.GradScaler{policy = {init = "x", update = keeper().update}} end,
      {"mp.amp.GradScaler", "policy.init"})
  end)

  it("a disabled scaler checks the arguments and stays disabled", function()
    local sc = amp.GradScaler{enabled = false}
    sc:set_policy(P.dynamic{init = 1024})
    assert.equal(1, sc:get_scale())
    H.raises(function() sc:set_policy(P.static(2), {scale = "bogus"}) end, {"GradScaler:set_policy", "scale"})
  end)

  -- a swap in the middle of a run, a checkpoint after it, and a resumed run
  -- from that checkpoint: the resumed scales are the straight run's
  local function swap_and_resume(first, second, swap_opts, make_resume, before, after, at_swap)
    local a = rig(first())
    run(a, before)
    a.sc:set_policy(second(), swap_opts)
    if not at_swap then run(a, {OK}) end
    local path = os.tmpname()
    mp.save(path, {scaler = a.sc:state_dict()})
    local straight = run(a, after)
    local b = rig(make_resume())
    b.sc:load_state_dict(mp.load(path).scaler)
    os.remove(path)
    same(run(b, after), straight, "resumed after the swap")
    return straight
  end

  -- a Lua policy with state of its own (its state_dict is in the checkpoint):
  -- grows every second step, divides by 4 on an overflow
  local function counting()
    return {n = 0, update = function(self, info)
              self.n = self.n + 1
              if info.found_inf then return info.scale / 4 end
              return self.n % 2 == 0 and info.scale * 2 or info.scale
            end,
            state_dict = function(self) return {n = self.n} end,
            load_state_dict = function(self, st) self.n = st.n end}
  end

  it("built-in -> Lua, checkpoint, resume (the resumed scaler is given the Lua policy)", function()
    -- dynamic: OK grows to 2048, INF backs off to 1024; the Lua policy keeps 1024
    local s = swap_and_resume(function() return P.dynamic{init = 1024, interval = 1} end, counting, nil, counting,
      {OK, INF}, {OK, OK, INF, OK, OK}, true)
    same(s, {1024, 2048, 512, 1024, 1024})
    s = swap_and_resume(function() return P.dynamic{init = 1024, interval = 1} end, counting, nil, counting,
      {OK, INF}, {OK, OK, INF, OK, OK}, false)
    same(s, {2048, 2048, 512, 512, 1024})
  end)

  it("Lua -> built-in with a scale given, checkpoint, resume (the built-in policy comes back from the checkpoint)", function()
    for _, at_swap in ipairs{true, false} do
      local s = swap_and_resume(function() return doubler(4) end, function() return P.dynamic{interval = 2} end,
        {scale = 64}, function() return P.static(1) end, {OK, OK}, {INF, OK, OK, OK, INF}, at_swap)
      -- at the swap: 64, backed off to 32, a fresh tracker grows after two good steps
      if at_swap then same(s, {32, 32, 64, 64, 32}) end
    end
  end)

  it("a checkpoint taken under a Lua policy is refused by a scaler with a built-in one", function()
    local a = rig(counting())
    run(a, {OK})
    local b = rig(P.static(2))
    H.raises(function() b.sc:load_state_dict(a.sc:state_dict()) end, {"GradScaler:load_state_dict", "Lua policy", "set_policy"})
    assert.equal(2, b.sc:get_scale())
  end)
end)

describe("state_dict / load_state_dict", function()
  -- run `prefix` on A, copy its state into a fresh scaler B (through a file when
  -- `file`), then the same `rest` on both: the scales must match step by step
  local function resume(policy, prefix, rest, true_grad, file)
    local a = rig(policy())
    run(a, prefix, true_grad)
    local sd = a.sc:state_dict()
    if file then
      local path = os.tmpname()
      mp.save(path, {scaler = sd})
      sd = mp.load(path).scaler
      os.remove(path)
    end
    local b = rig(P.static(1))
    b.sc:load_state_dict(sd)
    assert.equal(a.sc:get_scale(), b.sc:get_scale())
    local sa = run(a, rest, true_grad)
    local sb = run(b, rest, true_grad)
    same(sb, sa, "resumed")
    assert.equal(a.sc.stats.steps, b.sc.stats.steps)
    assert.equal(a.sc.stats.skipped, b.sc.stats.skipped)
    return sa
  end

  it("dynamic: the growth tracker carries over", function()
    -- prefix: t1, backoff 512 t0, t1, t2; rest: grow 1024 t0, t1, backoff 512
    local sa = resume(function() return P.dynamic{init = 1024, interval = 3} end, {OK, INF, OK, OK}, {OK, OK, INF})
    same(sa, {1024, 1024, 512})
  end)

  it("hysteresis: the counter, iteration and last overflow carry over", function()
    local pol = function() return P.hysteresis{init = 1024, window = 3, hysteresis = 2} end
    -- prefix leaves counter 1 (one tolerated overflow), last overflow at it 1
    local sa = resume(pol, {OK, INF, OK}, {INF, OK, OK, OK, INF})
    -- it3 inf: counter 1 -> back off 512; it4 (4-3)=1; it5 2; it6 3%3=0 grow 1024, counter 2; it7 inf: counter 1
    same(sa, {512, 512, 512, 1024, 1024})
  end)

  it("amax: the history carries over", function()
    local pol = function() return P.amax{init = 1024, history = 3, margin = 1} end
    local sa = resume(pol, {4, 0.25}, {0.25, 0.25, 0.25}, true)
    -- prefix: {4} => 4096, {4, 0.25} => 4096; rest: {4, 0.25, 0.25} => 4096,
    -- then 4 drops out: {0.25, 0.25, 0.25} => 2^floor(log2(262016) - 1) = 65536, twice
    same(sa, {4096, 65536, 65536})
  end)

  it("through mp.save / mp.load (a checkpoint)", function()
    resume(function() return P.hysteresis{init = 256, window = 2, hysteresis = 3} end,
      {INF, OK, INF}, {INF, OK, OK, INF, INF, OK}, false, true)
    resume(function() return P.amax{init = 64, history = 2, margin = 0} end,
      {1, 8}, {0.5, 0.5, INF, 2}, true, true)
    resume(function() return P.dynamic{init = 8, interval = 2, min = 2, max = 64} end,
      {OK, INF, OK}, {OK, OK, OK, OK, OK, OK, INF}, false, true)
  end)

  it("the policy itself is restored (a fresh scaler with another policy continues the saved one)", function()
    local a = rig(P.dynamic{init = 16, interval = 1, max = 64})
    run(a, {OK})
    local b = rig(P.static(3))
    b.sc:load_state_dict(a.sc:state_dict())
    same(run(b, {OK, OK, OK}), {64, 64, 64})
  end)

  it("load_state_dict of garbage errors", function()
    local r = rig(P.static(2))
    H.raises(function() r.sc:load_state_dict(nil) end, {"state_dict"})
    H.raises(function() r.sc:load_state_dict({scale = "x"}) end, {"state_dict"})
    H.raises(function() r.sc:load_state_dict({scale = -1}) end, {"scale"})
    assert.equal(2, r.sc:get_scale())
  end)
end)

describe("the floor: a scale that cannot collapse in silence", function()
  -- a policy fed NaN more often than it grows, in a child, so stderr can be read;
  -- prints the final scale, skipped steps and whether the state says it warned
  local function starve(policy_src, steps, clean_every)
    return H.child(string.format([[
      local mp = require "mp"
      local P = mp.amp.policy
      local p = mp.tensor({0.5}, {requires_grad = true})
      local opt = mp.optim.SGD({p}, {lr = 0})
      local sc = mp.amp.GradScaler{policy = %s}
      local ok, err = pcall(function()
        for i = 1, %d do
          sc:scale(mp.tensor(1.0))
          p.grad = mp.tensor({i %% %d == 0 and 1 or 0 / 0})   -- NaN but one step in clean_every
          sc:step(opt)
          sc:update()
        end
      end)
      io.write(string.format("%%.17g %%d %%s %%s", sc:get_scale(), sc.stats.skipped,
                             tostring(sc:state_dict().warned_at_min), ok and "ok" or err))
    ]], policy_src, steps, clean_every or 3), true)
  end
  local function warnings(err)
    local n = 0
    for _ in err:gmatch("[^\n]*at its minimum[^\n]*") do n = n + 1 end
    return n
  end

  it("the default dynamic policy stops at the smallest normal f32, and warns once", function()
    -- 65536 = 2^16 halves 142 times to 2^-126; 400 steps of mostly NaN take it there
    local res = starve("P.dynamic{interval = 4}", 400)
    assert.equal(0, res.rc, res.err)
    local scale, skipped, warned, outcome = res.out:match("^(%S+) (%S+) (%S+) (.*)$")
    assert.equal("ok", outcome)
    assert.equal(2 ^ -126, tonumber(scale))
    assert.equal("true", warned)
    assert.equal(1, warnings(res.err), res.err)
    assert.is_true(tonumber(skipped) > 200)
    assert.equal(2 ^ -126, P.dynamic{}.min)
  end)

  it("on_min = \"error\" raises at the floor for dynamic and amax", function()
    for _, src in ipairs{"P.dynamic{interval = 4, min = 2 ^ -4, on_min = \"error\"}",
                         "P.amax{min = 2 ^ -4, on_min = \"error\"}"} do
      local res = starve(src, 400, 1000)   -- amax regrows on any clean step: NaN throughout
      assert.equal(0, res.rc, res.err)
      local scale, _, _, outcome = res.out:match("^(%S+) (%S+) (%S+) (.*)$")
      assert.equal(2 ^ -4, tonumber(scale), src)
      assert.truthy(outcome:find("minimum"), src .. ": " .. outcome)
    end
  end)

  it("a Lua policy's result is held to the floor and warns or raises the same way", function()
    local halve = "{update = function(self, info) return info.found_inf and info.scale / 2 or info.scale end%s}"
    local res = starve(string.format(halve, ""), 400)
    assert.equal(0, res.rc, res.err)
    local scale, _, warned, outcome = res.out:match("^(%S+) (%S+) (%S+) (.*)$")
    assert.equal("ok", outcome)
    assert.equal(2 ^ -126, tonumber(scale))
    assert.equal("true", warned)
    assert.equal(1, warnings(res.err), res.err)

    res = starve(string.format(halve, ", min = 1, on_min = \"error\""), 400)
    scale, _, _, outcome = res.out:match("^(%S+) (%S+) (%S+) (.*)$")
    assert.equal(1, tonumber(scale))
    assert.truthy(outcome:find("minimum"), outcome)
  end)

  it("on_min takes only \"warn\" or \"error\"", function()
    H.raises(function() P.dynamic{on_min = "explode"} end, {"on_min"})
    H.raises(function() P.amax{on_min = "explode"} end, {"on_min"})
  end)
end)
