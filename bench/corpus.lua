--- The decoding corpus: one NDJSON exec body of the shape sandkit-agent writes, the same bytes
-- on every run (a fixed-seed generator, no clock, no randomness from the system).
--
-- It mixes what real commands produce: full 64 KiB data frames (a build artefact, a log dump,
-- `cat` of a big file) and short-line frames (a test runner printing one line at a time), on
-- stdout and stderr, ending with the exit frame. Payloads are pseudo-random bytes, so base64
-- decoding sees every symbol of the alphabet.

local core = require "sandkit.core"

local corpus = {}

--- Full frames carry the most a frame may (docs/protocol.md §3.3: 64 KiB decoded).
corpus.FULL_FRAME = 64 * 1024
--- 256 full frames and 64 short lines after each: 16,641 frames, about 17.6 MB of payload and
-- 24 MB of NDJSON — long enough to time, short enough for plain Lua to get through in seconds.
corpus.FULL_FRAMES = 256
corpus.LINES_PER_FULL = 64

--- A 32-bit linear congruential generator (Numerical Recipes' constants): deterministic and
-- cheap, which is all a payload needs.
local function lcg(seed)
  local state = seed
  return function()
    -- Exact in both Lua 5.4's integers and LuaJIT's doubles: the product stays below 2^53.
    state = (state * 1664525 + 1013904223) % 4294967296
    return state
  end
end

--- n pseudo-random bytes, four per generator step.
local function random_bytes(next_u32, n)
  local parts = {}
  local floor = math.floor
  for i = 1, floor(n / 4) do
    local v = next_u32()
    parts[i] = string.char(v % 256, floor(v / 256) % 256, floor(v / 65536) % 256, floor(v / 16777216) % 256)
  end
  return table.concat(parts)
end

local WORDS = { "compiling", "linking", "test", "passed", "ok", "warning:", "src/frames.c",
  "shard", "case", "cached", "downloading", "layer", "sha256", "done", "in", "ms", "retry" }

--- Writes the corpus to path; returns what is in it.
function corpus.generate(path)
  local next_u32 = lcg(20240601)
  -- Eight distinct 64 KiB blocks, each frame a different rotation of one: distinct payloads
  -- without generating 16 MiB a byte at a time in Lua.
  local blocks = {}
  for i = 1, 8 do blocks[i] = random_bytes(next_u32, corpus.FULL_FRAME) end

  local f = assert(io.open(path, "wb"))
  local seq, frames, payload = 0, 0, 0
  local function frame(stream, data)
    f:write('{"t":"', stream, '","seq":', seq, ',"data":"', core.b64encode(data), '"}\n')
    seq = seq + 1
    frames = frames + 1
    payload = payload + #data
  end
  for i = 1, corpus.FULL_FRAMES do
    local block = blocks[next_u32() % #blocks + 1]
    local cut = next_u32() % #block
    frame("stdout", block:sub(cut + 1) .. block:sub(1, cut))
    for j = 1, corpus.LINES_PER_FULL do
      local words = {}
      for k = 1, next_u32() % 12 + 1 do words[k] = WORDS[next_u32() % #WORDS + 1] end
      local line = string.format("[%6d.%03d] %s %d\n", i, j, table.concat(words, " "), next_u32() % 100000)
      frame(next_u32() % 8 == 0 and "stderr" or "stdout", line)
    end
  end
  f:write('{"t":"exit","code":0,"truncated":false}\n')
  frames = frames + 1
  local size = f:seek("end")
  f:close()
  return { frames = frames, data_frames = frames - 1, payload_bytes = payload, input_bytes = size }
end

return corpus
