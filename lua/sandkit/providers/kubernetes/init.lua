--- The `kubernetes` provider: each session is a SandboxClaim of kubernetes-sigs/agent-sandbox,
-- bound to a pod of a warm pool whose sandkit-agent runs in capability mode; every request to
-- it carries an Ed25519 capability for that pod's UID. docs/kubernetes.md has the setup.
--
--   sandkit.sandbox{ provider = "kubernetes",
--     warm_pool = "py-pool",         -- required: the SandboxWarmPool claims name
--     namespace = nil,               -- default: the kubeconfig context's, else "default"
--     kubeconfig = nil, context = nil, service_account_dir = nil,
--     signing_key = "key.pem",       -- required: Ed25519 private key, PKCS#8 PEM
--     key_id = "k1",                 -- required: the key's id in the agents' key ring
--     transport = "direct",          -- "direct" | "apiserver" | "router"
--     router_url = nil, router_token = nil, agent_port = 8971,
--     lifetime = 3600,               -- seconds: the claim's shutdownTime, policy Delete (a
--                                    -- create{ lifetime = S } sets one claim's own)
--     ready_timeout = 180, ready_interval = 0.5, capability_lifetime = 300, api_timeout = 30,
--     header_timeout, grace, error_body_timeout, body_timeout, connect_timeout, command_timeout }
--
-- Ownership: a claim is this sandbox's when it carries app.kubernetes.io/managed-by=sandkit
-- and names this warm pool; its Sandbox (status.sandbox.name) must have the claim as its
-- controller, and the pod the Sandbox. A session whose chain does not hold is not ours: `get`
-- reads it as absent, `list` leaves it out, `terminate` refuses it, and nothing is ever sent
-- to its pod.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"
local wait = require "sandkit.wait"
local api = require "sandkit.providers.kubernetes.api"
local capability = require "sandkit.providers.kubernetes.capability"
local kubeconfig = require "sandkit.providers.kubernetes.kubeconfig"
local time = require "sandkit.time"
local watch = require "sandkit.providers.kubernetes.watch"

local kubernetes = {}

--- Every sandbox option this provider takes, besides `provider` and the common timeouts.
kubernetes.OPTIONS = { warm_pool = true, namespace = true, kubeconfig = true, context = true,
  service_account_dir = true, signing_key = true, key_id = true, transport = true,
  router_url = true, router_token = true, agent_port = true, lifetime = true,
  ready_timeout = true, ready_interval = true, capability_lifetime = true, api_timeout = true }

--- Options `create{}` takes besides id and env: a claim's own lifetime, in seconds.
kubernetes.CREATE_OPTIONS = { lifetime = true }
--- 9999-12-31T23:59:59Z, the last time RFC 3339 (a claim's shutdownTime) can write.
local LAST_SHUTDOWN_TIME = 253402300799

--- The options the `sandkit` command takes as flags, before or after the command (--provider
-- kubernetes). A secret comes from a file (`secret_file`): argv is readable by everyone (`ps`).
kubernetes.CLI_OPTIONS = {
  { flag = "warm-pool", arg = "POOL", option = "warm_pool", help = "the SandboxWarmPool claims draw from" },
  { flag = "namespace", arg = "NS", option = "namespace",
    help = "where claims are made (default: the kubeconfig context's, else default)" },
  { flag = "kubeconfig", arg = "FILE", option = "kubeconfig",
    help = "a kubeconfig (default $KUBECONFIG, ~/.kube/config, else in-cluster)" },
  { flag = "context", arg = "NAME", option = "context", help = "the kubeconfig context (default current-context)" },
  { flag = "signing-key", arg = "FILE", option = "signing_key", help = "the Ed25519 private key, PKCS#8 PEM" },
  { flag = "key-id", arg = "ID", option = "key_id", help = "the signing key's id in the agents' key ring" },
  { flag = "transport", arg = "direct|apiserver|router", option = "transport",
    help = "how requests reach the pod's agent (default direct)" },
  { flag = "router-url", arg = "URL", option = "router_url", help = "agent-sandbox's router, for --transport router" },
  { flag = "router-token-file", arg = "FILE", option = "router_token", secret_file = true,
    help = "a file holding the router's bearer token (its ROUTER_AUTH_TOKEN)" },
  { flag = "agent-port", arg = "PORT", option = "agent_port", convert = options_check.flag.port,
    help = "the agent's port in the pod (default 8971)" },
  { flag = "lifetime", arg = "S", option = "lifetime", convert = options_check.flag.whole_seconds,
    help = "seconds a claim lives (default 3600); after create or run, that claim's own" },
  { flag = "ready-timeout", arg = "S", option = "ready_timeout", convert = options_check.flag.seconds,
    help = "seconds a claim gets to serve (default 180)" },
  { flag = "capability-lifetime", arg = "S", option = "capability_lifetime",
    convert = options_check.flag.seconds,
    help = "seconds a capability lives (default 300, at most 900)" },
  { flag = "service-account-dir", arg = "DIR", option = "service_account_dir",
    help = "the in-cluster credentials (default /var/run/secrets/kubernetes.io/serviceaccount)" },
}

kubernetes.AGENT_PORT = 8971
kubernetes.MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
kubernetes.MANAGED_BY = "sandkit"
kubernetes.NONCE_ANNOTATION = "sandkit.dev/nonce"
--- agent-sandbox names a Sandbox's pod here when it is not the Sandbox's own name.
kubernetes.POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
kubernetes.CAPABILITY_HEADER = "X-Sandkit-Capability"

local DEFAULTS = {
  lifetime = 3600,       -- seconds a claim lives unless terminated first
  ready_timeout = 180,   -- seconds from claim to a ready agent: a cold start pulls an image
  ready_interval = 0.5,  -- seconds between agent health probes
}
--- Claims read per list page: small answers, few round trips.
local LIST_LIMIT = 100
--- Pages a list follows at most (100,000 claims): a server that hands out continue tokens for
-- ever cannot keep a list going for ever.
local MAX_LIST_PAGES = 1000
--- A watch asks the server to end it by then, so a stream that went quiet is replaced before a
-- proxy in between drops it; the readiness deadline bounds it too.
local MAX_WATCH_SECONDS = 290
--- Backoff after a watch that failed at once: from 0.1 s doubling to 2 s.
local MAX_BACKOFF = 2

--- Ready=False reasons agent-sandbox does not recover from: waiting for them is waiting for
-- nothing. The value says what the reason means for the caller.
local TERMINAL = {
  WarmPoolNotFound = "config", TemplateNotFound = "config", InvalidMetadata = "config",
  EnvVarsInjectionRejected = "config", VolumeClaimTemplatesError = "config",
  ClaimExpired = "expired", SandboxExpired = "expired",
}

local REFUSALS = {
  preview = "agent-sandbox pods have no preview endpoint; expose a port with a Service of your own",
  pause_resume = "a SandboxClaim cannot be paused; it lives until terminated or its lifetime ends",
  snapshot = "agent-sandbox takes no snapshots of a claimed pod",
}

local provider_mt = {}
provider_mt.__index = provider_mt

local function hex(n)
  return (core.random(n):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

--- A DNS-1123 label: what Kubernetes accepts as a namespace and what sandkit uses as a claim
-- name, so that the same id is also a valid pod and Service name.
local function dns_label(s)
  return type(s) == "string" and #s <= 63 and s:match("^[a-z0-9][a-z0-9%-]*$") ~= nil
    and s:sub(-1) ~= "-"
end

--- A DNS-1123 subdomain: an object name such as a warm pool's.
local function dns_subdomain(s)
  return type(s) == "string" and #s <= 253 and s:match("^[a-z0-9][a-z0-9%-%.]*$") ~= nil
    and s:match("[a-z0-9]$") ~= nil
end

--- A session id is its claim's name, a DNS label, so that it is also a valid pod and Service
-- name.
kubernetes.ID = { max = 63, pattern = "^[a-z0-9%-]+$", valid = dns_label,
  what = "a kubernetes session id is a DNS label: 1 to 63 of [a-z0-9-], starting and ending with a "
    .. "letter or digit" }

-- Options --------------------------------------------------------------------------------------

local function check_options(options)
  local function bad(field, details)
    return nil, errors.invalid_input("sandkit.sandbox", field, details)
  end
  if not dns_subdomain(options.warm_pool) then
    return bad("warm_pool", "the kubernetes provider needs warm_pool, the name of the "
      .. "SandboxWarmPool its claims draw from")
  end
  if options.namespace ~= nil and not dns_label(options.namespace) then
    return bad("namespace", "namespace is a DNS label")
  end
  if type(options.key_id) ~= "string" or not options.key_id:match("^[%w%._:%-]+$") or #options.key_id > 64 then
    return bad("key_id", "the kubernetes provider needs key_id, the signing key's id in the "
      .. "agents' key ring (1 to 64 of [A-Za-z0-9._:-])")
  end
  local transport = options.transport or "direct"
  if transport ~= "direct" and transport ~= "apiserver" and transport ~= "router" then
    return bad("transport", "transport is \"direct\", \"apiserver\" or \"router\"")
  end
  local router_url
  if transport == "router" then
    if type(options.router_url) ~= "string" or not options.router_url:match("^https?://[^/?#@%s]+[^?#%s]*$") then
      return bad("router_url", "the router transport needs router_url = \"http(s)://host[:port]\"")
    end
    router_url = options.router_url:gsub("/+$", "")
  end
  if options.router_token ~= nil and (type(options.router_token) ~= "string"
      or options.router_token == "" or options.router_token:find("[%c ]")) then
    return bad("router_token", "router_token is the router's bearer token")
  end
  local port = options.agent_port or kubernetes.AGENT_PORT
  if json.integer(port) == nil or port < 1 or port > 65535 then
    return bad("agent_port", "agent_port is a port number")
  end
  local times, refused = options_check.each(options_check.seconds, "sandkit.sandbox", options,
    { "ready_timeout", "ready_interval", "api_timeout" }, DEFAULTS)
  if not times then return nil, refused end
  times.lifetime, refused = options_check.whole_seconds("sandkit.sandbox", options, "lifetime", DEFAULTS.lifetime)
  if not times.lifetime then return nil, refused end
  -- A token re-minted with REMINT_MARGIN left must still have some life to send: the refusal
  -- says so, whatever else is wrong with the value.
  local cap_life = options_check.seconds("sandkit.sandbox", options, "capability_lifetime",
    capability.DEFAULT_LIFETIME)
  if not cap_life or cap_life <= capability.REMINT_MARGIN then
    return bad("capability_lifetime", "capability_lifetime is more than "
      .. capability.REMINT_MARGIN .. " seconds (at most " .. capability.MAX_LIFETIME .. " are used)")
  end
  return { transport = transport, router_url = router_url, port = json.integer(port),
    times = times, capability_lifetime = cap_life }
end

function kubernetes.new(options)
  local checked, err = check_options(options)
  if not checked then return nil, err end
  local key
  key, err = capability.load_key(options.signing_key, "sandkit.sandbox")
  if not key then return nil, err end
  local cfg
  cfg, err = kubeconfig.load{ kubeconfig = options.kubeconfig, context = options.context,
    service_account_dir = options.service_account_dir }
  if not cfg then return nil, err end
  local namespace = options.namespace or cfg.namespace or "default"
  if not dns_label(namespace) then
    return nil, errors.invalid_input("sandkit.sandbox", "namespace", "the kubeconfig's namespace "
      .. tostring(namespace) .. " is not a DNS label")
  end
  return setmetatable({
    name = "kubernetes",
    refusals = REFUSALS,
    options = options,
    api = api.new(cfg, { timeout = checked.times.api_timeout }),
    namespace = namespace,
    warm_pool = options.warm_pool,
    key = key,
    key_id = options.key_id,
    transport = checked.transport,
    router_url = checked.router_url,
    router_token = options.router_token,
    port = checked.port,
    times = checked.times,
    capability_lifetime = checked.capability_lifetime,
  }, provider_mt)
end

function provider_mt:capabilities()
  return { files = true, jobs = true, reconnect = true, list = true, preview = false,
    pause_resume = false, snapshot = false }
end

-- Paths and reads ------------------------------------------------------------------------------

--- Where each resource the provider reads is served.
local GROUPS = { sandboxclaims = api.CLAIMS, sandboxes = api.SANDBOXES, pods = api.CORE }

--- The path of a collection in this namespace, or of one object in it.
function provider_mt:path(resource, name)
  return GROUPS[resource] .. "/namespaces/" .. self.namespace .. "/" .. resource
    .. (name and ("/" .. name) or "")
end

function provider_mt:claims_path(name)
  return self:path("sandboxclaims", name)
end

--- Absent and someone else's are one refusal, so no caller learns whether a sibling's id exists.
local function not_ours(operation, id)
  local err = errors.unreachable(operation, "session '" .. id .. "' does not belong to this sandbox")
  err.not_ours = true
  return err
end

--- A GET of one object: the object | nil (absent) | nil, err.
function provider_mt:read(operation, resource, name)
  return self.api:call{ operation = operation, verb = "get", resource = resource,
    namespace = self.namespace, name = name, method = "GET", path = self:path(resource, name),
    absent_on_404 = true }
end

function provider_mt:read_claim(id, operation)
  return self:read(operation, "sandboxclaims", id)
end

--- Calls `each(object)` for every object of a collection that `query` selects, following
-- continue until it is empty (a page may hold fewer items than `limit` and still not be the
-- last): true | nil, err.
function provider_mt:each_listed(operation, resource, query, each)
  local continue
  for _ = 1, MAX_LIST_PAGES do
    local q = {}
    for i, pair in ipairs(query) do q[i] = pair end
    q[#q + 1] = { "limit", tostring(LIST_LIMIT) }
    if continue then q[#q + 1] = { "continue", continue } end
    local page, err = self.api:call{ operation = operation, verb = "list", resource = resource,
      namespace = self.namespace, method = "GET", path = self:path(resource), query = q }
    if not page then return nil, err end
    if type(page.items) ~= "table" then
      return nil, errors.unexpected(operation, "items", "the " .. resource .. " list has no items")
    end
    for _, obj in ipairs(page.items) do
      if type(obj) == "table" then each(obj) end
    end
    continue = type(page.metadata) == "table" and page.metadata.continue or nil
    if type(continue) ~= "string" or continue == "" then return true end
  end
  return nil, errors.unreachable(operation, "the " .. resource .. " list did not end within "
    .. MAX_LIST_PAGES .. " pages")
end

local function meta(obj)
  return type(obj) == "table" and type(obj.metadata) == "table" and obj.metadata or {}
end

function provider_mt:owns(claim)
  local m = meta(claim)
  local spec = type(claim.spec) == "table" and claim.spec or {}
  local pool = type(spec.warmPoolRef) == "table" and spec.warmPoolRef.name
  return type(m.labels) == "table" and m.labels[kubernetes.MANAGED_BY_LABEL] == kubernetes.MANAGED_BY
    and pool == self.warm_pool
end

local function ready_condition(claim)
  local status = type(claim.status) == "table" and claim.status or {}
  if type(status.conditions) ~= "table" then return nil end
  for _, c in ipairs(status.conditions) do
    if type(c) == "table" and c.type == "Ready" then return c end
  end
end

--- What a claim says about itself, for "last seen".
local function describe(claim)
  if meta(claim).deletionTimestamp then return "claim is being deleted" end
  local c = ready_condition(claim)
  if not c then return "claim has no Ready condition yet" end
  local text = "claim Ready=" .. tostring(c.status)
  if type(c.reason) == "string" and c.reason ~= "" then
    text = text .. " (" .. c.reason
    if type(c.message) == "string" and c.message ~= "" then text = text .. ": " .. c.message end
    text = text .. ")"
  end
  return text
end

--- The session state a claim stands for.
local function claim_state(claim)
  if meta(claim).deletionTimestamp then return "terminated" end
  local c = ready_condition(claim)
  if c and c.status == "False" and TERMINAL[c.reason] == "expired" then return "terminated" end
  if c and c.status == "True" then return "running" end
  return "starting"
end

local function controlled_by(obj, kind, uid)
  local refs = meta(obj).ownerReferences
  if type(refs) ~= "table" then return false end
  for _, ref in ipairs(refs) do
    if type(ref) == "table" and ref.controller == true and ref.kind == kind and ref.uid == uid then
      return true
    end
  end
  return false
end

--- The pod's address: IPv4 preferred (docs/kubernetes.md).
local function pod_ip(pod)
  local status = type(pod.status) == "table" and pod.status or {}
  local ips = {}
  if type(status.podIPs) == "table" then
    for _, entry in ipairs(status.podIPs) do
      if type(entry) == "table" and type(entry.ip) == "string" then ips[#ips + 1] = entry.ip end
    end
  end
  if type(status.podIP) == "string" then table.insert(ips, 1, status.podIP) end
  for _, ip in ipairs(ips) do
    if ip:match("^%d+%.%d+%.%d+%.%d+$") then return ip end
  end
  for _, ip in ipairs(ips) do
    if ip:match("^[%x:]+$") and ip:find(":", 1, true) then return ip end
  end
end

--- The Sandbox a claim names, when it names one that can be.
local function sandbox_name(claim)
  local status = type(claim.status) == "table" and claim.status or {}
  local name = type(status.sandbox) == "table" and status.sandbox.name
  if type(name) == "string" and dns_subdomain(name) then return name end
end

--- The pod a Sandbox runs: its pod-name annotation, else the Sandbox's own name.
local function pod_name_of(sandbox, sb_name)
  local annotations = type(meta(sandbox).annotations) == "table" and meta(sandbox).annotations or {}
  return annotations[kubernetes.POD_NAME_ANNOTATION] or sb_name
end

--- The pod behind a claim, through the ownership chain: { name, uid, ip, sandbox } | false and
-- why not yet (something is missing or still starting) | nil and an error (the chain does
-- not hold, or a read failed). `lookup(resource, name)` finds a Sandbox or a pod (object |
-- nil when absent | nil, err); by default each is read with a GET.
function provider_mt:chain(claim, operation, lookup)
  lookup = lookup or function(resource, name) return self:read(operation, resource, name) end
  local id, claim_uid = meta(claim).name, meta(claim).uid
  local sb_name = sandbox_name(claim)
  if not sb_name then return false, "claim names no sandbox yet" end
  local sandbox, err = lookup("sandboxes", sb_name)
  if err then return nil, err end
  if not sandbox then return false, "sandbox " .. sb_name .. " does not exist" end
  if not controlled_by(sandbox, "SandboxClaim", claim_uid) then return nil, not_ours(operation, id) end
  local pod_name = pod_name_of(sandbox, sb_name)
  if type(pod_name) ~= "string" or not dns_subdomain(pod_name) then
    return nil, errors.unexpected(operation, "sandbox", "sandbox " .. sb_name .. " names a pod "
      .. "that is not an object name")
  end
  local pod
  pod, err = lookup("pods", pod_name)
  if err then return nil, err end
  if not pod then return false, "pod " .. pod_name .. " does not exist" end
  if not controlled_by(pod, "Sandbox", meta(sandbox).uid) then return nil, not_ours(operation, id) end
  if meta(pod).deletionTimestamp then return false, "pod " .. pod_name .. " is terminating" end
  local ip = pod_ip(pod)
  if not ip then return false, "pod " .. pod_name .. " has no IP yet" end
  if type(meta(pod).uid) ~= "string" or meta(pod).uid == "" then
    return nil, errors.unexpected(operation, "pod", "pod " .. pod_name .. " has no uid")
  end
  return { name = pod_name, uid = meta(pod).uid, ip = ip, sandbox = sb_name }
end

--- The session a claim of this sandbox stands for, once its chain is checked: the record |
-- nil (the chain does not hold: not ours, read as absent) | nil, err. A claim Ready whose
-- pod is not in view yet is still starting; only a running session carries its pod, so
-- nothing is ever sent to one in another state without reading it again.
function provider_mt:record(claim, operation, lookup)
  local pod, why = self:chain(claim, operation, lookup)
  if pod == nil then
    if why.not_ours then return nil end
    return nil, why
  end
  local record = { id = meta(claim).name, state = claim_state(claim), generation = 1,
    claim_uid = meta(claim).uid, created_at = time.parse_rfc3339(meta(claim).creationTimestamp) }
  if record.state == "running" then
    if pod then record.pod = pod else record.state = "starting" end
  end
  return record
end

--- The pod of a running session, read from scratch: pod | nil, err.
function provider_mt:resolve(id, operation)
  local claim, err = self:read_claim(id, operation)
  if err then return nil, err end
  if not claim or not self:owns(claim) then return nil, not_ours(operation, id) end
  local state = claim_state(claim)
  if state ~= "running" then
    return nil, errors.unreachable(operation, "session '" .. id .. "' is " .. state .. " (" .. describe(claim) .. ")")
  end
  local pod, why = self:chain(claim, operation)
  if pod == nil then return nil, why end
  if pod == false then
    return nil, errors.unreachable(operation, "session '" .. id .. "' cannot be reached: " .. why)
  end
  return pod
end

-- Agent requests --------------------------------------------------------------------------------

local function host(ip)
  return ip:find(":", 1, true) and ("[" .. ip .. "]") or ip
end

--- Where a request to the pod's agent goes and what it carries, per transport.
function provider_mt:agent_target(pod, path, token, operation)
  if self.transport == "direct" then
    return { url = "http://" .. host(pod.ip) .. ":" .. self.port .. path,
      headers = { Authorization = "Bearer " .. token } }
  elseif self.transport == "apiserver" then
    -- The API server deletes Authorization (its own credential) before proxying: the
    -- capability travels in a header it leaves alone.
    return self.api:target(api.CORE .. "/namespaces/" .. self.namespace .. "/pods/" .. pod.name
      .. ":" .. self.port .. "/proxy" .. path, { [kubernetes.CAPABILITY_HEADER] = token }, operation)
  end
  local headers = { ["X-Sandbox-ID"] = pod.sandbox, ["X-Sandbox-Namespace"] = self.namespace,
    ["X-Sandbox-Port"] = tostring(self.port), ["X-Sandbox-Pod-IP"] = pod.ip,
    [kubernetes.CAPABILITY_HEADER] = token }
  if self.router_token then headers.Authorization = "Bearer " .. self.router_token end
  return { url = self.router_url .. path, headers = headers }
end

local transport_mt = {}
transport_mt.__index = transport_mt

function transport_mt:prepare(_, path, operation)
  local p = self.provider
  if not self.pod then
    local pod, err = p:resolve(self.id, operation)
    if not pod then return nil, err end
    self.pod = pod
  end
  local token = self.minter:token(self.pod.uid)
  return p:agent_target(self.pod, path, token, operation)
end

local CAPABILITY_REFUSED = "SANDBOX_CAPABILITY_REFUSED:"

--- A refused credential had no effect (docs/protocol.md §2): the pod may have been recreated
-- (a new UID, perhaps a new address), or the API server's credential rotated. So the chain is
-- read again, a fresh capability minted, and the request sent once more — only when the
-- first attempt provably did nothing: never connected, 401, or the agent's capability 403.
function transport_mt:settle(operation, err, _, replayed)
  if replayed or operation == protocol.OPERATIONS.health then return nil end
  local refused = err.status == 403 and err.code == "SANDBOX_COMMAND_FAILED"
    and type(err.body) == "string" and err.body:sub(1, #CAPABILITY_REFUSED) == CAPABILITY_REFUSED
  if not (err.sent == false or err.status == 401 or refused) then return nil end
  local p = self.provider
  if err.status == 401 and p.transport == "apiserver" then p.api.auth:refresh(operation) end
  local pod, rerr = p:resolve(self.id, operation)
  if not pod then return nil, errors.wrap(operation, "the session's pod could not be read again", rerr) end
  self.pod = pod
  self.minter:forget()
  return "replay"
end

function provider_mt:connection(record)
  local transport = setmetatable({ provider = self, id = record.id, pod = record.pod,
    minter = capability.minter{ key = self.key, key_id = self.key_id,
      lifetime = self.capability_lifetime } }, transport_mt)
  local conn = protocol.connection(transport, self.options)
  conn.features = record.features or {}
  return conn
end

-- Lifecycle --------------------------------------------------------------------------------------

--- Deletes a claim (Background: its Sandbox and pod go after it). With the uid, only that
-- object: a claim of the same name made since is someone else's. True also when it is gone.
function provider_mt:delete_claim(id, uid, operation)
  local _, err = self.api:call{ operation = operation, verb = "delete", resource = "sandboxclaims",
    namespace = self.namespace, name = id, method = "DELETE", path = self:claims_path(id),
    absent_on_404 = true, body = { apiVersion = "v1", kind = "DeleteOptions",
      propagationPolicy = "Background", preconditions = uid and { uid = uid } or nil } }
  -- 409 is the uid precondition failing: the claim meant is already gone.
  if err and err.status ~= 409 then return nil, err end
  return true
end

local function terminal_error(operation, claim)
  local c = ready_condition(claim)
  local kind = TERMINAL[c.reason]
  local message = operation .. ": claim " .. meta(claim).name .. " cannot become ready: "
    .. describe(claim)
  if kind == "config" then
    return errors.new("INVALID_INPUT", { operation = operation, reason = c.reason, message = message,
      field = (c.reason == "WarmPoolNotFound" or c.reason == "TemplateNotFound") and "warm_pool" or nil })
  end
  return errors.new("SANDBOX_UNREACHABLE", { operation = operation, reason = c.reason,
    message = message, retryable = false })
end

--- Waits for a claim to be Ready, its chain to hold and its agent to answer; returns the
-- session record, or nil and an error naming what was last seen. The claim changes are read
-- from a watch; a 410 (as a status or an ERROR event), a dropped or ended watch go back to a
-- GET and watch again from there.
function provider_mt:await(claim, operation)
  local id = meta(claim).name
  local deadline = wait.now() + self.times.ready_timeout
  local rv = meta(claim).resourceVersion
  local last = describe(claim)
  local stream, quick, changed = nil, 0, true
  local function fail(err)
    if stream then stream:close() end
    return nil, err
  end
  local function timed_out()
    return fail(errors.unreachable(operation, string.format("claim %s did not become ready within %gs; "
      .. "last seen: %s", id, self.times.ready_timeout, last)))
  end
  --- Reads the claim again after a watch stopped (after a backoff when `why`): true, or nil
  -- and the error that ends the wait.
  local function reread(why)
    if stream then stream:close() end
    stream = nil
    if why then
      quick = quick + 1
      wait.sleep(math.max(0, math.min(MAX_BACKOFF, 0.1 * 2 ^ (quick - 1), deadline - wait.now())))
    end
    local fresh, err = self:read_claim(id, operation)
    if err then
      if not err.retryable then return nil, err end
      last = err.message
      return true
    end
    if not fresh then
      return nil, errors.unreachable(operation, "claim " .. id .. " was deleted while it was awaited")
    end
    claim, rv, changed = fresh, meta(fresh).resourceVersion, true
    return true
  end
  while true do
    if wait.now() >= deadline then return timed_out() end
    if changed then
      changed = false
      local c = ready_condition(claim)
      if meta(claim).deletionTimestamp then
        return fail(errors.unreachable(operation, "claim " .. id .. " is being deleted"))
      end
      if c and c.status == "False" and TERMINAL[c.reason] then return fail(terminal_error(operation, claim)) end
      last = describe(claim)
      if c and c.status == "True" then
        local pod, why = self:chain(claim, operation)
        if pod == nil then return fail(why) end
        if pod then
          if stream then stream:close() end
          return self:await_agent(id, meta(claim).uid, pod, operation, deadline)
        end
        last = last .. "; " .. why
        -- The claim is Ready but its pod is not in view yet: no claim event may come, so the
        -- chain is read again shortly.
        local ok, rerr = reread(true)
        if ok == nil then return fail(rerr) end
      end
    elseif not stream then
      local resp, err = self.api:watch{ operation = operation, verb = "watch",
        resource = "sandboxclaims", namespace = self.namespace, name = id, method = "GET",
        path = self:claims_path(), deadline = deadline, query = {
          { "watch", "1" }, { "fieldSelector", "metadata.name=" .. id },
          { "resourceVersion", rv or "0" }, { "allowWatchBookmarks", "true" },
          { "timeoutSeconds", tostring(math.max(1, math.min(MAX_WATCH_SECONDS,
            math.ceil(deadline - wait.now())))) } } }
      if resp then
        stream = watch.reader(resp)
      elseif err.status ~= 410 and not err.retryable then
        return fail(err)
      else
        local ok, rerr = reread(err.status ~= 410)
        if ok == nil then return fail(rerr) end
      end
    else
      local event, kind, detail = stream:next(deadline)
      if event then
        local obj = type(event.object) == "table" and event.object or {}
        if event.type == "ADDED" or event.type == "MODIFIED" then
          if meta(obj).name == id then
            claim, rv, changed, quick = obj, meta(obj).resourceVersion, true, 0
          end
        elseif event.type == "BOOKMARK" then
          rv = meta(obj).resourceVersion or rv
        elseif event.type == "DELETED" then
          return fail(errors.unreachable(operation, "claim " .. id .. " was deleted while it was awaited; "
            .. "last seen: " .. last))
        elseif event.type == "ERROR" then
          -- A 410 here means the resource version is gone: read afresh, no backoff.
          local gone = json.integer(obj.code) == 410
          if not gone then last = "the watch failed: " .. tostring(obj.message) end
          local ok, rerr = reread(not gone)
          if ok == nil then return fail(rerr) end
        end
      elseif kind ~= "timeout" then
        if kind ~= "ended" then last = last .. " (the watch " .. kind .. ": " .. tostring(detail) .. ")" end
        local ok, rerr = reread(kind ~= "ended")
        if ok == nil then return fail(rerr) end
      end
    end
  end
end

--- Waits for the pod's agent to answer health (protocol version 1, ready).
function provider_mt:await_agent(id, claim_uid, pod, operation, deadline)
  local record = { id = id, state = "running", generation = 1, claim_uid = claim_uid, pod = pod }
  local conn = self:connection(record)
  local health, err = readiness.wait(conn, { timeout = math.max(0.001, deadline - wait.now()),
    interval = self.times.ready_interval, operation = operation })
  if not health then
    return nil, errors.unreachable(operation, "the agent of claim " .. id .. " (pod " .. pod.name .. ") did "
      .. "not become ready: " .. err.message, { cause = err })
  end
  record.features = health.features
  record.boot_id = health.bootId
  return record
end

--- A new claim that could not be handed back is deleted; when that fails too, the error says
-- so and names it in `left_behind`.
function provider_mt:discard(claim, err, operation)
  local id = meta(claim).name
  local ok, derr = self:delete_claim(id, meta(claim).uid, operation)
  if not ok then
    err.message = err.message .. "; deleting claim " .. id .. " failed too (" .. derr.message .. ")"
    err.left_behind = id
  end
  return nil, err
end

--- Whether a claim read back after an unanswered or refused create is this call's.
local function made_by(claim, nonce)
  local annotations = meta(claim).annotations
  return type(annotations) == "table" and annotations[kubernetes.NONCE_ANNOTATION] == nonce
end

--- POSTs the claim. An answer lost, a 5xx or a 409 is settled by reading the claim back and
-- comparing its nonce — never by sending the create again.
function provider_mt:post_claim(id, lifetime, operation)
  local nonce = hex(16)
  local body = {
    apiVersion = "extensions.agents.x-k8s.io/v1beta1", kind = "SandboxClaim",
    metadata = { name = id, labels = { [kubernetes.MANAGED_BY_LABEL] = kubernetes.MANAGED_BY },
      annotations = { [kubernetes.NONCE_ANNOTATION] = nonce } },
    spec = { warmPoolRef = { name = self.warm_pool },
      lifecycle = { shutdownTime = time.rfc3339(os.time() + lifetime),
        shutdownPolicy = "Delete" } },
  }
  local claim, err = self.api:call{ operation = operation, verb = "create",
    resource = "sandboxclaims", namespace = self.namespace, name = id, method = "POST",
    path = self:claims_path(), body = body, once = true }
  if claim then return claim end
  local unsettled = err.status == 409 or err.code == "SANDBOX_OUTCOME_UNKNOWN"
    or (err.status and err.status >= 500)
  if not unsettled then return nil, err end
  local found, ferr = self:read_claim(id, operation)
  if ferr then
    return nil, errors.new("SANDBOX_OUTCOME_UNKNOWN", { operation = operation, cause = err,
      message = operation .. ": the create of claim " .. id .. " was not settled and reading it "
        .. "back failed, so a claim may exist: " .. ferr.message })
  end
  if not found then
    return nil, errors.unreachable(operation, "claim " .. id .. " does not exist after its create "
      .. (err.status == 409 and "was refused as a duplicate" or "went unanswered")
      .. "; nothing was created, and the same create may be sent again", { cause = err })
  end
  if not made_by(found, nonce) then
    return nil, errors.new("INVALID_INPUT", { operation = operation, field = "id",
      message = operation .. ": a claim named " .. id .. " already exists and is not this call's" })
  end
  return found
end

local function refuse_env(opts, operation)
  if opts.env ~= nil and (type(opts.env) ~= "table" or next(opts.env) ~= nil) then
    -- agent-sandbox's claim env forces a cold start outside the warm pool: env goes per command.
    return errors.invalid_input(operation, "env", "kubernetes sessions take no session env "
      .. "(a claim's env forces a cold start); give env per command")
  end
end

function provider_mt:create(opts)
  local op = "sandbox.create"
  local refusal = refuse_env(opts, op)
  if refusal then return nil, refusal end
  local id = opts.id or ("sandkit-" .. hex(5))
  local lifetime, bad = options_check.whole_seconds(op, opts, "lifetime", self.times.lifetime)
  -- The claim's shutdownTime must be a time RFC 3339 can write, whose year has four digits.
  if not lifetime or os.time() + lifetime > LAST_SHUTDOWN_TIME then
    return nil, bad or errors.invalid_input(op, "lifetime", "lifetime is a whole number of seconds, "
      .. "ending before the year 10000")
  end
  local claim, err = self:post_claim(id, lifetime, op)
  if not claim then return nil, err end
  local record
  record, err = self:await(claim, op)
  if not record then return self:discard(claim, err, op) end
  return record
end

function provider_mt:get(id)
  local op = "sandbox.get"
  local claim, err = self:read_claim(id, op)
  if err then return nil, err end
  if not claim or not self:owns(claim) then return nil end
  return self:record(claim, op)
end

--- An existing session is handed back once it serves: one still starting is waited for (and
-- never deleted here: it is not this call's to give up on).
function provider_mt:serve(record, operation)
  if record.state ~= "starting" then return record end
  local claim, err = self:read_claim(record.id, operation)
  if not claim then return nil, err or errors.unreachable(operation, "claim " .. record.id .. " was deleted") end
  return self:await(claim, operation)
end

--- Session env is refused by get_or_create before it looks, as create refuses it.
function provider_mt:check_create(opts, operation)
  return refuse_env(opts, operation)
end

--- Finds the Sandboxes `wanted` names and their pods with one list of each collection (however
-- many pages), rather than two reads per session: a lookup for `chain`, or nil and an error.
-- Only the objects wanted are kept, so memory grows with this sandbox's sessions, not with
-- the namespace.
function provider_mt:bulk_lookup(operation, wanted)
  local found = { sandboxes = {}, pods = {} }
  local pods_wanted = {}
  local ok, err = self:each_listed(operation, "sandboxes", {}, function(sandbox)
    local name = meta(sandbox).name
    if wanted[name] then
      found.sandboxes[name] = sandbox
      local pod_name = pod_name_of(sandbox, name)
      if type(pod_name) == "string" then pods_wanted[pod_name] = true end
    end
  end)
  if not ok then return nil, err end
  if next(pods_wanted) then
    ok, err = self:each_listed(operation, "pods", {}, function(pod)
      if pods_wanted[meta(pod).name] then found.pods[meta(pod).name] = pod end
    end)
    if not ok then return nil, err end
  end
  return function(resource, name) return found[resource][name] end
end

--- Every session of this sandbox: its claims, page by page, each with its chain checked as
-- `get` checks it — a session whose chain does not hold is not listed. The Sandboxes and
-- pods are read with one list each (only when some claim names a Sandbox).
function provider_mt:list()
  local op = "sandbox.list"
  local claims, wanted = {}, {}
  local ok, err = self:each_listed(op, "sandboxclaims",
    { { "labelSelector", kubernetes.MANAGED_BY_LABEL .. "=" .. kubernetes.MANAGED_BY } },
    function(claim)
      if self:owns(claim) and dns_label(meta(claim).name) then
        claims[#claims + 1] = claim
        local sb_name = sandbox_name(claim)
        if sb_name then wanted[sb_name] = true end
      end
    end)
  if not ok then return nil, err end
  local lookup
  if next(wanted) then
    lookup, err = self:bulk_lookup(op, wanted)
    if not lookup then return nil, err end
  end
  local records = {}
  for _, claim in ipairs(claims) do
    local record, rerr = self:record(claim, op, lookup)
    if rerr then return nil, rerr end
    if record then records[#records + 1] = record end
  end
  return records
end

--- Idempotent: an absent claim is terminated. One that is not this sandbox's is refused, and
-- so is one whose chain does not hold: its Sandbox or pod is another's, and "never operated
-- on" means no DELETE. That is the refusal another pool's claim gets, not the success an
-- absent one gets: the claim is still there, and a caller told its session was terminated
-- would believe the claim gone; a chain that broke under a claim sandkit made is worth an
-- error someone reads. The claim is left to its owner and to its own shutdownTime.
function provider_mt:terminate(id)
  local op = "sandbox.terminate"
  local claim, err = self:read_claim(id, op)
  if err then return nil, err end
  if not claim then return true end
  if not self:owns(claim) then return nil, not_ours(op, id) end
  local pod, why = self:chain(claim, op)
  if pod == nil then return nil, why end
  local ok
  ok, err = self:delete_claim(id, meta(claim).uid, op)
  if not ok then return nil, errors.wrap(op, "claim " .. id .. " could not be deleted", err) end
  return true
end

return kubernetes
