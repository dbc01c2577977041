-- mp.fp8's telemetry: the trace of an FP8 scaler holder (fs:trace(path) records
-- a line per fs:update()), its loader (mp.fp8.load_trace), its report (fs:report())
-- and replay (mp.fp8.replay: what another recipe would have done on the recorded
-- amaxes). The holder (lua/mp/fp8/scaler.lua) calls new/record/close/report; the
-- tensor states and recipes are the ones docs/API.md "FP8 training" describes.
local core = require "mp.core"
local json = require("mp.amp.trace").json   -- mp.amp._json: one JSON writer for every trace

local trace = {}

-- the formats' largest finite value; what rounds past it (saturates: above the
-- midpoint to the next power, ties to even: e4m3's 464 rounds down to 448,
-- e5m2's 61440 up to inf), and what rounds to zero (at most half the smallest
-- subnormal, ties to even)
local FORMAT = {
  e4m3 = {max = 448, past = function(v) return v > 464 end, sub = 2 ^ -9},
  e5m2 = {max = 57344, past = function(v) return v >= 61440 end, sub = 2 ^ -16},
}
trace.FORMAT = FORMAT
local KINDS = {x = true, w = true, g = true}
local GRANULARITIES = {tensor = true, tile = true, block = true, mx = true}

-- the longest line load reads (and record writes): 16 MiB holds a step of 100,000
-- tensors; the default GPT's 24 FP8 tensors take about 1 KB
local LINE_MAX = 16 << 20

local function shown(v)
  if type(v) == "string" then return string.format("%q", #v > 40 and v:sub(1, 40) .. "..." or v) end
  return tostring(v)
end

local function f32(x) return (string.unpack("<f", string.pack("<f", x))) end

-- a JSON array of n entries, nil written as null
local function array(t, n)
  local parts = {}
  for k = 1, n do parts[k] = t[k] == nil and "null" or json(t[k]) end
  return "[" .. table.concat(parts, ",") .. "]"
end

-- ---- the step's values, with one host read ----
-- every present ts.amax, ts.used and ts.counts of fs.tensors, concatenated per
-- device into one f32 tensor and read back once (one device in practice: one read)
-- -> per tensor {amax =, scale =, saturated =, flushed =} (nil where absent)
local function gather(fs)
  local groups, order, where = {}, {}, {}
  for k, ts in ipairs(fs.tensors) do
    where[k] = {}
    for _, f in ipairs{"amax", "used", "counts"} do
      local t = ts[f]
      if t ~= nil then
        local dev = tostring(t.device)
        local g = groups[dev]
        if not g then g = {pieces = {}, n = 0}; groups[dev] = g; order[#order + 1] = dev end
        local n = t:numel()
        g.pieces[#g.pieces + 1] = t:reshape({n})
        where[k][f] = {g = g, at = g.n + 1, n = n}
        g.n = g.n + n
      end
    end
  end
  do
    local _ <close> = core.no_grad()
    for _, dev in ipairs(order) do
      local g = groups[dev]
      local all = #g.pieces == 1 and g.pieces[1] or core.cat(g.pieces, 1)
      g.values = all:to("f32"):totable()   -- the one host read (a wait on an asynchronous device)
    end
  end
  local out = {}
  for k, ts in ipairs(fs.tensors) do
    local w, r = where[k], {}
    if w.amax then r.amax = w.amax.g.values[w.amax.at] end
    if w.used then r.scale = w.used.g.values[w.used.at] end
    local numel = ts.numel
    if w.counts and type(numel) == "number" and numel > 0 then
      r.saturated = w.counts.g.values[w.counts.at] / numel
      r.flushed = w.counts.g.values[w.counts.at + 1] / numel
    end
    out[k] = r
  end
  return out
end

local function describe(ts)
  return {name = ts.name, layer = ts.layer, kind = ts.kind, format = ts.format, granularity = ts.granularity}
end

-- ---- the tracer ----
local Tracer = {}
Tracer.__index = Tracer

-- new(fs, path [, {meta =, fatal = false}]): fs:trace(path, opts) makes one. The file
-- is opened (gzip-compressed when the name ends in .gz) and refused here when it
-- cannot be; its header is written at the first record, when the holder knows its
-- tensors (they are made at the first forward pass).
function trace.new(fs, path, opts)
  local W = "fp8 Scaler:trace"
  if type(path) ~= "string" then error(W .. ": expected a file name or false (got " .. type(path) .. ")", 3) end
  local o = core._options(W, opts, "meta:table fatal:boolean", 3)
  local meta = o.meta or {}
  local ok, metajson = pcall(json, meta)
  if not ok then error(W .. ": option 'meta' cannot be written as JSON (" .. tostring(metajson) .. ")", 3) end
  local f, err = core._lines_open(path, "w")
  if not f then error(W .. ": " .. err, 3) end
  -- the counts (saturated, flushed) are what the trace is for: tracing turns the
  -- holder's telemetry on, as the loss scaler's trace does
  if type(fs.telemetry) == "boolean" then fs.telemetry = true end
  return setmetatable({f = f, path = path, meta = meta, fatal = o.fatal or false, written = 0, known = 0,
                       recipe = fs.recipe and tostring(fs.recipe.name) or "?", last = {}}, Tracer)
end

-- a line to the file; a failed write stops the trace with a warning and training
-- goes on (fatal = true: an error of update() instead). Each line is written and
-- flushed whole, so a crashed run's trace reads up to its last step.
function Tracer:write(line)
  if not self.f then return end
  local why
  if #line > LINE_MAX then
    why = string.format("a line of %d bytes, more than the %d that mp.fp8.load_trace reads", #line, LINE_MAX)
  else
    local ok, e = pcall(self.f.write, self.f, line)
    if ok then return true end
    why = tostring(e)
  end
  pcall(self.f.close, self.f)
  self.f = nil
  local msg = string.format("writing the trace '%s' failed (%s); the trace stops after %d steps", self.path, why,
                            self.written)
  if self.fatal then error("fp8 Scaler:update: " .. msg, 0) end
  io.stderr:write("mpengine: warning: fp8 Scaler: ", msg, ", and training goes on (fs:trace(path, {fatal = true}) "
                  .. "makes it an error)\n")
end

-- record(fs): the step that fs:update() is closing (called before it resets the
-- tensor states). The header (first record) lists fs.tensors; tensors made later
-- (a layer first used after the first step) get an {"add_tensors": [...]} line
-- before the step that first sees them.
function Tracer:record(fs)
  if not self.f then return end
  local n = #fs.tensors
  if not self.headed then
    local t = {}
    for k = 1, n do t[k] = describe(fs.tensors[k]) end
    local head = '{"fp8_trace":1,"recipe":' .. json(fs.recipe and tostring(fs.recipe.name) or self.recipe)
                 .. ',"meta":' .. json(self.meta) .. ',"tensors":' .. (n > 0 and json(t) or "[]") .. "}"
    if not self:write(head) then return end
    self.headed, self.known = true, n
  elseif n > self.known then
    local t = {}
    for k = self.known + 1, n do t[#t + 1] = describe(fs.tensors[k]) end
    if not self:write('{"add_tensors":' .. json(t) .. "}") then return end
    self.known = n
  end
  local v = gather(fs)
  self.written = self.written + 1
  local amax, scale, sat, flu = {}, {}, {}, {}
  for k = 1, n do
    amax[k], scale[k], sat[k], flu[k] = v[k].amax, v[k].scale, v[k].saturated, v[k].flushed
    if v[k].amax ~= nil then self.last[fs.tensors[k].name] = v[k] end
  end
  self.last_step = self.written
  self:write(string.format('{"step":%d,"amax":%s,"scale":%s,"saturated":%s,"flushed":%s}', self.written,
                           array(amax, n), array(scale, n), array(sat, n), array(flu, n)))
end

function Tracer:close()
  if self.f then self.f:close() end
  self.f = nil
end

-- ---- the report ----
local function pct(x) return x == nil and "-" or (x == 0 and "0" or string.format("%.3g%%", 100 * x)) end
local function num(x) return x == nil and "-" or string.format("%.4e", x) end

-- report(fs) -> string: a row per tensor state with the values of the step in
-- progress (before fs:update()), else those of the last step the trace recorded
function trace.report(fs)
  if type(fs) ~= "table" or type(fs.tensors) ~= "table" then error("fp8 Scaler:report: expected an fp8 Scaler", 2) end
  local now = gather(fs)
  local tr, any_now = fs._tracer, false
  for k = 1, #fs.tensors do if now[k].amax ~= nil then any_now = true end end
  local rows = {string.format("fp8 recipe %s   %d tensors   %s", fs.recipe and tostring(fs.recipe.name) or "?",
                              #fs.tensors, any_now and "values: the step in progress"
                              or (tr and tr.last_step and ("values: the last traced step (" .. tr.last_step .. ")")
                                  or "no values: no step in progress (fs:report() before fs:update(), or fs:trace(path))")),
                string.format("%-32s %-6s %-11s %12s %12s %11s %11s %6s", "tensor", "format", "granularity",
                              "amax", "scale", "saturated", "flushed", "steps")}
  for k, ts in ipairs(fs.tensors) do
    local v = now[k]
    if v.amax == nil and not any_now and tr and tr.last then v = tr.last[ts.name] or v end
    rows[#rows + 1] = string.format("%-32s %-6s %-11s %12s %12s %11s %11s %6s", tostring(ts.name),
                                    tostring(ts.format), tostring(ts.granularity), num(v.amax), num(v.scale),
                                    pct(v.saturated), pct(v.flushed), tostring(ts.steps_seen or 0))
  end
  return table.concat(rows, "\n")
end

-- ---- load ----
local function header_fault(h)
  if type(h) ~= "table" or h.fp8_trace == nil then return "not an fp8 trace (no fp8_trace header)" end
  if h.fp8_trace ~= 1 then return "fp8_trace is " .. shown(h.fp8_trace) .. " (this engine reads version 1)" end
  if type(h.recipe) ~= "string" then return "recipe is " .. shown(h.recipe) .. " (expected a name)" end
  if h.meta ~= nil and type(h.meta) ~= "table" then return "meta is " .. shown(h.meta) .. " (expected an object)" end
  if type(h.tensors) ~= "table" then return "tensors is " .. shown(h.tensors) .. " (expected a list)" end
end

local function tensors_fault(list, what, into)
  local n = 0
  for _ in pairs(list) do n = n + 1 end
  for k = 1, n do
    local t = list[k]
    local at = what .. "[" .. k .. "]"
    if type(t) ~= "table" then return at .. " is " .. shown(t) .. " (expected an object)" end
    if type(t.name) ~= "string" then return at .. ".name is " .. shown(t.name) .. " (expected a name)" end
    if not KINDS[t.kind] then return at .. ".kind is " .. shown(t.kind) .. ' (expected "x", "w" or "g")' end
    if not FORMAT[t.format] then return at .. ".format is " .. shown(t.format) .. ' (expected "e4m3" or "e5m2")' end
    if not GRANULARITIES[t.granularity] then
      return at .. ".granularity is " .. shown(t.granularity) .. ' (expected "tensor", "tile", "block" or "mx")'
    end
    into[#into + 1] = t
  end
end

local NONFINITE = {nan = 0 / 0, inf = math.huge, ["-inf"] = -math.huge}

-- a step's array of n entries: numbers (or the strings of non-finite ones), null
-- where the tensor had none; ok(v) says whether a number fits
local function array_fault(r, field, n, ok, want)
  local a = r[field]
  if type(a) ~= "table" then return field .. " is " .. shown(a) .. " (expected a list)" end
  for k in pairs(a) do
    if math.type(k) ~= "integer" or k < 1 or k > n then
      return field .. " has more than the " .. n .. " entries of the tensors"
    end
  end
  for k = 1, n do
    local v = a[k]
    if type(v) == "string" and NONFINITE[v] then v = NONFINITE[v]; a[k] = v end
    if v ~= nil and (type(v) ~= "number" or not ok(v)) then
      return field .. "[" .. k .. "] is " .. shown(v) .. " (expected " .. want .. " or null)"
    end
  end
end

local function frac(v) return v >= 0 and v <= 1 end
local function any(v) return true end
local function positive(v) return v > 0 or v ~= v end   -- a recipe's NaN or inf multiplier is written as such

-- load(path) -> {header =, steps =}: header as written (tensors gathering the
-- add_tensors lines), steps[i] = {step =, amax = {...}, scale =, saturated =,
-- flushed =} (lists in the header's order, nil where null; non-finite amaxes as
-- numbers). Every line is checked, a refusal names the file and line; a last line
-- without its newline that is not whole (a crash while writing) is left out.
function trace.load(path, who)
  who = who or "mp.fp8.load_trace"
  if type(path) ~= "string" then error(who .. ": expected a file name (got " .. type(path) .. ")", 2) end
  local f, err = core._lines_open(path, "r")
  if not f then error(who .. ": " .. err, 2) end
  local function refuse(lineno, why)
    f:close()
    error(string.format("%s: '%s' line %d: %s", who, path, lineno, why), 3)
  end
  local first, why = f:read(LINE_MAX)
  if not first then refuse(1, why or "not an fp8 trace (the file is empty: no step was recorded)") end
  local header, jwhy = core._json_decode(first)
  if header == nil and jwhy then refuse(1, "the header is " .. jwhy) end
  local fault = header_fault(header)
  if fault then refuse(1, fault) end
  local tensors = {}
  fault = tensors_fault(header.tensors, "tensors", tensors)
  if fault then refuse(1, fault) end
  header.tensors = tensors
  local steps, lineno = {}, 1
  while true do
    local line, complete = f:read(LINE_MAX)
    if line == nil then
      if complete then refuse(lineno + 1, complete) end   -- complete: why it stopped
      break
    end
    lineno = lineno + 1
    local r, rwhy = core._json_decode(line)
    local bad
    if type(r) ~= "table" then
      bad = r == nil and ("not JSON: " .. tostring(rwhy)) or ("is " .. shown(r) .. " (expected a step record)")
    elseif r.add_tensors ~= nil then
      if type(r.add_tensors) ~= "table" then bad = "add_tensors is " .. shown(r.add_tensors) .. " (expected a list)"
      else bad = tensors_fault(r.add_tensors, "add_tensors", tensors) end
    elseif math.type(r.step) ~= "integer" then
      bad = "step is " .. shown(r.step) .. " (expected an integer)"
    else
      local n = #tensors
      bad = array_fault(r, "amax", n, any, "a number")
            or array_fault(r, "scale", n, positive, "a number > 0")
            or array_fault(r, "saturated", n, frac, "a fraction")
            or array_fault(r, "flushed", n, frac, "a fraction")
      if not bad then
        -- amaxes and multipliers are f32 on the device, written in 9 digits: f32 again
        for k = 1, n do
          if r.amax[k] then r.amax[k] = f32(r.amax[k]) end
          if r.scale[k] then r.scale[k] = f32(r.scale[k]) end
        end
        steps[#steps + 1] = {step = r.step, amax = r.amax, scale = r.scale, saturated = r.saturated,
                             flushed = r.flushed}
      end
    end
    if bad and complete then refuse(lineno, bad) end
    if bad then break end   -- a last line cut short: left out
  end
  f:close()
  return {header = header, steps = steps}
end

-- mp.fp8.load_trace(path): load under its public name
function trace.load_trace(path) return trace.load(path) end

-- ---- replay ----
local function method_missing(r)
  if type(r) ~= "table" then return "expected a recipe (a table with layout, init, scale and observe; got "
                                    .. type(r) .. ")" end
  for _, m in ipairs{"layout", "init", "scale", "observe"} do
    local ok, v = pcall(function() return r[m] end)
    if not ok or type(v) ~= "function" and not (type(v) == "table" and getmetatable(v) and getmetatable(v).__call) then
      return "the recipe has no method '" .. m .. "' (a recipe is a table with layout, init, scale and observe)"
    end
  end
end

-- a multiplier a recipe gave: an f32 tensor of one value (a number is taken too)
local function multiplier(v)
  if type(v) == "number" then return v > 0 and v < math.huge and v or nil end
  if type(v) == "userdata" and pcall(function() return v:numel() end) and v:numel() == 1 then
    local x = v:reshape({1}):to("f32"):totable()[1]
    return x > 0 and x < math.huge and x or nil, x
  end
end

-- replay(trace, recipe) -> {recipe =, tensors = {...}, steps = {...}}: see docs/API.md
-- mp.fp8.replay. trace: load's table or a path.
function trace.replay(tr, recipe)
  local R = "mp.fp8.replay"
  if type(tr) == "string" then
    local ok, t = pcall(trace.load, tr, R)
    if not ok then error((tostring(t):gsub("^[^:]*:%d+: ", "")), 2) end
    tr = t
  end
  if type(tr) ~= "table" or type(tr.header) ~= "table" or type(tr.steps) ~= "table"
     or type(tr.header.tensors) ~= "table" then
    error(R .. ": expected a trace (mp.fp8.load_trace's table, or a path)", 2)
  end
  local missing = method_missing(recipe)
  if missing then error(R .. ": " .. missing, 2) end
  local function call(step, ts, what, ...)
    local res = table.pack(pcall(recipe[what], recipe, ...))
    if not res[1] then
      error(string.format("%s: the recipe's %s failed%s for %s: %s", R, what, step and (" at step " .. step) or "",
                          ts.name, tostring(res[2])), 3)
    end
    return table.unpack(res, 2, res.n)
  end
  -- the recipe's own tensor states, on the CPU, laid out as the recipe would
  local states, out_tensors = {}, {}
  for k, t in ipairs(tr.header.tensors) do
    local ts = {name = t.name, layer = t.layer, kind = t.kind, device = "cpu", steps_seen = 0, numel = 0}
    local fmt, gran = call(nil, ts, "layout", t.kind)
    if not FORMAT[fmt] then
      error(string.format('%s: the recipe\'s layout("%s") gave format %s (expected "e4m3" or "e5m2")', R, t.kind,
                          shown(fmt)), 2)
    end
    if not GRANULARITIES[gran] then
      error(string.format('%s: the recipe\'s layout("%s") gave granularity %s (expected "tensor", "tile", "block" '
                          .. 'or "mx")', R, t.kind, shown(gran)), 2)
    end
    ts.format, ts.granularity = fmt, gran
    call(nil, ts, "init", ts)
    states[k] = ts
    out_tensors[k] = {name = t.name, layer = t.layer, kind = t.kind, format = fmt, granularity = gran}
  end
  local steps = {}
  for i, r in ipairs(tr.steps) do
    if type(r) ~= "table" or type(r.amax) ~= "table" then
      error(R .. ": the trace's step " .. i .. " is not a step record (no amax list)", 2)
    end
    local e = {step = r.step, amax = {}, scale = {}, saturated = {}, overshoot = {}, underflow = {}, headroom = {}}
    local _ <close> = core.no_grad()
    for k, ts in ipairs(states) do
      local amax = r.amax[k]
      if type(amax) == "number" then
        local F = FORMAT[ts.format]
        local given = call(r.step, ts, "scale", ts)
        local m
        if given ~= nil then
          if ts.granularity ~= "tensor" then
            error(string.format("%s: the recipe's scale gave a multiplier at step %s for %s, whose granularity is %q "
                                .. "(quantize takes one for \"tensor\" only)", R, r.step, ts.name, ts.granularity), 2)
          end
          local got, raw = multiplier(given)
          if not got then
            error(string.format("%s: the recipe's scale gave %s at step %s for %s (expected nil or an f32 tensor of "
                                .. "one positive finite value)", R, raw and string.format("%.9g", raw) or shown(given), r.step,
                                ts.name), 2)
          end
          m = got
        elseif ts.granularity == "tensor" then
          -- current scaling: quantize's own f32 FP8_MAX / amax (1 for a zero tensor)
          local a = f32(amax)
          m = (a > 0 and a < math.huge) and f32(F.max / a) or 1
        end
        e.amax[k] = amax
        if m then
          e.scale[k] = m
          local v = amax * m
          local sat = amax == amax and F.past(v)
          e.saturated[k] = sat
          e.overshoot[k] = sat and v / F.max or nil
          e.underflow[k] = amax > 0 and v <= F.sub / 2   -- every nonzero value rounds to zero
          e.headroom[k] = amax ~= amax and amax or (amax > 0 and math.log(F.max / v, 2) or math.huge)
        else
          -- per-group scales (tile, block, mx) from each group's own amax: the
          -- group holding the tensor's amax maps it to the top of the format;
          -- a per-tensor amax says nothing more (mx's power-of-two scales aside)
          e.saturated[k], e.underflow[k], e.headroom[k] = false, false, 0
        end
        call(r.step, ts, "observe", ts, core.tensor({amax}, {dtype = "f32", device = "cpu"}))
        ts.steps_seen = ts.steps_seen + 1
      end
    end
    steps[i] = e
  end
  return {recipe = recipe.name ~= nil and tostring(recipe.name) or "?", tensors = out_tensors, steps = steps}
end

return trace
