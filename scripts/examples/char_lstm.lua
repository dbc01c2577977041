-- char_lstm.lua: a character-level LSTM language model on a text file.
--
--   build/mpengine scripts/examples/char_lstm.lua [PATH] [--steps 300] [--hidden 128] [--layers 2]
--       [--embed 32] [--seq 64] [--batch 32] [--lr 3e-3] [--dropout 0] [--amp off|f16|bf16]
--       [--every 25] [--sample 200] [--seed 0]
--
-- PATH: any text file; by default Debian's fortune file "computers"
-- (/usr/share/games/fortunes/computers), or this repository's README.md where
-- the fortunes are not installed. The text becomes byte ids with mp.data.text,
-- and each step trains on --batch random windows of --seq + 1 characters
-- (mp.data.windows): Embedding -> nn.LSTM (batch_first) -> Linear, cross-entropy
-- on the next character, Adam, gradients clipped to norm 1. Every --every steps
-- it prints the mean training loss of those steps, then the validation loss
-- (the text's last 10%), then --sample characters drawn one at a time with the
-- LSTM's state carried from character to character (temperature 0.8).
-- The line `loss: FIRST -> LAST` compares the first and the last --every steps.
local mp = mp or require "mp"
local here = (debug.getinfo(1, "S").source:match("^@(.*/)") or "./")
local cli = dofile(here .. "../lib/cli.lua")
local nn = mp.nn

local function usage(msg)
  io.stderr:write("char_lstm.lua: ", msg, "\n",
    "usage: char_lstm.lua [PATH] [--steps N] [--hidden H] [--layers L] [--embed E] [--seq T] [--batch B]\n",
    "                     [--lr LR] [--dropout P] [--amp off|f16|bf16] [--every N] [--sample N] [--seed S]\n")
  os.exit(2)
end

local argv, path = {}, nil
for i, a in ipairs(arg or {}) do
  if i == 1 and a:sub(1, 2) ~= "--" then path = a else argv[#argv + 1] = a end
end
local opts = cli.parse(argv, {
  steps = "int", hidden = "int", layers = "int", embed = "int", seq = "int", batch = "int", lr = "num",
  dropout = "num", amp = "str", every = "int", sample = "int", seed = "int",
}, {
  steps = 300, hidden = 128, layers = 2, embed = 32, seq = 64, batch = 32, lr = 3e-3, dropout = 0, amp = "off",
  every = 25, sample = 200, seed = 0,
}, usage, { dropout = true, sample = true, seed = true })
if opts.amp ~= "off" and opts.amp ~= "f16" and opts.amp ~= "bf16" then usage("--amp must be off, f16 or bf16") end

if not path then
  local fortune = "/usr/share/games/fortunes/computers"
  local f = io.open(fortune, "rb")
  if f then f:close(); path = fortune else path = here .. "../../README.md" end
end
mp.manual_seed(opts.seed)
local text = mp.data.text(path)
local V = text.vocab_size
print(string.format("text: %s, %d bytes, %d distinct", path, text.bytes, V))

local CharLSTM = nn.Module:extend("CharLSTM")
function CharLSTM:init()
  self.embed = nn.Embedding(V, opts.embed)
  self.lstm = nn.LSTM(opts.embed, opts.hidden, { num_layers = opts.layers, batch_first = true, dropout = opts.dropout })
  self.head = nn.Linear(opts.hidden, V)
end
-- x {batch, seq} ids -> logits {batch, seq, V}, and the LSTM's final state
function CharLSTM:forward(x, state)
  local out, st = self.lstm(self.embed(x), state)
  return self.head(out), st
end

local model = CharLSTM():to(mp.default_device())
local opt = mp.optim.Adam(model:parameters(), { lr = opts.lr })
local scaler = opts.amp == "f16" and mp.amp.GradScaler() or nil

local function loss_of(x, y)
  local _ <close> = mp.amp.autocast(opts.amp ~= "off" and opts.amp or false)
  local logits = model(x)
  return mp.cross_entropy(logits:reshape { -1, V }:to("f32"), y:reshape { -1 })
end

local window, first, last = 0, nil, nil
for step = 1, opts.steps do
  local x, y = mp.data.windows(text.train, opts.batch, opts.seq)
  opt:zero_grad()
  local loss = loss_of(x, y)
  if scaler then
    scaler:scale(loss):backward()
    scaler:unscale(opt)
  else
    loss:backward()
  end
  mp.optim.clip_grad_norm(model:parameters(), 1.0)
  if scaler then scaler:step(opt); scaler:update() else opt:step() end
  window = window + loss:item()
  if step % opts.every == 0 or step == opts.steps then
    local n = step % opts.every == 0 and opts.every or step % opts.every
    local mean = window / n
    first, last, window = first or mean, mean, 0
    local val
    do
      local _ <close> = mp.no_grad()
      model:eval()
      local vx, vy = mp.data.windows(text.val, opts.batch, math.min(opts.seq, text.val:numel() - 1))
      val = loss_of(vx, vy):item()
      model:train()
    end
    print(string.format("step %4d  train loss %.4f  val loss %.4f", step, mean, val))
  end
end
print(string.format("loss: %.4f -> %.4f", first, last))

if opts.sample > 0 then
  local _ <close> = mp.no_grad()
  model:eval()
  local ids, state = { text.encode("\n"):totable()[1] }, nil
  local out = {}
  for _ = 1, opts.sample do
    local logits
    logits, state = model(mp.tensor({ { ids[#ids] } }, { dtype = "i32", device = mp.default_device() }), state)
    local p = mp.softmax(logits:reshape { V }:to("f32"):cpu() / 0.8, 1)
    ids[#ids + 1] = mp.multinomial(p, 1):item()
    out[#out + 1] = ids[#ids]
  end
  print("sample:")
  print(text.decode(out))
end
