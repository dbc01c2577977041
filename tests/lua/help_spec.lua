-- help_spec.lua: mp.help, the REPL's help read from docs/API.md (lua/mp/help.lua).
-- The REPL's `?name` and printing are in repl_spec.lua.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local help = require "mp.help"

-- a reference in docs/API.md's format, naming real functions of mp
local FIXTURE = [[
# A reference

Text before the first area is not an entry.

## Things

What the things are: the first paragraph of an area.

### `mp.matmul(a, b) -> tensor`, `t:matmul(b)`
Matrix product, in the fixture.
Second line of the first paragraph.

A second paragraph, not printed.

### `t:max([dim]) -> values, indices`

The largest elements.

```lua
### not a heading: inside a fence
```

### `Tensor:backward([grad])`

Backward, spelt with Tensor.

## Layers

### `mp.nn.Linear(in, out) -> m`

A linear layer.

### `m:forward(x)`

Runs the module.

### f64: `mp.tensor(v, {dtype = "f64"})`, `t:f64()`

Text outside the backticks is not a signature.
]]

local fixture_path

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

describe("mp.help", function()
  setup(function()
    fixture_path = os.tmpname()
    write(fixture_path, FIXTURE)
  end)

  teardown(function()
    os.remove(fixture_path)
    help.reset()
  end)

  describe("parsing the reference", function()
    local db
    setup(function() db = help.parse(FIXTURE) end)

    it("reads areas, signatures, names and first paragraphs", function()
      assert.are.same({"Things", "Layers"}, {db.areas[1].title, db.areas[2].title})
      assert.are.equal(3, #db.areas[1].entries) -- the fenced "###" is not one
      local e = db.by_name["mp.matmul"][1]
      assert.are.equal(e, db.by_name["t:matmul"][1])
      assert.are.same({"mp.matmul(a, b) -> tensor", "t:matmul(b)"}, e.sigs)
      assert.are.same({"Matrix product, in the fixture.", "Second line of the first paragraph."}, e.para)
      assert.is_true(e.more)
      assert.are.same({"What the things are: the first paragraph of an area."}, db.areas[1].para)
      assert.are.same({"The largest elements."}, db.by_name["t:max"][1].para)
      assert.is_nil(db.by_name["###"])
      -- a name ends at "(", " ", "[" or "{"
      assert.truthy(db.by_name["mp.tensor"] and db.by_name["t:f64"] and db.by_name["Tensor:backward"])
    end)

    it("parses this repository's docs/API.md, which documents mp.help", function()
      local f = assert(io.open(H.root .. "/docs/API.md", "rb"))
      local real = help.parse(f:read("a"))
      f:close()
      assert.truthy(#real.areas > 0)
      for _, a in ipairs(real.areas) do
        for _, e in ipairs(a.entries) do
          assert.truthy(#e.sigs > 0, a.title)
        end
      end
      assert.truthy(real.by_name["mp.help"], "docs/API.md has no entry for mp.help")
    end)
  end)

  describe("with the fixture", function()
    before_each(function() help.reset(fixture_path) end)

    it("prints the usage and the areas with no argument", function()
      local text = help.text()
      assert.truthy(text:find("help(f) or ?name", 1, true), text)
      assert.truthy(text:find("Things", 1, true), text)
      assert.truthy(text:find("Layers", 1, true), text)
      assert.are.equal(text, help.text(mp))
    end)

    it("prints a function's signatures and first paragraph", function()
      local text = help.text(mp.matmul)
      assert.are.equal("mp.matmul(a, b) -> tensor\nt:matmul(b)\n  Matrix product, in the fixture.\n" ..
        "  Second line of the first paragraph.\n  (more in docs/API.md, under \"Things\")", text)
      assert.truthy(help.text(mp.ones({2}, {device = "cpu"}).max):find("The largest elements.", 1, true))
    end)

    it("finds names as typed: qualified, as methods, bare, or short for mp.", function()
      local want = help.text(mp.matmul)
      assert.are.equal(want, help.text("mp.matmul"))
      assert.are.equal(want, help.text(" t:matmul() "))
      assert.are.equal(want, help.text("x:matmul"))
      assert.are.equal(want, help.text("matmul"))
      assert.truthy(help.text("t:backward"):find("spelt with Tensor", 1, true))
      assert.truthy(help.text("nn.Linear"):find("A linear layer.", 1, true))
    end)

    it("lists an area, a module and the tensor methods", function()
      local area = help.text("layers")
      assert.truthy(area:find("mp.nn.Linear(in, out) -> m", 1, true), area)
      assert.truthy(area:find("m:forward(x)", 1, true), area)
      local nn = help.text(mp.nn)
      assert.truthy(nn:find("^mp.nn:"), nn)
      assert.truthy(nn:find("mp.nn.Linear(in, out) -> m", 1, true), nn)
      local tm = help.text("t")
      assert.truthy(tm:find("t:max([dim])", 1, true), tm)
    end)

    it("finds a module instance's class and a class's methods", function()
      assert.truthy(help.text(mp.nn.Linear(2, 3)):find("A linear layer.", 1, true))
      assert.truthy(help.text(mp.nn.Linear.forward):find("Runs the module.", 1, true))
    end)

    it("says plainly when there is no entry", function()
      assert.are.equal("no entry for 'nosuch'; try help() for the areas", help.text("nosuch"))
      assert.are.equal("no entry for 'mp.nosuch.x'; try help() for the areas", help.text("mp.nosuch.x"))
      assert.truthy(help.text(nil):find("the value is nil", 1, true))
      local f = function() end
      local text = help.text(f)
      assert.truthy(text:find("not part of mp", 1, true) and text:find("help_spec.lua", 1, true), text)
      assert.truthy(help.text(print):find("Lua's own", 1, true))
      assert.truthy(help.text(mp.ones({2}, {device = "cpu"})):find("t:name", 1, true))
    end)

    it("prints to stdout and returns nothing", function()
      local r = H.child(("local h = require 'mp.help'; h.reset(%q); print(select('#', h.help('matmul')))")
        :format(fixture_path), true)
      assert.are.equal(0, r.rc, r.err)
      assert.truthy(r.out:find("^mp.matmul%(a, b%) %-> tensor\n"), r.out)
      assert.truthy(r.out:find("\n0\n$"), r.out)
    end)
  end)

  describe("names of values", function()
    setup(function() help.reset() end)

    it("names mp's functions, tensor methods and Lua's own", function()
      assert.are.equal("mp.matmul", help.name_of(mp.matmul))
      assert.are.equal("mp.help", help.name_of(mp.help))
      assert.are.equal("t:max", help.name_of(mp.ones({2}, {device = "cpu"}).max))
      assert.are.equal("print", help.name_of(print))
      assert.are.equal("string.format", help.name_of(string.format))
      assert.is_nil(help.name_of(function() end))
      local opt = mp.optim.SGD(mp.nn.Linear(2, 2):parameters(), {lr = 0.1})
      assert.are.equal("opt:step", help.name_of(opt.step))
      assert.truthy(help.text(opt):find("an optimizer (mp.Optimizer): its methods are written opt:name", 1, true))
      opt:free()
    end)

    it("makes mp.pretty print functions by name", function()
      assert.are.equal("function: mp.matmul", mp.pretty(mp.matmul))
      assert.are.equal("{f = function: mp.help}", mp.pretty{f = mp.help})
      local f = function() end
      assert.are.equal(tostring(f), mp.pretty(f))
    end)
  end)

  describe("finding docs/API.md", function()
    it("in the tree the Lua files were loaded from", function()
      help.reset()
      local path = help.docs_path()
      assert.truthy(path, "docs/API.md not found")
      assert.truthy(path:find("docs/API.md$"), path)
      local a, b = io.open(path, "rb"), io.open(H.root .. "/docs/API.md", "rb")
      assert.are.equal(b:read("a"), a:read("a"))
      a:close(); b:close()
      assert.truthy(help.text():find("REPL", 1, true))
    end)

    it("under <prefix>/share/mpengine once installed, and from MPENGINE_DOCS", function()
      local prefix = os.tmpname()
      os.remove(prefix)
      assert(os.execute("mkdir -p " .. H.q(prefix .. "/share/lua/5.4/mp") .. " " .. H.q(prefix .. "/share/mpengine")))
      local src = assert(io.open(H.root .. "/lua/mp/help.lua", "rb"))
      write(prefix .. "/share/lua/5.4/mp/help.lua", src:read("a"))
      src:close()
      local code = "local h = require 'mp.help'; io.write(tostring(h.docs_path()), '|', h.text('nosuch'))"
      local env = {LUA_PATH = prefix .. "/share/lua/5.4/?.lua", MPENGINE_DOCS = ""}
      -- no reference installed: a message that says where it looked
      local r = H.child(code, true, env)
      assert.are.equal(0, r.rc, r.err)
      assert.truthy(r.out:find("^nil|mp.help: docs/API.md not found"), r.out)
      assert.truthy(r.out:find("MPENGINE_DOCS", 1, true), r.out)
      -- installed as `make install` does
      write(prefix .. "/share/mpengine/API.md", FIXTURE)
      r = H.child(code, true, env)
      assert.are.equal(0, r.rc, r.err)
      assert.are.equal(prefix .. "/share/mpengine/API.md|no entry for 'nosuch'; try help() for the areas", r.out)
      -- MPENGINE_DOCS, a file or its folder, comes first
      env.MPENGINE_DOCS = H.root .. "/docs"
      r = H.child(code, true, env)
      assert.truthy(r.out:find("^[^|]*docs/API%.md|no entry"), r.out)
      os.execute("rm -rf " .. H.q(prefix))
    end)
  end)
end)
