--- Error objects (README.md, "Errors"): one metatable, fields a caller branches on, a message a
-- person reads, and the chain of causes behind it.
--
-- `code` is what callers branch on; `retryable` says whether sending the same operation
-- again is safe; `failure` is a diagnostic label for SANDBOX_COMMAND_FAILED.

local time = require "sandkit.time"

local errors = {}

local error_mt = {}
error_mt.__index = error_mt
error_mt.__name = "sandkit.error"

--- Whether an operation that failed this way may be sent again, by code, when the
-- constructor does not say otherwise.
local RETRYABLE = {
  SANDBOX_OUTCOME_UNKNOWN = false,  -- it may have taken effect: a repeat could run it twice
  SANDBOX_UNREACHABLE = true,       -- nothing ran, or running it again is safe
  SANDBOX_COMMAND_FAILED = false,   -- the agent answered; asking again gets the same answer
  UNEXPECTED_RESPONSE_FORMAT = false,
  OPERATION_NOT_SUPPORTED = false,
  INVALID_INPUT = false,
  RATE_LIMIT_EXCEEDED = true,
  QUOTA_EXCEEDED = true,
  SANDBOX_NOT_AS_DECLARED = false,
}
errors.CODES = {}
for code in pairs(RETRYABLE) do errors.CODES[code] = code end

--- The agent protocol's operations that may start a command (docs/protocol.md §4): sent once,
-- and an unanswered one may have taken effect. Other clients say it per request (`once`).
local NOT_IDEMPOTENT = { ["sandbox.runCommand"] = true, ["sandbox.jobStart"] = true }

local function render(err)
  local head = err.code
  if err.failure then head = head .. " (" .. err.failure .. ")" end
  local parts = { head .. ": " .. err.message }
  local cause, depth = err.cause, 1
  while cause ~= nil and depth < 16 do
    if getmetatable(cause) == error_mt then
      local line = cause.code
      if cause.failure then line = line .. " (" .. cause.failure .. ")" end
      parts[#parts + 1] = "  caused by: " .. line .. ": " .. cause.message
      cause = cause.cause
    else
      parts[#parts + 1] = "  caused by: " .. tostring(cause)
      cause = nil
    end
    depth = depth + 1
  end
  return table.concat(parts, "\n")
end

error_mt.__tostring = render
error_mt.__concat = function(a, b)
  return (getmetatable(a) == error_mt and render(a) or tostring(a))
    .. (getmetatable(b) == error_mt and render(b) or tostring(b))
end

--- Creates an error. `fields.message` is required; `retryable` defaults by code; an error
-- wrapping an internal cause is internal too, unless `fields.internal` says otherwise.
function errors.new(code, fields)
  if RETRYABLE[code] == nil then error("unknown sandkit error code " .. tostring(code), 2) end
  if type(fields) ~= "table" or type(fields.message) ~= "string" then
    error("an error needs a message", 2)
  end
  local err = {}
  for k, v in pairs(fields) do err[k] = v end
  err.code = code
  if err.retryable == nil then err.retryable = RETRYABLE[code] end
  if err.internal == nil then
    err.internal = getmetatable(err.cause) == error_mt and err.cause.internal or false
  end
  return setmetatable(err, error_mt)
end

function errors.is_error(v)
  return getmetatable(v) == error_mt
end

--- A copy safe to show to a tenant: an internal error says only "Internal server error",
-- and a public one keeps no internal cause.
function error_mt:external()
  if self.internal then
    return setmetatable({ code = self.code, retryable = self.retryable,
      operation = self.operation, message = "Internal server error", internal = false }, error_mt)
  end
  local copy = {}
  for k, v in pairs(self) do copy[k] = v end
  if getmetatable(self.cause) == error_mt then
    copy.cause = not self.cause.internal and self.cause:external() or nil
  else
    copy.cause = nil
  end
  return setmetatable(copy, error_mt)
end

--- The one rule for a request that got no whole answer: could it have run, and may it be sent
-- again. An operation that may be repeated is SANDBOX_UNREACHABLE, safe to send again. One sent
-- `once`, because it may start something (a sandbox, a claim, a change of state), is
-- SANDBOX_OUTCOME_UNKNOWN (never retryable) unless it provably never left (fields.sent ==
-- false): then it ran nowhere and is SANDBOX_UNREACHABLE. The agent protocol's two command
-- starts (`once` left nil) are SANDBOX_OUTCOME_UNKNOWN whatever the transport says: the protocol
-- reads a failed connection as unanswered like any other (docs/protocol.md §4), and a caller of
-- runCommand or jobStart branches on that one code; `err.sent == false` still says it never left.
function errors.unanswered(operation, reason, fields, once)
  fields = fields or {}
  fields.operation = operation
  local starts_command = once == nil and NOT_IDEMPOTENT[operation] == true
  if starts_command or (once and fields.sent ~= false) then
    fields.message = operation .. " did not report its outcome and may have taken effect: " .. reason
    return errors.new("SANDBOX_OUTCOME_UNKNOWN", fields)
  end
  fields.message = operation .. " went unanswered: " .. reason
  return errors.new("SANDBOX_UNREACHABLE", fields)
end

--- The one wording of each way sandkit.http reports a request without a whole answer, for
-- every client alike. `failure` is the transport's facts ({ kind =, sent =, detail =, status =
-- }: status once headers came); `said` names `peer` (who should have answered), `seconds` (the
-- bound of the wait that ran out) and `bytes` (the bound on the answer's body).
function errors.transport_reason(failure, said)
  local peer, kind = said.peer, failure.kind
  if kind == "refused" then
    return "the request never reached " .. peer .. ": " .. tostring(failure.detail)
  elseif kind == "timeout" and failure.sent == false then
    return string.format("the request did not reach %s within %gs", peer, said.seconds)
  elseif kind == "timeout" then
    return string.format("%s did not answer within %gs", peer, said.seconds)
  elseif failure.status == nil then
    return "the connection failed before " .. peer .. " answered: " .. tostring(failure.detail)
  end
  local head = string.format("%s answered %d and its body ", peer, failure.status)
  if kind == "too_long" then
    return head .. string.format("exceeded %d bytes", said.bytes)
  elseif kind == "stalled" then
    return head .. string.format("stalled: not complete within %gs", said.seconds)
  end
  return head .. "could not be read: " .. tostring(failure.detail)
end

--- A transport's failure as the error callers branch on: its one wording, then the one rule.
-- `said` as for transport_reason, and `context`, when given, says what was being read.
function errors.transport_failure(operation, failure, once, said)
  local reason = errors.transport_reason(failure, said)
  if said.context then reason = said.context .. ": " .. reason end
  return errors.unanswered(operation, reason, { sent = failure.sent, status = failure.status }, once)
end

--- An unanswered request's error once the session it went to reached the end of its lifetime
-- (`ends`, Unix seconds): err.reason = "SESSION_EXPIRED" and err.expires_at say so, and the
-- message names the lifetime. Its code, `sent` and `retryable` stand as the one rule above made
-- them: a command cut by the end may have had effects, so its outcome stays unknown.
function errors.session_ended(err, id, ends)
  err.reason = "SESSION_EXPIRED"
  err.expires_at = ends
  err.message = err.message .. "; session " .. id .. " reached the end of its lifetime at "
    .. time.rfc3339(ends) .. " (set_lifetime, or sandkit lifetime, gives it longer)"
  return err
end

--- Seconds a Retry-After header asks for, or nil. Only the delta-seconds form is read: none of
-- the services sandkit calls sends a date. Nine digits (over 31 years) at most: a longer
-- figure is no advice anyone acts on, and would not stay an integer.
function errors.retry_after(value)
  local digits = type(value) == "string" and value:match("^%s*(%d+)%s*$")
  if not digits or #digits > 9 then return nil end
  return math.floor(tonumber(digits))
end

--- SANDBOX_UNREACHABLE for what asking again may change: a session not there (yet), a wait
-- that ran out. `fields` adds to it.
function errors.unreachable(operation, details, fields)
  fields = fields or {}
  fields.operation = operation
  fields.message = operation .. ": " .. details
  return errors.new("SANDBOX_UNREACHABLE", fields)
end

--- A session a provider will not touch because it is not this sandbox's. Absent and someone
-- else's are one refusal, so no caller learns whether a sibling's id exists; `not_ours` tells
-- the provider itself which it was.
function errors.not_ours(operation, id)
  return errors.unreachable(operation, "session '" .. id .. "' does not belong to this sandbox",
    { not_ours = true })
end

--- A failure of one step as seen by the operation that needed it: the step's code, retry
-- advice and details stand (a throttle stays a throttle), its message after what the
-- operation was doing, and the step's error as the cause.
function errors.wrap(operation, what, cause)
  return errors.new(cause.code, { operation = operation, cause = cause,
    message = operation .. ": " .. what .. ": " .. cause.message, retryable = cause.retryable,
    retry_after = cause.retry_after, status = cause.status, failure = cause.failure,
    reason = cause.reason })
end

--- An answer with a body this client cannot read as the protocol says it should be.
function errors.unexpected(operation, field, detail, fields)
  fields = fields or {}
  fields.operation = operation
  fields.field = field
  fields.message = operation .. ": unexpected " .. field .. ": " .. detail
  return errors.new("UNEXPECTED_RESPONSE_FORMAT", fields)
end

function errors.command_failed(failure, message, fields)
  fields = fields or {}
  fields.failure = failure
  fields.message = message
  return errors.new("SANDBOX_COMMAND_FAILED", fields)
end

function errors.not_supported(operation, reason)
  return errors.new("OPERATION_NOT_SUPPORTED", {
    operation = operation, message = operation .. " is not supported: " .. reason })
end

function errors.invalid_input(operation, field, details)
  return errors.new("INVALID_INPUT", {
    operation = operation, field = field, message = operation .. ": " .. details })
end

function errors.is_idempotent(operation)
  return not NOT_IDEMPOTENT[operation]
end

errors.metatable = error_mt

return errors
