-- gpu_step_model_spec.lua: scripts/bench/gpu/step_model.lua, the model of the
-- GPT-2-small step that `make bench-gpu` prints before any measurement: its
-- parameter count is gpt.lua's, its FLOPs are the textbook ones (plus the flash
-- backward's two recomputed products), every row's time is its roofline at 50%
-- and the target is their sum; the planned step (fused epilogues, no copies) is
-- printed under it.

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

  -- attention, causal tiles halving each product of 2 B T^2 d: 2 forward (S, PV)
  -- and 7 backward as kernels/cuda/cuda_flash.cu runs it (k_flash_dkv: S, dP, dV,
  -- dK; k_flash_dq: S, dP, dQ), 5 as planned (S, dP, dV, dK, dQ in one pass)
  it("has the GEMMs' 6 N (12 L d^2 + V d) FLOPs and attention's 9 L B T^2 d today, 7 as planned", function()
    local cfg = gpt2(8)
    local _, total = M.table(cfg)
    local _, plan = M.table(cfg, nil, "planned")
    local N, d, L, V, T = 8 * 1024, 768, 12, 50304, 1024
    assert.are.equal(6 * N * (12 * L * d * d + V * d), total.gemm_flops)
    assert.are.equal(6 * N * (12 * L * d * d + V * d), plan.gemm_flops)
    assert.are.equal(9 * L * 8 * T * T * d, total.attn_flops)
    assert.are.equal(7 * L * 8 * T * T * d, plan.attn_flops)
    assert.is_true(math.abs(plan.flops / 1e12 - 6.6) < 0.05)    -- the issue's estimate of the step
    assert.is_true(math.abs(total.flops / 1e12 - 6.77) < 0.01)  -- + 2 L B T^2 d = 0.155 TFLOP
  end)

  -- the passes today that the plan fuses away, each row's bytes from the code it
  -- stands for (N = B T tokens, f16 h = 2, f32 f = 4 bytes)
  it("counts the passes the code runs today that the plan fuses away", function()
    local cfg = gpt2(8)
    local N, d, L, h, f = 8 * 1024, 768, 12, 2, 4
    local by = {}
    for _, r in ipairs(M.kernels(cfg)) do by[r.name] = r end
    local function row(name, calls, bytes)
      assert.truthy(by[name], name)
      assert.are.equal(calls, by[name].calls, name)
      assert.are.equal(bytes, by[name].bytes, name)
    end
    -- c_fc: the erf GELU is no cuBLASLt epilogue: h in, y out; backward g, h in, dh out
    row("GELU (erf) pass: pre-activation in, activation out", L, 2 * h * N * 4 * d)
    row("GELU backward pass: g, pre-activation in, dh out", L, 3 * h * N * 4 * d)
    -- dW in f16 (+ the bias gradient), then widened (h in, f out) and added (f, f in, f out)
    row("attn.c_proj dW GEMM (f16 dW, bias grad)", L, h * (2 * N * d) + h * (d * d + d))
    row("attn.c_proj dW: widen to f32 + add into .grad", L, (h + 4 * f) * (d * d + d))
    -- q, k, v: one permute of the QKV output ({B,T,3C} in, {3,B,H,T,Dh} out; the
    -- three are its slabs, views), the output's transpose; backward the output
    -- gradient's transpose; chunk's gradient by narrow_pad: one slab padded (the
    -- slab in, {3,B,H,T,Dh} out), the other two added into that sum in place (the
    -- sum in, + 0 outside written back only where its bits change; the slab's g in
    -- and the slab out), then one permute back
    row("permute {B,T,3,H,Dh} -> {3,B,H,T,Dh} (q, k, v its slabs)", L, 2 * h * 3 * N * d)
    row("transpose copy of the attention output", L, 2 * h * N * d)
    row("transpose copy of the output's gradient", L, 2 * h * N * d)
    row("chunk backward: a slab padded to {3,B,H,T,Dh} (narrow_pad)", L, h * (N * d + 3 * N * d))
    row("chunk backward: 2 slabs added in place (narrow_pad add)", 2 * L, h * (3 * N * d + 2 * N * d))
    row("permute backward {3,B,H,T,Dh} -> {B,T,3,H,Dh}", L, 2 * h * 3 * N * d)
    for _, r in ipairs(M.kernels(cfg)) do   -- gpt.lua makes no narrow copies of q, k, v
      assert.falsy(r.name:match("narrow copies") or r.name:match("transpose copies"), r.name)
    end
    for _, r in ipairs(M.kernels(cfg, "planned")) do
      assert.falsy(r.name:match("chunk") or r.name:match("transpose") or r.name:match("permute") or r.name:match("widen")
                   or r.name:match("GELU %(erf%) pass") or r.name:match("GELU backward pass"), r.name)
    end
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
      if r.name:match("^zero_grad") or r.name:match("^scaler") or r.name:match("AdamW") or r.name:match("widen") then
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
    assert.has_error(function() M.kernels(gpt2(2), "fused") end,
      'step_model.kernels: plan must be "today" or "planned" (got fused)')
  end)

  it("prints the table when run as a script", function()
    local exe = os.getenv("MP_TEST_BUILD") and (os.getenv("MP_TEST_BUILD") .. "/mpengine") or (root .. "build/mpengine")
    local f = io.popen(string.format("cd %q && %q scripts/bench/gpu/step_model.lua 8 2>&1", root, exe))
    local out = f:read("a")
    f:close()
    assert.truthy(out:find("batch 8 %(124%.5 M parameters%)"), out)
    assert.truthy(out:find("flash attention backward"), out)
    -- today 6769.4 GFLOP, 29.812 ms at batch 8 (30.233 while q, k, v were chunk(3, 3)'s
    -- narrow copies and three transposes; 31.567 before CUDA's narrow_pad: chunk's
    -- gradient was three fills of zeros, three puts and two out-of-place adds); as
    -- planned 24.874 ms (the table before it, which took the plan for the code, gave
    -- 6614.8 GFLOP and 24.87 ms)
    assert.truthy(out:match("target step %(the sum%)%s+6769%.4%s+%d+%.%d%s+29%.812"), out)
    assert.truthy(out:find("as planned %b(): 24%.874 ms"), out)
  end)
end)
