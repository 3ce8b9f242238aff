--- Waiting until an agent can serve: its health answers protocol version 1 with status
-- `ready`, and any image command it supervises has not failed. An agent that waits for its
-- first activation is activated (unless the caller owns that step, as the Azure route does).
--
-- Every other answer is waited through until the deadline, as the original does: a 4xx from an
-- endpoint proxy whose token is still propagating, a 502 while a snapshot restores, a page that
-- is not the agent's, another protocol version, a body without a status. Only what asking again
-- cannot change ends the wait early: a refused activation, and a failure to even address the
-- agent (a route or credential the provider cannot produce).

local errors = require "sandkit.errors"
local protocol = require "sandkit.protocol"
local wait = require "sandkit.wait"

local readiness = {}

readiness.DEFAULT_TIMEOUT = 60  -- seconds a fresh sandbox gets to become servable
readiness.DEFAULT_INTERVAL = 0.5

local function describe(health)
  local text = health.status ~= nil and ("status " .. tostring(health.status))
    or "a health answer without a status"
  if health.imageCommand then text = text .. ", image command " .. tostring(health.imageCommand.status) end
  return text
end

--- Returns the health table once the agent is ready, or nil and an error naming what it
-- last saw. opts: timeout, interval, activate (default true), operation (for errors).
function readiness.wait(conn, opts)
  opts = opts or {}
  local timeout = opts.timeout or readiness.DEFAULT_TIMEOUT
  local interval = opts.interval or readiness.DEFAULT_INTERVAL
  local operation = opts.operation or "sandbox.create"
  local deadline = wait.now() + timeout
  local last
  while true do
    -- One probe may not outlast the whole wait.
    local probe_timeout = math.max(0.001, math.min(conn.header_timeout, deadline - wait.now()))
    local probe = setmetatable({ header_timeout = probe_timeout }, { __index = conn })
    local health, err = protocol.health(probe)
    if health then
      local status = health.status
      if status == "awaiting-network-verification" and opts.activate ~= false then
        local ok, aerr = protocol.activate(probe)
        if not ok and aerr.code == "SANDBOX_COMMAND_FAILED" then return nil, aerr end
        last = ok and "activated; waiting for ready" or tostring(aerr)
      elseif status == "ready" and not (health.imageCommand and health.imageCommand.status == "failed") then
        return health
      else
        last = describe(health)
      end
    elseif not (err.retryable or (err.status and err.operation == protocol.OPERATIONS.health)) then
      -- Not the health probe's own answer, and not one that waiting changes: the provider could
      -- not address the agent (a route, a credential, a sandbox not as declared) or the agent
      -- refused its activation.
      return nil, err
    elseif not (last and probe_timeout < conn.header_timeout and err.sent ~= false) then
      -- A probe cut short by the end of the wait mostly measures its own cut-off: what the
      -- agent said before it stays the better account of why the wait failed.
      last = err.message
    end
    if wait.now() + interval >= deadline then
      return nil, errors.unreachable(operation, string.format(
        "the agent did not become ready within %gs; last seen: %s", timeout, tostring(last)),
        { cause = errors.is_error(err) and err or nil })
    end
    wait.sleep(interval)
  end
end

return readiness
