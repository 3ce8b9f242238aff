--- The timing loop every Lua decoder in the suite shares (bench/peers/decode.py and decode.js
-- follow the same rules): the corpus is read and cut into 16 KiB chunks before the clock
-- starts — about what one socket read hands over — then decoded in passes until at least
-- MIN_PASSES passes and MIN_SECONDS have gone by. The fastest pass is reported: other work on
-- the machine can only slow a pass down, never speed it up.

local common = require "common"

local decode_loop = {}

decode_loop.CHUNK = 16 * 1024
decode_loop.MIN_PASSES = 3
decode_loop.MIN_SECONDS = 1.0

function decode_loop.chunks(path)
  local text = assert(common.read_file(path), "cannot read the corpus " .. tostring(path))
  local chunks = {}
  for i = 1, #text, decode_loop.CHUNK do chunks[#chunks + 1] = text:sub(i, i + decode_loop.CHUNK - 1) end
  return chunks
end

--- Counts one decoded frame into a pass's totals: frames, payload bytes, and the check (the sum
-- of each payload's first and last byte).
function decode_loop.tally(frame, frames, bytes, check)
  local data = frame.data
  if data then
    bytes = bytes + #data
    check = check + data:byte(1) + data:byte(-1)
  end
  return frames + 1, bytes, check
end

--- one_pass(chunks) -> frames, payload bytes, check (sum of each payload's first and last byte).
function decode_loop.run(path, one_pass)
  local chunks = decode_loop.chunks(path)
  local passes, total, best = 0, 0, math.huge
  local frames, bytes, check
  while passes < decode_loop.MIN_PASSES or total < decode_loop.MIN_SECONDS do
    collectgarbage()
    local t0 = common.now()
    frames, bytes, check = one_pass(chunks)
    local dt = common.now() - t0
    passes, total = passes + 1, total + dt
    if dt < best then best = dt end
  end
  return { passes = passes, best_seconds = best, frames = frames, bytes = bytes, check = check }
end

return decode_loop
