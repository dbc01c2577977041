-- cnn_reference_spec.lua: scripts/models/cnn.lua against PyTorch. The fixture
-- (tests/reference/fixtures/cnn.safetensors, made by tests/reference/make_cnn_fixture.py
-- with Debian's python3-torch) holds a small CNN's weights and batch-norm running
-- statistics under PyTorch's names, a batch, the loss of a training forward, every
-- gradient and the buffers after that forward (num_batches_tracked stored as PyTorch
-- does, I64, which mp.load reads as i32). The Lua model loads the state one to one and must match the loss, each gradient and each updated
-- statistic to 1e-4 relative (max |ours - ref| / max |ref| per tensor) in f32.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local FIXTURE = H.root .. "/tests/reference/fixtures/cnn.safetensors"
local RTOL = 1e-4

local rel_err = H.rel_err

describe("the Lua CNN against PyTorch", function()
  it("loads PyTorch's state dict one to one and matches the loss, every gradient and the running statistics", function()
    local fx = mp.load(FIXTURE)
    local CNN = dofile(H.root .. "/scripts/models/cnn.lua")
    local c1, c2 = fx["param.conv1.weight"].shape[1], fx["param.conv2.weight"].shape[1]
    local size = fx["input.x"].shape[3]
    local model = CNN { c1 = c1, c2 = c2, size = size, hidden = fx["param.fc1.weight"].shape[1] }
    local sd, n = {}, 0
    for k, t in pairs(fx) do
      local name = k:match("^param%.(.*)$")
      if name then sd[name] = t; n = n + 1 end
      name = k:match("^buffer%.(.*)$")
      if name then sd[name] = t end
    end
    local r = model:load_state_dict(sd, { strict = true })
    assert.are.same({}, r.missing_keys)
    assert.are.same({}, r.unexpected_keys)
    local dev = mp.default_device()
    model:to(dev)
    local loss = mp.cross_entropy(model(fx["input.x"]:to(dev)), fx["input.target"]:to(dev))
    local e = rel_err(loss, fx.loss)
    assert.is_true(e <= RTOL, "loss: relative error " .. e)
    loss:backward()
    local params = model:named_parameters()
    local checked = 0
    for k, ref in pairs(fx) do
      local name = k:match("^grad%.(.*)$")
      if name and params[name] then
        assert(params[name].grad, name .. ": no gradient")
        local err = rel_err(params[name].grad, ref)
        assert.is_true(err <= RTOL, string.format("grad.%s: relative error %.3g", name, err))
        checked = checked + 1
      end
    end
    assert.are.equal(n, checked)
    local buffers = model:named_buffers()
    for _, bn in ipairs { "bn1", "bn2" } do
      for _, s in ipairs { "running_mean", "running_var" } do
        local err = rel_err(buffers[bn .. "." .. s], fx["after." .. bn .. "." .. s])
        assert.is_true(err <= RTOL, string.format("%s.%s after the step: relative error %.3g", bn, s, err))
      end
      assert.are.equal(fx["after." .. bn .. ".num_batches_tracked"]:item(), buffers[bn .. ".num_batches_tracked"]:item())
    end
  end)
end)
