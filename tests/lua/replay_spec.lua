-- replay_spec.lua: mp.amp.replay (lua/mp/amp/lab.lua, the rules through engine/scaler.c's
-- policy simulator): run against a trace of the policy that made it, replay takes
-- every recorded decision and scale exactly, for each built-in policy and a Lua one;
-- other candidates move as their rules say on the recorded gradients (a scale too
-- high skips, one lower flushes more to zero in f16, a recorded overflow below its
-- scale is marked unknown); bad input is refused.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local function tmp(name) return os.tmpname() .. "-" .. name end

-- a trace of `steps` f16 steps under policy; steps in `blow` have their forward
-- overflow (the loss times 1e30), others have small gradients (the loss times 1e-3)
-- that underflow at low scales
local function record(policy, steps, blow)
  mp.manual_seed(3)
  local model = nn.Sequential(nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 4))
  local opt = mp.optim.SGD(model:parameters(), { lr = 1e-3 })
  local sc = mp.amp.GradScaler { policy = policy }
  local _, names = model:named_parameters()
  local path = tmp("r.jsonl")
  sc:trace(path, { names = names })
  for s = 1, steps do
    local x, y = mp.randn { 32, 16 }, mp.randint(0, 4, { 32 })
    opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast("f16")
      loss = mp.cross_entropy(model(x) * (blow[s] and 1e30 or 1), y) * 1e-3
    end
    sc:scale(loss):backward()
    sc:step(opt)
    sc:update()
  end
  sc:trace(false)
  local tr = mp.amp.load_trace(path)
  os.remove(path)
  return tr
end

local function same_as_recorded(tr, policy, what)
  local rep = mp.amp.replay(tr, policy)
  assert.are.equal(#tr.steps, #rep)
  local skips = 0
  for i, r in ipairs(tr.steps) do
    assert.are.equal(r.scale, rep[i].scale, what .. ": scale at step " .. i)
    assert.are.equal(not r.applied, rep[i].skipped, what .. ": decision at step " .. i)
    assert.are.equal(r.reason, rep[i].reason, what .. ": reason at step " .. i)
    if rep[i].skipped then skips = skips + 1 end
    for k, name in ipairs(tr.header.params) do
      local p = r.params[k]
      assert.are.equal(p.n > 0 and p.underflow / p.n or 0, rep[i].underflow[name])
    end
  end
  return skips
end

describe("mp.amp.replay", function()
  it("takes the recorded decisions exactly for the policy that recorded the trace", function()
    local blow = { [5] = true, [6] = true, [17] = true }
    local p = mp.amp.policy
    -- a high start and a short interval: backoffs and growths both happen
    for _, c in ipairs {
      { "dynamic", function() return p.dynamic { init = 2 ^ 40, interval = 4 } end },
      { "hysteresis", function() return p.hysteresis { init = 2 ^ 40, hysteresis = 2, window = 3 } end },
      { "amax", function() return p.amax { init = 2 ^ 40, history = 3 } end },
      { "static", function() return p.static(2 ^ 10) end },
      { "lua", function()
        return { update = function(self, info)   -- halve on a skip, else grow by 4 every 5 steps
          if info.found_inf then return info.scale / 2 end
          return info.step % 5 == 0 and info.scale * 4 or info.scale
        end, init = function() return 2 ^ 30 end }
      end },
    } do
      local tr = record(c[2](), 24, blow)
      local skips = same_as_recorded(tr, c[2](), c[1])
      assert.is_true(skips >= 3, c[1] .. ": " .. skips .. " skips")
    end
  end)

  it("moves other candidates by their rules on the recorded gradients", function()
    local tr = record(mp.amp.policy.dynamic { init = 2 ^ 16, interval = 1000 }, 12, {})
    -- far too high: every step overflows, and dynamic backs off by half each time
    local hi = mp.amp.replay(tr, mp.amp.policy.static(2 ^ 40))
    for _, e in ipairs(hi) do assert.is_true(e.skipped and e.reason == "overflow") end
    local dyn = mp.amp.replay(tr, mp.amp.policy.dynamic { init = 2 ^ 40 })
    assert.is_true(dyn[1].skipped)
    assert.are.equal(2 ^ 39, dyn[2].scale)
    -- lower scales flush more: the underflow fraction never falls as the scale does
    local name = tr.header.params[1]
    local last = -1
    for e = 16, -16, -4 do
      local u = mp.amp.replay(tr, mp.amp.policy.static(2 ^ e))[3].underflow[name]
      assert.is_true(u >= last, "2^" .. e .. ": " .. u .. " < " .. last)
      last = u
    end
    assert.is_true(last > 0.5, "at 2^-16 most of these small gradients flush: " .. last)
  end)

  it("marks a recorded gradient overflow it cannot judge below the recorded scale", function()
    local tr = record(mp.amp.policy.static(2 ^ 16), 3, {})
    local r = tr.steps[2]   -- a fresh table: put back in its place, replay reads it
    r.applied, r.reason = false, "overflow"   -- as if step 2 had overflowed at 2^16
    tr.steps[2] = r
    local low = mp.amp.replay(tr, mp.amp.policy.static(2 ^ 8))
    assert.is_true(low[2].skipped and low[2].unknown)
    assert.is_false(low[1].skipped)
    local same = mp.amp.replay(tr, mp.amp.policy.static(2 ^ 16))
    assert.is_true(same[2].skipped)
    assert.is_nil(same[2].unknown)
  end)

  it("refuses what is not a trace or a policy, and reports a policy that fails", function()
    local tr = record(mp.amp.policy.static(2 ^ 16), 2, {})
    H.raises(function() mp.amp.replay({}, mp.amp.policy.static(1)) end, { "mp.amp.replay", "trace" })
    local msg = H.raises(function() mp.amp.replay("/nonexistent.jsonl", mp.amp.policy.static(1)) end,
                         { "mp.amp.replay", "cannot open" })
    assert.is_truthy(msg:find("replay_spec.lua", 1, true), "reported at the caller's line: " .. msg)
    H.raises(function() mp.amp.replay(tr, {}) end, { "mp.amp.replay", "policy" })
    -- a record a script built or changed is checked as load_trace checks its own
    local r = tr.steps[1]
    r.params[1].n = "many"
    tr.steps[1] = r
    H.raises(function() mp.amp.replay(tr, mp.amp.policy.static(1)) end, { "mp.amp.replay", "step 1", "params[1].n" })
    H.raises(function() mp.amp.replay({ header = {}, steps = { { step = 1, scale = -1, params = {} } } },
                                      mp.amp.policy.static(1)) end, { "mp.amp.replay", "step 1", "scale is -1" })
    tr = record(mp.amp.policy.static(2 ^ 16), 2, {})
    H.raises(function() mp.amp.replay(tr, { update = function() error("boom") end }) end, { "step 1", "boom" })
    H.raises(function() mp.amp.replay(tr, { update = function() return -1 end }) end, { "step 1", "finite number > 0" })
    H.raises(function() mp.amp.replay(tr, mp.amp.policy.dynamic { interval = 0 }) end, { "interval" })
  end)
end)

describe("scripts/policy_lab.lua", function()
  it("prints a row per policy from one trace, and writes the trajectories with --out", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local tr = tmp("lab.jsonl")
    local out_path = tmp("lab-out.jsonl")
    local out, code = H.script("scripts/train_mlp.lua")("--max-steps 12 --amp f16 --trace " .. tr)
    assert.are.equal(0, code, out)
    out, code = H.script("scripts/policy_lab.lua")(tr .. " dynamic static:2^30 scripts/policies/conservative.lua --out " .. out_path)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("12 steps, 6 parameters, 0 skipped as recorded", 1, true), out)
    assert.is_truthy(out:match("\ndynamic%s+0%s"), out)          -- the recorded policy: no skips, as recorded
    assert.is_truthy(out:match("\nstatic:2%^30%s+12%s"), out)     -- always too high
    assert.is_truthy(out:match("\nconservative%.lua%s+%d+"), out)
    local n = 0
    for line in io.lines(out_path) do
      n = n + 1
      assert.is_truthy(line:match('^{"policy":"[^"]+","scale":[%d.e+]+,"skipped":%a+,"step":%d+,"underflow":{.*}}$'), line)
    end
    assert.are.equal(36, n)
    out, code = H.script("scripts/policy_lab.lua")("/nonexistent.jsonl")
    assert.are.equal(2, code)
    assert.is_truthy(out:find("cannot open", 1, true), out)
    os.remove(tr); os.remove(out_path)
  end)
end)

describe("scripts/policies/histogram.lua", function()
  local function policy() return dofile(H.root .. "/scripts/policies/histogram.lua") end
  local function hist_at(bin_lo, count)   -- all values in [2^bin_lo, 2^(bin_lo + 1)) of the scaled gradients
    local h = {}
    for b = 1, 64 do h[b] = 0 end
    h[bin_lo + 48 + 1] = count
    return h
  end

  it("rises toward the scale that keeps underflow under its target, an octave per step", function()
    local p = policy()
    -- scaled values at 2^-30: at 2^10 they all flush; 5 octaves more would clear them
    local s = p:update { scale = 2 ^ 10, found_inf = false, grad_amax = 2 ^ -40, hist = hist_at(-30, 1000), hist_lo = -48 }
    assert.are.equal(2 ^ 11, s)
  end)

  it("comes down at once when the largest gradient leaves too little headroom, and never rises into it", function()
    local p = policy()
    -- most values near f16's flush (precision wants 3 octaves more), but amax * scale =
    -- 2^15, within an octave of 65504: 2 octaves of headroom need the scale 2 octaves
    -- lower; headroom wins
    local s = p:update { scale = 2 ^ 16, found_inf = false, grad_amax = 2 ^ -1, hist = hist_at(-27, 1000), hist_lo = -48 }
    assert.are.equal(2 ^ 14, s)
    -- values far from underflow and from overflow: the smallest scale that keeps them
    -- clear of f16's flush is below this one, so it falls to it
    s = p:update { scale = 2 ^ 16, found_inf = false, grad_amax = 2 ^ -10, hist = hist_at(-8, 1000), hist_lo = -48 }
    assert.is_true(s < 2 ^ 16 and s >= 2 ^ -24)
  end)

  it("backs off by 4 on an overflow, keeps the scale on a forward overflow or without a histogram", function()
    local p = policy()
    assert.are.equal(2 ^ 14, p:update { scale = 2 ^ 16, found_inf = true, reason = "overflow" })
    assert.are.equal(2 ^ 16, p:update { scale = 2 ^ 16, found_inf = true, reason = "forward" })
    assert.are.equal(2 ^ 16, p:update { scale = 2 ^ 16, found_inf = false, grad_amax = 1 })
  end)
end)
