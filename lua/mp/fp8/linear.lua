-- mp.fp8.linear: the FP8 linear layer as an mp.autograd.Function, in
-- Transformer Engine's form (docs/API.md "mp.fp8.linear"):
--
--   forward   y = fp8.matmul(q(x), q(w)) + bias          q(x), q(w): x, w quantized as the recipe lays them out
--   backward  dx = fp8.matmul(q(g), q(w^T))               g = dy, quantized along out
--             dw = fp8.matmul(q(g^T), q(x^T))             both along the rows
--             db = the sum of g over the rows, in f32
--
-- The transposes are quantized afresh from the saved x and from w: with per-tensor
-- scales that gives the codes transposing would (the same multiplier, the same
-- values); with 1x128 tiles it is DeepSeek-V3's 128x1 quantization of the backward.
-- x is rounded to bf16 first (what autocast's low class gives a linear layer) and
-- saved so, 2 bytes an element; w is the FP32 master weight itself (no copy).
-- A forward with grad mode off (evaluation) quantizes with the step's scales and
-- records nothing: evaluating between steps changes no recipe's state.
local core = require "mp.core"
local autograd = require "mp.autograd"
local R = require "mp.fp8.recipes"

local L = {}

local OUT = {f32 = true, bf16 = true, f16 = true}

local fp8_mod
local function fp8() fp8_mod = fp8_mod or require "mp.fp8" return fp8_mod end

-- cuBLASLt's FP8 GEMM wants k a multiple of 16: off the CPU, both operands of a
-- product get zeros along k (the same codes for the real values; zeros add nothing)
local function pad_k(t)
  local k = t.shape[2]
  if t.device == "cpu" or k % 16 == 0 then return t end
  return core.cat({t, core.zeros({t.shape[1], 16 - k % 16}, {dtype = t.dtype, device = t.device})}, 2)
end

-- src {rows, k} quantized for tensor state ts: the recipe's scale for this step;
-- record = true counts this quantization in ts (amax, the multiplier used, the
-- elements, with telemetry the saturated/flushed counts); a transpose of a
-- tensor already counted passes false
local function quant(fs, ts, src, record)
  local scale = fs.recipe:scale(ts)
  local counts = record and fs.telemetry and "tensor" or nil
  local q, _, amax, c = fp8().quantize(pad_k(src), {format = ts.format, granularity = ts.granularity,
                                                    scale = scale, counts = counts})
  if record then fs:_record(ts, amax, scale, src:numel(), c) end
  return q
end

local function out_dtype(dt) return OUT[dt] and dt or "f32" end

local function forward(ctx, x, w, b, fs, layer, out, record)
  local _ <close> = core._autocast(false)   -- the dtypes below are this function's, not autocast's
  local nin, nout = w.shape[2], w.shape[1]
  if x.shape[#x.shape] ~= nin then
    error(string.format("mp.fp8.linear: x's last dim is %d, the weight's in_features %d", x.shape[#x.shape], nin), 0)
  end
  local st = fs:_layer(layer, x.device)
  local lead = {}
  for i = 1, #x.shape - 1 do lead[i] = x.shape[i] end
  local x2 = x:reshape{-1, nin}
  if x2.dtype ~= "bf16" then x2 = x2:to("bf16") end
  local qx = quant(fs, st.x, x2, record)
  local qw = quant(fs, st.w, w, record)
  local y = fp8().matmul(qx, qw, {out_dtype = "f32"})
  -- the bias added to the f32 product, then one rounding (cuBLASLt's bias epilogue)
  if b then y = y + (b.dtype == "f32" and b or b:to("f32")) end
  if out ~= "f32" then y = y:to(out) end
  ctx:save_for_backward(x2, w)
  ctx.st, ctx.fs, ctx.xshape, ctx.xdtype, ctx.has_b = st, fs, x.shape, x.dtype, b ~= nil
  lead[#lead + 1] = nout
  return y:reshape(lead)
end

local function backward(ctx, gy)
  local _ <close> = core._autocast(false)
  local x2, w = table.unpack(ctx.saved_tensors, 1, 2)
  local st, fs, needs = ctx.st, ctx.fs, ctx.needs_input_grad
  local nout = w.shape[1]
  local g2 = gy:reshape{-1, nout}
  local dx, dw, db
  local qgt
  if needs[1] then
    local qg = quant(fs, st.g, g2, true)
    local qwt = quant(fs, st.w, w:transpose(1, 2), false)
    dx = fp8().matmul(qg, qwt, {out_dtype = out_dtype(ctx.xdtype)}):reshape(ctx.xshape)
  end
  if needs[2] then
    qgt = quant(fs, st.g, g2:transpose(1, 2), not needs[1])
    local qxt = quant(fs, st.x, x2:transpose(1, 2), false)
    dw = fp8().matmul(qgt, qxt, {out_dtype = out_dtype(w.dtype)})
  elseif not needs[1] then
    -- only the bias learns: g still counts for the recipe (its amax, this step)
    quant(fs, st.g, g2, true)
  end
  if ctx.has_b and needs[3] then db = (g2.dtype == "f32" and g2 or g2:to("f32")):sum(1) end
  return dx, dw, db, nil, nil, nil, nil
end

L.Function = autograd.Function{name = "fp8_linear", forward = forward, backward = backward}

-- the holder of a recipe given bare: kept on the recipe (recipe._scaler)
function L.holder(fs_or_recipe, Scaler, name)
  if type(fs_or_recipe) == "table" and getmetatable(fs_or_recipe) == Scaler.class then return fs_or_recipe end
  local why = R.missing(fs_or_recipe)
  if why then
    error(string.format("%s: expected an mp.fp8.Scaler or a recipe (%s)", name, why), 3)
  end
  local fs = rawget(fs_or_recipe, "_scaler")
  if not fs then
    fs = Scaler.new{recipe = fs_or_recipe}
    rawset(fs_or_recipe, "_scaler", fs)
  end
  return fs
end

-- mp.fp8.linear(x, weight, bias, fs_or_recipe [, {name = "linear", out_dtype = "bf16"}])
function L.linear(Scaler, x, w, b, fs, opts)
  local N = "mp.fp8.linear"
  fs = L.holder(fs, Scaler, N)
  opts = core._options(N, opts, "name:string out_dtype:string", 3)
  local out = opts.out_dtype or "bf16"
  if not OUT[out] then
    error(string.format('%s: option \'out_dtype\' must be "bf16", "f16" or "f32" (got %q)', N, out), 3)
  end
  if not R.is_tensor(x) then error(N .. ": x must be a tensor (got " .. type(x) .. ")", 3) end
  if not R.is_tensor(w) or #w.shape ~= 2 then error(N .. ": weight must be a tensor {out, in}", 3) end
  if b ~= nil and (not R.is_tensor(b) or #b.shape ~= 1 or b.shape[1] ~= w.shape[1]) then
    error(string.format("%s: bias must be nil or a tensor {%d}", N, w.shape[1]), 3)
  end
  return L.Function(x, w, b, fs, opts.name or "linear", out, core.is_grad_enabled())
end

return L
