-- fp8_spike.lua: an activation outlier under three FP8 scaling recipes (issue 30,
-- item 5's spike). The default char GPT of train_gpt.lua (scripts/models/gpt.lua,
-- Debian's fortunes or --data PATH, AdamW with its warmup and cosine, gradients
-- clipped to 1) trains --steps steps under mp.fp8.autocast, once per recipe, from
-- the same seed and the same batches, each run recording an fp8 trace (fs:trace).
-- At step --spike one channel (--channel, 1-based) of the input of the first
-- block's MLP up-projection (h.0.mlp.c_fc, by a forward pre-hook) is multiplied by
-- --factor, for that step's forward only: an outlier feature, as LLMs grow them.
-- Under delayed scaling the multiplier of that input comes from the amaxes of the
-- steps before, so the outlier channel saturates; current scaling takes the step's
-- own amax (nothing saturates; the other values are squeezed toward zero), block
-- scaling the amax of each 1x128 tile.
--
--   build/mpengine scripts/fp8_spike.lua [--steps 40] [--spike 30] [--factor 1000]
--       [--channel 1] [--recipes delayed,current,block] [--layers 2] [--dim 128]
--       [--heads 4] [--ctx 64] [--batch 32] [--lr 3e-3] [--seed 0] [--data PATH]
--       [--trace-dir DIR] [--check]
--
-- Prints per recipe the affected tensor's amax, the measured fraction of its
-- values saturated and of its nonzero values flushed to zero at the spike step
-- (the holder's counts), and the final training loss; then mp.fp8.replay of the
-- delayed run's trace against delayed and current: what each predicts at the spike
-- step (a counterfactual on the recorded amaxes). --check exits 1 unless delayed
-- saturates at the spike, current and block do not, and replay predicts both.
-- Recipes as fp8_lab.lua takes them (scripts/lib/fp8_recipe.lua).
local mp = mp or require "mp"
local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
local cli = dofile(here .. "lib/cli.lua")
local recipe_of = dofile(here .. "lib/fp8_recipe.lua")
local GPT = dofile(here .. "models/gpt.lua")
local T = require "mp.fp8.trace"

local function usage(msg)
  io.stderr:write("fp8_spike.lua: ", msg, "\n",
    "usage: fp8_spike.lua [--steps N] [--spike S] [--factor F] [--channel C] [--recipes R1,R2,...]\n",
    "                     [--layers L] [--dim D] [--heads H] [--ctx T] [--batch B] [--lr LR] [--seed S]\n",
    "                     [--data PATH] [--trace-dir DIR] [--check]\n")
  os.exit(2)
end

local opts = cli.parse(arg or {}, {
  steps = "int", spike = "int", factor = "num", channel = "int", recipes = "str", layers = "int", dim = "int",
  heads = "int", ctx = "int", batch = "int", lr = "num", seed = "int", data = "str", ["trace-dir"] = "str",
  check = "flag",
}, {
  steps = 40, spike = 30, factor = 1000, channel = 1, recipes = "delayed,current,block", layers = 2, dim = 128,
  heads = 4, ctx = 64, batch = 32, lr = 3e-3, seed = 0,
}, usage, {seed = true})
if opts.spike > opts.steps then usage("--spike must be at most --steps") end
if opts.channel > opts.dim then usage("--channel must be at most --dim") end
if opts.dim % opts.heads ~= 0 then usage("--dim must be a multiple of --heads") end
-- one spec per comma (a spec's own k=v list uses commas too: split before NAME or a path)
local specs = {}
for part in (opts.recipes .. ","):gmatch("([^,]*),") do
  if part:match("^%a+$") or part:match("^%a+:") or part:find("/", 1, true) or part:match("%.lua$") or #specs == 0 then
    specs[#specs + 1] = part
  else
    specs[#specs] = specs[#specs] .. "," .. part
  end
end
if type(mp.fp8.Scaler) ~= "function" and type(mp.fp8.Scaler) ~= "table" or mp.fp8.autocast == nil then
  usage("mp.fp8.Scaler and mp.fp8.autocast are not in this build (FP8 training, docs/API.md)")
end
local recipes = {}
for k, spec in ipairs(specs) do
  local r, label = recipe_of(spec, usage)
  recipes[k] = {spec = spec, label = label, recipe = r}
end
local dir = opts["trace-dir"]
local tmpdir
if not dir then
  tmpdir = os.tmpname()
  os.remove(tmpdir)
  dir = tmpdir
end
if not os.execute("mkdir -p '" .. dir:gsub("'", "'\\''") .. "'") then usage("cannot make the folder " .. dir) end

local text = mp.data.text(opts.data)
local cfg = {vocab = text.vocab_size, ctx = opts.ctx, layers = opts.layers, dim = opts.dim, heads = opts.heads}
local V = cfg.vocab

-- one run under `recipe`: the trace's path, the final training loss and the name
-- of the tensor state of the spiked input
local function run(c)
  mp.manual_seed(opts.seed)
  local model = GPT(cfg)
  local groups = mp.optim.decay_groups(model, 0.1)
  local opt = mp.optim.AdamW(groups, {lr = opts.lr})
  opt:set_schedule(mp.optim.schedule.cosine{warmup = math.min(30, opts.steps), total = opts.steps, min_lr = opts.lr * 0.1})
  -- the spiked layer's path, as the holder names layers (its parameters' prefix)
  local target = model.h[1].mlp.c_fc
  local layer
  for name, p in pairs(model:named_parameters()) do
    if p == target.weight then layer = name:gsub("%.weight$", "") end
  end
  local step, mask = 0, nil
  local hook = target:register_forward_pre_hook(function(_, x)
    if step ~= opts.spike then return nil end
    if not mask then
      local m = {}
      for j = 1, opts.dim do m[j] = j == opts.channel and opts.factor or 1 end
      mask = mp.tensor(m, {device = x.device})
    end
    return x * mask:to(x.dtype)   -- {B, T, dim} times {dim}: one channel of every token
  end)
  local fs = mp.fp8.Scaler{recipe = c.recipe, telemetry = true, model = model}   -- model: layers by their paths
  local path = string.format("%s/%s.jsonl", dir, c.label:gsub("[^%w_.-]", "_"))
  fs:trace(path, {meta = {script = "fp8_spike.lua", recipe = c.spec, spike = opts.spike, factor = opts.factor,
                          channel = opts.channel, layer = layer, seed = opts.seed}})
  local loss
  while step < opts.steps do
    step = step + 1
    opt:zero_grad()
    local x, y = mp.data.windows(text.train, opts.batch, opts.ctx)
    do
      local _ <close> = mp.fp8.autocast(fs)
      loss = mp.cross_entropy(model(x):reshape{-1, V}, y:reshape{-1})
    end
    loss:backward()
    mp.optim.clip_grad_norm(model:parameters(), 1.0)
    opt:step()
    fs:update()
  end
  fs:trace(false)
  hook:remove()
  return path, loss:item(), layer
end

print(string.format("fp8_spike: gpt %d layers, d %d, ctx %d, batch %d; %d steps; at step %d channel %d of the input "
  .. "of h.0.mlp.c_fc times %g", opts.layers, opts.dim, opts.ctx, opts.batch, opts.steps, opts.spike, opts.channel,
  opts.factor))
print(string.format("%-24s %-26s %12s %12s %12s %12s %10s", "recipe", "tensor", "amax before", "amax spike",
  "saturated", "flushed", "loss"))
local function pct(x) return x == nil and "-" or string.format("%.4g%%", 100 * x) end
local results, delayed_trace = {}, nil
for _, c in ipairs(recipes) do
  local path, loss, layer = run(c)
  local tr = T.load(path)
  local k
  for i, t in ipairs(tr.header.tensors) do
    if t.kind == "x" and (t.layer == layer or t.name == layer .. ".x") then k = i end
  end
  if not k then usage("the trace " .. path .. " has no input tensor of layer " .. tostring(layer)) end
  local s, before = tr.steps[opts.spike], opts.spike > 1 and tr.steps[opts.spike - 1] or nil
  local res = {label = c.label, name = tr.header.tensors[k].name, k = k, saturated = s and s.saturated[k],
               flushed = s and s.flushed[k], amax = s and s.amax[k], before = before and before.amax[k], loss = loss}
  results[#results + 1] = res
  if c.label:match("^delayed") and not delayed_trace then delayed_trace = {tr = tr, k = k, spec = c.spec} end
  print(string.format("%-24s %-26s %12s %12s %12s %12s %10.4f", c.label, res.name,
    res.before and string.format("%.4g", res.before) or "-", res.amax and string.format("%.4g", res.amax) or "-",
    pct(res.saturated), pct(res.flushed), loss))
end

local ok = true
local function expect(cond, what)
  print(string.format("  %s %s", cond and "yes:" or "NO: ", what))
  if not cond then ok = false end
end
print("\nat the spike step:")
for _, r in ipairs(results) do
  if r.label:match("^delayed") then
    expect(r.saturated ~= nil and r.saturated > 0, r.label .. " saturates (" .. pct(r.saturated) .. " of the values)")
  elseif r.label:match("^current") or r.label:match("^block") then
    expect(r.saturated == 0, r.label .. " does not saturate (" .. pct(r.saturated) .. ")")
  end
end
if delayed_trace then
  print("\nreplay of the delayed run's trace (mp.fp8.replay, a counterfactual on its recorded amaxes):")
  for _, spec in ipairs{delayed_trace.spec, "current"} do
    local r = recipe_of(spec, usage)
    local traj = T.replay(delayed_trace.tr, r)
    local e, k = traj.steps[opts.spike], delayed_trace.k
    if e and e.amax[k] then
      print(string.format("  %-10s step %d %s: multiplier %.4g, amax x multiplier = %.4g x FP8_MAX -> %s", spec,
        opts.spike, traj.tensors[k].name, e.scale[k] or 0 / 0, 2 ^ -e.headroom[k],
        e.saturated[k] and string.format("saturates (overshoot %.4gx)", e.overshoot[k])
        or (e.underflow[k] and "all flushed" or "no saturation")))
      if spec ~= "current" then expect(e.saturated[k], "replay predicts delayed saturating")
      else expect(not e.saturated[k], "replay predicts current not saturating") end
    end
  end
end
if tmpdir and not opts["trace-dir"] then os.execute("rm -rf '" .. tmpdir:gsub("'", "'\\''") .. "'") end
if opts.check and not ok then os.exit(1) end
