--- The Kubernetes REST calls the kubernetes provider makes, over sandkit.http: whole
-- requests and answers, watches as streams, and the one place a Kubernetes answer becomes a
-- sandkit error.
--
--   local client = api.new(cfg, { timeout = 30 })    -- cfg from sandkit.providers.kubernetes.kubeconfig
--   client:call{ operation =, verb = "get", resource = "sandboxclaims", namespace =, name =,
--                method = "GET", path =, query = { {k, v}… }, body = <table>, once = bool,
--                content_type = "application/json", absent_on_404 = bool, max_body = bytes,
--                discovery = bool }           -- decoded answer | nil (absent) | nil, err
--                                             (discovery: a read of an API group's document, whose
--                                             404 is the group's absence, nothing more)
--   client:watch{ … same, plus deadline }     -- response (stream) | nil, err
--   client:target(path, headers, operation)   -- a protocol target for the API server's proxy
--
-- Authentication failures get one more try: a 401 makes the credential source read its token
-- file or run its exec plugin again, and when that changed anything the request goes once
-- more (a 401 is answered before the server does anything).
--
-- agent-sandbox's resources are served at v1beta1 from its v0.5.0 on. A 404 that names no
-- object is the API server not serving the path at all: the error says which agent-sandbox
-- the cluster has, from its API group's discovery document.

local errors = require "sandkit.errors"
local http = require "sandkit.http"
local json = require "sandkit.json"
local wait = require "sandkit.wait"

local api = {}

api.CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1"
api.SANDBOXES = "/apis/agents.x-k8s.io/v1beta1"
api.CORE = "/api/v1"
--- The release of agent-sandbox whose API sandkit speaks, and where its version is told.
api.AGENT_SANDBOX_FLOOR = "v0.5.0"
api.EXTENSIONS_GROUP = "/apis/extensions.agents.x-k8s.io"
--- Seconds a call may take when the sandbox gives no bound of its own.
api.DEFAULT_TIMEOUT = 30
--- Seconds a connection gets to be made: an API server that does not accept by then is down.
local CONNECT_TIMEOUT = 10
--- Characters of the server's own words an error quotes.
local MAX_QUOTED = 300
--- Bytes of a failed watch's answer read: a Status is a few hundred bytes.
local MAX_WATCH_ERROR = 64 * 1024

local client_mt = {}
client_mt.__index = client_mt

function api.new(cfg, opts)
  return setmetatable({ server = cfg.server, ca_pem = cfg.ca_pem,
    tls_server_name = cfg.tls_server_name, auth = cfg.auth,
    timeout = opts and opts.timeout or api.DEFAULT_TIMEOUT }, client_mt)
end

--- Percent-encodes a query value: everything but unreserved characters.
local function escape(s)
  return (tostring(s):gsub("[^%w%-%._~]", function(c) return string.format("%%%02X", c:byte()) end))
end

local function with_query(path, query)
  local parts = {}
  for _, pair in ipairs(query or {}) do parts[#parts + 1] = pair[1] .. "=" .. escape(pair[2]) end
  if #parts == 0 then return path end
  return path .. "?" .. table.concat(parts, "&")
end

--- The server's own words about a failure: a Status's message, else the body, on one line.
local function said(answer)
  local st = answer.json
  local text = st and st.kind == "Status" and type(st.message) == "string" and st.message
    or answer.body or ""
  text = text:gsub("%s+", " ")
  if #text > MAX_QUOTED then text = text:sub(1, MAX_QUOTED) .. "…" end
  return text ~= "" and text or "no message"
end

--- Seconds the server asks a throttled client to wait: Retry-After, else the Status's
-- retryAfterSeconds.
local function retry_after(answer)
  local v = errors.retry_after((answer.headers or {})["retry-after"])
  if v then return v end
  local st = answer.json
  local details = st and type(st.details) == "table" and st.details
  return details and json.integer(details.retryAfterSeconds) or nil
end

local function what(call)
  local target = call.resource .. (call.name and (" " .. call.name) or "")
  return call.verb .. " " .. target .. (call.namespace and (" in namespace " .. call.namespace) or "")
end

--- The one classifier: a non-2xx Kubernetes answer as a sandkit error. `reason` is the Status
-- reason (AlreadyExists, Forbidden, Expired, …) and `status` the HTTP status.
function api.refusal(call, answer)
  local status = answer.status
  local st = answer.json
  local reason = st and st.kind == "Status" and type(st.reason) == "string" and st.reason or nil
  local fields = { operation = call.operation, status = status, reason = reason }
  local answered = string.format("Kubernetes answered %d%s to %s: %s", status,
    reason and (" " .. reason) or "", what(call), said(answer))
  local head = call.operation .. ": " .. answered
  fields.message = head
  if status == 401 or status == 403 then
    -- Authentication and RBAC: asking again gets the same answer. The text names the user
    -- the server saw, for an operator's eyes.
    fields.internal = true
    fields.field = "kubeconfig"
    fields.message = head .. (status == 403 and " (the client's Role needs this verb: "
      .. "deploy/kubernetes/rbac.yaml)" or "")
    return errors.new("INVALID_INPUT", fields)
  end
  if status == 429 then
    fields.retry_after = retry_after(answer)
    return errors.new("RATE_LIMIT_EXCEEDED", fields)
  end
  if status >= 500 then
    -- The server did not say what became of the request: no answer.
    return errors.unanswered(call.operation, answered, { status = status, reason = reason, sent = true },
      call.once == true)
  end
  if status == 410 then
    -- A resource version or continue token too old: starting again from now works.
    return errors.new("SANDBOX_UNREACHABLE", fields)
  end
  return errors.new("INVALID_INPUT", fields)
end

--- Who answers, as the transport failures' wording names it.
local PEER = "the Kubernetes API server"

--- A call that got no whole answer, saying which call it was.
local function unanswered(call, failure, seconds, bytes)
  return errors.transport_failure(call.operation, failure, call.once == true,
    { peer = PEER, seconds = seconds, bytes = bytes, context = what(call) })
end

--- The request fields every call to the API server carries, with the current credential.
function client_mt:request_spec(operation, method, path, headers, body)
  local fields, err = self.auth:fields(operation)
  if not fields then return nil, err end
  local all = { Accept = "application/json" }
  for k, v in pairs(fields.headers) do all[k] = v end
  for k, v in pairs(headers or {}) do all[k] = v end
  return { method = method, url = self.server .. path, headers = all, body = body,
    ca_pem = self.ca_pem, tls_server_name = self.tls_server_name,
    client_cert_pem = fields.client_cert_pem, client_key_pem = fields.client_key_pem,
    connect_timeout = CONNECT_TIMEOUT }
end

--- Sends with `send` (http.exchange or http.send) and, after a 401 that changed the
-- credential, once more. Returns what `send` returned.
function client_mt:authenticated(call, send, extra)
  local headers = {}
  local body
  if call.body ~= nil then
    body = json.encode(call.body)
    headers["Content-Type"] = call.content_type or "application/json"
  end
  local path = with_query(call.path, call.query)
  local retried = false
  while true do
    local spec, err = self:request_spec(call.operation, call.method, path, headers, body)
    if not spec then return nil, nil, err end
    spec.fresh_connect = call.once
    for k, v in pairs(extra) do spec[k] = v end
    local answer, failure = send(spec)
    if retried or not answer or answer.status ~= 401 or not self.auth:refresh(call.operation) then
      return answer, failure
    end
    if answer.close then answer:close() end
    retried = true
  end
end

--- Whether a 404 is the API server not serving the path (its bare "could not find the
-- requested resource", or a page), rather than an object it serves being absent (a Status
-- whose details name it).
local function unserved(answer)
  local st = answer.json
  local details = st and st.kind == "Status" and type(st.details) == "table" and st.details
  return answer.status == 404 and not (details and details.name ~= nil)
end

--- The error for a call to an agent-sandbox path the API server does not serve, saying what
-- its discovery document shows: an agent-sandbox older than the floor, or none.
function client_mt:unserved_error(call, answer)
  local group = self:call{ operation = call.operation, verb = "get", resource = "apigroups",
    name = "extensions.agents.x-k8s.io", method = "GET", path = api.EXTENSIONS_GROUP, absent_on_404 = true,
    discovery = true }
  local served = {}
  for _, v in ipairs(type(group) == "table" and type(group.versions) == "table" and group.versions or {}) do
    if type(v) == "table" and type(v.version) == "string" then served[#served + 1] = v.version end
  end
  local found = #served > 0 and ("serves extensions.agents.x-k8s.io " .. table.concat(served, ", ")
    .. " but not v1beta1: agent-sandbox is older than " .. api.AGENT_SANDBOX_FLOOR)
    or "serves no extensions.agents.x-k8s.io API group: agent-sandbox (its extensions) is not installed"
  return errors.new("INVALID_INPUT", { operation = call.operation, status = 404,
    message = string.format("%s: the API server %s; sandkit needs agent-sandbox %s or later, where "
      .. "v1beta1 first appears (Kubernetes answered 404 to %s: %s)", call.operation, found,
      api.AGENT_SANDBOX_FLOOR, what(call), said(answer)) })
end

--- One whole call: its decoded JSON answer ({} for an empty body), nil when absent_on_404 and
-- the answer was 404 naming the object, or nil and an error.
function client_mt:call(call)
  local deadline = wait.now() + (call.timeout or self.timeout)
  local answer, failure, err = self:authenticated(call, http.exchange, { deadline = deadline,
    max_body = call.max_body })
  if err then return nil, err end
  if not answer then
    return nil, unanswered(call, failure, call.timeout or self.timeout, call.max_body or http.MAX_EXCHANGE_BODY)
  end
  if unserved(answer) and not call.discovery and call.path:find("^/apis/") then
    return nil, self:unserved_error(call, answer)
  end
  if answer.status == 404 and call.absent_on_404 then return nil end
  if answer.status < 200 or answer.status >= 300 then return nil, api.refusal(call, answer) end
  if answer.body == "" then return {} end
  if not answer.json then
    return nil, errors.unexpected(call.operation, "body", "the API server's answer to "
      .. what(call) .. " is not a JSON object")
  end
  return answer.json
end

--- A streamed call (a watch): the response once its headers are in and the status is 2xx,
-- or nil and an error (the answer read and classified).
function client_mt:watch(call)
  local bound = math.min(self.timeout, call.deadline - wait.now())
  local answer, failure, err = self:authenticated(call, http.send, { header_deadline = wait.now() + bound,
    max_error_body = MAX_WATCH_ERROR })
  if err then return nil, err end
  if not answer then return nil, unanswered(call, failure, bound, MAX_WATCH_ERROR) end
  if answer.status >= 200 and answer.status < 300 then return answer end
  local headers = answer:headers()
  local body = answer:read_all(math.min(call.deadline, wait.now() + self.timeout)) or ""
  local decoded = json.decode(body)
  local whole = { status = answer.status, headers = headers, body = body,
    json = type(decoded) == "table" and decoded or nil }
  if unserved(whole) then return nil, self:unserved_error(call, whole) end
  return nil, api.refusal(call, whole)
end

--- A protocol target (protocol.lua) for a request through the API server, to `path` on the
-- server, with the current credential and `headers` added.
function client_mt:target(path, headers, operation)
  local spec, err = self:request_spec(operation, nil, path, headers)
  if not spec then return nil, err end
  return { url = spec.url, headers = spec.headers, ca_pem = spec.ca_pem,
    tls_server_name = spec.tls_server_name, client_cert_pem = spec.client_cert_pem,
    client_key_pem = spec.client_key_pem }
end

api.escape = escape

return api
