-- mp.help: the REPL's help, read from docs/API.md, the same text as the API
-- reference, so the two never disagree.
--   help()                  how to use it, and the areas of the reference
--   help(mp.matmul)         a function, module table or class: its entry
--   help "t:reshape"        a documented name (also "reshape", "nn.Linear")
--   help "Autograd"         an area: the signatures under it
--   ?mp.matmul              the same, typed at the mpengine prompt (repl.c)
-- An entry is a `### ` heading of backticked signatures and its first
-- paragraph; a signature's name is its text before the first "(", " ", "["
-- or "{". Values map back to names by walking `mp` (and the tensor methods,
-- as t:name) once; mp.pretty and the REPL print functions by the same map.
local M = {}

local DOCS_ENV = "MPENGINE_DOCS"   -- a path to API.md, or to its folder

-- ------------------------------------------------------------ finding the docs

local function readable(path)
  local f = io.open(path, "rb")
  if not f then return false end
  local ok = f:read(1) ~= nil   -- nil for an empty file or a folder
  f:close()
  return ok
end

-- the folder this file was loaded from (build tree: <repo>/lua/mp; installed:
-- <prefix>/share/lua/5.4/mp)
local function here()
  local src = debug.getinfo(1, "S").source
  return src:match("^@(.*)/[^/]*$") or (src:match("^@") and ".") or nil
end

-- where API.md is looked for, in order
function M.candidates()
  local list = {}
  local env = os.getenv(DOCS_ENV)
  if env and env ~= "" then
    list[#list + 1] = env
    list[#list + 1] = env .. "/API.md"
  end
  local dir = here()
  if dir then
    list[#list + 1] = dir .. "/../../docs/API.md"            -- build tree
    list[#list + 1] = dir .. "/../../../mpengine/API.md"     -- <prefix>/share/mpengine
  end
  return list
end

-- "a/lua/mp/../../docs/API.md" as "a/docs/API.md", for the messages
local function tidy(path)
  local out, abs = {}, path:sub(1, 1) == "/"
  for seg in path:gmatch("[^/]+") do
    if seg == ".." and #out > 0 and out[#out] ~= ".." then out[#out] = nil
    elseif seg ~= "." then out[#out + 1] = seg end
  end
  return (abs and "/" or "") .. table.concat(out, "/")
end

function M.docs_path()
  for _, p in ipairs(M.candidates()) do
    if readable(p) then return tidy(p) end
  end
  return nil
end

-- ------------------------------------------------------------------ parsing

-- a signature's name: its text before the first "(", " ", "[" or "{"
local function sig_name(sig)
  return sig:match("^[^%(%s%[{]+")
end

-- parses API.md's text into {areas = {{title, entries}}, entries = {...},
-- by_name = {name -> {entry...}}}; an entry is {area, sigs, names, para, more}
function M.parse(text)
  local db = {areas = {}, entries = {}, by_name = {}}
  local area, entry, target, state = nil, nil, nil, nil
  -- target: the entry (or area) whose first paragraph is being read;
  -- state: "before" it, "in" it, "after" it
  local fence = false
  for line in (text:gsub("\r\n", "\n") .. "\n"):gmatch("(.-)\n") do
    local is_fence = line:match("^%s*```") ~= nil
    if not fence and line:match("^## ") then
      area = {title = line:sub(4):gsub("%s+$", ""), entries = {}, para = {}}
      db.areas[#db.areas + 1] = area
      entry, target, state = nil, area, "before"
    elseif not fence and line:match("^### ") then
      entry = {area = area and area.title, sigs = {}, names = {}, para = {}, more = false}
      for sig in line:gmatch("`([^`]+)`") do
        local name = sig_name(sig)
        entry.sigs[#entry.sigs + 1] = sig
        if name then
          entry.names[#entry.names + 1] = name
          local list = db.by_name[name]
          if not list then list = {}; db.by_name[name] = list end
          list[#list + 1] = entry
        end
      end
      if #entry.sigs == 0 then entry.sigs[1] = line:sub(5) end
      db.entries[#db.entries + 1] = entry
      if area then area.entries[#area.entries + 1] = entry end
      target, state = entry, "before"
    elseif not fence and line:match("^# ") then
      entry, target = nil, nil
    elseif target then
      local blank = line:match("^%s*$") ~= nil
      if state == "before" then
        if is_fence then state = "after"; target.more = true
        elseif not blank then state = "in"; target.para[#target.para + 1] = line end
      elseif state == "in" then
        if blank or is_fence then state = "after"
        else target.para[#target.para + 1] = line end
        if is_fence then target.more = true end
      elseif not blank then
        target.more = true
      end
    end
    if is_fence then fence = not fence end
  end
  return db
end

local db_cache, db_path, db_override
-- the parsed reference, or nil and why not
function M.db()
  if db_cache then return db_cache, db_path end
  local path = db_override or M.docs_path()
  if not path then
    return nil, "mp.help: docs/API.md not found (looked in " .. table.concat(M.candidates(), ", ") ..
      "; set " .. DOCS_ENV .. " to its path)"
  end
  local f = assert(io.open(path, "rb"))
  local text = f:read("a")
  f:close()
  db_cache, db_path = M.parse(text), path
  return db_cache, db_path
end

-- forgets the parsed reference; with a path, reads that file from now on
-- (tests use their own reference)
function M.reset(path) db_cache, db_path, db_override = nil, nil, path end

-- ------------------------------------------------- values back to their names

local names_cache   -- value -> list of paths, shortest first

local function is_ident(k) return type(k) == "string" and k:match("^[%a_][%w_]*$") ~= nil end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do if is_ident(k) then keys[#keys + 1] = k end end
  table.sort(keys)
  return keys
end

-- objects whose methods the reference writes as <prefix>:name, by their
-- metatable's __name
local OBJECTS = {
  ["mp.Tensor"] = {prefix = "t", what = "a tensor"},
  ["mp.Optimizer"] = {prefix = "opt", what = "an optimizer"},
  ["mp.amp.GradScaler"] = {prefix = "scaler", what = "a loss scaler"},
}

-- the methods table behind a registry metatable's __index (a table, or a C
-- __index closed over one)
local function methods_of(mt)
  local index = type(mt) == "table" and rawget(mt, "__index")
  if type(index) == "table" then return index end
  if type(index) == "function" then
    local _, up = debug.getupvalue(index, 1)
    if type(up) == "table" then return up end
  end
  return nil
end

local function tensor_methods() return methods_of(debug.getregistry()["mp.Tensor"]) end

-- Lua's base functions (not the user's globals: they come and go)
local BASE = {"assert", "collectgarbage", "dofile", "error", "getmetatable", "ipairs", "load",
  "loadfile", "next", "pairs", "pcall", "print", "rawequal", "rawget", "rawlen", "rawset",
  "require", "select", "setmetatable", "tonumber", "tostring", "type", "warn", "xpcall"}

local function build_names()
  local names = {}
  local function add(v, path)
    local list = names[v]
    if not list then list = {}; names[v] = list end
    list[#list + 1] = path
  end
  local ok, mp = pcall(require, "mp")
  local queue, seen = {}, {}
  if ok and type(mp) == "table" then queue[1] = {mp, "mp", 0} end
  -- the tensor methods (also mp.Tensor) are named t:name, as the reference does
  local meth = tensor_methods()
  if meth then
    seen[meth] = true
    for _, k in ipairs(sorted_keys(meth)) do
      if type(meth[k]) == "function" then add(meth[k], "t:" .. k) end
    end
    if ok and type(mp) == "table" and rawget(mp, "Tensor") == meth then add(meth, "mp.Tensor") end
  end
  -- breadth first: the shortest path to a value comes first
  local head = 1
  while queue[head] do
    local t, path, depth = table.unpack(queue[head])
    head = head + 1
    if not seen[t] then
      seen[t] = true
      add(t, path)
      for _, k in ipairs(sorted_keys(t)) do
        local v = rawget(t, k)
        if type(v) == "function" then add(v, path .. "." .. k)
        elseif type(v) == "table" and depth < 4 and not seen[v] then
          queue[#queue + 1] = {v, path .. "." .. k, depth + 1}
        end
      end
    end
  end
  -- an optimizer's methods as opt:name (a userdata: its metatable is in the registry)
  local ometh = methods_of(debug.getregistry()["mp.Optimizer"])
  if ometh then
    for _, k in ipairs(sorted_keys(ometh)) do
      if type(ometh[k]) == "function" and k:sub(1, 1) ~= "_" then add(ometh[k], "opt:" .. k) end
    end
  end
  -- Lua's own functions, so that `print` prints as function: print
  for _, lib in ipairs{"string", "table", "math", "io", "os", "coroutine", "utf8", "debug"} do
    local t = _G[lib]
    if type(t) == "table" then
      for _, k in ipairs(sorted_keys(t)) do
        if type(t[k]) == "function" and not names[t[k]] then add(t[k], lib .. "." .. k) end
      end
    end
  end
  for _, k in ipairs(BASE) do
    local v = rawget(_G, k)
    if type(v) == "function" and not names[v] then add(v, k) end
  end
  return names
end

local function paths_of(v)
  if not names_cache then names_cache = build_names() end
  return names_cache[v]
end

-- a documented name for a name: t:x and Tensor:x are the same method
local function documented(db, name)
  if db.by_name[name] then return name end
  local obj, meth = name:match("^(%w+):([%w_]+)$")
  if obj == "t" and db.by_name["Tensor:" .. meth] then return "Tensor:" .. meth end
  if obj == "Tensor" and db.by_name["t:" .. meth] then return "t:" .. meth end
  return nil
end

-- the name v is known by (documented names first), or nil
function M.name_of(v)
  local paths = paths_of(v)
  if not paths then return nil end
  local db = M.db()
  if db then
    for _, p in ipairs(paths) do
      if documented(db, p) then return p end
    end
  end
  return paths[1]
end

-- ----------------------------------------------------------------- rendering

local function render_entry(e, out)
  for _, s in ipairs(e.sigs) do out[#out + 1] = s end
  for _, l in ipairs(e.para) do out[#out + 1] = "  " .. l:gsub("^%s+", "") end
  if e.more then
    out[#out + 1] = ("  (more in docs/API.md, under %q)"):format(e.area or "")
  end
end

local function render_entries(list)
  local out, seen = {}, {}
  for _, e in ipairs(list) do
    if not seen[e] then
      seen[e] = true
      if #out > 0 then out[#out + 1] = "" end
      render_entry(e, out)
    end
  end
  return table.concat(out, "\n")
end

local function render_list(title, list)
  local out = {title}
  for _, e in ipairs(list) do out[#out + 1] = "  " .. table.concat(e.sigs, ", ") end
  return table.concat(out, "\n")
end

local function usage(db, path)
  local out = {
    "help(f) or ?name prints a name's signatures and description from the API reference:",
    "  help(mp.matmul)    help(mp.nn)    help \"t:reshape\"    ?mp.optim.AdamW    ?t:max",
    "help \"<area>\" lists an area's entries. The areas:",
  }
  for _, a in ipairs(db.areas) do
    out[#out + 1] = ("  %-28s %d %s"):format(a.title, #a.entries, #a.entries == 1 and "entry" or "entries")
  end
  out[#out + 1] = "The whole reference: " .. path
  return table.concat(out, "\n")
end

local function not_found(what)
  return ("no entry for '%s'; try help() for the areas"):format(what)
end

-- entries for a typed name, trying the spellings a user reaches for
local function lookup(db, s)
  -- "mp.zeros({2})" and "t:max()" as their names
  local name = s:gsub("^%s+", ""):gsub("%s+$", ""):gsub("%b()$", "")
  local function try(n)
    local d = documented(db, n)
    return d and db.by_name[d]
  end
  local hit = try(name)
  if hit then return hit end
  local obj, sep, last = name:match("^(.-)([%.:]?)([%a_][%w_]*)$")
  if not last then return nil end
  if sep == ":" or (sep == "." and obj ~= "" and not obj:match("^mp")) then
    -- x:max, t.max: a tensor method (or mp.nn.Linear for nn.Linear)
    hit = try("t:" .. last) or try("mp." .. name)
    if hit then return hit end
  elseif sep == "" then
    hit = try("mp." .. last) or try("t:" .. last)
    if hit then return hit end
  end
  -- last resort: every entry named <anything>.last or <anything>:last
  local list = {}
  if sep == "" then
    for n, entries in pairs(db.by_name) do
      if n:match("[%.:]" .. last .. "$") then
        for _, e in ipairs(entries) do list[#list + 1] = e end
      end
    end
  end
  table.sort(list, function(a, b) return a.sigs[1] < b.sigs[1] end)
  return #list > 0 and list or nil
end

local function area_of(db, s)
  local want = s:lower():gsub("^%s+", ""):gsub("%s+$", "")
  for _, a in ipairs(db.areas) do
    if a.title:lower() == want then return a end
  end
end

-- entries whose names start with prefix .. "." (a module's documented names)
local function under(db, prefix)
  local list, seen = {}, {}
  for _, e in ipairs(db.entries) do
    for _, n in ipairs(e.names) do
      if not seen[e] and n:sub(1, #prefix + 1) == prefix .. "." then
        seen[e] = true
        list[#list + 1] = e
      end
    end
  end
  return list
end

local function text_for_name(db, s)
  local hit = lookup(db, s)
  if hit then return render_entries(hit) end
  local a = area_of(db, s)
  if a then
    local text = render_list(a.title .. ":", a.entries)
    if #a.para > 0 then
      local out = {}
      for _, l in ipairs(a.para) do out[#out + 1] = "  " .. l:gsub("^%s+", "") end
      text = text .. "\n" .. table.concat(out, "\n")
    end
    return text
  end
  if s == "t" or s == "Tensor" or s == "mp.Tensor" then
    local list = {}
    for _, e in ipairs(db.entries) do
      for _, n in ipairs(e.names) do
        if n:match("^t:") or n:match("^Tensor:") then list[#list + 1] = e; break end
      end
    end
    return render_list("tensor methods (t:name):", list)
  end
  local mod = s:match("^mp") and s or "mp." .. s
  local list = under(db, mod)
  if #list > 0 then return render_list(mod .. ":", list) end
  return nil
end

-- a method found in a class table (mp.nn.Module.forward): its <obj>:name entries
local function method_entries(db, path)
  local last = path:match("%.%u[%w_]*%.([%a_][%w_]*)$")
  if not last then return nil end
  local list = {}
  for n, entries in pairs(db.by_name) do
    local obj = n:match("^(%w+):" .. last .. "$")
    if obj and obj ~= "t" and obj ~= "Tensor" then
      for _, e in ipairs(entries) do list[#list + 1] = e end
    end
  end
  table.sort(list, function(a, b) return a.sigs[1] < b.sigs[1] end)
  return #list > 0 and list or nil
end

local function text_for_value(db, v)
  local paths = paths_of(v)
  if not paths and type(v) == "table" then
    -- an instance (an nn module, an optimizer): its class
    local mt = getmetatable(v)
    if type(mt) == "table" then
      local index = rawget(mt, "__index")
      paths = paths_of(mt) or (type(index) == "table" and paths_of(index)) or nil
    end
  end
  if not paths then
    local mt = getmetatable(v)
    local obj = type(mt) == "table" and type(rawget(mt, "__name")) == "string" and OBJECTS[rawget(mt, "__name")]
    if obj then
      -- an object of mp: the entries of its methods
      local list = {}
      for _, e in ipairs(db.entries) do
        for _, n in ipairs(e.names) do
          if n:sub(1, #obj.prefix + 1) == obj.prefix .. ":" then list[#list + 1] = e; break end
        end
      end
      local title = ("%s (%s): its methods are written %s:name (?%s:name)"):format(obj.what, rawget(mt, "__name"),
        obj.prefix, obj.prefix)
      if obj.prefix == "t" then title = title:gsub("%)", " " .. (tostring(v):match("(%[[^%]\n]*%])%s*$") or "") .. ")", 1) end
      return #list > 0 and render_list(title, list) or title
    end
    local where = ""
    if type(v) == "function" then
      local info = debug.getinfo(v, "S")
      if info.what ~= "C" then where = (" (defined at %s:%d)"):format(info.short_src, info.linedefined) end
    end
    return ("no entry for this %s%s: it is not part of mp; try help() for the areas"):format(type(v), where)
  end
  for _, p in ipairs(paths) do
    local d = documented(db, p)
    if d then return render_entries(db.by_name[d]) end
  end
  for _, p in ipairs(paths) do
    local list = method_entries(db, p)
    if list then return render_entries(list) end
  end
  for _, p in ipairs(paths) do
    local text = text_for_name(db, p)
    if text then return text end
  end
  if paths[1]:match("^mp") then return not_found(paths[1]) end
  return ("'%s' is Lua's own; see the Lua 5.4 manual"):format(paths[1])
end

-- the text help(...) prints
function M.text(...)
  local db, path = M.db()
  if not db then return path end
  if select("#", ...) == 0 then return usage(db, path) end
  local v = ...
  if v == package.loaded["mp"] then return usage(db, path) end
  if v == nil then
    return "help: the value is nil (a misspelt name?); try help() for the areas"
  end
  if type(v) == "string" then
    if v:match("^%s*$") then return usage(db, path) end
    return text_for_name(db, v) or not_found((v:gsub("^%s+", ""):gsub("%s+$", "")))
  end
  return text_for_value(db, v)
end

-- help(x): prints M.text(x); returns nothing, so the REPL prints nothing more
function M.help(...)
  io.stdout:write(M.text(...), "\n")
  io.stdout:flush()
end

return M
