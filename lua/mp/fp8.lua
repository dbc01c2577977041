-- mp.fp8: scaled FP8 tensors and their product (docs/API.md "FP8"): the
-- options checked here, the work in engine/ops_fp8.c through core._fp8_*.
local core = require "mp.core"

local fp8 = {}

local FORMATS = {e4m3 = true, e5m2 = true}
local GRANULARITIES = {tensor = true, tile = true, block = true, mx = true}
local OUT = {f32 = true, bf16 = true, f16 = true}

local function bad(name, what, want, got)
  error(string.format("%s: option '%s' must be %s (got %s)", name, what, want,
                      type(got) == "string" and string.format("%q", got) or tostring(got)), 3)
end

-- quantize(x [, {format = "e4m3", granularity = "tensor", scale =, counts = false}])
--   -> q, scales, amax [, {saturated =, flushed =} (counts = true: read back, a host wait)
--                       | f32 {2} tensor {saturated, flushed} on x's device (counts = "tensor": no wait)]
function fp8.quantize(x, opts)
  local Q = "mp.fp8.quantize"
  opts = core._options(Q, opts, "format:any granularity:any scale:any counts:any", 3)
  local fmt, g, scale = opts.format or "e4m3", opts.granularity or "tensor", opts.scale
  if not FORMATS[fmt] then bad(Q, "format", '"e4m3" or "e5m2"', fmt) end
  if not GRANULARITIES[g] then bad(Q, "granularity", '"tensor", "tile", "block" or "mx"', g) end
  if scale ~= nil then
    if g ~= "tensor" then bad(Q, "scale", 'absent unless granularity is "tensor"', scale) end
    if type(scale) == "number" and not (scale > 0 and scale < math.huge) then
      bad(Q, "scale", "a positive finite number or an f32 tensor of one value", scale)
    end
  end
  local counts = opts.counts
  if counts ~= nil and type(counts) ~= "boolean" and counts ~= "tensor" then
    bad(Q, "counts", 'true, false or "tensor"', counts)
  end
  if counts == "tensor" then return core._fp8_quantize(x, fmt, g, scale, "tensor") end
  local q, s, amax, sat, flushed = core._fp8_quantize(x, fmt, g, scale, counts and true or false)
  if counts then return q, s, amax, {saturated = sat, flushed = flushed} end
  return q, s, amax
end

-- matmul(a, b [, {out_dtype = "bf16",
--                  accumulate = "f32" | "fast" | {acc_bits =, promote_every =, acc_round = "nearest" | "truncate"}}])
--   -> a b^T: a {m, k}, b {n, k}, both from quantize
function fp8.matmul(a, b, opts)
  local M = "mp.fp8.matmul"
  opts = core._options(M, opts, "out_dtype:any accumulate:any", 3)
  local out, acc = opts.out_dtype or "bf16", opts.accumulate or "f32"
  if not OUT[out] then bad(M, "out_dtype", '"f32", "bf16" or "f16"', out) end
  local bits, every, fast, rnd = 0, 0, false, "nearest"
  if acc == "fast" then
    fast = true
  elseif type(acc) == "table" then
    core._options(M .. ": option 'accumulate'", acc, "acc_bits:any promote_every:any acc_round:any", 3)
    bits, every, rnd = acc.acc_bits, acc.promote_every or 0, acc.acc_round or "nearest"
    if math.type(bits) ~= "integer" or bits < 1 or bits > 23 then
      bad(M, "accumulate.acc_bits", "an integer from 1 to 23", bits)
    end
    if math.type(every) ~= "integer" or every < 0 then
      bad(M, "accumulate.promote_every", "a non-negative integer (0: never)", every)
    end
    if rnd ~= "nearest" and rnd ~= "truncate" then
      bad(M, "accumulate.acc_round", '"nearest" or "truncate"', rnd)
    end
  elseif acc ~= "f32" then
    bad(M, "accumulate", '"f32", "fast" or {acc_bits =, promote_every =, acc_round =}', acc)
  end
  return core._fp8_matmul(a, b, out, bits, every, fast, rnd)
end

-- codes(q) -> q's e4m3/e5m2 codes as a plain tensor (the same storage), without its scales
fp8.codes = core._fp8_codes

-- FP8 training (docs/API.md "FP8 training"): the recipes, the holder of their
-- tensor states, autocast, the linear layer's Function (lua/mp/fp8/), and the
-- trace and the lab (mp.fp8.trace), each file loaded at the first call that
-- needs it: `require "mp"` stays as small as it was (a larger Lua heap moves
-- where the collector runs, and so the peak memory of runs that never use FP8).
-- The calls are tail calls, so errors still point at the caller's line.
local function lazy(mod, name)
  return function(...) return require(mod)[name](...) end
end

fp8.delayed = lazy("mp.fp8.recipes", "delayed")
fp8.current = lazy("mp.fp8.recipes", "current")
fp8.block = lazy("mp.fp8.recipes", "block")
fp8.mx = lazy("mp.fp8.recipes", "mx")
fp8.Scaler = lazy("mp.fp8.holder", "new")
fp8.autocast = lazy("mp.fp8.holder", "autocast")
fp8.linear = lazy("mp.fp8.holder", "linear")
fp8.load_trace = lazy("mp.fp8.trace", "load_trace")
fp8.replay = lazy("mp.fp8.trace", "replay")

return fp8
