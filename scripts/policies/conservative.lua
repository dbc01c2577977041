-- conservative.lua: a custom loss-scaling rule. Grow slowly, back off hard, and never
-- back off for a forward overflow.
--
--   build/mpengine scripts/train_mlp.lua --amp f16 --policy scripts/policies/conservative.lua
--
--   * start at 2^15;
--   * a skipped step with reason "overflow" or "nan" (an f16 overflow in the backward
--     pass usually becomes NaN once inf meets a zero in a matmul) divides the scale by 8,
--     never below `min`;
--   * reason "forward" (the loss itself was inf/NaN before any scaling) keeps the scale:
--     no loss scale cures a forward overflow, and backing off would only cost precision
--     in the steps after it; the clean-step counter is not reset either;
--   * grow x2 only after `interval` clean steps in a row (4000, twice PyTorch's), and not
--     within `cooldown` steps of the last backoff, never above `max`.
-- Scales stay powers of two, so unscaling (x 1/scale) is exact.
local P = {init = 2^15, backoff = 1 / 8, growth = 2, interval = 4000, cooldown = 8000, min = 1, max = 2^24}

local policy = {clean = 0, last_backoff = -math.huge}

function policy:init() return P.init end

function policy:update(info)
  local s = info.scale
  if info.found_inf then
    if info.reason == "forward" then return s end       -- not the scale's fault
    self.clean, self.last_backoff = 0, info.step
    return math.max(P.min, s * P.backoff)
  end
  self.clean = self.clean + 1
  if self.clean >= P.interval and info.step - self.last_backoff >= P.cooldown then
    self.clean = 0
    return math.min(P.max, s * P.growth)
  end
  return s
end

-- checkpointed with the scaler (-math.huge is kept as "never")
function policy:state_dict()
  return {clean = self.clean, last_backoff = self.last_backoff == -math.huge and -1 or self.last_backoff,
          never = self.last_backoff == -math.huge}
end

function policy:load_state_dict(sd)
  self.clean = sd.clean or 0
  self.last_backoff = sd.never and -math.huge or sd.last_backoff or -math.huge
end

return policy
