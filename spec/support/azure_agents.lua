--- Agent sides for azure provider specs: real local HTTP servers (support/fake_http) whose
-- scenarios decide every byte, plus the provider plumbing the specs share.

local sandkit = require "sandkit"
local fake_http = require "support.fake_http"
local azure_dataplane = require "support.azure_dataplane"

local azure_agents = {}

--- Bounds short enough that a stall is exercised in a fraction of a second.
azure_agents.HEADER_TIMEOUT = 2
azure_agents.ERROR_BODY_TIMEOUT = 0.3

--- Starts a server whose requests `handle_source` answers: a Lua function expression taking
-- (req, conn, respond), where conn.state is shared by every connection of the server.
function azure_agents.start(handle_source, accept_source)
  return fake_http.start("local respond = require 'support.respond'\n"
    .. "local handle = " .. handle_source .. "\n"
    .. "return { handle = function(req, conn) return handle(req, conn, respond) end"
    .. (accept_source and (", accept = " .. accept_source) or "") .. " }\n")
end

--- The route URL of a server, as the data plane reports one.
function azure_agents.url(server)
  return server.url .. "/"
end

--- A URL on which nothing listens any more.
function azure_agents.dead_url()
  local server = azure_agents.start("function(req, conn, respond) respond.status(conn, '204 No Content') end")
  local url = azure_agents.url(server)
  server:stop()
  return url
end

--- An azure sandbox over a fake data plane, with loopback routes allowed and short bounds.
function azure_agents.sandbox(dataplane, options)
  local sb_options = { provider = "azure", group = "group", image = "image", dataplane = dataplane,
    allow_loopback_http = true, header_timeout = azure_agents.HEADER_TIMEOUT,
    error_body_timeout = azure_agents.ERROR_BODY_TIMEOUT, ready_interval = 0.05,
    state_interval = 0.05, grace = 1 }
  for k, v in pairs(options or {}) do sb_options[k] = v end
  return assert(sandkit.sandbox(sb_options))
end

--- Puts an already-activated route for session `id` in the provider's cache.
function azure_agents.cache_route(sb, id, url, token)
  sb.provider.routes[id] = { base = url:gsub("/$", ""), token = token }
end

--- The base URL of the route cached for `id`, or nil.
function azure_agents.cached(sb, id)
  local route = sb.provider.routes[id]
  return route and route.base
end

--- A connection to session `id` of an agent session, made without reading its record: the
-- seam at which specs drive one operation through the route rules.
function azure_agents.connection(sb, id)
  return assert(sb.provider:connection(azure_dataplane.record(id)))
end

return azure_agents
