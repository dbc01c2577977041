-- reference_spec.lua: composite networks against PyTorch. Each fixture in
-- tests/reference/fixtures (made by tests/reference/make_fixtures.py; see the
-- README there) holds inputs, weights, the loss and every gradient; the same
-- network is rebuilt here with mpengine's ops and modules, run forward and
-- backward in f32, and compared.
-- LUA_PATH="lua/?.lua;lua/?/init.lua;;" LUA_CPATH="build/?.so;;" busted tests/lua/reference_spec.lua
--
-- The norm, per tensor: max_i |ours_i - ref_i| / max(max_i |ref_i|, 1e-30) <= 1e-5.
-- The reference is PyTorch in float64 from the same f32 inputs, rounded to f32,
-- so this bounds mpengine's own f32 error relative to each tensor's scale.

local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn or require "mp.nn"

local DIR = H.root .. "/tests/reference/fixtures/"
local RTOL = 1e-5

---------------------------------------------------------------- reading safetensors in Lua

-- a small JSON reader: objects, arrays, strings, numbers, true/false/null
local function json_decode(s)
  local pos = 1
  local function ws() pos = s:find("[^ \t\r\n]", pos) or #s + 1 end
  local value
  local function str()
    local out = {}
    pos = pos + 1
    while true do
      local c = s:sub(pos, pos)
      if c == "" then error("json: unterminated string") end
      if c == '"' then pos = pos + 1; break end
      if c == "\\" then
        local e = s:sub(pos + 1, pos + 1)
        local map = { ['"'] = '"', ["\\"] = "\\", ["/"] = "/", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t" }
        if e == "u" then
          out[#out + 1] = utf8.char(tonumber(s:sub(pos + 2, pos + 5), 16))
          pos = pos + 6
        else
          out[#out + 1] = assert(map[e], "json: bad escape")
          pos = pos + 2
        end
      else
        out[#out + 1] = c
        pos = pos + 1
      end
    end
    return table.concat(out)
  end
  function value()
    ws()
    local c = s:sub(pos, pos)
    if c == "{" then
      local r = {}
      pos = pos + 1
      ws()
      if s:sub(pos, pos) == "}" then pos = pos + 1; return r end
      while true do
        ws()
        local k = str()
        ws()
        assert(s:sub(pos, pos) == ":", "json: expected ':'")
        pos = pos + 1
        r[k] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "}" then return r end
        assert(d == ",", "json: expected ',' or '}'")
      end
    elseif c == "[" then
      local r = {}
      pos = pos + 1
      ws()
      if s:sub(pos, pos) == "]" then pos = pos + 1; return r end
      while true do
        r[#r + 1] = value()
        ws()
        local d = s:sub(pos, pos)
        pos = pos + 1
        if d == "]" then return r end
        assert(d == ",", "json: expected ',' or ']'")
      end
    elseif c == '"' then
      return str()
    elseif s:sub(pos, pos + 3) == "true" then pos = pos + 4; return true
    elseif s:sub(pos, pos + 4) == "false" then pos = pos + 5; return false
    elseif s:sub(pos, pos + 3) == "null" then pos = pos + 4; return nil
    else
      local num = s:match("^-?%d+%.?%d*[eE]?[-+]?%d*", pos)
      assert(num and #num > 0, "json: unexpected character at " .. pos)
      pos = pos + #num
      return math.tointeger(tonumber(num)) or tonumber(num)
    end
  end
  return value()
end

local nest = H.nest

local FORMATS = { F32 = { "f", 4, "f32" }, I32 = { "i4", 4, "i32" } }

-- {name = tensor}, metadata: reads the header and data with string.unpack
local function read_safetensors(path)
  local f = assert(io.open(path, "rb"))
  local bytes = f:read("a")
  f:close()
  local n = string.unpack("<I8", bytes)
  local header = json_decode(bytes:sub(9, 8 + n))
  local base = 8 + n
  local out = {}
  for name, e in pairs(header) do
    if name ~= "__metadata__" then
      local fmt = assert(FORMATS[e.dtype], "unsupported dtype " .. tostring(e.dtype))
      local count = (e.data_offsets[2] - e.data_offsets[1]) // fmt[2]
      local vals, p = {}, base + e.data_offsets[1] + 1
      local chunk = 256
      for i = 1, count, chunk do
        local m = math.min(chunk, count - i + 1)
        local got = table.pack(string.unpack("<" .. string.rep(fmt[1], m), bytes, p))
        for j = 1, m do vals[i + j - 1] = got[j] end
        p = got[m + 1]
      end
      out[name] = mp.tensor(nest(vals, e.shape), { dtype = fmt[3] })
    end
  end
  return out, header.__metadata__ or {}
end

-- tensors through mp.load when the engine has it, else through the Lua reader,
-- on the default device (mp.load gives cpu tensors): the networks run there
local function load_fixture(name)
  local path = DIR .. name .. ".safetensors"
  local t, meta = read_safetensors(path)
  if mp.load then t = mp.load(path) end
  for k, v in pairs(t) do t[k] = v:to(mp.default_device()) end
  return t, meta
end

---------------------------------------------------------------- comparing

-- max |a - b| / max(max |b|, 1e-30), over flat values
local function rel_err(a, b)
  local av, bv = a:totable(), b:totable()
  if type(av) == "number" then av, bv = { av }, { bv } end
  av, bv = H.flat(av), H.flat(bv)
  assert(#av == #bv, "sizes differ: " .. #av .. " vs " .. #bv)
  local diff, scale = 0, 0
  for i = 1, #bv do
    if av[i] ~= av[i] then return math.huge end
    diff = math.max(diff, math.abs(av[i] - bv[i]))
    scale = math.max(scale, math.abs(bv[i]))
  end
  return diff / math.max(scale, 1e-30)
end

local function match(what, ours, ref)
  assert(ours, what .. ": missing (no gradient reached it?)")
  assert.are.same(ref.shape, ours.shape, what .. ": shape")
  local e = rel_err(ours, ref)
  assert(e <= RTOL, string.format("%s: relative error %.3g > %g", what, e, RTOL))
  return e
end

-- every float input and param as a fresh leaf that requires grad
local function leaves(fx)
  local v = {}
  for k, t in pairs(fx) do
    local name = k:match("^input%.(.*)$") or k:match("^param%.(.*)$")
    if name then
      v[name] = t.dtype == "f32" and t:clone():detach():requires_grad(true) or t
    end
  end
  return v
end

-- the fixture's param.<name> tensors into model, by PyTorch's state_dict names
local function load_params(model, fx)
  local sd = {}
  for k, t in pairs(fx) do
    local name = k:match("^param%.(.*)$")
    if name then sd[name] = t end
  end
  model:load_state_dict(sd)
end

-- loss and every grad.<name> of the fixture against ours (grads from `v`, or `named`)
local function check_all(fx, loss, v, named)
  match("loss", loss, fx.loss)
  local n = 0
  for k, ref in pairs(fx) do
    local name = k:match("^grad%.(.*)$")
    if name then
      local t = (named and named[name]) or v[name]
      assert(t, "no tensor for grad." .. name)
      match("grad." .. name, t.grad, ref)
      n = n + 1
    end
  end
  assert(n > 0, "the fixture holds no gradients")
end

---------------------------------------------------------------- the networks

describe("composite networks against PyTorch fixtures", function()
  before_each(function() mp.set_grad_enabled(true) end)

  it("the fixtures are there and small", function()
    local total = 0
    for _, name in ipairs { "mlp", "ln_gelu", "ln_gelu_tanh_3d", "embed_bag", "attention", "misc", "rms_norm" } do
      local f = assert(io.open(DIR .. name .. ".safetensors", "rb"), "missing fixture " .. name)
      total = total + f:seek("end")
      f:close()
    end
    assert.is_true(total < 512 * 1024, "fixtures take " .. total .. " bytes")
  end)

  it("the Lua reader and mp.load agree on every fixture tensor", function()
    if not mp.load then pending("mp.load is not there yet") return end
    local t = read_safetensors(DIR .. "misc.safetensors")
    local u = mp.load(DIR .. "misc.safetensors")
    local n = 0
    for k, v in pairs(t) do
      assert(u[k], "mp.load lacks " .. k)
      assert.are.equal(v.dtype, u[k].dtype, k)
      H.assert_same(u[k]:totable(), v:totable(), k)
      n = n + 1
    end
    for k in pairs(u) do assert(t[k], "mp.load has an extra " .. tostring(k)) end
    assert.is_true(n >= 8)
  end)

  it("MLP 784 -> 32 -> 10 with ReLU, batch 8, cross_entropy (nn.Sequential + load_state_dict)", function()
    local fx = load_fixture("mlp")
    local model = nn.Sequential(nn.Linear(784, 32), nn.ReLU(), nn.Linear(32, 10))
    load_params(model, fx)   -- PyTorch's state_dict names map one to one
    local x = fx["input.x"]:clone():requires_grad(true)
    local loss = mp.cross_entropy(model(x), fx["input.target"])
    loss:backward()
    local named = model:named_parameters()
    named.x = x
    check_all(fx, loss, {}, named)
  end)

  it("LayerNorm -> GELU -> Linear -> mse_loss (nn modules)", function()
    local fx = load_fixture("ln_gelu")
    local model = nn.Sequential(nn.LayerNorm(6), nn.GELU(), nn.Linear(6, 3))
    load_params(model, fx)
    local v = leaves(fx)
    local loss = mp.mse_loss(model(v.x), v.y)
    loss:backward()
    local named = model:named_parameters()
    named.x, named.y = v.x, v.y
    check_all(fx, loss, v, named)
  end)

  it("LayerNorm(eps 1e-3) -> GELU(tanh) -> Linear on 3-d input -> mse_loss (functional)", function()
    local fx, meta = load_fixture("ln_gelu_tanh_3d")
    local v = leaves(fx)
    local eps = tonumber(meta.eps) or 1e-3
    local h = mp.layer_norm(v.x, v["0.weight"], v["0.bias"], eps)
    h = mp.gelu(h, { approximate = "tanh" })
    local loss = mp.mse_loss(mp.linear(h, v["2.weight"], v["2.bias"]), v.y)
    loss:backward()
    check_all(fx, loss, v)
  end)

  it("RMSNorm(eps 1e-6) -> Linear on 3-d input -> mse_loss (nn modules, PyTorch's state_dict names)", function()
    local fx, meta = load_fixture("rms_norm")
    local eps = assert(tonumber(meta.eps))
    local model = nn.Sequential(nn.RMSNorm(6, { eps = eps }), nn.Linear(6, 3))
    load_params(model, fx)   -- "0.weight", as torch.nn.RMSNorm's
    local v = leaves(fx)
    local loss = mp.mse_loss(model(v.x), v.y)
    loss:backward()
    local named = model:named_parameters()
    named.x, named.y = v.x, v.y
    check_all(fx, loss, v, named)
  end)

  it("rms_norm(eps 1e-6) -> Linear on 3-d input -> mse_loss (functional)", function()
    local fx, meta = load_fixture("rms_norm")
    local v = leaves(fx)
    local h = mp.rms_norm(v.x, v["0.weight"], assert(tonumber(meta.eps)))
    local loss = mp.mse_loss(mp.linear(h, v["1.weight"], v["1.bias"]), v.y)
    loss:backward()
    check_all(fx, loss, v)
  end)

  it("Embedding -> mean -> Linear -> log_softmax -> cross_entropy", function()
    local fx = load_fixture("embed_bag")
    local v = leaves(fx)
    local e = mp.embedding(v.idx, v["emb.weight"])   -- {4,5,8}
    local hmean = e:mean(2)                            -- over the 5 positions
    local logp = mp.log_softmax(mp.linear(hmean, v["fc.weight"], v["fc.bias"]), -1)
    local loss = mp.cross_entropy(logp, v.target)
    loss:backward()
    check_all(fx, loss, v)
  end)

  it("batched matmul + softmax attention block", function()
    local fx, meta = load_fixture("attention")
    local v = leaves(fx)
    local x = v.x
    local q, k, val = mp.linear(x, v["wq.weight"]), mp.linear(x, v["wk.weight"]), mp.linear(x, v["wv.weight"])
    local s = q:matmul(k:transpose(2, 3)) / math.sqrt(8)
    local p = mp.softmax(s, -1)
    local o = p:matmul(val)
    local out = mp.linear(o, v["wo.weight"], v["wo.bias"])
    local loss = mp.mse_loss(out, v.y)
    loss:backward()
    check_all(fx, loss, v)
  end)

  it("elementwise and shape ops end to end", function()
    local fx = load_fixture("misc")
    local v = leaves(fx)
    local x, z, w = v.x, v.z, v.w
    local a = mp.sigmoid(x) * w
    local b = mp.cat({ a, x:narrow(2, 2, 2) * 2, mp.tanh(z:narrow(2, 1, 2)) }, 2)   -- {3,8}
    local c = mp.where(b:gt(0.25), b, b * b * 0.5)
    local zl, zs = z:log(), z:sqrt():pow(3)
    local d = c:exp() + mp.cat({ zl, zl }, 2) + mp.cat({ zs, zs }, 2) - c:abs()
    local m = d:reshape { 3, 2, 4 }:max(3)                -- {3,2}
    local ce = mp.cross_entropy(d:reshape { 2, 3, 4 }, v.target, { reduction = "sum" })
    local loss = ce + m:mean() + x:transpose(1, 2):pow(2):sum() * 0.01
    loss:backward()
    check_all(fx, loss, v)
  end)
end)
