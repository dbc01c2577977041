-- timeout.lua: a rank that does not come, for dist_spec.lua, under mpirun -np 2
-- with a timeout of 1 s:
--
--   mpengine tests/lua/dist/timeout.lua MARK
--
-- rank 1 stays away until rank 0's all_reduce has timed out (rank 0 writes
-- MARK.0 then), then calls its own, which fails at once: rank 0 gave up. Each
-- rank prints its errors and a barrier's after them (the world is broken:
-- none can run); rank 0 waits for rank 1's MARK.1 before it exits, and the job
-- then ends with MPI_Abort (MPI cannot finalize after a timeout). Every wait
-- for a mark is bounded (60 s).
local mp = require "mp"
local mark = assert(arg[1], "timeout.lua MARK")
local rank = mp.dist.init{timeout = 1}
local dev = mp.default_device()

local function wait_for(path)
  for _ = 1, 600 do
    local f = io.open(path, "rb")
    if f then return f:close() end
    os.execute("sleep 0.1")
  end
  error("rank " .. rank .. ": " .. path .. " did not come in 60 s")
end

if rank == 1 then wait_for(mark .. ".0") end
local ok, err = pcall(mp.dist.all_reduce, mp.ones(4, {device = dev}))
print("rank " .. rank .. " all_reduce: " .. tostring(err))
ok, err = pcall(mp.dist.barrier)
print("rank " .. rank .. " barrier: " .. tostring(err))
io.stdout:flush()
io.open(mark .. "." .. rank, "wb"):close()
if rank == 0 then wait_for(mark .. ".1") end
