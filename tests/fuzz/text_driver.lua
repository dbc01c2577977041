-- text_driver.lua: the mp.data.text fuzzer's checks (tests/fuzz/fuzz_lua.c,
-- FUZZ_TEXT). Returns a function of (path, bytes): the bytes are the file at
-- path. It reads the file with mp.data.text, under a max_bytes the last byte
-- picks (sometimes just below the size), then encodes, decodes and cuts
-- windows from the result. An error is an answer when it is one the input
-- earns (a text under 2 bytes, a file over max_bytes, a byte outside the
-- vocabulary); the function returns a string naming a broken promise (wrong
-- vocabulary, ids that do not decode to the file, windows that are not
-- windows), which the C side turns into a crash.
local mp = require "mp"

-- each row of y is its row of x moved on by one, and x's row then y's last id
-- is a stretch of the text
local function windows_ok(x, y, ctx, d, s)
  local xs, ys = x:totable(), y:totable()
  for r = 1, #xs do
    for j = 1, ctx - 1 do
      if xs[r][j + 1] ~= ys[r][j] then return false end
    end
    if not s:find(d.decode(xs[r]) .. d.decode({ ys[r][ctx] }), 1, true) then return false end
  end
  return true
end

return function(path, s)
  local n = #s
  local last = n > 0 and s:byte(n) or 0
  local max_bytes = (last % 4 == 0 and n > 1) and n - 1 or 1 << 20
  local ok, d = pcall(mp.data.text, path, { max_bytes = max_bytes })
  if not ok then
    d = tostring(d)
    if n > max_bytes then
      return d:find("more than max_bytes", 1, true) == nil and ("over max_bytes, but: " .. d) or nil
    end
    if n < 2 then return d:find("the text has", 1, true) == nil and ("a short text, but: " .. d) or nil end
    return "a text of " .. n .. " bytes refused: " .. d
  end
  if n > max_bytes or n < 2 then return "read " .. n .. " bytes with max_bytes " .. max_bytes end
  if d.bytes ~= n then return "bytes " .. tostring(d.bytes) .. " for a file of " .. n end

  -- the vocabulary: the distinct bytes, in increasing order
  local seen = {}
  for i = 1, n do seen[s:byte(i)] = true end
  local k = 0
  for b = 0, 255 do
    if seen[b] then
      k = k + 1
      if d.vocab[k] ~= b then return "vocab[" .. k .. "] is " .. tostring(d.vocab[k]) .. ", expected " .. b end
    end
  end
  if #d.vocab ~= k or d.vocab_size ~= k then return "vocab size " .. #d.vocab .. ", expected " .. k end

  -- the splits decode to the file; encode is the inverse of decode
  if d.decode(d.train) .. d.decode(d.val) ~= s then return "train .. val does not decode to the file" end
  if d.val:numel() ~= math.max(1, n // 10) then return "val has " .. d.val:numel() .. " ids" end
  local e = d.encode(s)
  if d.decode(e) ~= s then return "decode(encode(s)) ~= s" end
  e:free()
  local ok2, err = pcall(d.encode, s:sub(1, 1) .. "\0\255")
  if ok2 ~= (seen[0] and seen[255] or false) then return "encode of bytes " .. (ok2 and "outside" or "inside") ..
    " the vocabulary: " .. tostring(err) end

  -- windows: y is x moved on by one
  local ctx, batch = 1 + s:byte(1) % 16, 1 + s:byte(2) % 8
  local ntrain = d.train:numel()
  local ok3, x, y = pcall(mp.data.windows, d.train, batch, ctx, "cpu")
  if ok3 ~= (ntrain >= ctx + 1) then return "windows of ctx " .. ctx .. " over " .. ntrain .. " ids: " .. tostring(x) end
  if ok3 then
    if x.shape[1] ~= batch or x.shape[2] ~= ctx or not windows_ok(x, y, ctx, d, s) then return "windows are not windows" end
    x:free(); y:free()
  end
  d.train:free(); d.val:free()
  return nil
end
