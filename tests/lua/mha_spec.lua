-- mha_spec.lua: mp.nn.MultiheadAttention (lua/mp/nn/attention.lua) against PyTorch
-- 1.13's nn.MultiheadAttention: outputs, averaged weights and the gradients of
-- sum(out * r) for every input and parameter, from
-- tests/reference/fixtures/mha.safetensors (tests/reference/make_mha_fixture.py):
-- self- and cross-attention, batch_first both ways, float, bool and causal masks,
-- without biases. Norm: max |ours - ref| / max(max |ref|, 1) <= 1e-4.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local TOL = 1e-4
local T, META = mp.load(H.root .. "/tests/reference/fixtures/mha.safetensors")
for k, v in pairs(T) do T[k] = v:to(mp.default_device()) end   -- mp.load gives cpu tensors
local CASES = { "self_seq", "cross_bf", "self_float_mask_weights", "cross_bool_mask_seq", "self_causal_bf",
                "cross_nobias_seq_weights" }
local PARAMS = { "in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias" }

local function values(t) return H.flat(t:totable()) end

local function err(a, b)
  assert.are.same(b.shape, a.shape)
  local va, vb = values(a), values(b)
  local d, m = 0, 1
  for i = 1, #vb do
    local x = math.abs(va[i] - vb[i])
    if x ~= x then x = math.huge end
    d, m = math.max(d, x), math.max(m, math.abs(vb[i]))
  end
  return d / m
end

local function check(a, b, what)
  local e = err(a, b)
  assert(e <= TOL, string.format("%s: %.3g > %g", what, e, TOL))
end

-- the case's settings (the fixture's metadata is JSON of flat scalars)
local function settings(name)
  local s = {}
  for k, v in META[name]:gmatch('"([%w_]+)": ("?[^,}"]*"?)') do
    if v == "true" then s[k] = true elseif v == "false" then s[k] = false
    elseif v:sub(1, 1) == '"' then s[k] = v:sub(2, -2) else s[k] = tonumber(v) end
  end
  return s
end

local function build(name)
  local s = settings(name)
  local m = mp.nn.MultiheadAttention(s.embed_dim, s.num_heads, { bias = s.bias, batch_first = s.batch_first })
  local sd = {}
  for _, p in ipairs(PARAMS) do sd[p] = T[name .. ".param." .. p] end
  if not s.bias then sd.in_proj_bias, sd["out_proj.bias"] = nil, nil end
  m:load_state_dict(sd)
  return m, s
end

local function run(name, force_explicit)
  local m, s = build(name)
  local p = name .. "."
  local inputs, q, k, v = {}
  if s.self then
    q = mp.tensor(T[p .. "input.x"]):requires_grad(true)
    k, v, inputs.x = q, q, q
  else
    q = mp.tensor(T[p .. "input.query"]):requires_grad(true)
    k = mp.tensor(T[p .. "input.key"]):requires_grad(true)
    v = mp.tensor(T[p .. "input.value"]):requires_grad(true)
    inputs.query, inputs.key, inputs.value = q, k, v
  end
  local opts = { need_weights = s.need_weights or force_explicit or nil }
  if s.mask == "float" then opts.attn_mask = T[p .. "mask"]
  elseif s.mask == "bool" then opts.attn_mask = T[p .. "mask"]:gt(0.5)
  elseif s.mask == "causal" then opts.is_causal = true end
  local out, w = m(q, k, v, opts)
  check(out, T[p .. "out"], name .. " out")
  if s.need_weights then check(w, T[p .. "weights"], name .. " weights") end
  ;(out * T[p .. "r"]):sum():backward()
  for n, t in pairs(inputs) do check(t.grad, T[p .. "grad." .. n], name .. " grad of " .. n) end
  local params = m:named_parameters()
  for _, pn in ipairs(PARAMS) do
    local ref = T[p .. "grad." .. pn]
    if ref then check(params[pn].grad, ref, name .. " grad of " .. pn) end
  end
end

describe("mp.nn.MultiheadAttention against torch.nn.MultiheadAttention (1.13, float32)", function()
  before_each(function() mp.set_grad_enabled(true) end)
  for _, name in ipairs(CASES) do
    it(name .. ": output, weights and gradients", function() run(name) end)
  end
  for _, name in ipairs({ "self_seq", "cross_bf", "self_causal_bf" }) do
    it(name .. ": the explicit path (need_weights = true) gives the same as the fused one", function() run(name, true) end)
  end
end)

describe("mp.nn.MultiheadAttention", function()
  it("PyTorch's parameter names, shapes and init", function()
    local m = mp.nn.MultiheadAttention(16, 4)
    local map, names = m:named_parameters()
    local shapes = {}
    for i, n in ipairs(names) do shapes[i] = map[n].shape end
    assert.are.same(PARAMS, names)
    assert.are.same({ { 48, 16 }, { 48 }, { 16, 16 }, { 16 } }, shapes)
    assert.are.same(values(mp.zeros({ 48 })), values(m.in_proj_bias))
    assert.are.same(values(mp.zeros({ 16 })), values(m.out_proj.bias))
    local bound, top = math.sqrt(6 / 64), 0
    for _, x in ipairs(values(m.in_proj_weight)) do top = math.max(top, math.abs(x)) end
    assert.is_true(top <= bound and top > 0.8 * bound, "xavier_uniform bound " .. bound .. ", max " .. top)
    top = 0
    for _, x in ipairs(values(m.out_proj.weight)) do top = math.max(top, math.abs(x)) end
    assert.is_true(top <= 1 / 4 and top > 0.15, "Linear's init: U(-1/sqrt(16), 1/sqrt(16))")
    local nb = mp.nn.MultiheadAttention(8, 2, { bias = false })
    assert.are.same({ "in_proj_weight", "out_proj.weight" }, select(2, nb:named_parameters()))
  end)

  it("unbatched {L, E} inputs give {L, E} outputs and {L, S} weights", function()
    local m = mp.nn.MultiheadAttention(8, 2)
    local q, kv = mp.randn({ 3, 8 }), mp.randn({ 5, 8 })
    local o, w = m(q, kv, kv, { need_weights = true })
    assert.are.same({ 3, 8 }, o.shape)
    assert.are.same({ 3, 5 }, w.shape)
    local batched = m(q:reshape({ 3, 1, 8 }), kv:reshape({ 5, 1, 8 }), kv:reshape({ 5, 1, 8 }))
    assert.is_true(err(o, batched:reshape({ 3, 8 })) < 1e-6)
  end)

  it("dropout applies while training only; eval is deterministic", function()
    local m = mp.nn.MultiheadAttention(8, 2, { dropout = 0.5, batch_first = true })
    local x = mp.randn({ 2, 4, 8 })
    m:eval()
    local a, b = m(x, x, x), m(x, x, x)
    assert.are.same(values(a), values(b))
    m:train()
    local c = m(x, x, x)
    assert.is_true(err(c, a) > 1e-3)
  end)

  it("errors name the layer and the argument", function()
    local function fails(pat, f, ...)
      local ok, e = pcall(f, ...)
      assert.is_false(ok)
      assert.matches(pat, tostring(e))
    end
    local MHA = mp.nn.MultiheadAttention
    fails("embed_dim must be divisible by num_heads %(got 10 and 4%)", MHA, 10, 4)
    fails("num_heads must be a positive integer", MHA, 8, 0)
    fails("dropout must be a number in %[0, 1%)", MHA, 8, 2, { dropout = 1 })
    fails("unknown option", MHA, 8, 2, { kdim = 4 })
    local m = MHA(8, 2)
    local x = mp.randn({ 3, 2, 8 })
    fails("query must be {L, N, 8}", m, mp.randn({ 3, 2, 6 }), x, x)
    fails("key must be a tensor", m, x, 42, x)
    fails("key and value must have the query's batch size", m, x, mp.randn({ 3, 4, 8 }), mp.randn({ 3, 4, 8 }))
    fails("attn_mask must be {3, 3} or {4, 3, 3}", m, x, x, x, { attn_mask = mp.zeros({ 2, 3 }) })
    fails("unknown option 'key_padding_mask'", m, x, x, x, { key_padding_mask = mp.zeros({ 2, 3 }) })
  end)
end)
