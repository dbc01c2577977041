-- fp8_lab.lua: FP8 scaling recipes compared on one recorded fp8 trace, without the
-- model (mp.fp8.replay: a counterfactual on the recorded amaxes; a run under
-- another recipe would itself differ, see docs/API.md mp.fp8.replay).
--
--   build/mpengine scripts/fp8_lab.lua TRACE [RECIPE ...] [--out TABLE.jsonl] [--rows N]
--
-- TRACE: a file written by fs:trace (plain or .gz). RECIPE: delayed[:history=H,
-- margin=M,algo=A,format=F], current, block, mx, or a Lua file returning a recipe
-- (scripts/lib/fp8_recipe.lua); by default delayed and current. For each recipe a
-- summary row:
--   saturate   tensor-steps whose amax times the recipe's multiplier rounds past
--              the format's largest value (and in how many steps)
--   underflow  tensor-steps where it is at most half the smallest subnormal: the
--              whole tensor flushed to zero
--   overshoot  the worst amax * multiplier / FP8_MAX (where it saturates)
--   headroom   the least log2(FP8_MAX / (amax * multiplier)) of the tensor-scaled
--              tensors, in binades (negative: saturated)
-- then the saturating and underflowing steps and tensors themselves, worst first
-- (at most N rows each, default 10). Tile, block and mx tensors take per-group
-- scales from their own amaxes and are shown as such. --out writes, per recipe and
-- step, {recipe, step, scale, saturated, overshoot, underflow, headroom} (objects
-- keyed by tensor name) as JSON lines, for scripts/plot.lua --lab.
local mp = mp or require "mp"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local recipe_of = dofile(here .. "lib/fp8_recipe.lua")
local T = require "mp.fp8.trace"

local function usage(msg)
  io.stderr:write("fp8_lab.lua: ", msg, "\n",
    "usage: fp8_lab.lua TRACE [RECIPE ...] [--out TABLE.jsonl] [--rows N]\n")
  os.exit(2)
end

local args, specs, out_path, max_rows, trace_path = arg or {}, {}, nil, 10, nil
local i = 1
while i <= #args do
  local a = args[i]
  if a == "--out" then
    out_path = args[i + 1] or usage("--out needs a file name")
    i = i + 1
  elseif a == "--rows" then
    max_rows = math.tointeger(tonumber(args[i + 1] or ""))
    if not max_rows or max_rows < 0 then usage("--rows needs a count (got " .. tostring(args[i + 1]) .. ")") end
    i = i + 1
  elseif a:sub(1, 2) == "--" then
    usage("unknown option " .. a)
  elseif not trace_path then
    trace_path = a
  else
    specs[#specs + 1] = a
  end
  i = i + 1
end
if not trace_path then usage("a trace file is needed") end
if #specs == 0 then specs = {"delayed", "current"} end
local recipes = {}
for k, spec in ipairs(specs) do
  local r, label = recipe_of(spec, usage)
  recipes[k] = {recipe = r, label = label}
end

local ok, trace = pcall(T.load, trace_path, "fp8_lab.lua")
if not ok then usage(tostring(trace):gsub("^[^:]*:%d+: ", ""):gsub("^fp8_lab%.lua: ", "")) end
if #trace.steps == 0 then usage("the trace holds no steps") end
local names = {}
for k, t in ipairs(trace.header.tensors) do names[k] = t.name end

-- what the run recorded: tensor-steps with saturated and with flushed values
local rec_sat, rec_flu, rec_known = 0, 0, false
for _, r in ipairs(trace.steps) do
  for k = 1, #names do
    if r.saturated[k] then rec_known = true; if r.saturated[k] > 0 then rec_sat = rec_sat + 1 end end
    if r.flushed[k] and r.flushed[k] > 0 then rec_flu = rec_flu + 1 end
  end
end
print(string.format("trace %s: %d steps, %d tensors, recipe %s; recorded: %s", trace_path, #trace.steps, #names,
  trace.header.recipe, rec_known and string.format("%d tensor-steps with saturated values, %d with flushed values",
                                                    rec_sat, rec_flu) or "no counts (telemetry was off)"))

local function g(x) return string.format("%.4g", x) end
local out = out_path and (io.open(out_path, "w") or usage("--out: cannot write " .. out_path))
for _, c in ipairs(recipes) do
  local rok, traj = pcall(T.replay, trace, c.recipe)
  if not rok then usage(tostring(traj):gsub("^[^:]*:%d+: ", "")) end
  local sat, under, worst, least, sat_steps, per_group = {}, {}, nil, nil, 0, 0
  for _, e in ipairs(traj.steps) do
    local any = false
    for k = 1, #names do
      if e.amax[k] ~= nil then
        local row = {step = e.step, name = names[k], amax = e.amax[k], scale = e.scale[k],
                     overshoot = e.overshoot[k], headroom = e.headroom[k]}
        if e.saturated[k] then sat[#sat + 1] = row; any = true end
        if e.underflow[k] then under[#under + 1] = row end
        if e.overshoot[k] and (not worst or e.overshoot[k] > worst.overshoot) then worst = row end
        if e.scale[k] == nil then per_group = per_group + 1
        elseif not least or e.headroom[k] < least.headroom then least = row end
      end
    end
    if any then sat_steps = sat_steps + 1 end
    if out then
      local o = {recipe = c.label, step = e.step, scale = {}, saturated = {}, overshoot = {}, underflow = {}, headroom = {}}
      for k = 1, #names do
        if e.amax[k] ~= nil then
          o.scale[names[k]], o.saturated[names[k]], o.underflow[names[k]] = e.scale[k], e.saturated[k], e.underflow[k]
          o.overshoot[names[k]], o.headroom[names[k]] = e.overshoot[k], e.headroom[k]
        end
      end
      out:write(mp.amp._json(o), "\n")
    end
  end
  print(string.format("\n%-28s saturate %d (%d steps)   underflow %d   overshoot %s   headroom %s%s", c.label, #sat,
    sat_steps, #under, worst and (g(worst.overshoot) .. "x at step " .. worst.step .. " " .. worst.name) or "-",
    least and (g(least.headroom) .. " binades at step " .. least.step .. " " .. least.name) or "-",
    per_group > 0 and string.format("   (%d tensor-steps with per-group scales)", per_group) or ""))
  table.sort(sat, function(a, b) return a.overshoot > b.overshoot end)
  table.sort(under, function(a, b) return a.headroom > b.headroom end)
  for _, list in ipairs{{sat, "saturates"}, {under, "underflows"}} do
    for k = 1, math.min(max_rows, #list[1]) do
      local r = list[1][k]
      print(string.format("  step %-6d %-36s %s: amax %s x scale %s = %s x FP8_MAX (headroom %s binades)", r.step,
        r.name, list[2], g(r.amax), g(r.scale), g(2 ^ -r.headroom), g(r.headroom)))
    end
    if #list[1] > max_rows then print(string.format("  ... %d more (--rows)", #list[1] - max_rows)) end
  end
end
if out then out:close() end
