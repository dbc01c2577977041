-- mp.nn's containers: Sequential (a chain of modules) and ModuleList (modules
-- held in order, without a forward).
local common = require "mp.nn.common"
common.own_file()

local raise, show = common.raise, common.show
local M = require "mp.nn.module"
local Module, is_module = M.Module, M.is_module

local containers = {}

-- Sequential(m1, m2, ...): children "0", "1", ...; forward feeds each output to the next.
-- #seq is the number of children; seq:get(i) is the i-th (1-based, as Lua lists are).
local Sequential = Module:extend("Sequential")
containers.Sequential = Sequential
Sequential.__len = function(self) return #rawget(self, "_module_names") end

function Sequential:init(...)
  local n = select("#", ...)
  for i = 1, n do
    local m = select(i, ...)
    if not is_module(m) then
      raise(string.format("mp.nn.Sequential: argument %d must be a module (got %s)", i, show(m)))
    end
    self:add_module(tostring(i - 1), m)
  end
end

-- seq:add(m) (alias append): m becomes the next child; returns seq
function Sequential:add(m)
  if not is_module(m) then
    raise("mp.nn.Sequential:add: expected a module (got " .. show(m) .. ")")
  end
  self:add_module(tostring(#self), m)
  return self
end
Sequential.append = Sequential.add

function Sequential:get(i)
  local n = #self
  if math.type(i) ~= "integer" or i < 1 or i > n then
    raise(string.format("mp.nn.Sequential:get: index must be an integer in 1..%d (got %s)", n, show(i)))
  end
  return rawget(self, "_modules")[rawget(self, "_module_names")[i]]
end

function Sequential:forward(x, ...)
  local mods = rawget(self, "_modules")
  local names = rawget(self, "_module_names")
  if #names == 0 then return x end
  x = mods[names[1]](x, ...)
  for i = 2, #names do x = mods[names[i]](x) end
  return x
end

-- ModuleList({m1, m2, ...}): modules held in order as children "0", "1", ...
-- (PyTorch's names, so state dicts match) with no forward of their own: ml[i]
-- (1-based, nil past the end, so ipairs(ml) walks them), #ml, ml:append(m),
-- ml:extend{...}. Their parameters are the list's.
local ModuleList = Module:extend("ModuleList")
containers.ModuleList = ModuleList
ModuleList.__len = Sequential.__len
local module_index = ModuleList.__index
ModuleList.__index = function(self, k)
  if math.type(k) == "integer" then
    local name = rawget(self, "_module_names")[k]
    return name and rawget(self, "_modules")[name] or nil
  end
  return module_index(self, k)
end

function ModuleList:init(mods)
  if mods == nil then return end
  if type(mods) ~= "table" or is_module(mods) then
    raise("mp.nn.ModuleList: expected a list of modules (got " .. show(mods) .. ")")
  end
  self:extend(mods)
end

function ModuleList:append(m)
  if not is_module(m) then
    raise("mp.nn.ModuleList:append: expected a module (got " .. show(m) .. ")")
  end
  self:add_module(tostring(#self), m)
  return self
end

function ModuleList:extend(mods)
  if type(mods) ~= "table" or is_module(mods) then
    raise("mp.nn.ModuleList:extend: expected a list of modules (got " .. show(mods) .. ")")
  end
  for i, m in ipairs(mods) do
    if not is_module(m) then
      raise(string.format("mp.nn.ModuleList: entry %d must be a module (got %s)", i, show(m)))
    end
    self:add_module(tostring(#self), m)
  end
  return self
end

function ModuleList:forward()
  raise("mp.nn.ModuleList: a list has no forward; call its modules (for _, m in ipairs(list) do x = m(x) end)")
end

return containers
