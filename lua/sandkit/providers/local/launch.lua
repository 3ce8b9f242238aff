--- A local session's agent started and waited for: its command line, its token and lifetime
-- files, the wait for its report that it listens and for its health, and then its record. The
-- provider's start_agent and await_agent call these (a spec puts a failure between the two).

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"
local wait = require "sandkit.wait"
local agent_process = require "sandkit.providers.local.agent_process"
local state = require "sandkit.providers.local.state"

local launch = {}

-- Loaded by a start that needs them: limits only for a session that has some.
local function limits() return require "sandkit.providers.local.limits" end

--- Starts an agent for the session directory and waits until it serves. `fields`: generation,
-- env, expires_at (os.time seconds, or nil: it ends the agent's life), isolate, network and
-- host_uid (the session's, kept in its record).
function launch.start_agent(provider, id, dir, fields)
  local agent, missing = agent_process.find(provider.options)
  if not agent then
    -- Not OPERATION_NOT_SUPPORTED: the provider does this; the installation is what is amiss.
    return nil, errors.invalid_input("sandbox.create", "agent_path", missing)
  end
  local token_path = dir .. "/token"
  os.remove(token_path)
  local token = core.b64encode(core.random(32))
  local ok, err = core.write_private(token_path, token)
  if ok then ok, err = agent_process.write_end(dir, fields.expires_at) end
  if not ok then return nil, errors.invalid_input("sandbox.create", "root", err) end
  -- Inside nginx the agent listens on 127.0.0.1: there a Unix socket woke the worker for
  -- smaller reads and cost a stream 10-20% of its rate (bench/RESULTS.md "The agent's start,
  -- and local sessions over a Unix socket"). A socket left by an agent that was killed would
  -- refuse the next one its name.
  local socket = not wait.check_nginx() and state.socket_path(dir) or nil
  if socket then os.remove(socket) end
  local argv = agent_process.argv(agent, dir, fields, provider.options, provider.bwrap, socket)
  if fields.image then
    for _, word in ipairs{ "--image", provider:image_store().dir .. "/" .. fields.image .. "/rootfs",
      "--image-work", dir .. "/work" } do argv[#argv + 1] = word end
  end
  if fields.limits then limits().argv(argv, fields.limits) end
  if fields.limits and fields.limits.disk then
    argv[#argv + 1] = "--disk"
    argv[#argv + 1] = dir .. "/disk.img"
  end
  local pid, reader = core.spawn(argv, { ready_fd = 3, setsid = true,
    stderr = dir .. "/agent.log", stdout = dir .. "/agent.log" })
  if not pid then
    return nil, errors.invalid_input("sandbox.create", "agent_path", "cannot start sandkit-agent: " .. reader)
  end

  -- Whatever fails once the agent runs, the agent goes with it: a session without its record
  -- is one no get, list or terminate could find again.
  local done, record, failure = pcall(provider.await_agent, provider, id, dir, pid, reader, token, fields,
    socket)
  if not done then
    failure = errors.unreachable("sandbox.create", "sandkit-agent for session " .. id
      .. " was started, then: " .. tostring(record), { retryable = false })
    record = nil
  end
  if not record then
    reader:close()
    -- SIGTERM first: the agent kills its commands' process groups before it goes.
    agent_process.stop(pid, dir)
    return nil, failure
  end
  return record
end

--- Waits until the agent started as `pid` listens and serves, then writes its record: the
-- record, or nil and an error (the caller stops the agent).
function launch.await_agent(provider, id, dir, pid, reader, token, fields, socket)
  -- The agent writes one line when it listens; its closing without one means it failed.
  local line, closed = agent_process.ready_line(reader, core.now() + provider.ready_timeout)
  local ready = line and json.decode(line)
  if type(ready) ~= "table" or type(ready.port) ~= "number" then
    local log = (state.read_file(dir .. "/agent.log") or ""):sub(-600)
    -- An agent that closed the pipe without its line is leaving: its status says why.
    local refusal = closed and agent_process.refusal(select(2, core.reap(pid, true)))
    if refusal then
      local said = log:match("sandkit%-agent: ([^\n]*)\n?$") or log
      return nil, errors.invalid_input("sandbox.create", refusal.field, said .. "; " .. refusal.instead)
    end
    return nil, errors.unreachable("sandbox.create", "sandkit-agent for session " .. id
      .. " did not report that it listens: " .. log)
  end
  local record = { id = id, pid = pid, socket = socket, port = not socket and json.integer(ready.port) or nil,
    boot_id = ready.bootId,
    generation = fields.generation, isolate = fields.isolate, network = fields.network,
    host_uid = fields.host_uid, env = fields.env, created_at = os.time(),
    expires_at = fields.expires_at, labels = fields.labels, image = fields.image, limits = fields.limits }
  local conn = protocol.connection(agent_process.transport(record, token), provider.options)
  local health, herr = readiness.wait(conn, { timeout = provider.ready_timeout })
  if not health then return nil, herr end
  local written, werr = state.write_record(dir, record)
  if not written then return nil, errors.invalid_input("sandbox.create", "root", tostring(werr)) end
  record.state = "running"
  record.token = token
  record.features = health.features
  return record
end

return launch
