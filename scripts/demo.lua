-- demo.lua: a short tour of why mixed-precision training needs loss scaling.
-- Run with `make demo` or `build/mpengine scripts/demo.lua`.
local mp = mp or require "mp"

local function section(title) print("\n== " .. title) end

-- fraction of entries of t equal to zero, and of non-finite entries
local function census(t)
  local zeros, inf = 0, 0
  for _, v in ipairs(t:reshape(-1):totable()) do
    if v == 0 then zeros = zeros + 1 elseif v ~= v or v == math.huge or v == -math.huge then inf = inf + 1 end
  end
  return zeros / t:numel(), inf / t:numel()
end

section("f16 has a narrow range")
local probe = mp.tensor{65504, 65519, 65520, 1e5, 6.1e-5, 5.96e-8, 2.98e-8, 1e-8}
print("f32 values:"); print(probe)
print("rounded to f16 (round to nearest even, subnormals kept):"); print(probe:f16())
print("and to bf16 (f32's range, 8 bits of precision):"); print(probe:bf16())

section("small gradients underflow in f16")
-- Gradient magnitudes in deep networks spread over many decades; here log-normal
-- around 2^-20 (about 1e-6), as the mixed-precision paper measured for activation gradients.
mp.manual_seed(0)
local n = 100000
local grads = ((mp.randn{n} * 3 - 20) * math.log(2)):exp()
local z32 = census(grads)
local z16 = census(grads:f16())
print(string.format("values that are zero in f32: %5.1f%%   after casting to f16: %5.1f%%", 100 * z32, 100 * z16))

section("multiplying by a loss scale shifts them back into range")
print(" scale      zero in f16   inf in f16")
for _, scale in ipairs{1, 2^8, 2^16, 2^24, 2^32} do
  local zeros, inf = census((grads * scale):f16())
  print(string.format(" 2^%-7d  %9.2f%%   %9.2f%%", math.floor(math.log(scale, 2) + 0.5), 100 * zeros, 100 * inf))
end
print("Too small a scale flushes gradients to zero; too large a one overflows to inf.")
print("A dynamic scaler searches for the largest scale that does not overflow,")
print("and unscales in f32 before the optimizer step (FP32 master weights).")

section("unscaling in f32 recovers the values")
-- share of gradients that survive the f16 round trip to f16 precision (2^-11 relative)
local function recovered(scale)
  local rel = (((grads * scale):f16():f32() / scale - grads):abs() / grads):totable()
  local ok = 0
  for _, r in ipairs(rel) do if r <= 2^-11 then ok = ok + 1 end end
  return ok / #rel
end
print(string.format("kept to f16 precision: no scaling %5.1f%%   scale 2^16 %5.1f%%   scale 2^24 %5.1f%%",
  100 * recovered(1), 100 * recovered(2^16), 100 * recovered(2^24)))

section("matmul in f16 accumulates in f32 and rounds once")
local a, b = mp.randn{64, 256}, mp.randn{256, 32}
local exact = mp.matmul(a:f16():f32(), b:f16():f32())
local half = mp.matmul(a:f16(), b:f16())
print(string.format("max |f16 matmul - f32 matmul of the same inputs| = %.3g (one f16 rounding of values ~%.0f)",
  (half:f32() - exact):abs():max():item(), exact:abs():max():item()))
