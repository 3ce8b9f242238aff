--- Small file and shell helpers the specs share.
local files = {}

--- The whole file, or nil when it cannot be opened.
function files.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function files.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

--- A checksum of a large body, cheap enough for tens of MiB in Lua: it samples every 997th
-- byte (a prime, so no power-of-two block lines up with it) weighted by position, and the
-- length. Over content that does not repeat (files.pattern), a lost, added or moved run of
-- bytes changes it.
function files.checksum(s)
  local sum = #s
  for i = 1, #s, 997 do sum = (sum * 31 + s:byte(i) * i) % 2147483647 end
  return sum
end

--- n bytes that do not repeat at any short period: 16-byte cells holding their index within a
-- 64 KiB block, the block's first cell its own number.
function files.pattern(n)
  local cells = {}
  for i = 1, 4096 do cells[i] = string.format("%015x\n", i) end
  local base = table.concat(cells)
  local blocks = {}
  for b = 1, math.ceil(n / 65536) do blocks[b] = string.format("block %09x\n", b) .. base:sub(17) end
  return table.concat(blocks):sub(1, n)
end

--- A fresh private directory under the system's temporary folder (mode 0700, or `mode`).
function files.temp_dir(mode)
  local core = require "sandkit.core"
  local dir = os.tmpname()
  os.remove(dir)
  assert(core.mkdir(dir, mode or 448))
  return dir
end

--- Runs a shell command; true when it exited 0. os.execute answers true under Lua 5.4 and 0
-- under LuaJIT (5.1's exit status), which this hides.
function files.execute(command)
  local r = os.execute(command)
  return r == true or r == 0
end

--- The variables that carry the sanitizer runtime `make check-asan` preloads: a child loading
-- the C module built with it needs them; other programs (curl, Chromium) must not get them.
files.SANITIZER_ENV = { "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS" }

--- The environment of a Lua child process that loads this checkout's sandkit: its paths, and
-- the sanitizer runtime when `make check-asan` preloads it; `extra` is added.
function files.child_env(extra)
  local env = { LUA_PATH = package.path, LUA_CPATH = package.cpath, PATH = os.getenv("PATH") }
  for _, name in ipairs(files.SANITIZER_ENV) do env[name] = os.getenv(name) end
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

--- A word the shell passes on unchanged, whatever it holds.
function files.shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

return files
