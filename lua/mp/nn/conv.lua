-- mp.nn's layers of convolutional networks: Conv2d, MaxPool2d, AvgPool2d,
-- AdaptiveAvgPool2d, BatchNorm2d, Flatten (each `conv.Name = Name`, taken into
-- mp.nn by nn.lua, as layers.lua's are).
local core = require "mp.core"
local common = require "mp.nn.common"
common.own_file()

local is_tensor, raise, show, shape_str = common.is_tensor, common.raise, common.show, common.shape_str
local check_size, check_opts = common.check_size, common.check_opts
local M = require "mp.nn.module"
local Module = M.Module
local uniform, check_pair, checked_options = common.uniform, common.check_pair, common.checked_options

local conv = {}

local function pair_str(p) return p[1] == p[2] and tostring(p[1]) or string.format("(%d, %d)", p[1], p[2]) end

-- Conv2d(in, out, kernel_size [, {stride=1, padding=0, dilation=1, groups=1, bias=true}]):
-- weight {out, in / groups, kh, kw}; PyTorch's default init, kaiming_uniform_(a=sqrt(5)):
-- weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in / groups * kh * kw
local Conv2d = Module:extend("Conv2d")
conv.Conv2d = Conv2d

function Conv2d:init(in_channels, out_channels, kernel_size, opts)
  local f = "mp.nn.Conv2d"
  in_channels = check_size(f, "in_channels", in_channels)
  out_channels = check_size(f, "out_channels", out_channels)
  local k = check_pair(f, "kernel_size", kernel_size, 1)
  opts = checked_options(f, opts, "stride:any padding:any dilation:any groups:integer bias:boolean")
  self.stride = check_pair(f, "stride", opts.stride or 1, 1)
  self.padding = check_pair(f, "padding", opts.padding or 0, 0)
  self.dilation = check_pair(f, "dilation", opts.dilation or 1, 1)
  self.groups = check_size(f, "groups", opts.groups or 1)
  if in_channels % self.groups ~= 0 or out_channels % self.groups ~= 0 then
    raise(string.format("%s: groups (%d) must divide in_channels (%d) and out_channels (%d)", f, self.groups,
                        in_channels, out_channels))
  end
  self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
  local bound = 1 / math.sqrt(in_channels // self.groups * k[1] * k[2])
  self:add_parameter("weight", uniform({ out_channels, in_channels // self.groups, k[1], k[2] }, bound))
  if opts.bias ~= false then self:add_parameter("bias", uniform({ out_channels }, bound)) end
end

function Conv2d:forward(x)
  return core.conv2d(x, self.weight, self.bias,
                     { stride = self.stride, padding = self.padding, dilation = self.dilation, groups = self.groups })
end

function Conv2d:extra_repr()
  local s = string.format("%d, %d, kernel_size=%s, stride=%s", self.in_channels, self.out_channels,
                          pair_str(self.kernel_size), pair_str(self.stride))
  if self.padding[1] ~= 0 or self.padding[2] ~= 0 then s = s .. ", padding=" .. pair_str(self.padding) end
  if self.dilation[1] ~= 1 or self.dilation[2] ~= 1 then s = s .. ", dilation=" .. pair_str(self.dilation) end
  if self.groups ~= 1 then s = s .. ", groups=" .. self.groups end
  if not self.bias then s = s .. ", bias=false" end
  return s
end

-- MaxPool2d(kernel_size [, {stride=kernel_size, padding=0}]) and AvgPool2d (padding
-- counted in the average, as PyTorch's default)
local function pool_class(name, fn)
  local cls = Module:extend(name)
  conv[name] = cls
  function cls:init(kernel_size, opts)
    local f = "mp.nn." .. name
    self.kernel_size = check_pair(f, "kernel_size", kernel_size, 1)
    opts = checked_options(f, opts, "stride:any padding:any")
    self.stride = opts.stride and check_pair(f, "stride", opts.stride, 1) or self.kernel_size
    self.padding = check_pair(f, "padding", opts.padding or 0, 0)
  end
  function cls:forward(x) return core[fn](x, self.kernel_size, { stride = self.stride, padding = self.padding }) end
  function cls:extra_repr()
    return string.format("kernel_size=%s, stride=%s, padding=%s", pair_str(self.kernel_size), pair_str(self.stride),
                         pair_str(self.padding))
  end
end
pool_class("MaxPool2d", "max_pool2d")
pool_class("AvgPool2d", "avg_pool2d")

-- AdaptiveAvgPool2d(output_size): output_size an integer or {rows, columns}
local AdaptiveAvgPool2d = Module:extend("AdaptiveAvgPool2d")
conv.AdaptiveAvgPool2d = AdaptiveAvgPool2d

function AdaptiveAvgPool2d:init(output_size)
  self.output_size = check_pair("mp.nn.AdaptiveAvgPool2d", "output_size", output_size, 1)
end

function AdaptiveAvgPool2d:forward(x) return core.adaptive_avg_pool2d(x, self.output_size) end

function AdaptiveAvgPool2d:extra_repr() return "output_size=" .. pair_str(self.output_size) end

-- BatchNorm2d(c [, {eps=1e-5, momentum=0.1, affine=true, track_running_stats=true}]) over
-- {n, c, h, w}: weight ones, bias zeros; buffers running_mean (zeros), running_var
-- (ones), always f32, and num_batches_tracked (i32; PyTorch's is i64), as PyTorch names
-- them. Training uses the batch's statistics and moves the running ones; eval uses
-- the running ones (or the batch's without track_running_stats).
local BatchNorm2d = Module:extend("BatchNorm2d")
conv.BatchNorm2d = BatchNorm2d

function BatchNorm2d:init(num_features, opts)
  local f = "mp.nn.BatchNorm2d"
  num_features = check_size(f, "num_features", num_features)
  opts = check_opts(f, opts, { eps = core._BATCH_NORM_EPS, momentum = core._BATCH_NORM_MOMENTUM, affine = true,
                               track_running_stats = true })
  if not (opts.eps > 0) then raise(f .. ": eps must be positive (got " .. show(opts.eps) .. ")") end
  if not (opts.momentum >= 0 and opts.momentum <= 1) then
    raise(f .. ": momentum must be in [0, 1] (got " .. show(opts.momentum) .. ")")
  end
  self.num_features, self.eps, self.momentum = num_features, opts.eps, opts.momentum
  self.affine, self.track_running_stats = opts.affine, opts.track_running_stats
  if opts.affine then
    self:add_parameter("weight", core.ones({ num_features }, { dtype = "f32" }))
    self:add_parameter("bias", core.zeros({ num_features }, { dtype = "f32" }))
  end
  if opts.track_running_stats then
    self:add_buffer("running_mean", core.zeros({ num_features }, { dtype = "f32" }))
    self:add_buffer("running_var", core.ones({ num_features }, { dtype = "f32" }))
    self:add_buffer("num_batches_tracked", core.zeros({}, { dtype = "i32" }))
  end
end

-- bn(x [, {residual = z, activation = "relu"}]): relu(bn(x) + z) with those options
-- (mp.batch_norm's: one op where the backend fuses them), checked before the
-- running statistics move
function BatchNorm2d:forward(x, opts)
  local f = "mp.nn.BatchNorm2d"
  if is_tensor(x) and #x.shape ~= 4 then
    raise(string.format("%s: expected a 4-d input {n, c, h, w} (got %s)", f, shape_str(x.shape)))
  end
  opts = checked_options(f, opts, "residual:any activation:string")
  if opts.residual ~= nil and not is_tensor(opts.residual) then
    raise(string.format("%s: option 'residual' must be a tensor (got %s)", f, show(opts.residual)))
  end
  if opts.activation ~= nil and opts.activation ~= "relu" and opts.activation ~= "none" then
    raise(string.format('%s: option \'activation\' must be "relu" or "none" (got %s)', f, show(opts.activation)))
  end
  local batch_stats = self.training or not self.track_running_stats
  if self.training and self.track_running_stats then
    self.num_batches_tracked = self.num_batches_tracked + 1
  end
  return core.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                         { training = batch_stats, momentum = self.momentum, eps = self.eps,
                           residual = opts.residual, activation = opts.activation })
end

function BatchNorm2d:extra_repr()
  return string.format("%d, eps=%g, momentum=%g, affine=%s, track_running_stats=%s", self.num_features, self.eps,
                       self.momentum, tostring(self.affine), tostring(self.track_running_stats))
end

-- Flatten([{start_dim=2, end_dim=-1}]): dims start_dim..end_dim (1-based, negative
-- from the end) merged into one: {n, c, h, w} -> {n, c*h*w} by default (PyTorch's
-- Flatten(1, -1) in its 0-based dims)
local Flatten = Module:extend("Flatten")
conv.Flatten = Flatten

function Flatten:init(opts)
  opts = check_opts("mp.nn.Flatten", opts, { start_dim = 2, end_dim = -1 })
  self.start_dim, self.end_dim = opts.start_dim, opts.end_dim
end

function Flatten:forward(x)
  local n = #x.shape
  local s = self.start_dim < 0 and n + 1 + self.start_dim or self.start_dim
  local e = self.end_dim < 0 and n + 1 + self.end_dim or self.end_dim
  if s < 1 or e > n or s > e then
    raise(string.format("mp.nn.Flatten: dims %d..%d do not fit a %d-d input", self.start_dim, self.end_dim, n))
  end
  local shape, merged = {}, 1
  for d = 1, s - 1 do shape[#shape + 1] = x.shape[d] end
  for d = s, e do merged = merged * x.shape[d] end
  shape[#shape + 1] = merged
  for d = e + 1, n do shape[#shape + 1] = x.shape[d] end
  return x:reshape(shape)
end

function Flatten:extra_repr() return string.format("start_dim=%d, end_dim=%d", self.start_dim, self.end_dim) end

return conv
