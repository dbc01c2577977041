-- mp.amp's lab: what a policy would have done on a recorded trace (replay) and a
-- step's low-precision run against FP32, op by op (diagnose). lua/llab.c holds
-- their C halves (the built-in policies run without a model, the observer).
local core = require "mp.core"
local errors = require "mp.errors"
local P = require "mp.amp.policy"
local T = require "mp.amp.trace"

local check_scale, checked_view, shown = P.check_scale, P.checked_view, T.shown

local lab = {}

-- ---- replay: a policy against a recorded trace, without the model ----
-- mp.amp.replay(trace, policy) runs `policy` (built-in, or a Lua table with
-- update(self, info)) over the steps of `trace` (load_trace's table, or a path) and
-- returns its trajectory: one entry per recorded step, held packed as load_trace's
-- steps are (#traj, traj[i] and ipairs(traj) give each entry as a fresh table),
--   {step =, scale = (the scale that step would run at), skipped = true|false,
--    reason = nil|"overflow"|"nan"|"forward", underflow = {[name] = fraction},
--    unknown = true (a recorded overflow at a higher scale: see below)}.
-- At each step the recorded gradients are moved from the recorded scale to the
-- candidate's: each parameter's log2 histogram shifts by log2(candidate / recorded)
-- bins (a fractional shift splits a bin, taking its values as spread evenly in log
-- scale), the values at or below 2^-25 are the ones f16 would flush (underflow),
-- and the step overflows when a parameter's true gradient amax times the
-- candidate scale reaches 65520, f16's rounding point to inf. A recorded skip for a
-- NaN or an overflow in the forward pass is a skip at any scale; a recorded
-- gradient overflow is one at the recorded scale and above, and below it the
-- trace cannot say (its amax is of the finite values only): replay counts it as
-- skipped and marks it unknown. The policy gets the `info` it gets in training,
-- computed at the candidate scale.
--
-- Replay is a counterfactual on the recorded gradients: a run under the candidate
-- would take other steps (skips change the weights, so later gradients differ),
-- and intermediate activations' gradients, which are not recorded, may overflow
-- before the parameters' do. For the recorded policy itself replay reproduces the
-- recorded decisions exactly (tests/lua/replay_spec.lua).
local F16_OVERFLOW, LOG2_UNDERFLOW = 65520, -25

-- a histogram moved by `shift` octaves (fractional: a bin split in proportion),
-- clamped into the end bins as the telemetry's are
local function shift_hist(h, shift, into)
  local nb, whole = #h, math.floor(shift)
  local frac = shift - whole
  for b = 1, nb do
    local v = h[b]
    if v ~= 0 then
      local t1 = math.max(1, math.min(nb, b + whole))
      local t2 = math.max(1, math.min(nb, b + whole + 1))
      into[t1] = into[t1] + v * (1 - frac)
      if frac > 0 then into[t2] = into[t2] + v * frac end
    end
  end
end

-- values of a parameter at or below 2^t at its recorded scale (log-uniform within a bin)
local function count_below(p, t, hist_lo)
  local c = 0
  for b = 1, #p.hist do
    local h = p.hist[b]
    if h > 0 then
      local lo = b - 1 + hist_lo   -- the bin holds [2^lo, 2^(lo + 1))
      if lo + 1 <= t then c = c + h
      elseif lo < t then c = c + h * (t - lo) end
    end
  end
  return c
end

local REASON_OF = {overflow = "overflow", nan = "nan", forward = "forward"}

local function is_steps(v)
  return type(v) == "table" or (type(v) == "userdata" and (getmetatable(v) or {}).__name == "mp.amp.TraceSteps")
end

-- a record replay reads (load_trace checked its own; one a script built or put in
-- is checked here): what is wrong with it, or nil
local function record_fault(r)
  if type(r) ~= "table" then return "is " .. shown(r) .. " (expected a record)" end
  if not math.tointeger(r.step) then return "step is " .. shown(r.step) .. " (expected an integer)" end
  if not core._scale_ok(r.scale) then return "scale is " .. shown(r.scale) .. " (expected a finite number > 0)" end
  if r.reason ~= nil and not REASON_OF[r.reason] then return "reason is " .. shown(r.reason) end
  if type(r.params) ~= "table" then return "params is " .. shown(r.params) .. " (expected a list)" end
  for k, p in ipairs(r.params) do
    if type(p) ~= "table" then return "params[" .. k .. "] is " .. shown(p) end
    for _, f in ipairs{"n", "zeros", "underflow", "overflow"} do
      if type(p[f]) ~= "number" or not (p[f] >= 0) then
        return "params[" .. k .. "]." .. f .. " is " .. shown(p[f]) .. " (expected a count)"
      end
    end
    if type(p.amax) ~= "number" then return "params[" .. k .. "].amax is " .. shown(p.amax) .. " (expected a number)" end
    if type(p.hist) ~= "table" then return "params[" .. k .. "].hist is " .. shown(p.hist) .. " (expected 64 counts)" end
    for b = 1, 64 do
      if type(p.hist[b]) ~= "number" then
        return "params[" .. k .. "].hist[" .. b .. "] is " .. shown(p.hist[b]) .. " (expected 64 counts)"
      end
    end
  end
end

function lab.replay(trace, pol)
  if type(trace) == "string" then   -- its errors at the caller's line, as replay's own
    local ok, t = pcall(T.load_trace, trace)
    if not ok then error((tostring(t):gsub("^[^:]*:%d+: ", ""):gsub("^mp%.amp%.load_trace", "mp.amp.replay")), 2) end
    trace = t
  end
  if type(trace) ~= "table" or not is_steps(trace.steps) or type(trace.header) ~= "table" then
    error("mp.amp.replay: expected a trace (mp.amp.load_trace's table, or a path)", 2)
  end
  local _, own = checked_view(pol, "mp.amp.replay")
  local names, hist_lo = trace.header.params or {}, trace.header.hist_lo or -48
  if type(names) ~= "table" then error("mp.amp.replay: the trace's header.params is not a list of names", 2) end
  if math.type(hist_lo) ~= "integer" then error("mp.amp.replay: the trace's header.hist_lo is not an integer", 2) end
  local builtin = getmetatable(pol) == P.Builtin
  local sim, scale
  if builtin then
    sim = core._policy_sim(pol, pol.init)
    scale = sim:scale()
  else
    scale = own or 65536   -- the engine's default first scale
  end
  -- the trajectory, packed as the records are (lua/ltrace.c)
  local out, skipped = core._trajectory(names), 0
  local steps = trace.steps
  for i = 1, #steps do
    local r = steps[i]   -- a fresh table from a loaded trace: each step's is garbage after it
    local fault = record_fault(r)
    if fault then error("mp.amp.replay: the trace's step " .. i .. " " .. fault, 2) end
    local shift = math.log(scale / r.scale, 2)
    local exact = scale == r.scale
    local under, n_all, zeros, under_all, over_all, amax = {}, 0, 0, 0, 0, 0
    local overflow = false
    local total_hist = {}
    for b = 1, #(r.params[1] and r.params[1].hist or {}) do total_hist[b] = 0 end
    for k, p in ipairs(r.params) do
      local u = exact and p.underflow or count_below(p, LOG2_UNDERFLOW - shift, hist_lo)
      under[k] = p.n > 0 and u / p.n or 0
      n_all, zeros, under_all = n_all + p.n, zeros + p.zeros, under_all + u
      local o = p.overflow
      if not exact then   -- the values at or above 65520 at the candidate scale
        local nonzero = 0
        for b = 1, #p.hist do nonzero = nonzero + p.hist[b] end
        o = p.amax * scale >= F16_OVERFLOW and nonzero - count_below(p, math.log(F16_OVERFLOW, 2) - shift, hist_lo) or 0
      end
      over_all = over_all + o
      if p.amax == p.amax and p.amax > amax then amax = p.amax end
      if p.amax * scale >= F16_OVERFLOW then overflow = true end
      shift_hist(p.hist, exact and 0 or shift, total_hist)
    end
    local reason, unknown
    if r.reason == "forward" or r.reason == "nan" then
      reason = r.reason
    elseif r.reason == "overflow" then
      reason, unknown = "overflow", scale < r.scale or nil
    elseif overflow then
      reason = "overflow"
    end
    if exact then reason, unknown = REASON_OF[r.reason or ""], nil end   -- the recorded step itself
    local skip = reason ~= nil
    if skip then skipped = skipped + 1 end
    core._trajectory_add(out, r.step, scale, skip, reason, unknown, under)
    -- the next scale, as the policy decides it from this step
    if builtin then
      scale = sim:step(reason, skip and 0 or amax)
    else
      local info = {scale = scale, found_inf = skip, reason = reason, step = i, skipped = skipped, grad_amax = amax,
                    underflow_frac = n_all > 0 and under_all / n_all or 0,
                    overflow_frac = n_all > 0 and over_all / n_all or 0, zero_frac = n_all > 0 and zeros / n_all or 0,
                    hist = total_hist, hist_lo = hist_lo}
      local ok, v = pcall(pol.update, pol, info)
      if not ok then error("mp.amp.replay: the policy's update failed at step " .. r.step .. ": " .. tostring(v), 2) end
      local s2, err = check_scale(v, "the policy's update(self, info)")
      if not s2 then error("mp.amp.replay: step " .. r.step .. ": " .. err, 2) end
      scale = s2
    end
  end
  return out
end

-- ---- diagnose: a step's low-precision run against FP32, op by op ----
-- mp.amp.diagnose{model =, loss = function() ... return loss end [, scale =,
--   scaler =, print = true, rows = 20]} runs `loss` (the step's forward, autocast regions
-- included, on its own inputs) twice from the same weights and random state: once in
-- FP32 with every autocast region switched off, once as written; each loss times the
-- scale (`scale`, else the scaler's current scale, else 1) goes through backward.
-- Every op's output and every backward's gradients are kept, in order, and compared
-- pairwise: the low-precision run's amax against the FP32 run's, its inf/NaN count
-- (where FP32 has none: the low precision made them) and the fraction of values
-- FP32 has nonzero that the low-precision run has at 0 (underflow). The parameters'
-- gradients are compared the same way. The model's gradients are left as they were.
-- Returns {rows = {...}, first = the first row whose inf/NaN FP32 does not have
-- (forward before backward, in run order), mismatch = where the two runs' op
-- sequences part, if they do}; each row {kind = "forward"|"backward"|"param",
-- name =, index =, shape =, amax = (of the finite values), amax_f32 = (NaN for a
-- cast that FP32 does not make), nonfinite =, nonfinite_f32 =, underflow =}. It prints the table (the first offending row on top) unless print
-- is false. Usable from scaler.on_skip and from the REPL.
-- The printed table holds at most `rows` rows (default 20; math.huge or "all" for
-- every one): the flagged rows (an inf/NaN that FP32 does not have) always, then
-- the other rows worth a look (inf/NaN, underflow, the parameters' gradients),
-- the largest underflow first, shown in run order; a last line says how many were
-- left out and how to see them. The returned rows are always all of them.
local function compare(lp, fp)
  local _ <close> = core.no_grad()
  local a, b = lp:to("f32"), fp:to("f32")
  local numel = a:numel()
  local finite_a = (a - a):eq(0)            -- x - x is 0 exactly when x is finite
  local finite_b = (b - b):eq(0)
  local nonfinite, nonfinite_f32 = numel - finite_a:sum():item(), numel - finite_b:sum():item()
  local amax = numel > 0 and a:masked_fill(finite_a:eq(0), 0):abs():max():item() or 0   -- of the finite values
  local amax_f32 = numel > 0 and b:masked_fill(finite_b:eq(0), 0):abs():max():item() or 0
  local under = numel > 0 and (a:eq(0):to("f32") * b:ne(0):to("f32")):sum():item() / numel or 0
  return {amax = amax, amax_f32 = amax_f32, nonfinite = nonfinite, nonfinite_f32 = nonfinite_f32, underflow = under,
          shape = table.concat(lp.shape, "x")}
end

local function run_observed(model, loss_fn, scale, f32)
  local was
  if f32 then was = core._autocast_suppress(true) end
  local grad_was = core.set_grad_enabled(true)   -- from an on_skip callback or under no_grad alike
  core._observe(true)
  local ok, err = pcall(function()
    local loss = loss_fn()
    if type(loss) ~= "userdata" then error("the loss function must return the loss tensor", 0) end
    ;(scale ~= 1 and loss * scale or loss):backward()
  end)
  local seen = core._observe(false)
  core.set_grad_enabled(grad_was)
  if f32 then core._autocast_suppress(was) end
  if not ok then error(err, 0) end
  local grads = {}
  for name, p in pairs(model:named_parameters()) do grads[name] = p.grad; p.grad = nil end
  return seen, grads
end

local DIAGNOSE_ROWS = 20

function lab.diagnose(o)
  local opts = core._options("mp.amp.diagnose", o,
                             "model:table loss:function scale:number scaler:table print:boolean rows:any", 2)
  local max_rows = opts.rows == nil and DIAGNOSE_ROWS or opts.rows
  if max_rows == "all" then max_rows = math.huge end
  if not (type(max_rows) == "number" and (max_rows == math.huge or (math.tointeger(max_rows) and max_rows >= 1))) then
    errors.raise("mp.amp.diagnose: rows must be a positive integer, math.huge or \"all\" (got " .. shown(opts.rows) .. ")")
  end
  if not opts.model or type(opts.model.named_parameters) ~= "function" then
    error("mp.amp.diagnose: model must be an mp.nn module", 2)
  end
  if not opts.loss then error("mp.amp.diagnose: loss must be a function that runs the forward and returns the loss", 2) end
  local scale = opts.scale or (opts.scaler and opts.scaler:get_scale()) or 1
  local model = opts.model
  local params, names = model:named_parameters()
  local kept = {}
  for name, p in pairs(params) do kept[name] = p.grad; p.grad = nil end
  local rng = core.get_rng_state()
  local ok, r = pcall(function()
    local seen32, g32 = run_observed(model, opts.loss, scale, true)
    core.set_rng_state(rng)
    local seen, g = run_observed(model, opts.loss, scale, false)
    return {seen32, g32, seen, g}
  end)
  for name, p in pairs(params) do p.grad = kept[name] end
  core.set_rng_state(rng)
  if not ok then error("mp.amp.diagnose: " .. tostring(r), 2) end
  local seen32, g32, seen, g = r[1], r[2], r[3], r[4]
  -- pair the two runs' entries in order; the casts that autocast adds (op "to" and
  -- its backward) exist in the low-precision run only: they get rows of their own
  -- (an f32 -> f16 cast is where a large activation first becomes inf)
  local rows, mismatch = {}, nil
  local i, j = 1, 1
  while i <= #seen and j <= #seen32 do
    local a, b = seen[i], seen32[j]
    local row
    if a.op == b.op and a.backward == b.backward and a.tensor:numel() == b.tensor:numel() then
      row = compare(a.tensor, b.tensor)
      i, j = i + 1, j + 1
    elseif a.op == "to" then
      row = compare(a.tensor, a.tensor)
      row.amax_f32, row.nonfinite_f32, row.underflow = 0 / 0, 0, 0   -- no FP32 counterpart
      i = i + 1
    elseif b.op == "to" then
      j = j + 1
    else
      mismatch = string.format("entry %d: %s%s against FP32's %s%s", i, a.op, a.backward and " backward" or "",
                               b.op, b.backward and " backward" or "")
      break
    end
    if row then
      row.kind, row.name, row.index = a.backward and "backward" or "forward", a.op, #rows + 1
      if a.backward then row.name = row.name .. " -> input " .. a.input end
      rows[#rows + 1] = row
    end
  end
  if not mismatch and (i <= #seen or j <= #seen32) then
    local rest = 0
    for k = i, #seen do if seen[k].op ~= "to" then rest = rest + 1 end end
    for k = j, #seen32 do if seen32[k].op ~= "to" then rest = rest + 1 end end
    if rest > 0 then mismatch = string.format("%d ops against FP32's %d", #seen, #seen32) end
  end
  for _, name in ipairs(names) do
    if g[name] and g32[name] then
      local row = compare(g[name], g32[name])
      row.kind, row.name, row.index = "param", name, #rows + 1
      rows[#rows + 1] = row
    end
  end
  local first
  for _, row in ipairs(rows) do
    if row.nonfinite > 0 and row.nonfinite_f32 == 0 then first = row; break end
  end
  local result = {rows = rows, first = first, mismatch = mismatch, scale = scale}
  if opts.print ~= false then
    local lines = {string.format("mp.amp.diagnose at loss scale %g: %d ops and gradients against FP32%s", scale, #rows,
                                 mismatch and ("; the runs part at " .. mismatch) or "")}
    lines[#lines + 1] = string.format("%-4s %-9s %-34s %-14s %12s %12s %9s %10s", "#", "kind", "op / parameter", "shape",
                                      "amax", "amax f32", "inf/nan", "underflow")
    local function e(x) return x == x and string.format("%12.4e", x) or string.format("%12s", "-") end
    local function line(row, mark)
      lines[#lines + 1] = string.format("%-4s %-9s %-34s %-14s %s %s %9d %10.3e", mark .. row.index, row.kind,
                                        row.name:sub(1, 34), row.shape:sub(1, 14), e(row.amax), e(row.amax_f32),
                                        row.nonfinite, row.underflow)
    end
    -- which rows to print: the flagged ones (inf/NaN that FP32 does not have)
    -- always; the rest of those worth a look, by underflow, up to max_rows
    local flagged, others = {}, {}
    for _, row in ipairs(rows) do
      if row ~= first then
        if row.nonfinite > 0 and row.nonfinite_f32 == 0 then flagged[#flagged + 1] = row
        elseif row.nonfinite > 0 or row.underflow > 0 or row.kind == "param" then others[#others + 1] = row end
      end
    end
    local room = math.max(0, max_rows - #flagged - (first and 1 or 0))
    local chosen = {}
    for _, row in ipairs(flagged) do chosen[row] = true end
    if room < #others then
      local by = {}
      for k, row in ipairs(others) do by[k] = row end
      table.sort(by, function(a, b)
        local ka, kb = a.nonfinite > 0 and 1 or 0, b.nonfinite > 0 and 1 or 0
        if ka ~= kb then return ka > kb end
        if a.underflow ~= b.underflow then return a.underflow > b.underflow end
        return a.index < b.index
      end)
      for k = 1, room do chosen[by[k]] = true end
    else
      for _, row in ipairs(others) do chosen[row] = true end
    end
    if first then line(first, "!") end
    local shown_n = first and 1 or 0
    for _, row in ipairs(rows) do
      if chosen[row] then line(row, ""); shown_n = shown_n + 1 end
    end
    local worth = #flagged + #others + (first and 1 or 0)
    if shown_n < worth then
      lines[#lines + 1] = string.format("... %d more rows not shown (%d of %d; rows = %d): rows = math.huge (or \"all\") "
                                        .. "shows every one; the returned table's rows holds them all",
                                        worth - shown_n, shown_n, worth, max_rows)
    end
    lines[#lines + 1] = first and ("first inf/NaN that FP32 does not have: " .. first.kind .. " " .. first.name)
                        or "no inf/NaN that FP32 does not have"
    print(table.concat(lines, "\n"))
  end
  return result
end

return lab
