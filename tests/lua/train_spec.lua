-- train_spec.lua: scripts/train_mlp.lua end to end, in child processes: options,
-- bit-identical weights for the same seed, and a run saved after k steps and
-- resumed giving bit-identical weights to a straight run.
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local script = "scripts/train_mlp.lua"

local run = H.script(script)

local function tmp(name) return os.tmpname() .. "-" .. name end

local same_model = H.same_model

describe("train_mlp.lua", function()
  it("trains, prints its final accuracy last, and writes metrics", function()
    local ck, metrics = tmp("a.safetensors"), tmp("m.jsonl")
    local out, code = run("--max-steps 200 --seed 3 --save " .. ck .. " --metrics " .. metrics)
    assert.are.equal(0, code, out)
    local acc = tonumber(out:match("final test accuracy: (0%.%d%d%d%d)%s*exit="))
    assert.is_not_nil(acc, out)
    assert.is_true(acc > 0.7, out)   -- 200 steps of Adam already pass 70%
    local lines = {}
    for l in io.lines(metrics) do lines[#lines + 1] = l end
    assert.are.equal(2, #lines)
    assert.is_truthy(lines[2]:match('^{"step": 200, "epoch": 1, "loss": [%d.e-]+, "lr": 0.001, "samples_per_s": [%d.]+}$'), lines[2])
    os.remove(ck); os.remove(metrics)
  end)

  it("gives bit-identical weights for the same seed, different ones for another", function()
    local a, b, c = tmp("a"), tmp("b"), tmp("c")
    assert.are.equal(0, select(2, run("--max-steps 30 --seed 7 --save " .. a)))
    assert.are.equal(0, select(2, run("--max-steps 30 --seed 7 --save " .. b)))
    assert.are.equal(0, select(2, run("--max-steps 30 --seed 8 --save " .. c)))
    assert.is_true(same_model(a, b))
    assert.is_false(same_model(a, c))
    os.remove(a); os.remove(b); os.remove(c)
  end)

  it("resumes mid-epoch bit-identically to a straight run", function()
    local straight, half, resumed = tmp("s"), tmp("h"), tmp("r")
    assert.are.equal(0, select(2, run("--max-steps 40 --seed 5 --save " .. straight)))
    assert.are.equal(0, select(2, run("--max-steps 17 --seed 5 --save " .. half)))
    local out, code = run("--max-steps 40 --seed 5 --resume " .. half .. " --save " .. resumed)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("resumed from", 1, true))
    local ok, where = same_model(straight, resumed)
    assert.is_true(ok, where)
    assert.are.equal(40, mp.load(resumed).step)
    os.remove(straight); os.remove(half); os.remove(resumed)
  end)

  it("--tiny K: the loss and Adam's eps times 2^-K give the ordinary run's weights, bit for bit, in f32", function()
    local a, b = tmp("a"), tmp("b")
    assert.are.equal(0, select(2, run("--max-steps 20 --seed 4 --save " .. a)))
    assert.are.equal(0, select(2, run("--max-steps 20 --seed 4 --tiny 20 --save " .. b)))
    local ok, where = same_model(a, b)
    assert.is_true(ok, where)
    os.remove(a); os.remove(b)
  end)

  it("--inject-overflow N: every N-th step's backward overflows and the scaler skips it", function()
    local out, code = run("--max-steps 10 --amp f16 --inject-overflow 5")
    assert.are.equal(0, code, out)
    assert.is_truthy(out:match("skipped steps: 2 of 10"), out)
  end)

  it("rejects bad options with a clear message", function()
    for _, case in ipairs{
      {"--epochs 0", "--epochs must be a positive integer"},
      {"--lr abc", "--lr must be a positive number"},
      {"--bogus 1", "unknown option --bogus"},
      {"--amp f32", "--amp must be off, f16, bf16 or fp8"},
      {"--policy dynamic", "--policy needs --amp f16 or bf16"},
      {"--amp off --policy static:1024", "--policy needs --amp f16 or bf16"},
      {"--amp f16 --policy bogus", "--policy must be static, none, dynamic, hysteresis, amax"},
      {"--batch", "needs a value"},
      {"--inject-overflow 5", "--inject-overflow needs --amp f16 or bf16"},
      {"--trace t.jsonl", "--trace needs --amp f16 or bf16"},
      {"--tiny -1", "--tiny must be a positive integer"},
    } do
      local out, code = run(case[1])
      assert.are_not.equal(0, code, case[1])
      assert.is_truthy(out:find(case[2], 1, true), case[1] .. ": " .. out)
    end
  end)
end)
