--- The Azure Container Apps sandbox data plane, over REST: the calls the azure provider makes
-- (docs/azure.md), each one whole request and answer.
--
--   local dataplane = require "sandkit.providers.azure.dataplane"
--   local dp = assert(dataplane.new{
--     subscription = "…", resource_group = "…",
--     region = "eastus2",              -- or endpoint = "https://management.eastus2.azuredevcompute.io"
--     token = "<Entra access token>",  -- or a function(scope) -> token | nil, err, called per request
--     api_version = "2026-02-01-preview", timeout = 30, ca_file = nil, proxy = nil,
--   })
--
-- Every method returns a value, or nil when the data plane answered 404 (absent), or nil and an
-- error. Calls that may start something — create, executeShellCommand, stop, resume — are sent
-- exactly once on a fresh connection: a lost answer plus a resend could orphan a sandbox or run
-- a command twice, so an unanswered one is SANDBOX_OUTCOME_UNKNOWN.

local core = require "sandkit.core"
local json_codec = require "sandkit.json"
local errors = require "sandkit.errors"
local http = require "sandkit.http"
local options_check = require "sandkit.options"

local dataplane = {}

dataplane.API_VERSION = "2026-02-01-preview"
--- The Entra scope data-plane tokens are minted for: not ARM, and not the endpoint's host.
dataplane.SCOPE = "https://dynamicsessions.io/.default"
dataplane.MAX_FILE_BYTES = 32 * 1024 * 1024
--- Seconds one call may take when the caller gives no bound of its own.
dataplane.DEFAULT_TIMEOUT = 30
--- A command's captured output comes back in one JSON answer; past this it is not read.
local MAX_EXECUTE_BODY = 16 * 1024 * 1024
--- Characters of the data plane's own error text an error message carries.
local MAX_SERVICE_TEXT = 300
local CONNECT_TIMEOUT = 10

local client_mt = {}
client_mt.__index = client_mt

--- Percent-encodes everything but unreserved characters (and '/', where a query value keeps it).
local function escape(s, keep_slash)
  local pattern = keep_slash and "[^%w%-%._~/]" or "[^%w%-%._~]"
  return (s:gsub(pattern, function(c) return string.format("%%%02X", c:byte()) end))
end

--- A path segment must stay one segment: nothing that could turn the request into one for
-- another path.
local function segment(value)
  return type(value) == "string" and value:match("^[%w%-_%.]+$") ~= nil
    and value ~= "." and value ~= ".."
end

--- What a sandbox id is: one path segment, as long as an Azure resource name may be.
dataplane.ID = { max = 260, pattern = "^[%w%-_%.]+$", valid = segment,
  what = "a sandbox id is 1 to 260 of letters, digits, '-', '_', '.'" }

function dataplane.new(options)
  if type(options) ~= "table" then error("sandkit: dataplane.new takes an options table", 2) end
  for _, name in ipairs{ "subscription", "resource_group" } do
    if not segment(options[name]) then
      return nil, errors.invalid_input("sandkit.sandbox", name,
        "the Azure data plane needs " .. name .. " (letters, digits, '-', '_', '.')")
    end
  end
  local endpoint = options.endpoint
  if endpoint == nil and options.region ~= nil then
    if not segment(options.region) then
      return nil, errors.invalid_input("sandkit.sandbox", "region", "region is a name such as eastus2")
    end
    endpoint = "https://management." .. options.region .. ".azuredevcompute.io"
  end
  if type(endpoint) ~= "string" or not endpoint:match("^https?://[^/?#@%s]+/*$") then
    return nil, errors.invalid_input("sandkit.sandbox", "endpoint",
      "the Azure data plane needs region, or endpoint = \"https://host\"")
  end
  local token = options.token
  if type(token) ~= "string" and type(token) ~= "function" then
    return nil, errors.invalid_input("sandkit.sandbox", "token",
      "the Azure data plane needs token: an Entra token for " .. dataplane.SCOPE
        .. ", or a function(scope) returning one")
  end
  local timeout, bad = options_check.seconds("sandkit.sandbox", options, "timeout", dataplane.DEFAULT_TIMEOUT)
  if bad then return nil, bad end
  local api_version = options.api_version or dataplane.API_VERSION
  if type(api_version) ~= "string" or not api_version:match("^[%w%-%.]+$") then
    return nil, errors.invalid_input("sandkit.sandbox", "api_version", "api_version is a version such as "
      .. dataplane.API_VERSION)
  end
  return setmetatable({
    endpoint = endpoint:gsub("/+$", ""),
    prefix = "/subscriptions/" .. options.subscription .. "/resourceGroups/" .. options.resource_group
      .. "/sandboxGroups/",
    token = token,
    timeout = timeout,
    api_version = api_version,
    ca_file = options.ca_file,
    proxy = options.proxy,
  }, client_mt)
end

function client_mt:bearer(operation)
  if type(self.token) == "string" then return self.token end
  local ok, token, err = pcall(self.token, dataplane.SCOPE)
  if ok and type(token) == "string" and token ~= "" then return token end
  if not ok then err = token end
  if errors.is_error(err) then return nil, err end
  -- The token source may name an identity or a secret store: kept out of tenant-facing text.
  return nil, errors.new("SANDBOX_UNREACHABLE", { operation = operation, internal = true,
    message = operation .. ": no Entra token for " .. dataplane.SCOPE .. ": " .. tostring(err) })
end

--- The data plane's own words about a failure: its JSON error's message, else the body,
-- clipped and on one line.
local function service_text(resp)
  local json, text = resp.json, nil
  if json then
    local e = type(json.error) == "table" and json.error or json
    for _, key in ipairs{ "message", "Message", "detail", "title" } do
      if type(e[key]) == "string" then text = e[key] break end
    end
  end
  text = (text or resp.body or ""):gsub("[%c]+", " ")
  if #text > MAX_SERVICE_TEXT then text = text:sub(1, MAX_SERVICE_TEXT) .. "…" end
  return text
end

--- Who answers, as the transport failures' wording names it.
local PEER = "the Azure data plane"

--- The one place a data-plane answer is classified.
local function refusal(call, resp)
  local status = resp.status
  local text = service_text(resp)
  if status == 429 then
    return errors.new("RATE_LIMIT_EXCEEDED", { operation = call.operation, status = status,
      retry_after = errors.retry_after(resp.headers["retry-after"]),
      message = call.operation .. ": the Azure data plane is rate limiting: " .. text })
  end
  if status >= 500 then
    return errors.unanswered(call.operation, string.format("%s answered %d: %s", PEER, status, text),
      { status = status, sent = true }, call.once == true)
  end
  -- 401 and 403 texts name principals and role assignments.
  return errors.command_failed("operationFailed",
    string.format("%s: the Azure data plane refused it with %d: %s", call.operation, status, text),
    { operation = call.operation, status = status, internal = status == 401 or status == 403 })
end

--- Sends one call. Returns the answer for a 2xx, nil for a 404, or nil and an error.
-- call: operation, method, group, id (a sandbox's, when the call is on one), path (below the
--       group, or below the sandbox), query, json | body + content_type, once, timeout, max_body.
function client_mt:send(call)
  if not segment(call.group) then
    return nil, errors.invalid_input(call.operation, "group", "a sandbox group is letters, digits, '-', '_', '.'")
  end
  local path = call.path
  if call.id ~= nil then
    local bad = options_check.id(call.operation, call.id, dataplane.ID)
    if bad then return nil, bad end
    path = "/sandboxes/" .. call.id .. (path or "")
  end
  local token, err = self:bearer(call.operation)
  if not token then return nil, err end
  local url = self.endpoint .. self.prefix .. call.group .. path .. "?api-version=" .. self.api_version
  for _, pair in ipairs(call.query or {}) do
    url = url .. "&" .. pair[1] .. "=" .. escape(pair[2], true)
  end
  local headers = { Authorization = "Bearer " .. token, Accept = "application/json" }
  local body = call.body
  if call.json then
    body = json_codec.encode(call.json)
    headers["Content-Type"] = "application/json"
  elseif body then
    headers["Content-Type"] = call.content_type
  end
  local timeout = call.timeout or self.timeout
  local resp, failure = http.exchange{
    method = call.method, url = url, headers = headers, body = body,
    fresh_connect = call.once, ca_file = self.ca_file, proxy = self.proxy,
    connect_timeout = math.min(CONNECT_TIMEOUT, timeout),
    deadline = core.now() + timeout, max_body = call.max_body,
  }
  if not resp then
    return nil, errors.transport_failure(call.operation, failure, call.once == true,
      { peer = PEER, seconds = timeout, bytes = call.max_body or http.MAX_EXCHANGE_BODY })
  end
  if resp.status >= 200 and resp.status < 300 then return resp end
  if resp.status == 404 then return nil end
  return nil, refusal(call, resp)
end

--- A sandbox as the provider reads it. Label values are kept whatever their type, so a
-- malformed transport label is refused rather than read as absent.
local function to_record(json)
  if type(json) ~= "table" or type(json.id) ~= "string" or json.id == "" then return nil end
  local labels = {}
  if type(json.labels) == "table" then
    for k, v in pairs(json.labels) do
      if type(k) == "string" then labels[k] = v end
    end
  end
  return {
    id = json.id,
    state = type(json.state) == "string" and json.state or nil,
    labels = labels,
    egress_policy = type(json.egressPolicy) == "table" and json.egressPolicy or nil,
    ports = type(json.ports) == "table" and json.ports or nil,
  }
end

local function record_answer(operation, resp)
  local record = to_record(resp.json)
  if not record then
    return nil, errors.unexpected(operation, "sandbox", "the answer is not a sandbox with an id")
  end
  return record
end

function client_mt:get_sandbox(group, id)
  local op = "azure.getSandbox"
  local resp, err = self:send{ operation = op, method = "GET", group = group, id = id }
  if not resp then return nil, err end
  return record_answer(op, resp)
end

--- spec: image, cpu, memory, egress_policy, labels, environment, auto_suspend (idle seconds).
function client_mt:create_sandbox(group, spec)
  local op = "azure.createSandbox"
  local body = {
    sourcesRef = { diskImage = { name = spec.image, isPublic = true } },
    resources = { cpu = spec.cpu, memory = spec.memory },
    egressPolicy = spec.egress_policy,
  }
  if spec.labels and next(spec.labels) then body.labels = spec.labels end
  if spec.environment and next(spec.environment) then body.environment = spec.environment end
  if spec.auto_suspend then
    body.lifecycle = { autoSuspendPolicy = { enabled = true, interval = spec.auto_suspend, mode = "Memory" } }
  end
  local resp, err = self:send{ operation = op, method = "PUT", group = group, path = "/sandboxes",
    json = body, once = true }
  if not resp then
    if err then return nil, err end
    return nil, errors.command_failed("operationFailed", op .. ": the sandbox group " .. group
      .. " does not exist", { operation = op, status = 404 })
  end
  local record = to_record(resp.json)
  if not record then
    -- A sandbox may now exist whose id nobody learned.
    return nil, errors.new("SANDBOX_OUTCOME_UNKNOWN", { operation = op,
      message = op .. " did not report its outcome and may have taken effect: the answer named no sandbox",
      cause = errors.unexpected(op, "id", "missing from the answer") })
  end
  return record
end

local function simple(self, op, method, group, id, suffix, once)
  local resp, err = self:send{ operation = op, method = method, group = group, id = id,
    path = suffix, json = method == "POST" and {} or nil, once = once }
  if not resp then return nil, err end
  return true
end

--- Starts the deletion; the sandbox reads as present until it is gone.
function client_mt:delete_sandbox(group, id)
  return simple(self, "azure.deleteSandbox", "DELETE", group, id)
end

function client_mt:stop_sandbox(group, id)
  return simple(self, "azure.stopSandbox", "POST", group, id, "/stop", true)
end

function client_mt:resume_sandbox(group, id)
  return simple(self, "azure.resumeSandbox", "POST", group, id, "/resume", true)
end

local integer = json_codec.integer

local function port_url(ports, port)
  if type(ports) ~= "table" then return nil end
  for _, p in ipairs(ports) do
    if type(p) == "table" and integer(p.port) == port and type(p.url) == "string" then
      return p.url
    end
  end
end

--- The URL the data plane's proxy serves `port` at. A port not yet exposed is added, without
-- proxy authentication: the agent behind it checks its own per-boot credential.
function client_mt:agent_port_url(group, id, port)
  local op = "azure.agentPortUrl"
  local record, err = self:get_sandbox(group, id)
  if not record then return nil, err end
  local url = port_url(record.ports, port)
  if url then return url end
  local resp
  resp, err = self:send{ operation = op, method = "POST", group = group,
    id = id, path = "/ports/add", json = { port = port, auth = { anonymous = true } } }
  if not resp then return nil, err end
  url = port_url(resp.json and resp.json.ports, port)
  if url then return url end
  -- The answer may carry no ports; the sandbox itself says where the port went.
  record, err = self:get_sandbox(group, id)
  if not record then return nil, err end
  url = port_url(record.ports, port)
  if url then return url end
  return nil, errors.unreachable(op, "port " .. port .. " of sandbox " .. id .. " has no address yet")
end

function client_mt:read_file(group, id, path)
  local op = "azure.readFile"
  local resp, err = self:send{ operation = op, method = "GET", group = group,
    id = id, path = "/files", query = { { "path", path } },
    max_body = dataplane.MAX_FILE_BYTES }
  if not resp then return nil, err end
  return resp.body
end

function client_mt:write_file(group, id, path, bytes)
  local op = "azure.writeFile"
  if #bytes > dataplane.MAX_FILE_BYTES then
    return nil, errors.invalid_input(op, "files", path .. " is larger than the 33554432-byte file limit")
  end
  local resp, err = self:send{ operation = op, method = "PUT", group = group,
    id = id, path = "/files", query = { { "path", path }, { "createDirs", "true" } },
    body = bytes, content_type = "application/octet-stream" }
  if not resp then return nil, err end
  return true
end

function client_mt:mkdir(group, id, path)
  local op = "azure.mkdir"
  local resp, err = self:send{ operation = op, method = "POST", group = group,
    id = id, path = "/files/mkdir", json = { path = path } }
  if not resp then return nil, err end
  return true
end

--- Runs a shell command string: { stdout =, stderr =, exit_code = <integer or nil> }.
-- opts.timeout (seconds) bounds the whole call; the data plane itself has no timeout field.
function client_mt:execute_shell_command(group, id, command, working_directory, opts)
  local op = "azure.executeShellCommand"
  local call = { operation = op, method = "POST", group = group,
    id = id, path = "/executeShellCommand",
    json = { command = command, workingDirectory = working_directory }, once = true,
    timeout = opts and opts.timeout, max_body = MAX_EXECUTE_BODY }
  local resp, err = self:send(call)
  if not resp then return nil, err end
  local json = resp.json
  if not json or (json.stdout ~= nil and type(json.stdout) ~= "string")
      or (json.stderr ~= nil and type(json.stderr) ~= "string") then
    -- The command ran; what it did cannot be read.
    return nil, errors.unanswered(op, "the answer is not the command's output",
      { status = resp.status, sent = true }, true)
  end
  return { stdout = json.stdout or "", stderr = json.stderr or "",
    exit_code = integer(json.exitCode) }
end

return dataplane
