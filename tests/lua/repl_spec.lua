-- repl_spec.lua: the mpengine REPL on a real terminal, driven through tmux.
-- Runs $MPENGINE, else $MP_TEST_BUILD/mpengine, else build/mpengine:
-- busted tests/lua/repl_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local BIN, q = H.mpengine, H.q

local function sh(cmd)
  local p = io.popen(cmd .. " 2>/dev/null; echo \"__rc=$?\"")
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)\n?$"))
  return (out:gsub("__rc=%d+\n?$", "")), rc
end

local function has_tmux()
  local _, rc = sh("command -v tmux >/dev/null")
  return rc == 0
end

if not has_tmux() then
  describe("mpengine REPL", function()
    pending("tmux not installed")
  end)
  return
end

math.randomseed(os.time())
-- a private tmux server: never touches the user's sessions
local SOCKET = ("mpengine_spec_%d_%d"):format(os.time(), math.random(1e6))
local TMUX = "tmux -L " .. SOCKET .. " "

local function sleep(s) os.execute("sleep " .. s) end

local session, tmpdir, counter = nil, nil, 0

local function send(...)
  local keys = {}
  for i = 1, select("#", ...) do keys[#keys + 1] = q((select(i, ...))) end
  sh(TMUX .. "send-keys -t " .. session .. " " .. table.concat(keys, " "))
end

-- sends a line as literal text, then Enter
local function line(text)
  sh(TMUX .. "send-keys -t " .. session .. " -l " .. q(text))
  send("Enter")
end

local function screen()
  return (sh(TMUX .. "capture-pane -p -J -S -500 -t " .. session))
end

local function has_line(text, wanted)
  for l in (text .. "\n"):gmatch("(.-)\n") do
    if l:gsub("%s+$", "") == wanted then return true end
  end
  return false
end

-- polls the pane for up to 5 s until pred(screen) holds; returns the screen
local function wait_for(pred, what)
  local s
  for _ = 1, 50 do
    s = screen()
    if pred(s) then return s end
    sleep(0.1)
  end
  error(("timed out waiting for %s; screen:\n%s"):format(what, s), 2)
end

local function wait_line(wanted)
  return wait_for(function(s) return has_line(s, wanted) end, "line " .. q(wanted))
end

-- some line of the screen matches the whole pattern (tabs show as spaces)
local function wait_match(pattern)
  return wait_for(function(s)
    for l in (s .. "\n"):gmatch("(.-)\n") do
      if l:gsub("%s+$", ""):match("^" .. pattern .. "$") then return true end
    end
    return false
  end, "a line matching " .. q(pattern))
end

local function wait_text(text)
  return wait_for(function(s) return s:find(text, 1, true) ~= nil end, q(text))
end

describe("mpengine REPL", function()
  setup(function()
    local f = io.open(BIN, "rb")
    assert(f, BIN .. " is not built (run make)")
    f:close()
    tmpdir = (sh("mktemp -d")):gsub("%s+$", "")
    assert(tmpdir ~= "", "mktemp -d failed")
    -- an idle session keeps the server up between tests: a server that
    -- exits with its last session races the next new-session
    local _, rc = sh(TMUX .. "new-session -d -s keeper 'sleep 3600'")
    assert.are.equal(0, rc, "tmux new-session failed")
  end)

  teardown(function()
    sh(TMUX .. "kill-server")
    if tmpdir then sh("rm -rf " .. q(tmpdir)) end
  end)

  before_each(function()
    counter = counter + 1
    session = "repl" .. counter
    local cmd = H.env { MPENGINE_HISTORY = tmpdir .. "/history" } .. q(BIN)
    local _, rc = sh(TMUX .. "new-session -d -x 120 -y 50 -s " .. session .. " " .. q(cmd))
    assert.are.equal(0, rc, "tmux new-session failed")
    wait_text("mpengine ")  -- the banner
    wait_text("> ")         -- the prompt
  end)

  after_each(function()
    sh(TMUX .. "kill-session -t " .. session)
  end)

  it("prints a banner with the device", function()
    assert.matches("mpengine %d+%.%d+%.%d+  %(Lua 5%.4%)  device: %w+", screen())
  end)

  it("auto-prints expressions, several results one per line", function()
    line("1+2")
    wait_line("3")
    line("'a', nil, 4")
    local s = wait_line("4")
    assert.truthy(s:find("\na\nnil\n4\n", 1, true), s)
    line("x = mp.tensor({{1, 5}, {7, 2}}, {device = 'cpu'})")
    line("x:max(2)")
    -- the values, then the indices, each printed as a tensor of its own
    s = wait_match("%[i32 2 cpu%]")
    assert.truthy(s:find("%[f32 2 cpu%]\n%s+1%s+0\n%[i32 2 cpu%]"), s)
  end)

  it("prints mp's functions by their documented names", function()
    line("mp.matmul")
    wait_line("function: mp.matmul")
    line("x = mp.ones({2}, {device = 'cpu'})")
    line("x.max")
    wait_line("function: t:max")
    line("mp.help, print")
    wait_line("function: mp.help")
    wait_line("function: print")
  end)

  it("has help(f) and ?name from docs/API.md", function()
    line("help(mp.help)")
    wait_line("mp.help([f])")
    wait_line("?name")
    wait_text("  Prints the signatures and first paragraph")
    line("?mp.autograd.grad")
    wait_match("mp%.autograd%.grad%(outputs, inputs %[, opts%]%) %-> gradients")
    line("?  nosuch.thing ")
    wait_line("no entry for 'nosuch.thing'; try help() for the areas")
    line("help()")
    wait_text("help(f) or ?name prints")
    wait_match("  REPL%s+%d+ entr[iesy]+")
    line("?")
    line('"after" .. "help"')
    wait_line("afterhelp")
  end)

  it("keeps ?name lines in the history as typed", function()
    line("?t:backward")
    wait_text("backward(")
    line("'done'")
    wait_line("done")
    local f = assert(io.open(tmpdir .. "/history", "rb"))
    local text = f:read("a")
    f:close()
    assert.truthy(text:find("?t:backward", 1, true), text)
  end)

  it("continues an incomplete statement on the next line", function()
    line("x = {")
    line("1}")
    line("#x")
    wait_line("1")
  end)

  it("reports errors with a traceback and goes on", function()
    line('error("boom")')
    wait_text("boom")
    wait_text("traceback")
    line('"still" .. "alive"')
    wait_line("stillalive")
  end)

  it("interrupts a running loop with Ctrl-C and survives", function()
    line("while true do end")
    sleep(0.5)
    send("C-c")
    wait_text("interrupted")
    line("print(7*6)")
    wait_line("42")
  end)

  it("drops the input being typed on Ctrl-C at the prompt", function()
    -- each key waits for the screen to show the one before (a loaded machine
    -- may read "half typed" after a Ctrl-C sent later)
    line("t = {")
    wait_line("..>")
    send("C-c")
    wait_line("mp>")
    sh(TMUX .. "send-keys -t " .. session .. " -l " .. q("half typed"))
    wait_text("mp> half typed")
    send("C-c")
    wait_text("half typed^C")
    line("print(6*7+1, t)")
    wait_match("43%s+nil")
  end)

  it("appends lines to the history file", function()
    line("print('hist' .. 'ory')")
    wait_line("history")
    local f = assert(io.open(tmpdir .. "/history", "rb"))
    local text = f:read("a")
    f:close()
    assert.truthy(text:find("print('hist' .. 'ory')", 1, true), text)
  end)

  it("exits on end of input", function()
    line("print('bye')")
    wait_line("bye")
    send("C-d")
    wait_for(function()
      local _, rc = sh(TMUX .. "has-session -t " .. session)
      return rc ~= 0
    end, "the REPL to exit")
  end)

  it("uses _PROMPT and _PROMPT2", function()
    line('_PROMPT, _PROMPT2 = "first>> ", "second>> "')
    line("y = (")
    line("5)")
    line("y")
    wait_text("second>> 5)")
    wait_text("first>> y")
    wait_line("5")
  end)
end)
