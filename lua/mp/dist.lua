-- mp.dist: processes that train together, started by mpirun (engine/dist.h,
-- lua/ldist.c). Without a launcher a script is a world of one: rank 0 of 1,
-- every collective leaves its tensor as it is, and MPI is never loaded.
--
--   mp.dist.init([{device_collectives = false, timeout = 1800}]) -> rank, size
--     timeout: seconds a collective waits for every rank to arrive (math.huge: no limit)
--   mp.dist.timeout() -> that timeout
--   mp.dist.rank()  mp.dist.size()  mp.dist.local_rank()  mp.dist.local_size()
--   mp.dist.backend() -> "Open MPI v4.1.4" (what carries the collectives)
--   mp.dist.all_reduce(t [, "sum"|"mean"|"max"|"min"]) -> t (in place)
--   mp.dist.broadcast(t [, root = 0]) -> t (in place)
--   mp.dist.all_gather(t) -> {size, t's shape...}: rank r's t at index r + 1
--   mp.dist.barrier()  mp.dist.finalize()
--   local _ <close> = mp.dist.no_sync()   -- gradients stay local in this scope
--   mp.dist.rank_seed(seed) -> this rank's seed (dropout, augmentation)
--   mp.dist.save(path, tbl)               -- rank 0 writes; every rank waits
--
-- Collectives are called by every rank in the same order with the same shape
-- and dtype (checked, with the collective itself and its op or root: a
-- mismatch is an error on every rank naming both sides). A rank that
-- finalizes (or ends) while another waits gives it an error naming the rank;
-- a wait past the timeout is an error naming the ranks that did not come, and
-- the job then ends at exit (engine/dist_agree.h). CPU tensors go through
-- MPI, CUDA tensors through NCCL on the backend's stream.
-- Data parallel training: an optimizer made with {dist = true} (lua/mp/optim.lua).
local core = require "mp.core"
local D = core._dist

local M = {}
for k, v in pairs(D) do M[k] = v end

-- A rank's own seed from the run's seed, for what must differ between ranks
-- (dropout masks, augmentation); what must not (the data order, the initial
-- weights, which rank 0 broadcasts anyway) uses the run's seed itself. Rank 0
-- keeps the run's seed, so one process gives the same run as before.
function M.rank_seed(seed)
  if math.type(seed) ~= "integer" then
    error("mp.dist.rank_seed: seed must be an integer (got " .. (math.type(seed) or type(seed)) .. ")", 2)
  end
  return seed + D.rank() * 0x9E3779B97F4A7C15   -- the golden-ratio step: ranks' seeds far apart (wraps)
end

-- A checkpoint written once: rank 0 saves (to a temporary file, then renamed:
-- mp.save), and no rank goes on until it has, so any rank may load it next.
function M.save(path, tbl)
  local ok, err = true, nil
  if D.rank() == 0 then ok, err = pcall(core.save, path, tbl) end
  -- every rank learns whether rank 0 succeeded, and fails alike
  local flag = core.tensor({ok and 1 or 0}, {dtype = "i32", device = "cpu"})
  if D.is_initialized() then D.all_reduce(flag, "min") end
  local all_ok = flag:item() == 1
  flag:free()
  if not all_ok then
    error("mp.dist.save: " .. (err and tostring(err):gsub("^[^\n]-:%d+: ", "", 1):gsub("^mp.save: ", "") or
      "rank 0 could not write " .. tostring(path)), 2)
  end
end

return M
