-- cli_spec.lua: the mpengine command line (options, scripts, stdin, errors).
-- Runs $MPENGINE, else $MP_TEST_BUILD/mpengine, else build/mpengine, as a
-- child process: busted tests/lua/cli_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local BIN, q = H.mpengine, H.q

local slurp, spit = H.slurp, H.spit

-- runs `mpengine <args>` (args: a shell-quoted string), optional stdin text;
-- returns stdout, stderr, exit status (rc via the shell: works on any Lua)
local function run(args, stdin)
  local err, inp = os.tmpname(), os.tmpname()
  spit(inp, stdin or "")
  local p = io.popen(H.env() .. q(BIN) .. " " .. args .. " <" .. q(inp) .. " 2>" .. q(err)
                     .. "; echo \"__rc=$?\"")
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)\n?$"))
  out = out:gsub("__rc=%d+\n?$", "")
  local errtext = slurp(err)
  os.remove(err)
  os.remove(inp)
  return out, errtext, rc
end

describe("mpengine command line", function()
  setup(function()
    local f = io.open(BIN, "rb")
    assert(f, BIN .. " is not built (run make)")
    f:close()
  end)

  it("runs -e statements", function()
    local out, err, rc = run("-e " .. q("print(1+1)"))
    assert.are.equal("2\n", out)
    assert.are.equal("", err)
    assert.are.equal(0, rc)
  end)

  it("runs several -e in order", function()
    local out, _, rc = run("-e " .. q("x = 20") .. " -e " .. q("print(x + 1)"))
    assert.are.equal("21\n", out)
    assert.are.equal(0, rc)
  end)

  it("prints the version with -v and --version", function()
    for _, opt in ipairs({ "-v", "--version" }) do
      local out, _, rc = run(opt)
      assert.matches("^mpengine %d+%.%d+%.%d+ %(Lua 5%.4%.%d+%)\n$", out)
      assert.are.equal(0, rc)
    end
  end)

  it("lists every option in --help", function()
    local out, _, rc = run("--help")
    assert.are.equal(0, rc)
    for _, opt in ipairs({ "-e", "-i", "-l", "-v", "--device", "--help", "--" }) do
      assert.truthy(out:find(opt, 1, true), "--help does not mention " .. opt)
    end
  end)

  it("gives a script its arg table", function()
    local script = os.tmpname()
    spit(script, "print(arg[0], arg[1], arg[2], #arg, ...)\n")
    local out, err, rc = run(q(script) .. " one two")
    os.remove(script)
    assert.are.equal(script .. "\tone\ttwo\t2\tone\ttwo\n", out)
    assert.are.equal("", err)
    assert.are.equal(0, rc)
  end)

  it("puts the interpreter and options at negative arg indices", function()
    local script = os.tmpname()
    spit(script, "print(arg[-3] ~= nil, arg[-2], arg[-1], arg[0])\n")
    local out, _, rc = run("--device cpu " .. q(script))
    os.remove(script)
    assert.are.equal("true\t--device\tcpu\t" .. script .. "\n", out)
    assert.are.equal(0, rc)
  end)

  it("reports a script error with a traceback and fails", function()
    local script = os.tmpname()
    spit(script, "local x = 1\nerror('kaboom here')\n")
    local out, err, rc = run(q(script))
    os.remove(script)
    assert.are_not.equal(0, rc)
    assert.truthy(err:find("kaboom here", 1, true), err)
    assert.truthy(err:find("traceback", 1, true), err)
    assert.are.equal("", out)
  end)

  it("fails clearly on a missing script", function()
    local _, err, rc = run("nosuch_script_1234.lua")
    assert.are_not.equal(0, rc)
    assert.matches("^mpengine: cannot open nosuch_script_1234%.lua", err)
  end)

  it("rejects an unknown option, naming it", function()
    for _, opt in ipairs({ "--frobnicate", "-z" }) do
      local _, err, rc = run(opt)
      assert.are.equal(1, rc)
      assert.truthy(err:find("'" .. opt .. "'", 1, true), err)
      assert.truthy(err:find("usage", 1, true), err)
    end
  end)

  it("rejects options missing their argument", function()
    for _, opt in ipairs({ "-e", "-l", "--device" }) do
      local _, err, rc = run(opt)
      assert.are.equal(1, rc)
      assert.truthy(err:find("'" .. opt .. "' needs an argument", 1, true), err)
    end
  end)

  it("runs piped stdin as a script when there is no script", function()
    local out, _, rc = run("", "print(40+2)\n")
    assert.are.equal("42\n", out)
    assert.are.equal(0, rc)
  end)

  it("runs stdin for '-', with arguments", function()
    local out, _, rc = run("- a b", "print(arg[0], ...)\n")
    assert.are.equal("-\ta\tb\n", out)
    assert.are.equal(0, rc)
  end)

  it("fails when piped stdin raises an error", function()
    local _, err, rc = run("", "error('from stdin')\n")
    assert.are_not.equal(0, rc)
    assert.truthy(err:find("from stdin", 1, true), err)
  end)

  it("stops option handling at --", function()
    -- after "--", "-" is a file name, not stdin: there is no such file
    local out, err, rc = run("-e " .. q("print(arg[0])") .. " -- -", "print('stdin')")
    assert.are.equal("-\n", out)
    assert.are_not.equal(0, rc)
    assert.matches("^mpengine: cannot open %-", err)
  end)

  it("loads a library with -l", function()
    local out, _, rc = run("-l s=string -e " .. q("print(s.rep('ab', 2))"))
    assert.are.equal("abab\n", out)
    assert.are.equal(0, rc)
  end)

  it("has mp as a global in -e and in scripts", function()
    local out, _, rc = run("-e " .. q("print(type(mp))"))
    assert.are.equal("table\n", out)
    assert.are.equal(0, rc)
    local script = os.tmpname()
    spit(script, "print(type(mp), mp == require 'mp')\n")
    out, _, rc = run(q(script))
    os.remove(script)
    assert.are.equal("table\ttrue\n", out)
    assert.are.equal(0, rc)
  end)

  it("accepts --device cpu in both forms", function()
    for _, opt in ipairs({ "--device cpu", "--device=cpu" }) do
      local out, err, rc = run(opt .. " -e " .. q("print(mp.default_device and mp.default_device() or 'cpu')"))
      assert.are.equal("", err)
      assert.are.equal(0, rc)
      assert.are.equal("cpu\n", out)
    end
  end)

  it("fails with a message on an unknown device", function()
    for _, opt in ipairs({ "--device nosuch", "--device=nosuch" }) do
      local out, err, rc = run(opt .. " -e " .. q("print('ran')"))
      assert.are.equal(1, rc)
      assert.matches("^mpengine: .*nosuch", err)
      assert.are.equal("", out)
    end
  end)

  it("ignores LUA_INIT under -E and runs it otherwise", function()
    local out = run("-e " .. q("print('main')"))
    assert.are.equal("main\n", out)
    local env = H.env({ LUA_INIT = "print('init')" }, { "LUA_INIT_5_4" })
    local p = io.popen(env .. q(BIN) .. " -e " .. q("print('main')") .. " </dev/null")
    assert.are.equal("init\nmain\n", p:read("a"))
    p:close()
    p = io.popen(env .. q(BIN) .. " -E -e " .. q("print('main')") .. " </dev/null")
    assert.are.equal("main\n", p:read("a"))
    p:close()
  end)

  it("the REPL survives hostile globals: _PROMPT, mp, print and the global table itself", function()
    local out, err, rc = run("-i", table.concat({
      "_PROMPT = setmetatable({}, {__tostring = function() error('bad prompt') end})",
      "print(1 + 1)",
      "_PROMPT = nil",
      "mp = setmetatable({}, {__index = function() error('mp gone') end})",
      "{}",
      "print = 5",
      "3",
      "print = nil",
      "setmetatable(_G, {__index = function(_, k) error('hostile ' .. k) end})",
      "rawget(_G, 'io').write('still here\\n')",
      "error(setmetatable({}, {__tostring = function() error('x') end}))",
      "rawget(_G, 'io').write('after all\\n')",
    }, "\n") .. "\n")
    assert.are.equal(0, rc, err)
    assert.truthy(out:find("2", 1, true), out)
    assert.truthy(out:find("still here", 1, true), out)
    assert.truthy(out:find("after all", 1, true), out)
    local all = out .. err
    for _, w in ipairs{"bad prompt", "mp gone", "error calling 'print'", "hostile _PROMPT"} do
      assert.truthy(all:find(w, 1, true), w .. " not reported:\n" .. all)
    end
  end)

  it("t:free() in a script run by mpengine releases at once (the CLI holds no tensors under it)", function()
    local out, err, rc = run("-", table.concat({
      "collectgarbage('stop')",
      "local t = mp.zeros{1000000}",
      "local before = mp.counters and mp.memory().in_use",
      "t:free()",
      "do local u <close> = mp.zeros{1000000} end",
      "io.write(before - mp.memory().in_use)",
    }, "\n") .. "\n")
    assert.are.equal(0, rc, err)
    assert.are.equal("4000000", out)
  end)
end)
