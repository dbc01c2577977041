-- collectives.lua: mp.dist's collectives on every dtype, for dist_spec.lua, run
-- under mpirun -np N (N >= 2). Each rank checks what it got and prints
-- "rank R ok" at the end; a wrong value raises (and mpengine ends the job).
local mp = require "mp"
local rank, n = mp.dist.init()
assert(rank == mp.dist.rank() and n == mp.dist.size() and n >= 2, "a world of two or more")
assert(mp.dist.backend():find("MPI"), mp.dist.backend())
local dev = mp.get_default_device and mp.get_default_device() or mp.default_device()

local function eq(got, want, what)
  if got ~= want then error(string.format("rank %d: %s: got %s, want %s", rank, what, tostring(got), tostring(want)), 2) end
end

-- sum, mean, max, min of rank-dependent values, every dtype (f16/bf16: exact small values)
local sum_r = n * (n - 1) / 2   -- 0 + 1 + ... + n-1
for _, dt in ipairs{"f32", "f16", "bf16", "i32"} do
  for _, op in ipairs{"sum", "mean", "max", "min"} do
    if not (dt == "i32" and op == "mean") then
      local t = mp.tensor({rank, 2 * rank + 1, -rank}, {dtype = dt, device = dev})
      local r = mp.dist.all_reduce(t, op)
      assert(rawequal(r, t), "all_reduce returns its tensor")
      local v = t:to("f32"):totable()
      local want = ({sum = {sum_r, 2 * sum_r + n, -sum_r}, mean = {sum_r / n, (2 * sum_r + n) / n, -sum_r / n},
                     max = {n - 1, 2 * n - 1, 0}, min = {0, 1, -(n - 1)}})[op]
      for i = 1, 3 do eq(v[i], want[i] + 0.0, dt .. " " .. op .. " [" .. i .. "]") end
    end
  end
end

-- a large f32 reduction (more than one MPI message)
local big = mp.full({1 << 20}, rank + 1, {device = dev})
mp.dist.all_reduce(big)
eq((-big):max():item(), -(sum_r + n + 0.0), "large sum (min)")
eq(big:max():item(), sum_r + n + 0.0, "large sum (max)")

-- broadcast from the last rank, of u8 bytes too
local b = mp.tensor({{rank, rank}, {rank, rank}}, {device = dev})
mp.dist.broadcast(b, n - 1)
eq(b:sum():item(), 4.0 * (n - 1), "broadcast")
local u = mp.full({5}, rank, {dtype = "u8", device = dev})
mp.dist.broadcast(u)
eq(u:to("f32"):sum():item(), 0.0, "broadcast u8 from 0")

-- all_gather: rank r's tensor at index r + 1
local g = mp.dist.all_gather(mp.full({2, 3}, rank, {dtype = "bf16", device = dev}))
eq(table.concat(g.shape, ","), n .. ",2,3", "all_gather shape")
eq(g.dtype, "bf16", "all_gather dtype")
for r = 0, n - 1 do eq(g[r + 1]:to("f32"):sum():item(), 6.0 * r, "all_gather[" .. r .. "]") end

-- the ranks disagree: an error on every rank, naming what each called, and the world goes on
local function disagree(what, sides, f, ...)
  local ok, err = pcall(f, ...)
  assert(not ok and err:find("the ranks disagree on " .. what .. ": " .. sides, 1, true),
         "rank " .. rank .. ": want " .. sides .. "\n got " .. tostring(err))
end
local ok, err
local dn = type(dev) == "string" and dev or tostring(dev)
disagree("the tensor's shape", "rank 0 calls all_reduce (sum) of f32 {1} on " .. dn .. "; rank 1 calls all_reduce (sum) of f32 {2} on",
         mp.dist.all_reduce, mp.zeros(rank + 1, {device = dev}))
-- the same number of elements in another shape: {2,4} against {8}, and against {4,2}
disagree("the tensor's shape", "rank 0 calls all_reduce (sum) of f32 {2,4} on " .. dn .. "; rank 1 calls all_reduce (sum) of f32 {8} on",
         mp.dist.all_reduce, rank == 0 and mp.zeros({2, 4}, {device = dev}) or mp.zeros({8}, {device = dev}))
disagree("the tensor's shape", "rank 0 calls all_gather of f32 {2,4} on " .. dn .. "; rank 1 calls all_gather of f32 {4,2} on",
         mp.dist.all_gather, rank == 0 and mp.zeros({2, 4}, {device = dev}) or mp.zeros({4, 2}, {device = dev}))
-- different collectives: all_reduce against broadcast, barrier against all_gather
local x = mp.zeros({2, 4}, {device = dev})
disagree("the collective", "rank 0 calls all_reduce (sum) of f32 {2,4} on " .. dn .. "; rank 1 calls broadcast (root 0) of f32 {2,4} on",
         rank == 0 and function() return mp.dist.all_reduce(x, "sum") end or function() return mp.dist.broadcast(x, 0) end)
disagree("the collective", "rank 0 calls barrier; rank 1 calls all_gather of f32 {2,4} on",
         rank == 0 and mp.dist.barrier or function() return mp.dist.all_gather(x) end)
-- the engine's own collectives take part: a public all_reduce against a data-parallel backward's bucket
local lin = mp.nn.Linear(3, 2)
local opt = mp.optim.SGD(lin:parameters(), {lr = 0.1, dist = true})
disagree("the collective", "rank 0 calls all_reduce (sum) of f32 {8} on " .. dn .. "; rank 1 calls the gradient average (a bucket of f32 {8} on",
         rank == 0 and function() return mp.dist.all_reduce(mp.zeros(8, {device = dev})) end
                   or function() return lin(mp.ones({1, 3}, {device = dev})):sum():backward() end)
opt:zero_grad()
lin(mp.ones({1, 3}, {device = dev})):sum():backward()   -- and then the buckets line up again
eq(lin.bias.grad:sum():item(), 2.0, "the gradient average after the disagreement")
ok, err = pcall(mp.dist.all_reduce, mp.zeros(2, {device = dev}), rank == 0 and "sum" or "max")
assert(not ok and err:find("the ranks disagree on the op", 1, true), tostring(err))
-- a tensor one rank alone may not reduce (u8): the rendezvous comes first, so
-- the other rank learns of it too instead of waiting; and ranks that agree on
-- such a tensor all refuse it
ok, err = pcall(mp.dist.all_reduce, mp.zeros(2, {dtype = rank == 0 and "u8" or "f32", device = dev}))
assert(not ok and err:find("the ranks disagree on the tensor's dtype", 1, true), tostring(err))
ok, err = pcall(mp.dist.all_reduce, mp.zeros(2, {dtype = "u8", device = dev}))
assert(not ok and err:find("is u8", 1, true), tostring(err))
ok, err = pcall(mp.dist.all_reduce, mp.zeros(2, {dtype = "i32", device = dev}), "mean")
assert(not ok and err:find("mean", 1, true), tostring(err))
ok, err = pcall(mp.dist.broadcast, mp.zeros(2, {device = dev}), rank)
assert(not ok and err:find("the ranks disagree on the root", 1, true), tostring(err))
ok, err = pcall(mp.dist.all_reduce, mp.zeros(2, {dtype = rank == 0 and "f32" or "f16", device = dev}))
assert(not ok and err:find("the ranks disagree on the tensor's dtype", 1, true), tostring(err))
-- refused on every rank alike, before any message
ok, err = pcall(mp.dist.broadcast, mp.zeros(2), n)
assert(not ok and err:find("mp.dist.broadcast: root " .. n .. " is not a rank", 1, true), tostring(err))

-- after all that, the collectives still line up
local s = mp.tensor({1}, {device = dev})
mp.dist.all_reduce(s)
eq(s:item(), n + 0.0, "a sum after the errors")
mp.dist.barrier()
print(string.format("rank %d ok", rank))
mp.dist.finalize()
ok, err = pcall(mp.dist.all_reduce, s)
assert(not ok and err:find("mp.dist was finalized", 1, true), tostring(err))
