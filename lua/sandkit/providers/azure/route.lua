--- The way to an Azure session's own agent: its HTTPS route through the data plane's proxy and
-- the per-boot credential its image wrote, fetched, judged, activated and cached per session,
-- and the protocol transport over it, which refreshes a route and sends a request once more
-- only where the first attempt provably was not delivered (docs/azure.md, "Refreshing").
-- Methods of the azure provider (agent_route.methods).

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"
local sessions = require "sandkit.providers.azure.sessions"

local agent_route = { methods = {} }
local methods = agent_route.methods

--- Where the agent listens in the sandbox, and the file its image writes the per-boot
-- credential to (44 characters of standard base64, no newline).
agent_route.AGENT_PORT = 8971
agent_route.TOKEN_PATH = "/run/sandkit/agent-token"

local ACTIVATE = protocol.OPERATIONS.activate

--- Agent answers to 404 that are the agent's own verdict, not a proxy that has no route.
local TYPED_NOT_FOUND = { "PATH_NOT_FOUND:", "JOB_NOT_FOUND:" }

--- The base of an agent route ("https://host[:port]"), or nil when the URL is anything but a
-- provider route: the credential is attached to whatever this returns.
local function route_base(url, allow_loopback_http)
  if type(url) ~= "string" or url:find("[%z\1-\32\127\\]") then return nil end
  local scheme, authority, rest = url:match("^(%a[%w+.-]*)://([^/?#]*)(.*)$")
  if not scheme or (rest ~= "" and rest ~= "/") then return nil end   -- a path, query or fragment
  if authority:find("@", 1, true) then return nil end                 -- user info
  local host, port = authority:match("^([%w%.%-]+)(:?%d*)$")
  if not host or port == ":" or (port ~= "" and tonumber(port:sub(2)) > 65535) then return nil end
  scheme, host = scheme:lower(), host:lower()
  local provider = scheme == "https"
    and (host:match("^[%w%-]+[%w%.%-]*%.adcproxy%.io$") or host:match("^[%w%-]+[%w%.%-]*%.azurecontainerapps%.io$"))
  local loopback = allow_loopback_http and scheme == "http" and host == "127.0.0.1"
  if not (provider or loopback) then return nil end
  return scheme .. "://" .. host .. port
end

--- 32 bytes of standard base64: with the padding core.b64decode insists on, exactly 44
-- characters and nothing around them.
local function valid_token(bytes)
  local raw = type(bytes) == "string" and core.b64decode(bytes)
  return type(raw) == "string" and #raw == 32
end

--- Fetches the session's route and the credential of its current boot. The URL is judged
-- before the credential is even read.
function methods:fetch_route(id)
  local url, err = self.dataplane:agent_port_url(self.group, id, agent_route.AGENT_PORT)
  if not url then
    if err then return nil, errors.wrap("sandbox.agent", "the agent route could not be fetched", err) end
    return nil, sessions.gone("sandbox.agent", id)
  end
  local base = route_base(url, self.allow_loopback_http)
  if not base then return nil, sessions.invalid_route() end
  local token
  token, err = self.dataplane:read_file(self.group, id, agent_route.TOKEN_PATH)
  if not token then
    if err then return nil, errors.wrap("sandbox.agentCredentials", "the agent credential could not be read", err) end
    -- The image writes it when the agent starts: not yet is not never.
    return nil, errors.unreachable("sandbox.agent", "the agent of session " .. id
      .. " has not written its credential yet")
  end
  if not valid_token(token) then return nil, sessions.invalid_route() end
  return { base = base, token = token }
end

local function target(route, path)
  return { url = route.base .. path, headers = { Authorization = "Bearer " .. route.token }, route = route }
end

--- Judges the session again before its agent is activated: activation starts image code, so
-- the policy is checked even when the first operation only reads a file.
function methods:judge_for_activation(id)
  local record, err = self:judged(id, ACTIVATE)
  if not record then return nil, err end
  if record.transport ~= "agent" then return nil, sessions.invalid_route() end
  return true
end

function methods:activate_route(id, route)
  local ok, err = self:judge_for_activation(id)
  if not ok then return nil, err end
  local conn = protocol.connection({ prepare = function(_, _, path) return target(route, path) end },
    self.conn_options)
  return protocol.activate(conn)
end

--- Fetches, activates and stores a route. Nothing is stored until activation succeeded, so an
-- operation running meanwhile sees no route and opens its own; activating twice is harmless.
function methods:open_route(id)
  local route, err = self:fetch_route(id)
  if not route then return nil, err end
  local ok
  ok, err = self:activate_route(id, route)
  if not ok then return nil, err end
  self.routes[id] = route
  return route
end

--- Drops a route, unless another operation already replaced it.
function methods:forget(id, route)
  if route ~= nil and self.routes[id] == route then self.routes[id] = nil end
end

local transport_mt = {}
transport_mt.__index = transport_mt

--- A transport over the session's cached route (protocol.lua's prepare/settle). One object per
-- connection; the cache it reads and writes is the provider's.
function methods:route_transport(id)
  return setmetatable({ provider = self, id = id }, transport_mt)
end

function transport_mt:prepare(_, path, operation)
  local p, id = self.provider, self.id
  if operation == ACTIVATE then
    -- Only readiness asks for an activation, and only when health says a boot awaits one.
    -- Health is public, so it cannot refuse the credential of an earlier boot: the cached
    -- one is stale, and the activation goes out with the boot's own, judged again first.
    p:forget(id, self.last_route)
    local fresh, err = p:fetch_route(id)
    if not fresh then return nil, err end
    local ok
    ok, err = p:judge_for_activation(id)
    if not ok then return nil, err end
    -- Stored by the next request, which readiness sends only after this one succeeded;
    -- a failure passes through settle, which discards it.
    self.pending = fresh
    self.last_route = fresh
    return target(fresh, path)
  end
  local route = self.pending or p.routes[id]
  if self.pending then
    p.routes[id], self.pending = self.pending, nil
  end
  if not route then
    local err
    route, err = p:open_route(id)
    if not route then return nil, err end
  end
  self.last_route = route
  return target(route, path)
end

local function typed_not_found(err)
  if err.status ~= 404 or err.code ~= "SANDBOX_COMMAND_FAILED" or type(err.body) ~= "string" then
    return false
  end
  for _, prefix in ipairs(TYPED_NOT_FOUND) do
    if err.body:sub(1, #prefix) == prefix then return true end
  end
  return false
end

--- Decides what a failed attempt means for the route (protocol.lua calls it for every failed
-- attempt; `replayed` is true for the one replay). Refresh and replay once only where the
-- request provably was not delivered; everything else keeps or drops the route and returns.
function transport_mt:settle(operation, err, attempted, replayed)
  local p, id, used = self.provider, self.id, attempted.route
  if operation == ACTIVATE then
    self.pending = nil
    return nil
  end
  -- The agent's own answer: the route works.
  if typed_not_found(err) then return nil end
  -- A replay that failed must not leave its route for the next operation.
  if replayed then
    p:forget(id, used)
    return nil
  end
  -- A credential refusal is answered before anything runs and has no side effect: a 401, or
  -- the 403 sandkit-agent gives a wrong token. Only a changed credential makes it worth a replay.
  local unauthorized = protocol.credential_refused(err)
  local not_delivered = err.sent == false                                         -- never connected
    or (err.status == 404 and err.code == "SANDBOX_COMMAND_FAILED")               -- no route at the proxy
    or unauthorized                                                               -- refused before anything ran
  if not not_delivered then
    -- A timeout, a connection lost after connecting, a 5xx, an unreadable body: the request
    -- may have run. Never replayed; the next operation starts from a fresh route.
    p:forget(id, used)
    return nil
  end
  local current = p.routes[id]
  if current ~= nil and current ~= used then return "replay" end   -- refreshed meanwhile
  local fresh, ferr = p:fetch_route(id)
  if not fresh then
    p:forget(id, used)
    return nil, errors.wrap(operation, "the route to the agent could not be refreshed", ferr)
  end
  if unauthorized and fresh.base == used.base and fresh.token == used.token then
    -- The credential the agent refused is still the current one: that is its answer.
    return nil
  end
  local ok, aerr = p:activate_route(id, fresh)
  if not ok then
    p:forget(id, used)
    return nil, errors.wrap(operation, "the refreshed route to the agent could not be activated", aerr)
  end
  p.routes[id] = fresh
  return "replay"
end

--- Waits until the session's agent serves, activating a boot that awaits it.
function methods:wait_agent(id, operation)
  local conn = protocol.connection(self:route_transport(id), self.conn_options)
  return readiness.wait(conn, { timeout = self.times.ready_timeout,
    interval = self.times.ready_interval, operation = operation })
end

return agent_route
