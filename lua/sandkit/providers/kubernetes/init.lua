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
--     pool_grace = 30,               -- seconds a claim waits for its missing pool or template
--     keepalive = 30 via "apiserver" and "router", else none (seconds; false: none),
--     header_timeout, grace, error_body_timeout, body_timeout, connect_timeout, command_timeout }
--
-- Sessions can be paused and resumed: the Sandbox's spec.operatingMode (agent-sandbox v0.5)
-- takes the pod away and keeps the Sandbox; a resumed session runs on a new pod.
--
-- Ownership: a claim is this sandbox's when it carries app.kubernetes.io/managed-by=sandkit
-- and names this warm pool; its Sandbox (status.sandbox.name) must have the claim as its
-- controller, and the pod the Sandbox. A session whose chain does not hold is not ours: `get`
-- reads it as absent, `list` leaves it out, `terminate` refuses it, and nothing is ever sent
-- to its pod.
--
-- Its parts: claims.lua (the claim → Sandbox → pod chain and its reads), agent_requests.lua
-- (the way to a pod's agent and its capabilities), lifecycle.lua (create, get, list, terminate
-- and the wait for a claim), and the clients: api.lua, auth.lua, kubeconfig.lua,
-- capability.lua, watch.lua.

local errors = require "sandkit.errors"
local json = require "sandkit.json"
local options_check = require "sandkit.options"
local agent_requests = require "sandkit.providers.kubernetes.agent_requests"
local api = require "sandkit.providers.kubernetes.api"
local capability = require "sandkit.providers.kubernetes.capability"
local claims = require "sandkit.providers.kubernetes.claims"
local kubeconfig = require "sandkit.providers.kubernetes.kubeconfig"
local lifecycle = require "sandkit.providers.kubernetes.lifecycle"

local kubernetes = {}

--- Every sandbox option this provider takes, besides `provider` and the common timeouts.
kubernetes.OPTIONS = { warm_pool = true, namespace = true, kubeconfig = true, context = true,
  service_account_dir = true, signing_key = true, key_id = true, transport = true,
  router_url = true, router_token = true, agent_port = true, lifetime = true,
  ready_timeout = true, ready_interval = true, capability_lifetime = true, api_timeout = true,
  pool_grace = true }

--- Options `create{}` takes besides id and env: a claim's own lifetime, in seconds.
kubernetes.CREATE_OPTIONS = { lifetime = true }

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
  { flag = "pool-grace", arg = "S", option = "pool_grace", convert = options_check.flag.seconds,
    help = "seconds a claim waits for a missing warm pool or template (default 30)" },
  { flag = "capability-lifetime", arg = "S", option = "capability_lifetime",
    convert = options_check.flag.seconds,
    help = "seconds a capability lives (default 300, at most 900)" },
  { flag = "service-account-dir", arg = "DIR", option = "service_account_dir",
    help = "the in-cluster credentials (default /var/run/secrets/kubernetes.io/serviceaccount)" },
}

kubernetes.AGENT_PORT = 8971
kubernetes.MANAGED_BY_LABEL = claims.MANAGED_BY_LABEL
kubernetes.MANAGED_BY = claims.MANAGED_BY
kubernetes.NONCE_ANNOTATION = lifecycle.NONCE_ANNOTATION
kubernetes.POD_NAME_ANNOTATION = claims.POD_NAME_ANNOTATION
kubernetes.CAPABILITY_HEADER = agent_requests.CAPABILITY_HEADER

local DEFAULTS = {
  lifetime = 3600,       -- seconds a claim lives unless terminated first
  ready_timeout = 180,   -- seconds from claim to a ready agent: a cold start pulls an image
  ready_interval = 0.5,  -- seconds between agent health probes
  -- Seconds a claim waits for a pool or template that does not exist: agent-sandbox takes
  -- such a claim up again when the pool appears (and every minute), so one being applied
  -- alongside is worth a wait, and a misspelt name is said within half a minute.
  pool_grace = 30,
}

local REFUSALS = {
  preview = "agent-sandbox pods have no preview endpoint; expose a port with a Service of your own",
  snapshot = "agent-sandbox takes no snapshots of a claimed pod",
}

local provider_mt = {}
provider_mt.__index = provider_mt
for _, part in ipairs{ claims, agent_requests, lifecycle } do
  for name, method in pairs(part.methods) do provider_mt[name] = method end
end

local dns_label, dns_subdomain = claims.dns_label, claims.dns_subdomain

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
  -- The router takes the Sandbox's name (<pool>-xxxxx for a warm one) as X-Sandbox-ID only when
  -- it is a DNS label, and answers 400 otherwise: such a pool's sessions would be unreachable.
  if transport == "router" and options.warm_pool:find(".", 1, true) then
    return bad("warm_pool", "the router transport needs a warm pool whose name holds no '.': the "
      .. "router takes a Sandbox's name (<pool>-xxxxx) only as a DNS label")
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
  local port, refused = options_check.port("sandkit.sandbox", options, "agent_port", kubernetes.AGENT_PORT)
  if not port then return nil, refused end
  local times
  times, refused = options_check.each(options_check.seconds, "sandkit.sandbox", options,
    { "ready_timeout", "ready_interval", "api_timeout", "pool_grace" }, DEFAULTS)
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

-- The provider -----------------------------------------------------------------------------------

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
  return { files = true, jobs = true, reconnect = true, list = true, fs = true, watch = true, preview = false,
    stdin = true, pty = true,
    pause_resume = true, snapshot = false, set_lifetime = true, labels = true }
end

return kubernetes
