-- rnn_spec.lua: mp.nn.LSTM and mp.nn.GRU, and the fused cells under them
-- (mp.lstm_cell, mp.gru_cell). The fixtures (tests/reference/make_rnn_fixture.py)
-- hold PyTorch's outputs and gradients for the same weights, loaded through the
-- state dict by PyTorch's names; ours must match to 1e-4 (relative to each
-- tensor's largest value), and under autocast to a low-precision tolerance.
-- Runs on the default device: under MP_DEVICE=cuda on the emulated device too.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn

local DIR = H.root .. "/tests/reference/fixtures/"
local RTOL = 1e-4

local function load_fixture(name)
  local t, meta = mp.load(DIR .. name .. ".safetensors")
  for k, v in pairs(t) do t[k] = v:to(mp.default_device()) end
  return t, meta
end

local function module_for(fx, meta)
  local cls = meta.kind == "lstm" and nn.LSTM or nn.GRU
  local m = cls(tonumber(meta.input_size), tonumber(meta.hidden_size),
                { num_layers = tonumber(meta.num_layers), bias = meta.bias == "1", batch_first = meta.batch_first == "1" })
  local sd = {}
  for k, t in pairs(fx) do
    local name = k:match("^param%.(.*)$")
    if name then sd[name] = t end
  end
  m:load_state_dict(sd)   -- strict: PyTorch's names and shapes one to one
  return m:to(mp.default_device())
end

-- forward and backward of the fixture's loss; returns the outputs and the leaves
local function run(fx, meta, m, dtype)
  local x = fx["input.x"]:clone():detach():requires_grad(true)
  local h0 = fx["input.h0"] and fx["input.h0"]:clone():detach():requires_grad(true)
  local c0 = fx["input.c0"] and fx["input.c0"]:clone():detach():requires_grad(true)
  local out, hn, cn
  do
    local _ <close> = dtype and mp.amp.autocast(dtype) or nil
    if meta.kind == "lstm" then
      local st
      out, st = m(x, h0 and { h0, c0 } or nil)
      hn, cn = st[1], st[2]
    else
      out, hn = m(x, h0)
    end
  end
  local loss = (out:to("f32") * fx["input.r_out"]):sum() + (hn:to("f32") * fx["input.r_h"]):sum()
  if cn then loss = loss + (cn:to("f32") * fx["input.r_c"]):sum() end
  loss:backward()
  return { output = out, h_n = hn, c_n = cn, loss = loss }, { x = x, h0 = h0, c0 = c0 }
end

local function check(fx, meta, m, res, lv, tol)
  local function match(what, ours, ref)
    assert(ours, what .. ": missing")
    assert.are.same(ref.shape, ours.shape, what .. ": shape")
    local e = H.rel_err(ours, ref)
    assert(e <= tol, string.format("%s %s: relative error %.3g > %g", meta.kind, what, e, tol))
  end
  -- the loss is a sum of terms that cancel (its error relative to itself says
  -- little in low precision): compared in f32 only, the outputs always
  if tol <= RTOL then match("loss", res.loss, fx.loss) end
  for _, k in ipairs { "output", "h_n", "c_n" } do
    if fx["out." .. k] then match(k, res[k], fx["out." .. k]) end
  end
  local n = 0
  local params = m:named_parameters()
  for k, ref in pairs(fx) do
    local name = k:match("^grad%.(.*)$")
    if name then
      local t = lv[name] or params[name]
      assert(t, "no tensor for " .. k)
      match(k, t.grad, ref)
      n = n + 1
    end
  end
  assert(n >= 3, "too few gradients checked")
end

describe("mp.nn.LSTM and mp.nn.GRU", function()
  it("have PyTorch's parameter names, shapes, order and init", function()
    mp.manual_seed(3)
    local m = nn.LSTM(5, 8, { num_layers = 2 })
    local map, names = m:named_parameters()
    local shapes = {}
    for i, name in ipairs(names) do shapes[i] = map[name].shape end
    assert.are.same({ "weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                      "weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1" }, names)
    assert.are.same({ { 32, 5 }, { 32, 8 }, { 32 }, { 32 }, { 32, 8 }, { 32, 8 }, { 32 }, { 32 } }, shapes)
    local bound = 1 / math.sqrt(8)
    for _, p in pairs(map) do
      assert.is_true(p:abs():max():item() <= bound)
      assert.is_true(p:abs():max():item() > 0.8 * bound)   -- spread over the whole range
    end
    local g = nn.GRU(4, 6, { bias = false })
    map, names = g:named_parameters()
    shapes = {}
    for i, name in ipairs(names) do shapes[i] = map[name].shape end
    assert.are.same({ "weight_ih_l0", "weight_hh_l0" }, names)
    assert.are.same({ { 18, 4 }, { 18, 6 } }, shapes)
    assert.are.equal("LSTM(5, 8, num_layers=2)", tostring(m):match("^[^\n]*"))
  end)

  it("refuse bad arguments, naming the function and argument", function()
    H.raises(function() nn.LSTM(0, 4) end, { "mp.nn.LSTM", "input_size" })
    H.raises(function() nn.GRU(3, 2.5) end, { "mp.nn.GRU", "hidden_size" })
    H.raises(function() nn.LSTM(3, 4, { num_layers = 0 }) end, { "mp.nn.LSTM", "num_layers" })
    H.raises(function() nn.LSTM(3, 4, { dropout = 1 }) end, { "mp.nn.LSTM", "dropout" })
    H.raises(function() nn.GRU(3, 4, { bidirectional = true }) end, { "mp.nn.GRU", "bidirectional is not supported" })
    H.raises(function() nn.LSTM(3, 4, { hidden = 3 }) end, { "mp.nn.LSTM", "hidden" })
    local m = nn.LSTM(3, 4)
    H.raises(function() m(mp.zeros { 5, 2, 4 }) end, { "mp.nn.LSTM", "input_size 3" })
    H.raises(function() m(mp.zeros { 5 }) end, { "mp.nn.LSTM", "3-d" })
    H.raises(function() m(mp.zeros { 5, 2, 3 }, { mp.zeros { 1, 3, 4 } }) end, { "mp.nn.LSTM", "h0", "{1,2,4}" })
    H.raises(function() m(mp.zeros { 5, 2, 3 }, mp.zeros { 1, 2, 4 }) end, { "mp.nn.LSTM", "{h0, c0}" })
    local g = nn.GRU(3, 4)
    H.raises(function() g(mp.zeros { 5, 2, 3 }, mp.zeros { 2, 2, 4 }) end, { "mp.nn.GRU", "h0" })
  end)

  for _, name in ipairs { "rnn_lstm", "rnn_lstm_bf", "rnn_gru" } do
    it("match PyTorch's outputs and gradients: " .. name, function()
      local fx, meta = load_fixture(name)
      local m = module_for(fx, meta)
      local res, lv = run(fx, meta, m)
      assert.are.equal("f32", res.output.dtype)
      check(fx, meta, m, res, lv, RTOL)
    end)
  end

  for _, dt in ipairs { "f16", "bf16" } do
    it("match PyTorch under autocast " .. dt .. " (low-precision GEMMs and cells, f32 weights)", function()
      for _, name in ipairs { "rnn_lstm", "rnn_gru" } do
        local fx, meta = load_fixture(name)
        local m = module_for(fx, meta)
        local res, lv = run(fx, meta, m, dt)
        assert.are.equal(dt, res.output.dtype)
        assert.are.equal("f32", m.weight_ih_l0.grad.dtype)
        check(fx, meta, m, res, lv, dt == "f16" and 1e-2 or 3e-2)
      end
    end)
  end

  it("keep the state dict's names, and load their own state dict", function()
    mp.manual_seed(5)
    local a, b = nn.GRU(3, 4, { num_layers = 2 }), nn.GRU(3, 4, { num_layers = 2 })
    b:load_state_dict(a:state_dict())
    local x = mp.randn { 4, 2, 3 }
    local ya, ha = a(x)
    local yb, hb = b(x)
    assert.are.equal(0, H.rel_err(ya, yb))
    assert.are.equal(0, H.rel_err(ha, hb))
  end)

  it("take batch_first and unbatched inputs, and the shapes PyTorch gives", function()
    mp.manual_seed(6)
    local m = nn.LSTM(3, 5, { num_layers = 2 })
    local x = mp.randn { 7, 2, 3 }
    local y, st = m(x)
    assert.are.same({ 7, 2, 5 }, y.shape)
    assert.are.same({ 2, 2, 5 }, st[1].shape)
    assert.are.same({ 2, 2, 5 }, st[2].shape)
    -- unbatched {seq, in}: the first batch row's results
    local y1, st1 = m(x:select(2, 1))
    assert.are.same({ 7, 5 }, y1.shape)
    assert.are.same({ 2, 5 }, st1[1].shape)
    assert.is_true(H.rel_err(y1, y:select(2, 1)) < 1e-6)
    -- batch_first over the same weights: the transposed results
    local bf = nn.LSTM(3, 5, { num_layers = 2, batch_first = true })
    bf:load_state_dict(m:state_dict())
    local yb, stb = bf(x:transpose(1, 2))
    assert.are.same({ 2, 7, 5 }, yb.shape)
    assert.is_true(H.rel_err(yb:transpose(1, 2), y) < 1e-6)
    assert.is_true(H.rel_err(stb[2], st[2]) < 1e-6)
    -- a state carried over: two halves give the whole
    local ya, sa = m(x:narrow(1, 1, 3))
    local yb2 = m(x:narrow(1, 4, 4), sa)
    assert.is_true(H.rel_err(mp.cat({ ya, yb2 }, 1), y) < 1e-6)
  end)

  it("apply dropout between layers, only while training", function()
    mp.manual_seed(7)
    local x = mp.randn { 6, 3, 4 }
    local one = nn.GRU(4, 8, { dropout = 0.5 })          -- one layer: nothing between layers
    assert.are.equal(0, H.rel_err(one(x), one:eval()(x)))
    local two = nn.LSTM(4, 8, { num_layers = 2, dropout = 0.5 })
    local y_train = two(x)
    two:eval()
    local y1, y2 = two(x), two(x)
    assert.are.equal(0, H.rel_err(y1, y2))                -- eval: deterministic
    assert.is_true(H.rel_err(y_train, y1) > 1e-3)         -- training: the mask changed the second layer
  end)
end)

describe("mp.lstm_cell and mp.gru_cell", function()
  it("compute PyTorch's cells (written out with ops) and their gradients", function()
    mp.manual_seed(8)
    local B, Hd = 3, 5
    local g = mp.randn({ B, 4 * Hd }, { requires_grad = true })
    local c = mp.randn({ B, Hd }, { requires_grad = true })
    local h1, c1 = mp.lstm_cell(g, c)
    local function gate(k) return g:narrow(2, k * Hd + 1, Hd) end
    local i, f, gg, o = mp.sigmoid(gate(0)), mp.sigmoid(gate(1)), mp.tanh(gate(2)), mp.sigmoid(gate(3))
    local c_ref = f * c + i * gg
    local h_ref = o * mp.tanh(c_ref)
    assert.is_true(H.rel_err(c1, c_ref) < 1e-6)
    assert.is_true(H.rel_err(h1, h_ref) < 1e-6)
    local w1, w2 = mp.randn { B, Hd }, mp.randn { B, Hd }
    local dg_ref, dc_ref = table.unpack(mp.autograd.grad({ (h_ref * w1):sum() + (c_ref * w2):sum() }, { g, c }))
    local dg, dc = table.unpack(mp.autograd.grad({ (h1 * w1):sum() + (c1 * w2):sum() }, { g, c }))
    assert.is_true(H.rel_err(dg, dg_ref) < 1e-5)
    assert.is_true(H.rel_err(dc, dc_ref) < 1e-5)

    local gi = mp.randn({ B, 3 * Hd }, { requires_grad = true })
    local gh = mp.randn({ B, 3 * Hd }, { requires_grad = true })
    local hp = mp.randn({ B, Hd }, { requires_grad = true })
    local hy = mp.gru_cell(gi, gh, hp)
    local function part(t, k) return t:narrow(2, k * Hd + 1, Hd) end
    local r = mp.sigmoid(part(gi, 0) + part(gh, 0))
    local z = mp.sigmoid(part(gi, 1) + part(gh, 1))
    local n = mp.tanh(part(gi, 2) + r * part(gh, 2))
    local h_gru = (1 - z) * n + z * hp
    assert.is_true(H.rel_err(hy, h_gru) < 1e-6)
    local ref = mp.autograd.grad({ (h_gru * w1):sum() }, { gi, gh, hp })
    local ours = mp.autograd.grad({ (hy * w1):sum() }, { gi, gh, hp })
    for k = 1, 3 do assert.is_true(H.rel_err(ours[k], ref[k]) < 1e-5) end
  end)

  it("pass gradcheck in f64 (on the CPU)", function()
    if mp.default_device() ~= "cpu" then pending("f64 is the CPU's") return end
    mp.manual_seed(9)
    local opt = { dtype = "f64", requires_grad = true }
    local g, c = mp.randn({ 2, 12 }, opt), mp.randn({ 2, 3 }, opt)
    assert.is_true(mp.autograd.gradcheck(function(a, b)
      local h, cc = mp.lstm_cell(a, b)
      return { h, cc }
    end, { g, c }))
    local gi, gh, hp = mp.randn({ 2, 9 }, opt), mp.randn({ 2, 9 }, opt), mp.randn({ 2, 3 }, opt)
    assert.is_true(mp.autograd.gradcheck(function(a, b, h) return mp.gru_cell(a, b, h) end, { gi, gh, hp }))
  end)

  it("refuse mismatched shapes, dtypes and integer tensors, naming the argument", function()
    H.raises(function() mp.lstm_cell(mp.zeros { 2, 12 }, mp.zeros { 2, 4 }) end,
             { "mp.lstm_cell", "gates {2,12} does not match c_prev {2,4}" })
    H.raises(function() mp.lstm_cell(mp.zeros { 2, 16 }, mp.zeros { 3, 4 }) end, { "mp.lstm_cell", "gates" })
    H.raises(function() mp.lstm_cell(nil, mp.zeros { 2, 4 }) end, { "mp.lstm_cell", "gates must be a tensor (got nil)" })
    H.raises(function() mp.gru_cell(mp.zeros { 2, 12 }, mp.zeros { 2, 12 }, 3) end,
             { "mp.gru_cell", "h_prev must be a tensor (got number)" })
    H.raises(function() mp.lstm_cell(mp.zeros { 2, 16 }, mp.zeros { 2, 4 }, 1) end, { "mp.lstm_cell", "too many arguments" })
    H.raises(function() mp.lstm_cell(mp.zeros { 2, 16 }, mp.zeros { 2, 4, 1 }) end, { "mp.lstm_cell", "c_prev", "2-d" })
    H.raises(function() mp.lstm_cell(mp.zeros({ 2, 16 }, { dtype = "i32" }), mp.zeros { 2, 4 }) end,
             { "mp.lstm_cell", "gates must be a float tensor" })
    H.raises(function() mp.gru_cell(mp.zeros { 2, 12 }, mp.zeros { 2, 9 }, mp.zeros { 2, 4 }) end,
             { "mp.gru_cell", "gh {2,9} does not match h_prev {2,4}" })
    H.raises(function() mp.gru_cell(mp.zeros { 2, 12 }, mp.zeros({ 2, 12 }, { dtype = "f16" }), mp.zeros { 2, 4 }) end,
             { "mp.gru_cell", "gh is f16" })
  end)
end)

describe("a backend without the cell kernels", function()
  it("declines the cells by name (MP_FAKE_CUDA_WITHOUT)", function()
    local fake = H.build .. "/tests/fake_cuda.so"
    local f = io.open(fake, "rb")
    if not f then return pending("no fake device built") end
    f:close()
    local r = H.child([[
      local x = mp.randn({ 4, 2, 3 }, { device = "cuda" })
      local ok1, e1 = pcall(function() return mp.nn.LSTM(3, 5):to("cuda")(x) end)
      local ok2, e2 = pcall(function() return mp.nn.GRU(3, 5):to("cuda")(x) end)
      return tostring(ok1) .. "|" .. tostring(e1) .. "|" .. tostring(ok2) .. "|" .. tostring(e2)
    ]], false, { MP_DEVICE = "cpu", MP_CUDA_BACKEND = fake, MP_FAKE_CUDA_WITHOUT = "lstm_cell_grad,gru_cell" })
    assert.are.equal(0, r.rc, r.out .. r.err)
    assert.truthy(r.out:find("OK:false|", 1, true), r.out)
    assert.truthy(r.out:find("mp.lstm_cell: lstm_cell is not available for f32 tensors on cuda (the backend declines it)",
                             1, true), r.out)
    assert.truthy(r.out:find("mp.gru_cell: gru_cell is not available for f32 tensors on cuda", 1, true), r.out)
  end)
end)

describe("scripts/examples/char_lstm.lua", function()
  it("trains a character LSTM on a text file: the loss falls, and it samples text", function()
    local run = H.script(H.root .. "/scripts/examples/char_lstm.lua")
    local out, code = run(H.q(H.root .. "/README.md") ..
                          " --steps 30 --every 10 --hidden 32 --embed 16 --seq 16 --batch 8 --layers 2 --sample 30")
    assert.are.equal(0, code, out)
    assert.truthy(out:find("README.md", 1, true), out)
    local first, last = out:match("loss: ([%d.]+) %-> ([%d.]+)")
    assert(first, out)
    assert.is_true(tonumber(last) < tonumber(first) - 0.2, out)
    local sample = out:match("sample:\n(.*)\nexit=")
    assert.truthy(sample and #sample >= 30, out)
  end)

  it("refuses an unknown option and a missing file", function()
    local run = H.script(H.root .. "/scripts/examples/char_lstm.lua")
    local out, code = run("--stepz 3")
    assert.are.equal(2, code, out)
    assert.truthy(out:find("unknown option --stepz", 1, true), out)
    out, code = run("/nonexistent/text --steps 1")
    assert.are_not.equal(0, code, out)
    assert.truthy(out:find("mp.data.text", 1, true), out)
  end)
end)
