-- nn_spec.lua: mp.nn modules: naming, shapes, default init, train/eval,
-- state_dict round trips, moving, and argument checking.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/nn_spec.lua

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn or require "mp.nn"

local function sorted_keys(t)
  local r = {}
  for k in pairs(t) do r[#r + 1] = k end
  table.sort(r)
  return r
end

local function values(t)
  local v = t:totable()
  if type(v) == "number" then return { v } end
  return H.flat(v)
end

local function mlp() return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)) end

describe("mp.nn", function()
  before_each(function()
    mp.manual_seed(123)
    mp.set_grad_enabled(true)
  end)

  describe("naming", function()
    it("Sequential(Linear, ReLU, Linear) names 0.weight 0.bias 2.weight 2.bias, in that order", function()
      local m = mlp()
      local map, names = m:named_parameters()
      assert.are.same({ "0.bias", "0.weight", "2.bias", "2.weight" }, sorted_keys(map))
      assert.are.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, names)
      local ps = m:parameters()
      assert.are.equal(4, #ps)
      for i, n in ipairs(names) do assert.is_true(rawequal(ps[i], map[n]), n) end
      assert.is_true(rawequal(map["0.weight"], m:get(1).weight))
      assert.is_true(rawequal(map["2.bias"], m:get(3).bias))
    end)

    it("a module of its own: fields register children and parameters in definition order", function()
      local Net = nn.Module:extend("Net")
      function Net:init()
        self.scale = mp.ones({ 1 }):requires_grad(true)   -- a leaf that requires grad: a parameter
        self.body = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        self.head = nn.Linear(3, 1, { bias = false })
        self.note = "not a parameter"
        self.buffer = mp.zeros { 3 }                       -- no requires_grad: a plain field
      end
      function Net:forward(x) return self.head(self.body(x)) * self.scale end
      local net = Net()
      local _, names = net:named_parameters()
      assert.are.same({ "scale", "body.0.weight", "body.0.bias", "head.weight" }, names)
      assert.are.equal("not a parameter", net.note)
      assert.are.same({ 3 }, net.buffer.shape)
      local y = net(mp.ones { 2, 3 })
      assert.are.same({ 2, 1 }, y.shape)
      assert.are.equal(2, #net:children())
      assert.are.equal(5, #net:modules())   -- net, body, body.0, body.1, head
    end)

    it("add_module and add_parameter declare explicitly; names with dots are refused", function()
      local m = nn.Module()
      m:add_parameter("w", mp.zeros { 2 })
      assert.is_true(m.w:requires_grad())   -- made a parameter
      m:add_module("inner", nn.Linear(2, 2))
      local _, names = m:named_parameters()
      assert.are.same({ "w", "inner.weight", "inner.bias" }, names)
      H.raises(function() m:add_module("a.b", nn.ReLU()) end, { "add_module", "dots" })
      H.raises(function() m:add_parameter("", mp.zeros { 1 }) end, { "add_parameter" })
      H.raises(function() m:add_parameter("forward", mp.zeros { 1 }) end, { "forward" })
      H.raises(function() m:add_parameter("x", mp.zeros({ 1 }, { dtype = "i32" })) end, { "float" })
      H.raises(function() m:add_parameter("y", mp.zeros({ 1 }):requires_grad(true) * 2) end, { "leaf" })
      H.raises(function() m:add_module("z", {}) end, { "module" })
    end)

    it("assigning to a parameter replaces it in place in the order; nil removes it", function()
      local l = nn.Linear(2, 2)
      local w = mp.zeros({ 2, 2 }):requires_grad(true)
      l.weight = w
      local _, names = l:named_parameters()
      assert.are.same({ "weight", "bias" }, names)
      assert.is_true(rawequal(w, l.weight))
      l.bias = nil
      _, names = l:named_parameters()
      assert.are.same({ "weight" }, names)
      assert.is_nil(l.bias)
      H.raises(function() l.weight = "x" end, { "parameter", "weight" })
    end)

    it("a module used twice appears once in parameters(), under each name in state_dict", function()
      local l = nn.Linear(2, 2)
      local m = nn.Sequential(l, nn.Tanh(), l)
      local _, names = m:named_parameters()
      assert.are.same({ "0.weight", "0.bias" }, names)
      assert.are.equal(2, #m:parameters())
      assert.are.same({ "0.bias", "0.weight", "2.bias", "2.weight" }, sorted_keys(m:state_dict()))
    end)

    it("Sequential: #seq, seq:get(i) 1-based, seq:add(m) names the next child", function()
      local s = nn.Sequential(nn.Linear(2, 2))
      assert.are.equal(1, #s)
      s:add(nn.ReLU()):add(nn.Linear(2, 1))
      assert.are.equal(3, #s)
      assert.are.equal("ReLU", s:get(2):type_name())
      local _, names = s:named_parameters()
      assert.are.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, names)
      H.raises(function() s:get(4) end, { "index" })
      H.raises(function() s:get(0) end, { "index" })
      assert.are.same({ 5, 1 }, s(mp.ones { 5, 2 }).shape)
      local empty = nn.Sequential()
      local x = mp.ones { 2 }
      assert.are.equal(x, empty(x))
    end)

    it("tostring shows the tree as PyTorch prints it", function()
      local s = tostring(nn.Sequential(nn.Linear(784, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 10, { bias = false })))
      assert.are.equal(table.concat({
        "Sequential(",
        "  (0): Linear(in_features=784, out_features=32, bias=true)",
        "  (1): ReLU()",
        "  (2): Dropout(p=0.1)",
        "  (3): Linear(in_features=32, out_features=10, bias=false)",
        ")" }, "\n"), s)
    end)
  end)

  describe("shapes and forward", function()
    it("Linear: weight {out,in}, bias {out}, f32 leaves that require grad", function()
      local l = nn.Linear(5, 3)
      assert.are.same({ 3, 5 }, l.weight.shape)
      assert.are.same({ 3 }, l.bias.shape)
      for _, p in ipairs(l:parameters()) do
        assert.are.equal("f32", p.dtype)
        assert.is_true(p.is_leaf)
        assert.is_true(p:requires_grad())
      end
      assert.are.same({ 7, 3 }, l(mp.ones { 7, 5 }).shape)
      assert.are.same({ 2, 4, 3 }, l(mp.ones { 2, 4, 5 }).shape)
      local x = mp.randn { 2, 5 }
      H.assert_close(l(x):totable(), mp.linear(x, l.weight, l.bias):totable(), 0, 0, "forward")
    end)

    it("Linear without bias has only a weight", function()
      local l = nn.Linear(5, 3, { bias = false })
      local _, names = l:named_parameters()
      assert.are.same({ "weight" }, names)
      assert.is_nil(l.bias)
      local x = mp.randn { 2, 5 }
      H.assert_close(l(x):totable(), mp.linear(x, l.weight):totable(), 0, 0, "forward")
    end)

    it("LayerNorm(d): weight ones, bias zeros, eps 1e-5", function()
      local ln = nn.LayerNorm(6)
      assert.are.same({ 1, 1, 1, 1, 1, 1 }, ln.weight:totable())
      assert.are.same({ 0, 0, 0, 0, 0, 0 }, ln.bias:totable())
      assert.are.equal(1e-5, ln.eps)
      local x = mp.randn { 3, 6 }
      H.assert_close(ln(x):totable(), mp.layer_norm(x, ln.weight, ln.bias, 1e-5):totable(), 0, 0, "forward")
      local plain = nn.LayerNorm(6, { elementwise_affine = false })
      assert.are.equal(0, #plain:parameters())
      assert.are.same({ 3, 6 }, plain(x).shape)
    end)

    it("RMSNorm(d): weight ones, no bias, eps f32's epsilon (PyTorch's None for f32)", function()
      local rms = nn.RMSNorm(6)
      assert.are.same({ 1, 1, 1, 1, 1, 1 }, rms.weight:totable())
      assert.is_nil(rms.bias)
      assert.are.equal(2 ^ -23, rms.eps)
      local keys = {}
      for k in pairs(rms:state_dict()) do keys[#keys + 1] = k end
      assert.are.same({ "weight" }, keys)   -- torch.nn.RMSNorm's, so checkpoints load with strict=True
      local x = mp.randn { 3, 6 }
      H.assert_close(rms(x):totable(), mp.rms_norm(x, rms.weight):totable(), 0, 0, "forward")
      H.assert_close(rms(x):totable(), mp.rms_norm(x, rms.weight, 2 ^ -23):totable(), 0, 0, "default eps")
      -- y = x / sqrt(mean(x^2) + eps) * w, by hand in double
      local w = mp.tensor({ 0.5, 1, 1.5, 2, 2.5, 3 })
      local xs, ys = x:totable(), mp.rms_norm(x, w, 1e-2):totable()
      for r = 1, 3 do
        local ss = 0
        for j = 1, 6 do ss = ss + xs[r][j] ^ 2 end
        for j = 1, 6 do
          local want = xs[r][j] / math.sqrt(ss / 6 + 1e-2) * (0.5 * j)
          assert.is_true(math.abs(ys[r][j] - want) <= 1e-5 * (1 + math.abs(want)), ("row %d col %d"):format(r, j))
        end
      end
      local plain = nn.RMSNorm({ 6 }, { eps = 1e-6, elementwise_affine = false })
      assert.are.equal(0, #plain:parameters())
      H.assert_close(plain(x):totable(), mp.rms_norm(x, nil, 1e-6):totable(), 0, 0, "no weight")
      assert.are.equal("RMSNorm((6,), eps=1e-06, elementwise_affine=false)", tostring(plain))
    end)

    it("mp.rms_norm's errors name it and the argument", function()
      local x = mp.randn { 2, 3 }
      for _, c in ipairs {
        { function() return mp.rms_norm(x, mp.ones { 2 }) end,
          "mp.rms_norm: weight {2} does not match input {2,3} (expected {3})" },
        { function() return mp.rms_norm(x, mp.ones { 3 }, 0) end, "mp.rms_norm: eps must be positive (got 0)" },
        { function() return mp.rms_norm(x, mp.ones { 3 }, -1e-6) end, "mp.rms_norm: eps must be positive (got -1e-06)" },
        { function() return mp.rms_norm(x, nil, 0 / 0) end, "mp.rms_norm: eps must be positive" },
        { function() return mp.rms_norm(x, mp.ones { 3 }, "big") end, "rms_norm' (number expected, got string)" },
        { function() return mp.rms_norm(mp.tensor({ 1, 2 }, { dtype = "i32" }), nil) end,
          "mp.rms_norm: input must be a float tensor (got i32)" },
        { function() return mp.rms_norm(x, mp.ones({ 3 }, { dtype = "f16" })) end,
          ("mp.rms_norm: weight is f16 on %s, input f32 on %s"):format(x.device, x.device) },
      } do
        local msg = H.raises(c[1], {})
        assert.is_truthy(msg:find(c[2], 1, true), "error is " .. msg .. "; expected it to contain " .. c[2])
      end
    end)

    it("Embedding(n, d): weight {n,d}; indices of any shape give {..., d}", function()
      local e = nn.Embedding(10, 4)
      assert.are.same({ 10, 4 }, e.weight.shape)
      local idx = mp.tensor({ { 0, 9, 3 }, { 3, 3, 1 } }, { dtype = "i32" })
      local y = e(idx)
      assert.are.same({ 2, 3, 4 }, y.shape)
      local w = e.weight:totable()
      H.assert_same(y:totable()[1][2], w[10], "row 9")
      H.assert_same(y:totable()[2][1], w[4], "row 3")
    end)

    it("ModuleList holds modules in order with PyTorch's names and no forward", function()
      local ml = nn.ModuleList { nn.Linear(4, 3), nn.ReLU() }
      ml:append(nn.Linear(3, 2)):extend { nn.Tanh() }
      assert.are.equal(4, #ml)
      assert.are.equal("Linear", ml[3]:type_name())
      assert.is_nil(ml[5])
      local n = 0
      for i, m in ipairs(ml) do n = i end
      assert.are.equal(4, n)
      local _, names = ml:named_parameters()
      assert.are.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, names)
      local x = mp.randn { 5, 4 }
      for _, m in ipairs(ml) do x = m(x) end
      assert.are.same({ 5, 2 }, x.shape)
      local sd = ml:state_dict()
      local ml2 = nn.ModuleList { nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2), nn.Tanh() }
      ml2:load_state_dict(sd)
      H.assert_same(ml2[1].weight:totable(), ml[1].weight:totable(), "loaded")
      H.raises(function() ml(x) end, { "ModuleList", "no forward" })
      H.raises(function() ml:append(3) end, { "mp.nn.ModuleList:append", "module" })
      H.raises(function() nn.ModuleList { 1 } end, { "entry 1 must be a module" })
      H.raises(function() nn.ModuleList(nn.ReLU()) end, { "list of modules" })
    end)

    it("activations match the functional ops", function()
      local x = mp.randn { 4, 5 }
      H.assert_same(nn.ReLU()(x):totable(), mp.relu(x):totable(), "relu")
      H.assert_same(nn.Tanh()(x):totable(), mp.tanh(x):totable(), "tanh")
      H.assert_same(nn.Sigmoid()(x):totable(), mp.sigmoid(x):totable(), "sigmoid")
      H.assert_same(nn.SiLU()(x):totable(), mp.silu(x):totable(), "silu")
      H.assert_same(nn.GELU()(x):totable(), mp.gelu(x):totable(), "gelu")
      H.assert_same(nn.GELU("tanh")(x):totable(), mp.gelu(x, { approximate = "tanh" }):totable(), "gelu tanh")
      H.assert_same(nn.GELU { approximate = "tanh" }(x):totable(), mp.gelu(x, { approximate = "tanh" }):totable(),
                    "gelu tanh (options)")
      H.assert_same(nn.Identity()(x):totable(), x:totable(), "identity")
    end)

    it("silu is x * sigmoid(x), computed in f32 and rounded once for f16/bf16", function()
      local vals = { -30, -4.5, -1, -0.25, 0, 0.125, 1, 3, 20 }
      local got = mp.silu(mp.tensor(vals)):totable()
      for i, v in ipairs(vals) do
        H.assert_close(got[i], v / (1 + math.exp(-v)), 1e-6, 1e-30, "silu(" .. v .. ")")
      end
      for _, dt in ipairs { "f16", "bf16" } do
        local x = mp.randn({ 7, 9 }):to(dt)
        H.assert_same(mp.silu(x):to("f32"):totable(), mp.silu(x:to("f32")):to(dt):to("f32"):totable(), dt)
      end
      H.raises(function() mp.silu(3) end, { "silu", "tensor expected" })
      -- under autocast it runs in its input's dtype, as in PyTorch (no class)
      local y
      do
        local _ <close> = mp.amp.autocast("f16")
        y = mp.silu(mp.randn { 2, 2 })
      end
      assert.are.equal("f32", y.dtype)
      assert.are.equal("silu", mp.silu(mp.randn({ 2 }):requires_grad(true)).grad_fn)
    end)

    it("gradients reach every parameter after backward; zero_grad clears them", function()
      local m = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3))
      local loss = mp.cross_entropy(m(mp.randn { 5, 4 }), mp.tensor({ 0, 1, 2, 1, 0 }, { dtype = "i32" }))
      loss:backward()
      local map, names = m:named_parameters()
      assert.are.equal(6, #names)
      for _, n in ipairs(names) do
        local g = map[n].grad
        assert.is_not_nil(g, n)
        assert.are.same(map[n].shape, g.shape, n)
      end
      assert.are.equal(m, m:zero_grad())
      for _, n in ipairs(names) do assert.is_nil(map[n].grad, n) end
    end)
  end)

  describe("default init", function()
    it("Linear: weight and bias uniform within +-1/sqrt(in), spread out, not all equal", function()
      local l = nn.Linear(100, 50)
      local bound = 1 / math.sqrt(100)
      for _, p in ipairs { l.weight, l.bias } do
        local v = values(p)
        local lo, hi, sum = math.huge, -math.huge, 0
        for _, x in ipairs(v) do
          lo, hi, sum = math.min(lo, x), math.max(hi, x), sum + x
        end
        assert.is_true(lo >= -bound * (1 + 1e-6) and hi <= bound * (1 + 1e-6), "outside the bound")
        assert.is_true(lo ~= hi, "all equal")
        if #v >= 1000 then
          assert.is_true(lo < -0.9 * bound and hi > 0.9 * bound, "does not fill the interval")
          assert.is_true(math.abs(sum / #v) < 0.05 * bound, "not centred")
        end
      end
      -- the bound follows in_features, not out_features
      local wide = values(nn.Linear(4, 300).weight)
      local amax = 0
      for _, x in ipairs(wide) do amax = math.max(amax, math.abs(x)) end
      assert.is_true(amax <= 0.5 * (1 + 1e-6) and amax > 0.45)
    end)

    it("Embedding: weight ~ N(0, 1)", function()
      local v = values(nn.Embedding(100, 50).weight)
      local sum, sq = 0, 0
      for _, x in ipairs(v) do sum, sq = sum + x, sq + x * x end
      local mean = sum / #v
      local sd = math.sqrt(sq / #v - mean * mean)
      assert.is_true(math.abs(mean) < 0.05, "mean " .. mean)
      assert.is_true(math.abs(sd - 1) < 0.05, "sd " .. sd)
    end)

    it("mp.manual_seed makes the init reproducible", function()
      mp.manual_seed(42)
      local a = mlp()
      mp.manual_seed(42)
      local b = mlp()
      local ma, names = a:named_parameters()
      local mb = b:named_parameters()
      for _, n in ipairs(names) do H.assert_same(ma[n]:totable(), mb[n]:totable(), n) end
      local c = mlp()
      assert.are_not.same(ma["0.weight"]:totable(), c:named_parameters()["0.weight"]:totable())
    end)
  end)

  describe("train and eval", function()
    it("a new module trains; eval and train set the flag on every descendant and return the module", function()
      local inner = nn.Sequential(nn.Dropout(0.5), nn.Linear(2, 2))
      local m = nn.Sequential(nn.Linear(2, 2), inner)
      for _, x in ipairs(m:modules()) do assert.is_true(x.training) end
      assert.are.equal(m, m:eval())
      for _, x in ipairs(m:modules()) do assert.is_false(x.training) end
      assert.are.equal(m, m:train())
      for _, x in ipairs(m:modules()) do assert.is_true(x.training) end
      m:train(false)
      assert.is_false(inner:get(1).training)
      inner:train()
      assert.is_false(m.training)
      assert.is_true(inner:get(1).training)
      H.raises(function() m:train("yes") end, { "boolean" })
    end)

    it("Dropout drops and rescales while training and is the identity in eval", function()
      local d = nn.Dropout(0.5)
      local x = mp.ones { 1000 }
      local y = values(d(x))
      local zeros = 0
      for _, v in ipairs(y) do
        assert.is_true(v == 0 or v == 2, "value " .. v)
        if v == 0 then zeros = zeros + 1 end
      end
      assert.is_true(zeros > 400 and zeros < 600, zeros .. " zeros of 1000")
      d:eval()
      H.assert_same(values(d(x)), values(x), "eval")
      local m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.9)):eval()
      local z = mp.randn { 4, 3 }
      H.assert_same(m(z):totable(), m:get(1)(z):totable(), "dropout inside eval Sequential")
    end)
  end)

  describe("state_dict and load_state_dict", function()
    it("state_dict: every name, detached tensors sharing the parameters' values", function()
      local m = mlp()
      local sd = m:state_dict()
      assert.are.same({ "0.bias", "0.weight", "2.bias", "2.weight" }, sorted_keys(sd))
      local map, names = m:named_parameters()
      for _, n in ipairs(names) do
        assert.is_false(sd[n]:requires_grad(), n)
        assert.is_nil(sd[n].grad_fn, n)
        H.assert_same(sd[n]:totable(), map[n]:totable(), n)
      end
    end)

    it("round trip: values copied into the same tensors, outputs equal", function()
      local a, b = mlp(), mlp()
      local before = b:named_parameters()
      local r = b:load_state_dict(a:state_dict())
      assert.are.same({}, r.missing_keys)
      assert.are.same({}, r.unexpected_keys)
      local ma, names = a:named_parameters()
      local mb = b:named_parameters()
      for _, n in ipairs(names) do
        assert.is_true(rawequal(before[n], mb[n]), n .. " kept its identity")
        assert.is_true(mb[n]:requires_grad() and mb[n].is_leaf, n)
        H.assert_same(mb[n]:totable(), ma[n]:totable(), n)
      end
      local x = mp.randn { 3, 4 }
      H.assert_same(b(x):totable(), a(x):totable(), "outputs")
      -- b still trains: gradients reach the loaded parameters
      b(x):sum():backward()
      assert.is_not_nil(mb["0.weight"].grad)
      -- a's own state_dict loads into a too (it shares a's storage)
      local sd = a:state_dict()
      a:load_state_dict(sd)
      H.assert_same(a:named_parameters()["0.weight"]:totable(), ma["0.weight"]:totable(), "self load")
    end)

    it("a state_dict taken earlier shows values loaded later (it shares storage)", function()
      local a, b = mlp(), mlp()
      local sd = a:state_dict()
      a:load_state_dict(b:state_dict())
      H.assert_same(sd["0.weight"]:totable(), b:named_parameters()["0.weight"]:totable(), "shared")
    end)

    it("values of another float dtype are converted into the parameter's dtype", function()
      local a, b = mlp(), mlp()
      local sd = a:state_dict()
      local half = {}
      for k, v in pairs(sd) do half[k] = v:f16() end
      b:load_state_dict(half)
      local w = b:named_parameters()["0.weight"]
      assert.are.equal("f32", w.dtype)
      H.assert_same(w:totable(), half["0.weight"]:f32():totable(), "f16 values")
    end)

    it("strict loading names the missing and unexpected keys and changes nothing", function()
      local a, b = mlp(), mlp()
      local keep = values(b:named_parameters()["0.weight"])
      local sd = a:state_dict()
      sd["2.bias"] = nil
      sd["3.weight"] = mp.zeros { 1 }
      local msg = H.raises(function() b:load_state_dict(sd) end, { "load_state_dict", "missing", "2.bias",
                                                                  "unexpected", "3.weight" })
      assert.is_truthy(msg)
      H.assert_same(values(b:named_parameters()["0.weight"]), keep, "untouched")
      local r = b:load_state_dict(sd, { strict = false })
      assert.are.same({ "2.bias" }, r.missing_keys)
      assert.are.same({ "3.weight" }, r.unexpected_keys)
      H.assert_same(values(b:named_parameters()["0.weight"]), values(a:named_parameters()["0.weight"]), "loaded")
    end)

    it("a shape mismatch or a non-tensor is refused before anything is written", function()
      local a, b = mlp(), mlp()
      local keep = values(b:named_parameters()["0.weight"])
      local sd = a:state_dict()
      sd["2.weight"] = mp.zeros { 3, 2 }
      H.raises(function() b:load_state_dict(sd) end, { "size mismatch", "2.weight", "{3,2}", "{2,3}" })
      H.assert_same(values(b:named_parameters()["0.weight"]), keep, "untouched")
      sd = a:state_dict()
      sd["0.bias"] = { 1, 2, 3 }
      H.raises(function() b:load_state_dict(sd) end, { "0.bias", "tensor" })
      sd["0.bias"] = mp.zeros({ 3 }, { dtype = "i32" })
      H.raises(function() b:load_state_dict(sd) end, { "0.bias", "float" })
      H.raises(function() b:load_state_dict("x") end, { "table" })
      H.raises(function() b:load_state_dict({}, { stric = false }) end, { "unknown option" })
    end)

    it("loading after an optimizer was made: the optimizer steps from the loaded values", function()
      if not mp.optim then pending("mp.optim is not there yet") return end
      local a, b = mlp(), mlp()
      local opt = mp.optim.SGD(b:parameters(), { lr = 0.5 })
      b:load_state_dict(a:state_dict())
      local ma, names = a:named_parameters()
      local mb = b:named_parameters()
      for _, n in ipairs(names) do mb[n].grad = mp.ones(mb[n].shape) end
      opt:step()
      for _, n in ipairs(names) do
        H.assert_close(mb[n]:totable(), (ma[n] - 0.5):totable(), 1e-6, 1e-7, n)
      end
    end)

    it("restores a model whose parameters went NaN", function()
      local l = nn.Linear(2, 2)
      local good = l:state_dict()
      for k, v in pairs(good) do good[k] = v:clone() end
      l:load_state_dict { weight = mp.full({ 2, 2 }, 0 / 0), bias = mp.full({ 2 }, 1 / 0) }
      assert.is_true(l.weight:totable()[1][1] ~= l.weight:totable()[1][1], "NaN loaded")
      l:load_state_dict(good)
      H.assert_same(l.weight:totable(), good.weight:totable(), "weight restored")
      H.assert_same(l.bias:totable(), good.bias:totable(), "bias restored")
    end)

    it("round trip through mp.save and mp.load", function()
      if not (mp.save and mp.load) then pending("mp.save / mp.load are not there yet") return end
      local a, b = mlp(), mlp()
      local path = os.tmpname()
      mp.save(path, { model = a:state_dict(), step = 3 })
      local ck = mp.load(path)
      os.remove(path)
      b:load_state_dict(ck.model)
      local ma, names = a:named_parameters()
      local mb = b:named_parameters()
      for _, n in ipairs(names) do H.assert_same(mb[n]:totable(), ma[n]:totable(), n) end
    end)
  end)

  describe("to", function()
    it("to the device the parameters are on keeps them as they are", function()
      local m = mlp()
      local before, names = m:named_parameters()
      assert.are.equal(m, m:to(mp.default_device()))
      assert.are.equal(m, m:to("f32"))
      local after = m:named_parameters()
      for _, n in ipairs(names) do assert.is_true(rawequal(before[n], after[n]), n) end
    end)

    it("to another dtype replaces each parameter by a converted leaf that requires grad, grads too", function()
      local m = mlp()
      m(mp.randn { 2, 4 }):sum():backward()
      local before = m:named_parameters()
      m:to("f16")
      local after, names = m:named_parameters()
      for _, n in ipairs(names) do
        local p = after[n]
        assert.are.equal("f16", p.dtype, n)
        assert.is_true(p.is_leaf and p:requires_grad(), n)
        assert.are.equal("f16", p.grad.dtype, n)
        H.assert_same(p:totable(), before[n]:f16():totable(), n)
      end
      assert.are.same({ 3, 2 }, m(mp.randn({ 3, 4 }, { dtype = "f16" })).shape)
      m:to("f32")
      assert.are.equal("f32", m:get(1).weight.dtype)
    end)

    it("refuses integer dtypes, unknown names and unavailable devices clearly", function()
      local m = mlp()
      H.raises(function() m:to("i32") end, { "Module:to", "float" })
      H.raises(function() m:to("gpu0") end, { "Module:to" })
      H.raises(function() m:to() end, { "Module:to" })
      if not mp.cuda.is_available() then
        H.raises(function() m:to("cuda") end, { "Module:to", "cuda" })
        assert.are.equal("cpu", m:get(1).weight.device)
      end
    end)
  end)

  describe("bad constructor arguments", function()
    local cases = {
      { "Linear in_features -1", function() return nn.Linear(-1, 3) end,
        "mp.nn.Linear: in_features must be a positive integer (got -1)" },
      { "Linear in_features 0", function() return nn.Linear(0, 3) end, "in_features must be a positive integer (got 0)" },
      { "Linear in_features 2.5", function() return nn.Linear(2.5, 3) end, "in_features must be a positive integer (got 2.5)" },
      { "Linear in_features string", function() return nn.Linear("a", 3) end, 'in_features must be a positive integer (got "a")' },
      { "Linear out_features nil", function() return nn.Linear(3) end, "out_features must be a positive integer (got nil)" },
      { "Linear bias not boolean", function() return nn.Linear(3, 3, { bias = "yes" }) end, "option bias must be a boolean" },
      { "Linear unknown option", function() return nn.Linear(3, 3, { bais = true }) end, "mp.nn.Linear: unknown option 'bais'" },
      { "Linear options not a table", function() return nn.Linear(3, 3, true) end, "options must be a table" },
      { "Dropout p -0.1", function() return nn.Dropout(-0.1) end, "mp.nn.Dropout: p must be a number in [0, 1] (got -0.1)" },
      { "Dropout p 1.5", function() return nn.Dropout(1.5) end, "p must be a number in [0, 1] (got 1.5)" },
      { "Dropout p NaN", function() return nn.Dropout(0 / 0) end, "p must be a number in [0, 1]" },
      { "Dropout p string", function() return nn.Dropout("x") end, "p must be a number in [0, 1]" },
      { "LayerNorm 0", function() return nn.LayerNorm(0) end, "mp.nn.LayerNorm: normalized_shape must be a positive integer (got 0)" },
      { "LayerNorm eps 0", function() return nn.LayerNorm(3, { eps = 0 }) end, "eps must be positive" },
      { "RMSNorm 0", function() return nn.RMSNorm(0) end, "mp.nn.RMSNorm: normalized_shape must be a positive integer (got 0)" },
      { "RMSNorm eps -1", function() return nn.RMSNorm(3, { eps = -1 }) end, "mp.nn.RMSNorm: eps must be positive (got -1)" },
      { "RMSNorm bias option", function() return nn.RMSNorm(3, { bias = true }) end, "mp.nn.RMSNorm: unknown option 'bias'" },
      { "Embedding n 0", function() return nn.Embedding(0, 3) end, "mp.nn.Embedding: num_embeddings must be a positive integer (got 0)" },
      { "Embedding d -2", function() return nn.Embedding(3, -2) end, "embedding_dim must be a positive integer (got -2)" },
      { "GELU bad form", function() return nn.GELU("fast") end, 'mp.nn.GELU: approximate must be "none" or "tanh" (got "fast")' },
      { "Sequential non-module", function() return nn.Sequential(nn.ReLU(), 3) end, "mp.nn.Sequential: argument 2 must be a module (got 3)" },
    }
    for _, c in ipairs(cases) do
      it(c[1], function()
        local msg = H.raises(c[2], {})
        assert.is_truthy(msg:find(c[3], 1, true), "error is " .. msg .. "; expected it to contain " .. c[3])
        -- the message points at the caller's line, not into nn.lua
        assert.is_falsy(msg:find("nn.lua", 1, true), msg)
      end)
    end

    it("sizes given as integral floats are accepted", function()
      local l = nn.Linear(4.0, 2.0)
      assert.are.same({ 2, 4 }, l.weight.shape)
      assert.are.equal("integer", math.type(l.in_features))
    end)

    it("a module without forward says so", function()
      H.raises(function() nn.Module()(mp.ones { 1 }) end, { "forward is not implemented" })
    end)
  end)
end)
