--- The `aws` provider: each session is one Lambda MicroVM started from this sandbox's image,
-- with sandkit-agent answering inside it on port 8971 behind AWS's endpoint proxy.
--
--   sandkit.sandbox{ provider = "aws", region = "us-east-2",
--     image = "arn:aws:lambda:…:microvm-image:…", image_version = "3",
--     egress_connectors = {}, preview_ports = {}, idle_suspend_seconds = nil,
--     max_lifetime_seconds = nil, endpoint = nil, ca_file = nil, api_timeout = 30,
--     credentials = nil, access_key_id = nil, secret_access_key = nil, session_token = nil,
--     header_timeout = 60, grace = 60, command_timeout = nil,
--     ready_timeout = 60, ready_interval = 0.5 }
--
-- Authorization is AWS's: a request reaches a MicroVM's agent only with a header map minted by
-- CreateMicrovmAuthToken for that MicroVM and port, plus `X-aws-proxy-port` naming the port.
-- One MicroVM is one session, so that scope is exactly a session's.
--
-- Ownership is the image: a session is this sandbox's when GetMicrovm reports `imageArn` equal
-- to `image`. IAM cannot draw that line (the mint is granted for every image of a stack), so
-- every operation on a session reads its record first. A record naming another image, or none,
-- is not ours: `get` reads it as absent, everything else refuses it.
--
-- docs/aws.md describes the options and every refusal. Its parts: agent_endpoint.lua (the way
-- to a MicroVM's agent through AWS's proxy), microvms.lua (the control-plane client), sigv4.lua
-- (the request signer).

local errors = require "sandkit.errors"
local json = require "sandkit.json"
local microvms = require "sandkit.providers.aws.microvms"
local options_check = require "sandkit.options"
local agent_endpoint = require "sandkit.providers.aws.agent_endpoint"

local aws = {}

--- The sandbox options this provider takes besides the common ones (sandkit.sandbox), and the
-- create options besides id and env (tenant_key is known so that it is refused with a reason).
aws.OPTIONS = options_check.set{ "region", "image", "image_version", "egress_connectors",
  "preview_ports", "idle_suspend_seconds", "max_lifetime_seconds", "endpoint", "ca_file",
  "api_timeout", "credentials", "access_key_id", "secret_access_key", "session_token",
  "ready_timeout", "ready_interval", "allow_loopback_http" }
aws.CREATE_OPTIONS = options_check.set{ "tenant_key" }
--- A session id is its MicroVM's.
aws.ID = microvms.ID

--- Where sandkit-agent listens inside a MicroVM, the header AWS's proxy reads to pick the port,
-- and the life of the token minted for each agent request (agent_endpoint.lua).
aws.AGENT_PORT = agent_endpoint.AGENT_PORT
aws.PROXY_PORT_HEADER = agent_endpoint.PROXY_PORT_HEADER
aws.AGENT_TOKEN_MINUTES = agent_endpoint.AGENT_TOKEN_MINUTES
--- Life of a preview token handed to a caller: long enough for a person to use a preview,
-- and half of what AWS mints at most.
aws.PREVIEW_TOKEN_MINUTES = 30
--- The longest `maximumDurationInSeconds` RunMicrovm accepts (eight hours).
aws.MAX_LIFETIME_SECONDS = 28800
--- How long create waits for a MicroVM to become servable. AWS's proxy answers 502 for the
-- first seconds after a run while the snapshot restores; a minute reads a slow restore as
-- slow rather than broken.
aws.READY_TIMEOUT = 60
--- Between readiness polls: a restore takes seconds, so polling faster only spends calls.
aws.READY_INTERVAL = 0.5

--- What a caller is told a preview token is good for: never more than AWS will mint, so a
-- caller is never promised more life than the token has.
function aws.preview_lifetime_seconds()
  return math.min(aws.PREVIEW_TOKEN_MINUTES, microvms.MAX_AUTH_TOKEN_MINUTES) * 60
end

local provider_mt = {}
provider_mt.__index = provider_mt
for name, method in pairs(agent_endpoint.methods) do provider_mt[name] = method end

local STATES = {
  RUNNING = "running",
  SUSPENDED = "paused",
  TERMINATED = "terminated",
  TERMINATING = "terminated",
}

--- Any other state is a MicroVM on its way up: reporting it running would invite commands
-- to something that cannot answer yet.
local function session_state(aws_state)
  return STATES[aws_state] or "starting"
end

local to_integer = json.integer

local function check_options(options)
  local function bad(field, details)
    return errors.invalid_input("sandbox.create", field, details)
  end
  if type(options.image) ~= "string" or options.image == "" then
    return bad("image", "the aws provider needs image, the ARN of the MicroVM image "
      .. "(GetMicrovm's imageArn is compared with it to tell this sandbox's sessions)")
  end
  local version = options.image_version
  if to_integer(version) then version = tostring(to_integer(version)) end
  if type(version) ~= "string" or version == "" then
    return bad("image_version", "the aws provider needs image_version, the version to run")
  end
  local egress = options.egress_connectors or {}
  if type(egress) ~= "table" then return bad("egress_connectors", "egress_connectors is a list of ARNs") end
  for i = 1, #egress do
    if type(egress[i]) ~= "string" or egress[i] == "" then
      return bad("egress_connectors", "egress_connectors is a list of ARNs")
    end
  end
  local ports = options.preview_ports or {}
  if type(ports) ~= "table" then return bad("preview_ports", "preview_ports is a list of ports") end
  local port_set = {}
  for i = 1, #ports do
    local port = ports[i]
    if not options_check.is("port", port) then
      return bad("preview_ports", "preview_ports is a list of port numbers 1-65535")
    end
    if port == aws.AGENT_PORT then
      -- The agent behind the proxy checks no token of its own: a preview of its port would
      -- hand whoever holds it every command and file of the session.
      return bad("preview_ports", "port 8971 is the agent's and cannot be previewed")
    end
    port_set[to_integer(port)] = true
  end
  local _, refused = options_check.each(options_check.whole_seconds, "sandbox.create", options,
    { "idle_suspend_seconds", "max_lifetime_seconds" })
  if refused then return refused end
  if options.max_lifetime_seconds and options.max_lifetime_seconds > aws.MAX_LIFETIME_SECONDS then
    return bad("max_lifetime_seconds", "max_lifetime_seconds is at most 28800: Lambda runs a "
      .. "MicroVM for eight hours at most")
  end
  local times
  times, refused = options_check.each(options_check.seconds, "sandbox.create", options,
    { "ready_timeout", "ready_interval", "api_timeout" },
    { ready_timeout = aws.READY_TIMEOUT, ready_interval = aws.READY_INTERVAL })
  if refused then return refused end
  return nil, version, egress, ports, port_set, times
end

local REFUSALS = {
  list = "enumerating MicroVMs would need an account-wide lambda:ListMicrovms grant; reach a "
    .. "session whose id you hold with get, and Lambda terminates one nobody reaches",
  snapshot = "Lambda MicroVMs expose no snapshot API",
  -- A MicroVM's maximumDurationInSeconds is fixed by RunMicrovm, and GetMicrovm reports no
  -- end: expires_at is nil here.
  set_lifetime = "a MicroVM's maximum duration is fixed when it starts (max_lifetime_seconds)",
  labels = "RunMicrovm keeps no labels, and without a listing nothing could select by them",
}

function aws.new(options)
  local refused, version, egress, ports, port_set, times = check_options(options)
  if refused then return nil, refused end
  local client, err = microvms.new{ region = options.region, endpoint = options.endpoint,
    ca_file = options.ca_file, timeout = options.api_timeout, credentials = options.credentials,
    access_key_id = options.access_key_id, secret_access_key = options.secret_access_key,
    session_token = options.session_token }
  if not client then return nil, err end
  local preview_ports = {}
  for i = 1, #ports do preview_ports[i] = to_integer(ports[i]) end
  table.sort(preview_ports)
  return setmetatable({
    name = "aws",
    refusals = REFUSALS,
    options = options,
    client = client,
    image = options.image,
    image_version = version,
    egress = egress,
    preview_ports = preview_ports,
    preview_port_set = port_set,
    idle_suspend_seconds = options.idle_suspend_seconds,
    max_lifetime_seconds = options.max_lifetime_seconds,
    ready_timeout = times.ready_timeout,
    ready_interval = times.ready_interval,
  }, provider_mt)
end

--- `preview` is offered only when ports were declared: preview() would refuse every port
-- otherwise, and callers branch on this flag rather than call and fail.
function provider_mt:capabilities()
  return { files = true, jobs = true, reconnect = true, pause_resume = true, fs = true, watch = true,
    stdin = true, pty = true, preview = #self.preview_ports > 0, list = false, snapshot = false,
    set_lifetime = false, labels = false }
end

-- Errors -------------------------------------------------------------------------------------

--- Refused rather than dropped: RunMicrovm has nowhere to put either, and a session-level
-- value that silently never applies is worse than no session.
local function refuse_session_fields(opts, operation)
  if opts.env ~= nil and (type(opts.env) ~= "table" or next(opts.env) ~= nil) then
    return errors.not_supported(operation,
      "AWS sandboxes take no session-level env; set env per command instead")
  end
  if opts.tenant_key ~= nil then
    return errors.not_supported(operation,
      "AWS sandboxes take no tenant_key; a MicroVM is already single-tenant")
  end
end

-- Records and ownership ---------------------------------------------------------------------

function provider_mt:owns(vm)
  return vm.image_arn ~= nil and vm.image_arn == self.image
end

--- The session's record if it exists, ours or not (nil when absent).
function provider_mt:fetch(id, operation)
  local vm, err = self.client:get(id)
  if err then return nil, errors.wrap(operation, "could not read session '" .. id .. "'", err) end
  return vm
end

--- The session's record if it exists and is ours; absent and foreign are both nil.
function provider_mt:owned(id, operation)
  local vm, err = self:fetch(id, operation)
  if err then return nil, err end
  if vm and self:owns(vm) then return vm end
  return nil
end

function provider_mt:ensure_owned(id, operation)
  local vm, err = self:owned(id, operation)
  if err then return nil, err end
  if not vm then return nil, errors.not_ours(operation, id) end
  return vm
end

local function session_record(id, vm, state)
  return { id = id, state = state or session_state(vm.state), generation = 1,
    endpoint = vm.endpoint, image_version = vm.image_version }
end

--- The record of a session whose agent answered `health`.
local function servable_record(id, vm, health)
  local record = session_record(id, vm, "running")
  record.features = health.features
  record.boot_id = health.bootId
  return record
end

-- Lifecycle ---------------------------------------------------------------------------------

--- Starts a MicroVM and returns once it can serve.
--
-- The client token is fresh per call and never the caller's id: AWS hands back the MicroVM a
-- token created before even after it was terminated, so a reused id would return a dead
-- MicroVM and wait for it for ever. Reaching an existing session is `get`'s job.
function provider_mt:create(opts)
  local refusal = refuse_session_fields(opts, "sandbox.create")
  if refusal then return nil, refusal end
  local vm, err = self.client:run{
    image_identifier = self.image,
    image_version = self.image_version,
    client_token = microvms.client_token(),
    -- No execution role, ever: a session would read its credentials from instance metadata,
    -- which the egress connectors do not govern.
    egress_network_connectors = self.egress,
    max_idle_duration_seconds = self.idle_suspend_seconds,
    maximum_duration_seconds = self.max_lifetime_seconds,
  }
  if not vm then
    return nil, errors.wrap("sandbox.create", "could not start a MicroVM from '" .. self.image .. "'", err)
  end
  local id = vm.id
  if not id then
    return nil, errors.unexpected("sandbox.create", "microvmId", "RunMicrovm returned no MicroVM id")
  end
  local ready, health = self:wait_until_servable(id, "sandbox.create")
  if not ready then
    local failure = health
    -- The caller never learns this id, so nothing else could terminate it: left running, it
    -- would bill until its lifetime ceiling, once per retried create.
    local gone, cleanup = self.client:terminate(id)
    if not gone and cleanup then
      failure.message = failure.message .. "; terminating MicroVM '" .. id .. "' failed too ("
        .. cleanup.message .. "), so it runs until Lambda reaps it"
    end
    return nil, failure
  end
  return servable_record(id, ready, health)
end

function provider_mt:get(id)
  local vm, err = self:owned(id, "sandbox.get")
  if err then return nil, err end
  if not vm then return nil end
  -- Echoing the caller's id when the answer carried none would report a record that could
  -- not be read as one that was.
  if not vm.id then
    return nil, errors.unreachable("sandbox.get", "the record for session '" .. id .. "' carried no id")
  end
  return session_record(vm.id, vm)
end

--- Reaching a session someone else started must mean what create means, or the promise holds
-- only for whoever won the race: a starting session is waited for here (not in get, which
-- reports a state and promises none).
function provider_mt:serve(record, operation)
  if record.state ~= "starting" then return record end
  local ready, health = self:wait_until_servable(record.id, operation)
  if not ready then return nil, health end
  return servable_record(record.id, ready, health)
end

--- What create refuses, get_or_create refuses before it looks: an existing session honours
-- env and tenant_key no more than a fresh one would.
function provider_mt:check_create(opts, operation)
  return refuse_session_fields(opts, operation)
end

--- Not offered: enumerating would need lambda:ListMicrovms, which AWS grants on no resource,
-- so only account-wide. What it would serve — a MicroVM whose RunMicrovm answer was lost —
-- Lambda reaps already: with no traffic it is suspended after the idle time, then terminated.

function provider_mt:list()
  return nil, errors.not_supported("sandbox.list", REFUSALS.list)
end

--- Idempotent: a session AWS already reaped is terminated. Absent and foreign part ways here
-- alone — every other operation needs the session to exist, so for them the two are one.
function provider_mt:terminate(id)
  local vm, err = self:fetch(id, "sandbox.terminate")
  if err then return nil, err end
  if not vm then return true end
  if not self:owns(vm) then return nil, errors.not_ours("sandbox.terminate", id) end
  local _, terr = self.client:terminate(id)
  if terr then
    return nil, errors.wrap("sandbox.terminate", "could not terminate MicroVM '" .. id .. "'", terr)
  end
  return true
end

local function transition(self, record, operation, call, verb)
  local id = record.id
  local vm, err = self:ensure_owned(id, operation)
  if not vm then return nil, err end
  local done
  done, err = self.client[call](self.client, id)
  if err then return nil, errors.wrap(operation, "could not " .. verb .. " MicroVM '" .. id .. "'", err) end
  if not done then return nil, errors.unreachable(operation, "MicroVM '" .. id .. "' no longer exists") end
  return true
end

--- Asynchronous at AWS: the MicroVM is suspending when this returns.
function provider_mt:pause(record)
  return transition(self, record, "sandbox.pause", "suspend", "suspend")
end

function provider_mt:resume(record)
  return transition(self, record, "sandbox.resume", "resume", "resume")
end

function provider_mt:snapshot()
  return nil, errors.not_supported("sandbox.snapshot", REFUSALS.snapshot)
end

--- A capability to reach one declared port of the session: the endpoint together with the
-- token headers and the port header, since the endpoint refuses anything without them and a
-- caller handed a bare URL would have to build the authorization itself.
function provider_mt:preview(record, port)
  -- The declared list is the only bound on ingress here: the mint grants whatever port it is
  -- asked for. So an undeclared port is refused before any call.
  if not self.preview_port_set[port] then
    return nil, errors.not_supported("sandbox.preview", string.format(
      "port %d is not one of this sandbox's declared preview ports (%s); a token for it "
      .. "would grant ingress the sandbox never declared", port, table.concat(self.preview_ports, ", ")))
  end
  local id = record.id
  local vm, err = self:ensure_owned(id, "sandbox.preview")
  if not vm then return nil, err end
  local base
  base, err = self:endpoint_url(id, vm, "sandbox.preview")
  if not base then return nil, err end
  local headers
  headers, err = self:mint(id, port, aws.PREVIEW_TOKEN_MINUTES, "sandbox.preview",
    "could not mint a preview token for port " .. port)
  if not headers then return nil, err end
  return { endpoint = base, headers = headers, allowed_ports = { port },
    expires_in = aws.preview_lifetime_seconds() }
end

return aws
