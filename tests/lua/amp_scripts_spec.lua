-- amp_scripts_spec.lua: the mixed-precision scripts end to end, in child processes:
-- train_mlp.lua --amp f16|bf16 and --policy (built-in names, NAME:ARGS, Lua files from
-- scripts/policies/), its skip summary, checkpoints that resume an AMP run bit-exactly
-- (scale and policy state included), and underflow.lua --quick.
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local exe = H.mpengine

-- env: extra environment variables, {NAME = "value"} (the child runs on the cpu: H.env)
local function sh(script, args, env)
  local p = io.popen(string.format("%s%s %s %s 2>&1; echo \"exit=$?\"", H.env(env), exe, script, args))
  local out = p:read("a")
  p:close()
  return out, tonumber(out:match("exit=(%d+)%s*$"))
end
local function run(args, env) return sh("scripts/train_mlp.lua", args, env) end

local function tmp(name) local b = os.tmpname(); os.remove(b); return b .. "-" .. name end

local same_model = H.same_model

-- the last two lines: the skip summary, then the accuracy
local function tail(out)
  local skipped, of, detail, acc = out:match("skipped steps: (%d+) of (%d+)([^\n]*)\nfinal test accuracy: (0%.%d%d%d%d)%s*exit=")
  return tonumber(skipped), tonumber(of), detail, tonumber(acc)
end

describe("train_mlp.lua --amp", function()
  it("f16 trains, reports skipped steps before the final accuracy, and logs scale and skips", function()
    local metrics = tmp("m.jsonl")
    local out, code = run("--amp f16 --max-steps 100 --seed 1 --metrics " .. metrics)
    assert.are.equal(0, code, out)
    local skipped, of, _, acc = tail(out)
    assert.is_not_nil(acc, out)
    assert.are.equal(100, of)
    assert.are.equal(0, skipped, out)          -- 2^16 is far from overflow for this MLP
    assert.is_true(acc > 0.7, out)
    assert.is_truthy(out:find("loss scale 65536  skipped 0", 1, true), out)
    local lines = {}
    for l in io.lines(metrics) do lines[#lines + 1] = l end
    assert.are.equal(1, #lines)
    assert.is_truthy(lines[1]:match('^{"step": 100, "epoch": 1, "loss": [%d.e-]+, "lr": 0.001, "samples_per_s": [%d.]+, "scale": 65536, "skipped": 0}$'), lines[1])
    os.remove(metrics)
  end)

  it("f16 matches FP32 closely after 50 steps; bf16 runs unscaled by default", function()
    local out32 = run("--max-steps 50")
    local out16, c16 = run("--amp f16 --max-steps 50")
    local outb, cb = run("--amp bf16 --max-steps 50")
    assert.are.equal(0, c16, out16)
    assert.are.equal(0, cb, outb)
    local acc32 = tonumber(out32:match("final test accuracy: (0%.%d+)"))
    local _, _, _, acc16 = tail(out16)
    local skb, ofb, _, accb = tail(outb)
    assert.are.equal(50, ofb)
    assert.are.equal(0, skb)
    assert.is_truthy(outb:find("loss scale 1  skipped 0", 1, true), outb)   -- policy none
    assert.is_true(math.abs(acc16 - acc32) < 0.02, out16)
    assert.is_true(math.abs(accb - acc32) < 0.03, outb)
  end)

  it("takes built-in policies by name, with options, and counts skips by reason", function()
    local out, code = run("--amp f16 --max-steps 30 --policy static:1024")
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("loss scale 1024  skipped 0", 1, true), out)
    out, code = run("--amp f16 --max-steps 30 --policy static:2^10")
    assert.is_truthy(out:find("loss scale 1024  skipped 0", 1, true), out)
    for _, name in ipairs{"none", "dynamic", "hysteresis", "amax"} do
      out, code = run("--amp f16 --max-steps 5 --policy " .. name)
      assert.are.equal(0, code, name .. ": " .. out)
      assert.is_not_nil(select(4, tail(out)), out)
    end
    -- 2^20 overflows f16 in this MLP's backward: skips, each halving the scale
    out, code = run("--amp f16 --max-steps 20 --policy dynamic:init=2^20,interval=1000")
    assert.are.equal(0, code, out)
    local skipped, of, detail = tail(out)
    assert.are.equal(20, of)
    assert.is_true(skipped >= 1, out)
    assert.is_truthy(detail:match("^ %(.*%d%)$"), out)       -- "(overflow 3)" or with nan
    assert.is_truthy(out:find("loss scale " .. math.tointeger(2 ^ (20 - skipped)) .. "  skipped " .. skipped, 1, true), out)
  end)

  it("takes a Lua policy file: logging.lua logs every decision and equals the built-in dynamic rule", function()
    local a, b = tmp("dyn"), tmp("log")
    local out1, c1 = run("--amp f16 --max-steps 25 --seed 2 --policy dynamic:init=2^18,interval=4 --save " .. a)
    assert.are.equal(0, c1, out1)
    -- same rule in Lua, with its options from the file's .new{} (kept in a temp policy file)
    local pf = tmp("pol.lua")
    local f = assert(io.open(pf, "w"))
    f:write('local L = dofile("scripts/policies/logging.lua")\n',
            'return getmetatable(L).__index.new{init = 2^18, interval = 4}\n')
    f:close()
    local out2, c2 = run("--amp f16 --max-steps 25 --seed 2 --policy " .. pf .. " --save " .. b)
    assert.are.equal(0, c2, out2)
    local n = 0
    for _ in out2:gmatch("\npolicy: step %d+  scale ") do n = n + 1 end
    assert.are.equal(25, n, out2)                             -- one line per update
    assert.is_truthy(out2:find("backoff  (found_inf, reason ", 1, true), out2)
    assert.is_truthy(out2:find("grow  (finite", 1, true), out2)
    assert.is_true(same_model(a, b))
    assert.are.equal(mp.load(a).scaler.scale, mp.load(b).scaler.scale)
    assert.are.same({select(1, tail(out1))}, {select(1, tail(out2))})
    os.remove(a); os.remove(b); os.remove(pf)
  end)

  it("takes conservative.lua, which never backs off on a forward overflow", function()
    local out, code = run("--amp f16 --max-steps 20 --policy scripts/policies/conservative.lua")
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("loss scale 32768", 1, true), out)
    local p = dofile("scripts/policies/conservative.lua")
    local s = p:init()
    assert.are.equal(s, p:update{scale = s, found_inf = true, reason = "forward", step = 1, skipped = 1})
    assert.are.equal(s / 8, p:update{scale = s, found_inf = true, reason = "overflow", step = 2, skipped = 2})
    assert.are.equal(s / 8, p:update{scale = s / 8, found_inf = false, step = 3, skipped = 2})
  end)

  it("rejects --policy without --amp, unknown names, bad options and bad files", function()
    local bad = tmp("bad.lua")
    local f = assert(io.open(bad, "w")); f:write("return 42\n"); f:close()
    for _, case in ipairs{
      {"--policy dynamic", "--policy needs --amp f16 or bf16"},
      {"--amp off --policy scripts/policies/logging.lua", "--policy needs --amp f16 or bf16"},
      {"--amp f16 --policy dynamo", "--policy must be static, none, dynamic, hysteresis, amax"},
      {"--amp f16 --policy static:0", "--policy static:S needs a finite number S > 0"},
      {"--amp f16 --policy dynamic:bogus=1", "unknown option 'bogus'"},
      {"--amp f16 --policy dynamic:interval", "expected key=value"},
      {"--amp f16 --policy scripts/policies/missing.lua", "missing.lua"},
      {"--amp f16 --policy " .. bad, "the file must return a policy"},
    } do
      local out, code = run(case[1])
      assert.are.equal(2, code, case[1] .. ": " .. out)
      assert.is_truthy(out:find(case[2], 1, true), case[1] .. ": " .. out)
    end
    os.remove(bad)
  end)

  it("resumes an AMP run mid-epoch bit-identically: weights, scale, counters, skips", function()
    local straight, half, resumed = tmp("s"), tmp("h"), tmp("r")
    local pol = "--amp f16 --seed 5 --policy dynamic:init=2^20,interval=7"
    local out_s, cs = run(pol .. " --max-steps 40 --save " .. straight)
    assert.are.equal(0, cs, out_s)
    assert.are.equal(0, select(2, run(pol .. " --max-steps 17 --save " .. half)))
    local out, code = run(pol .. " --max-steps 40 --resume " .. half .. " --save " .. resumed)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("resumed from", 1, true))
    local ok, where = same_model(straight, resumed)
    assert.is_true(ok, where)
    local a, b = mp.load(straight), mp.load(resumed)
    assert.are.equal(40, b.step)
    assert.are.equal(a.scaler.scale, b.scaler.scale)
    assert.are.equal(a.scaler.tracker, b.scaler.tracker)
    assert.are.equal(a.scaler.skipped, b.scaler.skipped)
    assert.is_true(a.scaler.skipped > 0)                      -- the scale did move
    local s1, o1, d1 = tail(out_s)
    local s2, o2, d2 = tail(out)
    assert.are.same({s1, o1, d1}, {s2, o2, d2})
    -- the checkpoint's --amp and --policy must match
    for _, args in ipairs{"--amp bf16 --seed 5", "--amp f16 --seed 5", "--seed 5",
                          "--amp f16 --seed 5 --policy dynamic:init=2^20,interval=8"} do
      local o, c = run(args .. " --max-steps 40 --resume " .. half)
      assert.are.equal(2, c, args .. ": " .. o)
      assert.is_truthy(o:find("--resume: the checkpoint was made with --amp f16 --policy dynamic:init=2^20,interval=7", 1, true), o)
    end
    -- and an FP32 checkpoint does not resume as an AMP run
    local plain = tmp("p")
    assert.are.equal(0, select(2, run("--seed 5 --max-steps 5 --save " .. plain)))
    local o, c = run("--amp f16 --seed 5 --max-steps 10 --resume " .. plain)
    assert.are.equal(2, c, o)
    assert.is_truthy(o:find("made with --amp off", 1, true), o)
    os.remove(straight); os.remove(half); os.remove(resumed); os.remove(plain)
  end)

  it("resumes a run with a Lua policy, its state included", function()
    local pf = tmp("pol.lua")
    local f = assert(io.open(pf, "w"))
    f:write('local L = dofile("scripts/policies/logging.lua")\n',
            'return getmetatable(L).__index.new{init = 2^18, interval = 5}\n')
    f:close()
    local straight, half, resumed = tmp("s"), tmp("h"), tmp("r")
    local pol = "--amp f16 --seed 4 --policy " .. pf
    assert.are.equal(0, select(2, run(pol .. " --max-steps 30 --save " .. straight, { MP_POLICY_LOG_EVERY = "1000" })))
    assert.are.equal(0, select(2, run(pol .. " --max-steps 13 --save " .. half, { MP_POLICY_LOG_EVERY = "1000" })))
    local out, code = run(pol .. " --max-steps 30 --resume " .. half .. " --save " .. resumed, { MP_POLICY_LOG_EVERY = "1000" })
    assert.are.equal(0, code, out)
    assert.is_true(same_model(straight, resumed))
    local a, b = mp.load(straight), mp.load(resumed)
    assert.are.equal(a.scaler.scale, b.scaler.scale)
    assert.are.equal(a.scaler.policy.state.tracker, b.scaler.policy.state.tracker)
    os.remove(straight); os.remove(half); os.remove(resumed); os.remove(pf)
  end)
end)

describe("train_mlp.lua --amp fp8", function()
  it("resumes an FP8 delayed-scaling run mid-epoch bit-identically, the amax histories included", function()
    local straight, half, resumed = tmp("s8"), tmp("h8"), tmp("r8")
    local args = "--amp fp8 --recipe delayed --seed 3"
    local out_s, cs = run(args .. " --max-steps 6 --save " .. straight)
    assert.are.equal(0, cs, out_s)
    assert.is_truthy(out_s:find("fp8 recipe delayed (x e4m3/tensor, w e4m3/tensor, g e5m2/tensor)", 1, true), out_s)
    assert.are.equal(0, select(2, run(args .. " --max-steps 3 --save " .. half)))
    local out, code = run(args .. " --max-steps 6 --resume " .. half .. " --save " .. resumed)
    assert.are.equal(0, code, out)
    local ok, where = same_model(straight, resumed)
    assert.is_true(ok, where)
    local a, b = mp.load(straight), mp.load(resumed)
    for name, st in pairs(a.fp8.tensors) do
      assert.are.same(st.state.history:totable(), b.fp8.tensors[name].state.history:totable(), name)
      assert.are.same(st.state.scale:totable(), b.fp8.tensors[name].state.scale:totable(), name)
    end
    assert.are.equal(6, a.fp8.tensors["0.x"].steps_seen)
    local o, c = run("--amp fp8 --recipe current --seed 3 --max-steps 6 --resume " .. half)
    assert.are.equal(2, c, o)
    assert.is_truthy(o:find("--recipe delayed; this run has --amp fp8 --policy none --recipe current", 1, true), o)
    os.remove(straight); os.remove(half); os.remove(resumed)
  end)

  it("trains under current and block scaling; rejects --recipe without --amp fp8 and unknown recipes", function()
    for _, r in ipairs{"current", "block"} do
      local out, code = run("--amp fp8 --recipe " .. r .. " --max-steps 3")
      assert.are.equal(0, code, out)
      local acc = tonumber(out:match("final test accuracy: (0%.%d+)"))
      assert.is_true(acc ~= nil and acc > 0.2, out)
    end
    for _, c in ipairs{{"--recipe block", "--recipe needs --amp fp8"},
                       {"--amp fp8 --recipe bogus", "--recipe must be delayed, current, block, mx"},
                       {"--amp f8", "--amp must be off, f16, bf16 or fp8"}} do
      local o, code = run(c[1] .. " --max-steps 1")
      assert.are.equal(2, code, o)
      assert.is_truthy(o:find(c[2], 1, true), o)
    end
  end)
end)

describe("underflow.lua --quick", function()
  it("shows f16 without scaling stalling, f16 with scaling matching FP32, and why", function()
    local out, code = sh("scripts/underflow.lua", "--quick")
    assert.are.equal(0, code, out)
    local un, un0 = out:match("f16 unscaled: test accuracy (0%.%d+) after %d+ steps %(from (0%.%d+)%)")
    assert.is_not_nil(un, out)
    assert.is_true(math.abs(tonumber(un) - tonumber(un0)) < 0.02, out)
    local sc, fp = out:match("f16 x 2%^20:%s+test accuracy (0%.%d+), fp32 (0%.%d+)")
    assert.is_not_nil(sc, out)
    assert.is_true(tonumber(fp) > 0.6, out)
    assert.is_true(math.abs(tonumber(sc) - tonumber(fp)) < 0.02, out)
    -- the telemetry: every gradient of the unscaled run is zero, all of d loss/d logits flushed
    assert.is_truthy(out:match("f16 unscaled%s+step 1%s+1280 nonzero values, flushed to 0 by f16%s+1280 %(100.00%%%)"), out)
    assert.is_truthy(out:match("\n0%.weight%s+[%d.%%]+ / [%d.%%]+%s+100%.00%% / 0 "), out)
  end)
end)
