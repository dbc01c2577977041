-- trace_load_spec.lua: what mp.amp.load_trace (lua/mp/amp/trace.lua, lua/ltrace.c,
-- lua/llines.c) refuses, and what a loaded trace costs: a header whose shape is not
-- the engine's, a line longer than any the engine writes (plain or gzip, with or
-- without its newline: refused once the cap is read, not grown into), records whose
-- fields have the wrong type or range, a newline-terminated last line that is not a
-- record, a NUL in a line, a gzip file whose data check fails. Each refusal names
-- the function, the file and the line. The records are held packed, not as a table
-- per record.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local core = require "mp.core"

local function tmp(name) return os.tmpname() .. "-" .. name end

local HEADER = '{"bins":64,"hist_lo":-48,"meta":{},"params":["w","b"],"policy":{"kind":"dynamic"},'
  .. '"trace":"mpengine.scaler","version":1}'
-- a step as the engine writes it (lua/lscaler_trace.c, push_record), with `%d` for the step
local RECORD = '{"step":%d,"scale":65536,"applied":true,"reason":null,"loss":2.30258512,"params":['
  .. '{"n":120,"amax":0.0123456789,"nan":0,"inf":0,"zeros":0,"underflow":0,"overflow":0,"lo":30,'
  .. '"hist":[1,3,9,20,40,30,12,5]},'
  .. '{"n":10,"amax":0.00234567891,"nan":0,"inf":0,"zeros":0,"underflow":0,"overflow":0,"lo":28,"hist":[1,2,4,3]}]}'

local function record(step) return string.format(RECORD, step) end

-- a trace file of the header and the given lines (each ended by a newline unless
-- `cut`); through a gzip line file when the name ends in .gz
local function write_trace(path, lines, header, cut)
  if path:match("%.gz$") then
    local f = assert(core._lines_open(path, "w"))
    f:write(header or HEADER)
    for _, l in ipairs(lines) do f:write(l) end
    f:close()
  else
    H.spit(path, (header or HEADER) .. "\n" .. table.concat(lines, "\n") .. (cut and "" or (#lines > 0 and "\n" or "")))
  end
  return path
end

-- the error of loading path, which must name the function, the file and every word
local function refused(path, words)
  local msg = H.raises(function() mp.amp.load_trace(path) end, { "mp.amp.load_trace: '" .. path .. "' line" })
  for _, w in ipairs(words) do
    assert.is_truthy(msg:find(w, 1, true), "expected '" .. w .. "' in: " .. msg)
  end
  return msg
end

describe("mp.amp.load_trace", function()
  it("reads records back as written: a scale an f32 holds exactly, counts, the histogram in its 64 bins", function()
    local path = write_trace(tmp("ok.jsonl"), { record(1), record(2) })
    local tr = mp.amp.load_trace(path)
    assert.are.equal(2, #tr.steps)
    local r = tr.steps[2]
    assert.are.equal(2, r.step)
    assert.are.equal(65536, r.scale)
    assert.is_true(r.applied)
    assert.is_nil(r.reason)
    assert.is_true(math.abs(r.loss - 2.30258512) < 1e-12)
    assert.are.equal(2, #r.params)
    assert.are.equal(120, r.params[1].n)
    assert.are.equal(H.f32(0.0123456789), r.params[1].amax)
    assert.are.equal(64, #r.params[1].hist)
    assert.are.equal(1, r.params[1].hist[31])   -- lo 30 (0-based): the first count is bin 31
    assert.are.equal(5, r.params[1].hist[38])
    assert.are.equal(0, r.params[1].hist[39])
    assert.are.equal(3, r.params[2].hist[32])
    for _, each in ipairs { ipairs, pairs } do   -- as over a list of records
      local n = 0
      for i, s in each(tr.steps) do n = n + 1; assert.are.equal(i, s.step) end
      assert.are.equal(2, n)
    end
    assert.is_nil(tr.steps[3])
    local next_of = pairs(tr.steps)                    -- its iterator past the end, or from any key
    assert.is_nil(next_of(tr.steps, math.maxinteger))
    assert.is_nil(next_of(tr.steps, -5))
    assert.are_not.equal(tr.steps[1], tr.steps[1])   -- each read builds the record anew
    local mine = tr.steps[1]
    mine.scale = 2
    tr.steps[1] = mine                                 -- and one put in its place is kept
    assert.are.equal(mine, tr.steps[1])
    H.raises(function() tr.steps[3] = mine end, { "step 1..2" })
    os.remove(path)
  end)

  it("refuses a header whose shape is not the engine's, at line 1", function()
    local path = tmp("hdr.jsonl")
    for _, c in ipairs {
      { '"bins":64', '"bins":1000000', "bins is 1000000" },
      { '"bins":64', '"bins":1e999999', "bins is inf" },
      { '"hist_lo":-48', '"hist_lo":0', "hist_lo is 0" },
      { '"version":1', '"version":2', "version is 2" },
      { '"params":["w","b"]', '"params":"w"', "params is \"w\"" },
      { '"params":["w","b"]', '"params":["w",7]', "params[2] is 7" },
      { '"meta":{}', '"meta":5', "meta is 5" },
    } do
      write_trace(path, { record(1) }, (HEADER:gsub(c[1]:gsub("[%[%]%-]", "%%%0"), c[2])))
      refused(path, { "line 1", c[3] })
    end
    H.spit(path, "")
    refused(path, { "line 1", "not a scaler trace" })
    H.spit(path, '{"trace":"mpengine.scaler",\n')
    refused(path, { "line 1", "not JSON" })
    os.remove(path)
  end)

  it("refuses a line longer than any the engine writes once it has read that much, plain or gzip", function()
    local long = string.rep("a", (16 << 20) + 1)
    for _, c in ipairs {
      { tmp("long.jsonl"), false },   -- with its newline
      { tmp("long-cut.jsonl"), true }, -- and without: the cap, not the end, stops the reading
      { tmp("long.jsonl.gz"), false },
    } do
      write_trace(c[1], { record(1), long }, nil, c[2])
      refused(c[1], { "line 3", "longer than 16777216 bytes" })
      os.remove(c[1])
    end
    local path = tmp("longhdr.jsonl")
    H.spit(path, HEADER:sub(1, -2) .. ',"pad":"' .. string.rep("x", 1 << 20) .. '"}\n')
    refused(path, { "line 1", "longer than 1048576 bytes" })
    os.remove(path)
  end)

  it("refuses a record whose fields have the wrong type or range, naming the field", function()
    local path = tmp("bad.jsonl")
    local function with(from, to) return (record(2):gsub(from:gsub("[%[%]%-%.]", "%%%0"), to, 1)) end
    for _, c in ipairs {
      { with('"hist":[1,3,9,20,40,30,12,5]', '"hist":"abc"'), "params[1].hist is a string" },
      { with('"zeros":0', '"zeros":-1'), "params[1].zeros is -1" },
      { with('"n":120', '"n":1e999999'), "params[1].n is 1e999999" },
      { with('"n":120', '"n":"120"'), "params[1].n is a string" },
      { with('"scale":65536', '"scale":0'), "scale is 0" },
      { with('"scale":65536', '"scale":-2'), "scale is -2" },
      { with('"scale":65536', '"scale":1e-50'), "scale is 1e-50" },
      { with('"scale":65536', '"scale":"inf"'), "scale is a string" },
      { with('"lo":30', '"lo":4611686018427387904'), "params[1].lo is 4611686018427387904" },
      { with('"lo":30', '"lo":0.5'), "params[1].lo is 0.5" },
      { with('"lo":30', '"lo":60'), "bins from bin 60 run past" },
      { with('"amax":0.0123456789', '"amax":-1'), "params[1].amax is -1" },
      { with('"amax":0.0123456789', '"amax":1e300'), "params[1].amax is 1e300" },
      { with('"underflow":0', '"underflow":121'), "params[1].underflow is 121, more than its n" },
      { with('"hist":[1,3,9,20,40,30,12,5]', '"hist":[100,100]'), "params[1].hist counts more values than its n" },
      { with('"hist":[1,3,9,20,40,30,12,5]', '"hist":[' .. string.rep("0,", 64) .. '0]'), "more than the trace's 64 bins" },
      { with('"reason":null', '"reason":"bogus"'), 'reason is "bogus"' },
      { with('"reason":null', '"reason":"nan"'), "applied is true with a reason" },
      { with('"step":2', '"step":2,"extra":1'), "field 'extra'" },
      { with('"step":2', '"step":2,"step":3'), "field 'step' twice" },
      { with('"loss":2.30258512,', ''), "no field 'loss'" },
      { with('"inf":0,', ''), "params[1] has no field 'inf'" },
      { with('"applied":true', '"applied":1'), "applied is" },
      { with('"params":[', '"params":{'), "params is an object" },
      { with('"hist":[1,2,4,3]', '"hist":[1,2,4,3'), "not JSON" },
      { record(2) .. " x", "more after the record" },
      { "[1,2]", "a list, not a step record" },
      { with('"reason":null', '"reason":"ove\\u0072flow"'), "escape" },
      { with('"reason":null', '"reason":"o\0"'), "control character" },
    } do
      write_trace(path, { record(1), c[1], record(3) })
      refused(path, { "line 3", c[2] })
      write_trace(path, { record(1), c[1] })   -- as the last line, newline-terminated: refused too
      refused(path, { "line 3", c[2] })
    end
    os.remove(path)
  end)

  it("leaves out a last line without its newline that is not a record (a write cut short)", function()
    local path = tmp("cut.jsonl")
    local r = record(2)
    for cut = 1, #r - 1, 37 do
      write_trace(path, { record(1), r:sub(1, cut) }, nil, true)
      assert.are.equal(1, #mp.amp.load_trace(path).steps, "cut at " .. cut)
    end
    write_trace(path, { record(1), r }, nil, true)   -- whole, only its newline missing: kept
    assert.are.equal(2, #mp.amp.load_trace(path).steps)
    os.remove(path)
  end)

  it("refuses a gzip trace whose data check fails instead of ending it there", function()
    local path = write_trace(tmp("crc.jsonl.gz"), { record(1), record(2) })
    local z = H.slurp(path)
    -- the trailer's CRC-32 changed: the data decodes, the check at its end fails
    H.spit(path, z:sub(1, -9) .. string.char((z:byte(-8) + 1) % 256) .. z:sub(-7))
    refused(path, { "cannot read it", "incorrect data check" })
    os.remove(path)
  end)

  it("holds the records packed: a step of two parameters takes bytes, not kilobytes", function()
    local path = tmp("many.jsonl.gz")
    local lines = {}
    for s = 1, 4000 do lines[s] = record(s) end
    write_trace(path, lines)
    collectgarbage("collect")
    local before = collectgarbage("count") * 1024
    local tr = mp.amp.load_trace(path)
    collectgarbage("collect")
    local per_step = (collectgarbage("count") * 1024 - before) / #tr.steps
    assert.are.equal(4000, #tr.steps)
    -- the packed layout takes 69 bytes for this record (a table per record: 3.5 KB)
    assert.is_true(per_step < 200, per_step .. " bytes per step")
    assert.are.equal(4000, tr.steps[4000].step)
    os.remove(path)
  end)
end)
