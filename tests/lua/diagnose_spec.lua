-- diagnose_spec.lua: mp.amp.diagnose (lua/mp/amp/lab.lua over engine/observe.c and
-- mp_autocast_suppress): the low-precision run against FP32 op by op names the first
-- op whose inf/NaN FP32 does not have, forward or backward; a clean step has none;
-- underflow shows where f16 flushes what FP32 keeps; the model's gradients and the
-- random state are left as they were; it works from scaler.on_skip; bad use is refused.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local function setup_model()
  mp.manual_seed(0)
  return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4)), mp.randn { 8, 16 },
         mp.randint(0, 4, { 8 })
end

describe("mp.amp.diagnose", function()
  it("names a forward overflow: the first linear's f16 output, which FP32 keeps finite", function()
    local model, x, y = setup_model()
    local r = mp.amp.diagnose { model = model, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x * 1e5), y)
    end }
    assert.is_truthy(r.first, "no offending op")
    assert.are.equal("forward", r.first.kind)
    assert.is_truthy(r.first.name == "linear" or r.first.name == "to", r.first.name)
    assert.are.equal(0, r.first.nonfinite_f32)
    assert.is_nil(r.mismatch)
  end)

  it("names a backward overflow under a loss scale, and leaves gradients and randomness alone", function()
    local model, x, y = setup_model()
    local before = model[0] and nil
    local p1 = model:parameters()[1]
    p1.grad = mp.full(p1.shape, 7)
    local state = mp.get_rng_state()
    local r = mp.amp.diagnose { model = model, scale = 2 ^ 16, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x * 3000), y)
    end }
    assert.is_truthy(r.first)
    assert.are.equal("backward", r.first.kind)
    assert.are.equal(2 ^ 16, r.scale)
    assert.are.equal(7, p1.grad:max():item())
    assert.is_nil(model:parameters()[2].grad)
    assert.are.same(state, mp.get_rng_state())
    local params = 0
    for _, row in ipairs(r.rows) do if row.kind == "param" then params = params + 1 end end
    assert.are.equal(4, params)
  end)

  it("finds nothing in a clean step, and shows f16 flushing a tiny loss's gradients", function()
    local model, x, y = setup_model()
    local clean = mp.amp.diagnose { model = model, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x), y)
    end }
    assert.is_nil(clean.first)
    local tiny = mp.amp.diagnose { model = model, print = false, loss = function()
      local _ <close> = mp.amp.autocast("f16")
      return mp.cross_entropy(model(x), y) * 2 ^ -30
    end }
    local worst = 0
    for _, row in ipairs(tiny.rows) do if row.kind == "backward" then worst = math.max(worst, row.underflow) end end
    assert.is_true(worst > 0.5, "f16 flushes most of the 2^-30 gradients: " .. worst)
  end)

  it("runs from scaler.on_skip and prints its table", function()
    local out = H.child([[
      local nn = mp.nn
      mp.manual_seed(0)
      local model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
      local opt = mp.optim.SGD(model:parameters(), {lr = 0.1})
      local sc = mp.amp.GradScaler{policy = mp.amp.policy.static(2^16)}
      local x, y = mp.randn{4, 8} * 1e5, mp.randint(0, 2, {4})
      local function loss_fn()
        local _ <close> = mp.amp.autocast("f16")
        return mp.cross_entropy(model(x), y)
      end
      local found
      sc.on_skip = function() found = mp.amp.diagnose{model = model, loss = loss_fn, scaler = sc} end
      opt:zero_grad()
      sc:scale(loss_fn()):backward()
      sc:step(opt)
      sc:update()
      return found and found.first and found.first.kind
    ]])
    assert.is_truthy(out.out:find("first inf/NaN that FP32 does not have", 1, true), out.out .. out.err)
    assert.is_truthy(out.out:find("OK:", 1, true), out.out .. out.err)
  end)

  describe("rows = N", function()
    -- 12 Linear layers: 24 parameter rows, and many more with a tiny loss's underflow
    local function deep()
      mp.manual_seed(0)
      local layers = {}
      for k = 1, 12 do layers[#layers + 1] = nn.Linear(8, 8); layers[#layers + 1] = nn.ReLU() end
      return nn.Sequential(table.unpack(layers)), mp.randn { 4, 8 }, mp.randint(0, 8, { 4 })
    end
    -- the printed lines of one diagnose call, and its result
    local function printed(o)
      local out, real = {}, _G.print   -- lab.lua's print is the global one
      _G.print = function(...) out[#out + 1] = table.concat({ ... }, "\t") end
      local ok, r = pcall(mp.amp.diagnose, o)
      _G.print = real
      assert(ok, r)
      local text = table.concat(out, "\n")
      local lines = {}
      for l in text:gmatch("[^\n]+") do lines[#lines + 1] = l end
      local table_rows = 0
      for _, l in ipairs(lines) do if l:match("^!?%d+ +%a") then table_rows = table_rows + 1 end end
      return text, table_rows, r
    end
    local function tiny(model, x, y)
      return function()
        local _ <close> = mp.amp.autocast("f16")
        return mp.cross_entropy(model(x), y) * 2 ^ -30
      end
    end

    it("prints 20 rows by default and says how many it left out and how to see them", function()
      local model, x, y = deep()
      local text, n, r = printed { model = model, loss = tiny(model, x, y) }
      assert.is_true(#r.rows > 40, "rows: " .. #r.rows)
      assert.are.equal(20, n, text)
      local more = text:match("%.%.%. (%d+) more rows not shown")
      assert.is_truthy(more, text)
      assert.is_truthy(text:find("rows = math.huge", 1, true) and text:find('"all"', 1, true), text)
      -- every row worth a look is either printed or counted
      local worth = 0
      for _, row in ipairs(r.rows) do
        if row.nonfinite > 0 or row.underflow > 0 or row.kind == "param" then worth = worth + 1 end
      end
      assert.are.equal(worth, n + tonumber(more), text)
      -- the printed ones are the largest underflows
      local least_printed = math.huge
      for l in text:gmatch("[^\n]+") do
        local u = l:match("^%d+ +%a+ .- ([%d.e+-]+)$")
        if u then least_printed = math.min(least_printed, tonumber(u)) end
      end
      local above = 0
      for _, row in ipairs(r.rows) do if row.underflow > least_printed then above = above + 1 end end
      assert.is_true(above <= 20, "rows with more underflow than a printed one: " .. above)
    end)

    it("rows = N, math.huge and \"all\"", function()
      local model, x, y = deep()
      local _, n5 = printed { model = model, loss = tiny(model, x, y), rows = 5 }
      assert.are.equal(5, n5)
      local all_text, n_all = printed { model = model, loss = tiny(model, x, y), rows = "all" }
      assert.is_nil(all_text:find("more rows not shown", 1, true), all_text)
      local _, n_huge = printed { model = model, loss = tiny(model, x, y), rows = math.huge }
      assert.are.equal(n_all, n_huge)
      assert.is_true(n_all > 20, n_all)
    end)

    it("always prints the flagged rows (inf/NaN that FP32 does not have), however few rows are asked", function()
      local model, x, y = deep()
      local text, n, r = printed { model = model, rows = 1, loss = function()
        local _ <close> = mp.amp.autocast("f16")
        return mp.cross_entropy(model(x * 1e5), y)
      end }
      assert.is_truthy(r.first, text)
      local flagged = 0
      for _, row in ipairs(r.rows) do if row.nonfinite > 0 and row.nonfinite_f32 == 0 then flagged = flagged + 1 end end
      assert.is_true(flagged > 1, "flagged: " .. flagged)
      assert.are.equal(flagged, n, text)
      assert.is_truthy(text:find("^.*\n!" .. r.first.index .. " "), text)
    end)

    it("refuses a bad rows", function()
      local model, x, y = deep()
      for _, bad in ipairs { 0, -1, 2.5, "some", true } do
        H.raises(function() mp.amp.diagnose { model = model, loss = tiny(model, x, y), rows = bad } end,
                 { "mp.amp.diagnose", "rows must be a positive integer" })
      end
    end)
  end)

  it("refuses bad use", function()
    local model = setup_model()
    H.raises(function() mp.amp.diagnose { loss = function() end } end, { "mp.amp.diagnose", "model" })
    H.raises(function() mp.amp.diagnose { model = model } end, { "mp.amp.diagnose", "loss" })
    H.raises(function() mp.amp.diagnose { model = model, loss = function() return 1 end } end, { "loss tensor" })
    H.raises(function() mp.amp.diagnose { model = model, loss = function() end, bogus = 1 } end, { "bogus" })
  end)
end)
