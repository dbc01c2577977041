-- gpt_qkv_pair.lua (not a spec): the pair of training runs gpt_qkv_spec.lua
-- compares, scripts/models/gpt.lua as it is and with the attention's q, k, v
-- made as before (chunk(3, 3) and transposes), on the default device. Loaded
-- by the spec in its own process, or in a child on the emulated device:
--   local P = dofile("tests/lua/gpt_qkv_pair.lua"); P.compare("bf16") -> the losses
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"

local CFG = { vocab = 40, ctx = 64, layers = 1, dim = 128, heads = 2 }   -- head dim 64
local BATCH, STEPS = 2, 3

-- the attention as gpt.lua built it before: three narrow copies, three transposes
local function chunk_forward(self, x)
  local B, T, C = x.shape[1], x.shape[2], x.shape[3]
  local q, k, v = self.c_attn(x):chunk(3, 3)
  local function heads(t) return t:reshape { B, T, self.heads, C // self.heads }:transpose(2, 3) end
  local y = mp.attention(heads(q), heads(k), heads(v), { causal = true })
  return self.c_proj(y:transpose(2, 3):reshape { B, T, C })
end

-- STEPS training steps; the parameters and gradients written to a safetensors
-- file, whose bytes are returned with the losses (printed to 9 digits)
local function train(mode, old_layout)
  local GPT = dofile(H.root .. "/scripts/models/gpt.lua")
  local dev = mp.default_device()
  mp.manual_seed(0)
  local model = GPT(CFG)
  model:to(dev)
  if old_layout then
    for _, block in ipairs(model.h) do block.attn.forward = chunk_forward end
  end
  local opt = mp.optim.AdamW(mp.optim.decay_groups(model, 0.1), { lr = 3e-3 })
  local scaler = mode == "f16" and mp.amp.GradScaler {} or nil
  local ids = mp.randint(0, CFG.vocab, { 4096 }, { device = "cpu" })
  local losses = {}
  for s = 1, STEPS do
    local x, y = mp.data.windows(ids, BATCH, CFG.ctx)
    x, y = x:to(dev), y:to(dev)
    opt:zero_grad()
    local loss
    do
      local _ <close> = mode ~= "f32" and mp.amp.autocast(mode) or nil
      loss = mp.cross_entropy(model(x):reshape { -1, CFG.vocab }, y:reshape { -1 })
    end
    if scaler then
      scaler:scale(loss):backward()
      scaler:unscale(opt)
      mp.optim.clip_grad_norm(model:parameters(), 1.0)
      scaler:step(opt)
      scaler:update()
    else
      loss:backward()
      mp.optim.clip_grad_norm(model:parameters(), 1.0)
      opt:step()
    end
    losses[s] = string.format("%.9g", loss:item())
  end
  local out, named = {}, model:named_parameters()
  for name, p in pairs(named) do
    out["param." .. name] = p:cpu()
    out["grad." .. name] = p.grad:cpu()
  end
  local path = os.tmpname()
  mp.save(path, out)
  local bytes = H.slurp(path)
  os.remove(path)
  return table.concat(losses, " "), bytes
end

-- the two runs, bit for bit: raises where they differ, else returns the losses
local function compare(mode)
  local loss_new, new = train(mode, false)
  local loss_old, old = train(mode, true)
  assert(loss_old == loss_new, "losses " .. loss_old .. " (chunk(3, 3)) and " .. loss_new .. " (permute)")
  assert(#new > 0 and #new == #old, "file sizes " .. #new .. ", " .. #old)
  if new ~= old then
    local at = 1
    while new:byte(at) == old:byte(at) do at = at + 1 end
    error(string.format("%s: the safetensors files first differ at byte %d of %d", mode, at, #new))
  end
  return loss_new
end

return { compare = compare, train = train }
