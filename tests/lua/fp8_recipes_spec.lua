-- fp8_recipes_spec.lua: the FP8 recipes (lua/mp/fp8/recipes.lua), the holder
-- mp.fp8.Scaler and mp.fp8.autocast (lua/mp/fp8/holder.lua): delayed scaling's
-- scale sequence against a hand computation, its algos, the option errors,
-- set_recipe, an exact resume, autocast's routing of nn.Linear and its names.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local f32 = H.f32

-- a tensor state as the holder makes one, for driving a recipe by hand
local function state(r, kind)
  local ts = {name = "t." .. kind, layer = "t", kind = kind, device = mp.default_device(), numel = 0, steps_seen = 0}
  ts.format, ts.granularity = r:layout(kind)
  r:init(ts)
  return ts
end

local function amax(v) return mp.full({1}, v) end

-- TE's rule in f64 then f32 (448 / a is one rounding either way: f64 has room)
local function te_next(prev, a, fmax, margin)
  if not (a > 0) or a == math.huge then return prev end
  return f32(f32(fmax / a) / 2 ^ margin)
end

describe("mp.fp8 recipes", function()
  it("delayed: the scale sequence over a scripted amax sequence (window max, margin, zero and non-finite amax)", function()
    local seq = {2, 0.5, 3, 0, 0.25, 7, 1 / 0, 0.1, 0.2, 0.3, 0 / 0, 5, 1, 1, 1, 1}
    for _, c in ipairs{{algo = "max", history = 3, margin = 0}, {algo = "max", history = 1, margin = 1},
                       {algo = "most_recent", history = 4, margin = 2}} do
      local r = mp.fp8.delayed(c)
      local ts = state(r, "x")
      assert.are.equal(1, r:scale(ts):item())   -- the first step runs at 1
      local window, want = {}, 1
      for i, a in ipairs(seq) do
        r:observe(ts, amax(a))
        table.insert(window, 1, f32(a))
        window[c.history + 1] = nil
        local m
        if c.algo == "most_recent" then m = f32(a)
        else
          m = -math.huge
          for _, v in ipairs(window) do
            if v ~= v then m = 0 / 0 break end
            m = math.max(m, v)
          end
        end
        want = te_next(want, m, 448, c.margin)
        local got = r:scale(ts):item()
        assert(got == want, string.format("%s history %d margin %d, step %d: scale %.9g, TE's %.9g", c.algo, c.history,
                                          c.margin, i, got, want))
      end
      assert.are.equal(c.history, ts.history:numel())
    end
  end)

  it("delayed: hybrid puts e5m2 on the gradients (max 57344); e4m3 everywhere with format e4m3", function()
    local r = mp.fp8.delayed{history = 2}
    assert.are.same({"e4m3", "tensor"}, {r:layout("x")})
    assert.are.same({"e5m2", "tensor"}, {r:layout("g")})
    local ts = state(r, "g")
    r:observe(ts, amax(4))
    assert.are.equal(57344 / 4, r:scale(ts):item())
    assert.are.same({"e4m3", "tensor"}, {mp.fp8.delayed{format = "e4m3"}:layout("g")})
  end)

  it("delayed: an algo function gets the history (newest first) and gives the amax", function()
    local seen
    local r = mp.fp8.delayed{history = 3, algo = function(h) seen = h:totable() return h:mean():reshape{1} end}
    local ts = state(r, "w")
    r:observe(ts, amax(2))
    r:observe(ts, amax(4))
    assert.are.same({4, 2, 0}, seen)
    assert.are.equal(f32(448 / 2), r:scale(ts):item())
    local bad = mp.fp8.delayed{algo = function() return 3 end}
    local ts2 = state(bad, "x")
    H.raises(function() bad:observe(ts2, amax(1)) end, {"mp.fp8.delayed", "algo", "f32 tensor of one value"})
  end)

  it("block, current and mx: their layouts, no scale of their own, nothing to keep", function()
    local b = mp.fp8.block{}
    assert.are.same({"e4m3", "tile"}, {b:layout("x")})
    assert.are.same({"e4m3", "block"}, {b:layout("w")})
    assert.are.same({"e4m3", "tile"}, {b:layout("g")})
    assert.are.same({"mx"}, {select(2, mp.fp8.mx{}:layout("w"))})
    local c = mp.fp8.current{}
    assert.are.same({"e5m2", "tensor"}, {c:layout("g")})
    assert.is_nil(c:scale(state(c, "x")))
    assert.are.same({}, c:state(state(c, "x")))
  end)

  it("refuses bad options, naming the function and the option", function()
    H.raises(function() mp.fp8.delayed{history = 0} end, {"mp.fp8.delayed", "'history'"})
    H.raises(function() mp.fp8.delayed{algo = "mean"} end, {"mp.fp8.delayed", "'algo'"})
    H.raises(function() mp.fp8.delayed{margin = -1} end, {"mp.fp8.delayed", "'margin'"})
    H.raises(function() mp.fp8.delayed{format = "e5m2"} end, {"mp.fp8.delayed", "'format'"})
    H.raises(function() mp.fp8.delayed{len = 3} end, {"mp.fp8.delayed", "len"})
    H.raises(function() mp.fp8.current{margin = 1} end, {"mp.fp8.current", "'margin'"})
    H.raises(function() mp.fp8.block{tile = 64} end, {"mp.fp8.block", "'tile'"})
    H.raises(function() mp.fp8.mx{block = 16} end, {"mp.fp8.mx", "'block'"})
    H.raises(function() mp.fp8.delayed{}:layout("y") end, {"mp.fp8.delayed", "kind"})
    H.raises(function() mp.fp8.Scaler{recipe = {name = "r"}} end, {"mp.fp8.Scaler", "recipe", "layout"})
    H.raises(function() mp.fp8.Scaler{recipe = mp.fp8.current{}, telemetry = 1} end, {"mp.fp8.Scaler", "telemetry"})
    H.raises(function() mp.fp8.autocast(mp.fp8.current{}, {dtype = "f32"}) end, {"mp.fp8.autocast", "'dtype'"})
    H.raises(function() mp.fp8.Scaler{recipe = mp.fp8.current{}}:set_recipe(mp.fp8.current{}, {history = "drop"}) end,
             {"set_recipe", "'history'"})
  end)
end)

-- a small model trained under FP8 autocast: the losses and final weights
local function run(r, steps, opts)
  opts = opts or {}
  mp.manual_seed(3)
  local m = mp.nn.Sequential(mp.nn.Linear(20, 33), mp.nn.ReLU(), mp.nn.Linear(33, 4))
  local opt = mp.optim.Adam(m:parameters(), {lr = 1e-2})
  local fs = opts.fs or mp.fp8.Scaler{recipe = r, model = m}
  if opts.load then
    m:load_state_dict(opts.load.model)
    opt:load_state_dict(opts.load.optim)
    fs:load_state_dict(opts.load.fp8)
    mp.set_rng_state(opts.load.rng)
  end
  local losses = {}
  for s = (opts.from or 0) + 1, steps do
    opt:zero_grad()
    for _ = 1, opts.accum or 1 do
      local x, y = mp.randn({8, 20}), mp.randint(0, 4, {8}):to("i32")
      local loss
      do
        local _ <close> = mp.fp8.autocast(fs)
        loss = mp.cross_entropy(m(x), y)
      end
      loss:backward()
      losses[#losses + 1] = loss:item()
    end
    opt:step()
    fs:update()
    if opts.save_at == s then
      local path = os.tmpname()
      mp.save(path, {model = m:state_dict(), optim = opt:state_dict(), fp8 = fs:state_dict(), rng = mp.get_rng_state()})
      opts.saved = mp.load(path)
      os.remove(path)
    end
  end
  return losses, m, fs
end

describe("mp.fp8.Scaler and mp.fp8.autocast", function()
  it("routes nn.Linear through the FP8 Function, named by the model's paths; autocast(false) turns it off", function()
    local losses, m, fs = run(mp.fp8.delayed{history = 8}, 3)
    local names = {}
    for _, ts in ipairs(fs.tensors) do names[#names + 1] = ts.name end
    assert.are.same({"0.x", "0.w", "0.g", "2.x", "2.w", "2.g"}, names)
    assert.are.equal(3, fs.by_name["2.g"].steps_seen)
    assert.is_true(fs.by_name["0.x"].scale:item() ~= 1)
    do
      local _ <close> = mp.fp8.autocast(fs)
      assert.are.equal("fp8_linear", m["0"](mp.randn({2, 20})).grad_fn)
      do
        local _o <close> = mp.fp8.autocast(false)
        local y = m["0"](mp.randn({2, 20}))
        assert.are.equal("bf16", y.dtype)        -- mp.amp's bf16 autocast stays on
        assert.are_not.equal("fp8_linear", y.grad_fn)
      end
      assert.are.equal("fp8_linear", m["0"](mp.randn({2, 20})).grad_fn)
    end
    local y = m["0"](mp.randn({2, 20}))
    assert.are.equal("f32", y.dtype)
    for _, l in ipairs(losses) do assert.is_true(l == l and l < 10) end
  end)

  it("names layers linear<i> in first-use order without a model; a bare recipe keeps its holder", function()
    local r = mp.fp8.current{}
    local a, b = mp.nn.Linear(4, 4), mp.nn.Linear(4, 4)
    do
      local _ <close> = mp.fp8.autocast(r)
      b(a(mp.randn({2, 4})))
    end
    assert.are.same({"linear1.x", "linear1.w", "linear1.g", "linear2.x"},
                    {r._scaler.tensors[1].name, r._scaler.tensors[2].name, r._scaler.tensors[3].name,
                     r._scaler.tensors[4].name})
    assert.are.equal(r._scaler.by_name["linear2.w"].granularity, "tensor")
  end)

  it("resumes exactly: N steps, save, resume, the same losses and weights bit for bit as one run", function()
    for _, r in ipairs{function() return mp.fp8.delayed{history = 4} end, function() return mp.fp8.block{} end} do
      local full, m_full = run(r(), 6)
      local o = {save_at = 3}
      run(r(), 3, o)
      local rest, m_res = run(r(), 6, {from = 3, load = o.saved})
      for i = 1, 3 do assert.are.equal(full[3 + i], rest[i]) end
      local a, b = m_full:state_dict(), m_res:state_dict()
      for k, t in pairs(a) do
        assert.are.same(t:reshape{-1}:view("i32"):totable(), b[k]:reshape{-1}:view("i32"):totable(), k)
      end
    end
  end)

  it("gradient accumulation: amax is the max over the micro-batches, numel their sum", function()
    local fs
    local seen = {}
    local rec = mp.fp8.delayed{history = 2}
    local observe = rec.observe
    rec.observe = function(self, ts, a)
      if ts.name == "0.x" then seen[#seen + 1] = {a:item(), ts.numel} end
      return observe(self, ts, a)
    end
    local _, _, f = run(rec, 1, {accum = 3})
    fs = f
    assert.are.equal(1, #seen)
    assert.are.equal(3 * 8 * 20, seen[1][2])
    assert.is_true(seen[1][1] > 0)
    assert.are.equal(1, fs.by_name["0.x"].steps_seen)
  end)

  it("set_recipe: keep carries delayed's history into a new window; reset starts afresh", function()
    local _, _, fs = run(mp.fp8.delayed{history = 4}, 3)
    local h = fs.by_name["0.x"].history:totable()
    fs:set_recipe(mp.fp8.delayed{history = 2})
    assert.are.same({h[1], h[2]}, fs.by_name["0.x"].history:totable())
    local s = fs.by_name["0.x"].scale:item()
    assert.is_true(s ~= 1)
    fs:set_recipe(mp.fp8.delayed{history = 2}, {history = "reset"})
    assert.are.same({0, 0}, fs.by_name["0.x"].history:totable())
    assert.are.equal(1, fs.by_name["0.x"].scale:item())
    fs:set_recipe(mp.fp8.block{})
    assert.are.equal("block", fs.by_name["0.w"].granularity)
    run(nil, 2, {fs = fs})   -- trains on under the new recipe
    H.raises(function() fs:load_state_dict({recipe = "delayed", tensors = {}}) end, {"load_state_dict", "'delayed'", "'block'"})
  end)

  it("takes a user's recipe: any table with the methods (here a static multiplier of 4)", function()
    local observed = {}
    local static = {
      name = "static4",
      layout = function(_, kind) return kind == "g" and "e5m2" or "e4m3", "tensor" end,
      init = function(_, ts) ts.mult = mp.full({1}, 4, {device = ts.device}) end,
      scale = function(_, ts) return ts.mult end,
      observe = function(_, ts, a) observed[ts.name] = (observed[ts.name] or 0) + 1 end,
      state = function(_, ts) return {mult = ts.mult} end,
      load = function(_, ts, t) ts.mult = t.mult:to(ts.device) end,
    }
    local losses, _, fs = run(static, 2)
    assert.are.equal(2, observed["2.g"])
    assert.are.equal(4, fs.by_name["0.w"].mult:item())
    assert.are.equal("static4", fs:state_dict().recipe)
    for _, l in ipairs(losses) do assert.is_true(l == l and l < 10) end
    -- the multiplier the step used is the recipe's
    do
      local _ <close> = mp.fp8.autocast(fs)
      local m = mp.nn.Linear(20, 3)
      m(mp.randn({2, 20}))
      assert.are.equal(4, fs.by_name["linear1.x"].used:item())
    end
  end)

  it("mx: every tensor in 32-blocks with E8M0 scales", function()
    local losses, _, fs = run(mp.fp8.mx{}, 3)
    assert.are.equal("mx", fs.by_name["2.g"].granularity)
    assert.are.equal(3, fs.by_name["2.g"].steps_seen)
    for _, l in ipairs(losses) do assert.is_true(l == l and l < 10) end
  end)

  it("telemetry: the saturated and flushed counts per tensor, summed over the step", function()
    local fs = mp.fp8.Scaler{recipe = mp.fp8.delayed{}, telemetry = true}
    local w = mp.full({2, 3}, 1000):requires_grad(true)   -- at scale 1 e4m3 saturates 1000
    mp.fp8.linear(mp.ones({2, 3}), w, nil, fs)
    mp.fp8.linear(mp.ones({2, 3}), w, nil, fs)
    assert.are.same({12, 0}, fs.by_name["linear.w"].counts:totable())
  end)
end)
