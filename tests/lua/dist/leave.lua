-- leave.lua: a rank that leaves while the other waits in a collective, for
-- dist_spec.lua, under mpirun -np 2:
--
--   mpengine tests/lua/dist/leave.lua HOW [uncaught | exit]
--
-- rank 1 leaves at once, by HOW: "exit" (os.exit(0)), "end" (the end of its
-- script), "caught" (an error it catches, then the end), "finalize"
-- (mp.dist.finalize(), whose error it prints), or "uneven" (a data-parallel
-- training that runs out of batches one step before rank 0's). Rank 0 calls
-- all_reduce (or its third backward), prints what it got, then tries a barrier:
-- a rank left, so no collective can run any more. With "uncaught" rank 0 does
-- not catch the error: mpengine reports it and the job ends; with "exit" it
-- ends by os.exit(0) (on the emulated device, with step 3's queued work that
-- mp.dist's leaving runs: it crashed when that came in C's exit handlers).
-- Every wait is bounded by a timeout of 60 s, should the rank's leaving go unseen.
local mp = require "mp"
local how, uncaught, exits = arg[1], arg[2] == "uncaught", arg[2] == "exit"
local rank = mp.dist.init{timeout = 60}
local dev = mp.default_device()

if how == "uneven" then   -- the usual way: rank 1 has one batch less
  local lin = mp.nn.Linear(3, 2)
  local opt = mp.optim.SGD(lin:parameters(), {lr = 0.1, dist = true})
  local function step()
    opt:zero_grad()
    lin(mp.ones({4, 3}, {device = dev})):sum():backward()
    opt:step()
  end
  for s = 1, rank == 0 and 3 or 2 do
    if s < 3 then step()
    else
      local ok, err = pcall(step)
      print("rank 0 step 3: " .. tostring(err))
    end
  end
  if rank == 1 then return end
elseif rank == 1 then
  if how == "exit" then os.exit(0) end
  if how == "caught" then print("rank 1 caught: " .. select(2, pcall(error, "a failure of its own", 0))) end
  if how == "finalize" then print("rank 1 finalize: " .. tostring(select(2, pcall(mp.dist.finalize)))) end
  return
else
  local t = mp.ones(4, {device = dev})
  if uncaught then mp.dist.all_reduce(t) end
  local ok, err = pcall(mp.dist.all_reduce, t)
  print("rank 0 all_reduce: " .. tostring(err))
end
local ok, err = pcall(mp.dist.barrier)
print("rank 0 barrier: " .. tostring(err))
if exits then os.exit(0) end
