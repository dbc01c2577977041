-- plot_spec.lua: scripts/plot.lua draws a trace, a metrics file and the policy lab's
-- candidates with gnuplot: the PNG exists with the size asked for (read from its
-- IHDR chunk), and bad arguments are refused with a message.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local function tmp(name) return os.tmpname() .. "-" .. name end

-- make deps installs gnuplot-nox; a machine without it (the GPU machine, which has no
-- package registry) reports these pending instead of failing
local have_gnuplot = os.execute("gnuplot --version >/dev/null 2>&1")
local MISSING = "gnuplot is not installed (make deps installs gnuplot-nox)"

-- width and height of a PNG file, or nil
local function png_size(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local head = f:read(24)
  f:close()
  if not head or head:sub(1, 8) ~= "\137PNG\r\n\26\n" or head:sub(13, 16) ~= "IHDR" then return nil end
  local w, h = string.unpack(">I4", head, 17), string.unpack(">I4", head, 21)
  return w, h
end

describe("scripts/plot.lua", function()
  local trace, lab, metrics = tmp("t.jsonl.gz"), tmp("lab.jsonl"), tmp("m.jsonl")
  setup(function()
    if not have_gnuplot then return end
    local out, code = H.script("scripts/train_mlp.lua")(
      "--max-steps 200 --amp f16 --inject-overflow 70 --trace " .. trace .. " --metrics " .. metrics)
    assert.are.equal(0, code, out)
    out, code = H.script("scripts/policy_lab.lua")(trace .. " dynamic amax --out " .. lab)
    assert.are.equal(0, code, out)
  end)
  teardown(function() os.remove(trace); os.remove(lab); os.remove(metrics) end)

  it("draws a trace with the lab's candidates at the size asked for", function()
    if not have_gnuplot then return pending(MISSING) end
    local png = tmp("a.png")
    local out, code = H.script("scripts/plot.lua")(trace .. " --lab " .. lab .. " --heat amax --size 640,800 --out " .. png)
    assert.are.equal(0, code, out)
    assert.are.same({ 640, 800 }, { png_size(png) })
    assert.is_truthy(out:find("200 steps, 2 candidates", 1, true), out)
    os.remove(png)
  end)

  it("draws a metrics file (a line every 100 steps), 900 pixels wide and 260 per panel by default", function()
    if not have_gnuplot then return pending(MISSING) end
    local png = tmp("m.png")
    local out, code = H.script("scripts/plot.lua")(metrics .. " --out " .. png)
    assert.are.equal(0, code, out)
    assert.are.same({ 900, 520 }, { png_size(png) })
    os.remove(png)
  end)

  -- the gnuplot script and data of one picture (--gp), and what plot.lua printed
  local leftovers = {}
  local function drawn(args)
    local gp, png = tmp("p.gp"), tmp("p.png")
    leftovers[#leftovers + 1] = H.q(gp) .. " " .. H.q(gp .. ".data") .. " " .. H.q(png)
    local out, code = H.script("scripts/plot.lua")(args .. " --out " .. png .. " --gp " .. gp)
    assert.are.equal(0, code, out)
    return H.slurp(gp), gp .. ".data", gp
  end
  teardown(function() for _, l in ipairs(leftovers) do os.execute("rm -rf " .. l) end end)

  it("gives every panel one x range and the same margins, in plain (not enhanced) text", function()
    if not have_gnuplot then return pending(MISSING) end
    local script, data = drawn(trace .. " --lab " .. lab .. " --heat amax")
    assert.is_truthy(script:find("set terminal pngcairo noenhanced", 1, true), script)
    local _, nx = script:gsub("set xrange", "")
    assert.are.equal(1, nx, script)   -- one range, set before the first panel
    assert.is_nil(script:find("autoscale x", 1, true), script)
    assert.is_truthy(script:find("set xrange %[0%.5:200%.5%]"), script)
    assert.is_truthy(script:find("set lmargin at screen", 1, true) and script:find("set rmargin at screen", 1, true))
    assert.is_truthy(script:find("set xrange") < script:find("\nplot "), script)
    -- the heat map's cells sit at the step numbers, as the other panels' points
    local xs = {}
    for line in io.lines(data .. "/under.dat") do
      local x = line:match("^(%d+) ")
      if x then xs[tonumber(x)] = true end
    end
    for step = 1, 200 do assert.is_true(xs[step], "no heat cell at step " .. step) end
    assert.is_nil(xs[0])
    assert.is_nil(xs[201])
  end)

  it("pads the scale panels' ranges so that lines at the edge (2^16) are inside", function()
    if not have_gnuplot then return pending(MISSING) end
    local script = drawn(trace .. " --lab " .. lab)
    local n = 0
    for lo, hi in script:gmatch("set ylabel 'log2 loss scale[^\n]*\nset yrange %[([%d.e+-]+):([%d.e+-]+)%]") do
      n = n + 1
      assert.is_true(tonumber(hi) > 16 and tonumber(lo) < 16, lo .. ":" .. hi)
    end
    assert.is_true(n >= 2, script)
  end)

  it("--heat draws for any candidate, dynamic included (its map is all 0 and says so)", function()
    if not have_gnuplot then return pending(MISSING) end
    for _, pol in ipairs { "dynamic", "amax" } do
      local script, data = drawn(trace .. " --lab " .. lab .. " --heat " .. pol)
      assert.is_truthy(script:find("with image", 1, true), script)
      assert.is_truthy(script:find("f16 underflow fraction (" .. pol .. ")", 1, true), script)
      local cells, numbers = 0, 0
      for line in io.lines(data .. "/under.dat") do
        local v = line:match("^%d+ %d+ (%S+)$")
        if v then
          cells = cells + 1
          if tonumber(v) and v ~= "NaN" then numbers = numbers + 1 end
        end
      end
      assert.are.equal(200 * 6, cells)
      assert.are.equal(cells, numbers)   -- every cell has a value: nothing left blank
      if script:find("set cbrange [0:0.01]", 1, true) then   -- all zero: a range of its own and a note
        assert.is_truthy(script:find("0 everywhere", 1, true), script)
      end
    end
  end)

  it("thins the parameters' labels to what the panel holds", function()
    if not have_gnuplot then return pending(MISSING) end
    -- a trace of 40 parameters, 3 steps
    local names, many = {}, tmp("many.jsonl")
    for k = 1, 40 do names[k] = string.format("h.%d.mlp.c_proj_%d.weight", k // 4, k) end
    local r = H.child(string.format([[
local mp = require "mp"
local ps, names = {}, {}
for k = 1, 40 do ps[k] = mp.zeros({4}, {requires_grad = true}); names[k] = %q .. k end
local opt = mp.optim.SGD(ps, {lr = 0.1})
local scaler = mp.amp.GradScaler()
scaler:trace(%q, {names = {%s}})
for i = 1, 3 do
  local loss = ps[1]:sum()
  for k = 2, 40 do loss = loss + ps[k]:sum() * k end
  scaler:scale(loss):backward(); scaler:step(opt); scaler:update(); opt:zero_grad()
end
scaler:trace(false)
io.write("done")
]], "p", many, "'" .. table.concat(names, "', '") .. "'"), true)
    assert.are.equal("done", r.out, r.err)
    local script = drawn(many .. " --size 900,800")
    local tics = script:match("set ytics (%b())")
    assert.is_truthy(tics, script)
    local _, shown = tics:gsub("'[^']*' %d+", "")
    assert.is_true(shown >= 4 and shown < 40, tics)
    assert.is_truthy(tics:find("c_proj_1.weight", 1, true), tics)   -- underscores as written
    assert.is_truthy(script:find("1 in %d+ named"), script)
    os.remove(many)
  end)

  it("refuses bad arguments", function()
    if not have_gnuplot then return pending(MISSING) end
    for _, c in ipairs {
      { "", "an input file" },
      { trace, "--out PICTURE.png is needed" },
      { trace .. " --out x.png --size 10", "--size must be W,H" },
      { trace .. " --out x.png --heat dynamic", "--heat needs --lab" },
      { trace .. " --out x.png --lab " .. lab .. " --heat nosuch", "no candidate nosuch" },
      { "/nonexistent.jsonl --out x.png", "cannot open" },
      { trace .. " --out x.png --bogus", "unknown option --bogus" },
    } do
      local out, code = H.script("scripts/plot.lua")(c[1])
      assert.are.equal(2, code, c[1] .. ": " .. out)
      assert.is_truthy(out:find(c[2], 1, true), c[1] .. ": " .. out)
    end
  end)
end)
