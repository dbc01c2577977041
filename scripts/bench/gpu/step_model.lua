-- step_model.lua: a model of the GPT-2-small f16 AMP training step on an H200,
-- made before any measurement: every kernel the step runs as the CUDA backend
-- runs it today, its FLOPs and the bytes it must move, the H200's ceiling for it,
-- and its time at 50% of that ceiling. The sum of those times is the target step
-- time. `make bench-gpu` prints it on any machine (scripts/bench/gpu/run.sh),
-- before it looks for a GPU, and under it the sum for the step as the
-- transformer-speed work plans to run it (M.kernels(cfg, "planned")): the erf
-- GELU in c_fc's epilogue, GELU's derivative in c_proj's dX epilogue, dW summed
-- straight into the f32 .grad, a flash backward of 5 products, Q, K, V read in
-- place from the QKV GEMM's output and O written in the layout c_proj reads.
--
--   build/mpengine scripts/bench/gpu/step_model.lua [batch]     -- print the table
--   local M = dofile("scripts/bench/gpu/step_model.lua")         -- M.kernels(cfg[, "planned"]), M.table(cfg, hw[, plan])
--
-- The step is bench_gpu.lua's (scripts/models/gpt.lua under f16 autocast,
-- GradScaler(dynamic), AdamW, FP32 master weights): pre-LayerNorm blocks, causal
-- attention, GELU MLP, the output layer tied to the token embedding. What the
-- model assumes about each kernel, so that a measured column can be read against it:
-- - GEMMs take f16 operands (the optimizer writes the f16 working copy of every
--   weight in its own pass, so no cast kernel per step) and sum in f32; the bias
--   is an epilogue (cuBLASLt's EPILOGUE_BIAS). GPT's GELU is the erf form
--   (nn.GELU's default), which cuBLASLt's GELU_AUX_BIAS epilogue does not do
--   (kernels/cuda/cuda_gemm_lt.cu declines it): c_fc is the GEMM with the bias,
--   then a GELU pass reading the pre-activation (kept for the backward) and
--   writing the activation (engine/ops_matmul.c linear_gelu); backward, GELU's
--   derivative is its own pass (unary_grad: g and the pre-activation in, dh out)
--   before c_fc's GEMMs. dW GEMMs write dW (and the bias gradient, their
--   epilogue) in f16; engine/backward.c's accumulate_leaf widens that into an f32
--   tensor and adds it into the f32 .grad (the CUDA backend has no add_widened):
--   2 + 4 + 4 x 3 bytes a weight after the GEMM's own 2.
-- - q, k, v: the QKV GEMM's {B, T, 3C} output, viewed as {B, T, 3, H, Dh}, is
--   permuted to {3, B, H, T, Dh} in one copy, and q, k, v are chunk(3, 1)'s
--   slabs of it, views (scripts/models/gpt.lua; engine/ops_shape.c: a narrow
--   with nothing outside it shares storage); the attention's output goes back by
--   a transpose copy (the reshapes are views). Backward: the output's gradient
--   transposed, chunk's gradient by the backend's narrow_pad
--   (kernels/cuda/cuda_layout.cu): the first slab's padded to {3, B, H, T, Dh}
--   in one pass (the slab read, every element written once), the other two
--   added into that sum in place (engine/backward.c narrow_into_node): the whole
--   sum read (+ 0 outside the slab: an element there is written back only when
--   its bits change, a -0, left out here), the slab's gradient read and the slab
--   written; then one permute back to {B, T, 3, H, Dh}.
-- - Attention is one flash kernel forward (O and the log-sum-exp written) and
--   backward k_flash_dot (D = rowsum(dO * O)), k_flash_dkv over key tiles (S, dP,
--   dV, dK) and k_flash_dq over query tiles (S, dP, dQ), causal tiles skipped
--   (kernels/cuda/cuda_flash.cu): 2 B T^2 d FLOPs forward (two products, half of
--   them causal) and 7 B T^2 d backward.
-- - Layer norm: one pass forward (f32 in and out, mean and rstd kept: its
--   autocast class is f32) and one backward; the f32 -> f16 cast before each
--   Linear (autocast) and its backward (f16 -> f32) are passes of their own, as are
--   the residual additions (f32 + f16 -> f32) and the gradients' accumulation where
--   the residual stream forks.
-- - The cross-entropy reads the f16 logits once forward (keeping each row's
--   log-sum-exp) and once backward (writing f16 dlogits): no f32 copy of them.
-- - Per step: zero_grad (a memset of the f32 gradients), the scaler's unscale +
--   inf/NaN check (read and write the gradients), fused AdamW (read p, g, m, v;
--   write p, m, v and the f16 working copy: 30 bytes a parameter).
-- Ceilings: 790 TFLOP/s dense f16/bf16 (what torch measured on the H200) for the
-- GEMMs and attention, 4.3 TB/s (a device copy) for the rest; each kernel's time
-- at 50% is max(FLOPs / (0.5 x 790 T), bytes / (0.5 x 4.3 T)). Elementwise FLOPs
-- are not counted (they are memory-bound by far). Launch overheads are left out:
-- a step of ~300 kernels captured as a CUDA graph pays a few microseconds each.
local M = {}

M.H200 = { flops = 790e12, bw = 4.3e12, at = 0.5 }
M.GPT2_SMALL = { vocab = 50304, ctx = 1024, layers = 12, dim = 768, heads = 12 }

local function positive_int(cfg, key)
  local v = cfg[key]
  if math.type(v) ~= "integer" or v < 1 then
    error(string.format("step_model: cfg.%s must be a positive integer (got %s)", key, tostring(v)), 3)
  end
  return v
end

-- the parameters of the model, counted as scripts/models/gpt.lua makes them
function M.parameters(cfg)
  local d, L, V, T = cfg.dim, cfg.layers, cfg.vocab, cfg.ctx
  local block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
  return V * d + T * d + L * block + 2 * d
end

-- every kernel of one step: {name, kind = "gemm" | "attn" | "mem", calls, flops, bytes}
-- (flops and bytes per call). cfg: vocab, ctx, layers, dim, heads, batch.
function M.kernels(cfg, plan)
  if plan ~= nil and plan ~= "today" and plan ~= "planned" then
    error(string.format("step_model.kernels: plan must be \"today\" or \"planned\" (got %s)", tostring(plan)), 2)
  end
  local planned = plan == "planned"
  if type(cfg) ~= "table" then error("step_model.kernels: cfg must be a table", 2) end
  for _, k in ipairs { "vocab", "ctx", "layers", "dim", "heads", "batch" } do positive_int(cfg, k) end
  if cfg.dim % cfg.heads ~= 0 then
    error(string.format("step_model.kernels: cfg.dim (%d) must be a multiple of cfg.heads (%d)", cfg.dim, cfg.heads), 2)
  end
  local B, T, d, L, V, H = cfg.batch, cfg.ctx, cfg.dim, cfg.layers, cfg.vocab, cfg.heads
  local N = B * T                  -- tokens
  local h, f = 2, 4                -- bytes of f16 and f32
  local P = M.parameters(cfg)
  local ks = {}
  local function k(name, kind, calls, flops, bytes)
    ks[#ks + 1] = { name = name, kind = kind, calls = calls, flops = flops, bytes = bytes }
  end
  -- a Linear of `fin` -> `fout` features on N rows: forward, dX and dW GEMMs
  local function gemm_fwd(name, fin, fout, epi_bytes)
    k(name .. " GEMM", "gemm", L, 2 * N * fin * fout, h * (N * fin + fin * fout + N * fout) + (epi_bytes or 0))
  end
  local function gemm_bwd(name, fin, fout, epi_bytes, dx_note)
    k(name .. " dX GEMM" .. (dx_note or ""), "gemm", L, 2 * N * fin * fout, h * (N * fout + fin * fout + N * fin) + (epi_bytes or 0))
    if planned then
      k(name .. " dW GEMM (+= f32 .grad, bias grad)", "gemm", L, 2 * N * fin * fout,
        h * (N * fout + N * fin) + 2 * f * (fin * fout + fout))
    else
      k(name .. " dW GEMM (f16 dW, bias grad)", "gemm", L, 2 * N * fin * fout,
        h * (N * fout + N * fin) + h * (fin * fout + fout))
      k(name .. " dW: widen to f32 + add into .grad", "mem", L, 0, (h + f + 3 * f) * (fin * fout + fout))
    end
  end
  local ln_fwd = f * N * d * 2 + f * 2 * N + f * 2 * d              -- x in, y out, mean/rstd out, gamma/beta
  local ln_bwd = f * N * d * 3 + f * 2 * N + f * 2 * d * 2          -- x, dy in, dx out; dgamma/dbeta
  local cast_fwd = (f + h) * N * d                                  -- f32 -> f16
  local resid = (f + h + f) * N * d                                 -- f32 + f16 -> f32
  local fork = 3 * f * N * d                                        -- dx += dbranch (f32)
  local narrow = (f + h) * N * d                                    -- the f32 residual gradient -> f16 for a GEMM

  -- forward
  k("embedding: wte[idx] + wpe", "mem", 1, 0, f * 3 * N * d + 4 * N)
  k("layer norm forward (ln_1, ln_2)", "mem", 2 * L, 0, ln_fwd)
  k("cast f32 -> f16 before c_attn / c_fc", "mem", 2 * L, 0, cast_fwd)
  gemm_fwd("attn.c_attn (+ bias)", d, 3 * d, h * 3 * d)
  if not planned then
    k("permute {B,T,3,H,Dh} -> {3,B,H,T,Dh} (q, k, v its slabs)", "mem", L, 0, 2 * h * 3 * N * d)
  end
  k("flash attention forward (causal)", "attn", L, 2 * B * T * T * d, h * 4 * N * d + f * B * H * T)
  if not planned then k("transpose copy of the attention output", "mem", L, 0, 2 * h * N * d) end
  gemm_fwd("attn.c_proj (+ bias)", d, d, h * d)
  k("residual add (f32 + f16)", "mem", 2 * L, 0, resid)
  if planned then
    gemm_fwd("mlp.c_fc (+ bias + GELU, pre-activation kept)", d, 4 * d, h * 4 * d + h * N * 4 * d)
  else
    gemm_fwd("mlp.c_fc (+ bias)", d, 4 * d, h * 4 * d)
    k("GELU (erf) pass: pre-activation in, activation out", "mem", L, 0, 2 * h * N * 4 * d)
  end
  gemm_fwd("mlp.c_proj (+ bias)", 4 * d, d, h * d)
  k("layer norm forward (ln_f) + cast", "mem", 1, 0, ln_fwd + cast_fwd)
  k("lm_head GEMM (tied wte)", "gemm", 1, 2 * N * d * V, h * (N * d + V * d + N * V))
  k("cross-entropy forward (f16 logits, row lse)", "mem", 1, 0, h * N * V + f * N * 2)
  -- backward
  k("cross-entropy backward (f16 dlogits)", "mem", 1, 0, 2 * h * N * V + f * N * 2)
  k("lm_head dX GEMM", "gemm", 1, 2 * N * d * V, h * (N * V + V * d + N * d))
  if planned then
    k("lm_head dW GEMM (+= f32 wte.grad)", "gemm", 1, 2 * N * d * V, h * (N * V + N * d) + 2 * f * V * d)
  else
    k("lm_head dW GEMM (f16 dW)", "gemm", 1, 2 * N * d * V, h * (N * V + N * d) + h * V * d)
    k("lm_head dW: widen to f32 + add into wte.grad", "mem", 1, 0, (h + f + 3 * f) * V * d)
  end
  k("cast backward f16 -> f32 + layer norm backward (ln_f)", "mem", 1, 0, (h + f) * N * d + ln_bwd)
  k("narrow the residual gradient f32 -> f16", "mem", 2 * L, 0, narrow)
  if planned then
    gemm_bwd("mlp.c_proj", 4 * d, d, h * N * 4 * d, " (+ GELU' epilogue)")
  else
    gemm_bwd("mlp.c_proj", 4 * d, d)
    k("GELU backward pass: g, pre-activation in, dh out", "mem", L, 0, 3 * h * N * 4 * d)
  end
  gemm_bwd("mlp.c_fc", d, 4 * d)
  gemm_bwd("attn.c_proj", d, d)
  if not planned then k("transpose copy of the output's gradient", "mem", L, 0, 2 * h * N * d) end
  k("attention backward: rowsum(dO * O)", "mem", L, 0, 2 * h * N * d + f * B * H * T)
  if planned then
    k("flash attention backward (causal, dQ without atomics)", "attn", L, 5 * B * T * T * d,
      h * 8 * N * d + f * 2 * B * H * T)
  else   -- dkv: q, k, v, dO in, dk, dv out; dq: q, k, v, dO in, dq out; both read lse and D
    k("flash attention backward dK, dV (S, dP, dV, dK)", "attn", L, 4 * B * T * T * d,
      h * 6 * N * d + f * 2 * B * H * T)
    k("flash attention backward dQ (S, dP, dQ)", "attn", L, 3 * B * T * T * d, h * 5 * N * d + f * 2 * B * H * T)
    k("chunk backward: a slab padded to {3,B,H,T,Dh} (narrow_pad)", "mem", L, 0, h * (N * d + 3 * N * d))
    k("chunk backward: 2 slabs added in place (narrow_pad add)", "mem", 2 * L, 0, h * (3 * N * d + N * d + N * d))
    k("permute backward {3,B,H,T,Dh} -> {B,T,3,H,Dh}", "mem", L, 0, 2 * h * 3 * N * d)
  end
  gemm_bwd("attn.c_attn", d, 3 * d)
  k("cast backward f16 -> f32 (ln_1, ln_2 outputs)", "mem", 2 * L, 0, (h + f) * N * d)
  k("layer norm backward (ln_1, ln_2)", "mem", 2 * L, 0, ln_bwd)
  k("residual fork: dx += dbranch", "mem", 2 * L, 0, fork)
  k("embedding backward (scatter-add into wte, wpe .grad)", "mem", 1, 0, f * N * d * 5 + 4 * N)
  -- the step's end
  k("zero_grad (memset of the f32 gradients)", "mem", 1, 0, f * P)
  k("scaler: unscale + inf/NaN check", "mem", 1, 0, 2 * f * P)
  k("fused AdamW + f16 working copy", "mem", 1, 0, (4 * f + 3 * f + h) * P)
  return ks
end

-- the table: each kernel with its time at hw.at of its ceiling, and the sum
function M.table(cfg, hw, plan)
  hw = hw or M.H200
  local rows, total = {}, { flops = 0, bytes = 0, ms = 0, gemm_flops = 0, attn_flops = 0 }
  for _, kr in ipairs(M.kernels(cfg, plan)) do
    local t_c = kr.flops / (hw.at * hw.flops)
    local t_m = kr.bytes / (hw.at * hw.bw)
    local per = math.max(t_c, t_m)
    local r = { name = kr.name, kind = kr.kind, calls = kr.calls, flops = kr.flops * kr.calls,
                bytes = kr.bytes * kr.calls, bound = t_c >= t_m and "compute" or "memory", ms = per * kr.calls * 1e3 }
    rows[#rows + 1] = r
    total.flops, total.bytes, total.ms = total.flops + r.flops, total.bytes + r.bytes, total.ms + r.ms
    if kr.kind == "gemm" then total.gemm_flops = total.gemm_flops + r.flops end
    if kr.kind == "attn" then total.attn_flops = total.attn_flops + r.flops end
  end
  return rows, total
end

function M.print(cfg, hw)
  hw = hw or M.H200
  local rows, total = M.table(cfg, hw)
  local P = M.parameters(cfg)
  print(string.format("== GPT-2-small step model: %d layers, d %d, %d heads, T %d, vocab %d, batch %d (%.1f M parameters), "
    .. "f16 autocast, AdamW", cfg.layers, cfg.dim, cfg.heads, cfg.ctx, cfg.vocab, cfg.batch, P / 1e6))
  print(string.format("   ceilings: %.0f TFLOP/s dense f16/bf16, %.1f TB/s; each kernel's time at %.0f%% of its ceiling",
    hw.flops / 1e12, hw.bw / 1e12, hw.at * 100))
  print(string.format("%-58s %6s %10s %10s %8s %9s %6s", "kernel", "calls", "GFLOP", "MB", "bound", "ms @50%", "share"))
  for _, r in ipairs(rows) do
    print(string.format("%-58s %6d %10.1f %10.1f %8s %9.3f %5.1f%%", r.name, r.calls, r.flops / 1e9, r.bytes / 1e6,
      r.bound, r.ms, 100 * r.ms / total.ms))
  end
  local tokens = cfg.batch * cfg.ctx
  print(string.format("%-58s %6s %10.1f %10.1f %8s %9.3f", "target step (the sum)", "", total.flops / 1e9,
    total.bytes / 1e6, "", total.ms))
  print(string.format("   GEMMs %.2f TFLOP, attention %.2f TFLOP; at the target: %.0f tokens/s, MFU %.1f%% of 989 TFLOP/s "
    .. "(6 N + 6 L T d per token, as bench_gpu.lua counts)", total.gemm_flops / 1e12, total.attn_flops / 1e12,
    tokens / (total.ms / 1e3), 100 * tokens / (total.ms / 1e3) * (6 * P + 6 * cfg.layers * cfg.ctx * cfg.dim) / 989e12))
  local _, plan = M.table(cfg, hw, "planned")
  print(string.format("   as planned (c_fc's GELU and GELU' in the GEMM epilogues, dW into the f32 .grad, a 5-product "
    .. "flash backward, no q/k/v/output copies): %.3f ms, %.0f MB", plan.ms, plan.bytes / 1e6))
  print("   measured column: only on a GPU (not measured here)")
  return rows, total
end

-- run as a script: print the table for the bench's batch (MP_BENCH_GPT_BATCH, or
-- the first argument; 32 as bench_gpu.lua's default)
if arg and arg[0] and arg[0]:match("step_model%.lua$") then
  local cfg = {}
  for key, v in pairs(M.GPT2_SMALL) do cfg[key] = v end
  cfg.batch = math.tointeger(tonumber(arg[1] or os.getenv("MP_BENCH_GPT_BATCH") or "32"))
  M.print(cfg)
end

return M
