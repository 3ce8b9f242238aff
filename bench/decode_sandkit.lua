--- Decoding with sandkit: the corpus fed to core.decoder() in 16 KiB reads, every frame taken
-- out as a table with its payload as a Lua string.
--   lua5.4 bench/decode_sandkit.lua CORPUS
-- Prints RESULT { passes, best_seconds, frames, bytes, check } (per pass).

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"
local decode_loop = require "decode_loop"

local function one_pass(chunks)
  local frames, bytes, check = 0, 0, 0
  local d = core.decoder()
  for _, chunk in ipairs(chunks) do
    d:feed(chunk)
    while true do
      local frame, kind, detail = d:next()
      if not frame then
        if frame == nil then error("the corpus did not decode: " .. tostring(kind) .. ": " .. tostring(detail)) end
        break
      end
      frames, bytes, check = decode_loop.tally(frame, frames, bytes, check)
    end
  end
  d:close()
  return frames, bytes, check
end

common.result(decode_loop.run(arg[1], one_pass))
