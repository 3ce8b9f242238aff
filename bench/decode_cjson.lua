--- Decoding without sandkit, as a Lua program would do it by hand: lines split from 16 KiB
-- reads, each parsed by lua-cjson, the payload decoded by a base64 decoder in plain Lua.
--   lua5.4 bench/decode_cjson.lua CORPUS
-- Prints RESULT as bench/decode_sandkit.lua does.
--
-- The decoder is a fair one, not a strawman: a lookup table, twelve symbols per string.byte
-- call and nine bytes per string.char call, one table.concat per payload. Like most hand-written
-- decoders it checks less than sandkit does (a symbol outside the alphabet raises rather than
-- being reported at its offset).

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local cjson = require "cjson"
local common = require "common"
local decode_loop = require "decode_loop"

local byte, char, concat, find, sub = string.byte, string.char, table.concat, string.find, string.sub

local value = {}
do
  local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  for i = 1, 64 do value[byte(alphabet, i)] = i - 1 end
end

-- The decoder with Lua 5.3+'s integer operators, as a Lua 5.4 program would write it. It is
-- kept as text so that this file also loads under LuaJIT, which has no such operators and gets
-- the same decoder on its `bit` library below.
local B64_54 = [=[
local value, byte, char, concat = ...
return function(s)
  local n = #s
  if n == 0 then return "" end
  assert(n % 4 == 0, "base64 length is not a multiple of 4")
  local out, k = {}, 0
  local last = n - 3 -- the final group may carry padding: it is decoded on its own
  local i = 1
  while i + 11 < last do
    local a, b, c, d, e, f, g, h, p, q, r, t = byte(s, i, i + 11)
    local x = (value[a] << 18) | (value[b] << 12) | (value[c] << 6) | value[d]
    local y = (value[e] << 18) | (value[f] << 12) | (value[g] << 6) | value[h]
    local z = (value[p] << 18) | (value[q] << 12) | (value[r] << 6) | value[t]
    k = k + 1
    out[k] = char(x >> 16, (x >> 8) & 255, x & 255, y >> 16, (y >> 8) & 255, y & 255,
      z >> 16, (z >> 8) & 255, z & 255)
    i = i + 12
  end
  while i < last do
    local a, b, c, d = byte(s, i, i + 3)
    local x = (value[a] << 18) | (value[b] << 12) | (value[c] << 6) | value[d]
    k = k + 1
    out[k] = char(x >> 16, (x >> 8) & 255, x & 255)
    i = i + 4
  end
  local a, b, c, d = byte(s, i, i + 3)
  if d ~= 61 then
    local x = (value[a] << 18) | (value[b] << 12) | (value[c] << 6) | value[d]
    out[k + 1] = char(x >> 16, (x >> 8) & 255, x & 255)
  elseif c ~= 61 then
    local x = (value[a] << 18) | (value[b] << 12) | (value[c] << 6)
    out[k + 1] = char(x >> 16, (x >> 8) & 255)
  else
    out[k + 1] = char(((value[a] << 18) | (value[b] << 12)) >> 16)
  end
  return concat(out)
end
]=]

local b64decode
if rawget(_G, "jit") then
  local bit = require "bit"
  local lshift, rshift, band, bor = bit.lshift, bit.rshift, bit.band, bit.bor
  local function quad(a, b, c, d)
    return bor(lshift(value[a], 18), lshift(value[b], 12), lshift(value[c], 6), value[d])
  end
  b64decode = function(s)
    local n = #s
    if n == 0 then return "" end
    assert(n % 4 == 0, "base64 length is not a multiple of 4")
    local out, k = {}, 0
    local last = n - 3
    local i = 1
    while i < last do
      local x = quad(byte(s, i, i + 3))
      k = k + 1
      out[k] = char(rshift(x, 16), band(rshift(x, 8), 255), band(x, 255))
      i = i + 4
    end
    local a, b, c, d = byte(s, i, i + 3)
    if d ~= 61 then
      local x = quad(a, b, c, d)
      out[k + 1] = char(rshift(x, 16), band(rshift(x, 8), 255), band(x, 255))
    elseif c ~= 61 then
      local x = bor(lshift(value[a], 18), lshift(value[b], 12), lshift(value[c], 6))
      out[k + 1] = char(rshift(x, 16), band(rshift(x, 8), 255))
    else
      out[k + 1] = char(rshift(bor(lshift(value[a], 18), lshift(value[b], 12)), 16))
    end
    return concat(out)
  end
else
  b64decode = assert(load(B64_54))(value, byte, char, concat)
end

local function one_pass(chunks)
  local frames, bytes, check = 0, 0, 0
  local pending = ""
  for _, chunk in ipairs(chunks) do
    local buf = pending == "" and chunk or pending .. chunk
    local start = 1
    while true do
      local nl = find(buf, "\n", start, true)
      if not nl then break end
      local frame = cjson.decode(sub(buf, start, nl - 1))
      start = nl + 1
      frames = frames + 1
      local t = frame.t
      if t == "stdout" or t == "stderr" then
        -- lua-cjson reads every number as a float under Lua 5.4.
        frame.seq = math.tointeger and math.tointeger(frame.seq) or frame.seq
        local data = b64decode(frame.data)
        bytes = bytes + #data
        check = check + byte(data, 1) + byte(data, -1)
      end
    end
    pending = sub(buf, start)
  end
  return frames, bytes, check
end

common.result(decode_loop.run(arg[1], one_pass))
