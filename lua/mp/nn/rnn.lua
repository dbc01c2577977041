-- mp.nn's recurrent layers: LSTM and GRU, after torch.nn's (docs/API.md "Recurrent
-- layers"). Parameter names, shapes, gate order and init are PyTorch's, so a
-- PyTorch state dict loads one to one: weight_ih_l<k> {G*hidden, in},
-- weight_hh_l<k> {G*hidden, hidden}, bias_ih_l<k> and bias_hh_l<k> {G*hidden},
-- with G = 4 (gates i, f, g, o) for the LSTM and 3 (r, z, n) for the GRU, all
-- U(-1/sqrt(hidden), 1/sqrt(hidden)).
--
-- A layer runs its input projection as one GEMM over the whole sequence, then
-- per step the hidden projection (a GEMM) and the fused cell op (mp.lstm_cell,
-- mp.gru_cell: one kernel for every gate, engine/ops_rnn.c). Under autocast
-- the GEMMs and the cell run in low precision, as PyTorch's autocast runs its
-- RNNs; the cell computes in f32 inside.
local core = require "mp.core"
local common = require "mp.nn.common"
common.own_file()

local raise, show, shape_str, is_tensor = common.raise, common.show, common.shape_str, common.is_tensor
local check_size, check_opts = common.check_size, common.check_opts
local Module = require("mp.nn.module").Module
local uniform = common.uniform
local autograd = require "mp.autograd"

local rnn = {}

-- the constructor both share; gates: the gate count G
local function init_layers(self, fname, gates, input_size, hidden_size, opts)
  input_size = check_size(fname, "input_size", input_size)
  hidden_size = check_size(fname, "hidden_size", hidden_size)
  opts = check_opts(fname, opts,
                    { num_layers = 1, bias = true, batch_first = false, dropout = 0, bidirectional = false })
  local layers = check_size(fname, "num_layers", opts.num_layers)
  if not (opts.dropout >= 0 and opts.dropout < 1) then
    raise(fname .. ": dropout must be a number in [0, 1) (got " .. show(opts.dropout) .. ")")
  end
  if opts.bidirectional then
    raise(fname .. ": bidirectional is not supported (run a second layer over the reversed sequence)")
  end
  self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, layers
  self.bias, self.batch_first, self.dropout = opts.bias, opts.batch_first, opts.dropout
  local bound = 1 / math.sqrt(hidden_size)
  for k = 0, layers - 1 do
    self:add_parameter("weight_ih_l" .. k, uniform({ gates * hidden_size, k == 0 and input_size or hidden_size }, bound))
    self:add_parameter("weight_hh_l" .. k, uniform({ gates * hidden_size, hidden_size }, bound))
    if opts.bias then
      self:add_parameter("bias_ih_l" .. k, uniform({ gates * hidden_size }, bound))
      self:add_parameter("bias_hh_l" .. k, uniform({ gates * hidden_size }, bound))
    end
  end
end

local function extra_repr(self)
  local s = string.format("%d, %d", self.input_size, self.hidden_size)
  if self.num_layers ~= 1 then s = s .. ", num_layers=" .. self.num_layers end
  if not self.bias then s = s .. ", bias=false" end
  if self.batch_first then s = s .. ", batch_first=true" end
  if self.dropout ~= 0 then s = s .. ", dropout=" .. tostring(self.dropout) end
  return s
end

-- the input as {seq, batch, input_size}, and whether it came unbatched ({seq, input_size})
local function seq_first(self, fname, x)
  if not is_tensor(x) then raise(fname .. ": input must be a tensor (got " .. show(x) .. ")") end
  local s = x.shape
  local unbatched = #s == 2
  if unbatched then
    x = x:reshape { s[1], 1, s[2] }
  elseif #s ~= 3 then
    raise(string.format("%s: input must be 3-d {%s, input_size} or 2-d {seq, input_size} (got %s)", fname,
                        self.batch_first and "batch, seq" or "seq, batch", shape_str(s)))
  elseif self.batch_first then
    x = x:transpose(1, 2)
  end
  s = x.shape
  if s[3] ~= self.input_size then
    raise(string.format("%s: input %s has %d features, expected input_size %d", fname, shape_str(x.shape), s[3],
                        self.input_size))
  end
  if s[1] < 1 then raise(fname .. ": input has no time steps") end
  return x, unbatched
end

-- a state argument {layers, batch, hidden} ({layers, hidden} unbatched), or zeros like x
local function state(self, fname, what, t, x, unbatched)
  local L, B, H = self.num_layers, x.shape[2], self.hidden_size
  if t == nil then return core.zeros({ L, B, H }, { dtype = x.dtype, device = x.device }) end
  if not is_tensor(t) then raise(fname .. ": " .. what .. " must be a tensor (got " .. show(t) .. ")") end
  local want = unbatched and { L, H } or { L, B, H }
  local s = t.shape
  local ok = #s == #want
  for i = 1, #want do ok = ok and s[i] == want[i] end
  if not ok then
    raise(string.format("%s: %s must be %s (got %s)", fname, what, shape_str(want), shape_str(s)))
  end
  return unbatched and t:reshape { L, B, H } or t
end

-- the outputs in the caller's layout: out {seq, batch, hidden} and the final states {layers, batch, hidden}
local function finish(self, out, finals, unbatched)
  local T, B, H, L = out.shape[1], out.shape[2], self.hidden_size, self.num_layers
  local r = {}
  for i, list in ipairs(finals) do
    r[i] = core.cat(list, 1):reshape(unbatched and { L, H } or { L, B, H })
  end
  if unbatched then out = out:reshape { T, H }
  elseif self.batch_first then out = out:transpose(1, 2) end
  return out, r
end

-- x {T, ...} as its T steps x[1], ..., x[T] under one autograd node, whose
-- backward is one cat of the steps' gradients. (T selects would each give back
-- a zero-padded gradient the size of all of x: T^2 work in the backward.)
local steps = autograd.Function {
  name = "rnn_steps",
  forward = function(ctx, x)
    ctx.shape = x.shape
    local r = {}
    for t = 1, x.shape[1] do r[t] = x:select(1, t) end
    return table.unpack(r)
  end,
  backward = function(ctx, ...) return core.cat({ ... }, 1):reshape(ctx.shape) end,
}

-- every layer over the sequence x {T, B, in}: step(gi_t, w_hh, b_hh, states) -> the new states, h first;
-- returns the last layer's output {T, B, H} and each state's final value per layer
local function run_layers(self, x, states, step)
  local T, B, H = x.shape[1], x.shape[2], self.hidden_size
  local inp, finals = x, {}
  for i = 1, #states do finals[i] = {} end
  for k = 0, self.num_layers - 1 do
    local w_ih, b_ih = self["weight_ih_l" .. k], self["bias_ih_l" .. k]
    local w_hh, b_hh = self["weight_hh_l" .. k], self["bias_hh_l" .. k]
    local gi = { steps(core.linear(inp, w_ih, b_ih)) }   -- every step's input projection in one GEMM
    local cur = {}
    for i, s in ipairs(states) do cur[i] = s:select(1, k + 1) end
    local outs = {}
    for t = 1, T do
      cur = step(gi[t], w_hh, b_hh, cur)
      outs[t] = cur[1]
    end
    for i = 1, #cur do finals[i][k + 1] = cur[i] end
    inp = core.cat(outs, 1):reshape { T, B, H }
    if k < self.num_layers - 1 and self.dropout > 0 and self.training then
      inp = core.dropout(inp, self.dropout, true)
    end
  end
  return inp, finals
end

-- LSTM(input_size, hidden_size [, {num_layers=1, bias=true, batch_first=false, dropout=0}])
local LSTM = Module:extend("LSTM")
rnn.LSTM = LSTM

function LSTM:init(input_size, hidden_size, opts) init_layers(self, "mp.nn.LSTM", 4, input_size, hidden_size, opts) end

local function lstm_step(gi, w_hh, b_hh, cur)
  local h, c = core.lstm_cell(gi + core.linear(cur[1], w_hh, b_hh), cur[2])
  return { h, c }
end

-- m(x [, {h0, c0}]) -> output, {h_n, c_n}
function LSTM:forward(x, hc)
  local fname = "mp.nn.LSTM"
  local unbatched
  x, unbatched = seq_first(self, fname, x)
  if hc ~= nil and type(hc) ~= "table" then
    raise(fname .. ": the state must be a table {h0, c0} (got " .. show(hc) .. ")")
  end
  hc = hc or {}
  local h0 = state(self, fname, "h0", hc[1], x, unbatched)
  local c0 = state(self, fname, "c0", hc[2], x, unbatched)
  local out, finals = run_layers(self, x, { h0, c0 }, lstm_step)
  return finish(self, out, finals, unbatched)
end

LSTM.extra_repr = extra_repr

-- GRU(input_size, hidden_size [, {num_layers=1, bias=true, batch_first=false, dropout=0}])
local GRU = Module:extend("GRU")
rnn.GRU = GRU

function GRU:init(input_size, hidden_size, opts) init_layers(self, "mp.nn.GRU", 3, input_size, hidden_size, opts) end

local function gru_step(gi, w_hh, b_hh, cur)
  return { core.gru_cell(gi, core.linear(cur[1], w_hh, b_hh), cur[1]) }
end

-- m(x [, h0]) -> output, h_n
function GRU:forward(x, h0)
  local fname = "mp.nn.GRU"
  local unbatched
  x, unbatched = seq_first(self, fname, x)
  h0 = state(self, fname, "h0", h0, x, unbatched)
  local out, finals = run_layers(self, x, { h0 }, gru_step)
  local r
  out, r = finish(self, out, finals, unbatched)
  return out, r[1]
end

GRU.extra_repr = extra_repr

return rnn
