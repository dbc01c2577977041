-- logging.lua: PyTorch GradScaler's dynamic rule written in Lua, printing every
-- decision with the info it saw.
--
--   build/mpengine scripts/train_mlp.lua --amp f16 --policy scripts/policies/logging.lua
--
-- The rule is mp.amp.policy.dynamic{}'s (init 2^16, growth 2, backoff 0.5, interval
-- 2000): on a skipped step the scale halves and the clean-step counter resets; after
-- `interval` clean steps in a row the scale doubles (only when the result is still
-- finite in f32) and the counter resets. With the same options it gives the same
-- scale sequence, hence bit-identical weights, as the built-in.
--
-- One line per decision goes to stdout:
--   policy: step 12  scale 65536 -> 32768  backoff  (found_inf, reason overflow, skipped 1, grad_amax 0, ...)
-- MP_POLICY_LOG_EVERY=N prints the steps that keep the scale only every N-th step
-- (every change is always printed). The file returns a fresh table each time it is
-- loaded; edit the options below, or require it and call .new{...} yourself.
local F32_MAX = 3.4028234663852886e38

local Logging = {}
Logging.__index = Logging

function Logging.new(o)
  o = o or {}
  return setmetatable({
    init_scale = o.init or 65536, growth = o.growth or 2, backoff = o.backoff or 0.5,
    interval = o.interval or 2000, every = o.every or tonumber(os.getenv("MP_POLICY_LOG_EVERY")) or 1,
    tracker = 0, out = o.out or io.stdout,
    -- asks train_mlp.lua for scaler:telemetry(true), so that info.zero_frac,
    -- underflow_frac and overflow_frac are measured (without it they read 0)
    telemetry = o.telemetry ~= false,
  }, Logging)
end

local function g(x) return x == nil and "nil" or string.format("%.4g", x) end

function Logging:log(info, new, what)
  if new == info.scale and self.every > 1 and info.step % self.every ~= 0 then return end
  self.out:write(string.format(
    "policy: step %d  scale %s -> %s  %s  (%s, reason %s, skipped %d, grad_amax %s, zero_frac %s, underflow_frac %s, overflow_frac %s, clean %d)\n",
    info.step, string.format("%.10g", info.scale), string.format("%.10g", new), what, info.found_inf and "found_inf" or "finite",
    tostring(info.reason), info.skipped or 0, g(info.grad_amax), g(info.zero_frac), g(info.underflow_frac),
    g(info.overflow_frac), self.tracker))
end

function Logging:init()
  self.out:write(string.format("policy: logging dynamic rule  init %s  growth %s  backoff %s  interval %d\n",
    string.format("%.10g", self.init_scale), g(self.growth), g(self.backoff), self.interval))
  return self.init_scale
end

function Logging:update(info)
  local s, new, what = info.scale, info.scale, "hold"
  if info.found_inf then
    new, what = s * self.backoff, "backoff"
    self.tracker = 0
  else
    self.tracker = self.tracker + 1
    if self.tracker == self.interval then
      local grown = s * self.growth
      if grown <= F32_MAX then new, what = grown, "grow" else what = "hold (growth would overflow f32)" end
      self.tracker = 0
    end
  end
  self:log(info, new, what)
  return new
end

-- saved in train_mlp.lua's checkpoints (scaler:state_dict()), so a resumed run
-- continues with the same counter
function Logging:state_dict() return {tracker = self.tracker} end
function Logging:load_state_dict(sd) self.tracker = sd.tracker or 0 end

return Logging.new()
