-- The engine's layers have no import circle (docs/ARCHITECTURE.md, "Autograd"):
-- scripts/include_graph.py reads the #include lines of engine/ and kernels/ and
-- the calls of names one unit alone defines, and --check exits 1 with the
-- circle's arrows when the folders named hold one. (python3 runs without the
-- sanitizers' runtimes that make test SAN=1 preloads: its own allocations at
-- exit are not ours to report.)
local root = os.getenv("MP_TEST_ROOT") or "."

local function check(folder)
  local p = io.popen("env -u LD_PRELOAD python3 " .. root .. "/scripts/include_graph.py --check " .. folder .. " 2>&1; echo rc=$?")
  local out = p:read("a")
  p:close()
  return out:match("rc=(%d+)%s*$"), out
end

describe("the import graph", function()
  it("engine/ has no circle", function()
    local rc, out = check("engine")
    assert.are.equal("0", rc, out)
  end)

  it("kernels/cpu has no circle", function()
    local rc, out = check("kernels/cpu")
    assert.are.equal("0", rc, out)
  end)

  it("the check names a circle when there is one", function()
    -- a copy of engine/ with one arrow back down: tensor.c calling the graph
    local dir = os.tmpname()
    os.remove(dir)
    local sh = "env -u LD_PRELOAD "   -- mkdir and cp, as python3 above, outside the sanitizers
    assert(os.execute(sh .. "mkdir -p " .. dir .. "/scripts " .. dir .. "/engine " .. dir .. "/kernels && " .. sh ..
      "cp " .. root .. "/scripts/include_graph.py " .. dir .. "/scripts/ && " .. sh .. "cp " .. root ..
      "/engine/*.[ch] " .. dir .. "/engine/"))
    local f = assert(io.open(dir .. "/engine/tensor.c", "a"))
    f:write("\nvoid t_back(mp_node *n) { mp_node_release(n); }\n")
    f:close()
    local p = io.popen("env -u LD_PRELOAD python3 " .. dir .. "/scripts/include_graph.py --check engine 2>&1; echo rc=$?")
    local out = p:read("a")
    p:close()
    os.execute("env -u LD_PRELOAD rm -rf " .. dir)
    assert.are.equal("1", out:match("rc=(%d+)%s*$"), out)
    assert.truthy(out:find("engine/tensor -> engine/graph: mp_node_release", 1, true), out)
  end)
end)

-- One name, one file (docs/ARCHITECTURE.md, "The arrows"): no two files in
-- different layers share a name, so that neither a reader nor a structure tool
-- pairs engine/io.h with a binding file called io.c; and each header of engine/
-- and lua/ belongs to the .c file of its name, but for the two umbrella headers.
local function files(dir, pattern)
  local p = io.popen("cd " .. root .. " && find " .. dir .. " -type f -name '" .. pattern .. "' | sort")
  local out = {}
  for f in p:lines() do out[#out + 1] = f end
  p:close()
  return out
end

describe("file names", function()
  it("no two files in different layers share a name", function()
    -- the public Lua modules (lua/mp/*.lua, require "mp.optim") are named by the API
    local layers = {
      engine = files("engine", "*.[ch]"), kernels = files("kernels", "*.[ch]*"),
      ["lua (C)"] = files("lua", "*.[ch]"), ["lua/mp"] = files("lua/mp", "*.lua"),
    }
    local owner, clashes = {}, {}
    for layer, list in pairs(layers) do
      for _, f in ipairs(list) do
        local stem = f:match("([^/]+)%.[^./]+$")
        local public = layer == "lua/mp" and f:match("^lua/mp/[^/]+%.lua$")
        if not public then
          local o = owner[stem]
          if o and o.layer ~= layer then clashes[#clashes + 1] = o.file .. " and " .. f end
          owner[stem] = owner[stem] or { layer = layer, file = f }
        end
      end
    end
    assert.are.same({}, clashes)
  end)

  it("every header of engine/ and lua/ has its .c file (engine/ops.h and engine/autograd.h gather several)", function()
    local umbrella = { ["engine/ops.h"] = true, ["engine/autograd.h"] = true }
    local orphans = {}
    for _, dir in ipairs { "engine", "lua" } do
      for _, h in ipairs(files(dir, "*.h")) do
        local c = io.open(root .. "/" .. h:gsub("%.h$", ".c"))
        if c then c:close() elseif not umbrella[h] then orphans[#orphans + 1] = h end
      end
    end
    assert.are.same({}, orphans)
  end)
end)
