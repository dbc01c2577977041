-- The FP8 autocast regions open now (a stack; mp.fp8.autocast pushes, its guard
-- pops), read by nn.Linear:forward through package.loaded (before the first
-- region this file is not loaded, and no region is open): top() is nil outside
-- every region, or
-- {holder =, dtype =} inside one ({off = true} inside mp.fp8.autocast(false)).
local active = {stack = {}}

function active.top()
  local s = active.stack
  local t = s[#s]
  if t == nil or t.off then return nil end
  return t
end

return active
