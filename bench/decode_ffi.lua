--- Decoding with sandkit's C decoder through LuaJIT's FFI, on the plain C ABI of src/common/frames.h
-- (what an nginx worker could use instead of the C module): the corpus in 16 KiB reads, every
-- frame taken out as a table with its payload as a Lua string (ffi.string copies it out).
--   luajit bench/decode_ffi.lua CORPUS        (LUA_CPATH must find the LuaJIT build of sandkit.core)
-- Prints RESULT { passes, best_seconds, frames, bytes, check } (per pass).

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local decode_loop = require "decode_loop"
local ffi = require "ffi"

-- src/common/frames.h, as it stands: the structure must match it field for field, or the decoder
-- writes past what the FFI allocated.
ffi.cdef[[
typedef struct sk_frames sk_frames;
typedef struct sk_frame {
  int type;
  uint64_t seq;
  const unsigned char *data;
  size_t data_len;
  int32_t code;
  int truncated;
  int has_signal;
  int32_t signal;
  int oom;
  const char *error_code;
  size_t error_code_len;
  const char *message;
  size_t message_len;
  int data_is_base64;
  const char *event;
  size_t event_len;
  const char *path;
  size_t path_len;
  const char *from;
  size_t from_len;
  const char *reason;
  size_t reason_len;
} sk_frame;
sk_frames *sk_frames_new(size_t max_line);
void sk_frames_free(sk_frames *d);
int sk_frames_decode(sk_frames *d, const char **in, size_t *in_len, sk_frame *out);
const char *sk_frames_error(const sk_frames *d);
]]

-- The C module exports the decoder's symbols; loading it again by path reaches them.
local C = ffi.load(assert(package.searchpath("sandkit.core", package.cpath), "sandkit.core not found"))

local TYPES = { "stdout", "stderr", "exit", "error" }
local FRAME, FAILED = 1, -1

local function one_pass(chunks)
  local frames, bytes, check = 0, 0, 0
  local d = ffi.gc(C.sk_frames_new(0), C.sk_frames_free)
  local f = ffi.new("sk_frame")
  local input = ffi.new("const char *[1]")
  local left = ffi.new("size_t[1]")
  for _, chunk in ipairs(chunks) do
    input[0], left[0] = chunk, #chunk
    while true do
      local r = C.sk_frames_decode(d, input, left, f)
      if r == FAILED then error("the corpus did not decode: " .. ffi.string(C.sk_frames_error(d))) end
      if r ~= FRAME then break end
      local frame = { type = TYPES[f.type] }
      if f.type <= 2 then
        frame.seq = tonumber(f.seq)
        frame.data = ffi.string(f.data, f.data_len)
      else
        frame.code = f.code
      end
      frames, bytes, check = decode_loop.tally(frame, frames, bytes, check)
    end
  end
  return frames, bytes, check
end

common.result(decode_loop.run(arg[1], one_pass))
