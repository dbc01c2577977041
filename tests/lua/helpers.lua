-- helpers.lua: shared by tests/lua/*_spec.lua (not a spec itself).
-- Load it with:  local H = dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "helpers.lua")
-- (busted runs the specs with `require "mp"` on LUA_PATH/LUA_CPATH; see tests/run.sh)

local H = {}

-- repository root, from where this file lives (tests/lua/helpers.lua)
local here = debug.getinfo(1, "S").source:gsub("^@", "")
local dir = here:match("^(.*)/[^/]*$") or "."
H.root = dir .. "/../.."
H.build = os.getenv("MP_TEST_BUILD") or (H.root .. "/build")
H.lua = os.getenv("LUA") or "lua5.4"

function H.q(s) return "'" .. tostring(s):gsub("'", [['\'']]) .. "'" end

-- the value of x rounded to f32 (an independent reference: string.pack)
function H.f32(x) return (string.unpack("<f", string.pack("<f", x))) end

function H.isnan(x) return x ~= x end

-- |a - b| <= atol + rtol * |b|
function H.close(a, b, rtol, atol)
  rtol, atol = rtol or 1e-5, atol or 1e-6
  if H.isnan(a) or H.isnan(b) then return H.isnan(a) and H.isnan(b) end
  if a == b then return true end
  return math.abs(a - b) <= atol + rtol * math.abs(b)
end

-- flatten nested tables (row-major)
function H.flat(t, out)
  out = out or {}
  if type(t) ~= "table" then out[#out + 1] = t; return out end
  for i = 1, #t do H.flat(t[i], out) end
  return out
end

-- asserts two nested tables (or numbers) hold the same values within tolerance
function H.assert_close(got, want, rtol, atol, what)
  local g, w = H.flat(got), H.flat(want)
  assert(#g == #w, (what or "values") .. ": " .. #g .. " elements, expected " .. #w)
  for i = 1, #w do
    if not H.close(g[i], w[i], rtol, atol) then
      error(string.format("%s: element %d is %.9g, expected %.9g", what or "values", i, g[i], w[i]), 2)
    end
  end
  return true
end

-- exact equality of nested tables, NaN equal to NaN, with the first difference in the message
function H.assert_same(got, want, what)
  local g, w = H.flat(got), H.flat(want)
  assert(#g == #w, (what or "values") .. ": " .. #g .. " elements, expected " .. #w)
  for i = 1, #w do
    if not (g[i] == w[i] or (H.isnan(g[i]) and H.isnan(w[i]))) then
      error(string.format("%s: element %d is %.17g, expected %.17g", what or "values", i, g[i], w[i]), 2)
    end
  end
  return true
end

-- a Lua matrix (table of rows) from a flat table
function H.rows(flat, m, n)
  local r = {}
  for i = 1, m do
    r[i] = {}
    for j = 1, n do r[i][j] = flat[(i - 1) * n + j] end
  end
  return r
end

-- naive product of Lua matrices A {m,k} and B {k,n}
function H.matmul(A, B)
  local m, k, n = #A, #B, #B[1]
  assert(#A[1] == k)
  local C = {}
  for i = 1, m do
    C[i] = {}
    for j = 1, n do
      local s = 0
      for p = 1, k do s = s + A[i][p] * B[p][j] end
      C[i][j] = s
    end
  end
  return C
end

-- resident set size of this process in bytes (nil where /proc is missing)
function H.rss()
  local f = io.open("/proc/self/status", "r")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  local kb = s:match("VmRSS:%s*(%d+)%s*kB")
  return kb and tonumber(kb) * 1024
end

-- the mpengine program the CLI and REPL specs run
H.mpengine = os.getenv("MPENGINE") or (H.build .. "/mpengine")

-- Child processes run on the CPU unless a spec asks for another device (envvars
-- MP_DEVICE): on a GPU machine, a suite run with MP_DEVICE=cuda would otherwise
-- create a CUDA context and load cuBLAS in each of its hundreds of children.
-- H.env(envvars [, unset]) is the `env ...` prefix of a child's command line
-- (unset: a list of variables to remove).
-- H.script(path)(args) -> output, exit status: a training script run by build/mpengine in a
-- child process (CPU unless asked otherwise), its output and status together
function H.script(path)
  return function(args)
    local p = io.popen(string.format("%s%s %s %s 2>&1; echo \"exit=$?\"", H.env(), H.mpengine, path, args))
    local out = p:read("a")
    p:close()
    return out, tonumber(out:match("exit=(%d+)%s*$"))
  end
end

function H.env(envvars, unset)
  local vars = { MP_DEVICE = "cpu" }
  for k, v in pairs(envvars or {}) do vars[k] = v end
  local names = {}
  for k in pairs(vars) do names[#names + 1] = k end
  table.sort(names)
  local parts = { "env" }
  for _, k in ipairs(unset or {}) do parts[#parts + 1] = "-u " .. k end
  for _, k in ipairs(names) do parts[#parts + 1] = k .. "=" .. H.q(vars[k]) end
  return table.concat(parts, " ") .. " "
end

-- the emulated CUDA device (tests/emu), or why not: the environment that
-- puts a child process's "cuda" device on it, NCCL's calls included
local emu_so = H.build .. "/tests/emu_cuda.so"
local emu_f = io.open(emu_so, "rb")
if emu_f then emu_f:close() end
H.emu = emu_f and emu_so or nil
H.no_emu = "the emulated CUDA device is not built (" .. emu_so .. ": the CUDA toolkit's headers were not found)"
function H.emu_env(envvars)
  local vars = { MP_DEVICE = "cuda", MP_CUDA_BACKEND = H.emu, MP_NCCL_LIBRARY = H.emu }
  for k, v in pairs(envvars or {}) do vars[k] = v end
  return vars
end

-- whether this process's default device is a real GPU: "cuda" on mp/cuda.so
-- itself, not on the emulated or the fake device (test backends loaded through
-- MP_CUDA_BACKEND). The emulated device sums in the CPU's f32 order; a GPU's
-- tensor cores and cuBLAS kernels do not, and the specs that bound a GPU's sums
-- say where they widen for it.
function H.gpu_hardware()
  local mp = require "mp"
  if mp.default_device() ~= "cuda" then return false end
  local backend = os.getenv("MP_CUDA_BACKEND")
  return not (backend and (backend:match("emu_cuda%.so$") or backend:match("fake_cuda%.so$")))
end

-- Debian's dataset-fashion-mnist, which the training scripts read (the Makefile
-- installs it; a machine without it, such as the GPU machine, reports their
-- specs pending with H.no_fmnist)
local fm_dir = require("mp").data.FASHION_MNIST_DIR
local fm_f = io.open(fm_dir .. "/train-images-idx3-ubyte.gz", "rb")
if fm_f then fm_f:close() end
H.have_fmnist = fm_f ~= nil
H.no_fmnist = "dataset-fashion-mnist is not installed (" .. fm_dir .. ")"

function H.spit(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

function H.slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end
local spit, slurp = H.spit, H.slurp

-- nested tables of `shape` from a flat list (a number for a 0-d shape)
function H.nest(flat, shape)
  if #shape == 0 then return flat[1] end
  local k = 0
  local function go(d)
    local r = {}
    for i = 1, shape[d] do
      if d == #shape then k = k + 1; r[i] = flat[k] else r[i] = go(d + 1) end
    end
    return r
  end
  return go(1)
end

-- the number of elements of a tensor of `shape`
function H.numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end

-- a tensor's values as a flat Lua list, row-major, in any dtype (one value for a 0-d tensor)
function H.values(t)
  local v = t:totable()
  if type(v) == "number" then return { v } end
  return H.flat(v)
end

-- a standard normal from Lua's own generator (Box-Muller), so that a spec that
-- seeds math.randomseed draws the same inputs on every device and build
function H.gauss()
  local u1, u2 = 1 - math.random(), math.random()
  return math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)
end

-- Runs a Lua chunk in a child lua5.4 with `mp` loaded. Returns a table:
--   rc      exit status as the shell reports it (128 + n: killed by signal n)
--   signal  the signal number, or nil when the child exited normally
--   out     what the child wrote on stdout
--   err     what the child wrote on stderr
-- raw=true runs `code` as the whole script; otherwise the code is the body of a
-- function run under pcall, and the child writes "OK:<tostring of the first
-- result>" or "ERR:<message>" and exits 0 (no error) or 3 (error) WITHOUT
-- closing the Lua state (os.exit(n, false)), so that crashes at exit (a
-- separate bug) do not mask what the call itself did. envvars: extra environment
-- variables for the child, {NAME = "value"} (MP_DEVICE is cpu unless given: H.env).
function H.child(code, raw, envvars)
  local script, errf = os.tmpname(), os.tmpname()
  local body = code
  if not raw then
    body = "local mp = require 'mp'\n"
        .. "local ok, r = pcall(function()\n" .. code .. "\nend)\n"
        .. "io.write(ok and ('OK:' .. tostring(r)) or ('ERR:' .. tostring(r)))\n"
        .. "io.stdout:flush()\n"
        .. "os.exit(ok and 0 or 3, false)\n"
  end
  spit(script, body)
  local vars = { LUA_PATH = H.root .. "/lua/?.lua;" .. H.root .. "/lua/?/init.lua;;", LUA_CPATH = H.build .. "/?.so;;" }
  for k, v in pairs(envvars or {}) do vars[k] = v end
  local cmd = "{ " .. H.env(vars) .. H.lua .. " " .. H.q(script) .. " 2>" .. H.q(errf)
           .. "; } 2>/dev/null; echo \"__rc=$?\""
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  local rc = tonumber(out:match("__rc=(%d+)\n?$"))
  out = out:gsub("__rc=%d+\n?$", "")
  local err = slurp(errf)
  os.remove(script)
  os.remove(errf)
  return { rc = rc, signal = rc and rc > 128 and rc - 128 or nil, out = out, err = err }
end

-- Asserts that `code` (a function body, see H.child) raises a Lua error in a
-- child process without killing it, and that the message contains every
-- string in `words` (plain, case-insensitive). Returns the message.
function H.child_error(code, words)
  local r = H.child(code)
  assert(not r.signal, string.format("child killed by signal %s running:\n%s\nstderr: %s",
                                     tostring(r.signal), code, r.err))
  local msg = r.out:match("^ERR:(.*)$")
  assert(msg, string.format("expected an error from:\n%s\ngot: %s (rc %s) %s", code, r.out,
                            tostring(r.rc), r.err))
  assert(r.rc == 3, "child exit status " .. tostring(r.rc) .. " for:\n" .. code)
  local low = msg:lower()
  for _, w in ipairs(words or {}) do
    assert(low:find(w:lower(), 1, true),
           string.format("error from:\n%s\nis %q; expected it to mention %q", code, msg, w))
  end
  return msg
end

-- In-process: calls fn, asserts it raises, and that the message mentions each word.
function H.raises(fn, words)
  local ok, msg = pcall(fn)
  assert(not ok, "expected an error, the call succeeded")
  msg = tostring(msg)
  local low = msg:lower()
  for _, w in ipairs(words or {}) do
    assert(low:find(w:lower(), 1, true),
           string.format("error is %q; expected it to mention %q", msg, w))
  end
  return msg
end

-- max |a - b| / max |b| over two tensors of any dtype and device (the reference specs' measure)
function H.rel_err(a, b)
  local d = (a:to("f32"):cpu() - b:to("f32"):cpu()):abs():max():item()
  return d / math.max(b:abs():max():item(), 1e-30)
end

-- every tensor of two train_mlp.lua checkpoints' models, bit for bit (raw f32 bytes);
-- returns ok, and where they first differ
function H.same_model(a, b)
  local mp = require "mp"
  local ca, cb = mp.load(a), mp.load(b)
  local n = 0
  for k, t in pairs(ca.model) do
    local u = cb.model[k]
    assert(u, "missing " .. k)
    local x, y = t:reshape{-1}:totable(), u:reshape{-1}:totable()
    assert(#x == #y, k)
    for i = 1, #x do
      if string.pack("<f", x[i]) ~= string.pack("<f", y[i]) then return false, k .. "[" .. i .. "]" end
    end
    n = n + 1
  end
  return n == 6, "tensor count " .. n
end

-- Gradient checks of pow_spec and math_ops_spec: f64 through mp.autograd.gradcheck where
-- the default device has f64, else f32 central differences.
-- uniform values in [lo, hi] from Lua's generator, rounded to f32
function H.uniform(n, lo, hi)
  local v = {}
  for i = 1, n do v[i] = H.f32(lo + (hi - lo) * math.random()) end
  return v
end

-- The gradients of f (inputs: leaves of the given shapes, f32) against central
-- differences: L = sum(f(...) * R) for a fixed R; h = 1e-2 and |num - ana| <=
-- 1e-3 + 1e-2 |ana| (f32 forward: L's rounding over 2h is ~1e-4 here; h^2 f'''
-- is ~1e-4 for these O(1) powers). Used where the default device declines f64
-- (MP_DEVICE=cuda: the f32 kernels of the fake and the emulated device).
function H.gradcheck32(f, inputs, what)
  local mp = require "mp"
  local function vals(t) return H.flat(t:f32():totable()) end
  local xs = {}
  for i, x in ipairs(inputs) do xs[i] = mp.tensor(H.nest(x.v, x.shape)):requires_grad(true) end
  local out = f(table.unpack(xs))
  mp.manual_seed(7)
  local R = mp.randn(out.shape)
  local Rv = vals(R)
  out:backward(R)
  local function L(args)
    local o = vals(f(table.unpack(args)))
    local s = 0
    for k = 1, #o do s = s + o[k] * Rv[k] end
    return s
  end
  local _ <close> = mp.no_grad()
  for i, x in ipairs(inputs) do
    local ana = vals(xs[i].grad)
    assert(table.concat(x.shape, ",") == table.concat(xs[i].grad.shape, ","), what .. ": gradient shape of input " .. i)
    for j = 1, #x.v do
      local v, args = x.v[j], {}
      for k, y in ipairs(xs) do args[k] = y:detach() end
      local vp, vm = H.f32(v + 1e-2), H.f32(v - 1e-2)
      x.v[j] = vp
      args[i] = mp.tensor(H.nest(x.v, x.shape))
      local lp = L(args)
      x.v[j] = vm
      args[i] = mp.tensor(H.nest(x.v, x.shape))
      local lm = L(args)
      x.v[j] = v
      local num = (lp - lm) / (vp - vm)
      if not (math.abs(num - ana[j]) <= 1e-3 + 1e-2 * math.abs(ana[j])) then
        error(string.format("%s: input %d element %d: analytic %.7g, numeric %.7g", what, i, j, ana[j], num), 2)
      end
    end
  end
end

-- Where the default device holds f64 (the CPU): mp.autograd.gradcheck on the
-- same values as f64 leaves, at PyTorch's defaults (eps 1e-6, atol 1e-5, rtol
-- 1e-3, every entry of the Jacobian: truncation ~1e-13 and rounding ~1e-10
-- there, for these O(1) powers on bases >= 0.5), and the gradients' shapes.
function H.gradcheck(f, inputs, what)
  local mp = require "mp"
  if not pcall(mp.zeros, { 1 }, { dtype = "f64" }) then return H.gradcheck32(f, inputs, what) end
  local xs = {}
  for i, x in ipairs(inputs) do xs[i] = mp.tensor(H.nest(x.v, x.shape), { dtype = "f64" }):requires_grad(true) end
  local ok, err = pcall(mp.autograd.gradcheck, f, xs, { eps = 1e-6, atol = 1e-5, rtol = 1e-3 })
  if not ok then error(what .. " (f64): " .. tostring(err), 2) end
  local out = f(table.unpack(xs))
  out:backward(mp.ones(out.shape, { dtype = "f64" }))
  for i, x in ipairs(xs) do
    assert(table.concat(inputs[i].shape, ",") == table.concat(x.grad.shape, ","), what .. ": gradient shape of input " .. i)
    assert(x.grad.dtype == "f64", what .. ": gradient dtype of input " .. i)
  end
end

-- every kind of optimizer step the kernels have (kernels/cpu/cpu_optim.c), each
-- with its options set so that every branch of its update runs: name -> maker
-- of an optimizer over a list of parameters, and the names in a fixed order
H.optimizer_kinds = {
  SGD = function(ps) return require("mp").optim.SGD(ps, {lr = 0.05, momentum = 0.9, weight_decay = 0.01}) end,
  Adam = function(ps) return require("mp").optim.Adam(ps, {lr = 0.01, weight_decay = 0.01}) end,
  AdamW = function(ps) return require("mp").optim.AdamW(ps, {lr = 0.01}) end,
  RMSprop = function(ps) return require("mp").optim.RMSprop(ps, {lr = 0.01, centered = true, momentum = 0.5}) end,
  Adagrad = function(ps) return require("mp").optim.Adagrad(ps, {lr = 0.05}) end,
}
H.optimizer_kind_names = {"SGD", "Adam", "AdamW", "RMSprop", "Adagrad"}

return H
