-- demo.lua: the small run each AMP recipe of this folder (amp_*.lua) trains when
-- run as a script: a 8-16-8 network learning a fixed linear map under f16 autocast,
-- plain SGD, a default GradScaler. The recipes load it only then (the spec loads
-- them for their train() alone), so what is particular to a recipe stays in its file.
local mp = mp or require "mp"

local demo = {}

-- Linear(8, 16), the hidden layer (ReLU unless given), Linear(16, 8)
function demo.model(hidden)
  local nn = mp.nn
  return nn.Sequential(nn.Linear(8, 16), hidden or nn.ReLU(), nn.Linear(16, 8))
end

-- Seeds the generator and returns {model, opt, scaler, batches}: demo.model(o.hidden),
-- SGD at lr 0.1 over its parameters, a GradScaler, and o.batches (40) batches of
-- o.rows (8) inputs with their targets, a fixed random linear map of the inputs.
function demo.setup(o)
  o = o or {}
  mp.manual_seed(0)
  local d = { model = demo.model(o.hidden) }
  d.opt = mp.optim.SGD(d.model:parameters(), { lr = 0.1 })
  d.scaler = mp.amp.GradScaler()
  local teacher = mp.randn{8, 8}
  d.batches = {}
  for i = 1, o.batches or 40 do
    local x = mp.randn{o.rows or 8, 8}
    d.batches[i] = { x, mp.matmul(x, teacher) }
  end
  return d
end

-- Prints "<label> first -> last, ..., scale S, skipped K of N steps": for each
-- label and list of losses (one per iteration) that follow `steps`, the first and
-- the last; then what the scaler did over the run's `steps` optimizer steps.
function demo.report(scaler, steps, ...)
  local args, falls = { ... }, {}
  for k = 1, #args, 2 do
    local losses = args[k + 1]
    falls[#falls + 1] = string.format("%s %.4f -> %.4f", args[k], losses[1], losses[#losses])
  end
  print(string.format("%s, scale %g, skipped %d of %d steps",
    table.concat(falls, ", "), scaler:get_scale(), scaler.stats.skipped, steps))
end

return demo
