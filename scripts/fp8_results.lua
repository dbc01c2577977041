-- fp8_results.lua: FP8 recipes against bf16 AMP on the char GPT, side by side in
-- one sitting: every configuration and seed runs scripts/train_gpt.lua in a
-- process of its own (the same data, model and schedule; only --amp/--recipe
-- and --seed change), one after another, so that their speeds compare.
--
--   build/mpengine scripts/fp8_results.lua [--steps 1500] [--seeds 0,1,2]
--       [--configs bf16,delayed,current,block,mx] [--out TABLE.jsonl] [-- TRAIN_GPT_ARGS...]
--
-- A config is bf16 (--amp bf16), f32 (--amp off) or an FP8 recipe as train_gpt.lua's
-- --recipe takes it (delayed, current, block, mx, FILE.lua). Prints one row per
-- config: the final validation loss of each seed, their mean, the mean's
-- difference relative to bf16's mean, and the median tokens/s over the seeds
-- (the step's speed, evaluation excluded as train_gpt.lua reports it). --out writes
-- the rows as JSON lines. Arguments after `--` go to every train_gpt.lua run.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"

local function usage(msg)
  io.stderr:write("fp8_results.lua: ", msg, "\n",
    "usage: fp8_results.lua [--steps N] [--seeds S,S,..] [--configs C,C,..] [--out FILE] [-- ARGS...]\n")
  os.exit(2)
end

local function list(s, what)
  local t = {}
  for item in s:gmatch("[^,]+") do t[#t + 1] = item end
  if #t == 0 then usage(what .. " must be a comma-separated list") end
  return t
end

local steps, seeds, configs, out_path, extra = 1500, {0, 1, 2}, {"bf16", "delayed", "current", "block", "mx"}, nil, {}
local args, i = arg or {}, 1
while i <= #args do
  local a, v = args[i], args[i + 1]
  if a == "--" then
    table.move(args, i + 1, #args, 1, extra)
    break
  elseif a == "--steps" then
    steps = math.tointeger(tonumber(v or "")) or usage("--steps needs a whole number")
    if steps < 1 then usage("--steps must be >= 1") end
  elseif a == "--seeds" then
    seeds = {}
    for _, s in ipairs(list(v or usage("--seeds needs a list"), "--seeds")) do
      seeds[#seeds + 1] = math.tointeger(tonumber(s)) or usage("--seeds: not a whole number: " .. s)
    end
  elseif a == "--configs" then
    configs = list(v or usage("--configs needs a list"), "--configs")
  elseif a == "--out" then
    out_path = v or usage("--out needs a file name")
  else
    usage("unknown argument " .. a)
  end
  i = i + 2
end

-- the interpreter running this script (build/mpengine or lua5.4) runs the children
local exe = arg and arg[-1] or "lua5.4"
local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

local function amp_args(config)
  if config == "bf16" then return {"--amp", "bf16"} end
  if config == "f32" then return {"--amp", "off"} end
  return {"--amp", "fp8", "--recipe", config}
end

-- one run: its final validation loss and the median of its tokens/s lines
local function run(config, seed)
  local metrics = os.tmpname()
  local cmd = {quote(exe), quote(here .. "train_gpt.lua"), "--steps", steps, "--seed", seed, "--metrics", quote(metrics)}
  for _, a in ipairs(amp_args(config)) do cmd[#cmd + 1] = quote(a) end
  for _, a in ipairs(extra) do cmd[#cmd + 1] = quote(a) end
  local p = io.popen(table.concat(cmd, " ") .. " 2>&1")
  local out = p:read("a")
  p:close()
  -- the last validation loss at full precision (the printed line has 3 decimals)
  local loss
  local f = io.open(metrics)
  if f then
    for line in f:lines() do loss = tonumber(line:match('"val_loss": ([%d.eE+-]+)')) or loss end
    f:close()
  end
  os.remove(metrics)
  if not loss or not out:match("final val loss") then
    io.stderr:write(string.format("fp8_results.lua: %s seed %d failed:\n%s\n", config, seed, out))
    os.exit(1)
  end
  local speeds = {}
  for tps in out:gmatch("step %d+/%d+ .-([%d.]+) tokens/s") do speeds[#speeds + 1] = tonumber(tps) end
  table.sort(speeds)
  return loss, speeds[(#speeds + 1) // 2]
end

local function mean(t)
  local s = 0
  for _, v in ipairs(t) do s = s + v end
  return s / #t
end

local rows = {}
for _, config in ipairs(configs) do
  local row = {config = config, losses = {}, speeds = {}}
  for _, seed in ipairs(seeds) do
    local loss, tps = run(config, seed)
    row.losses[#row.losses + 1], row.speeds[#row.speeds + 1] = loss, tps
    io.stderr:write(string.format("  %s seed %d: val loss %.4f, %s tokens/s\n", config, seed, loss,
                                  tps and string.format("%.0f", tps) or "?"))
  end
  row.mean = mean(row.losses)
  table.sort(row.speeds)
  row.tokens_per_s = row.speeds[(#row.speeds + 1) // 2]
  rows[#rows + 1] = row
end

local base
for _, r in ipairs(rows) do if r.config == "bf16" then base = r end end
print(string.format("char GPT, %d steps, seeds %s", steps, table.concat(seeds, ",")))
print(string.format("%-10s %-26s %8s %10s %10s %8s", "config", "val loss per seed", "mean", "vs bf16", "tokens/s",
                    "speed"))
for _, r in ipairs(rows) do
  local per = {}
  for k, l in ipairs(r.losses) do per[k] = string.format("%.4f", l) end
  local rel = base and (r.mean - base.mean) / base.mean
  local speed = base and base.tokens_per_s and r.tokens_per_s and r.tokens_per_s / base.tokens_per_s
  r.rel_vs_bf16, r.speed_vs_bf16 = rel, speed
  print(string.format("%-10s %-26s %8.4f %10s %10.0f %8s", r.config, table.concat(per, " "), r.mean,
                      rel and string.format("%+.2f%%", rel * 100) or "-", r.tokens_per_s or 0,
                      speed and string.format("%.2fx", speed) or "-"))
end

if out_path then
  local f = assert(io.open(out_path, "w"))
  for _, r in ipairs(rows) do
    local per = {}
    for k, l in ipairs(r.losses) do per[k] = string.format("%.6f", l) end
    f:write(string.format('{"config": "%s", "steps": %d, "seeds": [%s], "val_loss": [%s], "mean": %.6f, ' ..
                          '"rel_vs_bf16": %s, "tokens_per_s": %s}\n', r.config, steps, table.concat(seeds, ", "),
                          table.concat(per, ", "), r.mean, r.rel_vs_bf16 and string.format("%.6f", r.rel_vs_bf16) or "null",
                          r.tokens_per_s and string.format("%.1f", r.tokens_per_s) or "null"))
  end
  f:close()
end
