-- mp.nn's layers: Linear, the activations, GELU, Dropout, LayerNorm, RMSNorm, Embedding.
-- A layer is a class here and a line `layers.Name = Name`: nn.lua takes every
-- class of this table (and of conv.lua's) into mp.nn, so a new layer is written
-- in one place.
local core = require "mp.core"
local common = require "mp.nn.common"
common.own_file()

local raise, show = common.raise, common.show
local check_size, check_opts = common.check_size, common.check_opts
local M = require "mp.nn.module"
local Module = M.Module
local uniform = common.uniform

local layers = {}

-- Linear(in, out [, {bias=true}]): y = x @ weight^T + bias, weight {out,in}.
-- PyTorch's default init: kaiming_uniform_(a=sqrt(5)) gives weight ~ U(-1/sqrt(in), 1/sqrt(in)),
-- and the bias ~ U(-1/sqrt(in), 1/sqrt(in)). mp.manual_seed makes it reproducible.
local Linear = Module:extend("Linear")
layers.Linear = Linear

function Linear:init(in_features, out_features, opts)
  in_features = check_size("mp.nn.Linear", "in_features", in_features)
  out_features = check_size("mp.nn.Linear", "out_features", out_features)
  opts = check_opts("mp.nn.Linear", opts, { bias = true })
  self.in_features, self.out_features = in_features, out_features
  local bound = 1 / math.sqrt(in_features)
  self:add_parameter("weight", uniform({ out_features, in_features }, bound))
  if opts.bias then self:add_parameter("bias", uniform({ out_features }, bound)) end
end

-- inside mp.fp8.autocast the product runs in FP8 (lua/mp/fp8/linear.lua); the
-- regions' stack is mp.fp8.active's, loaded by the first region (none before)
function Linear:forward(x)
  local active = package.loaded["mp.fp8.active"]
  local f = active and active.top()
  if f then return f.holder:_linear(self, x, f.dtype) end
  return core.linear(x, self.weight, self.bias)
end

function Linear:extra_repr()
  return string.format("in_features=%d, out_features=%d, bias=%s", self.in_features, self.out_features,
                       tostring(self.bias ~= nil))
end

-- Sequential(m1, m2, ...): children "0", "1", ...; forward feeds each output to the next.

local function activation(name, fn)
  local cls = Module:extend(name)
  cls.forward = function(self, x) return fn(x) end
  layers[name] = cls
  return cls
end

activation("ReLU", function(x) return core.relu(x) end)
activation("Tanh", function(x) return core.tanh(x) end)
activation("Sigmoid", function(x) return core.sigmoid(x) end)
activation("SiLU", function(x) return core.silu(x) end)
activation("Identity", function(x) return x end)

-- GELU([approximate]) with approximate "none" (default, the erf form) or "tanh";
-- also GELU{approximate="tanh"}
local GELU = Module:extend("GELU")
layers.GELU = GELU

function GELU:init(approximate)
  if type(approximate) == "table" then
    approximate = check_opts("mp.nn.GELU", approximate, { approximate = "none" }).approximate
  end
  approximate = approximate or "none"
  if approximate ~= "none" and approximate ~= "tanh" then
    raise("mp.nn.GELU: approximate must be \"none\" or \"tanh\" (got " .. show(approximate) .. ")")
  end
  self.approximate = approximate
end

function GELU:forward(x) return core.gelu(x, { approximate = self.approximate }) end

function GELU:extra_repr()
  return self.approximate == "none" and "" or "approximate='" .. self.approximate .. "'"
end

-- Dropout([p=0.5]): zeroes each element with probability p while training and
-- scales the rest by 1/(1-p); the identity after m:eval()
local Dropout = Module:extend("Dropout")
layers.Dropout = Dropout

function Dropout:init(p)
  if p == nil then p = 0.5 end
  if type(p) ~= "number" or not (p >= 0 and p <= 1) then
    raise("mp.nn.Dropout: p must be a number in [0, 1] (got " .. show(p) .. ")")
  end
  self.p = p
end

function Dropout:forward(x) return core.dropout(x, self.p, self.training) end

function Dropout:extra_repr() return "p=" .. tostring(self.p) end

-- LayerNorm(d [, {eps=1e-5, elementwise_affine=true, bias=true}]): normalises
-- over the last dim, of size d; weight ones and bias zeros, as PyTorch
local LayerNorm = Module:extend("LayerNorm")
layers.LayerNorm = LayerNorm

function LayerNorm:init(d, opts)
  if type(d) == "table" and #d == 1 then d = d[1] end
  d = check_size("mp.nn.LayerNorm", "normalized_shape", d)
  opts = check_opts("mp.nn.LayerNorm", opts, { eps = core._LAYER_NORM_EPS, elementwise_affine = true, bias = true })
  if not (opts.eps > 0) then
    raise("mp.nn.LayerNorm: eps must be positive (got " .. show(opts.eps) .. ")")
  end
  self.normalized_shape, self.eps, self.elementwise_affine = d, opts.eps, opts.elementwise_affine
  if opts.elementwise_affine then
    self:add_parameter("weight", core.ones({ d }, { dtype = "f32" }))
    if opts.bias then self:add_parameter("bias", core.zeros({ d }, { dtype = "f32" })) end
  end
end

function LayerNorm:forward(x) return core.layer_norm(x, self.weight, self.bias, self.eps) end

function LayerNorm:extra_repr()
  return string.format("(%d,), eps=%g, elementwise_affine=%s", self.normalized_shape, self.eps,
                       tostring(self.elementwise_affine))
end

-- RMSNorm(d [, {eps=f32's epsilon, elementwise_affine=true}]): x / sqrt(mean(x^2) + eps)
-- * weight over the last dim, of size d; weight ones, no bias, as PyTorch's (whose eps
-- None is the dtype's epsilon: rms_norm computes in f32, so f32's, 1.1920929e-07)
local RMSNorm = Module:extend("RMSNorm")
layers.RMSNorm = RMSNorm

function RMSNorm:init(d, opts)
  if type(d) == "table" and #d == 1 then d = d[1] end
  d = check_size("mp.nn.RMSNorm", "normalized_shape", d)
  opts = check_opts("mp.nn.RMSNorm", opts, { eps = core._RMS_NORM_EPS, elementwise_affine = true })
  if not (opts.eps > 0) then
    raise("mp.nn.RMSNorm: eps must be positive (got " .. show(opts.eps) .. ")")
  end
  self.normalized_shape, self.eps, self.elementwise_affine = d, opts.eps, opts.elementwise_affine
  if opts.elementwise_affine then self:add_parameter("weight", core.ones({ d }, { dtype = "f32" })) end
end

function RMSNorm:forward(x) return core.rms_norm(x, self.weight, self.eps) end

function RMSNorm:extra_repr()
  return string.format("(%d,), eps=%g, elementwise_affine=%s", self.normalized_shape, self.eps,
                       tostring(self.elementwise_affine))
end

-- Embedding(n, d): a lookup table of n rows of size d, weight ~ N(0, 1) as PyTorch;
-- forward takes i32 indices (0-based) of any shape and gives {..., d}
local Embedding = Module:extend("Embedding")
layers.Embedding = Embedding

function Embedding:init(n, d)
  n = check_size("mp.nn.Embedding", "num_embeddings", n)
  d = check_size("mp.nn.Embedding", "embedding_dim", d)
  self.num_embeddings, self.embedding_dim = n, d
  self:add_parameter("weight", core.randn({ n, d }, { dtype = "f32" }))
end

function Embedding:forward(idx) return core.embedding(idx, self.weight) end

function Embedding:extra_repr() return string.format("%d, %d", self.num_embeddings, self.embedding_dim) end

return layers
