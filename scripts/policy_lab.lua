-- policy_lab.lua: loss-scaling policies compared on one recorded trace, without the
-- model (mp.amp.replay: a counterfactual on the recorded gradients; the run itself
-- would differ under another policy, see lua/mp/amp/lab.lua).
--
--   build/mpengine scripts/policy_lab.lua TRACE [POLICY ...] [--out TABLE.jsonl]
--
-- TRACE: a file written by scaler:trace or --trace (plain or .gz). POLICY: as
-- --policy takes them (dynamic, hysteresis, amax, static:S, none, NAME:k=v,...,
-- or a Lua file returning a policy); by default dynamic, hysteresis, amax and
-- the policies in scripts/policies/ that decide scales. For each, one row:
--   skipped      steps the candidate skips (and how many of them the trace
--                cannot judge: a recorded overflow below the recorded scale)
--   underflow    mean and worst fraction of gradient values f16 flushes to zero:
--                mean over steps of all parameters together, worst of any one
--                parameter at any step
--   recover      steps from a skip until the scale is back at its value before
--                the skip, mean over skips ("never" when it does not come back)
--   scale        the range of scales the candidate runs at
-- --out also writes each candidate's trajectory (step, scale, skipped and each
-- parameter's underflow fraction) as JSON lines, for scripts/plot.lua.
local mp = mp or require "mp"
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local cli = dofile(here .. "lib/cli.lua")

local function usage(msg)
  io.stderr:write("policy_lab.lua: ", msg, "\n",
    "usage: policy_lab.lua TRACE [POLICY ...] [--out TABLE.jsonl]\n")
  os.exit(2)
end

local args, specs, out_path = arg or {}, {}, nil
local trace_path
local i = 1
while i <= #args do
  local a = args[i]
  if a == "--out" then
    out_path = args[i + 1] or usage("--out needs a file name")
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
if #specs == 0 then
  specs = {"dynamic", "hysteresis", "amax"}
  for _, f in ipairs {"histogram.lua"} do
    local p = here .. "policies/" .. f
    if io.open(p) then specs[#specs + 1] = p end
  end
end

local ok, trace = pcall(mp.amp.load_trace, trace_path)
if not ok then usage(tostring(trace):gsub("^[^:]*:%d+: ", "")) end
if #trace.steps == 0 then usage("the trace holds no steps") end
local names = trace.header.params

-- the n of each parameter (the same every step): the weights of the mean underflow
local n_of, n_all = {}, 0
for k, p in ipairs(trace.steps[1].params) do
  n_of[names[k] or ("param " .. k)] = p.n
  n_all = n_all + p.n
end

local function log2(x) return math.log(x, 2) end
local function fmt_scale(x) return string.format("2^%g", math.floor(log2(x) * 100 + 0.5) / 100) end

local function summarise(traj)
  local skipped, unknown, mean_u, worst_u, lo, hi = 0, 0, 0, 0, math.huge, 0
  local recover, events, never = 0, 0, 0
  for t, e in ipairs(traj) do
    if e.skipped then
      skipped = skipped + 1
      if e.unknown then unknown = unknown + 1 end
      -- steps until the scale is back at its value before this skip
      local before, back = e.scale, nil
      for u = t + 1, #traj do
        if traj[u].scale >= before then back = u - t; break end
      end
      if back then recover, events = recover + back, events + 1 else never = never + 1 end
    end
    local sum = 0
    for name, f in pairs(e.underflow) do
      sum = sum + f * (n_of[name] or 0)
      if f > worst_u then worst_u = f end
    end
    mean_u = mean_u + (n_all > 0 and sum / n_all or 0)
    lo, hi = math.min(lo, e.scale), math.max(hi, e.scale)
  end
  local rec = events > 0 and string.format("%.1f", recover / events) or "-"
  if never > 0 then rec = rec .. string.format(" (%d never)", never) end
  return {skipped = skipped, unknown = unknown, mean_u = mean_u / #traj, worst_u = worst_u, recover = rec,
          range = fmt_scale(lo) .. ".." .. fmt_scale(hi)}
end

local recorded = 0
for _, r in ipairs(trace.steps) do if not r.applied then recorded = recorded + 1 end end
print(string.format("trace %s: %d steps, %d parameters, %d skipped as recorded (policy %s)", trace_path,
  #trace.steps, #names, recorded, tostring(trace.header.policy and trace.header.policy.kind)))
print(string.format("%-28s %12s %14s %14s %14s  %s", "policy", "skipped", "underflow mean", "underflow worst",
  "recover steps", "scale"))
local out = out_path and assert(io.open(out_path, "w"))
for _, spec in ipairs(specs) do
  local pol = cli.policy(spec, usage)
  local traj = mp.amp.replay(trace, pol)
  local s = summarise(traj)
  print(string.format("%-28s %12s %14.3e %14.3e %14s  %s", spec:match("([^/]+)$"),
    s.unknown > 0 and string.format("%d (%d ?)", s.skipped, s.unknown) or tostring(s.skipped), s.mean_u, s.worst_u,
    s.recover, s.range))
  if out then
    for _, e in ipairs(traj) do
      out:write(mp.amp._json{policy = spec:match("([^/]+)$"), step = e.step, scale = e.scale, skipped = e.skipped,
                             underflow = e.underflow}, "\n")
    end
  end
end
if out then out:close() end
