-- underflow.lua: the mixed-precision paper's loss-scaling finding (Micikevicius et al.,
-- "Mixed Precision Training", 2018, section 3.2), reproduced on our own model.
--
--   build/mpengine scripts/underflow.lua [--steps N] [--tiny K] [--quick]
--
-- The MLP of train_mlp.lua (784-512-256-10) learns Fashion-MNIST with a loss that is
-- multiplied by 2^-K (K = 20 by default), so that its gradients are tiny, as many
-- activation gradients were in the paper's networks. SGD (momentum 0.9) gets a learning
-- rate multiplied by 2^K, which makes the FP32 run exactly the ordinary one (a power of two
-- scales every f32 gradient exactly). Three runs from the same weights and batches:
--
--   fp32          no autocast
--   f16 unscaled  autocast("f16"), GradScaler policy none(): the backward pass rounds
--                 gradients to f16, and those at or below 2^-25 become zero
--   f16 x 2^K     autocast("f16"), GradScaler policy static(2^K): the scaled gradients sit
--                 in f16's range; the scaler divides them by 2^K in FP32 before the step
--
-- It prints the loss (the true loss, x 2^K) and test accuracy side by side, then the
-- telemetry that shows why (scaler:telemetry_table() on the first and last steps): per
-- backward op, how many values were rounded to f16 and how many of them flushed to zero,
-- and per parameter, the fraction of zero gradients and of gradients that f16 would flush
-- at the run's scale. --quick (60 steps, 2000 test images) is for the test suite.
local mp = mp or require "mp"

local opts = {steps = 400, tiny = 20, quick = false}
local argv = arg or {}
local i = 1
while i <= #argv do
  local a = argv[i]
  if a == "--quick" then opts.quick = true
  elseif a == "--steps" or a == "--tiny" then
    local n = math.tointeger(tonumber(argv[i + 1]))
    if not n or n <= 0 then
      io.stderr:write("underflow.lua: ", a, " needs a positive integer\n"); os.exit(2)
    end
    opts[a:sub(3)] = n
    i = i + 1
  else
    io.stderr:write("underflow.lua: unknown option ", a, "\nusage: underflow.lua [--steps N] [--tiny K] [--quick]\n")
    os.exit(2)
  end
  i = i + 1
end
if opts.quick then opts.steps = math.min(opts.steps, 60) end

local TINY = 2.0 ^ -opts.tiny
local LR = 0.05
local BATCH = 128
local EVAL_AT = {}
for _, s in ipairs{0, 25, 50, 100, 200, 300, 400, 600, 800, 1000} do
  if s < opts.steps then EVAL_AT[#EVAL_AT + 1] = s end
end
EVAL_AT[#EVAL_AT + 1] = opts.steps

local train = mp.data.fashion_mnist("train")
local test = mp.data.fashion_mnist("test")
local n_test = opts.quick and 2000 or test.labels:numel()
local nn = mp.nn

local runs = {
  {name = "fp32", amp = false, policy = mp.amp.policy.none()},
  {name = "f16 unscaled", amp = "f16", policy = mp.amp.policy.none()},
  {name = string.format("f16 x 2^%d", opts.tiny), amp = "f16", policy = mp.amp.policy.static(2.0 ^ opts.tiny)},
}

local function evaluate(model, amp)
  local _ <close> = mp.no_grad()
  local _a <close> = amp and mp.amp.autocast(amp) or nil
  model:eval()
  local correct, n = 0, 0
  for x, y in mp.data.loader(test, {batch = 1000}) do
    if n >= n_test then break end
    correct = correct + model(x:reshape{-1, 784}):argmax(2):eq(y):sum():item()
    n = n + y:numel()
  end
  model:train()
  return correct / n
end

-- the telemetry of one step: per-op flush counts and per-parameter fractions
local function snapshot(scaler)
  local per_param, info = scaler:telemetry_table()
  local ops = {}
  for op, b in pairs(info.backward or {}) do
    if b.rounded > 0 then ops[op] = {rounded = b.rounded, flushed = b.flushed, overflowed = b.overflowed} end
  end
  local params = {}
  for name, st in pairs(per_param) do
    params[name] = {amax = st.amax, zero_frac = st.zero_frac, underflow_frac = st.underflow_frac}
  end
  return {ops = ops, params = params, scale = info.scale}
end

-- The activation gradient where the backward pass enters the f16 region: d(loss)/d(logits),
-- computed in f32 at the run's scale, and how much of it rounding to f16 flushes to zero.
-- (This is the first f16 rounding point of the backward; measured here by hand as well,
-- since info.backward counts the roundings inside an op's backward.)
local function logit_grad_flush(model, x, y, scale)
  local logits
  do
    local _ <close> = mp.no_grad()
    local _a <close> = mp.amp.autocast("f16")
    logits = model(x:reshape{-1, 784})
  end
  local z = logits:f32():detach()
  z:requires_grad(true)
  local l = mp.cross_entropy(z, y) * (TINY * scale)
  l:backward()
  local g = z.grad
  local n = g:numel()
  local zeros = g:eq(0):sum():item()
  local flushed = g:f16():eq(0):sum():item() - zeros
  return {n = n, flushed = flushed, nonzero = n - zeros}
end

local function run(r)
  mp.manual_seed(0)
  local model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
  local opt = mp.optim.SGD(model:parameters(), {lr = LR / TINY, momentum = 0.9})
  local scaler = mp.amp.GradScaler{policy = r.policy}
  local _, names = model:named_parameters()
  scaler:telemetry(false, names)
  r.loss, r.acc, r.tel = {}, {}, {}
  r.acc[0] = evaluate(model, r.amp)
  local step, window, wn, next_eval = 0, 0, 0, 2
  local t0 = mp.clock()
  local epoch = 0
  while step < opts.steps do
    epoch = epoch + 1
    for x, y in mp.data.loader(train, {batch = BATCH, shuffle = true, seed = epoch}) do
      step = step + 1
      local sample = step == 1 or step == opts.steps
      if sample then
        scaler:telemetry(true)
        r.logit = r.logit or {}
        r.logit[step] = logit_grad_flush(model, x, y, scaler:get_scale())
      end
      opt:zero_grad()
      local loss
      do
        local _ <close> = r.amp and mp.amp.autocast(r.amp) or nil
        loss = mp.cross_entropy(model(x:reshape{-1, 784}), y) * TINY
      end
      scaler:scale(loss):backward()
      scaler:step(opt)
      scaler:update()
      if sample then
        r.tel[#r.tel + 1] = {step = step, snap = snapshot(scaler)}
        scaler:telemetry(false)
      end
      window, wn = window + loss:item() / TINY, wn + 1
      if step == EVAL_AT[next_eval] then
        r.loss[step], r.acc[step] = window / wn, evaluate(model, r.amp)
        window, wn, next_eval = 0, 0, next_eval + 1
      end
      if step >= opts.steps then break end
    end
  end
  r.seconds = mp.clock() - t0
  r.skipped = scaler.stats.skipped
end

print(string.format("MLP 784-512-256-10 on Fashion-MNIST, SGD momentum 0.9, batch %d, %d steps;", BATCH, opts.steps))
print(string.format("loss multiplied by 2^-%d, learning rate %.3g x 2^%d; test accuracy on %d images", opts.tiny, LR, opts.tiny, n_test))
print()
for _, r in ipairs(runs) do run(r) end

-- ---- side by side ----
local head = {string.format("%6s", "step")}
for _, r in ipairs(runs) do head[#head + 1] = string.format("%-25s", r.name) end
print(table.concat(head, "  "))
local sub = {string.format("%6s", "")}
for _ = 1, #runs do sub[#sub + 1] = string.format("%-25s", "train loss   test acc") end
print(table.concat(sub, "  "))
for _, s in ipairs(EVAL_AT) do
  local row = {string.format("%6d", s)}
  for _, r in ipairs(runs) do
    local l = r.loss[s]
    row[#row + 1] = string.format("%-25s", string.format("%10s   %8.4f", l and string.format("%.4f", l) or "-", r.acc[s]))
  end
  print(table.concat(row, "  "))
end
local secs = {}
for _, r in ipairs(runs) do secs[#secs + 1] = string.format("%s %.1f s, %d skipped", r.name, r.seconds, r.skipped) end
print("(" .. table.concat(secs, "; ") .. ")")

-- ---- why: telemetry ----
local function pct(x) return x == 0 and "0" or string.format("%.2f%%", 100 * x) end

print()
print("Why: the f16 rounding points of the backward pass (values rounded to f16 in one backward,")
print("and how many of them were flushed to zero), from scaler:telemetry_table()'s info.backward;")
print("an op whose incoming gradient is already all zeros rounds zeros and flushes nothing")
for _, r in ipairs(runs) do
  for _, t in ipairs(r.tel) do
    local ops = {}
    for op in pairs(t.snap.ops) do ops[#ops + 1] = op end
    table.sort(ops)
    if #ops == 0 then
      print(string.format("  %-14s step %-4d  no f16 rounding (FP32 backward)", r.name, t.step))
    end
    for _, op in ipairs(ops) do
      local b = t.snap.ops[op]
      print(string.format("  %-14s step %-4d  %-8s rounded %9d   flushed to 0 %9d (%s)", r.name, t.step, op,
        b.rounded, b.flushed, pct(b.flushed / b.rounded)))
    end
  end
end

print()
print("d loss / d logits (the activation gradient entering the f16 backward, computed in f32 at")
print("the run's scale): how much of it f16 rounds to zero (for fp32: what f16 would round to zero)")
for _, r in ipairs(runs) do
  local steps = {}
  for st in pairs(r.logit) do steps[#steps + 1] = st end
  table.sort(steps)
  for _, st in ipairs(steps) do
    local g = r.logit[st]
    print(string.format("  %-14s step %-4d  %6d nonzero values, flushed to 0 by f16 %6d (%s)", r.name, st,
      g.nonzero, g.flushed, pct(g.flushed / math.max(1, g.nonzero))))
  end
end

print()
print("Per parameter (the step's FP32 .grad, last step): zeros, and gradients at or below 2^-25")
print("at the run's scale, which f16 flushes (for fp32: what f16 would have flushed)")
local names = {}
for name in pairs(runs[1].tel[#runs[1].tel].snap.params) do names[#names + 1] = name end
table.sort(names)
local h = {string.format("%-10s", "parameter")}
for _, r in ipairs(runs) do h[#h + 1] = string.format("%-27s", r.name .. ": zeros / f16 flush") end
print(table.concat(h, "  "))
for _, name in ipairs(names) do
  local row = {string.format("%-10s", name)}
  for _, r in ipairs(runs) do
    local p = r.tel[#r.tel].snap.params[name]
    row[#row + 1] = string.format("%-27s", string.format("%8s / %-8s", pct(p.zero_frac), pct(p.underflow_frac)))
  end
  print(table.concat(row, "  "))
end
local amax = 0
for _, p in pairs(runs[1].tel[#runs[1].tel].snap.params) do amax = math.max(amax, p.amax) end
print(string.format("(largest fp32 gradient %.3g = 2^%.1f; f16 keeps magnitudes above 2^-25 = %.3g, normals from 2^-14)",
  amax, math.log(amax, 2), 2.0 ^ -25))

-- ---- verdict ----
local last = opts.steps
local fp, un, sc = runs[1].acc[last], runs[2].acc[last], runs[3].acc[last]
print()
print(string.format("f16 unscaled: test accuracy %.4f after %d steps (from %.4f): %s", un, last, runs[2].acc[0],
  math.abs(un - runs[2].acc[0]) < 0.02 and "stalled, its gradients flushed to zero" or "trained"))
print(string.format("f16 x 2^%d:    test accuracy %.4f, fp32 %.4f (difference %.2f points)", opts.tiny, sc, fp, 100 * (sc - fp)))
