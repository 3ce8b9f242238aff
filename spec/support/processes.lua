--- Processes and ports for the specs (and bench/gateway.lua) that start servers of their own:
-- every wait bounded, every process of ours ended.
--
--   processes.within(seconds, pred)       -- polls pred; true once it held, false at the bound
--   processes.free_port()                 -- a port nothing listens on, for a server to bind
--   processes.listening(port, pid, s)     -- true once something accepts on port; false when
--                                            pid ended first, or at the bound
--   processes.alive(pid), processes.children(pid)
--   processes.stop(pid, s)                -- SIGTERM, then SIGKILL past the bound; reaps it
--   processes.env(extra, sanitized)       -- an environment for a child: PATH and extra, and
--                                            with `sanitized` the sanitizer runtime the suite
--                                            runs under (make check-asan preloads it)
--   processes.bound_by_modes()            -- an argv prefix under which a folder's modes bind
--                                            root as they bind anyone (empty for anyone else)

local core = require "sandkit.core"
local socket = require "socket"
local files = require "support.files"

local processes = {}

--- How often a bounded wait looks again: far below any bound it serves.
local POLL = 0.01

function processes.within(seconds, pred)
  local deadline = core.now() + seconds
  repeat
    if pred() then return true end
    socket.sleep(POLL)
  until core.now() > deadline
  return pred() and true or false
end

function processes.free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

function processes.listening(port, pid, seconds)
  local up = false
  processes.within(seconds, function()
    local c = socket.tcp()
    c:settimeout(1)
    up = c:connect("127.0.0.1", port) and true or false
    c:close()
    return up or core.reap(pid)
  end)
  return up
end

--- A process is gone once it is absent or a zombie (dead, waiting for whoever reaps it).
function processes.alive(pid)
  local stat = files.read("/proc/" .. pid .. "/stat")
  local state = stat and stat:match("^%d+ %b() (%a)")
  return state ~= nil and state ~= "Z" and state ~= "X"
end

function processes.children(pid)
  local found = {}
  for _, name in ipairs(core.listdir("/proc") or {}) do
    local stat = name:match("^%d+$") and files.read("/proc/" .. name .. "/stat")
    if stat and tonumber(stat:match("^%d+ %b() %a (%d+)")) == pid then found[#found + 1] = tonumber(name) end
  end
  return found
end

function processes.env(extra, sanitized)
  local env = { PATH = os.getenv("PATH") }
  if sanitized then
    for _, name in ipairs(files.SANITIZER_ENV) do env[name] = os.getenv(name) end
  end
  for k, v in pairs(extra or {}) do env[k] = v end
  return env
end

--- What root keeps when it starts a program under bound_by_modes: everything but the two
-- capabilities that let it read, write and search any file whatever its modes.
local DAC_CAPABILITIES = "-dac_override,-dac_read_search"

function processes.bound_by_modes()
  local status = files.read("/proc/self/status") or ""
  if status:match("\nUid:%s+%d+%s+(%d+)") ~= "0" then return {} end
  return { "setpriv", "--bounding-set=" .. DAC_CAPABILITIES, "--inh-caps=" .. DAC_CAPABILITIES }
end

--- Ends a child of ours. Returns true when SIGTERM was enough.
function processes.stop(pid, seconds)
  core.kill(pid, core.SIGTERM)
  if processes.within(seconds, function() return core.reap(pid) end) then return true end
  core.kill(pid, core.SIGKILL)
  core.reap(pid, true)
  return false
end

return processes
