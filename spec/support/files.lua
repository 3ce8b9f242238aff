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

--- Every how many bytes files.checksum samples one: a prime, so no power-of-two block lines up
-- with it.
local CHECKSUM_STRIDE = 997
local CHECKSUM_MODULUS = 2147483647

--- files.checksum's sum over bytes that come in pieces, their total length known first:
-- sum.add(piece) for each piece in order, then sum.value(). A body of tens of MiB is summed
-- without ever being one string: on a virtual machine each fresh page of memory costs more than
-- the bytes written into it.
function files.checksummer(total)
  local sum, done = total, 0
  local summer = {}
  function summer.add(piece)
    -- The first sampled position (1, 1 + STRIDE, …, counted over the whole body) in this piece.
    local behind = done % CHECKSUM_STRIDE
    local i = behind == 0 and done + 1 or done + 1 + CHECKSUM_STRIDE - behind
    local last = done + #piece
    while i <= last do
      sum = (sum * 31 + piece:byte(i - done) * i) % CHECKSUM_MODULUS
      i = i + CHECKSUM_STRIDE
    end
    done = last
  end
  function summer.value() return sum end
  return summer
end

--- A checksum of a large body, cheap enough for tens of MiB in Lua: it samples every 997th
-- byte weighted by position, and the length. Over content that does not repeat (files.pattern),
-- a lost, added or moved run of bytes changes it.
function files.checksum(s)
  local summer = files.checksummer(#s)
  summer.add(s)
  return summer.value()
end

--- Bytes a piece of a file or of files.pattern holds: below the size from which the C library
-- maps fresh memory for each allocation instead of reusing what the last piece freed.
local PIECE = 65536

--- files.checksum of the file at path, read a piece at a time.
function files.file_checksum(path)
  local f = assert(io.open(path, "rb"))
  local summer = files.checksummer(f:seek("end"))
  f:seek("set")
  for piece in function() return f:read(PIECE) end do summer.add(piece) end
  f:close()
  return summer.value()
end

--- files.pattern(n)'s bytes a 64 KiB block at a time: an iterator of its pieces.
function files.pattern_pieces(n)
  -- A block's cells after its first, which names the block.
  local cells = {}
  for i = 2, PIECE / 16 do cells[#cells + 1] = string.format("%015x\n", i) end
  local rest = table.concat(cells)
  local b, blocks = 0, math.ceil(n / PIECE)
  return function()
    b = b + 1
    if b > blocks then return nil end
    local block = string.format("block %09x\n", b) .. rest
    if b == blocks then block = block:sub(1, n - (b - 1) * PIECE) end
    return block
  end
end

--- n bytes that do not repeat at any short period: 16-byte cells holding their index within a
-- 64 KiB block, the block's first cell its own number.
function files.pattern(n)
  local pieces = {}
  for piece in files.pattern_pieces(n) do pieces[#pieces + 1] = piece end
  return table.concat(pieces)
end

--- Writes files.pattern(n) to path a piece at a time.
function files.write_pattern(path, n)
  local f = assert(io.open(path, "wb"))
  for piece in files.pattern_pieces(n) do assert(f:write(piece)) end
  assert(f:close())
end

--- files.checksum of files.pattern(n), computed a piece at a time.
function files.pattern_checksum(n)
  local summer = files.checksummer(n)
  for piece in files.pattern_pieces(n) do summer.add(piece) end
  return summer.value()
end

--- Whether files and folders made with `mode` get all of it, no bit of it being in this
-- process's umask (Linux says the umask in /proc; false where it does not): where they do, no
-- chmod need be started after them.
function files.umask_keeps(mode)
  local status = files.read("/proc/self/status")
  local umask = status and tonumber(status:match("\nUmask:%s*(%d+)") or "", 8)
  if not umask then return false end
  for bit = 0, 8 do
    local b = 2 ^ bit
    if math.floor(mode / b) % 2 == 1 and math.floor(umask / b) % 2 == 1 then return false end
  end
  return true
end

--- The temporary files and folders this busted process made through temp_name and temp_dir,
-- removed when it ends (busted's "exit" event), whatever its specs did or failed to do: a run
-- of the suite leaves nothing in /tmp. os.tmpname, under both interpreters, names
-- /tmp/lua_XXXXXX whatever $TMPDIR says. A helper process a spec starts (a fake cluster's
-- controller, say) is no busted: what it makes is inside a folder of its spec's, or its own to
-- remove.
local made = {}

local function remember(path)
  if #made == 0 then
    local found, busted = pcall(require, "busted")
    if not (found and busted.subscribe) then return path end
    busted.subscribe({ "exit" }, function()
      local core = require "sandkit.core"
      for i = #made, 1, -1 do core.remove_tree(made[i]) end
      made = {}
      -- busted's mediator stops at a subscriber that does not ask it to go on: each spec file
      -- of a run loads this module afresh (busted insulates files), and each copy's list is
      -- removed only if the handlers before it let the event through.
      return nil, true
    end)
  end
  made[#made + 1] = path
  return path
end

--- A fresh name under the system's temporary folder: an empty file of that name, or with
-- `suffix` a name nothing has (os.tmpname's file removed, the suffix added).
function files.temp_name(suffix)
  local name = os.tmpname()
  if not suffix then return remember(name) end
  os.remove(name)
  return remember(name .. suffix)
end

--- A fresh private directory under the system's temporary folder (mode 0700, or `mode`).
function files.temp_dir(mode)
  local core = require "sandkit.core"
  local dir = files.temp_name("")
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

--- Whether this is `make check-asan`. Its memory is the sanitizer's: freed blocks wait in its
-- quarantine and shadow memory grows with every byte that passed, so resident-memory bounds
-- are measured by the plain build only.
files.SANITIZED = (os.getenv("LD_PRELOAD") or ""):find("libasan", 1, true) ~= nil

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
