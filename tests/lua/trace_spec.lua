-- trace_spec.lua: scaler:trace and mp.amp.load_trace (lua/mp/amp/trace.lua, lua/llines.c):
-- every record holds what the scaler saw that step (scale it ran at, decision and
-- reason, loss, each parameter's counts and histogram, as telemetry_table gives
-- them), plain and gzip files read back alike, a crashed run's trace reads up to its
-- last whole step, a half-written last line is left out, and bad use is refused.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local function tmp(name) return os.tmpname() .. "-" .. name end

-- a small model trained `steps` steps under f16 autocast with tracing to path;
-- step 3's forward overflows. Returns what telemetry showed each step.
local function train(path, steps, opts)
  mp.manual_seed(1)
  local model = nn.Sequential(nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 3))
  local opt = mp.optim.Adam(model:parameters(), { lr = 1e-2 })
  local sc = mp.amp.GradScaler {}
  local _, names = model:named_parameters()
  sc:trace(path, { names = names, meta = opts and opts.meta })
  local seen = {}
  for s = 1, steps do
    local x, y = mp.randn { 16, 12 }, mp.randint(0, 3, { 16 })
    opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast("f16")
      loss = mp.cross_entropy(model(x) * (s == 3 and 1e30 or 1), y)
    end
    local l = loss:item()
    sc:scale(loss):backward()
    local applied = sc:step(opt)
    local t, c = sc:telemetry_table()
    seen[s] = { scale = c.scale, applied = applied, reason = c.reason, loss = l, t = t, names = names }
    sc:update()
  end
  return sc, seen
end

describe("scaler:trace", function()
  for _, ext in ipairs { "jsonl", "jsonl.gz" } do
    it("records each step as telemetry saw it (" .. ext .. ")", function()
      local path = tmp("t." .. ext)
      local sc, seen = train(path, 6, { meta = { run = "spec" } })
      sc:trace(false)
      local tr = mp.amp.load_trace(path)
      assert.are.equal("mpengine.scaler", tr.header.trace)
      assert.are.equal(1, tr.header.version)
      assert.are.equal(-48, tr.header.hist_lo)
      assert.are.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, tr.header.params)
      assert.are.equal("spec", tr.header.meta.run)
      assert.are.equal("dynamic", tr.header.policy.kind)
      assert.are.equal(6, #tr.steps)
      for s, r in ipairs(tr.steps) do
        local w = seen[s]
        assert.are.equal(s, r.step)
        assert.are.equal(w.scale, r.scale, "step " .. s)
        assert.are.equal(w.applied, r.applied, "step " .. s)
        assert.are.equal(w.applied and nil or w.reason, r.reason)
        if w.loss == w.loss then assert.is_true(math.abs(r.loss - w.loss) <= 1e-6 * math.abs(w.loss)) end
        for i, name in ipairs(w.names) do
          local p, t = r.params[i], w.t[name]
          assert.are.equal(t.n, p.n)
          assert.are.equal(t.zeros, p.zeros)
          assert.are.equal(t.underflow, p.underflow)
          assert.are.equal(t.overflow, p.overflow)
          assert.are.equal(t.nan, p.nan)
          assert.are.equal(t.inf, p.inf)
          assert.is_true(math.abs(p.amax - t.amax) <= 1e-6 * t.amax, "amax")
          assert.are.same(t.hist, p.hist)
        end
      end
      assert.are.equal("forward", tr.steps[3].reason)
      assert.is_false(tr.steps[3].applied)
      assert.are.equal(tr.steps[3].scale / 2, tr.steps[4].scale)   -- the backoff shows in the next step
      os.remove(path)
    end)

    it("of a run that dies is readable up to its last step (" .. ext .. ")", function()
      local path = tmp("crash." .. ext)
      local code = string.format([[
        local mp = require "mp"
        local nn = mp.nn
        local model = nn.Sequential(nn.Linear(4, 2))
        local opt = mp.optim.SGD(model:parameters(), {lr = 0.1})
        local sc = mp.amp.GradScaler{}
        sc:trace(%q)
        for s = 1, 4 do
          opt:zero_grad()
          local loss
          do local _ <close> = mp.amp.autocast("f16"); loss = model(mp.randn{3, 4}):sum() end
          sc:scale(loss):backward(); sc:step(opt); sc:update()
        end
        os.exit(7, false)   -- no close, no collection: as a crash leaves it
      ]], path)
      local r = H.child(code, true)
      assert.are.equal(7, r.rc, r.err)
      local tr = mp.amp.load_trace(path)
      assert.are.equal(4, #tr.steps)
      assert.are.equal(4, tr.steps[4].step)
      os.remove(path)
    end)
  end

  it("leaves out a half-written last line, and refuses a broken one in the middle", function()
    local path = tmp("cut.jsonl")
    train(path, 3):trace(false)
    local text = H.slurp(path)
    H.spit(path, text:sub(1, #text - 40))   -- the last record cut short
    assert.are.equal(2, #mp.amp.load_trace(path).steps)
    local lines = {}
    for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
    lines[3] = "{garbage"
    H.spit(path, table.concat(lines, "\n") .. "\n")
    H.raises(function() mp.amp.load_trace(path) end, { "mp.amp.load_trace", "line 3" })
    H.spit(path, "hello\n")
    H.raises(function() mp.amp.load_trace(path) end, { "not a scaler trace" })
    H.raises(function() mp.amp.load_trace(tmp("missing")) end, { "cannot open" })
    os.remove(path)
  end)

  -- A trace is a side file: a write that fails (here the file-size limit, as a full
  -- disk would) stops the trace with a warning naming the file, and training goes
  -- on; with fatal = true the step's update() raises instead. In a child process
  -- whose files may not grow past 2 KB, 512 bytes gzip'd (ulimit -f: 40 steps take
  -- 16 KB, 1.7 KB gzip'd; SIGXFSZ ignored, so a write past it fails with EFBIG
  -- instead of killing the process).
  for _, ext in ipairs { "jsonl", "jsonl.gz" } do
    it("that cannot be written stops with a warning and training goes on, or with fatal = true ends it (" .. ext .. ")", function()
      local function run(fatal)
        local path, script, errf = tmp("full." .. ext), os.tmpname(), os.tmpname()
        H.spit(script, string.format([[
          local mp = require "mp"
          local nn = mp.nn
          mp.manual_seed(1)
          local model = nn.Sequential(nn.Linear(4, 2))
          local opt = mp.optim.SGD(model:parameters(), {lr = 0.1})
          local sc = mp.amp.GradScaler{}
          sc:trace(%q, {fatal = %s})
          for s = 1, 40 do
            opt:zero_grad()
            local loss
            do local _ <close> = mp.amp.autocast("f16"); loss = model(mp.randn{3, 4}):sum() end
            sc:scale(loss):backward(); sc:step(opt)
            local ok, err = pcall(sc.update, sc)
            if not ok then io.write("update failed at step ", s, ": ", tostring(err)); os.exit(3, false) end
          end
          sc:trace(false)
          io.write("trained 40 steps")
          os.exit(0, false)
        ]], path, tostring(fatal)))
        local vars = { LUA_PATH = H.root .. "/lua/?.lua;" .. H.root .. "/lua/?/init.lua;;", LUA_CPATH = H.build .. "/?.so;;" }
        local p = io.popen("{ trap '' XFSZ; ulimit -f " .. (ext == "jsonl" and 4 or 1) .. "; " .. H.env(vars) .. H.lua .. " " .. H.q(script) .. " 2>" .. H.q(errf)
                           .. "; } 2>/dev/null; echo \"__rc=$?\"")
        local out = p:read("a")
        p:close()
        local err = H.slurp(errf)
        os.remove(script); os.remove(errf)
        return path, out, err, tonumber(out:match("__rc=(%d+)"))
      end
      local path, out, err, rc = run(false)
      assert.are.equal(0, rc, out .. err)
      assert.is_truthy(out:find("trained 40 steps", 1, true), out)
      assert.is_truthy(err:find("mpengine: warning: GradScaler: writing the trace '" .. path .. "' failed", 1, true), err)
      assert.is_truthy(err:find("training goes on", 1, true), err)
      local _, warnings = err:gsub("mpengine: warning", "")
      assert.are.equal(1, warnings, err)   -- once: the trace is stopped, not retried every step
      local n = #mp.amp.load_trace(path).steps   -- what was written before the limit reads back
      assert.is_true(n >= 1 and n < 40, n .. " steps")
      assert.is_truthy(err:find("after " .. n .. " steps", 1, true) or err:find("after " .. (n + 1) .. " steps", 1, true), err)
      os.remove(path)
      path, out, err, rc = run(true)
      assert.are.equal(3, rc, out .. err)
      assert.is_truthy(out:find("GradScaler:update: writing the trace '" .. path .. "' failed", 1, true), out)
      assert.is_nil(err:find("warning", 1, true), err)
      os.remove(path)
    end)
  end

  it("refuses bad use", function()
    local sc = mp.amp.GradScaler {}
    H.raises(function() sc:trace(42) end, { "GradScaler:trace", "file name" })
    H.raises(function() sc:trace("/nonexistent-dir/x.jsonl") end, { "cannot open" })
    H.raises(function() sc:trace(tmp("x"), { nmaes = {} }) end, { "nmaes" })
    H.raises(function() sc:trace(tmp("x"), { fatal = "yes" }) end, { "GradScaler:trace", "fatal" })
    local path = tmp("t.jsonl")
    sc:trace(path)
    H.raises(function() sc:telemetry(false) end, { "trace" })
    sc:trace(false)
    sc:telemetry(false)
    os.remove(path)
  end)
end)

describe("scaler:trace on an asynchronous device", function()
  it("costs a step no read, copy or wait: each line comes from a snapshot one step later", function()
    if mp.default_device() ~= "cuda" then return pending("needs the cuda device (a GPU, or the fake device of CI's second pass)") end
    mp.manual_seed(2)
    local model = nn.Sequential(nn.Linear(12, 10), nn.ReLU(), nn.Linear(10, 3))
    local opt = mp.optim.Adam(model:parameters(), { lr = 1e-2 })
    local sc = mp.amp.GradScaler { sync = false }
    local path = tmp("async.jsonl")
    local x, y = mp.randn { 16, 12 }, mp.randint(0, 3, { 16 })
    sc:trace(path)
    local function one()
      opt:zero_grad()
      local loss
      do
        local _ <close> = mp.amp.autocast("f16")
        loss = mp.cross_entropy(model(x), y)
      end
      sc:scale(loss):backward()
      sc:step(opt)
      sc:update()
    end
    one(); one()
    local before = mp.counters("cuda")
    one(); one(); one()
    local now = mp.counters("cuda")
    assert.are.equal(before.host_reads, now.host_reads, "host reads")
    assert.are.equal(before.device_to_host, now.device_to_host, "copies to the host")
    assert.are.equal(before.device_waits, now.device_waits, "waits")
    -- the lines so far: every step but the last, whose snapshot closing the trace writes
    local lines = 0
    for _ in io.lines(path) do lines = lines + 1 end
    assert.are.equal(1 + 4, lines)
    sc:trace(false)
    local tr = mp.amp.load_trace(path)
    assert.are.equal(5, #tr.steps)
    for s, r in ipairs(tr.steps) do
      assert.are.equal(s, r.step)
      assert.is_true(r.applied)
      assert.is_true(r.loss > 0 and r.loss < 10, "loss " .. tostring(r.loss))
      assert.are.equal(4, #r.params)
    end
    os.remove(path)
  end)
end)
