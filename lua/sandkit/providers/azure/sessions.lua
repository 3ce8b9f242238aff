--- An Azure session's life as the data plane reports it: its record read and judged against
-- what the sandbox declares (transport label, egress policy), its states as sandkit's, and the
-- waits for it to run. Methods of the azure provider (sessions.methods), and the refusals the
-- provider's other parts share.

local errors = require "sandkit.errors"
local session_labels = require "sandkit.labels"
local wait = require "sandkit.wait"
local egress = require "sandkit.providers.azure.egress"

local sessions = { methods = {} }
local methods = sessions.methods

--- The label that says how a session is reached, and the one value that means its own agent.
sessions.TRANSPORT_LABEL = "alienAgentTransport"
sessions.TRANSPORT_VERSION = "native-file-v1"

--- Azure's sandbox states as sandkit's session states.
local STATES = {
  Running = "running", Creating = "starting", Resuming = "starting",
  Stopping = "paused", Stopped = "paused", Suspended = "paused", Idle = "paused", Hibernated = "paused",
  Deleting = "terminated", Failed = "terminated",
}
--- States a resume wakes from.
local ASLEEP = { Stopped = true, Suspended = true, Idle = true, Hibernated = true }

function sessions.invalid_route()
  return errors.command_failed("agentTransportInvalid",
    "Azure did not report a valid agent HTTPS route and per-boot credential",
    { operation = "sandbox.agent" })
end

--- How a session is reached, from its own record: "agent", "native", or refused.
function sessions.transport_of(raw)
  local value
  if type(raw.labels) == "table" then value = raw.labels[sessions.TRANSPORT_LABEL] end
  if value == nil then return "native" end
  if value == sessions.TRANSPORT_VERSION then return "agent" end
  return nil, sessions.invalid_route()
end

function sessions.gone(operation, id)
  return errors.command_failed("sandboxGone", operation .. ": session " .. id .. " does not exist",
    { operation = operation })
end

local gone = sessions.gone

--- Reads a session's raw record: raw | nil (absent) | nil, err.
function methods:read(id, operation)
  local raw, err = self.dataplane:get_sandbox(self.group, id)
  if raw then return raw end
  if err then return nil, errors.wrap(operation, "the session record could not be read", err) end
  return nil
end

--- Nil when the session enforces the declared egress policy, else the refusal.
function methods:egress_refusal(raw, operation)
  local effective = egress.key(raw.egress_policy)
  if effective ~= nil and effective == egress.key(self.egress_policy) then return nil end
  return errors.new("SANDBOX_NOT_AS_DECLARED", { operation = operation, sandbox_id = raw.id,
    restriction = "egress", message = operation .. ": session " .. raw.id
      .. " does not enforce the declared egress policy" })
end

--- A raw record as a session record, if it is what this sandbox declares.
function methods:judge(raw, operation)
  local kind, err = sessions.transport_of(raw)
  if not kind then return nil, err end
  local refusal = self:egress_refusal(raw, operation)
  if refusal then return nil, refusal end
  return { id = raw.id, state = STATES[raw.state] or "starting", azure_state = raw.state,
    generation = 1, transport = kind, labels = session_labels.of(raw.labels) }
end

--- Reads and judges a session that must exist.
function methods:judged(id, operation)
  local raw, err = self:read(id, operation)
  if not raw then return nil, err or gone(operation, id) end
  return self:judge(raw, operation)
end

--- Reads the record until `done(raw)` says yes, every state_interval, up to `timeout`.
function methods:poll(id, operation, timeout, done)
  local deadline = wait.now() + timeout
  while true do
    local raw, err = self:read(id, operation)
    if err then return nil, err end
    local verdict, why = done(raw)
    if verdict ~= nil then return verdict, why end
    if wait.now() + self.times.state_interval > deadline then
      return nil, errors.unreachable(operation, string.format(
        "session %s did not settle within %gs (last state %s)", id, timeout, tostring(raw and raw.state)))
    end
    wait.sleep(self.times.state_interval)
  end
end

--- Waits for Running: raw | nil, err.
function methods:await_running(id, operation, timeout)
  return self:poll(id, operation, timeout, function(raw)
    if not raw then return false, gone(operation, id) end
    if raw.state == "Running" then return raw end
    if STATES[raw.state] == "terminated" then
      return false, errors.command_failed("sandboxGone", operation .. ": session " .. id .. " is "
        .. raw.state, { operation = operation })
    end
  end)
end

--- Makes sure a session runs, waking it when it sleeps: raw, woke | nil, err. `raw` is its
-- record when the caller just read it.
function methods:ensure_running(id, operation, raw)
  local err
  if not raw then
    raw, err = self:read(id, operation)
    if not raw then return nil, err or gone(operation, id) end
  end
  if raw.state == "Running" then return raw, false end
  if STATES[raw.state] == "terminated" then return nil, gone(operation, id) end
  if raw.state == "Stopping" then
    return nil, errors.command_failed("sessionSuspended", operation .. ": session " .. id
      .. " is stopping; resume it once it stopped", { operation = operation })
  end
  local woke = false
  if ASLEEP[raw.state] then
    local ok
    ok, err = self.dataplane:resume_sandbox(self.group, id)
    if not ok then
      return nil, err and errors.wrap(operation, "the session could not be woken", err) or gone(operation, id)
    end
    woke = true
  end
  raw, err = self:await_running(id, operation, self.times.create_timeout)
  if not raw then return nil, err end
  return raw, woke
end

return sessions
