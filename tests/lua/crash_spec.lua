-- crash_spec.lua: a save killed at any moment never costs the checkpoint that was
-- there, and the temporary file it leaves is found and removed.
--
-- A child saves checkpoints to one path in a loop (version k: every tensor full
-- of k, and the string k); the parent kills it with SIGKILL after a random delay, 24
-- times. After each kill the file must load, whole and bit-identical to one
-- version the child wrote (never a mix, never a torn file), and any temporary
-- file the killed save left must be listed by mp.stale_saves and removed by the
-- next save, or by the next process that loads the path or starts a training
-- script on it (only the engine's own names, only files from before it started).
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local KILLS = 24

local function checkpoint(k)
  return {w = mp.full({128, 256}, k), b = mp.full({256}, k, {dtype = "f16"}), step = mp.tensor({k}, {dtype = "i32"}),
          version = tostring(k)}
end

-- the version a loaded checkpoint holds, or an error saying what is wrong with it
local function version_of(path)
  local t = mp.load(path)
  local k = t.step:item()
  assert(t.version == tostring(k), "the version string says " .. tostring(t.version) .. ", step says " .. k)
  assert(t.w:eq(k):sum():item() == 128 * 256, "w is not all " .. k)
  assert(t.b:eq(k):sum():item() == 256, "b is not all " .. k)
  return k
end

describe("a save killed at a random moment", function()
  it("never costs the old checkpoint, and leaves no temporary file for long (" .. KILLS .. " kills)", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. H.q(dir)))
    local path = dir .. "/ck.safetensors"
    mp.save(path, checkpoint(0))

    local script = dir .. "/saver.lua"
    H.spit(script, [[
      local mp = require "mp"
      local path, k = arg[1], tonumber(arg[2])
      while true do
        k = k + 1
        mp.save(path, {w = mp.full({128, 256}, k), b = mp.full({256}, k, {dtype = "f16"}),
                       step = mp.tensor({k}, {dtype = "i32"}), version = tostring(k)})
      end
    ]])
    local env = H.env{LUA_PATH = H.root .. "/lua/?.lua;" .. H.root .. "/lua/?/init.lua;;",
                      LUA_CPATH = H.build .. "/?.so;;"}
    math.randomseed(os.time())
    local last, leftovers = 0, 0
    for i = 1, KILLS do
      -- start a saver from the last version, kill it 20..200 ms later (it starts in ~30 ms)
      local delay = string.format("%.3f", 0.02 + math.random() * 0.18)
      local cmd = env .. H.lua .. " " .. H.q(script) .. " " .. H.q(path) .. " " .. last
                  .. " & pid=$!; sleep " .. delay .. "; kill -9 $pid; wait $pid 2>/dev/null; true"
      assert(os.execute("{ " .. cmd .. "; } 2>/dev/null"))
      local ok, k = pcall(version_of, path)
      assert(ok, string.format("kill %d (after %s s): the checkpoint does not load whole: %s", i, delay, tostring(k)))
      last = k
      local stale = mp.stale_saves(path)
      leftovers = leftovers + #stale
      for _, f in ipairs(stale) do assert(f:find("ck.safetensors.tmp-", 1, true), f) end
      -- a later save to the same path removes what the killed one left
      if #stale > 0 then
        mp.save(path, checkpoint(k))
        assert.are.equal(0, #mp.stale_saves(path))
        assert.are.equal(k, version_of(path))
      end
    end
    os.execute("rm -rf " .. H.q(dir))
    print(string.format("\ncrash_spec: %d kills, %d left a temporary file, the checkpoint loaded whole every time",
                        KILLS, leftovers))
  end)

  it("a process that loads the path removes what a killed save left", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. H.q(dir)))
    local path = dir .. "/big.safetensors"
    mp.save(path, {w = mp.zeros({64})})
    local script = dir .. "/saver.lua"
    H.spit(script, [[
      local mp = require "mp"
      local w = mp.randn({64, 1024, 1024})   -- 256 MB: the save takes a while
      io.write("ready\n"); io.stdout:flush()
      mp.save(arg[1], {w = w})
    ]])
    local env = H.env{LUA_PATH = H.root .. "/lua/?.lua;" .. H.root .. "/lua/?/init.lua;;",
                      LUA_CPATH = H.build .. "/?.so;;"}
    -- kill -9 the saver once its temporary file exists (polled, bounded)
    local cmd = env .. H.lua .. " " .. H.q(script) .. " " .. H.q(path) .. " >/dev/null & pid=$!; " ..
                "for i in $(seq 1 600); do ls " .. H.q(dir) .. " | grep -q 'big.safetensors.tmp-' && break; sleep 0.05; done; " ..
                "sleep 0.1; kill -9 $pid; wait $pid 2>/dev/null; true"
    assert(os.execute("{ " .. cmd .. "; } 2>/dev/null"))
    local stale = mp.stale_saves(path)
    assert.are.equal(1, #stale, "the killed save left no temporary file")
    -- a loader started after the kill removes it
    local r = H.child("local t = mp.load(" .. string.format("%q", path) .. ") return t.w:numel()")
    assert.are.equal("OK:64", r.out, r.err)
    assert.are.same({}, mp.stale_saves(path), "mp.load in a new process left the killed save's file")
    -- one written after the loading process started stays (it may be a save
    -- that has not locked it yet): this process loads the path now
    local fresh = path .. ".tmp-Fresh1"
    H.spit(fresh, "x")
    assert.are.equal(64, mp.load(path).w:numel())
    assert.are.equal(1, #mp.stale_saves(path))
    assert.are.equal(0, #mp.stale_saves(path, {before_start = true}), "a file newer than this process is not stale to it")
    H.raises(function() mp.stale_saves(path, {before_start = 1}) end, {"mp.stale_saves", "before_start"})
    os.execute("rm -rf " .. H.q(dir))
  end)

  it("a training script saving to a path removes the old temporary files a killed save left, and says so", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. H.q(dir)))
    local env = H.env{LUA_PATH = H.root .. "/lua/?.lua;" .. H.root .. "/lua/?/init.lua;;",
                      LUA_CPATH = H.build .. "/?.so;;"}
    local ck = dir .. "/mlp.safetensors"
    H.spit(ck .. ".tmp-Abc123", "x")
    os.execute("touch -d '1 hour ago' " .. H.q(ck .. ".tmp-Abc123"))
    H.spit(ck .. ".tmp-toolong7", "not ours")
    local p = io.popen(env .. H.q(H.mpengine) .. " scripts/train_mlp.lua --max-steps 1 --epochs 1 --save " .. H.q(ck) ..
                       " 2>&1; echo \"exit=$?\"")
    local out = p:read("a")
    p:close()
    assert.is_truthy(out:find("exit=0", 1, true), out)
    assert.is_truthy(out:find("removed 1 temporary file an interrupted save to " .. ck .. " left", 1, true), out)
    assert.are.same({}, mp.stale_saves(ck))
    assert.are.equal("not ours", H.slurp(ck .. ".tmp-toolong7"))
    os.execute("rm -rf " .. H.q(dir))
  end)

  it("mp.stale_saves lists only an interrupted save's files, and removes them when asked", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. H.q(dir)))
    local path = dir .. "/m.st"
    for _, name in ipairs{"m.st.tmp-abc123", "m.st.tmp-ZZ99zz", "m.st.tmp-toolong7", "m.st.tmp-ab", "n.st.tmp-abc123",
                          "m.stx.tmp-abc123"} do
      H.spit(dir .. "/" .. name, "x")
    end
    local found = mp.stale_saves(path)
    table.sort(found)
    assert.are.same({dir .. "/m.st.tmp-ZZ99zz", dir .. "/m.st.tmp-abc123"}, found)
    assert.are.equal(2, #mp.stale_saves(path, {remove = true}))
    assert.are.same({}, mp.stale_saves(path))
    assert.are.equal("x", H.slurp(dir .. "/m.st.tmp-toolong7"))   -- not ours: untouched
    assert.are.same({}, mp.stale_saves(dir .. "/nowhere/x.st"))
    H.raises(function() mp.stale_saves(42) end, {"mp.stale_saves", "path"})
    H.raises(function() mp.stale_saves(path, 5) end, {"mp.stale_saves", "options"})
    os.execute("rm -rf " .. H.q(dir))
  end)
end)
