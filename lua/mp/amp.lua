-- mp.amp: autocast and the loss scaler (API.md "amp", DESIGN.md section 6).
--
--   local _ <close> = mp.amp.autocast("f16")        -- or "bf16", or false inside a region
--   local scaler = mp.amp.GradScaler{policy = mp.amp.policy.dynamic{}}
--   scaler:scale(loss):backward()
--   scaler:step(opt)     -- true when applied, false when skipped (inf/NaN)
--   scaler:update()
--
-- The scale, the unscale + inf/NaN check, the skip and the built-in policies live
-- in C (engine/scaler.c). A policy written in Lua is any table with
-- update(self, info) -> new scale (and optionally init(self) -> first scale); it
-- is called from update() with what the step found.
local core = require "mp.core"

local amp = {}

function amp.autocast(dtype) return core._autocast(dtype) end

function amp.register(op, class)
  if type(op) ~= "string" or op == "" then error("mp.amp.register: op must be a name like \"gelu\"", 2) end
  core._register(op, class)
end

function amp.classes() return core._classes() end

-- ---- policies ----

local policy = {}
amp.policy = policy

-- option tables: the binding's one checker (lua/lbind.c)
local function options(name, opts, spec)
  local r = core._options(name, opts, spec, 3)   -- not a tail call: level 3 is our caller's caller
  return r
end

local Builtin = {}
Builtin.__index = Builtin
Builtin.__name = "mp.amp.policy"
function Builtin:__tostring()
  local parts = {}
  for _, k in ipairs{"init", "growth", "backoff", "interval", "window", "hysteresis", "history", "margin", "min", "max"} do
    if self[k] ~= nil then parts[#parts + 1] = k .. "=" .. tostring(self[k]) end
  end
  return string.format("%s{%s}", self.kind, table.concat(parts, ", "))
end

local function builtin(t) return setmetatable(t, Builtin) end

-- The built-in policies: the options each takes, the engine's defaults for the
-- rest and the engine's check of every value (engine/scaler.c,
-- mp_policy_defaults and mp_policy_check), through core._policy. A bad value is
-- refused here, when the policy is made.
function policy.static(scale)
  if not core._scale_ok(scale) then
    error("mp.amp.policy.static: scale must be a finite number > 0 (got " .. tostring(scale) .. ")", 2)
  end
  return builtin(core._policy("static", {init = scale}))
end

function policy.none() return builtin(core._policy("none")) end

-- The floor of every policy whose scale moves: the smallest normal f32 unless
-- min says otherwise (the engine's MP_MIN_SCALE). At its floor with gradients
-- that still overflow, a policy warns once (on_min = "warn") or raises
-- (on_min = "error"): the scale never reaches 0 with every later step skipped
-- in silence, as PyTorch's GradScaler's does (docs/ARCHITECTURE.md, "The floor").
policy.MIN_SCALE = core._MIN_SCALE

-- the built-in policies made with an explicit init: they fix their own first
-- scale at a swap (GradScaler:set_policy); the others start from the current one
local init_given = setmetatable({}, {__mode = "k"})
local function moving(kind, opts)
  local p = builtin(core._policy(kind, opts))
  if type(opts) == "table" and opts.init ~= nil then init_given[p] = true end
  return p
end
function policy.dynamic(opts) return moving("dynamic", opts) end
function policy.hysteresis(opts) return moving("hysteresis", opts) end
function policy.amax(opts) return moving("amax", opts) end

local function is_policy(p)
  return type(p) == "table" and (getmetatable(p) == Builtin or type(p.update) == "function")
end

-- the engine's test of a scale (mp_scale_ok), with the policy's words
local function check_scale(v, what)
  if not core._scale_ok(v) then
    return nil, string.format("%s returned %s (expected a finite number > 0)", what, tostring(v))
  end
  return v
end

-- The C view of a policy and the first scale it fixes for itself (nil when it
-- leaves that to whoever uses it: the engine's default in a new scaler, the
-- current scale at a swap): a static policy's scale, none's 1, an init given
-- explicitly, a Lua policy's init() or init number. A Lua policy's fields are
-- checked here, once for every user (GradScaler, set_policy, replay); nil and
-- the reason when one is wrong.
local function engine_view(p)
  if getmetatable(p) == Builtin then
    local own = (p.kind == "static" or p.kind == "none" or init_given[p]) and p.init or nil
    return p, own
  end
  local own = p.init
  if type(own) == "function" then
    local v, err = check_scale(own(p), "policy:init()")
    if not v then return nil, err end
    own = v
  elseif own ~= nil and not core._scale_ok(own) then
    return nil, string.format("policy.init must be a function or a finite number > 0 (got %s)",
                              type(own) == "number" and tostring(own) or type(own))
  end
  if p.min ~= nil and not (type(p.min) == "number" and p.min >= 0 and p.min < math.huge) then
    return nil, string.format("policy.min must be a finite number >= 0 (got %s)",
                              type(p.min) == "number" and tostring(p.min) or type(p.min))
  end
  -- its result is held to a floor (its min, else the engine's) and warns or
  -- raises there as its on_min says (checked by the binding)
  return {kind = "external", init = own, min = p.min ~= 0 and p.min or nil, on_min = p.on_min}, own
end

-- a policy's engine view for `fname`, raising at the caller of fname's caller
local function checked_view(p, fname)
  if not is_policy(p) then
    error(fname .. ": policy must be a built-in policy or a table with update(self, info)", 3)
  end
  local ep, own = engine_view(p)
  if not ep then error(fname .. ": " .. own, 3) end
  return ep, own
end

-- ---- GradScaler ----

local GradScaler = {}
GradScaler.__index = GradScaler
GradScaler.__name = "mp.amp.GradScaler"

function amp.GradScaler(opts)
  local o = options("mp.amp.GradScaler", opts, "policy:table enabled:boolean sync:boolean")
  local p = o.policy or policy.dynamic{}
  local ep = checked_view(p, "mp.amp.GradScaler")   -- its init: the policy's own, else the engine's default
  local enabled = o.enabled ~= false
  if not enabled then p = policy.none(); ep = p end
  local self = setmetatable({_c = core._scaler(ep), _policy = p, enabled = enabled, on_skip = nil,
                             _telemetry = false, _names = nil, _sync = o.sync ~= false}, GradScaler)
  self._c:set_sync(self._sync)
  return self
end

function GradScaler:get_scale() return self._c:_info().scale end

-- scaler:set_policy(p [, {scale = "keep" | "init" | number}]): any policy the
-- constructor takes, from the next step (at once outside a step). The scale it
-- starts from: by default the current one, unless the policy fixes its own (a
-- static scale, none's 1, an init given explicitly, a Lua policy's init() or
-- init); "init" takes the policy's first scale (the engine's default 65536
-- where it has none), "keep" the current one, a number that number. The new
-- policy starts fresh (growth tracker 0, full hysteresis, empty amax history,
-- its floor warning re-armed); steps and skipped counts go on. A scaler made
-- with enabled = false checks its arguments and stays disabled (as PyTorch's
-- disabled GradScaler ignores its calls).
function GradScaler:set_policy(p, opts)
  local name = "GradScaler:set_policy"
  local ep, own = checked_view(p, name)
  local o = options(name, opts, "scale:any")
  local scale = o.scale
  if scale == nil then scale = own and "init" or nil
  elseif scale == "keep" then scale = nil
  elseif scale ~= "init" and not core._scale_ok(scale) then
    error(string.format('%s: scale must be "keep", "init" or a finite number > 0 (got %s)', name,
                        type(scale) == "number" and tostring(scale) or type(scale)), 2)
  end
  if getmetatable(p) == Builtin and p.kind == "none" and scale ~= "init" and scale ~= 1 then
    error(name .. ": scale: policy.none() always runs at scale 1 (got " .. tostring(o.scale) .. ")", 2)
  end
  if not self.enabled then return end
  self._c:set_policy(ep, scale)
  self._policy = p
end

function GradScaler:scale(loss)
  if self._telemetry then core._flush_reset() end   -- a new step: count this backward only (no read)
  if self._trace then   -- the step's loss: the sum of its micro-batches' (gradient accumulation)
    self._trace_loss = self._trace_loss or {}
    self._trace_loss[#self._trace_loss + 1] = loss
  end
  return self._c:scale(loss)
end

function GradScaler:unscale(opt) self._c:unscale(opt) end

-- names of the optimizer's parameters, by position, when the script gave them
local function param_name(self, i)
  if self._names and self._names[i] then return self._names[i] end
  return "param " .. i
end

-- true when applied, false when skipped; with sync = false, nil: the decision
-- stayed on the device (the optimizer kernels read it there), and an attached
-- schedule advances every step, as PyTorch's schedulers do
function GradScaler:step(opt)
  if not self._sync and self.on_skip then
    error("GradScaler:step: on_skip needs the step's outcome on the host (create the scaler with sync = true)", 2)
  end
  local applied = self._c:step(opt)
  self._last_opt = opt
  if applied == false then
    local info = self._c:_info()
    if self.on_skip then
      self.on_skip{reason = info.reason, step = info.steps, scale = info.scale,
                   param = info.first_bad > 0 and param_name(self, info.first_bad) or nil}
    end
  else
    local sched = core._schedule_of and core._schedule_of(opt)
    if sched then sched:step() end
  end
  return applied
end

-- info for Lua policies and scaler.stats
-- (with telemetry: hist, the log2 histogram of the scaled gradients, all parameters
-- together: hist[b] counts 2^(b - 1 + hist_lo) <= |g scale| < 2^(b + hist_lo))
local function step_info(self, c)
  local t = c.total
  return {scale = c.scale, found_inf = c.found_inf, reason = c.reason, step = c.steps, skipped = c.skipped,
          grad_amax = t.amax, underflow_frac = t.underflow_frac, overflow_frac = t.overflow_frac,
          zero_frac = t.zero_frac, hist = self._telemetry and t.hist or nil, hist_lo = t.hist_lo}
end

local write_record   -- (the traces, below)

function GradScaler:update(new_scale)
  if self._trace then
    if self._trace_lag == nil then self._trace_lag = self._c:_trace_async() end
    local err = write_record(self)
    if err then error("GradScaler:update: " .. err, 2) end
  end
  if new_scale ~= nil then
    local v, err = check_scale(new_scale, "update(new_scale)")
    if not v then error("GradScaler:update: " .. err, 2) end
    self._c:update(v)
    return
  end
  local p = self._policy
  if getmetatable(p) == Builtin then
    self._c:update()
    return
  end
  self._c:_share()   -- data parallel: the policy sees what any rank found
  local c = self._c:_info()
  local ok, v = pcall(p.update, p, step_info(self, c))
  if not ok then error("GradScaler:update: the policy's update failed: " .. tostring(v), 2) end
  local s, err = check_scale(v, "the policy's update(self, info)")
  if not s then error("GradScaler:update: " .. err .. "; the scale stays " .. c.scale, 2) end
  self._c:update(s)
end

-- telemetry(true) also takes the names of the optimizer's parameters, in order
-- (e.g. from model:named_parameters()), for the report
function GradScaler:telemetry(on, names)
  if not on and self._trace then
    error("GradScaler:telemetry: a trace is being recorded, and needs telemetry (scaler:trace(false) first)", 2)
  end
  self._telemetry = on and true or false
  if names ~= nil then self._names = names end
  self._c:telemetry(self._telemetry)
  core._count_flush(self._telemetry)
end

function GradScaler:__index(k)
  if k == "stats" then
    local c = self._c:_info()
    return {steps = c.steps, skipped = c.skipped, found_inf = c.found_inf, last_skip_reason = c.last_skip_reason,
            scale = c.scale}
  end
  return GradScaler[k]
end

-- per parameter: amax, fractions, histogram (a table), or nil without telemetry
function GradScaler:telemetry_table()
  local c = self._c:_info()
  if not c.per_param then return nil end
  local out = {}
  for i, st in ipairs(c.per_param) do
    out[param_name(self, i)] = st
  end
  -- values that rounding to f16/bf16 flushed to zero (or to inf) in the last backward, per op
  c.backward = core._flush_stats(false)
  return out, c
end

local function fmt_frac(x) return x == 0 and "0" or string.format("%.2e", x) end

function GradScaler:report()
  local t, c = self:telemetry_table()
  if not t then return "GradScaler:report: telemetry is off (scaler:telemetry(true), then a step)" end
  local rows = {string.format("loss scale %g   step %d   skipped %d%s", c.scale, c.steps, c.skipped,
    c.found_inf and ("   last step skipped: " .. tostring(c.reason)) or ""),
    string.format("%-28s %12s %10s %12s %12s", "parameter", "grad amax", "zeros", "f16 underflow", "f16 overflow")}
  local names = {}
  for k in pairs(t) do names[#names + 1] = k end
  table.sort(names)
  for _, k in ipairs(names) do
    local st = t[k]
    rows[#rows + 1] = string.format("%-28s %12.4e %10s %12s %12s", k, st.amax, fmt_frac(st.zero_frac),
      fmt_frac(st.underflow_frac), fmt_frac(st.overflow_frac))
  end
  local ops = {}
  for k in pairs(c.backward) do ops[#ops + 1] = k end
  table.sort(ops)
  if #ops > 0 then
    rows[#rows + 1] = string.format("%-28s %12s %12s %12s", "backward op (low precision)", "rounded", "flushed to 0", "to inf")
    for _, k in ipairs(ops) do
      local b = c.backward[k]
      if b.rounded > 0 then
        rows[#rows + 1] = string.format("%-28s %12d %12s %12s", k, b.rounded,
          string.format("%d (%s)", b.flushed, fmt_frac(b.flushed / b.rounded)), tostring(b.overflowed))
      end
    end
  end
  return table.concat(rows, "\n")
end

function GradScaler:state_dict()
  local c = self._c:_info()
  local p = self._policy
  local pol = {}
  if getmetatable(p) == Builtin then
    for k, v in pairs(p) do pol[k] = v end
  else
    pol.kind = "lua"
    if type(p.state_dict) == "function" then pol.state = p:state_dict() end
  end
  return {scale = c.scale, tracker = c.tracker, last_overflow = c.last_overflow,
          hysteresis_left = c.hysteresis_left, warned_at_min = c.warned_at_min,
          amax_history = c.amax_history, amax_pos = c.amax_pos,
          steps = c.steps, skipped = c.skipped, policy = pol}
end

function GradScaler:load_state_dict(sd)
  if type(sd) ~= "table" or type(sd.scale) ~= "number" then
    error("GradScaler:load_state_dict: expected a table from state_dict()", 2)
  end
  local pol = sd.policy
  if type(pol) == "table" and pol.kind == "lua" and getmetatable(self._policy) == Builtin then
    error("GradScaler:load_state_dict: the checkpoint was taken under a Lua policy, which a checkpoint cannot hold; " ..
          "give this scaler that policy first (GradScaler{policy = p} or scaler:set_policy(p))", 2)
  end
  if type(pol) == "table" and pol.kind and pol.kind ~= "lua" then
    local p = builtin{}
    for k, v in pairs(pol) do p[k] = v end
    self._c:set_policy(p, "init")
    self._policy = p
  elseif type(pol) == "table" and pol.state ~= nil and type(self._policy.load_state_dict) == "function" then
    self._policy:load_state_dict(pol.state)
  end
  self._c:_restore(sd)
end

-- ---- traces ----
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
amp._json = json_value   -- for scripts that write their own JSON lines (the policy lab)

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

write_record = function(self)
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
  return trace_write(self, self._c:_trace_record(l))   -- lua/amp.c builds the line: it runs every step
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

function GradScaler:trace(path, opts)
  if path == false or path == nil then
    local err = drain(self)
    if self._trace then self._trace:close() end
    self._trace, self._trace_loss = nil, nil
    if err then error("GradScaler:trace: " .. err, 2) end
    return
  end
  if type(path) ~= "string" then error("GradScaler:trace: expected a file name or false (got " .. type(path) .. ")", 2) end
  local o = options("GradScaler:trace", opts, "names:table meta:table fatal:boolean")
  local err = drain(self)
  if self._trace then self._trace:close() end
  self._trace = nil
  if err then error("GradScaler:trace: " .. err, 2) end
  if o.names then self._names = o.names end
  local pol = {}
  if getmetatable(self._policy) == Builtin then
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
local function shown(v)
  if type(v) == "string" then return string.format("%q", #v > 40 and v:sub(1, 40) .. "..." or v) end
  return tostring(v)
end

-- what is wrong with a trace's header (the table of its first line), or nil
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
function amp.load_trace(path)
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

function amp.replay(trace, pol)
  if type(trace) == "string" then   -- its errors at the caller's line, as replay's own
    local ok, t = pcall(amp.load_trace, trace)
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
  local builtin = getmetatable(pol) == Builtin
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
--   scaler =, print = true]} runs `loss` (the step's forward, autocast regions
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

function amp.diagnose(o)
  local opts = options("mp.amp.diagnose", o, "model:table loss:function scale:number scaler:table print:boolean")
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
    if first then line(first, "!") end
    for _, row in ipairs(rows) do
      if row ~= first and (row.nonfinite > 0 or row.underflow > 0 or row.kind == "param") then line(row, "") end
    end
    lines[#lines + 1] = first and ("first inf/NaN that FP32 does not have: " .. first.kind .. " " .. first.name)
                        or "no inf/NaN that FP32 does not have"
    print(table.concat(lines, "\n"))
  end
  return result
end

return amp
