-- mp.data: datasets and the batch loader (docs/API.md "Data and files").
--
--   mp.data.read_idx(path)              -> tensor (IDX file, gzip or raw)
--   mp.data.fashion_mnist(split [, dir]) -> {images = u8 {N,28,28}, labels = i32 {N}}
--   mp.data.loader(dataset, {batch=, shuffle=false, seed=, drop_last=false, device=, shard=})
--       -> an iterator object: `for x, y in loader do`; `#loader` is the number of batches
--
--   mp.data.text([path] [, {max_bytes = n}])
--       -> {train = i32 ids, val = i32 ids, vocab = {bytes}, vocab_size, bytes, encode(s), decode(ids)}
--       path must be a regular file of at most max_bytes (M.TEXT_MAX_BYTES, 256 MiB) bytes
--   mp.data.windows(ids, batch, ctx [, device]) -> x, y: random windows (y = x moved on by one)
--
-- The file reading and the shuffle are C (lua/ldata.c over engine/data_idx.c
-- and engine/data_perm.c); this file checks the arguments and cuts batches
-- with index_select. The dataset stays on the cpu and batches are cut there,
-- as with PyTorch's DataLoader; each batch then goes to `device`, by default
-- the default device when the loader is made (cuda on a GPU machine), so that
-- a script written for the default device runs unchanged on either kind of
-- machine (PyTorch leaves the move to the script: `device = "cpu"` does that).
-- u8 pixels travel as bytes and become f32 on the device.
--
-- Shuffling: each call to mp.data.loader is one epoch with its own order.
-- With `seed`, the order is a pure function of (N, seed): the same seed gives the
-- same order, on any machine. Without `seed`, the loader draws its seed from the
-- engine's global random stream, as PyTorch's RandomSampler does: after
-- mp.manual_seed(s) the sequence of epoch orders is reproducible, and every epoch
-- differs from the last. (So a training loop should leave `seed` nil and call
-- mp.manual_seed once; `seed = base + epoch` is the explicit alternative.)
-- The draw moves the global stream on by two counters (engine/data_perm.h,
-- mp_draw_seed), so it is part of the generator state checkpoints save.
-- Loaders that do not shuffle never touch the global stream, and ignore `seed`.
--
-- Sharding (data parallel, mp.dist): shard = {rank, size} (rank 0-based, e.g.
-- {mp.dist.rank(), mp.dist.size()}) gives this rank its part of each global
-- batch of batch * size examples: the epoch's order is the one process's for the
-- same seed, and global batch k is rank 0's batch k, then rank 1's, and so on,
-- so `size` ranks with batch B see exactly what one process with batch size * B
-- sees. Without drop_last the order is first padded with its own first
-- examples to a multiple of size (as PyTorch's DistributedSampler does), so that
-- every rank takes the same number of steps and the last global batch splits
-- evenly. A sharded loader that shuffles needs an explicit seed, the same on
-- every rank.
local core = require "mp.core"
local D = core._data

local M = {}

M.FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

local TensorMT = getmetatable(core.zeros(1, {device = "cpu"}))
local function is_tensor(v) return getmetatable(v) == TensorMT end

local function describe(v)
  if type(v) == "string" then return "'" .. v .. "'" end
  if is_tensor(v) then return "a tensor" end
  if type(v) == "number" then return tostring(v) end
  return type(v)
end

-- raise a message at the position of the public function's caller, as
-- luaL_error does for C functions; depth is 1 when called from the public
-- function itself, 2 from a helper it calls
local function fail(depth, fmt, ...)
  error(string.format(fmt, ...), depth + 2)
end

-- call a C building block; re-raise its error at the public function's caller,
-- dropping the position inside this file, and with an optional hint appended
local function call(level, hint, f, ...)
  local r = table.pack(pcall(f, ...))
  if r[1] then return table.unpack(r, 2, r.n) end
  local msg = tostring(r[2]):gsub("^[^\n]-:%d+: ", "", 1)
  if hint and msg:find("cannot open", 1, true) then msg = msg .. hint end
  error(msg, level + 1)
end

function M.read_idx(path)
  local t = call(2, nil, D.read_idx, path)   -- not a tail call: error levels count this frame
  return t
end

-- ---- Fashion-MNIST ----

local FILES = {
  train = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"},
  test = {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"},
}

local FM = "mp.data.fashion_mnist"
local FM_HINT = " (Fashion-MNIST comes from Debian's dataset-fashion-mnist package, in "
  .. M.FASHION_MNIST_DIR .. "; or pass the directory holding the four .gz files)"

local function shape_str(t) return "{" .. table.concat(t.shape, ",") .. "}" end

function M.fashion_mnist(split, dir)
  local files = type(split) == "string" and FILES[split]
  if not files then fail(1, "%s: split must be 'train' or 'test' (got %s)", FM, describe(split)) end
  if dir ~= nil and type(dir) ~= "string" then
    fail(1, "%s: dir must be a string (got %s)", FM, describe(dir))
  end
  dir = (dir or M.FASHION_MNIST_DIR):gsub("/+$", "")
  if dir == "" then dir = "/" end
  local ipath, lpath = dir .. "/" .. files[1], dir .. "/" .. files[2]
  local images = call(2, FM_HINT, D.read_idx, ipath, FM)
  local labels = call(2, FM_HINT, D.read_idx, lpath, FM)
  local ish, lsh = images.shape, labels.shape
  if images.dtype ~= "u8" or #ish ~= 3 or ish[2] ~= 28 or ish[3] ~= 28 then
    fail(1, "%s: %s: expected u8 images {N,28,28} (got %s %s)", FM, ipath, images.dtype, shape_str(images))
  end
  if labels.dtype ~= "u8" or #lsh ~= 1 then
    fail(1, "%s: %s: expected u8 labels {N} (got %s %s)", FM, lpath, labels.dtype, shape_str(labels))
  end
  if ish[1] ~= lsh[1] then
    fail(1, "%s: %s has %d images but %s has %d labels", FM, ipath, ish[1], lpath, lsh[1])
  end
  local top = labels:max():item()
  if top > 9 then fail(1, "%s: %s: label %d out of range (classes are 0..9)", FM, lpath, top) end
  local labels32 = labels:to("i32")
  labels:free()
  return {images = images, labels = labels32}
end

-- ---- the loader ----

local LD = "mp.data.loader"
local function check_options(opts)
  if type(opts) ~= "table" then
    fail(2, "%s: options must be a table with batch= (got %s)", LD, describe(opts))
  end
  -- the keys: the binding's one checker (lua/lbind.c); the values below
  core._options(LD, opts, "batch:any shuffle:any seed:any drop_last:any device:any shard:any", 4)
  -- math.tointeger would also take the string "8"; options want numbers
  local function int(v) return type(v) == "number" and math.tointeger(v) or nil end
  local batch = int(opts.batch)
  if not batch or batch < 1 then
    fail(2, "%s: batch must be a positive integer (got %s)", LD, describe(opts.batch))
  end
  for _, k in ipairs{"shuffle", "drop_last"} do
    if opts[k] ~= nil and type(opts[k]) ~= "boolean" then
      fail(2, "%s: %s must be a boolean (got %s)", LD, k, describe(opts[k]))
    end
  end
  local seed = opts.seed
  if seed ~= nil and not int(seed) then
    fail(2, "%s: seed must be an integer (got %s)", LD, describe(seed))
  end
  local device = opts.device
  if device == nil then device = core.default_device()
  elseif device ~= "cpu" and device ~= "cuda" then
    fail(2, "%s: device must be 'cpu' or 'cuda' (got %s)", LD, describe(device))
  elseif device == "cuda" then
    local ok, why = core.cuda.is_available()
    if not ok then fail(2, "%s: device 'cuda' is not available on this machine: %s", LD, why) end
  end
  local shard = opts.shard
  if shard ~= nil then
    local r, s = type(shard) == "table" and int(shard[1]), type(shard) == "table" and int(shard[2])
    if not (r and s and s >= 1 and r >= 0 and r < s) then
      fail(2, "%s: shard must be {rank, size} with 0 <= rank < size, e.g. {mp.dist.rank(), mp.dist.size()} (got %s)",
           LD, type(shard) == "table" and ("{" .. tostring(shard[1]) .. ", " .. tostring(shard[2]) .. "}") or describe(shard))
    end
    if opts.shuffle and seed == nil then
      fail(2, "%s: a sharded loader that shuffles needs seed=, the same on every rank (else each rank draws its own order)", LD)
    end
    shard = {rank = r, size = s}
  end
  return batch, opts.shuffle or false, seed and int(seed), opts.drop_last or false, device, shard
end

local function check_dataset(ds)
  if type(ds) ~= "table" then
    fail(2, "%s: dataset must be a table {images = tensor, labels = tensor} (got %s)", LD, describe(ds))
  end
  for _, k in ipairs{"images", "labels"} do
    if not is_tensor(ds[k]) then
      fail(2, "%s: dataset.%s must be a tensor (got %s)", LD, k, describe(ds[k]))
    end
    if ds[k]:dim() < 1 then fail(2, "%s: dataset.%s must have at least one dim (got a scalar)", LD, k) end
  end
  for _, k in ipairs{"images", "labels"} do
    if ds[k].device ~= "cpu" then
      fail(2, "%s: dataset.%s must be on the cpu (got %s); the loader moves each batch to its device",
           LD, k, ds[k].device)
    end
  end
  local n, nl = ds.images:size(1), ds.labels:size(1)
  if n ~= nl then
    fail(2, "%s: dataset has %d images but %d labels (first dims %s and %s)", LD, n, nl,
         shape_str(ds.images), shape_str(ds.labels))
  end
  if n > 2147483647 then
    fail(2, "%s: dataset has %d examples, more than i32 indices can address", LD, n)
  end
  return n
end

local Loader = {}
Loader.__index = Loader

-- t on the loader's device; the cpu copy freed now, not at the next GC
local function move(t, device)
  if t.device == device then return t end
  local d = t:to(device)
  t:free()
  return d
end

-- the next batch, or nothing at the end of the epoch: index_select gathers
-- whole rows (memcpy), the batch moves to the device, then u8 pixels are
-- divided by 255 into f32
function Loader.__call(self)
  local i = self.next
  if i > self.nbatches then
    if self.order then self.order:free(); self.order = nil end
    return nil
  end
  self.next = i + 1
  local start, len = (i - 1) * self.batch + 1, nil
  if self.shard then   -- this rank's part of global batch i (the order is padded to a multiple of size)
    local s = self.shard
    local gstart = (i - 1) * self.batch * s.size
    len = math.min(self.batch * s.size, self.n - gstart) // s.size
    start = gstart + s.rank * len + 1
  else
    len = math.min(self.batch, self.n - start + 1)
  end
  local idx = self.order:narrow(1, start, len)   -- a view
  local xb = move(self.images:index_select(1, idx), self.device)
  local x = xb
  if xb.dtype == "u8" then x = xb / 255
  elseif xb.dtype ~= "f32" then x = xb:to("f32") end
  if not rawequal(x, xb) then xb:free() end   -- free the temporary now, not at the next GC
  local y = move(self.labels:index_select(1, idx), self.device)
  idx:free()
  return x, y
end

function Loader.__len(self) return self.nbatches end

function M.loader(ds, opts)
  local n = check_dataset(ds)
  local batch, shuffle, seed, drop_last, device, shard = check_options(opts)
  local order
  if shuffle then
    order = D.randperm(n, seed or D.draw_seed())
  else
    order = core.arange(n, {dtype = "i32", device = "cpu"})
  end
  local nbatches
  if shard then
    local global = batch * shard.size
    if drop_last then
      nbatches = n // global
    else   -- padded with the order's own first examples to a multiple of size
      local total = (n + shard.size - 1) // shard.size * shard.size
      local parts = {order}
      for have = n, total - 1, n do parts[#parts + 1] = order:narrow(1, 1, math.min(n, total - have)) end
      if #parts > 1 then
        local padded = core.cat(parts, 1)
        for _, p in ipairs(parts) do p:free() end
        order = padded
      end
      n = total
      nbatches = (n + global - 1) // global
    end
  else
    nbatches = drop_last and n // batch or (n + batch - 1) // batch
  end
  return setmetatable({images = ds.images, labels = ds.labels, n = n, batch = batch, shard = shard,
                       nbatches = nbatches, next = 1, order = order, device = device}, Loader)
end

-- ---- character-level text ----

M.FORTUNES_DIR = "/usr/share/games/fortunes"
-- the most bytes mp.data.text reads unless told otherwise (opts.max_bytes):
-- 256 MiB, more than enwik8; the ids take four bytes a byte
M.TEXT_MAX_BYTES = 256 * 1024 * 1024

-- every file of dir without an extension (no "."), in byte order of the names;
-- `ls -p` marks directories (and, with -L, links to them) with a "/": they are
-- left out (Debian's fortunes-off puts its files in a subdirectory)
local function fortune_files(dir)
  local p = io.popen("ls -1pL " .. dir .. " 2>/dev/null")
  local names = {}
  for name in p:lines() do
    if not name:find(".", 1, true) and not name:find("/$") then names[#names + 1] = name end
  end
  p:close()
  table.sort(names)   -- Lua compares strings bytewise (the C locale's order)
  return names
end

local LT = "mp.data.text"

-- the bytes of path, or of the fortunes, as one u8 tensor (nil when there are none);
-- the C reader refuses what is not a regular file and what is over max_bytes
local function text_bytes(path, max_bytes)
  if path then return call(3, nil, D.read_bytes, path, max_bytes, LT) end
  local names = fortune_files(M.FORTUNES_DIR)
  if #names == 0 then
    fail(2, "%s: no text in %s (apt-get install fortunes, or give a path)", LT, M.FORTUNES_DIR)
  end
  local parts, left = {}, max_bytes
  for _, name in ipairs(names) do
    if left < 1 then fail(2, "%s: the files of %s have more than max_bytes = %d bytes", LT, M.FORTUNES_DIR, max_bytes) end
    local ok, t = pcall(D.read_bytes, M.FORTUNES_DIR .. "/" .. name, left, LT)
    if not ok and left < max_bytes and tostring(t):find("more than max_bytes", 1, true) then
      for _, p in ipairs(parts) do p:free() end   -- the limit is on the whole text: say so
      fail(2, "%s: the files of %s have more than max_bytes = %d bytes", LT, M.FORTUNES_DIR, max_bytes)
    end
    if not ok then error(t, 3) end   -- any other failure: at M.text's caller, as the reader worded it
    if t then parts[#parts + 1] = t; left = left - t:numel() end
  end
  if #parts < 2 then return parts[1] end
  local all = core.cat(parts, 1)
  for _, t in ipairs(parts) do t:free() end
  return all
end

-- The bytes of a text file (default: Debian's fortunes, every file without an
-- extension sorted by name and concatenated) as i32 ids 0..V-1 over its
-- distinct bytes in byte order; the last 10% is the validation split. The file
-- is read in C (engine/data_file.c) into a u8 tensor and mapped to ids there
-- (engine/data_vocab.c): memory is five bytes per byte of text at the peak, four
-- after. Only regular files are read, and at most opts.max_bytes bytes
-- (M.TEXT_MAX_BYTES by default): a directory, FIFO or device is refused by its
-- kind before it is opened for reading, a larger file by its size.
function M.text(path, opts)
  if path ~= nil and type(path) ~= "string" then fail(1, "%s: path must be a string (got %s)", LT, describe(path)) end
  if opts ~= nil and type(opts) ~= "table" then fail(1, "%s: options must be a table (got %s)", LT, describe(opts)) end
  opts = core._options(LT, opts, "max_bytes:any", 2)
  local max_bytes = opts.max_bytes
  if max_bytes == nil then max_bytes = M.TEXT_MAX_BYTES
  elseif math.type(max_bytes) ~= "integer" or max_bytes < 1 then
    fail(1, "%s: max_bytes must be a positive integer (got %s)", LT, describe(max_bytes))
  end
  local bytes = text_bytes(path, max_bytes)
  local n = bytes and bytes:numel() or 0
  if n < 2 then
    if bytes then bytes:free() end
    fail(1, "%s: the text has %d bytes (at least 2 needed)", LT, n)
  end
  local all, vocab_s = call(2, nil, D.byte_ids, bytes, nil, LT)
  bytes:free()
  local vocab = { vocab_s:byte(1, -1) }
  local nval = math.max(1, n // 10)
  local ntrain = n - nval
  local d = { bytes = n, vocab = vocab, vocab_size = #vocab,
              train = all:narrow(1, 1, ntrain), val = all:narrow(1, ntrain + 1, nval) }
  function d.encode(s)
    if type(s) ~= "string" then fail(1, "%s: encode: s must be a string (got %s)", LT, describe(s)) end
    local ids = call(2, nil, D.byte_ids, s, vocab_s, LT .. ": encode")
    return ids
  end
  function d.decode(t)
    local r = {}
    for i, v in ipairs(is_tensor(t) and t:reshape { -1 }:totable() or t) do
      local b = math.type(v) == "integer" and vocab[v + 1]
      if not b then fail(1, "%s: decode: id %s is not in 0..%d", LT, describe(v), #vocab - 1) end
      r[i] = string.char(b)
    end
    return table.concat(r)
  end
  return d
end

-- `batch` windows of ctx + 1 consecutive ids at offsets from the random stream
-- (texts of up to 2^24 + ctx ids):
-- x their first ctx ids, y their last ctx ({batch, ctx} i32 each) on device
function M.windows(ids, batch, ctx, device)
  local LW = "mp.data.windows"
  if not is_tensor(ids) or ids.dtype ~= "i32" or #ids.shape ~= 1 then
    fail(1, "%s: ids must be a 1-d i32 tensor (got %s)", LW, describe(ids))
  end
  if math.type(batch) ~= "integer" or batch < 1 then fail(1, "%s: batch must be a positive integer", LW) end
  if math.type(ctx) ~= "integer" or ctx < 1 then fail(1, "%s: ctx must be a positive integer", LW) end
  local n = ids.shape[1]
  if n < ctx + 1 then fail(1, "%s: %d ids are fewer than ctx + 1 = %d", LW, n, ctx + 1) end
  -- offsets come from mp.randint, exact and unbiased up to 2^24 positions
  if n - ctx > 2 ^ 24 then fail(1, "%s: %d ids: at most 2^24 + ctx are supported", LW, n) end
  local start = core.randint(0, n - ctx, { batch, 1 }, { device = "cpu" })
  local idx = start + core.arange(ctx + 1, { dtype = "i32", device = "cpu" })
  local w = ids:index_select(1, idx:reshape { -1 }):reshape { batch, ctx + 1 }
  device = device or core.default_device()
  local x, y = move(w:narrow(2, 1, ctx), device), move(w:narrow(2, 2, ctx), device)
  start:free(); idx:free(); w:free()
  return x, y
end

return M
