-- plot.lua: a training run's loss scaling as a picture, drawn by gnuplot (Debian's
-- gnuplot-nox, installed by `make deps`).
--
--   build/mpengine scripts/plot.lua FILE --out PICTURE.png [--lab TRAJECTORIES.jsonl
--       [--heat POLICY]] [--size W,H] [--gp SCRIPT.gp]
--
-- FILE is a trace (scaler:trace, --trace; plain or .gz), an fp8 trace (fs:trace of an
-- mp.fp8.Scaler; told apart by its header) or a metrics file (--metrics of the
-- training scripts: JSON lines with step, loss and, with --amp, scale and skipped).
-- An fp8 trace draws two heat maps, FP8 tensors up and steps across: the fraction
-- of each tensor's values that saturated (rounded past the format's largest value)
-- at each step, and the fraction of its nonzero values flushed to zero (a cell is
-- blank where the tensor was not quantized that step or no counts were recorded).
-- Otherwise the panels, top to bottom:
--   loss over steps;
--   log2 of the loss scale over steps, skipped steps marked (x);
--   from a trace: each parameter's fraction of gradient values that f16 flushes to
--   zero at the step's scale, as a heat map (parameters up, steps across); with
--   --heat POLICY, that fraction for one candidate of --lab at its own scales (a
--   recorded f16 run's own fraction is near 0: its backward already rounded to
--   f16, and what flushed shows as zeros);
--   with --lab (scripts/policy_lab.lua --out): every candidate policy's scale
--   trajectory on one plot, its skipped steps marked.
-- The picture is PNG, 900 pixels wide by default. Every panel spans the same steps
-- (one x range, the same margins, so the panels line up), lines at the edge of
-- their range sit inside a padded range rather than on the border, labels are
-- plain text (no gnuplot "enhanced" markup: an underscore is an underscore) and
-- the parameters' labels are thinned to what the panel's height holds. --gp PATH
-- also writes the gnuplot script to PATH and keeps its data files in PATH.data/
-- (for a look, a rerun with gnuplot, or a test).
local mp = mp or require "mp"
local core = require "mp.core"

local function usage(msg)
  io.stderr:write("plot.lua: ", msg, "\n",
    "usage: plot.lua FILE --out PICTURE.png [--lab TRAJECTORIES.jsonl [--heat POLICY]] [--size W,H] [--gp SCRIPT.gp]\n")
  os.exit(2)
end

local args, input, out, lab, width, height, heat_of, gp_copy = arg or {}, nil, nil, nil, 900, nil, nil, nil
local i = 1
while i <= #args do
  local a = args[i]
  if a == "--out" or a == "--lab" or a == "--size" or a == "--heat" or a == "--gp" then
    local v = args[i + 1] or usage(a .. " needs a value")
    if a == "--out" then out = v elseif a == "--lab" then lab = v elseif a == "--heat" then heat_of = v
    elseif a == "--gp" then gp_copy = v
    else
      local w, h = v:match("^(%d+),(%d+)$")
      if not w then usage("--size must be W,H in pixels (got " .. v .. ")") end
      width, height = tonumber(w), tonumber(h)
    end
    i = i + 1
  elseif a:sub(1, 2) == "--" then
    usage("unknown option " .. a)
  elseif input then
    usage("one input file (got " .. input .. " and " .. a .. ")")
  else
    input = a
  end
  i = i + 1
end
if not input then usage("an input file (a trace or a metrics file) is needed") end
if not out then usage("--out PICTURE.png is needed") end
if heat_of and not lab then usage("--heat needs --lab") end

-- the JSON lines of a file (plain or gzip), decoded
local function lines_of(path)
  local f, err = core._lines_open(path, "r")
  if not f then usage(err) end
  local t = {}
  for line in function() return f:read() end do
    local v = core._json_decode(line)
    if type(v) == "table" then t[#t + 1] = v end
  end
  f:close()
  return t
end

-- ---- the series ----
local rows = lines_of(input)
if #rows == 0 then usage(input .. " holds no JSON lines") end
local is_trace = rows[1].trace == "mpengine.scaler"
local is_fp8 = rows[1].fp8_trace ~= nil
local steps, names = {}, {}
if is_fp8 then
  if lab then usage("--lab draws loss-scaling candidates, not an fp8 trace's (scripts/fp8_lab.lua prints those)") end
  local ok, tr = pcall(require("mp.fp8.trace").load, input, "plot.lua")
  if not ok then usage((tostring(tr):gsub("^[^:]*:%d+: plot%.lua: ", ""))) end
  for k, t in ipairs(tr.header.tensors) do names[k] = t.name end
  if #names == 0 then usage(input .. " holds no FP8 tensors") end
  local counted = false
  for _, r in ipairs(tr.steps) do
    local sat, flu = {}, {}
    for k = 1, #names do
      sat[k], flu[k] = r.saturated[k] or 0 / 0, r.flushed[k] or 0 / 0
      if r.saturated[k] then counted = true end
    end
    steps[#steps + 1] = {step = r.step, sat = sat, flu = flu}
  end
  if #steps > 0 and not counted then
    usage(input .. " holds no saturated/flushed counts (the holder's telemetry was off)")
  end
elseif is_trace then
  local tr = mp.amp.load_trace(input)
  names = tr.header.params
  for _, r in ipairs(tr.steps) do
    local under = {}
    for k, p in ipairs(r.params) do under[k] = p.n > 0 and p.underflow / p.n or 0 end
    steps[#steps + 1] = {step = r.step, loss = r.loss, scale = r.scale, skipped = not r.applied, under = under}
  end
else   -- metrics: skipped is a running count there
  local before = 0
  for _, r in ipairs(rows) do
    if type(r.step) == "number" then
      local skipped = type(r.skipped) == "number" and r.skipped > before
      if type(r.skipped) == "number" then before = r.skipped end
      steps[#steps + 1] = {step = r.step, loss = r.loss, scale = r.scale, skipped = skipped}
    end
  end
end
if #steps == 0 then usage(input .. " holds no steps") end

-- --heat: the candidate's own underflow fractions replace the recorded ones
local lab_rows = lab and lines_of(lab) or {}
if heat_of then
  local by_step = {}
  for _, r in ipairs(lab_rows) do if r.policy == heat_of then by_step[r.step] = r end end
  if next(by_step) == nil then usage("--heat: no candidate " .. heat_of .. " in " .. lab) end
  for _, s in ipairs(steps) do
    local r = by_step[s.step]
    for k, n in ipairs(names) do s.under[k] = r and r.underflow and r.underflow[n] or 0 / 0 end
  end
end

-- the heat maps: a field of each step, a value per name
local heats = {}
if is_fp8 and #names > 0 then
  heats = {{field = "sat", file = "saturated.dat", label = "FP8 saturated fraction",
            none = "no value saturated (0 everywhere)"},
           {field = "flu", file = "flushed.dat", label = "FP8 flushed-to-zero fraction",
            none = "no nonzero value flushed to zero (0 everywhere)"}}
elseif is_trace and #names > 0 then
  heats = {{field = "under", file = "under.dat",
            label = "f16 underflow fraction" .. (heat_of and (" (" .. heat_of .. ")") or ""),
            none = "no gradient value flushes to zero at these scales (0 everywhere)"}}
end
local panels = (is_fp8 and 0 or 2) + #heats + (lab and 1 or 0)
height = height or 260 * panels

-- ---- data files for gnuplot ----
local function sh(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
-- the data files: in a temporary folder, or with --gp beside the script it keeps
local dir = gp_copy and (gp_copy .. ".data") or os.tmpname()
if not gp_copy then os.remove(dir) end
if not os.execute("mkdir -p " .. sh(dir)) then usage("cannot make a temporary folder " .. dir) end
local function write(name, fn)
  local f = assert(io.open(dir .. "/" .. name, "w"))
  fn(f)
  f:close()
  return dir .. "/" .. name
end
local function num(x) return (x == nil or x ~= x) and "NaN" or string.format("%.9g", x) end
local function lg(x) return x and x > 0 and math.log(x, 2) or nil end

local series = not is_fp8 and write("steps.dat", function(f)
  for _, s in ipairs(steps) do
    f:write(string.format("%d %s %s %s\n", s.step, num(s.loss), num(lg(s.scale)), s.skipped and num(lg(s.scale)) or "NaN"))
  end
end)
-- the heat maps' cells: x the step (as every other panel), y the parameter (or
-- FP8 tensor); drawn as an image when the steps are evenly spaced (a trace
-- records every step), else as one square mark per cell
local even = true
for t, s in ipairs(steps) do
  if t > 2 and s.step - steps[t - 1].step ~= steps[2].step - steps[1].step then even = false end
end
for _, h in ipairs(heats) do
  h.max = 0
  for _, s in ipairs(steps) do
    for k = 1, #names do
      local u = s[h.field][k]
      if u and u == u and u > h.max then h.max = u end
    end
  end
  h.path = write(h.file, function(f)
    for k = 1, #names do   -- rows: parameters; columns: steps
      for _, s in ipairs(steps) do f:write(string.format("%d %d %s\n", s.step, k - 1, num(s[h.field][k]))) end
      f:write("\n")
    end
  end)
end
local heat = #heats > 0
local lab_series, lab_lo, lab_hi = {}, math.huge, -math.huge
if lab then
  local by = {}
  for _, r in ipairs(lab_rows) do
    if r.policy then
      if not by[r.policy] then by[r.policy] = {}; lab_series[#lab_series + 1] = r.policy end
      table.insert(by[r.policy], r)
    end
  end
  for k, pol in ipairs(lab_series) do
    lab_series[k] = {name = pol, file = write("lab" .. k .. ".dat", function(f)
      for _, r in ipairs(by[pol]) do
        local y = lg(r.scale)
        if y then lab_lo, lab_hi = math.min(lab_lo, y), math.max(lab_hi, y) end
        f:write(string.format("%d %s %s\n", r.step, num(y), r.skipped and num(y) or "NaN"))
      end
    end)}
  end
end

-- a log scale for the loss when it is positive and spans more than 2 decades
local lmin, lmax = math.huge, 0
for _, s in ipairs(steps) do
  if s.loss and s.loss == s.loss and s.loss < math.huge then lmin, lmax = math.min(lmin, s.loss), math.max(lmax, s.loss) end
end
local loss_log = lmin > 0 and lmax / lmin > 100

-- ---- ranges ----
-- one x range for every panel: the trace's steps (and the lab's), widened by half
-- a step where the heat map's cells, centred on their steps, need it
local xlo, xhi = steps[1].step, steps[#steps].step
for _, s in ipairs(steps) do xlo, xhi = math.min(xlo, s.step), math.max(xhi, s.step) end
for _, r in ipairs(lab_rows) do
  if r.policy and type(r.step) == "number" then xlo, xhi = math.min(xlo, r.step), math.max(xhi, r.step) end
end
local half = heat and #steps > 1 and (steps[2].step - steps[1].step) / 2 or 0.5
xlo, xhi = xlo - half, xhi + half

-- a value range with room above and below, so a line at the edge of the data
-- (a scale at its cap, a constant loss) is drawn inside the frame, not on it
local function padded(lo, hi, min_pad)
  if not (lo <= hi) then return nil end
  local pad = math.max(min_pad, (hi - lo) * 0.06)
  return lo - pad, hi + pad
end
local scale_lo, scale_hi = math.huge, -math.huge
for _, s in ipairs(steps) do
  local y = lg(s.scale)
  if y then scale_lo, scale_hi = math.min(scale_lo, y), math.max(scale_hi, y) end
end
local function yrange(lo, hi) return lo and string.format("set yrange [%.9g:%.9g]", lo, hi) or "set autoscale y" end
local loss_range
if lmin <= lmax then
  if loss_log then
    local f = (lmax / lmin) ^ 0.06
    loss_range = string.format("set yrange [%.9g:%.9g]", lmin / f, lmax * f)
  else
    loss_range = yrange(padded(lmin, lmax, math.max(math.abs(lmax) * 0.05, 1e-30)))
  end
else
  loss_range = "set autoscale y"
end

-- margins the same for every panel (in pixels of the picture, as screen
-- fractions), wide enough on the left for the longest parameter name and on the
-- right for the heat map's colour box, so the panels' x axes line up
local longest = 8
if heat then for _, n in ipairs(names) do longest = math.max(longest, #n) end end
local left = math.min(0.45, (longest * 6.5 + 70) / width)
local right = 1 - math.min(0.3, (heat and 120 or 20) / width)

-- ---- the gnuplot script ----
local function q(s) return "'" .. tostring(s):gsub("'", "''") .. "'" end
local g = {
  -- noenhanced: names such as h.0.attn.c_proj.weight or max_grad print as written
  "set terminal pngcairo noenhanced size " .. width .. "," .. height .. " font 'sans,9'",
  "set output " .. q(out),
  "set multiplot layout " .. panels .. ",1 title " .. q(input:match("([^/]+)$")),
  string.format("set lmargin at screen %.4f", left),
  string.format("set rmargin at screen %.4f", right),
  string.format("set xrange [%.9g:%.9g]", xlo, xhi),
  -- keys above the plots, where they cover no line
  "set grid", "set key outside top right horizontal box", "set xlabel 'step'",
}
if not is_fp8 then
  for _, l in ipairs{
  "set ylabel 'loss'",
  loss_log and "set logscale y" or "unset logscale y",
  loss_range,
  "plot " .. q(series) .. " using 1:2 with lines lw 1.5 lc rgb '#1f77b4' title 'loss'",
  "unset logscale y",
  "set ylabel 'log2 loss scale'",
  yrange(padded(scale_lo, scale_hi, 0.5)),
  "plot " .. q(series) .. " using 1:3 with steps lw 1.5 lc rgb '#2ca02c' title 'scale', "
    .. q(series) .. " using 1:4 with points pt 2 ps 1.2 lc rgb '#d62728' title 'skipped'",
  } do g[#g + 1] = l end
end
for _, h in ipairs(heats) do
  -- at most one label per ~14 pixels of the panel's plot area (font 9): every
  -- k-th parameter's name, so names do not overlap
  local plot_px = (height / panels) * 0.7
  local k_every = math.max(1, math.ceil(#names / math.max(1, math.floor(plot_px / 14))))
  local ytics = {}
  for k, n in ipairs(names) do
    if (k - 1) % k_every == 0 then ytics[#ytics + 1] = string.format("%s %d", q(n), k - 1) end
  end
  local what = is_fp8 and "FP8 tensor" or "parameter"
  g[#g + 1] = "set ylabel " .. q(k_every > 1 and string.format("%s (1 in %d named)", what, k_every) or what)
  g[#g + 1] = string.format("set yrange [-0.5:%.1f]", #names - 0.5)
  g[#g + 1] = "set ytics (" .. table.concat(ytics, ", ") .. ")"
  g[#g + 1] = "set cblabel " .. q(h.label)
  -- an all-zero map (a candidate at the recorded scales: the recorded f16
  -- backward already rounded, so what flushed is a zero, not an underflow) still
  -- draws: a range of its own, cells a pale blue where white means no data
  g[#g + 1] = h.max > 0 and "set cbrange [0:*]" or "set cbrange [0:0.01]"
  g[#g + 1] = "set palette defined (0 '#eef3fa', 0.25 '#fdd49e', 0.5 '#fc8d59', 1 '#b30000')"
  g[#g + 1] = "unset key"
  if h.max == 0 then
    g[#g + 1] = "set label 1 " .. q(h.none)
      .. " at graph 0.5, graph 0.5 center front"
  end
  g[#g + 1] = "plot " .. q(h.path) .. (even and " using 1:2:3 with image notitle"
                                    or " using 1:2:3 with points pt 5 ps 0.6 lc palette notitle")
  g[#g + 1] = "unset label 1; unset ytics; set ytics; set key"
end
if lab then
  local parts = {}
  -- candidates often share a trajectory (dynamic and hysteresis without skips):
  -- each is drawn wider than the ones after it, so one on top of another shows
  -- as a band of both colours instead of hiding it
  for k, s in ipairs(lab_series) do
    local lw = 1.5 + 1.5 * (#lab_series - k)
    parts[#parts + 1] = q(s.file) .. string.format(" using 1:2 with steps lw %.1f lc ", lw) .. k .. " title " .. q(s.name)
    parts[#parts + 1] = q(s.file) .. " using 1:3 with points pt 2 lc " .. k .. " notitle"
  end
  g[#g + 1] = "set ylabel 'log2 loss scale (candidates)'"
  g[#g + 1] = yrange(padded(lab_lo, lab_hi, 0.5))
  g[#g + 1] = #parts > 0 and ("plot " .. table.concat(parts, ", ")) or "plot NaN notitle"
end
g[#g + 1] = "unset multiplot"
local script = write("plot.gp", function(f) f:write(table.concat(g, "\n"), "\n") end)
if gp_copy then
  local f = io.open(gp_copy, "w") or usage("--gp: cannot write " .. gp_copy)
  f:write(table.concat(g, "\n"), "\n")
  f:close()
end
local okrun = os.execute("gnuplot " .. sh(script) .. " 2>" .. sh(dir .. "/gnuplot.err"))
local errf = io.open(dir .. "/gnuplot.err")
local err = errf and errf:read("a") or ""
if errf then errf:close() end
if not gp_copy then os.execute("rm -rf " .. sh(dir)) end
if not okrun then
  io.stderr:write("plot.lua: gnuplot failed", err ~= "" and (": " .. err) or " (is gnuplot installed? make deps)", "\n")
  os.exit(1)
end
print(string.format("plot.lua: wrote %s (%dx%d, %d steps%s)", out, width, height, #steps,
  lab and string.format(", %d candidates", #lab_series) or ""))
