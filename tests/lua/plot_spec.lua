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
