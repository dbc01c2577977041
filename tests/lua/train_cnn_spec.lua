-- train_cnn_spec.lua: scripts/train_cnn.lua end to end, in child processes: it trains
-- and prints its accuracy last; a run saved mid-epoch and resumed matches a straight
-- run bit for bit, batch norm's running statistics included; --amp f16 runs with the
-- loss scaler and reports its skipped steps. (The options themselves are
-- scripts/lib/train_classifier.lua's, tested through train_mlp.lua in train_spec.lua.)
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local run = H.script("scripts/train_cnn.lua")
local function tmp(name) return os.tmpname() .. "-" .. name end

-- every tensor of two checkpoints' models (parameters and buffers), bit for bit
local function same_model(a, b)
  local ca, cb = mp.load(a).model, mp.load(b).model
  local n = 0
  for k, t in pairs(ca) do
    local u = assert(cb[k], "missing " .. k)
    local x, y = t:reshape { -1 }:totable(), u:reshape { -1 }:totable()
    for i = 1, #x do
      if string.pack("<d", x[i]) ~= string.pack("<d", y[i]) then return false, k .. "[" .. i .. "]" end
    end
    n = n + 1
  end
  return n == 16, "tensor count " .. n   -- 4 convolution/linear weights, 2 biases, 2 x (2 + 3) of batch norm
end

describe("train_cnn.lua", function()
  it("trains, prints its final accuracy last, and resumes mid-epoch bit-identically", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local straight, half, resumed = tmp("s"), tmp("h"), tmp("r")
    local out, code = run("--max-steps 24 --seed 2 --save " .. straight)
    assert.are.equal(0, code, out)
    local acc = tonumber(out:match("final test accuracy: (0%.%d%d%d%d)%s*exit="))
    assert.is_true(acc ~= nil and acc > 0.5, out)   -- 24 steps of Adam with batch norm already pass 50%
    assert.are.equal(0, select(2, run("--max-steps 9 --seed 2 --save " .. half)))
    out, code = run("--max-steps 24 --seed 2 --resume " .. half .. " --save " .. resumed)
    assert.are.equal(0, code, out)
    local ok, where = same_model(straight, resumed)
    assert.is_true(ok, where)
    local ck = mp.load(resumed)
    assert.are.equal(24, ck.step)
    assert.are.equal(24, ck.model["bn1.num_batches_tracked"]:item())
    os.remove(straight); os.remove(half); os.remove(resumed)
  end)

  -- Issue 24: the test set was evaluated in batches of 1000, which took the run's
  -- peak from 144 MB (training at batch 128) to 760 MB and its RSS to 1.1 GB
  it("evaluates in batches of the training batch and needs no more memory for it than training", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local r = H.child([[
      local made, real = {}, mp.data.loader
      mp.data.loader = function(ds, o)
        made[#made + 1] = { batch = o.batch, peak = mp.memory("cpu").peak }
        return real(ds, o)
      end
      arg = { "--max-steps", "6", "--batch", "100" }
      dofile(]] .. H.q(H.root .. "/scripts/train_cnn.lua") .. [[)
      local eval = made[#made]   -- the last loader made: the evaluation's, after training
      return string.format("%d %d %d", eval.batch, eval.peak, mp.memory("cpu").peak)]])
    local batch, trained, peak = r.out:match("OK:(%d+) (%d+) (%d+)$")
    assert.is_truthy(batch, r.out .. r.err)
    assert.are.equal("100", batch)
    trained, peak = tonumber(trained), tonumber(peak)
    -- within 1 MiB: where the collector runs depends on the Lua heap's size
    -- (lua/lbind.c paces it at 64 x the heap), so a few KB more Lua code moves
    -- the peak by some KB either way; the batches of 1000 added 600 MB
    assert.is_true(peak <= trained + 2 ^ 20, string.format("evaluation raised the peak from %.1f MiB to %.1f MiB",
                                                           trained / 2 ^ 20, peak / 2 ^ 20))
  end)

  it("trains under f16 autocast with the loss scaler, and traces it with --trace", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local trace = tmp("t.jsonl.gz")
    local out, code = run("--max-steps 6 --amp f16 --trace " .. trace)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:match("skipped steps: %d+ of 6"), out)
    assert.is_truthy(out:match("final test accuracy: 0%.%d%d%d%d%s*exit="), out)
    local tr = mp.amp.load_trace(trace)
    assert.are.equal(6, #tr.steps)
    assert.are.equal("train_cnn.lua", tr.header.meta.script)
    assert.are.equal("conv1.weight", tr.header.params[1])
    assert.are.equal(#tr.header.params, #tr.steps[6].params)
    os.remove(trace)
    out, code = run("--max-steps 2 --trace " .. trace)
    assert.are.equal(2, code)
    assert.is_truthy(out:find("--trace needs --amp f16 or bf16", 1, true), out)
  end)

  it("--amp fp8 runs its linear layers in FP8 (block scaling) and saves the recipe's state", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local ck = tmp("ck8")
    local out, code = run("--max-steps 3 --amp fp8 --recipe block --save " .. ck)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("fp8 recipe block (x e4m3/tile, w e4m3/block, g e4m3/tile)", 1, true), out)
    assert.is_truthy(out:match("final test accuracy: 0%.%d%d%d%d%s*exit="), out)
    local c = mp.load(ck)
    assert.are.equal("block", c.fp8.recipe)
    assert.are.equal(3, c.fp8.tensors["fc1.w"].steps_seen)
    os.remove(ck)
  end)
end)
