-- amp_spec.lua: mp.amp autocast (op classes, nesting, register, the per-region
-- cast cache and its gradient) and the GradScaler's step mechanics: skipped
-- steps leave master weights and optimizer state bit-identical, skip reasons
-- and on_skip, unscale once per step, telemetry on constructed gradients, and
-- learning-rate schedules that advance only on applied steps.
-- (The policies' scale sequences are in scaler_spec.lua.)
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted --no-auto-insulate tests/lua/amp_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local amp = mp.amp
local P = amp.policy

-- the raw bytes of a tensor's f32 values (or of a number), for bit-identity
local function bits(t)
  local v = type(t) == "number" and {t} or t:totable()
  if type(v) == "number" then v = {v} end
  local out = {}
  for i, x in ipairs(H.flat(v)) do out[i] = string.pack("<f", x) end
  return table.concat(out)
end

local function vals(t)
  local v = t:totable()
  if type(v) == "number" then return {v} end
  return H.flat(v)
end

---------------------------------------------------------------- autocast

describe("guards close without <close> too", function()
  it("an autocast guard's close() ends its region (twice is harmless); no_grad's too", function()
    local g = mp.amp.autocast("f16")
    assert.are.equal("f16", mp.matmul(mp.randn { 2, 2 }, mp.randn { 2, 2 }).dtype)
    g:close()
    g:close()
    assert.are.equal("f32", mp.matmul(mp.randn { 2, 2 }, mp.randn { 2, 2 }).dtype)
    local n = mp.no_grad()
    assert.is_false(mp.is_grad_enabled())
    n:close()
    assert.is_true(mp.is_grad_enabled())
  end)
end)

describe("mp.amp.autocast's arguments, function form and forgotten guards", function()
  local x = mp.tensor({{0.5, 0.25}})
  local w2 = mp.tensor({{1, 2}, {3, 4}})

  it("a bad dtype lists only the low-precision choices", function()
    for _, d in ipairs({"f64", "f32", "i32", "u8", "x"}) do
      local msg = H.raises(function() local g = mp.amp.autocast(d); return g end, {"mp.amp.autocast", "f16 or bf16", d})
      assert(not msg:find("i32", 1, true) or d == "i32", msg)
      assert(not msg:find("u8", 1, true) or d == "u8", msg)
    end
    H.raises(function() local g = mp.amp.autocast(3); return g end, {"mp.amp.autocast", "got number"})
    H.raises(function() local g = mp.amp.autocast("f16", 3); return g end, {"mp.amp.autocast", "fn must be a function"})
  end)

  it("autocast(dtype, fn, ...) runs fn in a region and returns its results", function()
    local dt, sum, n = mp.amp.autocast("f16", function(a, b) return x:matmul(w2).dtype, a + b, nil end, 1, 2)
    assert.equal("f16", dt)
    assert.equal(3, sum)
    assert.is_nil(n)
    assert.equal("f32", x:matmul(w2).dtype)
    assert.equal("bf16", mp.amp.autocast("bf16", function() return x:matmul(w2).dtype end))
    -- off inside a region
    local _ <close> = mp.amp.autocast("f16")
    assert.equal("f32", mp.amp.autocast(false, function() return x:matmul(w2).dtype end))
    assert.equal("f16", x:matmul(w2).dtype)
  end)

  it("the function form closes its region when fn raises, and passes the error on", function()
    local ok, err = pcall(mp.amp.autocast, "f16", function() error("inside fn") end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("inside fn", 1, true))
    assert.equal("f32", x:matmul(w2).dtype)
  end)

  it("a guard collected while its region is open warns once per place, naming it", function()
    local r = H.child([[
local mp = require "mp"
for i = 1, 3 do
  local g = mp.amp.autocast("f16")
end
collectgarbage(); collectgarbage()
local ok = mp.amp.autocast("bf16"); ok:close(); ok = nil
do local _ <close> = mp.amp.autocast("f16") end
collectgarbage(); collectgarbage()
io.write("done")
]], true)
    assert.equal("done", r.out, r.err)
    local _, count = r.err:gsub("never closed", "")
    assert.equal(1, count, r.err)
    assert.truthy(r.err:find("created at [^\n]*:3 was never closed"), r.err)
    assert.truthy(r.err:find("<close>", 1, true), r.err)
  end)
end)

describe("mp.amp.autocast op classes", function()
  local x = mp.tensor({{0.5, 0.25}})
  local w = mp.tensor({{1, 2}, {3, 4}})

  it("low: matmul and linear give f16 inside an f16 region, f32 outside", function()
    do
      local _ <close> = amp.autocast("f16")
      assert.equal("f16", x:matmul(w).dtype)
      assert.equal("f16", mp.matmul(x, w).dtype)
      assert.equal("f16", mp.linear(x, w).dtype)
      assert.equal("f16", mp.linear(x, w, mp.tensor({1, 1})).dtype)
    end
    assert.equal("f32", x:matmul(w).dtype)
    assert.equal("f32", mp.linear(x, w).dtype)
  end)

  it("low: the inputs really are rounded to f16 before the product", function()
    local a = mp.tensor({{1 + 2 ^ -12}})   -- rounds to 1 in f16 (and to 1 in bf16)
    local b = mp.tensor({{1}})
    assert.equal(1 + 2 ^ -12, a:matmul(b):item())
    do
      local _ <close> = amp.autocast("f16")
      assert.equal(1, a:matmul(b):item())
    end
    do
      local _ <close> = amp.autocast("bf16")
      local y = a:matmul(b)
      assert.equal("bf16", y.dtype)
      assert.equal(1, y:item())
    end
  end)

  it("f32: softmax, log_softmax, cross_entropy, mse_loss, layer_norm, sum, mean, exp, log, pow give f32 from f16", function()
    local _ <close> = amp.autocast("f16")
    local h = mp.tensor({{0.5, 1.5, 2}}):f16()
    assert.equal("f16", h.dtype)
    assert.equal("f32", mp.softmax(h, -1).dtype)
    assert.equal("f32", mp.log_softmax(h, -1).dtype)
    assert.equal("f32", mp.cross_entropy(h, mp.tensor({2}, {dtype = "i32"})).dtype)
    assert.equal("f32", mp.mse_loss(h, h).dtype)
    assert.equal("f32", mp.layer_norm(h, mp.tensor({1, 1, 1}), mp.tensor({0, 0, 0})).dtype)
    assert.equal("f32", mp.rms_norm(h, mp.tensor({1, 1, 1}):f16()).dtype)
    assert.equal("f32", h:sum().dtype)
    assert.equal("f32", h:sum(2).dtype)
    assert.equal("f32", h:mean().dtype)
    assert.equal("f32", h:exp().dtype)
    assert.equal("f32", h:log().dtype)
    assert.equal("f32", h:pow(2).dtype)
    -- the f32 result is computed from the f16 values: sum of f16(0.1) * 3 in f32
    local t = mp.tensor({0.1, 0.1, 0.1}):f16()
    local f16_01 = vals(t)[1]
    assert.equal(H.f32(H.f32(f16_01 + f16_01) + f16_01), t:sum():item())
  end)

  it("promote: add/sub/mul/div/cat/where give the widest input dtype", function()
    local _ <close> = amp.autocast("f16")
    local h, f = mp.tensor({1, 2}):f16(), mp.tensor({3, 4})
    assert.equal("f32", (h + f).dtype)
    assert.equal("f32", (f - h).dtype)
    assert.equal("f32", (h * f).dtype)
    assert.equal("f32", (h / f).dtype)
    assert.equal("f16", (h + h).dtype)
    assert.equal("f16", (h * h).dtype)
    assert.equal("f32", mp.cat({h, f}, 1).dtype)
    assert.equal("f32", mp.where(mp.tensor({1, 0}, {dtype = "u8"}), h, f).dtype)
    assert.equal("f32", (f + f).dtype)
  end)

  it("ops of no class keep their inputs' dtype", function()
    local _ <close> = amp.autocast("f16")
    assert.equal("f16", mp.relu(mp.tensor({1, -1}):f16()).dtype)
    assert.equal("f32", mp.relu(mp.tensor({1, -1})).dtype)
    assert.equal("f32", mp.tanh(mp.tensor({1, -1})).dtype)
  end)

  it("classes() lists the built-in classes", function()
    local c = amp.classes()
    assert.equal("low", c.matmul)
    assert.equal("low", c.linear)
    for _, k in ipairs{"softmax", "log_softmax", "cross_entropy", "mse_loss", "layer_norm", "rms_norm", "sum", "mean", "exp", "log", "pow"} do
      assert.equal("f32", c[k], k)
    end
    for _, k in ipairs{"add", "sub", "mul", "div", "cat", "where"} do
      assert.equal("promote", c[k], k)
    end
  end)
end)

describe("mp.amp.autocast nesting", function()
  local x = mp.tensor({{0.5, 0.25}})
  local w = mp.tensor({{1, 2}, {3, 4}})

  it("bf16 inside f16, false inside bf16, and each exit restores the outer region", function()
    do
      local _ <close> = amp.autocast("f16")
      assert.equal("f16", x:matmul(w).dtype)
      do
        local _ <close> = amp.autocast("bf16")
        assert.equal("bf16", x:matmul(w).dtype)
        do
          local _ <close> = amp.autocast(false)
          assert.equal("f32", x:matmul(w).dtype)
          -- off means off: f16 inputs of an f32-class op are not cast either
          assert.equal("f16", mp.softmax(x:f16(), -1).dtype)
        end
        assert.equal("bf16", x:matmul(w).dtype)
      end
      assert.equal("f16", x:matmul(w).dtype)
    end
    assert.equal("f32", x:matmul(w).dtype)
  end)

  it("an error inside a region closes it", function()
    local ok = pcall(function()
      local _ <close> = amp.autocast("f16")
      local _ <close> = amp.autocast("bf16")
      error("inside")
    end)
    assert.is_false(ok)
    assert.equal("f32", x:matmul(w).dtype)
  end)

  it("autocast(false) outside any region is harmless", function()
    do
      local _ <close> = amp.autocast(false)
      assert.equal("f32", x:matmul(w).dtype)
    end
    assert.equal("f32", x:matmul(w).dtype)
  end)

  it("bad arguments error", function()
    H.raises(function() local _ <close> = amp.autocast("f32") end, {"f32"})
    H.raises(function() local _ <close> = amp.autocast("i32") end, {})
    H.raises(function() local _ <close> = amp.autocast("nope") end, {})
    H.raises(function() local _ <close> = amp.autocast(42) end, {})
    H.raises(function() local _ <close> = amp.autocast() end, {})
    H.raises(function() local _ <close> = amp.autocast(true) end, {})
    assert.equal("f32", x:matmul(w).dtype)
  end)
end)

describe("mp.amp.register", function()
  it("register(\"relu\", \"f32\") makes relu of f16 give f32 under autocast; \"none\" undoes it", function()
    finally(function() amp.register("relu", "none") end)
    amp.register("relu", "f32")
    assert.equal("f32", amp.classes().relu)
    do
      local _ <close> = amp.autocast("f16")
      local y = mp.relu(mp.tensor({1.5, -1}):f16())
      assert.equal("f32", y.dtype)
      assert.same({1.5, 0}, vals(y))
    end
    -- outside a region the class does nothing
    assert.equal("f16", mp.relu(mp.tensor({1, -1}):f16()).dtype)
    amp.register("relu", "none")
    do
      local _ <close> = amp.autocast("f16")
      assert.equal("f16", mp.relu(mp.tensor({1, -1}):f16()).dtype)
    end
  end)

  it("register(\"relu\", \"low\") casts f32 inputs down", function()
    finally(function() amp.register("relu", "none") end)
    amp.register("relu", "low")
    local _ <close> = amp.autocast("bf16")
    assert.equal("bf16", mp.relu(mp.tensor({1, -1})).dtype)
  end)

  it("a built-in op can be moved to another class and back", function()
    finally(function() amp.register("exp", "f32") end)
    amp.register("exp", "none")
    local _ <close> = amp.autocast("f16")
    assert.equal("f16", mp.tensor({1}):f16():exp().dtype)
    amp.register("exp", "f32")
    assert.equal("f32", mp.tensor({1}):f16():exp().dtype)
  end)

  it("bad class or op name errors", function()
    H.raises(function() amp.register("relu", "fp32") end, {"class"})
    H.raises(function() amp.register("", "f32") end, {})
    H.raises(function() amp.register("nope", "low") end, {"mp.amp.register", "no op named 'nope'"})
    H.raises(function() amp.register(42, "f32") end, {})
    H.raises(function() amp.register("relu") end, {})
    assert.is_not.equal("fp32", amp.classes().relu)
  end)
end)

describe("the autocast cast cache", function()
  -- w is used by two matmuls in one region. With the cache both uses share one
  -- f16 copy of w, so the two gradient contributions meet in f16 before the cast's
  -- backward accumulates them into w's f32 .grad: 1 + 2^-11 rounds to 1 in f16
  -- (a tie, to even). Two separate casts would give 1 + 2^-11 exactly in f32.
  local function twice(dtype, tiny, same_region)
    local w = mp.tensor({{1}}, {requires_grad = true})
    local x1, x2 = mp.tensor({{1}}), mp.tensor({{tiny}})
    local y1, y2
    if same_region then
      local _ <close> = amp.autocast(dtype)
      y1 = x1:matmul(w)
      y2 = x2:matmul(w)
      assert.equal(dtype, y1.dtype)
    else
      do local _ <close> = amp.autocast(dtype); y1 = x1:matmul(w) end
      do local _ <close> = amp.autocast(dtype); y2 = x2:matmul(w) end
    end
    local loss = (y1 + y2):sum()
    loss:backward()
    assert.equal("f32", w.grad.dtype)
    return w.grad:item(), w
  end

  it("f16: a parameter used twice in one region is cast once (gradients meet in f16)", function()
    assert.equal(1, (twice("f16", 2 ^ -11, true)))
  end)

  it("f16: two regions cast twice (gradients meet in the f32 .grad)", function()
    assert.equal(1 + 2 ^ -11, (twice("f16", 2 ^ -11, false)))
  end)

  it("bf16: the same, at bf16's precision", function()
    assert.equal(1, (twice("bf16", 2 ^ -8, true)))
    assert.equal(1 + 2 ^ -8, (twice("bf16", 2 ^ -8, false)))
  end)

  it("an inner region of the same dtype shares the outer region's cache", function()
    local w = mp.tensor({{1}}, {requires_grad = true})
    do
      local _ <close> = amp.autocast("f16")
      local a = mp.tensor({{1}}):matmul(w)
      local b
      do
        local _ <close> = amp.autocast("f16")
        b = mp.tensor({{2 ^ -11}}):matmul(w)
      end
      (a + b):sum():backward()
    end
    assert.equal(1, w.grad:item())
  end)

  it("the gradient through the cache equals both uses' contributions computed in f32 (f16 tolerance)", function()
    mp.manual_seed(7)
    local w = mp.randn({3, 4}):requires_grad(true)
    local x1, x2 = mp.randn({2, 3}), mp.randn({5, 3})
    do
      local _ <close> = amp.autocast("f16")
      local l = x1:matmul(w):sum() + (x2:matmul(w) * 2):sum()
      l:backward()
    end
    assert.equal("f32", w.grad.dtype)
    -- dL/dw = x1^T 1 + 2 x2^T 1 (rows: column sums of x1 and 2*x2)
    local X1, X2 = x1:totable(), x2:totable()
    local want = {}
    for i = 1, 3 do
      local s = 0
      for r = 1, 2 do s = s + X1[r][i] end
      for r = 1, 5 do s = s + 2 * X2[r][i] end
      want[i] = {s, s, s, s}
    end
    H.assert_close(w.grad:totable(), want, 2e-3, 2e-3, "w.grad")
  end)

  -- linear's f16 input is kept widened (f32) with its storage for the weight
  -- gradient's GEMM; a view of the same bytes as bf16 must multiply as bf16, not
  -- reuse the f16 widening. In a child with oneDNN held to AVX2, where the CPU
  -- widens bf16 operands too (its gemm_wide) and the two could meet.
  it("a view as bf16 of a linear input kept widened multiplies as bf16; the kept copy gives the same grads", function()
    local code = [[
      mp.manual_seed(3)
      local w = mp.randn({4, 6}):requires_grad(true)
      local h = mp.randn({5, 6}):to("f16")
      local y
      do local _ <close> = mp.amp.autocast("f16"); y = mp.linear(h, w) end
      local v, m = h:view("bf16"), mp.randn({6, 3}):to("bf16")
      local a, b = mp.matmul(v, m):f32():totable(), mp.matmul(v:clone(), m):f32():totable()
      local same = true
      for i = 1, 5 do for j = 1, 3 do same = same and string.pack("<f", a[i][j]) == string.pack("<f", b[i][j]) end end
      y:sum():backward()
      -- dw = 1^T h (f16 sums rounded once), the same bits as a fresh GEMM of the f16 values
      local want = mp.matmul(mp.ones({4, 5}):to("f16"), h:clone()):f32():totable()
      local g = w.grad:totable()
      for i = 1, 4 do for j = 1, 6 do same = same and g[i][j] == want[i][j] end end
      return tostring(same)]]
    local r = H.child(code, false, {ONEDNN_MAX_CPU_ISA = "AVX2"})
    assert.are.equal("OK:true", r.out, r.err)
  end)

  -- only an input that is its whole storage is kept widened: a batch that is a
  -- view of a dataset held in f16 would otherwise keep the whole dataset widened
  it("a linear input that is a view of a larger f16 tensor is not kept widened with its storage", function()
    mp.manual_seed(4)
    local data = mp.randn({20000, 64}):to("f16")   -- 2.5 MB in f16; 5 MB widened
    local w = mp.randn({16, 64}):requires_grad(true)
    local before = mp.memory().in_use
    local y
    do local _ <close> = amp.autocast("f16"); y = mp.linear(data:narrow(1, 1, 8), w) end
    y:sum():backward()
    local grew = mp.memory().in_use - before
    assert.is_true(grew < 1e6, ("in use grew by %d bytes"):format(grew))
    assert.are.equal("f32", w.grad.dtype)
  end)

  -- an evaluation pass under no_grad, then a training pass, in one region: the
  -- cast made under no_grad has no autograd history and must not be reused when
  -- gradients are wanted (PyTorch issues 65766 / 112583, fixed there by PR 165068)
  it("a no_grad forward in the region does not poison the cache for a later grad-enabled forward", function()
    local w = mp.tensor({{2}}, {requires_grad = true})
    local x = mp.tensor({{3}})
    local y
    do
      local _ <close> = amp.autocast("f16")
      do
        local _ <close> = mp.no_grad()
        assert.equal(6, x:matmul(w):item())
      end
      y = x:matmul(w)
    end
    assert.equal("matmul", y.grad_fn)
    y:sum():backward()
    assert.is_not_nil(w.grad)
    assert.equal(3, w.grad:item())
  end)

  it("backward runs without autocast: an f32 graph's gradients stay exact inside a region", function()
    local w = mp.tensor({{1 + 2 ^ -20}}, {requires_grad = true})
    local x = mp.tensor({{1 + 2 ^ -21}})
    local loss = x:matmul(w):sum()   -- f32, outside any region
    do
      local _ <close> = amp.autocast("f16")
      loss:backward()
    end
    assert.equal(H.f32(1 + 2 ^ -21), w.grad:item())
  end)

  it("a full f16 step: master stays f32, its .grad is f32 and close to the f32 gradient", function()
    mp.manual_seed(3)
    local model = mp.nn.Linear(4, 3)
    local params = model:parameters()
    local x = mp.randn({8, 4})
    local y = mp.tensor({0, 1, 2, 0, 1, 2, 0, 1}, {dtype = "i32"})
    -- f32 reference gradients
    mp.cross_entropy(model(x), y):backward()
    local ref = {}
    for i, p in ipairs(params) do ref[i] = p.grad:totable(); p.grad = nil end
    do
      local _ <close> = amp.autocast("f16")
      local logits = model(x)
      assert.equal("f16", logits.dtype)
      local loss = mp.cross_entropy(logits, y)
      assert.equal("f32", loss.dtype)
      loss:backward()
    end
    for i, p in ipairs(params) do
      assert.equal("f32", p.dtype)
      assert.equal("f32", p.grad.dtype)
      H.assert_close(p.grad:totable(), ref[i], 1e-2, 2e-3, "param " .. i)
    end
  end)
end)

---------------------------------------------------------------- GradScaler steps

-- two parameters with names, an optimizer, and a scaler with telemetry names
local function rig(make_opt, policy)
  local w = mp.tensor({{0.5, -0.25}, {1.5, 2}}, {requires_grad = true})
  local b = mp.tensor({0.125, -1}, {requires_grad = true})
  local opt = make_opt({w, b})
  local sc = amp.GradScaler{policy = policy or P.dynamic{init = 1024, interval = 2}}
  sc:telemetry(false, {"w", "b"})
  return {w = w, b = b, opt = opt, sc = sc}
end

local function set_grads(r, gw, gb)
  r.w.grad = mp.tensor(gw)
  r.b.grad = mp.tensor(gb)
end

local function snapshot(r)
  local s = {w = bits(r.w), b = bits(r.b)}
  local sd = r.opt:state_dict()
  s.step = sd.param_groups[1].step
  for i, st in pairs(sd.state) do
    for k, t in pairs(st) do s["state" .. i + 1 .. "." .. k] = bits(t) end   -- state ids are 0-based
  end
  return s
end

describe("GradScaler: skipped steps", function()
  local function check_skips(make_opt, state_keys)
    local r = rig(make_opt)
    local skips = {}
    r.sc.on_skip = function(info) skips[#skips + 1] = info end
    -- 1: applied (creates the optimizer state)
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{1, 2}, {3, 4}}, {5, 6})
    assert.is_true(r.sc:step(r.opt))
    r.sc:update()
    local before = snapshot(r)
    for _, k in ipairs(state_keys) do assert.is_not_nil(before[k], k) end
    -- 2: inf in b -> "overflow", param b
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{1, 2}, {3, 4}}, {math.huge, 6})
    assert.is_false(r.sc:step(r.opt))
    r.sc:update()
    assert.same(before, snapshot(r))
    -- 3: NaN in w -> "nan", param w
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{1, 0 / 0}, {3, 4}}, {5, 6})
    assert.is_false(r.sc:step(r.opt))
    r.sc:update()
    assert.same(before, snapshot(r))
    -- 4: the loss itself is inf, the gradients finite -> "forward", no param
    r.sc:scale(mp.tensor(math.huge))
    set_grads(r, {{1, 2}, {3, 4}}, {5, 6})
    assert.is_false(r.sc:step(r.opt))
    r.sc:update()
    assert.same(before, snapshot(r))
    -- 5: a NaN loss is "forward" too
    r.sc:scale(mp.tensor(0 / 0))
    set_grads(r, {{1, 2}, {3, 4}}, {5, 6})
    assert.is_false(r.sc:step(r.opt))
    r.sc:update()
    assert.same(before, snapshot(r))

    assert.equal(4, #skips)
    assert.equal("overflow", skips[1].reason)
    assert.equal("b", skips[1].param)
    assert.equal("nan", skips[2].reason)
    assert.equal("w", skips[2].param)
    assert.equal("forward", skips[3].reason)
    assert.is_nil(skips[3].param)
    assert.equal("forward", skips[4].reason)
    local st = r.sc.stats
    assert.equal(5, st.steps)
    assert.equal(4, st.skipped)
    assert.equal("forward", st.last_skip_reason)
    assert.is_true(st.found_inf)
    -- 6: applied again, and it moves the weights
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{1, 2}, {3, 4}}, {5, 6})
    assert.is_true(r.sc:step(r.opt))
    r.sc:update()
    assert.are_not.same(before.w, snapshot(r).w)
    assert.are_not.same(before.step, snapshot(r).step)
    assert.equal(4, r.sc.stats.skipped)
    assert.equal(6, r.sc.stats.steps)
    return r
  end

  it("Adam: masters, exp_avg, exp_avg_sq and the step count are bit-identical", function()
    check_skips(function(ps) return mp.optim.Adam(ps, {lr = 0.01}) end,
      {"state1.exp_avg", "state1.exp_avg_sq", "state2.exp_avg", "state2.exp_avg_sq"})
  end)

  it("AdamW: the same (weight decay must not run on a skipped step)", function()
    check_skips(function(ps) return mp.optim.AdamW(ps, {lr = 0.01, weight_decay = 0.1}) end,
      {"state1.exp_avg", "state2.exp_avg_sq"})
  end)

  it("SGD with momentum and weight decay: masters and momentum buffers are bit-identical", function()
    check_skips(function(ps) return mp.optim.SGD(ps, {lr = 0.1, momentum = 0.9, weight_decay = 0.01}) end,
      {"state1.momentum_buffer", "state2.momentum_buffer"})
  end)

  it("without names on_skip gets a positional name", function()
    local p = mp.tensor({1, 2}, {requires_grad = true})
    local q = mp.tensor({3}, {requires_grad = true})
    local opt = mp.optim.SGD({p, q}, {lr = 0.1})
    local sc = amp.GradScaler{}
    local got
    sc.on_skip = function(info) got = info end
    sc:scale(mp.tensor(1.0))
    p.grad = mp.tensor({1, 2})
    q.grad = mp.tensor({-math.huge})
    assert.is_false(sc:step(opt))
    assert.equal("overflow", got.reason)
    assert.is_truthy(tostring(got.param):find("2", 1, true))
  end)

  it("names from model:named_parameters() name the first bad parameter", function()
    local model = mp.nn.Sequential(mp.nn.Linear(2, 3), mp.nn.ReLU(), mp.nn.Linear(3, 1))
    local _, names = model:named_parameters()
    local opt = mp.optim.SGD(model:parameters(), {lr = 0.1})
    local sc = amp.GradScaler{}
    sc:telemetry(false, names)
    local got
    sc.on_skip = function(info) got = info end
    sc:scale(mp.tensor(1.0))
    for _, p in ipairs(model:parameters()) do p.grad = mp.zeros(p.shape) end
    model:parameters()[3].grad = mp.full(model:parameters()[3].shape, 0 / 0)
    assert.is_false(sc:step(opt))
    assert.equal("nan", got.reason)
    assert.equal("2.weight", got.param)
  end)

  it("a real f16 overflow in backward is found, skipped and backed off", function()
    local w = mp.tensor({{1, 2}}, {requires_grad = true})
    local opt = mp.optim.SGD({w}, {lr = 0.1})
    local sc = amp.GradScaler{policy = P.dynamic{init = 2 ^ 20, interval = 100}}
    local reason
    sc.on_skip = function(info) reason = info.reason end
    local before = bits(w)
    do
      local _ <close> = amp.autocast("f16")
      local y = mp.tensor({{1}}):matmul(w)       -- f16
      sc:scale(y:sum()):backward()              -- dL/dy = 2^20: inf in f16
    end
    assert.is_false(sc:step(opt))
    sc:update()
    assert.equal("overflow", reason)
    assert.equal(before, bits(w))
    assert.equal(2 ^ 19, sc:get_scale())
  end)

  -- PyTorch's recipe: several scale(loss):backward() per step, then one step.
  -- A micro-batch whose loss was inf/NaN must not be forgotten because a later
  -- micro-batch's loss was finite (its gradients can be finite: that is what
  -- the "forward" reason is for).
  it("gradient accumulation: a non-finite loss in any micro-batch skips the step (reason forward)", function()
    local r = rig(function(ps) return mp.optim.SGD(ps, {lr = 0.1}) end)
    local reason
    r.sc.on_skip = function(info) reason = info.reason end
    local before = snapshot(r)
    r.sc:scale(mp.tensor(math.huge))     -- micro-batch 1: loss inf
    r.sc:scale(mp.tensor(1.0))           -- micro-batch 2: fine
    set_grads(r, {{1, 2}, {3, 4}}, {5, 6})
    assert.is_false(r.sc:step(r.opt))
    assert.equal("forward", reason)
    assert.same(before, snapshot(r))
  end)
end)

describe("GradScaler: unscale", function()
  it("a second unscale in one step errors", function()
    local r = rig(function(ps) return mp.optim.SGD(ps, {lr = 0.1}) end)
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{1, 2}, {3, 4}}, {5, 6})
    r.sc:unscale(r.opt)
    H.raises(function() r.sc:unscale(r.opt) end, {"unscale"})
    -- and the gradients were divided once
    assert.same({1 / 1024, 2 / 1024, 3 / 1024, 4 / 1024}, vals(r.w.grad))
    -- the next step may unscale again
    r.sc:step(r.opt)
    r.sc:update()
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{1, 2}, {3, 4}}, {5, 6})
    r.sc:unscale(r.opt)
  end)

  it("unscale then step: no second unscale, the step uses grad / scale exactly", function()
    local r = rig(function(ps) return mp.optim.SGD(ps, {lr = 1}) end, P.static(8))
    local w0 = vals(r.w)
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{3, -5}, {0.5, 12}}, {8, 1})
    r.sc:unscale(r.opt)
    local g = vals(r.w.grad)
    assert.same({3 / 8, -5 / 8, 0.5 / 8, 12 / 8}, g)
    assert.is_true(r.sc:step(r.opt))
    assert.same({3 / 8, -5 / 8, 0.5 / 8, 12 / 8}, vals(r.w.grad))
    local w1 = vals(r.w)
    for i = 1, 4 do assert.equal(H.f32(w0[i] - g[i]), w1[i]) end
    assert.same({1, 1 / 8}, vals(r.b.grad))
  end)

  it("step alone unscales once", function()
    local r = rig(function(ps) return mp.optim.SGD(ps, {lr = 1}) end, P.static(4))
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{4, 8}, {-4, 2}}, {1, 0})
    assert.is_true(r.sc:step(r.opt))
    assert.same({1, 2, -1, 0.5}, vals(r.w.grad))
  end)

  it("unscale that finds inf: step returns false and does not unscale again", function()
    local r = rig(function(ps) return mp.optim.SGD(ps, {lr = 1}) end, P.static(4))
    local before = snapshot(r)
    r.sc:scale(mp.tensor(1.0))
    set_grads(r, {{4, 8}, {-4, 2}}, {math.huge, 0})
    r.sc:unscale(r.opt)
    assert.is_true(r.sc.stats.found_inf)
    assert.is_false(r.sc:step(r.opt))
    assert.same({1, 2, -1, 0.5}, vals(r.w.grad))
    assert.same(before, snapshot(r))
  end)

  it("scale(loss) is loss * scale and its gradient is scaled", function()
    local w = mp.tensor({2}, {requires_grad = true})
    local sc = amp.GradScaler{policy = P.static(64)}
    local l = sc:scale((w * 3):sum())
    assert.equal(6 * 64, l:item())
    l:backward()
    assert.same({3 * 64}, vals(w.grad))
  end)
end)

---------------------------------------------------------------- telemetry

describe("GradScaler: telemetry", function()
  local function telemetry_rig(policy)
    local w = mp.tensor({0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {requires_grad = true})
    local b = mp.tensor({0, 0}, {requires_grad = true})
    local opt = mp.optim.SGD({w, b}, {lr = 0})
    local sc = amp.GradScaler{policy = policy or P.static(1024)}
    return w, b, opt, sc
  end

  -- scaled gradients: 3 zeros (one -0), 3 that f16 flushes (|x| <= 2^-25),
  -- 2 that overflow f16 (|x| >= 65520), 2 ordinary
  local GW = {0, 0, -0.0, 2 ^ -25, 2 ^ -30, -2 ^ -26, 65520, -70000, 1, -3}

  it("is off by default: telemetry_table() is nil and report() says so", function()
    local w, b, opt, sc = telemetry_rig()
    sc:scale(mp.tensor(1.0))
    w.grad = mp.tensor(GW)
    sc:step(opt)
    assert.is_nil(sc:telemetry_table())
    assert.is_string(sc:report())
    assert.is_falsy(sc:report():find("70000", 1, true))
  end)

  it("fractions, amax and histogram bins on constructed gradients", function()
    local w, b, opt, sc = telemetry_rig()
    sc:telemetry(true, {"w", "b"})
    sc:scale(mp.tensor(1.0))
    w.grad = mp.tensor(GW)
    b.grad = mp.tensor({2, 0})
    assert.is_true(sc:step(opt))
    local t = sc:telemetry_table()
    assert.is_table(t)
    local tw, tb = t.w, t.b
    assert.equal(10, tw.n)
    assert.equal(0.3, tw.zero_frac)
    assert.equal(0.3, tw.underflow_frac)
    assert.equal(0.2, tw.overflow_frac)
    assert.equal(70000 / 1024, tw.amax)          -- of the true gradient
    assert.equal(70000, tw.scaled_amax)
    assert.equal(-48, tw.hist_lo)
    -- bin i (1-based) counts 2^(i-1+lo) <= |x| < 2^(i+lo), clamped at both ends
    local function bin(x) return math.floor(math.log(x, 2)) - tw.hist_lo + 1 end
    local want = {}
    for i = 1, #tw.hist do want[i] = 0 end
    for _, v in ipairs(GW) do
      if v ~= 0 then
        local k = math.max(1, math.min(#tw.hist, bin(math.abs(v))))
        want[k] = want[k] + 1
      end
    end
    assert.same(want, tw.hist)
    -- a few by hand
    assert.equal(1, tw.hist[24])       -- 2^-25
    assert.equal(1, tw.hist[19])       -- 2^-30
    assert.equal(1, tw.hist[23])       -- 2^-26
    assert.equal(1, tw.hist[49])       -- 1
    assert.equal(1, tw.hist[50])       -- 3
    assert.equal(2, tw.hist[64])       -- 65520 (2^15..2^16) and 70000 (clamped)
    assert.equal(2, tb.n)
    assert.equal(0.5, tb.zero_frac)
    assert.equal(0, tb.underflow_frac)
    assert.equal(2 / 1024, tb.amax)
    assert.equal(1, tb.hist[50])
    -- the gradients were unscaled exactly
    assert.same({0, 0, -0.0, 2 ^ -35, 2 ^ -40, -2 ^ -36, 65520 / 1024, -70000 / 1024, 1 / 1024, -3 / 1024}, vals(w.grad))
  end)

  it("report() is a string naming each parameter", function()
    local w, b, opt, sc = telemetry_rig()
    sc:telemetry(true, {"layer.weight", "layer.bias"})
    sc:scale(mp.tensor(1.0))
    w.grad = mp.tensor(GW)
    b.grad = mp.tensor({2, 0})
    sc:step(opt)
    sc:update()
    local rep = sc:report()
    assert.is_string(rep)
    assert.is_truthy(rep:find("layer.weight", 1, true), rep)
    assert.is_truthy(rep:find("layer.bias", 1, true), rep)
    assert.is_truthy(rep:find("1024", 1, true), rep)
  end)

  it("turning telemetry off again: telemetry_table() is nil", function()
    local w, b, opt, sc = telemetry_rig()
    sc:telemetry(true, {"w", "b"})
    sc:scale(mp.tensor(1.0))
    w.grad = mp.tensor(GW)
    sc:step(opt)
    sc:update()
    sc:telemetry(false)
    sc:scale(mp.tensor(1.0))
    sc:step(opt)
    assert.is_nil(sc:telemetry_table())
  end)

  it("a Lua policy sees the fractions in info when telemetry is on", function()
    local seen
    local w, b, opt, sc = telemetry_rig({init = function() return 1024 end,
                                         update = function(self, info) seen = info; return info.scale end})
    sc:telemetry(true, {"w", "b"})
    sc:scale(mp.tensor(1.0))
    w.grad = mp.tensor(GW)
    b.grad = mp.tensor({2, 0})
    sc:step(opt)
    sc:update()
    assert.equal(4 / 12, seen.zero_frac)
    assert.equal(3 / 12, seen.underflow_frac)
    assert.equal(2 / 12, seen.overflow_frac)
    assert.equal(70000 / 1024, seen.grad_amax)
  end)

  -- the table describes the step that was measured, also after update() moved the scale
  it("telemetry_table() after update() still reports the measured step's true amax", function()
    local w, b, opt, sc = telemetry_rig(P.dynamic{init = 1024, interval = 1})
    sc:telemetry(true, {"w", "b"})
    sc:scale(mp.tensor(1.0))
    w.grad = mp.tensor(GW)
    b.grad = mp.tensor({2, 0})
    sc:step(opt)
    local t1 = sc:telemetry_table()
    assert.equal(70000 / 1024, t1.w.amax)
    sc:update()
    assert.equal(2048, sc:get_scale())
    local t2 = sc:telemetry_table()
    assert.equal(70000 / 1024, t2.w.amax)
    assert.equal(2 / 1024, t2.b.amax)
  end)

  -- f16 rounding in the backward pass: y = x @ w in f16, loss = sum(y) * 2^-40,
  -- scale 1024: dL/dy = 2^-30 in f32, which is rounded to f16 (0) for the f16 y:
  -- 4 values flushed to zero at that rounding point, so w.grad is all zeros.
  it("counts the gradients flushed to zero at the f16 rounding points of backward", function()
    local w = mp.tensor({{1, 1}}, {requires_grad = true})
    local opt = mp.optim.SGD({w}, {lr = 0})
    local sc = amp.GradScaler{policy = P.static(1024)}
    sc:telemetry(true, {"w"})
    do
      local _ <close> = amp.autocast("f16")
      local y = mp.tensor({{1}, {2}}):matmul(w)
      assert.equal("f16", y.dtype)
      sc:scale(y:sum() * 2 ^ -40):backward()
    end
    assert.same({0, 0}, vals(w.grad))
    sc:step(opt)
    local t, c = sc:telemetry_table()
    assert.equal(1, t.w.zero_frac)
    local flushed, rounded = 0, 0
    for _, v in pairs(c.backward) do flushed, rounded = flushed + v.flushed, rounded + v.rounded end
    assert.equal(4, flushed, "flushed to zero in backward")
    assert.is_true(rounded >= 4)
  end)
end)

---------------------------------------------------------------- schedules

describe("learning-rate schedules with the scaler", function()
  local function cosine_lr(base, min_lr, warmup, total, n)
    if n < warmup then return base * (n + 1) / warmup end
    local f = math.min(1, (n - warmup) / math.max(1, total - warmup))
    return min_lr + (base - min_lr) * 0.5 * (1 + math.cos(math.pi * f))
  end

  it("cosine with warmup advances only on applied scaler steps", function()
    local p = mp.tensor({1}, {requires_grad = true})
    local opt = mp.optim.SGD({p}, {lr = 0.1})
    opt:set_schedule(mp.optim.schedule.cosine{warmup = 2, total = 6, min_lr = 0.01})
    local sc = amp.GradScaler{policy = P.static(2)}
    local n = 0
    assert.is_true(H.close(opt.lr, cosine_lr(0.1, 0.01, 2, 6, 0), 1e-6, 0))
    for _, g in ipairs{1, math.huge, 1, 1, 0 / 0, 1, 1, 1, 1, math.huge, 1} do
      local lr_before = opt.lr
      local p_before = p:item()
      sc:scale(mp.tensor(1.0))
      p.grad = mp.tensor({g * 2})
      local applied = sc:step(opt)
      sc:update()
      assert.equal(g == 1, applied)
      if applied then
        n = n + 1
        -- the step used the lr from before the advance
        assert.equal(H.f32(p_before - H.f32(lr_before)), p:item())
      else
        assert.equal(lr_before, opt.lr)
        assert.equal(p_before, p:item())
      end
      assert.is_true(H.close(opt.lr, cosine_lr(0.1, 0.01, 2, 6, n), 1e-6, 0),
        string.format("after %d applied steps lr %.9g, expected %.9g", n, opt.lr, cosine_lr(0.1, 0.01, 2, 6, n)))
    end
    assert.equal(8, n)
    assert.is_true(H.close(opt.lr, 0.01, 1e-6, 0))
  end)

  it("cosine values by hand: warmup 0.05, 0.1, then 0.1, the midpoint, min_lr", function()
    local p = mp.tensor({1}, {requires_grad = true})
    local opt = mp.optim.SGD({p}, {lr = 0.1})
    opt:set_schedule(mp.optim.schedule.cosine{warmup = 2, total = 6, min_lr = 0.01})
    local lrs = {opt.lr}
    for _ = 1, 6 do
      p.grad = mp.tensor({0})
      opt:step()
      lrs[#lrs + 1] = opt.lr
    end
    local want = {0.05, 0.1, 0.1, 0.01 + 0.09 * 0.5 * (1 + math.cos(math.pi / 4)), 0.055,
                  0.01 + 0.09 * 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.01}
    H.assert_close(lrs, want, 1e-6, 0, "lr")
  end)

  it("linear and constant schedules skip with the scaler too", function()
    local p = mp.tensor({1}, {requires_grad = true})
    local opt = mp.optim.SGD({p}, {lr = 1})
    opt:set_schedule(mp.optim.schedule.linear{warmup = 0, total = 4, min_lr = 0})
    local sc = amp.GradScaler{policy = P.static(1)}
    local lrs = {}
    for _, g in ipairs{0, math.huge, 0, 0} do
      sc:scale(mp.tensor(1.0))
      p.grad = mp.tensor({g})
      sc:step(opt)
      sc:update()
      lrs[#lrs + 1] = opt.lr
    end
    H.assert_close(lrs, {0.75, 0.75, 0.5, 0.25}, 1e-6, 0, "linear lr")
    local q = mp.tensor({1}, {requires_grad = true})
    local o2 = mp.optim.SGD({q}, {lr = 0.3})
    o2:set_schedule(mp.optim.schedule.constant{})
    sc:scale(mp.tensor(1.0))
    q.grad = mp.tensor({0 / 0})
    sc:step(o2)
    assert.is_true(H.close(o2.lr, 0.3, 1e-6, 0))
  end)
end)
