-- The engine's layers have no import circle (docs/ARCHITECTURE.md, "Autograd"):
-- scripts/include_graph.py reads the #include lines of engine/ and kernels/ and
-- the calls of names one unit alone defines, and --check exits 1 with the
-- circle's arrows when the folders named hold one.
local root = os.getenv("MP_TEST_ROOT") or "."

local function check(folder)
  local p = io.popen("python3 " .. root .. "/scripts/include_graph.py --check " .. folder .. " 2>&1; echo rc=$?")
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
    assert(os.execute("mkdir -p " .. dir .. "/scripts " .. dir .. "/engine " .. dir .. "/kernels && cp " ..
      root .. "/scripts/include_graph.py " .. dir .. "/scripts/ && cp " .. root .. "/engine/*.[ch] " .. dir ..
      "/engine/ && printf '\\nvoid t_back(mp_node *n) { mp_node_release(n); }\\n' >> " .. dir .. "/engine/tensor.c"))
    local p = io.popen("python3 " .. dir .. "/scripts/include_graph.py --check engine 2>&1; echo rc=$?")
    local out = p:read("a")
    p:close()
    os.execute("rm -rf " .. dir)
    assert.are.equal("1", out:match("rc=(%d+)%s*$"), out)
    assert.truthy(out:find("engine/tensor -> engine/graph: mp_node_release", 1, true), out)
  end)
end)
