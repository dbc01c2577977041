-- thread_bits_spec.lua: what the CPU promises about bits and threads
-- (docs/ARCHITECTURE.md, Threads). The same build, processor and thread count
-- give the same bits run after run: each model below trains three steps twice,
-- in two processes on two threads, and the saved states must be equal byte for
-- byte. A kernel whose result depended on which thread finished first (dynamic
-- schedules feeding a sum, float atomics) would fail here. Bits across thread
-- counts are not promised where oneDNN's GEMM splits a sum among its threads;
-- the convolutions' are, and tests/c/test_conv.c checks them in 1 and 2 threads.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local H = dofile(here .. "helpers.lua")

local function tmp(name) local b = os.tmpname(); os.remove(b); return b .. "-" .. name end

-- the state after three steps of kind in mode, trained in a child process on threads threads
local function train(kind, mode, threads)
  local out = tmp(kind .. "-" .. mode .. ".st")
  local p = io.popen(string.format("%s%s %s %s %s %s 2>&1; echo \"exit=$?\"", H.env { OMP_NUM_THREADS = tostring(threads) },
                                   H.mpengine, here .. "thread_bits_child.lua", kind, mode, out))
  local log = p:read("a")
  p:close()
  assert.are.equal("0", log:match("exit=(%d+)%s*$"), log)
  local bytes = H.slurp(out)
  os.remove(out)
  assert.is_true(#bytes > 1000, log)
  return bytes
end

describe("bits and threads", function()
  for _, c in ipairs { { "gpt", "f32" }, { "gpt", "f16" }, { "gpt", "bf16" }, { "resnet", "f32" }, { "resnet", "bf16" },
                       { "mlp", "f16" } } do
    it(string.format("%s %s: two runs on two threads train to the same bits", c[1], c[2]), function()
      local a, b = train(c[1], c[2], 2), train(c[1], c[2], 2)
      assert.is_true(a == b, "the two runs' states differ")
    end)
  end
end)
