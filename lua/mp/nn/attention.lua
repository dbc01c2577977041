-- mp.nn's attention layers: MultiheadAttention, PyTorch's nn.MultiheadAttention
-- (embed_dim = kdim = vdim) over mp.attention.
--
-- Parameters as PyTorch names and initialises them: in_proj_weight {3E, E}
-- (xavier_uniform: U(-sqrt(6 / 4E), sqrt(6 / 4E))), in_proj_bias {3E} (zeros),
-- out_proj.weight {E, E} (Linear's default init) and out_proj.bias (zeros),
-- so a PyTorch state_dict loads as it is.
--
-- Forward: the fused mp.attention (no t x t scores in memory) when no mask is
-- given and no weights are asked for; otherwise the scores are made explicitly
-- (matmul, the mask, softmax, dropout, matmul) in the order of PyTorch 1.13's
-- _scaled_dot_product_attention, so that the weights can be returned.
local core = require "mp.core"
local common = require "mp.nn.common"
common.own_file()

local raise, show, shape_str = common.raise, common.show, common.shape_str
local check_size, check_opts, is_tensor = common.check_size, common.check_opts, common.is_tensor
local Module = require("mp.nn.module").Module
local Linear = require("mp.nn.layers").Linear

local attention = {}

local NAME = "mp.nn.MultiheadAttention"

-- MultiheadAttention(embed_dim, num_heads [, {dropout = 0, bias = true, batch_first = false}])
local MHA = Module:extend("MultiheadAttention")
attention.MultiheadAttention = MHA

function MHA:init(embed_dim, num_heads, opts)
  local E = check_size(NAME, "embed_dim", embed_dim)
  local H = check_size(NAME, "num_heads", num_heads)
  opts = check_opts(NAME, opts, { dropout = 0, bias = true, batch_first = false })
  if E % H ~= 0 then
    raise(string.format("%s: embed_dim must be divisible by num_heads (got %d and %d)", NAME, E, H))
  end
  if not (opts.dropout >= 0 and opts.dropout < 1) then
    raise(NAME .. ": dropout must be a number in [0, 1) (got " .. show(opts.dropout) .. ")")
  end
  self.embed_dim, self.num_heads, self.head_dim = E, H, E // H
  self.dropout, self.batch_first = opts.dropout, opts.batch_first
  self:add_parameter("in_proj_weight", common.uniform({ 3 * E, E }, math.sqrt(6 / (E + 3 * E))))
  if opts.bias then self:add_parameter("in_proj_bias", core.zeros({ 3 * E }, { dtype = "f32" })) end
  self.out_proj = Linear(E, E, { bias = false })   -- its weight: Linear's init, as PyTorch's
  if opts.bias then self.out_proj:add_parameter("bias", core.zeros({ E }, { dtype = "f32" })) end
end

-- x {N, T, E} -> {N, H, T, hd}
local function heads(self, x)
  local s = x.shape
  return x:reshape({ s[1], s[2], self.num_heads, self.head_dim }):transpose(2, 3)
end

-- an input as {N, T, E} (batch first), checked; unbatched {T, E} gets N = 1
local function batch_first(self, x, what)
  if not is_tensor(x) then raise(string.format("%s: %s must be a tensor (got %s)", NAME, what, show(x))) end
  local s, E = x.shape, self.embed_dim
  if (#s ~= 2 and #s ~= 3) or s[#s] ~= E then
    raise(string.format("%s: %s must be {L, N, %d}, {N, L, %d} with batch_first, or {L, %d} (got %s)",
                        NAME, what, E, E, E, shape_str(s)))
  end
  if #s == 2 then return x:reshape({ 1, s[1], E }), false end
  if not self.batch_first then x = x:transpose(1, 2) end
  return x, true
end

-- the additive mask's shape check: {L, S} or {N * H, L, S}
local function mask_for(self, mask, N, L, S)
  if not is_tensor(mask) then raise(NAME .. ": attn_mask must be a tensor (got " .. show(mask) .. ")") end
  local s = mask.shape
  local ok = (#s == 2 and s[1] == L and s[2] == S) or (#s == 3 and s[1] == N * self.num_heads and s[2] == L and s[3] == S)
  if not ok then
    raise(string.format("%s: attn_mask must be {%d, %d} or {%d, %d, %d} (got %s)", NAME, L, S,
                        N * self.num_heads, L, S, shape_str(s)))
  end
  if #s == 3 then mask = mask:reshape({ N, self.num_heads, L, S }) end
  return mask
end

-- m(query, key, value [, {attn_mask =, is_causal = false, need_weights = false}]) -> out [, weights]
function MHA:forward(query, key, value, opts)
  if opts ~= nil and type(opts) ~= "table" then
    raise(NAME .. ": the options must be a table {attn_mask =, is_causal =, need_weights =} (got " .. show(opts) .. ")")
  end
  opts = common.checked_options(NAME, opts, "attn_mask:any is_causal:boolean need_weights:boolean")
  local q, batched = batch_first(self, query, "query")
  local k, kb = batch_first(self, key, "key")
  local v, vb = batch_first(self, value, "value")
  if kb ~= batched or vb ~= batched then raise(NAME .. ": query, key and value must all be batched or all unbatched") end
  local N, L, S, E = q.shape[1], q.shape[2], k.shape[2], self.embed_dim
  if k.shape[1] ~= N or v.shape[1] ~= N or v.shape[2] ~= S then
    raise(string.format("%s: key and value must have the query's batch size (%d) and one length (got %s and %s)",
                        NAME, N, shape_str(key.shape), shape_str(value.shape)))
  end
  local w, b = self.in_proj_weight, self.in_proj_bias
  local function proj(x, i)
    return core.linear(x, w:narrow(1, i * E + 1, E), b and b:narrow(1, i * E + 1, E) or nil)
  end
  q, k, v = heads(self, proj(q, 0)), heads(self, proj(k, 1)), heads(self, proj(v, 2))
  local p = self.training and self.dropout or 0
  local mask = opts.attn_mask
  local o, weights
  if mask == nil and not opts.need_weights then
    o = core.attention(q, k, v, { causal = opts.is_causal == true, dropout = p })
  else
    -- PyTorch's order: q / sqrt(hd), then q k^T (+ the mask), softmax, dropout, @ v
    local scores = core.matmul(q / math.sqrt(self.head_dim), k:transpose(3, 4))
    if opts.is_causal then
      local causal = core.ones({ L, S }, { dtype = "f32", device = scores.device }):triu(1):gt(0)
      scores = scores:masked_fill(causal, -math.huge)
    end
    if mask ~= nil then
      mask = mask_for(self, mask, N, L, S)
      if mask.dtype == "u8" then   -- true: not allowed (a comparison's result, or PyTorch's bool masks)
        scores = scores:masked_fill(mask, -math.huge)
      else
        scores = scores + mask:to(scores.dtype)
      end
    end
    local a = core.softmax(scores, -1)
    if p > 0 then a = core.dropout(a, p, true) end
    weights = a   -- after dropout, as PyTorch returns them
    o = core.matmul(a, v)
  end
  o = self.out_proj(o:transpose(2, 3):reshape({ N, L, E }))
  if not batched then
    o = o:reshape({ L, E })
  elseif not self.batch_first then
    o = o:transpose(1, 2)
  end
  if not opts.need_weights then return o end
  weights = weights:mean(2)   -- {N, L, S}: averaged over the heads, as PyTorch's default
  if not batched then weights = weights:reshape({ L, S }) end
  return o, weights
end

function MHA:extra_repr()
  return string.format("embed_dim=%d, num_heads=%d, dropout=%g, bias=%s, batch_first=%s", self.embed_dim,
                       self.num_heads, self.dropout, tostring(self.in_proj_bias ~= nil), tostring(self.batch_first))
end

return attention
