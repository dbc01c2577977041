-- histogram.lua: a loss-scaling rule that reads the gradients' log2 histogram (the
-- telemetry's) and picks the scale from it, which none of PyTorch's GradScaler,
-- Apex or DeepSpeed does: they move the scale by overflow events (dynamic,
-- hysteresis) or by the largest gradient alone (amax-style).
--
--   build/mpengine scripts/train_mlp.lua --amp f16 --policy scripts/policies/histogram.lua
--
-- Each clean step, from the histogram of the scaled gradients at the step's scale:
--   * low: the smallest power-of-two scale at which at most `target` of the nonzero
--     gradient values would flush to zero in f16 (|g scale| <= 2^-25);
--   * high: the largest power-of-two scale that keeps the largest gradient
--     `headroom` octaves below f16's largest value (65504);
--   * the next scale is low when low <= high (as little scale as precision needs,
--     so the rest is headroom against a gradient spike), else high (headroom wins
--     over precision: an overflow costs a whole step);
--   * it rises at most `rise` octaves per step (one noisy step does not fling it up)
--     and falls at once.
-- A skipped step divides the scale by 4, except a forward overflow, which no loss
-- scale causes or cures. Scales stay powers of two, so unscaling is exact. It needs
-- telemetry (`telemetry = true` turns it on); without a histogram it keeps the scale.
local P = {init = 2^16, target = 1e-4, headroom = 2, rise = 1, backoff = 1 / 4, min = 2^-24, max = 2^64}

local policy = {telemetry = true}

function policy:init() return P.init end

-- nonzero values of hist (bins of |g s| from 2^hist_lo) at or below 2^t, the
-- straddling bin split in log scale
local function below(hist, hist_lo, t)
  local c = 0
  for b = 1, #hist do
    local lo = b - 1 + hist_lo
    if lo + 1 <= t then c = c + hist[b] elseif lo < t then c = c + hist[b] * (t - lo) end
  end
  return c
end

function policy:update(info)
  local s = info.scale
  if info.found_inf then
    if info.reason == "forward" then return s end
    return math.max(P.min, s * P.backoff)
  end
  local h = info.hist
  if not h or not (info.grad_amax > 0) then return s end
  local total = 0
  for b = 1, #h do total = total + h[b] end
  if total == 0 then return s end
  -- octaves to move from s: the smallest e whose underflow is within target
  local e_low = 40
  for e = -40, 40 do
    if below(h, info.hist_lo, -25 - e) <= P.target * total then e_low = e; break end
  end
  local e_high = math.floor(math.log(65504 / (info.grad_amax * s), 2)) - P.headroom
  local e = math.min(e_low, e_high, P.rise)
  return math.min(P.max, math.max(P.min, s * 2.0 ^ e))
end

return policy
