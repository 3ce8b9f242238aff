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

--- A fresh private directory under the system's temporary folder (mode 0700, or `mode`).
function files.temp_dir(mode)
  local core = require "sandkit.core"
  local dir = os.tmpname()
  os.remove(dir)
  assert(core.mkdir(dir, mode or 448))
  return dir
end

--- Runs a shell command: true when it exited 0 (os.execute says so as true on Lua 5.2+ and
-- as 0 on LuaJIT's 5.1 ABI).
function files.sh(command)
  local r = os.execute(command)
  return r == true or r == 0
end

--- The environment of a Lua child process that loads this checkout's sandkit: its paths, and
-- the sanitizer runtime when `make check-asan` preloads it; `extra` is added.
function files.child_env(extra)
  local env = { LUA_PATH = package.path, LUA_CPATH = package.cpath, PATH = os.getenv("PATH") }
  for _, name in ipairs{ "LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS" } do env[name] = os.getenv(name) end
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

--- A word the shell passes on unchanged, whatever it holds.
function files.shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

return files
