-- device_one.lua: a device's own collectives in a world of one (NCCL with one
-- rank on a GPU; on the fake device with MP_FAKE_CUDA_COLL=1), for
-- scripts/gpu_check.sh: the group is made, every collective leaves its data
-- as a world of one must, on every dtype, and a data-parallel f16 step reads
-- nothing back on the host. Prints "device collectives ok" at the end.
local mp = require "mp"
mp.dist.init{device_collectives = true}
assert(mp.default_device() == "cuda", "run with MP_DEVICE=cuda")
for _, dt in ipairs{"f32", "f16", "bf16", "i32"} do
  for _, op in ipairs{"sum", "mean", "max", "min"} do
    if not (dt == "i32" and op == "mean") then
      local t = mp.tensor({1, -2, 3, 4096}, {dtype = dt})
      mp.dist.all_reduce(t, op)
      local v = t:to("f32"):totable()
      assert(v[1] == 1 and v[2] == -2 and v[3] == 3 and v[4] == 4096, dt .. " " .. op .. ": " .. table.concat(v, ","))
    end
  end
end
local big = mp.full({1 << 22}, 3)   -- 16 MiB
mp.dist.all_reduce(big, "sum")
assert(big:max():item() == 3 and (-big):max():item() == -3, "a 16 MiB all_reduce")
local b = mp.tensor({7, 8}, {dtype = "bf16"})
mp.dist.broadcast(b, 0)
assert(b:to("f32"):sum():item() == 15, "broadcast")
local g = mp.dist.all_gather(mp.tensor({{1, 2}}, {dtype = "f16"}))
assert(table.concat(g.shape, ",") == "1,1,2" and g:to("f32"):sum():item() == 3, "all_gather")
mp.cuda.synchronize()
print("backend: " .. mp.dist.backend())
print("device collectives ok")
