--- The sandkit-agent processes of the local provider: where the binary is, the command line a
-- session's agent starts with, its report that it listens, and stopping it.

local core = require "sandkit.core"
local wait = require "sandkit.wait"
local state = require "sandkit.providers.local.state"

local agent_process = {}

--- Seconds an agent gets to report that it listens, and to leave after SIGTERM.
agent_process.START_TIMEOUT = 10
local STOP_TIMEOUT = 5

local file_exists, read_file = state.file_exists, state.read_file

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

--- A lifetime is kept by coreutils' timeout(1) in front of the agent: at the end it sends the
-- agent SIGTERM, which the agent answers by killing its commands' process groups and leaving,
-- and SIGKILL if it has not left STOP_TIMEOUT seconds later. A SIGTERM from terminate reaches
-- the agent through it the same way.
local TIMEOUT_PROGRAM = "timeout"

--- The command line of the agent of the session folder `dir` (sandkit/providers/local/init.lua
-- has the layout): its files, token and log there, ending at `expires_at` (os.time seconds) if
-- given, under bubblewrap with the state folder `root` hidden when the sandbox isolates.
function agent_process.argv(agent, dir, expires_at, options, root)
  local argv = { agent, "--root", dir .. "/files", "--token-file", dir .. "/token",
    "--listen", "127.0.0.1:0", "--ready-fd", "3", "--log", "info" }
  if expires_at then
    local left = expires_at - os.time()
    if left < 1 then left = 1 end
    table.insert(argv, 1, TIMEOUT_PROGRAM)
    table.insert(argv, 2, "--kill-after=" .. STOP_TIMEOUT)
    table.insert(argv, 3, tostring(math.floor(left)))
  end
  if options.isolate == "bwrap" then
    -- The state folder holds every session's token, record and files: inside the sandbox it is
    -- empty but for this session's own files.
    for _, word in ipairs{ "--isolate", "bwrap", "--hide", root } do argv[#argv + 1] = word end
  end
  if options.output_cap then
    argv[#argv + 1] = "--output-cap"
    argv[#argv + 1] = tostring(options.output_cap)
  end
  return argv
end

--- The line the agent writes to its ready descriptor once it listens, or nil when it closed it
-- without one (it failed) or wrote none by `deadline`. The reader is closed either way.
function agent_process.ready_line(reader, deadline)
  local line, got = nil, ""
  while not line do
    local chunk = reader:read()
    if chunk then
      got = got .. chunk
      line = got:match("^([^\n]*)\n")
    elseif chunk == nil or core.now() >= deadline then
      break
    else
      wait.ready(reader, deadline)
    end
  end
  reader:close()
  return line
end

--- Whether pid is the agent serving dir: a recorded pid may since belong to someone else.
function agent_process.is_agent_of(pid, dir)
  local cmdline = read_file("/proc/" .. pid .. "/cmdline")
  return cmdline ~= nil and cmdline:find(dir .. "/files", 1, true) ~= nil
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
