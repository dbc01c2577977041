-- gpt_qkv_spec.lua: scripts/models/gpt.lua's q, k, v as slabs of one permute
-- ({B, T, 3C} read as {B, T, 3, H, Dh}, permuted to {3, B, H, T, Dh}, chunk(3, 1))
-- against the layout it replaced (chunk(3, 3) along the features, each piece's
-- heads split by a transpose): both only move elements, and chunk's gradient is
-- the same padding and in-place additions over a different layout, so training
-- must give the same bits. Three steps of train_gpt.lua's recipe (AdamW with decay
-- groups, clipping at 1.0, the loss scaler under f16) from one seed, in f32 and
-- under bf16 and f16 autocast, on the default device: the losses, every
-- parameter and every last gradient, byte for byte in the safetensors files.
-- Head dim 64 and T 64, so on CUDA (or the emulated device) f16/bf16 take the
-- flash kernels. The embedding's backward on CUDA adds with float atomics
-- (k_scatter_atomic, an unordered launch): their order is the device's, and
-- under the emulator's shuffled order (MP_EMU_ORDER=shuffle, as tests/run.sh
-- runs the suite) each launch's permutation depends on how many came before,
-- which the two layouts differ in; there the pair runs in a child process on
-- the emulator's forward order. On a real GPU the order is not fixed at all:
-- pending.
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")
local mp = require "mp"
local PAIR = H.root .. "/tests/lua/gpt_qkv_pair.lua"

-- where the pair runs: here, in a child on the emulator's fixed order, or not at all
local function where()
  if mp.default_device() ~= "cuda" then return "here" end
  local backend = os.getenv("MP_CUDA_BACKEND")
  if backend and backend:match("emu_cuda%.so$") then return "emu" end
  if backend and backend:match("fake_cuda%.so$") then return "here" end   -- the CPU's kernels through a second table
  return nil
end

describe("scripts/models/gpt.lua's q, k, v", function()
  for _, mode in ipairs { "f32", "bf16", "f16" } do
    local name = "train as chunk(3, 3) and transposes did, bit for bit, in " .. mode
    local w = where()
    if w == "here" then
      it(name, function() dofile(PAIR).compare(mode) end)
    elseif w == "emu" then
      it(name .. " (the emulated device, threads in forward order)", function()
        local r = H.child(string.format("return dofile(%q).compare(%q)", PAIR, mode), false,
                          { MP_DEVICE = "cuda", MP_CUDA_BACKEND = os.getenv("MP_CUDA_BACKEND"),
                            MP_NCCL_LIBRARY = os.getenv("MP_CUDA_BACKEND"), MP_EMU_ORDER = "forward",
                            MP_EMU_COVERAGE = os.getenv("MP_EMU_COVERAGE") })
        assert.are.equal(0, r.rc, r.out .. r.err)
        assert.truthy(r.out:match("^OK:%d"), r.out .. r.err)
      end)
    else
      pending(name .. ": on a real GPU the embedding backward's atomic adds have no fixed order")
    end
  end
end)
