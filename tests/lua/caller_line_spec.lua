-- caller_line_spec.lua: an error raised inside the Lua library (lua/mp/**), by
-- its own checks or by a C function it calls, reports the line of the script
-- that called the library, not a library line (lua/lerror.h, lua/mp/errors.lua).
-- Each case is a script file run with dofile; its error must begin with that
-- file's name and the line of the bad call.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local dir = os.tmpname()
os.remove(dir)
assert(os.execute("mkdir -p " .. H.q(dir)))

-- run `body` as line 3 of a script (after two setup lines); the error must
-- start with "<script>:3: " and hold every word in words
local n = 0
local function at_line(setup, body, words)
  n = n + 1
  local path = string.format("%s/user_script_%d.lua", dir, n)
  H.spit(path, 'local mp = require "mp"; local nn = mp.nn\n' .. setup .. "\n" .. body .. "\nreturn true\n")
  local ok, err = pcall(dofile, path)
  assert(not ok, body .. ": expected an error")
  err = tostring(err)
  local want = path .. ":3: "
  assert(err:sub(1, #want) == want, string.format("%s:\n  want the prefix %s\n  got %s", body, want, err))
  assert(not err:find("lua/mp/", 1, true), "a library path in: " .. err)
  for _, w in ipairs(words or {}) do
    assert(err:find(w, 1, true), string.format("%s: %q not in %s", body, w, err))
  end
end

describe("errors at the caller's line", function()
  teardown(function() os.execute("rm -rf " .. H.q(dir)) end)

  it("a C op raised from an nn module's forward", function()
    at_line("local emb = nn.Embedding(10, 4)", "local y = emb(mp.zeros{2, 3})", { "mp.embedding: indices must be i32" })
    at_line("local lin = nn.Linear(3, 4)", "local y = lin(mp.zeros{2, 5})", { "mp.linear" })
    at_line("local s = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))",
            "local y = s(mp.zeros{2, 5})", { "mp.linear" })
  end)

  it("the library's own checks in nn, optim and data", function()
    at_line("", "local e = nn.Embedding(0, 4)", { "mp.nn.Embedding" })
    at_line("local m = nn.Linear(2, 2)", "local opt = mp.optim.AdamW(m:parameters(), {lr = 'x'})",
            { "mp.optim.AdamW", "lr" })
    at_line("local m = nn.Linear(2, 2)", "local opt = mp.optim.SGD(m:parameters(), {lr = 0.1, bogus = 1})",
            { "mp.optim.SGD", "bogus" })
    at_line("local opt = mp.optim.SGD(nn.Linear(2, 2):parameters(), {lr = 0.1})", "opt:load_state_dict(5)",
            { "load_state_dict" })
    at_line("local m = nn.Linear(2, 2); local opt = mp.optim.SGD(m:parameters(), {lr = 0.1}); "
              .. "opt:set_schedule(function(n) return n < 1 and 1 or -1 end); m(mp.ones{1, 2}):sum():backward()",
            "opt:step(); opt:step()", { "schedule function returned -1" })
    at_line("local m = nn.Linear(2, 2)", "local opt = mp.optim.AdamW(m:parameters(), {betas = 3})", { "betas" })
    at_line("", "local w = mp.data.windows(5)", { "mp.data.windows" })
    at_line("", "local t = mp.data.text(5)", { "mp.data.text" })
    at_line("", "local l = mp.data.loader({x = 1})", { "mp.data.loader" })
  end)

  it("no library line when the caller tail-called the library (the REPL's `return expr`)", function()
    -- a coroutine, so that nothing but the chunk is below the library, as at the REPL's prompt
    local ok, err = coroutine.resume(coroutine.create(load('local mp = require "mp"; return mp.nn.LSTM(0, 4)', "=stdin")))
    assert.is_false(ok)
    err = tostring(err)
    assert.are.equal("mp.nn.LSTM: input_size must be a positive integer (got 0)", err)
  end)

  it("mp.errors.raise from any depth of library code", function()
    local errors = require "mp.errors"
    -- called from this spec (not library code): the position is this line
    local ok, err = pcall(function() errors.raise("boom") end)
    assert(not ok and tostring(err):match("caller_line_spec%.lua:%d+: boom$"), tostring(err))
    local here = debug.getinfo(1, "S").short_src
    assert(errors.where():find(here, 1, true), errors.where())
  end)

  it("a script in a folder named mp is not taken for the library", function()
    local sub = dir .. "/mp"
    assert(os.execute("mkdir -p " .. H.q(sub)))
    local path = sub .. "/nn.lua"
    H.spit(path, 'local mp = require "mp"\nlocal emb = mp.nn.Embedding(10, 4)\nlocal y = emb(mp.zeros{2, 3})\n')
    local ok, err = pcall(dofile, path)
    assert(not ok and tostring(err):sub(1, #path + 3) == path .. ":3:", tostring(err))
  end)
end)
