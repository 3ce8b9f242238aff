--- The sandkit-agent processes of the local provider: where the binary is, the command line a
-- session's agent starts with, its report that it listens, how requests reach it, and stopping
-- it.

local core = require "sandkit.core"
local wait = require "sandkit.wait"
local state = require "sandkit.providers.local.state"

local agent_process = {}

--- Seconds an agent gets to report that it listens, and to leave after SIGTERM.
agent_process.START_TIMEOUT = 10
local STOP_TIMEOUT = 5

local file_exists, read_file = state.file_exists, state.read_file

--- How requests reach the agent of `record`: its Unix socket, or its port on 127.0.0.1. The
-- URL's host and port then only name the request.
function agent_process.transport(record, token)
  local base = "http://127.0.0.1:" .. (record.socket and 80 or record.port)
  return {
    prepare = function(_, _, path)
      return { url = base .. path, unix_socket = record.socket,
        headers = { Authorization = "Bearer " .. token } }
    end,
  }
end

--- The agent binary: the option, $SANDKIT_AGENT, next to this installation's bin/, or $PATH;
-- nil and where it was looked for when it is nowhere.
function agent_process.find(options)
  if options.agent_path then
    if file_exists(options.agent_path) then return options.agent_path end
    return nil, "agent_path " .. options.agent_path .. " does not exist"
  end
  local env = os.getenv("SANDKIT_AGENT")
  if env and env ~= "" then
    if file_exists(env) then return env end
    return nil, "$SANDKIT_AGENT names " .. env .. ", which does not exist"
  end
  -- A LuaRocks tree or prefix keeps the module at <tree>/lib/lua/5.x/sandkit/core.so and the
  -- binary at <tree>/bin/sandkit-agent.
  local so = package.searchpath("sandkit.core", package.cpath)
  if so then
    local tree = so:match("^(.*)/lib/lua/[^/]+/sandkit/core%.so$")
    if tree and file_exists(tree .. "/bin/sandkit-agent") then return tree .. "/bin/sandkit-agent" end
  end
  for dir in (os.getenv("PATH") or ""):gmatch("[^:]+") do
    if file_exists(dir .. "/sandkit-agent") then return dir .. "/sandkit-agent" end
  end
  return nil, "sandkit-agent was not found (set agent_path, $SANDKIT_AGENT, or put it on $PATH)"
end

--- The command line of the agent of the session folder `dir` (sandkit/providers/local/init.lua
-- has the layout): its files, token, log and lifetime file there (the agent's own clock ends the
-- session at the time that file names, read again on SIGHUP: write_end, reread_end), listening
-- on `socket` (state.socket_path's) or else on a port of 127.0.0.1; confined or not as `fields` say,
-- with its network and host uid, and bubblewrap at `bwrap`.
function agent_process.argv(agent, dir, fields, options, bwrap, socket)
  local argv = { agent, "--root", dir .. "/files", "--token-file", dir .. "/token",
    "--listen", socket and ("unix:" .. socket) or "127.0.0.1:0", "--ready-fd", "3", "--log", "info",
    "--lifetime-file", dir .. "/lifetime" }
  for _, word in ipairs{ "--isolate", fields.isolate } do argv[#argv + 1] = word end
  if fields.isolate == "bwrap" then
    for _, word in ipairs{ "--network", fields.network, "--bwrap", bwrap } do argv[#argv + 1] = word end
    if fields.host_uid then
      argv[#argv + 1] = "--host-uid"
      argv[#argv + 1] = string.format("%d", fields.host_uid)
    end
  end
  if options.output_cap then
    argv[#argv + 1] = "--output-cap"
    argv[#argv + 1] = tostring(options.output_cap)
  end
  return argv
end

--- The line the agent writes to its ready descriptor once it listens, or nil when it closed it
-- without one (it failed: then also true) or wrote none by `deadline`. The reader is closed
-- either way.
function agent_process.ready_line(reader, deadline)
  local line, got, closed = nil, "", false
  while not line do
    local chunk = reader:read()
    if chunk then
      got = got .. chunk
      line = got:match("^([^\n]*)\n")
    elseif chunk == nil or core.now() >= deadline then
      closed = chunk == nil
      break
    else
      wait.ready(reader, deadline)
    end
  end
  reader:close()
  return line, not line and closed
end

--- The agent's exit statuses for confinement this machine cannot give (docs/agent.md), with
-- the option each is about and what to choose instead.
local REFUSALS = {
  [3] = { field = "isolate",
    instead = "isolate = \"none\" (sandkit --isolate none) runs commands unconfined instead" },
  [4] = { field = "network",
    instead = "network = \"none\" gives the session no network instead" },
  [5] = { field = "limits",
    instead = "capabilities().limits lists the limits this machine enforces" },
}

--- What an agent's exit status says the machine cannot give ({ field, instead }), or nil.
function agent_process.refusal(status)
  return REFUSALS[status]
end

--- The uid the sandbox user of a confined session is on this machine when sandkit runs as
-- root: a fresh one per session, so no two sessions share a uid (nor its process limits), in
-- [2^30, 2^31): above the uids of users and of the subordinate ranges useradd hands out (to
-- 600100000 on Debian). nil when not root: the agent then maps the sandbox user to the
-- calling user.
local HOST_UID_BASE = 2 ^ 30

function agent_process.host_uid()
  local status = read_file("/proc/self/status") or ""
  if status:match("\nUid:%s+%d+%s+(%d+)") ~= "0" then return nil end
  local b = { core.random(4):byte(1, 4) }
  return math.floor(HOST_UID_BASE + ((b[1] % 64) * 2 ^ 24 + b[2] * 2 ^ 16 + b[3] * 2 ^ 8 + b[4]))
end

--- Whether pid is the agent serving dir: a recorded pid may since belong to someone else.
function agent_process.is_agent_of(pid, dir)
  local cmdline = read_file("/proc/" .. pid .. "/cmdline")
  return cmdline ~= nil and cmdline:find(dir .. "/files", 1, true) ~= nil
end

--- Bytes of the lifetime file: the end's twelve digits (options.LAST_TIME has twelve) padded
-- with spaces, and a newline. A new end overwrites the old in place, one write of this fixed
-- width, never truncating first: the agent holds the file open and reads it again through that
-- descriptor (a confined agent could not open a new one), and never sees it shorter.
local END_WIDTH = 20

--- Writes the end of the session in `dir` (Unix seconds, or nil for none) where its agent
-- reads it: true, or nil and why. The first write creates the file, private to this user.
function agent_process.write_end(dir, ends)
  local path = dir .. "/lifetime"
  local text = string.format("%-" .. (END_WIDTH - 1) .. "s\n", ends and string.format("%d", ends) or "")
  local f = io.open(path, "r+b")
  if not f then return core.write_private(path, text) end
  local ok, err = f:write(text)
  if ok then ok, err = f:flush() end
  f:close()
  if not ok then return nil, err end
  return true
end

--- Whether the agent `pid` of `dir` can be given a new end: it is not running (the next one
-- reads the file at its start), or it was started with the lifetime file. One an older sandkit
-- started has none, and SIGHUP would end it.
function agent_process.takes_end(pid, dir)
  if not (core.alive(pid) and agent_process.is_agent_of(pid, dir)) then return true end
  local cmdline = read_file("/proc/" .. pid .. "/cmdline") or ""
  return cmdline:find("\0--lifetime-file\0" .. dir .. "/lifetime\0", 1, true) ~= nil
end

--- Tells the running agent `pid` of `dir` to read its end again (SIGHUP); nothing when it is
-- not running: a revived agent reads the file at its start.
function agent_process.reread_end(pid, dir)
  if core.alive(pid) and agent_process.is_agent_of(pid, dir) then core.kill(pid, core.SIGHUP) end
end

--- Stops the agent `pid` of `dir` and its commands: SIGTERM, then SIGKILL after STOP_TIMEOUT.
function agent_process.stop(pid, dir)
  if not (core.alive(pid) and agent_process.is_agent_of(pid, dir)) then
    core.reap(pid)
    return
  end
  -- SIGTERM lets the agent kill its commands' process groups before it goes.
  core.kill(pid, core.SIGTERM)
  local deadline = core.now() + STOP_TIMEOUT
  while core.now() < deadline do
    if core.reap(pid) and not (core.alive(pid) and agent_process.is_agent_of(pid, dir)) then return end
    wait.sleep(0.02)
  end
  core.kill(pid, core.SIGKILL)
  core.reap(pid, true)
end

return agent_process
