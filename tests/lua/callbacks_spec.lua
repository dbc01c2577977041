-- callbacks_spec.lua: Lua code that runs in the middle of a C function of the
-- binding (a metamethod of an argument, a finalizer started by an allocation)
-- and frees a tensor that function already holds. The C function must go on
-- with the tensor it was given: the release waits until it returns (lua/lbind.c).
--
-- How a use after free would show without a sanitizer: right after the free,
-- the callback allocates a tensor of the same size filled with 777, which the
-- caching allocator hands the freed block; a C function still reading the old
-- pointer would read 777s.
local mp = require "mp"
local H = dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "helpers.lua")

local SENTINEL = 777

-- free t, then take its block back with sentinels (kept alive in `keep`)
local keep = {}
local function free_and_reuse(t)
  local shape = t.shape
  t:free()
  keep[#keep + 1] = mp.full(shape, SENTINEL)
end

local function no_sentinel(t, what)
  for _, v in ipairs(H.flat(t:totable())) do
    assert(v ~= SENTINEL and v == v, (what or "result") .. " read freed memory (" .. tostring(v) .. ")")
  end
end

local function values(t) return H.flat(t:totable()) end

-- a shape table whose __len frees `victim`
local function hostile_shape(victim, shape)
  return setmetatable({}, {
    __len = function() free_and_reuse(victim); return #shape end,
    __index = function(_, i) return shape[i] end,
  })
end

-- a list whose __index, when asked for its last entry, frees the first
local function hostile_list(list)
  return setmetatable({}, {
    __len = function() return #list end,
    __index = function(_, i)
      if i == #list and list[1].numel then pcall(free_and_reuse, list[1]) end
      return list[i]
    end,
  })
end

-- an option table whose every lookup frees `victim` first
local function hostile_options(victim, opts)
  return setmetatable({}, {__index = function(_, k) pcall(free_and_reuse, victim); return opts[k] end})
end

describe("a tensor freed by Lua code running inside a C function", function()
  after_each(function() keep = {}; collectgarbage() end)

  it("shape tables: reshape and view go on with the tensor they were given", function()
    for _, op in ipairs{"reshape", "view"} do
      local t = mp.arange(12)
      local want = values(t)
      local r = t[op](t, hostile_shape(t, {3, 4}))
      assert.are.same({3, 4}, r.shape)
      assert.are.same(want, values(r))
      assert.has_error(function() return t:numel() end)   -- the userdata itself is freed
    end
  end)

  it("tensor lists: cat, the optimizers and clip_grad_norm", function()
    local a, b = mp.full({2, 3}, 1), mp.full({2, 3}, 2)
    local c = mp.cat(hostile_list{a, b}, 1)
    assert.are.same({1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2}, values(c))

    for _, kind in ipairs{"sgd", "adam", "adamw"} do
      local p1 = mp.full({4}, 1):requires_grad(true)
      local p2 = mp.full({4}, 2):requires_grad(true)
      p1.grad, p2.grad = mp.full({4}, 0.5), mp.full({4}, 0.5)
      local opt = require("mp.core")._optimizer(kind, hostile_list{p1, p2}, {lr = 0.1})
      opt:step()
      opt:free()
      no_sentinel(p2, kind)
    end

    local p1 = mp.full({4}, 3):requires_grad(true)
    local p2 = mp.full({4}, 4):requires_grad(true)
    p1.grad, p2.grad = mp.full({4}, 3), mp.full({4}, 4)
    local norm = mp.optim.clip_grad_norm(hostile_list{p1, p2}, 1e9)
    assert.is_true(math.abs(norm - 10) < 1e-5)
  end)

  it("a gradient replaced by a list's __index while clip_grad_norm reads the list", function()
    local p1 = mp.zeros{4}:requires_grad(true)
    local p2 = mp.zeros{4}:requires_grad(true)
    p1.grad, p2.grad = mp.full({4}, 3), mp.full({4}, 4)
    local list = setmetatable({}, {
      __len = function() return 2 end,
      __index = function(_, i)
        if i == 2 then p1.grad = nil; keep[#keep + 1] = mp.full({4}, SENTINEL) end
        return i == 1 and p1 or p2
      end,
    })
    local norm = mp.optim.clip_grad_norm(list, 1e9)
    assert.is_true(norm == norm and norm < 100, "norm " .. tostring(norm))
  end)

  it("option tables: gelu, cross_entropy", function()
    local x = mp.tensor{-1, 0, 1, 2}
    local want = values(mp.gelu(x, {approximate = "tanh"}))
    assert.are.same(want, values(mp.gelu(x, hostile_options(x, {approximate = "tanh"}))))

    local logits, target = mp.tensor{{1, 2, 3}, {3, 2, 1}}, mp.tensor({2, 0}, {dtype = "i32"})
    local ce = mp.cross_entropy(logits, target):item()
    assert.are.equal(ce, mp.cross_entropy(logits, target, hostile_options(logits, {reduction = "mean"})):item())
  end)

  it("finalizers: an allocation inside an op runs a __gc that frees the op's argument", function()
    collectgarbage("incremental", 0, 1000)   -- collect at nearly every allocation
    local ok, err = pcall(function()
      for i = 1, 300 do
        local x = mp.full({64}, i)
        setmetatable({}, {__gc = function() if x.numel then pcall(free_and_reuse, x) end end})
        local ok2, y = pcall(mp.relu, x)   -- x may be freed before relu starts: that is an error, not a crash
        if ok2 then
          for _, v in ipairs(values(y)) do assert(v == i, "relu read freed memory: " .. v) end
        end
        keep = {}
      end
    end)
    collectgarbage("incremental", 200, 100)
    collectgarbage("generational"); collectgarbage("incremental")
    assert(ok, err)
  end)

  it("a <close> scope and a coroutine inside a callback defer the release the same way", function()
    local t = mp.arange(6)
    local want = values(t)
    local shape = setmetatable({}, {
      __len = function()
        do local c <close> = t end
        keep[#keep + 1] = mp.full({6}, SENTINEL)
        return 2
      end,
      __index = function(_, i) return ({2, 3})[i] end,
    })
    assert.are.same(want, values(t:reshape(shape)))

    local u = mp.arange(6)
    local shape2 = setmetatable({}, {
      __len = function() coroutine.wrap(function() free_and_reuse(u) end)(); return 2 end,
      __index = function(_, i) return ({3, 2})[i] end,
    })
    assert.are.same(want, values(u:reshape(shape2)))
  end)

  it("the deferred releases happen: memory in use returns to where it was", function()
    collectgarbage()
    local before = mp.memory().in_use
    for _ = 1, 20 do
      local t = mp.zeros{1024}
      local r = t:reshape(setmetatable({}, {__len = function() t:free(); return 1 end,
                                            __index = function() return 1024 end}))
      r:free()
    end
    collectgarbage()
    assert.are.equal(before, mp.memory().in_use)
  end)
end)

-- a table whose # is whatever __len says
local function len_is(n, value)
  return setmetatable({}, {__len = function() return n end, __index = function() return value end})
end

describe("lengths that come from Lua", function()
  local bad = {-1, -(2 ^ 31), 2 ^ 31 + 1, 2 ^ 62, 2.5, 0 / 0, "3", {}}
  local function each_bad(fn, list)
    for _, n in ipairs(list or bad) do
      local ok, err = pcall(fn, n)
      assert(not ok, "length " .. tostring(n) .. " accepted")
      assert(type(err) == "string", "length " .. tostring(n) .. ": error is not a message")
      assert(err:find("mp%.") or err:find("Tensor:") or err:find("GradScaler"),
             "length " .. tostring(n) .. ": error names no function: " .. err)
    end
  end

  it("shapes, lists and nested data reject negative, huge and non-integer lengths by name", function()
    local t = mp.zeros{4}
    each_bad(function(n) return t:reshape(len_is(n, 2)) end)
    each_bad(function(n) return mp.zeros(len_is(n, 2)) end)
    each_bad(function(n) return mp.cat(len_is(n, t), 1) end)
    -- 2^31 + 1 values are no lie to mp.tensor where memory holds them (a GPU
    -- machine's 128 GB: it then reads them all from __index, for minutes): past
    -- the cpu memory limit instead, staged as doubles
    local over = {}
    for i, n in ipairs(bad) do over[i] = n == 2 ^ 31 + 1 and mp.memory("cpu").limit // 8 + 1 or n end
    each_bad(function(n) return mp.tensor(len_is(n, 1)) end, over)
    each_bad(function(n) return mp.optim.clip_grad_norm(len_is(n, t), 1) end)
  end)

  it("a scaler state whose amax history has a lying length is rejected, the scaler untouched", function()
    local s = mp.amp.GradScaler{policy = mp.amp.policy.amax{history = 4}}
    local before = s:state_dict()
    for _, n in ipairs(bad) do
      local sd = s:state_dict()
      sd.amax_history = len_is(n, 1)
      local ok, err = pcall(s.load_state_dict, s, sd)
      assert(not ok, "amax_history of length " .. tostring(n) .. " accepted")
      assert(err:find("amax_history"), err)
    end
    for _, v in ipairs{-1, 0 / 0, 1 / 0, "x"} do
      local sd = s:state_dict()
      sd.amax_history = {1, v}
      assert.has_error(function() s:load_state_dict(sd) end)
    end
    assert.are.same(before, s:state_dict())
  end)
end)
