-- amp_recipes_spec.lua: the AMP recipes of scripts/examples/amp_*.lua, each run
-- scaled against an unscaled control as PyTorch's GradScaler tests do
-- (test_cuda.py, _run_scaling_case): SGD with lr 1, 8x8 data, a scaler at init 128,
-- growth 2 every step (interval 1), backoff 0.5; at iteration 3 an inf is planted
-- in a gradient just before the scaler reads it, so that step is skipped and the
-- control skips it too. The scale must end at 128 * 2^3 * 0.5, the parameters equal
-- the control's within 1e-7 + 1e-5 relative; with enabled = false the scale stays 1
-- and nothing is skipped. The spec runs the examples' own train() functions; the
-- controls are written here, unscaled, as plain f32 training.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local nn = mp.nn
local P = mp.amp.policy

local function recipe(name) return dofile(H.root .. "/scripts/examples/amp_" .. name .. ".lua") end

local INIT, GROWTH, BACKOFF, SKIP, ITERS = 128, 2, 0.5, 3, 4
local MAX_NORM = 0.2   -- PyTorch's clipping tests: small enough to clip every step

local function net(mid) return nn.Sequential(nn.Linear(8, 8), mid or nn.ReLU(), nn.Linear(8, 8)) end

-- the scaler a recipe is given: the real one, except that in iteration `at` the
-- first call that reads the gradients (unscale or step) finds `victim`'s gradient
-- filled with inf first, as PyTorch's tests fill model[1].weight.grad between
-- backward and step. applied[i]: what step(opt) returned at iteration i for
-- victim's optimizer (`opt`).
local function planting(scaler, victim, opt, at)
  local iter, planted = 1, false
  local proxy = {applied = {}}
  local function plant()
    if iter == at and not planted and scaler.enabled then
      victim.grad = mp.full(victim.shape, math.huge)
      planted = true
    end
  end
  function proxy:scale(loss) return scaler:scale(loss) end
  function proxy:get_scale() return scaler:get_scale() end
  function proxy:unscale(o) plant(); return scaler:unscale(o) end
  function proxy:step(o)
    plant()
    local r = scaler:step(o)
    if o == opt then self.applied[iter] = r end
    return r
  end
  function proxy:update() iter = iter + 1; return scaler:update() end
  return proxy
end

-- a control and a scaled copy of `count` models with the same parameters, an SGD
-- optimizer (lr 1, PyTorch's) for each, and n batches {input, target} of 8x8
local function case(count, n, mid)
  mp.manual_seed(26)
  local c = {control = {}, scaled = {}, copt = {}, sopt = {}, batches = {}}
  for k = 1, count do
    c.control[k], c.scaled[k] = net(mid and mid()), net(mid and mid())
    c.scaled[k]:load_state_dict(c.control[k]:state_dict())
    c.copt[k] = mp.optim.SGD(c.control[k]:parameters(), {lr = 1})
    c.sopt[k] = mp.optim.SGD(c.scaled[k]:parameters(), {lr = 1})
  end
  for i = 1, n do c.batches[i] = {mp.randn{8, 8}, mp.randn{8, 8}} end
  return c
end

local function scaler_for(enabled)
  return mp.amp.GradScaler{policy = P.dynamic{init = INIT, growth = GROWTH, backoff = BACKOFF, interval = 1},
                           enabled = enabled}
end

-- PyTorch's _run_scaling_case. spec.scaled(c, scaler): the recipe on c.scaled;
-- spec.control(c, skip, enabled): the unscaled run on c.control, where skip(i) says
-- whether the scaled run's step i is skipped; spec.models (1), spec.batches (4),
-- spec.victim (1: the gradient planted with inf is that model's last weight's,
-- and applied[] follows that model's optimizer), spec.mid (a constructor of the
-- layer between the two Linears: ReLU), spec.atol (1e-7).
local function run_scaling_case(spec)
  for _, enabled in ipairs{true, false} do
    local c = case(spec.models or 1, spec.batches or ITERS, spec.mid)
    local v = spec.victim or 1
    local scaler = scaler_for(enabled)
    local proxy = planting(scaler, c.scaled[v]:parameters()[3], c.sopt[v], SKIP)
    local before = c.control[1]:parameters()[1]:totable()
    spec.control(c, function(i) return enabled and i == SKIP end, enabled)
    spec.scaled(c, proxy)
    local what = enabled and "enabled" or "disabled"
    if enabled then
      assert.are.equal(INIT * GROWTH ^ (ITERS - 1) * BACKOFF, scaler:get_scale())
      assert.are.same({true, true, false, true}, proxy.applied)
      assert.are.equal(1, scaler.stats.skipped)
    else
      assert.are.equal(1, scaler:get_scale())
      assert.are.same({true, true, true, true}, proxy.applied)
    end
    -- the runs trained: the comparison below is between moved parameters
    assert.is_false(H.close(c.control[1]:parameters()[1]:totable()[1][1], before[1][1], 0, 1e-4), what)
    for k = 1, #c.control do
      local cp, sp = c.control[k]:named_parameters(), c.scaled[k]:named_parameters()
      for name, p in pairs(cp) do
        H.assert_close(sp[name]:totable(), p:totable(), 1e-5, spec.atol or 1e-7,
                       string.format("%s: model %d's %s", what, k, name))
      end
    end
  end
end

-- the control of the one-model recipes: unscaled, f32 unless dtype names an
-- autocast dtype; clip: clip the gradients' norm at MAX_NORM before the step;
-- by_hand: backward loss * by_hand, and the gradients divided by it before the step
local function plain_control(c, skip, clip, dtype, by_hand)
  local model, opt = c.control[1], c.copt[1]
  for i, b in ipairs(c.batches) do
    opt:zero_grad()
    local loss
    do
      local _ <close> = mp.amp.autocast(dtype or false)
      loss = mp.mse_loss(model(b[1]), b[2])
    end
    if by_hand then
      (loss * by_hand):backward()
      for _, p in ipairs(model:parameters()) do p.grad = p.grad / by_hand end
    else
      loss:backward()
    end
    if clip then mp.optim.clip_grad_norm(model:parameters(), MAX_NORM) end
    if not skip(i) then opt:step() end
  end
end

describe("AMP recipes against an unscaled control (PyTorch's _run_scaling_case)", function()
  it("plain: scale(loss):backward(), step, update", function()
    local r = recipe("plain")
    run_scaling_case{
      control = function(c, skip) plain_control(c, skip) end,
      scaled = function(c, scaler) r.train(c.scaled[1], c.sopt[1], scaler, c.batches) end,
    }
  end)

  it("the comparison has teeth: a scaler that does not skip iteration 3 leaves other parameters", function()
    local r = recipe("plain")
    local c = case(1, ITERS)
    plain_control(c, function(i) return i == SKIP end)
    r.train(c.scaled[1], c.sopt[1], scaler_for(true), c.batches)   -- nothing planted: nothing skipped
    local cw, sw = H.flat(c.control[1]:parameters()[3]:totable()), H.flat(c.scaled[1]:parameters()[3]:totable())
    local differs = false
    for i = 1, #cw do differs = differs or not H.close(sw[i], cw[i], 1e-5, 1e-7) end
    assert.is_true(differs)
  end)

  it("clipping the scaled gradients at max_norm * scale", function()
    local r = recipe("clip_scaled")
    run_scaling_case{
      control = function(c, skip) plain_control(c, skip, true) end,
      scaled = function(c, scaler) r.train(c.scaled[1], c.sopt[1], scaler, c.batches, MAX_NORM) end,
    }
  end)

  it("clipping after scaler:unscale(opt)", function()
    local r = recipe("clip_unscaled")
    run_scaling_case{
      control = function(c, skip) plain_control(c, skip, true) end,
      scaled = function(c, scaler) r.train(c.scaled[1], c.sopt[1], scaler, c.batches, MAX_NORM) end,
    }
  end)

  it("gradient accumulation: 4 steps of 3 micro-batches", function()
    local r, every = recipe("accumulate"), 3
    run_scaling_case{
      batches = ITERS * every,
      control = function(c, skip)
        local model, opt = c.control[1], c.copt[1]
        opt:zero_grad()
        for i, b in ipairs(c.batches) do
          (mp.mse_loss(model(b[1]), b[2]) / every):backward()
          if i % every == 0 then
            if not skip(i // every) then opt:step() end
            opt:zero_grad()
          end
        end
      end,
      scaled = function(c, scaler) r.train(c.scaled[1], c.sopt[1], scaler, c.batches, every) end,
    }
  end)

  it("gradient penalty: grad(scale(loss), params, {create_graph = true}), unscaled by hand, its norm added", function()
    local r = recipe("gradient_penalty")
    run_scaling_case{
      mid = nn.Tanh,   -- second derivatives through tanh (ReLU's are zero)
      control = function(c, skip)
        local model, opt = c.control[1], c.copt[1]
        for i, b in ipairs(c.batches) do
          opt:zero_grad()
          local loss = mp.mse_loss(model(b[1]), b[2])
          local grads = mp.autograd.grad(loss, model:parameters(), {create_graph = true})
          local norm2 = 0
          for _, g in ipairs(grads) do norm2 = norm2 + (g * g):sum() end
          ;(loss + norm2:sqrt()):backward()
          if not skip(i) then opt:step() end
        end
      end,
      scaled = function(c, scaler) r.train(c.scaled[1], c.sopt[1], scaler, c.batches) end,
    }
  end)

  it("two models, two losses through a shared graph (retain_graph), two optimizers, one unscaled early", function()
    local r = recipe("two_models")
    run_scaling_case{
      models = 2,
      victim = 2,   -- the inf is in model 2's gradient: only opt 2 skips, as in PyTorch's test
      control = function(c, skip)
        local m, o = c.control, c.copt
        for i, b in ipairs(c.batches) do
          o[1]:zero_grad(); o[2]:zero_grad()
          local out0, out1 = m[1](b[1]), m[2](b[1])
          mp.mse_loss(out0 * 0.3 + out1 * 0.7, b[2]):backward(nil, {retain_graph = true})
          mp.mse_loss(out0 * 0.6 - out1 * 0.4, b[2]):backward()
          o[1]:step()
          if not skip(i) then o[2]:step() end
        end
      end,
      scaled = function(c, scaler) r.train(c.scaled, c.sopt, scaler, c.batches) end,
    }
  end)

  it("a custom Function with cast_inputs = \"f32\" in an f16 autocast region", function()
    local r = recipe("custom_function")
    local seen
    local mid = function() return r.Swish(1.5) end
    -- the Function's forward sees f32 inside the region
    do
      local x = mp.randn{2, 3}:f16()
      local _ <close> = mp.amp.autocast("f16")
      seen = r.swish(x, 1.5).dtype
    end
    assert.are.equal("f32", seen)
    -- Against the unscaled control: where the control's f16 gradients fall below
    -- f16's normal range (6.1e-5) they lose digits -- what the scaler is there to
    -- prevent -- and with lr 1 the parameters part by about 1e-5 relative.
    -- PyTorch's test_grad_scaling_autocast allows atol 1e-3 for this.
    run_scaling_case{
      mid = mid, atol = 1e-3,
      control = function(c, skip) plain_control(c, skip, false, "f16") end,
      scaled = function(c, scaler) r.train(c.scaled[1], c.sopt[1], scaler, c.batches, "f16") end,
    }
    -- Against a control that scales its backward by a fixed 4 by hand (no f16
    -- gradient underflows then) and divides the gradients by 4 before its step:
    -- the plain tolerance holds (the runs are in fact bit-identical). A disabled
    -- scaler is unscaled: its control is too.
    run_scaling_case{
      mid = mid,
      control = function(c, skip, enabled) plain_control(c, skip, false, "f16", enabled and 4 or nil) end,
      scaled = function(c, scaler) r.train(c.scaled[1], c.sopt[1], scaler, c.batches, "f16") end,
    }
  end)
end)

describe("the recipes' memory", function()
  local function in_use() collectgarbage(); collectgarbage(); return mp.memory().in_use end
  -- a second round of iterations ends with the memory the first ended with: the
  -- graphs kept by retain_graph and create_graph, and the custom Function's saved
  -- tensors, are released with the iteration
  for _, name in ipairs{"gradient_penalty", "two_models", "custom_function"} do
    it(name .. " holds no more after 8 iterations than after 4", function()
      local r = recipe(name)
      local c = case(name == "two_models" and 2 or 1, ITERS,
                     name == "custom_function" and function() return r.Swish(1.5) end or nil)
      local scaler = scaler_for(true)
      local function go()
        if name == "two_models" then r.train(c.scaled, c.sopt, scaler, c.batches, "f16")
        else r.train(c.scaled[1], c.sopt[1], scaler, c.batches, "f16") end
      end
      go()
      local after4 = in_use()
      go()
      assert.are.equal(after4, in_use())
    end)
  end
end)

describe("the recipes as scripts", function()
  for _, name in ipairs{"plain", "clip_scaled", "clip_unscaled", "accumulate", "gradient_penalty", "two_models",
                        "custom_function"} do
    it("scripts/examples/amp_" .. name .. ".lua trains under f16 autocast: its loss falls", function()
      local out, code = H.script(H.root .. "/scripts/examples/amp_" .. name .. ".lua")("")
      assert.are.equal(0, code, out)
      local first, last = out:match("([%d.]+) %-> ([%d.]+)")
      assert.is_not_nil(first, out)
      assert.is_true(tonumber(last) < tonumber(first), out)
      -- at most a skip or two while the scale finds its level (the penalty's first
      -- gradients, f16 and scaled by 65536, overflow at the start)
      local skipped = tonumber(out:match("skipped (%d+) of 40 steps"))
      assert.is_not_nil(skipped, out)
      assert.is_true(skipped <= 2, out)
    end)
  end
end)
