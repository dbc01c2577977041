-- data_spec.lua: mp.data (IDX reading, Fashion-MNIST, the batch loader, text).
-- busted tests/lua/data_spec.lua, with LUA_PATH/LUA_CPATH as in tests/run.sh.
--
-- The Fashion-MNIST figures below were read from Debian's files
-- (/usr/share/datasets/fashion-mnist) with Python's gzip module, independently
-- of this engine: the first ten labels of each split, the pixel sums of the
-- first images and of the whole training set, and 6000 (train) / 1000 (test)
-- examples per class. Tests on the real data are pending where the package is
-- not installed; everything else builds its own small datasets.
local mp = require "mp"
local data = mp.data or require "mp.data"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local DIR = data.FASHION_MNIST_DIR

-- each split read once for the whole file
local cache = {}
local function fmnist(split)
  cache[split] = cache[split] or data.fashion_mnist(split)
  return cache[split]
end

-- run f, expect an error whose message (position stripped) contains `want`
local function raises(want, f, ...)
  local ok, err = pcall(f, ...)
  assert.is_false(ok, "expected an error containing: " .. want)
  err = tostring(err)
  assert(err:find(want, 1, true), "error '" .. err .. "' lacks '" .. want .. "'")
  return err
end

-- a raw IDX file written from Lua (big-endian header), for read_idx and for
-- fake Fashion-MNIST directories (gzread reads raw files under .gz names too)
local function write_idx(path, type_byte, dims, payload)
  local f = assert(io.open(path, "wb"))
  f:write(string.pack(">BBBB", 0, 0, type_byte, #dims))
  for _, d in ipairs(dims) do f:write(string.pack(">I4", d)) end
  f:write(payload)
  f:close()
end

local function tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p '" .. p .. "'"))
  return p
end

local function rmdir(p) os.execute("rm -rf '" .. p .. "'") end

-- the labels of a whole epoch, in order, and the number of examples seen
local function epoch_labels(ds, opts)
  local out = {}
  for _, y in data.loader(ds, opts) do
    for _, v in ipairs(y:totable()) do out[#out + 1] = v end
  end
  return out
end

local function same_list(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

describe("mp.data.read_idx", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() rmdir(dir) end)

  it("reads u8 and big-endian i32 / f32 files", function()
    write_idx(dir .. "/a.idx", 0x08, {2, 3}, "\1\2\3\250\251\252")
    local t = data.read_idx(dir .. "/a.idx")
    assert.equal("u8", t.dtype)
    assert.same({2, 3}, t.shape)
    assert.same({{1, 2, 3}, {250, 251, 252}}, t:totable())

    write_idx(dir .. "/b.idx", 0x0C, {3}, string.pack(">i4>i4>i4", -7, 65536, 2147483647))
    t = data.read_idx(dir .. "/b.idx")
    assert.equal("i32", t.dtype)
    assert.same({-7, 65536, 2147483647}, t:totable())

    write_idx(dir .. "/c.idx", 0x0D, {2}, string.pack(">f>f", -1.5, 0.25))
    t = data.read_idx(dir .. "/c.idx")
    assert.equal("f32", t.dtype)
    assert.same({-1.5, 0.25}, t:totable())
  end)

  it("names the function, the path and the problem", function()
    local err = raises("mp.data.read_idx: " .. dir .. "/none.idx: cannot open: No such file or directory",
                       function() local t = data.read_idx(dir .. "/none.idx"); return t end)
    assert.truthy(err:match("^[^:]*data_spec%.lua:%d+: mp%.data%.read_idx"), err)   -- the caller's line
    write_idx(dir .. "/short.idx", 0x08, {60000, 28, 28}, string.rep("\0", 1000))
    raises("short.idx: truncated: expected 47040000 data bytes, got 1000", data.read_idx, dir .. "/short.idx")
    write_idx(dir .. "/huge.idx", 0x08, {65536, 65536, 256}, "")
    raises("huge.idx: dims too large", data.read_idx, dir .. "/huge.idx")
    local f = assert(io.open(dir .. "/text.idx", "wb")); f:write("hello world\n"); f:close()
    raises("text.idx: bad magic", data.read_idx, dir .. "/text.idx")
    raises("mp.data.read_idx: path must be a string (got number)", data.read_idx, 42)
  end)
end)

describe("mp.data.fashion_mnist", function()
  it("has 60000 training and 10000 test examples of 28x28 u8 with i32 labels", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    for split, n in pairs{train = 60000, test = 10000} do
      local ds = fmnist(split)
      assert.equal("u8", ds.images.dtype)
      assert.same({n, 28, 28}, ds.images.shape)
      assert.equal("i32", ds.labels.dtype)
      assert.same({n}, ds.labels.shape)
      local counts = {}
      for _, v in ipairs(ds.labels:totable()) do counts[v] = (counts[v] or 0) + 1 end
      local keys = 0
      for _ in pairs(counts) do keys = keys + 1 end
      assert.equal(10, keys)          -- classes 0..9 and nothing else
      for c = 0, 9 do assert.equal(n // 10, counts[c], split .. " class " .. c) end
    end
  end)

  it("matches checksums read independently from the files", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local tr, te = fmnist("train"), fmnist("test")
    assert.same({9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, te.labels:narrow(1, 1, 10):totable())
    assert.same({9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, tr.labels:narrow(1, 1, 10):totable())
    assert.equal(76247, tr.images:narrow(1, 1, 1):sum():item())
    assert.equal(33456, te.images:narrow(1, 1, 1):sum():item())
    assert.equal(255, te.images:max():item())
  end)

  it("rejects bad split names and dirs", function()
    raises("mp.data.fashion_mnist: split must be 'train' or 'test' (got 'x')", data.fashion_mnist, "x")
    raises("mp.data.fashion_mnist: split must be 'train' or 'test' (got nil)", data.fashion_mnist)
    raises("mp.data.fashion_mnist: dir must be a string (got 3)", data.fashion_mnist, "test", 3)
    local err = raises("mp.data.fashion_mnist: /nonexistent/dir/t10k-images-idx3-ubyte.gz: cannot open: "
                       .. "No such file or directory", data.fashion_mnist, "test", "/nonexistent/dir")
    assert.truthy(err:find("dataset-fashion-mnist", 1, true), err)   -- says where the data comes from
  end)

  describe("checks the files it reads", function()
    local dir
    before_each(function() dir = tmpdir() end)
    after_each(function() rmdir(dir) end)
    local IMG, LAB = "/t10k-images-idx3-ubyte.gz", "/t10k-labels-idx1-ubyte.gz"

    it("reads a well-formed directory (raw files under .gz names)", function()
      write_idx(dir .. IMG, 0x08, {2, 28, 28}, string.rep("\7", 2 * 784))
      write_idx(dir .. LAB, 0x08, {2}, "\3\9")
      local ds = data.fashion_mnist("test", dir .. "/")
      assert.same({2, 28, 28}, ds.images.shape)
      assert.equal("i32", ds.labels.dtype)
      assert.same({3, 9}, ds.labels:totable())
    end)

    it("rejects mismatched counts, wrong shapes and out-of-range labels", function()
      write_idx(dir .. IMG, 0x08, {3, 28, 28}, string.rep("\0", 3 * 784))
      write_idx(dir .. LAB, 0x08, {2}, "\1\2")
      raises("has 3 images but " .. dir .. LAB .. " has 2 labels", data.fashion_mnist, "test", dir)
      write_idx(dir .. LAB, 0x08, {3}, "\1\10\2")
      raises(LAB .. ": label 10 out of range (classes are 0..9)", data.fashion_mnist, "test", dir)
      write_idx(dir .. IMG, 0x08, {3, 4, 4}, string.rep("\0", 48))
      raises("expected u8 images {N,28,28} (got u8 {3,4,4})", data.fashion_mnist, "test", dir)
      write_idx(dir .. IMG, 0x08, {3, 28, 28}, string.rep("\0", 100))
      raises("mp.data.fashion_mnist: " .. dir .. IMG .. ": truncated: expected 2352 data bytes, got 100",
             data.fashion_mnist, "test", dir)
    end)
  end)
end)

describe("mp.data.loader", function()
  -- a small dataset whose image rows carry their own index, so every batch
  -- shows exactly which examples it holds and that images and labels pair up
  -- datasets live on the cpu (the loader moves batches to their device)
  local function indexed(n, dtype)
    local rows = mp.arange(n, {dtype = "i32", device = "cpu"}):reshape{n, 1}
    return {images = dtype and rows:to(dtype) or rows, labels = mp.arange(n, {dtype = "i32", device = "cpu"})}
  end

  it("gives batches on the default device, or on the device asked for", function()
    local ds = indexed(6, "u8")
    for x, y in data.loader(ds, {batch = 4}) do
      assert.equal(mp.default_device(), x.device)
      assert.equal(mp.default_device(), y.device)
      break
    end
    for x, y in data.loader(ds, {batch = 4, device = "cpu"}) do
      assert.equal("cpu", x.device)
      assert.equal("cpu", y.device)
      assert.same({{0}, {(string.unpack("<f", string.pack("<f", 1 / 255)))}}, x:narrow(1, 1, 2):totable())
      break
    end
    raises("mp.data.loader: device must be 'cpu' or 'cuda' (got 'gpu')", data.loader, ds, {batch = 2, device = "gpu"})
    if not mp.cuda.is_available() then
      raises("mp.data.loader: device 'cuda' is not available on this machine", data.loader, ds, {batch = 2, device = "cuda"})
    end
  end)

  it("gives f32 {B,28,28} in [0,1] and i32 {B}, with the last partial batch", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local te = fmnist("test")
    local l = data.loader(te, {batch = 128})
    assert.equal(79, #l)              -- 78 full batches and one of 16
    local n, nb, first = 0, 0, true
    for x, y in l do
      nb = nb + 1
      local b = nb < 79 and 128 or 16
      assert.equal("f32", x.dtype)
      assert.same({b, 28, 28}, x.shape)
      assert.equal("i32", y.dtype)
      assert.same({b}, y.shape)
      if first then
        first = false
        assert.same({9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, y:narrow(1, 1, 10):totable())
        assert.is_true(x:max():item() <= 1 and (-x):max():item() <= 0)
        -- the first image is the file's, divided by 255
        local px = te.images:narrow(1, 1, 1):reshape{784}:totable()
        local fx = x:narrow(1, 1, 1):reshape{784}:totable()
        for i = 1, 784 do assert.near(px[i] / 255, fx[i], 1e-7) end
      end
      n = n + b
    end
    assert.equal(79, nb)
    assert.equal(10000, n)
  end)

  it("drops the last partial batch with drop_last", function()
    local ds = indexed(10, "u8")
    local l = data.loader(ds, {batch = 4, drop_last = true})
    assert.equal(2, #l)
    local seen = epoch_labels(ds, {batch = 4, drop_last = true})
    assert.same({0, 1, 2, 3, 4, 5, 6, 7}, seen)
    assert.same({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, epoch_labels(ds, {batch = 4}))
    assert.equal(3, #data.loader(ds, {batch = 4}))
    assert.equal(0, #data.loader(ds, {batch = 11, drop_last = true}))
    assert.same({}, epoch_labels(ds, {batch = 11, drop_last = true}))
    assert.equal(1, #data.loader(ds, {batch = 11}))
  end)

  it("scales u8 by 1/255 and only casts other dtypes", function()
    local function first_x(ds) for x, y in data.loader(ds, {batch = 3}) do return x, y end end
    local u8 = first_x(indexed(5, "u8"))
    assert.equal("f32", u8.dtype)
    local function f32(v) return (string.unpack("<f", string.pack("<f", v))) end
    assert.same({{0}, {f32(1 / 255)}, {f32(2 / 255)}}, u8:totable())   -- k/255 rounded to f32
    assert.same({{0}, {1}, {2}}, first_x(indexed(5)):totable())          -- i32: cast
    assert.same({{0}, {1}, {2}}, first_x(indexed(5, "f32")):totable())   -- f32: as is
    assert.same({{0}, {1}, {2}}, first_x(indexed(5, "f16")):totable())   -- f16: widened
    -- labels keep their dtype
    local _, y = first_x({images = indexed(4, "u8").images, labels = mp.tensor({3, 1, 0, 2}, {dtype = "u8", device = "cpu"})})
    assert.equal("u8", y.dtype)
    assert.same({3, 1, 0}, y:totable())
  end)

  it("covers every example exactly once per shuffled epoch, images and labels together", function()
    local n = 1000
    local ds = indexed(n, "f32")
    local seen, count = {}, 0
    for x, y in data.loader(ds, {batch = 64, shuffle = true, seed = 11}) do
      local xs, ys = x:totable(), y:totable()
      for i = 1, #ys do
        assert.equal(ys[i], xs[i][1])          -- the row's own label
        assert.is_nil(seen[ys[i]])
        seen[ys[i]] = true
        count = count + 1
      end
    end
    assert.equal(n, count)
    for i = 0, n - 1 do assert.is_true(seen[i]) end
  end)

  it("covers the whole training set once per epoch, shuffled", function()
    if not H.have_fmnist then return pending(H.no_fmnist) end
    local tr = fmnist("train")
    local count, label_sum, pixel_sum, classes = 0, 0, 0, {}
    for x, y in data.loader(tr, {batch = 128, shuffle = true, seed = 1}) do
      count = count + y.shape[1]
      label_sum = label_sum + y:sum():item()
      pixel_sum = pixel_sum + x:sum():item()
      for _, v in ipairs(y:totable()) do classes[v] = (classes[v] or 0) + 1 end
    end
    assert.equal(60000, count)
    assert.equal(270000, label_sum)
    for c = 0, 9 do assert.equal(6000, classes[c]) end
    -- 3431114169 is the sum of all training pixels (Python); f32 batch sums round
    assert.near(3431114169, pixel_sum * 255, 3431114169 * 1e-6)
  end)

  it("shuffles reproducibly: the same seed gives the same order", function()
    local ds = indexed(500, "u8")
    local a = epoch_labels(ds, {batch = 32, shuffle = true, seed = 42})
    local b = epoch_labels(ds, {batch = 32, shuffle = true, seed = 42})
    local c = epoch_labels(ds, {batch = 32, shuffle = true, seed = 43})
    local plain = epoch_labels(ds, {batch = 32})
    assert.is_true(same_list(a, b))
    assert.is_false(same_list(a, c))
    assert.is_false(same_list(a, plain))
    -- a seeded order does not depend on the batch size, only on (N, seed)
    assert.is_true(same_list(a, epoch_labels(ds, {batch = 7, shuffle = true, seed = 42})))
    -- pinned: the C generator is xoshiro256** seeded by splitmix64, Fisher-Yates
    -- with Lemire's bounded draws (checked against a Python model in test_data.c)
    assert.same({9, 1, 4, 2, 8, 7, 6, 5, 3, 0}, epoch_labels(indexed(10), {batch = 4, shuffle = true, seed = 42}))
  end)

  it("without a seed, draws one from the global stream: new order each epoch, fixed by mp.manual_seed", function()
    local ds = indexed(300, "u8")
    mp.manual_seed(5)
    local e1 = epoch_labels(ds, {batch = 50, shuffle = true})
    local e2 = epoch_labels(ds, {batch = 50, shuffle = true})
    assert.is_false(same_list(e1, e2))
    mp.manual_seed(5)
    assert.is_true(same_list(e1, epoch_labels(ds, {batch = 50, shuffle = true})))
    assert.is_true(same_list(e2, epoch_labels(ds, {batch = 50, shuffle = true})))
  end)

  it("leaves the global random stream alone when it does not shuffle", function()
    local ds = indexed(20, "u8")
    mp.manual_seed(9)
    local r1 = mp.rand(3):totable()
    mp.manual_seed(9)
    epoch_labels(ds, {batch = 6})
    epoch_labels(ds, {batch = 6, shuffle = true, seed = 1})
    assert.same(r1, mp.rand(3):totable())
  end)

  it("can stop early and start again", function()
    local ds = indexed(100, "u8")
    for _, y in data.loader(ds, {batch = 10}) do
      assert.same({10}, y.shape)
      break
    end
    assert.equal(100, #epoch_labels(ds, {batch = 10, shuffle = true, seed = 2}))
  end)

  it("rejects bad options and datasets, naming mp.data.loader at the caller's line", function()
    local ds = indexed(5, "u8")
    local err = raises("mp.data.loader: batch must be a positive integer (got 0)",
                       function() local l = data.loader(ds, {batch = 0}); return l end)
    assert.truthy(err:match("^[^:]*data_spec%.lua:%d+: mp%.data%.loader"), err)   -- the caller's line
    err = raises("mp.data.fashion_mnist: split must be", function() local d = data.fashion_mnist("x"); return d end)
    assert.truthy(err:match("^[^:]*data_spec%.lua:%d+: mp%.data%.fashion_mnist"), err)
    raises("batch must be a positive integer (got -3)", data.loader, ds, {batch = -3})
    raises("batch must be a positive integer (got 1.5)", data.loader, ds, {batch = 1.5})
    raises("batch must be a positive integer (got '8')", data.loader, ds, {batch = "8"})
    raises("batch must be a positive integer (got nil)", data.loader, ds, {})
    raises("mp.data.loader: options must be a table with batch= (got nil)", data.loader, ds)
    raises("mp.data.loader: unknown option 'shufle' (expected batch, shuffle, seed, drop_last, device or shard)",
           data.loader, ds, {batch = 2, shufle = true})
    raises("mp.data.loader: shuffle must be a boolean (got 1)", data.loader, ds, {batch = 2, shuffle = 1})
    raises("mp.data.loader: drop_last must be a boolean (got 'yes')", data.loader, ds, {batch = 2, drop_last = "yes"})
    raises("mp.data.loader: seed must be an integer (got 0.5)", data.loader, ds, {batch = 2, shuffle = true, seed = 0.5})
    raises("mp.data.loader: seed must be an integer (got '1')", data.loader, ds, {batch = 2, shuffle = true, seed = "1"})
    assert.equal(3, #data.loader(ds, {batch = 2.0}))   -- an integral float is an integer
    raises("mp.data.loader: dataset must be a table {images = tensor, labels = tensor} (got nil)", data.loader)
    raises("mp.data.loader: dataset.images must be a tensor (got nil)", data.loader, {labels = ds.labels}, {batch = 2})
    raises("mp.data.loader: dataset.labels must be a tensor (got table)", data.loader,
           {images = ds.images, labels = {1, 2, 3}}, {batch = 2})
    raises("mp.data.loader: dataset has 5 images but 4 labels (first dims {5,1} and {4})", data.loader,
           {images = ds.images, labels = mp.arange(4, {dtype = "i32", device = "cpu"})}, {batch = 2})
    if mp.cuda.is_available() then
      raises("mp.data.loader: dataset.images must be on the cpu (got cuda)", data.loader,
             {images = ds.images:cuda(), labels = ds.labels}, {batch = 2})
    end
  end)
end)

describe("mp.data.text", function()
  local dir
  setup(function() dir = tmpdir() end)
  teardown(function() rmdir(dir) end)

  local function write(name, bytes)
    local f = assert(io.open(dir .. "/" .. name, "wb")); f:write(bytes); f:close()
    return dir .. "/" .. name
  end

  it("reads a file as ids over its distinct bytes in byte order, the last tenth for validation", function()
    local s = "hello there\nthe world\n"
    local d = data.text(write("small.txt", s))
    assert.same({10, 32, 100, 101, 104, 108, 111, 114, 116, 119}, d.vocab)
    assert.equal(10, d.vocab_size)
    assert.equal(#s, d.bytes)
    local id = {}
    for i, b in ipairs(d.vocab) do id[b] = i - 1 end
    local want = {}
    for i = 1, #s do want[i] = id[s:byte(i)] end
    assert.equal("i32", d.train.dtype)
    assert.equal("cpu", d.train.device)
    assert.same({table.unpack(want, 1, 20)}, d.train:totable())
    assert.same({table.unpack(want, 21, 22)}, d.val:totable())
    assert.same({id[116], id[104], id[101]}, d.encode("the"):totable())
    assert.equal("the world", d.decode(d.encode("the world")))
    assert.equal("the", d.decode({8, 4, 3}))
    raises("mp.data.text: encode: byte 120 (at offset 1) is not in the vocabulary", d.encode, "hx")
    raises("mp.data.text: decode: id 10 is not in 0..9", d.decode, {1, 10})
    local x, y = data.windows(d.train, 3, 4, "cpu")
    assert.same({3, 4}, x.shape)
    for r = 1, 3 do   -- each row of y is its row of x moved on by one, both a window of the text
      local xr, yr = x:totable()[r], y:totable()[r]
      assert.same({xr[2], xr[3], xr[4]}, {yr[1], yr[2], yr[3]})
      assert.truthy(s:find(d.decode(xr) .. d.decode({yr[4]}), 1, true))
    end
  end)

  it("refuses what is not a regular file, saying what it is", function()
    raises("mp.data.text: path '" .. dir .. "' is a directory, not a regular file", data.text, dir)
    raises("mp.data.text: path '/dev/null' is a character device, not a regular file", data.text, "/dev/null")
    raises("mp.data.text: cannot open path '" .. dir .. "/none': No such file or directory", data.text, dir .. "/none")
    raises("mp.data.text: the text has 0 bytes (at least 2 needed)", data.text, write("empty", ""))
    raises("mp.data.text: the text has 1 bytes (at least 2 needed)", data.text, write("one", "a"))
    raises("mp.data.text: path must be a string (got 5)", data.text, 5)
  end)

  -- in a child process under `timeout`: a reader that opens the FIFO for reading
  -- waits there for a writer forever
  it("refuses a FIFO without waiting for a writer", function()
    local fifo = dir .. "/fifo"
    assert(os.execute("mkfifo " .. H.q(fifo)))
    local p = io.popen("timeout 60 " .. H.lua .. " -e " .. H.q("local ok, e = pcall(require('mp').data.text, "
      .. string.format("%q", fifo) .. "); io.write(tostring(e))") .. " 2>&1; echo \" (exit $?)\"")
    local out = p:read("a")
    p:close()
    assert.truthy(out:find("mp.data.text: path '" .. fifo .. "' is a FIFO (named pipe), not a regular file (exit 0)", 1, true), out)
  end)

  it("reads at most max_bytes (TEXT_MAX_BYTES by default), naming the file and its size", function()
    local path = write("k.txt", string.rep("abcdefghij", 100))
    assert.equal(1000, data.text(path, {max_bytes = 1000}).bytes)
    raises("mp.data.text: path '" .. path .. "' has 1000 bytes, more than max_bytes = 999", data.text, path, {max_bytes = 999})
    assert.equal(256 * 1024 * 1024, data.TEXT_MAX_BYTES)
    local old = data.TEXT_MAX_BYTES
    data.TEXT_MAX_BYTES = 500
    local ok, err = pcall(data.text, path)
    data.TEXT_MAX_BYTES = old
    assert.is_false(ok)
    assert.truthy(tostring(err):find("has 1000 bytes, more than max_bytes = 500", 1, true), err)
    raises("mp.data.text: max_bytes must be a positive integer (got 0)", data.text, path, {max_bytes = 0})
    raises("mp.data.text: max_bytes must be a positive integer (got 1.5)", data.text, path, {max_bytes = 1.5})
    raises("mp.data.text: unknown option 'maxbytes' (expected max_bytes)", data.text, path, {maxbytes = 5})
    raises("mp.data.text: options must be a table (got 5)", data.text, path, 5)
  end)

  it("keeps the text out of Lua's heap: no table or string per byte", function()
    local n = 2 * 1024 * 1024
    local chunk = {}
    for i = 1, 4096 do chunk[i] = string.char((i - 1) * 7 % 251) end
    local path = write("big.bin", string.rep(table.concat(chunk), n // 4096))
    chunk = nil
    collectgarbage("collect")
    collectgarbage("stop")   -- what the call allocates stays counted, garbage or not
    local before = collectgarbage("count")
    local d = data.text(path)
    local grew = (collectgarbage("count") - before) * 1024
    collectgarbage("restart")
    assert.equal(n, d.bytes)
    assert.equal(251, d.vocab_size)
    assert.same({0, 7, 14}, d.train:narrow(1, 1, 3):totable())   -- bytes 0, 7, 14: ids 0, 7, 14
    -- one Lua integer a byte would be 16 bytes a byte; a string of the text, 1
    assert.is_true(grew < n / 16, string.format("Lua's heap grew by %.0f bytes for a text of %d", grew, n))
  end)

  it("concatenates the fortunes' files without an extension, leaving directories out", function()
    local old = data.FORTUNES_DIR
    local fdir = dir .. "/fortunes"
    assert(os.execute("mkdir -p " .. H.q(fdir .. "/off")))
    for name, s in pairs { b = "bbb\n", a = "aa\n", ["a.dat"] = "xx", ["off/c"] = "cc" } do
      local f = assert(io.open(fdir .. "/" .. name, "wb")); f:write(s); f:close()
    end
    data.FORTUNES_DIR = fdir
    local ok, d = pcall(data.text)
    local ok2, err = pcall(data.text, nil, {max_bytes = 6})
    data.FORTUNES_DIR = old
    assert(ok, d)
    assert.equal("aa\nbbb\n", d.decode(d.train) .. d.decode(d.val))
    assert.is_false(ok2)
    assert.truthy(tostring(err):find("mp.data.text: the files of " .. fdir .. " have more than max_bytes = 6 bytes", 1, true), err)
  end)
end)
