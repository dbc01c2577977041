-- api_driver.lua: the Lua program fuzzer's interpreter (tests/fuzz/fuzz_lua.c).
-- Returns a function of the fuzzer's bytes that runs up to 32 API calls: each
-- picks a function of mp (functions, tensor methods, optimizers, the scaler, nn
-- modules) and its arguments from the bytes: numbers at the edges (NaN, inf,
-- 2^31, 2^63, -0), dtype and device names, tensors from a pool that grows with
-- the calls' results, shape tables, option tables, and hostile tables whose
-- __len lies or whose __index frees a tensor of the pool in the middle of the
-- call. Every call runs under pcall: an error is an answer, a crash is a find.
local mp = require "mp"

local skip = {set_default_device = true, manual_seed = false, save = true, load = true, read_idx = true}
local calls = {}   -- {name, function(self_tensor, ...)}
local function add(name, fn, method)
  calls[#calls + 1] = {name = name, fn = fn, method = method}
end

local names = {}
for k, v in pairs(mp) do if type(v) == "function" and not skip[k] then names[#names + 1] = k end end
table.sort(names)
for _, k in ipairs(names) do add("mp." .. k, mp[k]) end
local methods = {}
for k, v in pairs(mp.Tensor) do if type(v) == "function" then methods[#methods + 1] = k end end
table.sort(methods)
for _, k in ipairs(methods) do add("Tensor:" .. k, mp.Tensor[k], true) end
for _, k in ipairs{"SGD", "Adam", "AdamW", "clip_grad_norm"} do add("mp.optim." .. k, mp.optim[k]) end
for _, k in ipairs{"Linear", "LayerNorm", "Embedding", "Dropout", "Sequential", "ReLU", "GELU", "Conv2d", "BatchNorm2d",
                   "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "Flatten"} do
  if mp.nn[k] then add("mp.nn." .. k, mp.nn[k]) end
end
add("GradScaler", function(...) return mp.amp.GradScaler(...) end)
for _, k in ipairs{"replay", "load_trace", "diagnose"} do add("mp.amp." .. k, mp.amp[k]) end
-- a world of one (no launcher): the collectives' argument checks; finalize and save stay out
for _, k in ipairs{"init", "all_reduce", "broadcast", "all_gather", "barrier", "rank_seed"} do add("mp.dist." .. k, mp.dist[k]) end
add("mp.dist.no_sync", function() local g = mp.dist.no_sync(); g:close(); return g end)
add("autocast", function(...) local g = mp.amp.autocast(...); if type(g) == "userdata" or type(g) == "table" then pcall(function() g:close() end) end return g end)
add("metamethods", function(a, b) return a + b, a * b, a - b, a / b, -a end)

local EDGE = {0 / 0, math.huge, -math.huge, 2 ^ 31, 2 ^ 31 - 1, 2 ^ 63, -2 ^ 63, -1, 0, -0.0, 0.5, 1e308, 1e-310, 3, 65504, 65520}
local STR = {"f32", "f16", "bf16", "i32", "u8", "cpu", "cuda", "mean", "sum", "none", "tanh", "", "f64", "x\0y"}

return function(data)
  local pos = 0
  local function b()
    pos = pos + 1
    return data:byte(pos) or 0
  end
  local pool = {mp.zeros{2, 3}, mp.randn{3}, mp.ones({4}, {dtype = "f16"}), mp.arange(6),
                mp.randn({2, 2}, {requires_grad = true}), mp.tensor({1, 0, 2}, {dtype = "i32"}), mp.full({1}, 7),
                mp.zeros({3, 1}, {dtype = "bf16"}), mp.ones({2, 3}, {dtype = "u8"}),
                mp.randn({2, 3, 5, 5}, {requires_grad = true}), mp.randn({4, 3, 3, 3}), mp.randn({1, 2, 4, 4}):to("bf16")}
  local function tensor() return pool[b() % #pool + 1] end
  local function free_one() local t = tensor(); pcall(function() t:free() end) end
  local value
  local function hostile()
    local lens = {-1, 2 ^ 40, 2.5, 0, 1, 2, 3, 2 ^ 31 + 1, 0 / 0, "3"}
    local len, frees = lens[b() % #lens + 1], b() % 3 == 0
    local inner = value(2)
    return setmetatable({}, {
      __len = function() if frees then free_one() end return len end,
      __index = function(_, k)
        if frees then free_one() end
        if b() % 2 == 0 then return tensor() end
        return type(inner) == "table" and inner[k] or inner
      end,
    })
  end
  function value(depth)
    local k = b() % 16
    if k == 0 then return nil
    elseif k == 1 then return b() - 128
    elseif k == 2 then return EDGE[b() % #EDGE + 1]
    elseif k == 3 then return STR[b() % #STR + 1]
    elseif k <= 6 then return tensor()
    elseif k == 7 then
      local t = {}
      for i = 1, b() % 5 do t[i] = (b() % 6) - 1 end
      return t
    elseif k == 8 and depth < 2 then return hostile()
    elseif k == 9 then
      return {dtype = STR[b() % 6 + 1], device = b() % 8 == 0 and "cuda" or "cpu", requires_grad = b() % 2 == 0,
              reduction = STR[b() % #STR + 1], approximate = STR[b() % #STR + 1], lr = EDGE[b() % #EDGE + 1]}
    elseif k == 10 then
      local t = {}
      for i = 1, b() % 4 do t[i] = tensor() end
      return t
    elseif k == 11 then return function() free_one(); return tensor() end
    elseif k == 12 then return b() % 2 == 0
    elseif k == 13 and depth < 2 then
      local t = {}
      for i = 1, b() % 3 do t[i] = value(depth + 1) end
      return t
    elseif k == 14 then   -- the options of convolution, pooling and batch norm (only theirs: no unknown key)
      local pair = function() return b() % 4 == 0 and {b() % 4, (b() % 4) - 1} or EDGE[b() % #EDGE + 1] end
      local which = b() % 3
      if which == 0 then return {stride = pair(), padding = (b() % 4) - 1, dilation = pair(), groups = b() % 4} end
      if which == 1 then return {stride = pair(), padding = pair()} end
      return {training = b() % 2 == 0, momentum = EDGE[b() % #EDGE + 1], eps = EDGE[b() % #EDGE + 1]}
    else return (b() % 5) + 1
    end
  end
  for _ = 1, 32 do
    if pos >= #data then break end
    local c = calls[b() % #calls + 1]
    local n = b() % 5
    local args = {}
    for i = 1, n do args[i] = value(0) end
    local ok, r = pcall(function()
      if c.method then return c.fn(tensor(), table.unpack(args, 1, n)) end
      return c.fn(table.unpack(args, 1, n))
    end)
    if ok and type(r) == "userdata" and #pool < 48 then pool[#pool + 1] = r end
    if ok and type(r) == "table" and getmetatable(r) and #pool < 48 then
      -- a module or an optimizer: call what it offers with no arguments
      for _, m in ipairs{"forward", "step", "zero_grad", "parameters", "state_dict", "update", "get_scale"} do
        if type(r[m]) == "function" then pcall(r[m], r, tensor()) end
      end
    end
    if b() % 16 == 0 then free_one() end
  end
end
