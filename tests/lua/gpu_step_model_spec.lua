-- gpu_step_model_spec.lua: scripts/bench/gpu/step_model.lua, the model of the
-- GPT-2-small step that `make bench-gpu` prints before any measurement: its
-- parameter count is gpt.lua's, its FLOPs are the textbook ones, every row's time
-- is its roofline at 50% and the target is their sum.

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local root = here .. "../../"
local M = dofile(root .. "scripts/bench/gpu/step_model.lua")

local function gpt2(batch)
  local c = {}
  for k, v in pairs(M.GPT2_SMALL) do c[k] = v end
  c.batch = batch
  return c
end

describe("GPU step model", function()
  it("counts the parameters that scripts/models/gpt.lua makes", function()
    local GPT = dofile(root .. "scripts/models/gpt.lua")
    local cfg = { vocab = 37, ctx = 8, layers = 2, dim = 16, heads = 4 }
    local n = 0
    for _, p in ipairs(GPT(cfg):parameters()) do n = n + p:numel() end
    assert.are.equal(n, M.parameters(cfg))
    assert.are.equal(124475904, M.parameters(M.GPT2_SMALL))   -- GPT-2 small with vocab 50304
  end)

  it("has the GEMMs' 6 N (12 L d^2 + V d) FLOPs and attention's 7 L B T^2 d (causal halves)", function()
    local cfg = gpt2(8)
    local _, total = M.table(cfg)
    local N, d, L, V, T = 8 * 1024, 768, 12, 50304, 1024
    assert.are.equal(6 * N * (12 * L * d * d + V * d), total.gemm_flops)
    assert.are.equal(7 * L * 8 * T * T * d, total.attn_flops)
    assert.is_true(math.abs(total.flops / 1e12 - 6.6) < 0.05)   -- the issue's estimate of the step
  end)

  it("gives each kernel its roofline time at 50% and the target as their sum", function()
    local cfg = gpt2(4)
    local hw = { flops = 100e12, bw = 1e12, at = 0.5 }
    local rows, total = M.table(cfg, hw)
    local ks = M.kernels(cfg)
    assert.are.equal(#ks, #rows)
    local sum = 0
    for i, r in ipairs(rows) do
      local k = ks[i]
      local want = k.calls * math.max(k.flops / 50e12, k.bytes / 0.5e12) * 1e3
      assert.is_true(math.abs(r.ms - want) <= 1e-12 * want, r.name)
      assert.are.equal(k.flops / 50e12 >= k.bytes / 0.5e12 and "compute" or "memory", r.bound, r.name)
      assert.is_true(r.bytes > 0, r.name)
      sum = sum + r.ms
    end
    assert.is_true(math.abs(total.ms - sum) <= 1e-12 * sum)
  end)

  it("scales the per-token kernels with the batch and keeps the per-parameter ones", function()
    local a, b = M.table(gpt2(4)), M.table(gpt2(8))
    for i, r in ipairs(a) do
      if r.name:match("^zero_grad") or r.name:match("^scaler") or r.name:match("AdamW") then
        assert.are.equal(r.bytes, b[i].bytes, r.name)
      else
        assert.is_true(b[i].bytes > 1.5 * r.bytes, r.name)
        assert.are.equal(2 * r.flops, b[i].flops, r.name)
      end
    end
  end)

  it("names the bad field of a configuration", function()
    local cfg = gpt2(0)
    assert.has_error(function() M.kernels(cfg) end, "step_model: cfg.batch must be a positive integer (got 0)")
    cfg = gpt2(2)
    cfg.heads = 5
    assert.has_error(function() M.kernels(cfg) end, "step_model.kernels: cfg.dim (768) must be a multiple of cfg.heads (5)")
    assert.has_error(function() M.kernels("gpt2") end, "step_model.kernels: cfg must be a table")
  end)

  it("prints the table when run as a script", function()
    local exe = os.getenv("MP_TEST_BUILD") and (os.getenv("MP_TEST_BUILD") .. "/mpengine") or (root .. "build/mpengine")
    local f = io.popen(string.format("cd %q && %q scripts/bench/gpu/step_model.lua 8 2>&1", root, exe))
    local out = f:read("a")
    f:close()
    assert.truthy(out:find("batch 8 %(124%.5 M parameters%)"), out)
    assert.truthy(out:find("flash attention backward"), out)
    assert.truthy(out:match("target step %(the sum%)%s+6614%.8"), out)
  end)
end)
