--- The Lambda MicroVMs control plane: the REST calls the aws provider makes, signed with SigV4
-- (service `lambda`) and sent over http.exchange.
--
--   local microvms = require "sandkit.providers.aws.microvms"
--   local client = assert(microvms.new{
--     region = "us-east-2",            -- or $AWS_REGION / $AWS_DEFAULT_REGION
--     endpoint = nil,                  -- default https://lambda.<region>.amazonaws.com
--     ca_file = nil, timeout = 30,     -- seconds per call, from sending to the end of the answer
--     credentials = nil,               -- a table, or a function called before every call
--     access_key_id = nil, secret_access_key = nil, session_token = nil,
--   })
--   client:run{ image_identifier =, image_version =, client_token =,
--               egress_network_connectors = {…}, max_idle_duration_seconds =,
--               maximum_duration_seconds = }                    --> microvm | nil, err
--   client:get(id)                                              --> microvm | nil | nil, err
--   client:terminate(id) / client:suspend(id) / client:resume(id) --> true | nil | nil, err
--   client:create_auth_token(id, { 8971 }, minutes)             --> { [header] = value } | nil | nil, err
--
-- A microvm is { id =, endpoint =, state =, image_arn =, image_version = }; a field AWS left
-- out is nil. A call on a MicroVM id answers nil with no error when AWS says 404: absent is an
-- answer, and each caller decides what it means.
--
-- Credentials are looked up before every call — the options, else the function, else the
-- AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN environment — so rotated
-- credentials are picked up. No error text ever holds a credential.

local core = require "sandkit.core"
local json_codec = require "sandkit.json"
local errors = require "sandkit.errors"
local http = require "sandkit.http"
local options_check = require "sandkit.options"
local sigv4 = require "sandkit.providers.aws.sigv4"
local wait = require "sandkit.wait"

local microvms = {}

--- The API version every path starts with: Lambda serves its other APIs from the same host
-- under other versions.
microvms.API_VERSION = "2025-09-09"
--- The longest life AWS mints an endpoint token for; asking for more is refused by AWS, so
-- every request is clamped here rather than failing at the far end.
microvms.MAX_AUTH_TOKEN_MINUTES = 60
--- Seconds one control-plane call may take: its answers are small documents, so a call that
-- takes longer is a call that is not coming back.
microvms.DEFAULT_TIMEOUT = 30

--- What a MicroVM id is: whatever RunMicrovm names one, bounded, without control characters.
-- Every id goes into its path escaped (segment below), so this is a bound, not what keeps an id
-- from reaching another route.
microvms.ID = { max = 256, pattern = "^[^%c]+$",
  what = "a MicroVM id is 1 to 256 characters, none of them a control character" }

--- The SigV4 service name: MicroVMs are signed as Lambda, not as a service of their own.
local SERVICE = "lambda"
--- How much of AWS's own sentence an error quotes: enough for any refusal AWS writes, not
-- enough for an unexpected page to flood a log.
local MAX_QUOTED = 300

local client_mt = {}
client_mt.__index = client_mt

local function non_empty_string(v)
  return type(v) == "string" and v ~= ""
end

local to_integer = json_codec.integer

--- Whether a URL host names this machine.
function microvms.is_loopback(host)
  return host == "localhost" or host == "[::1]" or host:match("^127%.%d+%.%d+%.%d+$") ~= nil
end

--- The base URL of the API: scheme://host[:port]/2025-09-09, or nil and why not.
local function base_url(region, endpoint)
  if endpoint == nil then
    return "https://lambda." .. region .. ".amazonaws.com/" .. microvms.API_VERSION
  end
  if type(endpoint) ~= "string" then return nil, "endpoint must be a URL string" end
  local scheme, host, port = endpoint:match("^(https?)://([%w%.%-]+)(:?%d*)/?$")
  if not scheme then
    scheme, host, port = endpoint:match("^(https?)://(%[[%x:]+%])(:?%d*)/?$")
  end
  if not scheme or port == ":" then
    return nil, "endpoint must be http(s)://host[:port], without a path"
  end
  -- A session token travels in x-amz-security-token: in the clear it is a credential handed to
  -- anyone on the path, so plain http is only for an endpoint on this machine.
  if scheme == "http" and not microvms.is_loopback(host) then
    return nil, "endpoint must be https unless it is on this machine (127.0.0.1, localhost, [::1])"
  end
  return scheme .. "://" .. host .. port .. "/" .. microvms.API_VERSION
end

function microvms.new(options)
  if type(options) ~= "table" then error("sandkit: microvms.new takes an options table", 2) end
  local region = options.region or os.getenv("AWS_REGION") or os.getenv("AWS_DEFAULT_REGION")
  if not non_empty_string(region) or not region:match("^[%w%-]+$") then
    return nil, errors.invalid_input("sandbox.create", "region",
      "the aws provider needs region (or $AWS_REGION), such as \"us-east-2\"")
  end
  local base, why = base_url(region, options.endpoint)
  if not base then return nil, errors.invalid_input("sandbox.create", "endpoint", why) end
  local credentials = options.credentials
  if credentials ~= nil and type(credentials) ~= "table" and type(credentials) ~= "function" then
    return nil, errors.invalid_input("sandbox.create", "credentials",
      "credentials must be a table or a function returning one")
  end
  local timeout, bad = options_check.seconds("sandbox.create", options, "timeout", microvms.DEFAULT_TIMEOUT)
  if bad then return nil, bad end
  return setmetatable({
    region = region,
    base = base,
    ca_file = options.ca_file,
    timeout = timeout,
    credentials = credentials,
    static = non_empty_string(options.access_key_id) and {
      access_key_id = options.access_key_id,
      secret_access_key = options.secret_access_key,
      session_token = options.session_token,
    } or nil,
  }, client_mt)
end

local NO_CREDENTIALS = "no AWS credentials: give access_key_id and secret_access_key, "
  .. "credentials = function() … end, or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"

--- The credentials for the next call. Nothing from a credential goes into the error.
local function resolve_credentials(self, operation)
  local found = self.static
  if not found and type(self.credentials) == "table" then found = self.credentials end
  if not found and type(self.credentials) == "function" then
    local value, why = self.credentials()
    if type(value) ~= "table" then
      local cause = errors.is_error(why) and why or nil
      local detail = type(why) == "string" and (": " .. why) or ""
      return nil, errors.new("INVALID_INPUT", { operation = operation, field = "credentials",
        cause = cause,
        message = operation .. ": the credentials function returned no credentials" .. detail })
    end
    found = value
  end
  if not found then
    local key = os.getenv("AWS_ACCESS_KEY_ID")
    if non_empty_string(key) then
      found = { access_key_id = key, secret_access_key = os.getenv("AWS_SECRET_ACCESS_KEY"),
        session_token = os.getenv("AWS_SESSION_TOKEN") }
    end
  end
  if not found or not non_empty_string(found.access_key_id)
      or not non_empty_string(found.secret_access_key)
      or (found.session_token ~= nil and type(found.session_token) ~= "string") then
    return nil, errors.invalid_input(operation, "credentials", NO_CREDENTIALS)
  end
  return found
end

--- A path segment for an id: every byte outside the unreserved set escaped, so an id can
-- never reach another route.
local function segment(id)
  return (id:gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

--- Cuts text to MAX_QUOTED bytes without splitting a UTF-8 sequence.
local function clip(text)
  if #text <= MAX_QUOTED then return text end
  local cut = MAX_QUOTED
  -- Bytes 0x80-0xBF continue a sequence: the cut moves back to where one starts.
  local byte = text:byte(cut + 1)
  while cut > 0 and byte >= 0x80 and byte < 0xC0 do
    cut = cut - 1
    byte = text:byte(cut + 1)
  end
  return text:sub(1, cut) .. "…"
end

--- AWS's error name: the x-amzn-ErrorType header, else the body's __type or code, without
-- the namespace or URL AWS decorates it with.
local function error_type(headers, json)
  local raw = headers["x-amzn-errortype"]
  if not non_empty_string(raw) and json then
    raw = json.__type or json.code or json.Code
  end
  if not non_empty_string(raw) then return nil end
  raw = raw:match("^([^:]*)") or raw
  return raw:match("#([^#]*)$") or raw
end

--- An IAM user or role ARN names an account and a principal; whoever reads the error must be
-- an operator, never a tenant.
local function names_identity(text)
  return text:find("arn:aws[%w%-]*:iam::") ~= nil or text:find("arn:aws[%w%-]*:sts::") ~= nil
end

--- Turns a non-2xx answer into the error callers branch on.
local function refusal(operation, answer)
  local json = answer.json
  local kind = error_type(answer.headers, json)
  local said = json and (json.message or json.Message)
  if not non_empty_string(said) then said = answer.body ~= "" and answer.body or nil end
  local text = said and clip(said) or "no message"
  local fields = { operation = operation, status = answer.status, aws_error = kind,
    internal = names_identity(text) }
  if kind == "ThrottlingException" or kind == "TooManyRequestsException" then
    fields.retry_after = errors.retry_after(answer.headers["retry-after"])
    fields.message = string.format("lambda %s was throttled (%s): %s", operation, kind, text)
    return errors.new("RATE_LIMIT_EXCEEDED", fields)
  end
  if kind == "ServiceQuotaExceededException" then
    fields.message = string.format("lambda %s: account quota exhausted (MicroVM memory is "
      .. "limited per account and Region): %s", operation, text)
    return errors.new("QUOTA_EXCEEDED", fields)
  end
  -- AWS answered: the same request gets the same refusal, unless AWS itself failed.
  fields.retryable = answer.status >= 500
  fields.message = string.format("lambda %s failed: HTTP %d%s: %s", operation, answer.status,
    kind and (" " .. kind) or "", text)
  return errors.new("SANDBOX_UNREACHABLE", fields)
end

--- Who answers, as the transport failures' wording names it.
local PEER = "AWS Lambda"

--- One signed call. Returns the decoded JSON answer ({} for an empty body), or nil when
-- `absent_on_404` and AWS said 404, or nil and an error. A call that changes a MicroVM's state
-- goes `once`: on a connection of its own, so a connection that died in the pool can never make
-- libcurl send it a second time, and an unanswered one may have taken effect.
function client_mt:call(operation, method, path, body, absent_on_404, once)
  local credentials, err = resolve_credentials(self, operation)
  if not credentials then return nil, err end
  local headers = {}
  if body then headers["content-type"] = "application/json" end
  local ok, signed = pcall(sigv4.sign, { method = method, url = self.base .. path,
    headers = headers, body = body or "", credentials = credentials, region = self.region,
    service = SERVICE })
  if not ok then
    -- The signer's refusals name the rule broken, never the value that broke it; where in
    -- sandkit it was raised is no help to the reader.
    local rule = tostring(signed):gsub("^[^:]*:%d+: ", "")
    return nil, errors.invalid_input(operation, "credentials", rule)
  end
  local answer, failure = http.exchange{ method = method, url = signed.url,
    headers = signed.headers, body = body, ca_file = self.ca_file,
    fresh_connect = once == true,
    connect_timeout = self.timeout,
    deadline = wait.now() + self.timeout }
  if not answer then
    return nil, errors.transport_failure(operation, failure, once == true,
      { peer = PEER, seconds = self.timeout, bytes = http.MAX_EXCHANGE_BODY })
  end
  local status = answer.status
  if status == 404 and absent_on_404 then return nil end
  if status < 200 or status >= 300 then return nil, refusal(operation, answer) end
  if answer.body == "" then return {} end
  if not answer.json then
    return nil, errors.unexpected(operation, "body", "the answer was not a JSON object")
  end
  return answer.json
end

local function text_field(v)
  if type(v) == "string" then return v end
  if type(v) == "number" then return tostring(to_integer(v) or v) end
  return nil
end

local function microvm(json)
  return { id = text_field(json.microvmId), endpoint = text_field(json.endpoint),
    state = text_field(json.state), image_arn = text_field(json.imageArn),
    image_version = text_field(json.imageVersion) }
end

local encode = json_codec.encode

local function positive_integer(v, name)
  if v == nil then return nil end
  local n = to_integer(v)
  if not n or n <= 0 then error("sandkit: " .. name .. " must be a positive integer", 3) end
  return n
end

--- RunMicrovm. The client token makes AWS start one MicroVM however often the same request
-- arrives; no execution role is ever passed (see providers/aws/init.lua).
function client_mt:run(spec)
  if type(spec) ~= "table" or not non_empty_string(spec.image_identifier)
      or not non_empty_string(spec.image_version) or not non_empty_string(spec.client_token) then
    error("sandkit: run needs image_identifier, image_version and client_token strings", 2)
  end
  local body = { imageIdentifier = spec.image_identifier, imageVersion = spec.image_version,
    clientToken = spec.client_token }
  -- Left out when empty: an empty list is the public internet either way, and lua-cjson
  -- would write an empty table as an object.
  if spec.egress_network_connectors and #spec.egress_network_connectors > 0 then
    body.egressNetworkConnectors = spec.egress_network_connectors
  end
  local idle = positive_integer(spec.max_idle_duration_seconds, "max_idle_duration_seconds")
  if idle then body.idlePolicy = { maxIdleDurationSeconds = idle, autoResumeEnabled = false } end
  body.maximumDurationInSeconds = positive_integer(spec.maximum_duration_seconds,
    "maximum_duration_seconds")
  local json, err = self:call("RunMicrovm", "POST", "/microvms", encode(body), false, true)
  if not json then return nil, err end
  return microvm(json)
end

--- A call on the MicroVM `id`, at `suffix` below its path: the answer, nil when AWS says it
-- is absent, or nil and an error (an id that is none is refused before anything is signed).
function client_mt:call_on(id, operation, method, suffix, body, once)
  local bad = options_check.id(operation, id, microvms.ID)
  if bad then return nil, bad end
  return self:call(operation, method, "/microvms/" .. segment(id) .. suffix, body, true, once)
end

function client_mt:get(id)
  local json, err = self:call_on(id, "GetMicrovm", "GET", "")
  if not json then return nil, err end
  return microvm(json)
end

function client_mt:terminate(id)
  local json, err = self:call_on(id, "TerminateMicrovm", "DELETE", "")
  if not json then return nil, err end
  return true
end

function client_mt:suspend(id)
  local json, err = self:call_on(id, "SuspendMicrovm", "POST", "/suspend", "{}", true)
  if not json then return nil, err end
  return true
end

function client_mt:resume(id)
  local json, err = self:call_on(id, "ResumeMicrovm", "POST", "/resume", "{}", true)
  if not json then return nil, err end
  return true
end

--- A header name and value the transfer layer can send as they are.
local function valid_header(name, value)
  return type(name) == "string" and name:match("^[%w!#$%%&'*+%-.^_`|~]+$") ~= nil
    and type(value) == "string" and not value:find("[%c]")
end

--- CreateMicrovmAuthToken: a header map that admits requests to `ports` of one MicroVM for
-- `minutes` (clamped to what AWS mints).
function client_mt:create_auth_token(id, ports, minutes)
  if type(ports) ~= "table" or #ports == 0 then error("sandkit: ports is a list of port numbers", 2) end
  local allowed = {}
  for i, port in ipairs(ports) do
    if not options_check.is("port", port) then error("sandkit: ports is a list of port numbers", 2) end
    allowed[i] = { port = to_integer(port) }
  end
  local life = positive_integer(minutes, "minutes")
  if not life then error("sandkit: minutes is required", 2) end
  life = math.min(life, microvms.MAX_AUTH_TOKEN_MINUTES)
  local json, err = self:call_on(id, "CreateMicrovmAuthToken", "POST", "/auth-token",
    encode{ allowedPorts = allowed, expirationInMinutes = life })
  if not json then return nil, err end
  local token = json.authToken
  if type(token) ~= "table" or next(token) == nil then
    return nil, errors.unexpected("CreateMicrovmAuthToken", "authToken",
      "the answer carried no header map")
  end
  local headers = {}
  for name, value in pairs(token) do
    if not valid_header(name, value) then
      -- The value is a credential: the refusal names the header, never its value.
      return nil, errors.unexpected("CreateMicrovmAuthToken", "authToken",
        "the header map holds an entry that is not a sendable header: " .. clip(tostring(name)))
    end
    headers[name] = value
  end
  return headers
end

--- A fresh client token: 128 random bits in hex, as RunMicrovm takes them.
function microvms.client_token()
  return (core.random(16):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

return microvms
