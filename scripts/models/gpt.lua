-- gpt.lua: a GPT in Lua on mpengine's ops: token and position embeddings,
-- pre-LayerNorm blocks of causal self-attention (mp.attention) and an MLP with
-- GELU, a final LayerNorm, and the output layer tied to the token embedding.
-- Parameter names and layouts are PyTorch's for the same modules (nn.Embedding,
-- nn.Linear, nn.LayerNorm), so a PyTorch state dict of the same definition loads
-- one to one. Initialisation is GPT-2's (GPT:init_weights): N(0, 0.02) for the
-- embeddings and Linear weights, zero biases, LayerNorms at ones and zeros, and
-- the residual projections (attn.c_proj, mlp.c_proj) at N(0, 0.02 / sqrt(2 *
-- layers)), so each block adds little to the residual stream at first. With the
-- output tied to the token embedding this matters: PyTorch's N(0, 1) embedding
-- gave logits of size ~sqrt(dim) and a first loss near 85, where GPT-2's gives
-- ~ln(vocab).
--
--   local GPT = dofile("scripts/models/gpt.lua")
--   local model = GPT{vocab = 114, ctx = 64, layers = 2, dim = 128, heads = 4}
--   local logits = model(idx)    -- idx {B, T} i32 -> {B, T, vocab}
local mp = mp or require "mp"
local nn = mp.nn

local Attention = nn.Module:extend("CausalSelfAttention")
function Attention:init(dim, heads)
  self.heads = heads
  self.c_attn = nn.Linear(dim, 3 * dim)
  self.c_proj = nn.Linear(dim, dim)
end
-- q, k, v: c_attn's {B, T, 3C} output read as {B, T, 3, H, Dh}, permuted once to
-- {3, B, H, T, Dh}, and cut along that leading 3 into three slabs of {B, H, T, Dh}
-- that share the permuted tensor's storage (chunk along dim 1 and reshape are
-- views), so one copy where chunk(3, 3) along the features made three and each
-- head split by a transpose three more. The same values and, in the backward, the
-- same gradient bits (the slabs' gradients padded and summed into one {3, B, H, T,
-- Dh} tensor, then one permute back, where the three were transposed back and
-- padded into {B, T, 3C}): tests/lua/gpt_qkv_spec.lua.
function Attention:forward(x)
  local B, T, C = x.shape[1], x.shape[2], x.shape[3]
  local H = self.heads
  local heads = { B, H, T, C // H }
  local qkv = self.c_attn(x):reshape { B, T, 3, H, C // H }:permute(3, 1, 4, 2, 5)   -- {3, B, H, T, Dh}
  local q, k, v = qkv:chunk(3, 1)
  local y = mp.attention(q:reshape(heads), k:reshape(heads), v:reshape(heads), { causal = true })
  return self.c_proj(y:transpose(2, 3):reshape { B, T, C })
end

local MLP = nn.Module:extend("MLP")
function MLP:init(dim)
  self.c_fc = nn.Linear(dim, 4 * dim)
  self.gelu = nn.GELU()
  self.c_proj = nn.Linear(4 * dim, dim)
end
-- c_fc and its GELU as one op (mp.linear_gelu: the same values as the two, one
-- pass fewer where the GEMM's epilogue does the GELU); the modules stay for
-- their parameters' names and the printed model. When either has hooks, or is
-- not the plain class (a replaced forward), or inside mp.fp8.autocast (where
-- nn.Linear:forward runs c_fc in FP8), the two run apart as modules.
local function plain(m, cls)
  local h = rawget(m, "_hooks")
  return getmetatable(m) == cls and rawget(m, "forward") == nil and m.forward == cls.forward
     and (not h or (#h.pre == 0 and #h.fwd == 0 and #h.bwd == 0))
end
local function in_fp8_region()   -- as nn.Linear:forward asks (lua/mp/nn/layers.lua)
  local active = package.loaded["mp.fp8.active"]
  return active ~= nil and active.top() ~= nil
end
function MLP:forward(x)
  local fc, act = self.c_fc, self.gelu
  if plain(fc, nn.Linear) and plain(act, nn.GELU) and not in_fp8_region() then
    return self.c_proj(mp.linear_gelu(x, fc.weight, fc.bias, { approximate = act.approximate }))
  end
  return self.c_proj(act(fc(x)))
end

local Block = nn.Module:extend("Block")
function Block:init(dim, heads)
  self.ln_1 = nn.LayerNorm(dim)
  self.attn = Attention(dim, heads)
  self.ln_2 = nn.LayerNorm(dim)
  self.mlp = MLP(dim)
end
function Block:forward(x)
  x = x + self.attn(self.ln_1(x))
  return x + self.mlp(self.ln_2(x))
end

local GPT = nn.Module:extend("GPT")
function GPT:init(cfg)
  assert(cfg.dim % cfg.heads == 0, "gpt: dim must be a multiple of heads")
  self.cfg = cfg
  self.wte = nn.Embedding(cfg.vocab, cfg.dim)
  self.wpe = nn.Embedding(cfg.ctx, cfg.dim)
  self.h = nn.ModuleList()
  for _ = 1, cfg.layers do self.h:append(Block(cfg.dim, cfg.heads)) end
  self.ln_f = nn.LayerNorm(cfg.dim)
  self:init_weights()
end

-- GPT-2's initialisation (see the header), drawn from mp's generator
-- (mp.manual_seed) in the parameters' order
function GPT:init_weights()
  local _ <close> = mp.no_grad()
  local std, proj_std = 0.02, 0.02 / math.sqrt(2 * self.cfg.layers)
  local named, names = self:named_parameters()
  for _, name in ipairs(names) do
    local p = named[name]
    if name:match("^h%.%d+%.ln_") or name:match("^ln_f%.") then
      -- LayerNorm: PyTorch's ones and zeros, as built
    elseif name:match("%.bias$") then
      p:copy_(mp.zeros(p.shape))
    elseif name:match("c_proj%.weight$") then
      p:copy_(mp.randn(p.shape) * proj_std)
    else   -- wte, wpe and the other Linear weights
      p:copy_(mp.randn(p.shape) * std)
    end
  end
end

-- idx {B, T} i32 (T <= ctx) -> logits {B, T, vocab}
function GPT:forward(idx)
  local T = idx.shape[2]
  assert(T <= self.cfg.ctx, "gpt: the sequence is longer than the context")
  local pos = mp.arange(T, { dtype = "i32", device = idx.device })
  local x = self.wte(idx) + self.wpe(pos)
  for _, block in ipairs(self.h) do x = block(x) end
  return mp.linear(self.ln_f(x), self.wte.weight)   -- tied output layer: x @ wte^T, the GEMM's transpose flag, no copy
end

-- n more ids after prompt (a 1-d i32 tensor): temperature, then the top_k most likely
function GPT:generate(prompt, n, temperature, top_k)
  local _ <close> = mp.no_grad()
  local ids = prompt:totable()
  for _ = 1, n do
    local from = math.max(1, #ids - self.cfg.ctx + 1)
    local window = {}
    for i = from, #ids do window[#window + 1] = ids[i] end
    local logits = self(mp.tensor({ window }, { dtype = "i32", device = prompt.device }))
    -- the last position's logits, sampled on the CPU (a row of vocab values; the
    -- CUDA backend has no topk yet)
    local last = logits:select(2, -1):select(1, 1):to("f32"):cpu() / temperature
    local v, i = last:topk(math.min(top_k, last.shape[1]))
    local pick = mp.multinomial(mp.softmax(v, 1), 1):item()
    ids[#ids + 1] = i[pick + 1]:item()
  end
  return mp.tensor(ids, { dtype = "i32", device = "cpu" })
end

return GPT
