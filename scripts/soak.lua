-- soak.lua: a long f16 AMP run with NaN injected into a chosen fraction of the
-- batches, checking what must hold however long it runs (not part of make test):
--   - resident memory flat: after the warm-up, RSS moves by at most --rss-slack MiB;
--   - the master weights stay finite;
--   - the scaler skipped exactly the injected steps, no more, no fewer;
--   - the scale stays within the policy's floor and ceiling.
-- Exits 1 with the reason when one fails. Prints a summary line either way.
--   mpengine scripts/soak.lua [--steps N] [--nan-frac F] [--policy amax|hysteresis|static]
--                             [--batch B] [--seed S] [--rss-slack MiB]
local mp = require "mp"
local nn = mp.nn

local opts = {steps = 20000, nan_frac = 0.02, policy = "amax", batch = 64, seed = 1, rss_slack = 16}
local i = 1
while arg and arg[i] do
  local k, v = arg[i]:match("^%-%-([%w-]+)$"), arg[i + 1]
  k = k and k:gsub("-", "_")
  if not k or opts[k] == nil or v == nil then
    io.stderr:write("soak.lua: unknown option or missing value: ", tostring(arg[i]), "\n")
    os.exit(2)
  end
  opts[k] = type(opts[k]) == "number" and assert(tonumber(v), "--" .. k .. ": not a number") or v
  i = i + 2
end

local function rss_mib()
  local f = io.open("/proc/self/status")
  if not f then return 0 end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)")) / 1024
end

-- policies that cannot collapse: a floor (min) and a bounded way down
local policies = {
  amax = function() return mp.amp.policy.amax{min = 1} end,
  hysteresis = function() return mp.amp.policy.hysteresis{init = 2 ^ 10, min = 1, window = 200} end,
  static = function() return mp.amp.policy.static(2 ^ 8) end,
}
assert(policies[opts.policy], "--policy: amax, hysteresis or static")

mp.manual_seed(opts.seed)
local D, C = 64, 10
local model = nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Linear(128, C))
local opt = mp.optim.Adam(model:parameters(), {lr = 1e-3})
local pol = policies[opts.policy]()
local scaler = mp.amp.GradScaler{policy = pol}
-- a fixed teacher: labels are learnable, so the gradients are real ones
local teacher = mp.randn{D, C}

-- which steps get NaN: a seeded stream of its own, so the count is known up front
local rng = opts.seed * 7919 % 2147483647
local function draw()
  rng = rng * 48271 % 2147483647
  return rng / 2147483647
end

local injected, skipped, fails, last_loss = 0, 0, {}, 0 / 0
local warm = math.max(100, math.floor(opts.steps / 10))
local rss_lo, rss_hi = math.huge, 0
local scale_lo, scale_hi = math.huge, 0
local t0 = mp.clock()
for step = 1, opts.steps do
  local x = mp.randn{opts.batch, D}
  local y = mp.matmul(x, teacher):argmax(2)
  local inject = draw() < opts.nan_frac
  if inject then
    injected = injected + 1
    x = mp.full({opts.batch, D}, 0 / 0)
  end
  local loss
  do
    local _ <close> = mp.amp.autocast("f16")
    loss = mp.cross_entropy(model(x), y)
  end
  opt:zero_grad()
  scaler:scale(loss):backward()
  local applied = scaler:step(opt)
  scaler:update()
  if applied == false then skipped = skipped + 1 end
  if applied == false and not inject then fails[#fails + 1] = "step " .. step .. " skipped without an injected NaN" end
  if applied ~= false and inject then fails[#fails + 1] = "step " .. step .. ": an injected NaN was applied" end
  local s = scaler:get_scale()
  scale_lo, scale_hi = math.min(scale_lo, s), math.max(scale_hi, s)
  if step % 100 == 0 then
    if not inject then last_loss = loss:item() end
    for _, p in ipairs(model:parameters()) do
      local v = p:sum():item()
      if v ~= v or v == math.huge or v == -math.huge then
        fails[#fails + 1] = "step " .. step .. ": a master weight is not finite"
        break
      end
    end
    if step > warm then
      local r = rss_mib()
      rss_lo, rss_hi = math.min(rss_lo, r), math.max(rss_hi, r)
    end
  end
  if #fails > 5 then break end
end
local wall = mp.clock() - t0
if skipped ~= injected then fails[#fails + 1] = string.format("skipped %d steps, injected %d", skipped, injected) end
if rss_hi > 0 and rss_hi - rss_lo > opts.rss_slack then
  fails[#fails + 1] = string.format("RSS moved by %.1f MiB after the warm-up (%.1f to %.1f; slack %d)",
                                    rss_hi - rss_lo, rss_lo, rss_hi, opts.rss_slack)
end
if scale_lo < 1 then fails[#fails + 1] = "the scale went below the policy's floor: " .. scale_lo end

print(string.format("soak: %d steps (%s, NaN in %.1f%% of batches) in %.1f s: injected %d, skipped %d, "
                    .. "RSS after warm-up %.1f..%.1f MiB, scale %g..%g, final loss %.4f, %s",
                    opts.steps, opts.policy, 100 * opts.nan_frac, wall, injected, skipped, rss_lo, rss_hi,
                    scale_lo, scale_hi, last_loss, #fails == 0 and "OK" or "FAILED"))
for _, f in ipairs(fails) do print("  " .. f) end
os.exit(#fails == 0 and 0 or 1)
