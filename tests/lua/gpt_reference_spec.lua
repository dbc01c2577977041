-- gpt_reference_spec.lua: scripts/models/gpt.lua against PyTorch. The fixture
-- (tests/reference/fixtures/gpt.safetensors, made by tests/reference/make_gpt_fixture.py
-- with Debian's python3-torch) holds a two-layer GPT's weights under PyTorch's names,
-- a batch, the loss and every gradient; the Lua model loads the weights one to one
-- and must match the loss and each gradient to 1e-4 relative (max |ours - ref| /
-- max |ref| per tensor) in f32.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local FIXTURE = H.root .. "/tests/reference/fixtures/gpt.safetensors"
local RTOL = 1e-4

local rel_err = H.rel_err

describe("the Lua GPT against PyTorch", function()
  it("loads PyTorch's state dict one to one and matches the loss and every gradient", function()
    local fx = mp.load(FIXTURE)
    local GPT = dofile(H.root .. "/scripts/models/gpt.lua")
    local vocab, ctx = fx["param.wte.weight"].shape[1], fx["param.wpe.weight"].shape[1]
    local model = GPT { vocab = vocab, ctx = ctx, layers = 2, dim = fx["param.wte.weight"].shape[2], heads = 4 }
    local sd, n = {}, 0
    for k, t in pairs(fx) do
      local name = k:match("^param%.(.*)$")
      if name then sd[name] = t; n = n + 1 end
    end
    local r = model:load_state_dict(sd, { strict = true })
    assert.are.same({}, r.missing_keys)
    assert.are.same({}, r.unexpected_keys)
    local dev = mp.default_device()
    model:to(dev)
    local idx, target = fx["input.idx"]:to(dev), fx["input.target"]:to(dev)
    local loss = mp.cross_entropy(model(idx):reshape { -1, vocab }, target:reshape { -1 })
    local e = rel_err(loss, fx.loss)
    assert.is_true(e <= RTOL, "loss: relative error " .. e)
    loss:backward()
    local params = model:named_parameters()
    local checked = 0
    for k, ref in pairs(fx) do
      local name = k:match("^grad%.(.*)$")
      if name then
        local p = assert(params[name], "the model has no " .. name)
        assert(p.grad, name .. ": no gradient")
        local err = rel_err(p.grad, ref)
        assert.is_true(err <= RTOL, string.format("grad.%s: relative error %.3g", name, err))
        checked = checked + 1
      end
    end
    assert.are.equal(n, checked)
    assert.is_true(checked >= 28, "gradients checked: " .. checked)
  end)
end)
