--- Requests to a Kubernetes session's agent: where each goes for the sandbox's transport
-- ("direct" to the pod's IP, "apiserver" through the API server's pods proxy, "router" through
-- agent-sandbox's router), an Ed25519 capability for the pod's UID on each, and the protocol
-- transport that reads the pod again and sends a request once more where its credential was
-- refused before anything ran. Methods of the kubernetes provider (agent_requests.methods).

local errors = require "sandkit.errors"
local protocol = require "sandkit.protocol"
local api = require "sandkit.providers.kubernetes.api"
local capability = require "sandkit.providers.kubernetes.capability"

local agent_requests = { methods = {} }
local methods = agent_requests.methods

--- The header a capability travels in where Authorization is the API server's or the router's.
agent_requests.CAPABILITY_HEADER = "X-Sandkit-Capability"
--- Seconds of a stream's silence after which the agent is asked for a keep-alive when a proxy
-- stands between: agent-sandbox's router cuts a connection silent for PROXY_TIMEOUT_SECONDS
-- (180 by default), and nginx in front of either proxy for proxy_read_timeout (60).
agent_requests.PROXIED_KEEPALIVE = 30

local function host(ip)
  return ip:find(":", 1, true) and ("[" .. ip .. "]") or ip
end

--- Where a request to the pod's agent goes and what it carries, per transport.
function methods:agent_target(pod, path, token, operation)
  if self.transport == "direct" then
    return { url = "http://" .. host(pod.ip) .. ":" .. self.port .. path,
      headers = { Authorization = "Bearer " .. token } }
  elseif self.transport == "apiserver" then
    -- The API server deletes Authorization (its own credential) before proxying: the
    -- capability travels in a header it leaves alone.
    return self.api:target(api.CORE .. "/namespaces/" .. self.namespace .. "/pods/" .. pod.name
      .. ":" .. self.port .. "/proxy" .. path, { [agent_requests.CAPABILITY_HEADER] = token }, operation)
  end
  local headers = { ["X-Sandbox-ID"] = pod.sandbox, ["X-Sandbox-Namespace"] = self.namespace,
    ["X-Sandbox-Port"] = tostring(self.port), ["X-Sandbox-Pod-IP"] = pod.ip,
    [agent_requests.CAPABILITY_HEADER] = token }
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

--- A refused credential had no effect (docs/protocol.md §2): the pod may have been recreated
-- (a new UID, perhaps a new address), or the API server's credential rotated. So the chain is
-- read again, a fresh capability minted, and the request sent once more — only when the
-- first attempt provably did nothing: never connected, 401, or the agent's capability 403.
function transport_mt:settle(operation, err, _, replayed)
  if replayed or operation == protocol.OPERATIONS.health then return nil end
  if not (err.sent == false or protocol.credential_refused(err)) then return nil end
  local p = self.provider
  if err.status == 401 and p.transport == "apiserver" then p.api.auth:refresh(operation) end
  local pod, rerr = p:resolve(self.id, operation)
  if not pod then return nil, errors.wrap(operation, "the session's pod could not be read again", rerr) end
  self.pod = pod
  self.minter:forget()
  return "replay"
end

function methods:connection(record)
  local transport = setmetatable({ provider = self, id = record.id, pod = record.pod,
    minter = capability.minter{ key = self.key, key_id = self.key_id,
      lifetime = self.capability_lifetime } }, transport_mt)
  local conn = protocol.connection(transport, self.options)
  if self.options.keepalive == nil and self.transport ~= "direct" then
    conn.keepalive = agent_requests.PROXIED_KEEPALIVE
  end
  conn.features = record.features
  if not conn.features and conn.keepalive then
    -- A session found by get or list, not made here: whether its agent sends keep-alives is
    -- asked once, since a stream through a proxy that cuts silent connections needs them.
    -- A health that fails says nothing, and the request after it will tell its own failure.
    local health = protocol.health(conn)
    conn.features = health and health.features
  end
  conn.features = conn.features or {}
  return conn
end

return agent_requests
