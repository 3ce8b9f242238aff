--- Error objects (README.md, "Errors"): one metatable, fields a caller branches on, a message a
-- person reads, and the chain of causes behind it.
--
-- `code` is what callers branch on; `retryable` says whether sending the same operation
-- again is safe; `failure` is a diagnostic label for SANDBOX_COMMAND_FAILED.

local errors = {}

local error_mt = {}
error_mt.__index = error_mt
error_mt.__name = "sandkit.error"

--- Whether an operation that failed this way may be sent again, by code, when the
-- constructor does not say otherwise.
local RETRYABLE = {
  SANDBOX_OUTCOME_UNKNOWN = false,  -- it may have taken effect: a repeat could run it twice
  SANDBOX_UNREACHABLE = true,       -- only idempotent operations are reported this way
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

--- Operations that may start a command: an unanswered one may have taken effect.
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

--- The request may have been delivered and no answer says what became of it.
-- Non-idempotent operations get SANDBOX_OUTCOME_UNKNOWN (never retryable); every other
-- operation SANDBOX_UNREACHABLE (safe to send again).
function errors.unanswered(operation, reason, fields)
  fields = fields or {}
  fields.operation = operation
  if NOT_IDEMPOTENT[operation] then
    fields.message = operation .. " did not report its outcome and may have taken effect: " .. reason
    return errors.new("SANDBOX_OUTCOME_UNKNOWN", fields)
  end
  fields.message = operation .. " could not reach the sandbox: " .. reason
  return errors.new("SANDBOX_UNREACHABLE", fields)
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
