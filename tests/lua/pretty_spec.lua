-- pretty_spec.lua: mp.pretty, which the REPL uses to auto-print plain tables.
local mp = require "mp"

describe("mp.pretty", function()
  it("renders lists, sorted keys, strings, nesting and tensors", function()
    assert.are.equal('{1, 2, "s", x = {y = [f32 2 cpu]}}', mp.pretty{1, 2, x = {y = mp.ones({2}, {device = "cpu"})}, "s"})
    assert.are.equal('{["a b"] = true, z = 1.5}', mp.pretty{z = 1.5, ["a b"] = true})
    assert.are.equal("{}", mp.pretty{})
    assert.are.equal("42", mp.pretty(42))
  end)

  it("caps depth, length and cycles", function()
    local t = {}
    t.self = t
    assert.are.equal("{self = {...cycle}}", mp.pretty(t))
    assert.are.equal("{a = {b = {c = {...}}}}", mp.pretty{a = {b = {c = {d = 1}}}})
    local long = {}
    for i = 1, 30 do long[i] = i end
    assert.is_truthy(mp.pretty(long):find("... (6 more)", 1, true))
  end)
end)
