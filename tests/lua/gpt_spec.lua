-- gpt_spec.lua: scripts/train_gpt.lua and scripts/models/gpt.lua end to end, in
-- child processes on a small text: the output's last lines, metrics, gradient
-- accumulation giving the larger batch's step, the model's parameter names,
-- options and resume checks. (The default run on Debian's fortunes is a
-- benchmark figure, not a test.)
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local script = "scripts/train_gpt.lua"

local run = H.script(script)

local function tmp(name) return os.tmpname() .. "-" .. name end

-- a small text: a few kilobytes of repeated sentences
local data = tmp("text.txt")
do
  local lines = {}
  for i = 1, 120 do
    lines[i] = string.format("line %d: the quick brown fox jumps over the lazy dog %d times.", i, i % 7)
  end
  H.spit(data, table.concat(lines, "\n"))
end
local SMALL = "--layers 1 --dim 32 --heads 2 --ctx 16 --eval-batches 2 --data " .. data

describe("train_gpt.lua", function()
  it("trains, prints the final val loss and then a sample, and writes metrics", function()
    local metrics = tmp("m.jsonl")
    local out, code = run(SMALL .. " --batch 8 --steps 40 --eval-every 20 --lr 1e-2 --sample 30 --metrics " .. metrics)
    assert.are.equal(0, code, out)
    local first = tonumber(out:match("step 20/40 .- val loss (%d+%.%d+)"))
    local final = tonumber(out:match("final val loss: (%d+%.%d%d%d)\n"))
    assert.is_not_nil(final, out)
    assert.is_true(final < first, out)
    local sample = out:match("final val loss: [%d.]+\n(.*)exit=")
    assert.is_true(#sample >= 30, "sample: " .. tostring(sample))
    local n = 0
    for l in io.lines(metrics) do
      n = n + 1
      assert.is_truthy(l:match('^{"step": %d+, "loss": [%d.e-]+, "val_loss": [%d.e-]+, "lr": [%d.e-]+, "tokens_per_s": [%d.]+}$'), l)
    end
    assert.are.equal(2, n)
    os.remove(metrics)
  end)

  it("--accum 2 --batch 4 gives the step of --batch 8: the same gradients to f32 rounding", function()
    -- the gradients themselves (Adam's first steps are nearly sign(g), which makes
    -- a rounding-level difference in a gradient that is 0 in exact arithmetic, such
    -- as the key bias's, a difference of lr in that weight)
    local GPT = dofile("scripts/models/gpt.lua")
    local text = mp.data.text(data)
    mp.manual_seed(0)
    local m = GPT { vocab = text.vocab_size, ctx = 16, layers = 1, dim = 32, heads = 2 }
    local function loss(x, y) return mp.cross_entropy(m(x):reshape { -1, text.vocab_size }, y:reshape { -1 }) end
    mp.manual_seed(5)
    local x, y = mp.data.windows(text.train, 8, 16)
    loss(x, y):backward()
    local whole = {}
    for i, p in ipairs(m:parameters()) do whole[i] = p.grad:clone() end
    m:zero_grad()
    mp.manual_seed(5)
    for _ = 1, 2 do   -- the same windows: four and then four more draws of one stream
      local xa, ya = mp.data.windows(text.train, 4, 16);
      (loss(xa, ya) / 2):backward()
    end
    for i, p in ipairs(m:parameters()) do
      local scale = math.max(whole[i]:abs():max():item(), 1e-3)
      local d = (p.grad - whole[i]):abs():max():item() / scale
      assert.is_true(d < 1e-5, "parameter " .. i .. ": " .. d)
    end
    -- and the script's first step sees the same loss either way
    local outs = {}
    for i, args in ipairs { "--batch 8", "--batch 4 --accum 2" } do
      local out, code = run(SMALL .. " " .. args .. " --steps 1 --eval-every 1")
      assert.are.equal(0, code, out)
      outs[i] = out:match("step 1/1  loss (%d+%.%d+)")
    end
    assert.are.equal(outs[1], outs[2])
  end)

  it("resumes from its checkpoint and refuses a different model", function()
    local ck = tmp("ck")
    assert.are.equal(0, select(2, run(SMALL .. " --batch 4 --steps 4 --eval-every 2 --save " .. ck)))
    local out, code = run(SMALL .. " --batch 4 --steps 6 --eval-every 2 --resume " .. ck)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("resumed from .- at step 4"), out)
    assert.is_truthy(out:find("step 6/6"), out)
    out, code = run("--layers 2 --dim 32 --heads 2 --ctx 16 --eval-batches 2 --data " .. data .. " --batch 4 --steps 6 --resume " .. ck)
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("checkpoint has %-%-layers 1"), out)
    os.remove(ck)
  end)

  it("--trace records every step, the loss summed over its micro-batches, names in the optimizer's order", function()
    local trace = tmp("t.jsonl")
    local out, code = run(SMALL .. " --batch 4 --accum 2 --steps 3 --eval-every 3 --amp f16 --trace " .. trace)
    assert.are.equal(0, code, out)
    local tr = mp.amp.load_trace(trace)
    assert.are.equal(3, #tr.steps)
    assert.are.equal("train_gpt.lua", tr.header.meta.script)
    assert.are.equal(2, tr.header.meta.accum)
    -- AdamW's decay group (the Linear weights: 4 per layer) first, then the rest
    local names, seen = tr.header.params, {}
    for i, n in ipairs(names) do
      local linear = n:match("c_attn%.weight$") or n:match("c_proj%.weight$") or n:match("c_fc%.weight$")
      assert.are.equal(i <= 4, linear ~= nil, n .. " at " .. i)
      assert.is_nil(seen[n], n)
      seen[n] = true
    end
    assert.are.equal(#names, #tr.steps[1].params)
    assert.is_true(seen["wte.weight"] and seen["ln_f.bias"])
    local step3 = tonumber(out:match("step 3/3%s+loss (%d+%.%d+)"))
    assert.is_true(math.abs(tr.steps[3].loss - step3) < 1e-3, out .. " trace " .. tr.steps[3].loss)
    os.remove(trace)
  end)

  it("--amp fp8 trains under each recipe (and a recipe file), naming it in the header line", function()
    local file = tmp("recipe.lua")
    H.spit(file, "return mp.fp8.delayed{history = 4, algo = 'most_recent'}")
    for _, r in ipairs {"delayed", "current", "block", file} do
      local out, code = run(SMALL .. " --batch 4 --steps 3 --eval-every 3 --amp fp8 --recipe " .. r)
      assert.are.equal(0, code, out)
      local name = r == file and "delayed" or r
      assert.is_truthy(out:find("; fp8 recipe " .. name .. " %(x e4m3/"), out)
      local v = tonumber(out:match("final val loss: (%d+%.%d%d%d)\n"))
      assert.is_true(v ~= nil and v < 10, out)
    end
    os.remove(file)
  end)

  it("--amp fp8 --fp8-trace records every FP8 tensor at each step; --recipe takes a built-in's options", function()
    local trace = tmp("fp8trace.jsonl")
    local out, code = run(SMALL .. " --batch 4 --steps 3 --eval-every 3 --amp fp8 --recipe delayed:history=2,margin=1"
                          .. " --fp8-trace " .. trace)
    assert.are.equal(0, code, out)
    local tr = mp.fp8.load_trace(trace)
    assert.are.equal(3, #tr.steps)
    assert.are.equal("delayed", tr.header.recipe)
    assert.are.equal("delayed:history=2,margin=1", tr.header.meta.recipe)
    local names = {}
    for _, t in ipairs(tr.header.tensors) do names[t.name] = t.kind end
    assert.are.equal("g", names["h.0.mlp.c_fc.g"])
    assert.are.equal(#tr.header.tensors, #tr.steps[3].amax)
    for _, a in ipairs(tr.steps[3].amax) do assert.is_true(a > 0, "every tensor was quantized at step 3") end
    os.remove(trace)
    out, code = run(SMALL .. " --steps 2 --fp8-trace " .. trace)
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("--fp8-trace needs --amp fp8", 1, true), out)
  end)

  it("--fp8-matmul runs the tied head in FP8 (states mp.linear1.*), checkpoints say so, and needs --amp fp8", function()
    local trace, ck = tmp("fp8mm.jsonl"), tmp("ck8mm")
    local args = SMALL .. " --batch 4 --steps 2 --eval-every 2 --amp fp8 --recipe delayed"
    local out, code = run(args .. " --fp8-matmul --fp8-trace " .. trace .. " --save " .. ck)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("; tied head in fp8", 1, true), out)
    local v = tonumber(out:match("final val loss: (%d+%.%d%d%d)\n"))
    assert.is_true(v ~= nil and v < 10, out)
    local tr = mp.fp8.load_trace(trace)
    local names = {}
    for i, t in ipairs(tr.header.tensors) do names[t.name] = i end
    assert.is_not_nil(names["mp.linear1.w"], "the head's weight is an FP8 tensor")
    assert.is_true(tr.steps[2].amax[names["mp.linear1.g"]] > 0, "the head's gradient was quantized")
    assert.is_not_nil(names["h.0.mlp.c_fc.x"])
    out, code = run(args .. " --fp8-trace " .. trace)
    assert.are.equal(0, code, out)
    assert.is_falsy(out:find("tied head", 1, true), out)
    tr = mp.fp8.load_trace(trace)
    for _, t in ipairs(tr.header.tensors) do assert.is_nil(t.name:match("^mp%."), t.name) end
    out, code = run(SMALL .. " --batch 4 --steps 4 --eval-every 2 --amp fp8 --recipe delayed --resume " .. ck)
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("checkpoint was trained with --fp8-matmul", 1, true), out)
    out, code = run(SMALL .. " --steps 2 --fp8-matmul")
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("--fp8-matmul needs --amp fp8", 1, true), out)
    os.remove(trace)
    os.remove(ck)
  end)

  it("--amp fp8 --recipe mx trains", function()
    local out, code = run(SMALL .. " --batch 4 --steps 3 --eval-every 3 --amp fp8 --recipe mx")
    assert.are.equal(0, code, out)
  end)

  it("--amp fp8 saves the recipe's state under the layers' paths, resumes it, and refuses another recipe", function()
    -- (bit for bit resumes are checked where the run's length does not move the lr
    -- schedule: train_mlp.lua in amp_scripts_spec.lua, and fp8_recipes_spec.lua)
    local ck = tmp("ck8")
    local args = SMALL .. " --batch 4 --eval-every 2 --amp fp8 --recipe delayed"
    assert.are.equal(0, select(2, run(args .. " --steps 4 --save " .. ck)))
    local c = mp.load(ck)
    local st = c.fp8.tensors["h.0.attn.c_attn.x"]
    assert.is_not_nil(st, "the layers' names are the model's paths")
    assert.are.equal(4, st.steps_seen)
    assert.are.equal(1024, st.state.history:numel())
    assert.is_true(st.state.history[4]:item() > 0 and st.state.history[5]:item() == 0)
    local out, code = run(args .. " --steps 6 --resume " .. ck)
    assert.are.equal(0, code, out)
    assert.is_truthy(out:find("resumed from .- at step 4"), out)
    out, code = run(SMALL .. " --batch 4 --steps 6 --amp fp8 --recipe current --resume " .. ck)
    assert.are.equal(2, code, out)
    assert.is_truthy(out:find("checkpoint has --recipe delayed", 1, true), out)
    os.remove(ck)
  end)

  it("rejects bad options, naming them", function()
    for _, c in ipairs {
      { "--recipe block", "--recipe needs --amp fp8" },
      { "--amp fp8 --recipe tensorwise", "--recipe: a recipe must be delayed, current, block or mx" },
      { "--amp fp8 --recipe /nonexistent/r.lua", "/nonexistent/r.lua" },
      { "--bogus 1", "unknown option --bogus" },
      { "--dim 30 --heads 4", "multiple of --heads" },
      { "--amp f32", "--amp must be" },
      { "--steps 0", "--steps must be a positive integer" },
      { "--data /nonexistent/text", "mp.data.text: cannot open path '/nonexistent/text': No such file or directory" },
      { "--data /dev/null", "mp.data.text: path '/dev/null' is a character device, not a regular file" },
      { "--trace t.jsonl", "--trace needs --amp f16 or bf16" },
    } do
      local out, code = run(c[1])
      assert.are_not.equal(0, code, c[1])
      assert.is_truthy(out:find(c[2], 1, true), c[1] .. " -> " .. out)
    end
  end)
end)

describe("scripts/models/gpt.lua", function()
  it("initialises as GPT-2: the first loss is within 0.5 of ln(vocab)", function()
    local GPT = dofile("scripts/models/gpt.lua")
    for _, cfg in ipairs {
      { vocab = 114, ctx = 64, layers = 2, dim = 128, heads = 4 },   -- train_gpt.lua's default
      { vocab = 50, ctx = 16, layers = 4, dim = 64, heads = 4 },
    } do
      mp.manual_seed(0)
      local m = GPT(cfg)
      local function rms(t) return (t * t):mean():item() ^ 0.5 end
      local named, names = m:named_parameters()
      local proj = 0.02 / math.sqrt(2 * cfg.layers)
      for _, n in ipairs(names) do
        local p, want = named[n], nil
        if n:match("ln_") then want = n:match("weight$") and 1 or 0
        elseif n:match("bias$") then want = 0
        elseif n:match("c_proj%.weight$") then want = proj
        else want = 0.02 end
        assert.is_true(math.abs(rms(p) - want) <= 0.1 * want + 1e-12, string.format("%s: rms %.5f, want %.5f", n, rms(p), want))
      end
      local x = mp.randint(0, cfg.vocab, { 8, cfg.ctx })
      local y = mp.randint(0, cfg.vocab, { 8, cfg.ctx })
      local loss = mp.cross_entropy(m(x):reshape { -1, cfg.vocab }, y:reshape { -1 }):item()
      assert.is_true(math.abs(loss - math.log(cfg.vocab)) < 0.5, string.format("first loss %.3f, ln(vocab) %.3f", loss, math.log(cfg.vocab)))
    end
    -- and train_gpt.lua's first step on the small text
    local out, code = run(SMALL .. " --batch 8 --steps 1 --eval-every 1")
    assert.are.equal(0, code, out)
    local first = tonumber(out:match("step 1/1  loss (%d+%.%d+)"))
    local V = mp.data.text(data).vocab_size
    assert.is_true(first and math.abs(first - math.log(V)) < 0.5, out)
  end)

  it("has PyTorch's parameter names and an output tied to the token embedding", function()
    local GPT = dofile("scripts/models/gpt.lua")
    mp.manual_seed(0)
    local m = GPT { vocab = 20, ctx = 8, layers = 2, dim = 16, heads = 4 }
    local _, names = m:named_parameters()
    assert.are.same({ "wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.c_attn.weight",
                      "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight",
                      "h.0.ln_2.bias", "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias", "h.0.mlp.c_proj.weight",
                      "h.0.mlp.c_proj.bias" }, { table.unpack(names, 1, 14) })
    assert.are.equal("ln_f.bias", names[#names])
    local idx = mp.randint(0, 20, { 3, 8 })
    local logits = m(idx)
    assert.are.same({ 3, 8, 20 }, logits.shape)
    mp.cross_entropy(logits:reshape { -1, 20 }, idx:reshape { -1 }):backward()
    assert.are.same({ 20, 16 }, m.wte.weight.grad.shape)   -- the tied output's gradient reaches the embedding
    local s = m:generate(mp.tensor({ 1, 2 }, { dtype = "i32" }), 5, 0.8, 5)
    assert.are.equal(7, s:numel())
  end)
end)
