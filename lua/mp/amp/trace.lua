-- mp.amp's traces: scaler:trace(path) writes one JSON line per step (this file's
-- trace.method, a GradScaler method), mp.amp.load_trace(path) reads a trace back
-- (held packed by lua/ltrace.c). The step's line itself is built in C
-- (lua/lscaler_trace.c), since it is built every step.
local core = require "mp.core"
local P = require "mp.amp.policy"

local trace = {}

-- scaler:trace(path [, {names =, meta =, fatal =}]) records every step from the next
-- one into a JSON-lines file (gzip-compressed when the name ends in .gz), one line per
-- step, each line written and flushed when the step's scale is updated, so the trace
-- of a crashed run is readable up to its last step; scaler:trace(false) closes it.
-- A trace is a side file: a write that fails later (a full disk) stops the trace
-- with a warning on stderr naming the file, and training goes on; fatal = true
-- makes it an error of that step's update() instead. On an
-- asynchronous device (CUDA) a step's line is written at the next step's update, from
-- a snapshot the device copied without a wait (a crashed run's trace then ends a step
-- early), and the step itself waits for nothing.
-- Tracing turns telemetry on (the per-parameter statistics it records).
--
-- Line 1, the header:
--   {"trace": "mpengine.scaler", "version": 1, "hist_lo": -48, "bins": 64,
--    "params": [names...], "policy": {...}, "meta": {...}}
-- then one line per step:
--   {"step": k, "scale": s, "applied": true|false, "reason": null|"overflow"|"nan"|"forward",
--    "loss": l, "params": [{"n", "amax", "nan", "inf", "zeros", "underflow", "overflow",
--                           "lo", "hist": [...]}...]}
-- where scale is the scale the step ran at; loss the unscaled loss (summed over the
-- losses scaled that step: micro-batches of gradient accumulation); per parameter, in
-- the optimizer's order: amax of the true gradient, counts over the scaled gradient
-- at that scale (zeros; underflow: |g s| <= 2^-25, f16 flushes it; overflow:
-- |g s| >= 65520) and the log2 histogram of |g s| from its first non-empty bin lo
-- (0-based): the k-th entry of hist (from 0) counts 2^(hist_lo + lo + k) <= |g s| <
-- 2^(hist_lo + lo + k + 1) (bins outside the list are empty; the first and last of the
-- 64 bins also take what lies beyond them). Non-finite numbers are written as the
-- strings "nan", "inf", "-inf". mp.amp.load_trace expands hist to all 64 bins.
-- mp.amp.load_trace(path) reads one back (and checks every line: below). Size per step (measured): the MLP of
-- train_mlp.lua 1.1 KB (0.3 KB gzip'd), the default GPT of train_gpt.lua 4.1 KB
-- (0.9 KB), GPT-2 small (148 parameter tensors) 25 KB (6.3 KB): a line per
-- parameter tensor's few dozen non-empty bins, not per value.

local function json_value(v)
  local t = type(v)
  if t == "number" then
    if v ~= v then return '"nan"' end
    if v == math.huge then return '"inf"' end
    if v == -math.huge then return '"-inf"' end
    if math.type(v) == "integer" then return tostring(v) end
    return string.format("%.9g", v)
  elseif t == "string" then
    return '"' .. v:gsub('[%c"\\]', function(c) return string.format("\\u%04x", c:byte()) end) .. '"'
  elseif t == "boolean" then
    return tostring(v)
  elseif t == "table" then
    if #v > 0 or next(v) == nil then
      local parts = {}
      for i = 1, #v do parts[i] = json_value(v[i]) end
      return "[" .. table.concat(parts, ",") .. "]"
    end
    local keys, parts = {}, {}
    for k in pairs(v) do keys[#keys + 1] = tostring(k) end
    table.sort(keys)
    for i, k in ipairs(keys) do parts[i] = json_value(k) .. ":" .. json_value(v[k]) end
    return "{" .. table.concat(parts, ",") .. "}"
  end
  return "null"
end
trace.json = json_value   -- mp.amp._json, for scripts that write their own JSON lines (the policy lab)

local HIST_LO = -48

-- The longest lines mp.amp.load_trace reads, and GradScaler:trace writes: the
-- header (the parameters' names and the script's meta) and a step's record (a
-- parameter takes 1.3 KB at most, every bin full of 16-digit counts: 16 MiB holds
-- 12,000 of them; GPT-2 small's 148 take 25 KB).
local TRACE_HEADER_MAX, TRACE_RECORD_MAX = 1 << 20, 16 << 20

-- A line to the trace file. A trace is a side file: when a write fails (a full
-- disk) or a line is longer than load_trace reads, the trace stops there with a
-- warning naming the file and training goes on; with trace(path, {fatal = true})
-- the message is returned, for update() to raise.
local function trace_write(self, line)
  local why
  if #line > TRACE_RECORD_MAX then
    why = string.format("a step's line of %d bytes, more than the %d that mp.amp.load_trace reads", #line,
                        TRACE_RECORD_MAX)
  else
    local ok, e = pcall(self._trace.write, self._trace, line)
    if ok then self._trace_lines = self._trace_lines + 1; return end
    -- lua/llines.c's words, less what the message says anyway: "line file: write failed (PATH: why)"
    why = tostring(e):gsub("^line file: write failed %((.*)%)$", "%1"):gsub("^" .. self._trace_path:gsub("%p", "%%%0") .. ": ", "")
  end
  local path, lines = self._trace_path, self._trace_lines
  pcall(self._trace.close, self._trace)
  self._trace, self._trace_loss, self._trace_lag = nil, nil, nil
  local msg = string.format("writing the trace '%s' failed (%s); the trace stops after %d steps", path, why, lines)
  if self._trace_fatal then return msg end
  io.stderr:write("mpengine: warning: GradScaler: ", msg, ", and training goes on (scaler:trace(path, {fatal = true}) makes it an error)\n")
end

function trace.write_step(self)
  local losses = self._trace_loss or {}
  self._trace_loss = nil
  if self._trace_lag then
    -- an asynchronous device: this step's snapshot is queued, the one before it
    -- (long copied by now) becomes its line; no wait for the device
    local l
    do
      local _ <close> = core.no_grad()
      for _, loss in ipairs(losses) do l = l and l + loss:detach() or loss:detach() end
    end
    self._c:_trace_snap(l)
    local line = self._c:_trace_take(false)
    if line then return trace_write(self, line) end
    return
  end
  local l
  for _, loss in ipairs(losses) do l = (l or 0) + loss:item() end
  return trace_write(self, self._c:_trace_record(l))   -- lua/lscaler_trace.c builds the line: it runs every step
end

-- the lines of the snapshots not yet written (an asynchronous device): at most two
local function drain(self)
  if not (self._trace and self._trace_lag) then return end
  for _ = 1, 2 do
    local line = self._c:_trace_take(true)
    if not line then break end
    local err = trace_write(self, line)
    if err or not self._trace then return err end
  end
end

function trace.method(self, path, opts)
  if path == false or path == nil then
    local err = drain(self)
    if self._trace then self._trace:close() end
    self._trace, self._trace_loss = nil, nil
    if err then error("GradScaler:trace: " .. err, 2) end
    return
  end
  if type(path) ~= "string" then error("GradScaler:trace: expected a file name or false (got " .. type(path) .. ")", 2) end
  local o = core._options("GradScaler:trace", opts, "names:table meta:table fatal:boolean", 2)
  local err = drain(self)
  if self._trace then self._trace:close() end
  self._trace = nil
  if err then error("GradScaler:trace: " .. err, 2) end
  if o.names then self._names = o.names end
  local pol = {}
  if getmetatable(self._policy) == P.Builtin then
    for k, v in pairs(self._policy) do pol[k] = v end
  else
    pol.kind = "lua"
  end
  local header = json_value{trace = "mpengine.scaler", version = 1, hist_lo = HIST_LO, bins = 64,
                            params = self._names or {}, policy = pol, meta = o.meta or {}}
  if #header > TRACE_HEADER_MAX then
    error(string.format("GradScaler:trace: the header line (the parameters' names and meta) takes %d bytes, more "
                        .. "than the %d that mp.amp.load_trace reads", #header, TRACE_HEADER_MAX), 2)
  end
  local f, oerr = core._lines_open(path, "w")
  if not f then error("GradScaler:trace: " .. oerr, 2) end
  self:telemetry(true)
  local ok, e = pcall(f.write, f, header)
  if not ok then f:close(); error("GradScaler:trace: " .. tostring(e), 2) end
  self._trace, self._trace_path, self._trace_fatal, self._trace_lines = f, path, o.fatal or false, 0
  -- on an asynchronous device (CUDA) each step's line is written one step later,
  -- from a snapshot copied without a wait; decided at the first step, when the
  -- scaler's state has a device
  self._trace_lag = nil
end

-- a value in a message: strings quoted and cut short
function trace.shown(v)
  if type(v) == "string" then return string.format("%q", #v > 40 and v:sub(1, 40) .. "..." or v) end
  return tostring(v)
end

-- what is wrong with a trace's header (the table of its first line), or nil
local shown = trace.shown

local function header_fault(h)
  if type(h) ~= "table" or h.trace ~= "mpengine.scaler" then return "not a scaler trace (no mpengine.scaler header)" end
  if h.version ~= 1 then return "version is " .. shown(h.version) .. " (this engine reads version 1)" end
  -- the histogram's shape is the engine's (kernels/backend.h), not the file's to choose
  if h.bins ~= 64 then return "bins is " .. shown(h.bins) .. " (the engine writes 64)" end
  if h.hist_lo ~= HIST_LO then return "hist_lo is " .. shown(h.hist_lo) .. " (the engine writes " .. HIST_LO .. ")" end
  if type(h.params) ~= "table" then return "params is " .. shown(h.params) .. " (expected a list of names)" end
  local n = 0
  for _ in pairs(h.params) do n = n + 1 end
  for i = 1, n do
    if type(h.params[i]) ~= "string" then return "params[" .. i .. "] is " .. shown(h.params[i]) .. " (expected a name)" end
  end
  for _, k in ipairs{"policy", "meta"} do
    if h[k] ~= nil and type(h[k]) ~= "table" then return k .. " is " .. shown(h[k]) .. " (expected an object)" end
  end
end

-- mp.amp.load_trace(path) -> {header = {...}, steps = ...}: the header as written,
-- and the steps held packed (lua/ltrace.c: 69 bytes a step of two parameters and a
-- dozen non-empty bins, where a table per record took 3.5 KB):
-- #steps, steps[i] and ipairs(steps) give each record as written (see above), non-
-- finite numbers as numbers again, each parameter's histogram expanded to all 64
-- bins (hist[1..64]). Each steps[i] is a table built when read: a change to it is
-- not kept; steps[i] = record puts one in its place (replay reads it then).
-- Every line is checked: the header's shape is the engine's (version 1, 64 bins
-- from 2^-48), each record's fields are the ones the engine writes, with their
-- types and ranges (a finite scale > 0, counts that are integers from 0 to the
-- parameter's n, lo from 0 to 63, at most 64 bins in all, applied as reason says);
-- a line longer than any the engine writes (1 MiB for the header, 16 MiB for a
-- record) is refused once that many bytes are read. A refusal names the file and
-- the line. A last line without its newline that is not a whole record (a run
-- that crashed while writing it) is left out; a newline-terminated one is refused.
function trace.load_trace(path)
  if type(path) ~= "string" then error("mp.amp.load_trace: expected a file name", 2) end
  local f, err = core._lines_open(path, "r")
  if not f then error("mp.amp.load_trace: " .. err, 2) end
  local function refuse(lineno, why)
    f:close()
    error(string.format("mp.amp.load_trace: '%s' line %d: %s", path, lineno, why), 3)
  end
  -- why f:read stopped: a line too long for any the engine writes, or unreadable data
  local function stopped(why, what)
    return why:find("^a line longer") and why .. " (no " .. what .. " is)" or why
  end
  local first, why = f:read(TRACE_HEADER_MAX)
  if not first then refuse(1, why and stopped(why, "header") or "not a scaler trace (the file is empty)") end
  local header, jwhy = core._json_decode(first)
  if header == nil and jwhy and first:find("mpengine.scaler", 1, true) then refuse(1, "the header is " .. jwhy) end
  local fault = header_fault(header)
  if fault then refuse(1, fault) end
  local steps, lineno = core._trace_steps(), 1
  while true do
    local line, complete = f:read(TRACE_RECORD_MAX)
    if line == nil then
      if complete then refuse(lineno + 1, stopped(complete, "step record")) end   -- complete: why
      break
    end
    lineno = lineno + 1
    local ok, bad = core._trace_add(steps, line)
    if not ok and complete then refuse(lineno, bad) end
  end
  f:close()
  core._trace_fit(steps)
  return {header = header, steps = steps}
end

return trace
