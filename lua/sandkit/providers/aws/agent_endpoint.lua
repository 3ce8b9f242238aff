--- The way to an AWS session's agent: AWS's endpoint proxy in front of each MicroVM, reached
-- with a header map CreateMicrovmAuthToken mints for one MicroVM and port, and the wait until
-- the agent behind it answers. Methods of the aws provider (agent_endpoint.methods).

local errors = require "sandkit.errors"
local microvms = require "sandkit.providers.aws.microvms"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"
local wait = require "sandkit.wait"

local agent_endpoint = { methods = {} }
local methods = agent_endpoint.methods

--- Where sandkit-agent listens inside a MicroVM.
agent_endpoint.AGENT_PORT = 8971
--- The header AWS's proxy reads to pick the port inside the MicroVM.
agent_endpoint.PROXY_PORT_HEADER = "X-aws-proxy-port"
--- Life of the token minted for each agent request. Short because it is minted per request:
-- the mint's answer carries no expiry to cache against, so a longer life would only widen
-- the window in which a leaked token works.
agent_endpoint.AGENT_TOKEN_MINUTES = 5

local function quoted(v)
  return v and ("'" .. v .. "'") or "none"
end

--- Where a MicroVM's proxy is reached: https://<endpoint>, or nil and why not. The endpoint
-- becomes the host of a URL that carries a token, so only host[:port] is accepted.
function methods:endpoint_url(id, vm, operation)
  local endpoint = vm.endpoint
  if not endpoint then
    return nil, errors.unreachable(operation, "MicroVM '" .. id .. "' has no endpoint yet (state "
      .. tostring(vm.state) .. ")")
  end
  local host = endpoint:match("^([%w%.%-]+):?%d*$") or endpoint:match("^(%[[%x:]+%]):?%d*$")
  if not host or endpoint:sub(-1) == ":" then
    return nil, errors.unexpected(operation, "endpoint",
      "MicroVM '" .. id .. "' reported an endpoint that is not host[:port]")
  end
  -- Specs serve fake agents on this machine without TLS; nothing else is ever plain http.
  if self.options.allow_loopback_http and microvms.is_loopback(host) then
    return "http://" .. endpoint
  end
  return "https://" .. endpoint
end

--- A token's header map for `ports` of one MicroVM, with the port header added.
function methods:mint(id, port, minutes, operation, what)
  local token, err = self.client:create_auth_token(id, { port }, minutes)
  if err then return nil, errors.wrap(operation, what, err) end
  if not token then
    return nil, errors.unreachable(operation, "MicroVM '" .. id .. "' no longer exists")
  end
  local headers = {}
  for name, value in pairs(token) do
    if name:lower() ~= agent_endpoint.PROXY_PORT_HEADER:lower() then headers[name] = value end
  end
  headers[agent_endpoint.PROXY_PORT_HEADER] = tostring(port)
  return headers
end

--- The whole of what AWS does differently from any other agent: where a request goes and
-- what authorizes it. Two control-plane calls per request — the record (ownership and
-- endpoint from one read) and a fresh 5-minute token — because the mint's answer carries no
-- expiry, so a cached token could only be guessed valid. The token is a header map, never a
-- bearer: AWS's proxy answers a bearer with a 403 that reads like a permissions problem.
function methods:agent_target(id, path, operation)
  local vm, err = self:ensure_owned(id, operation)
  if not vm then return nil, err end
  local base
  base, err = self:endpoint_url(id, vm, operation)
  if not base then return nil, err end
  local headers
  headers, err = self:mint(id, agent_endpoint.AGENT_PORT, agent_endpoint.AGENT_TOKEN_MINUTES, operation,
    "could not mint an endpoint token for '" .. id .. "'")
  if not headers then return nil, err end
  return { url = base .. path, headers = headers, ca_file = self.options.ca_file }
end

function methods:connection(record)
  local provider, id = self, record.id
  local transport = {
    prepare = function(_, _, path, operation)
      return provider:agent_target(id, path, operation)
    end,
  }
  local conn = protocol.connection(transport, self.options)
  conn.features = record.features or {}
  return conn
end

--- Returns once the session's agent answers its health probe: first its endpoint must be
-- published, then the probe must get through the 502s of a snapshot restore. Only the
-- endpoint's absence and the restore are waited on; a refused read or mint, or a record that
-- is not ours, does not resolve by waiting and is reported at once.
function methods:wait_until_servable(id, operation)
  local deadline = wait.now() + self.ready_timeout
  local vm
  while true do
    local found, err = self:fetch(id, operation)
    if err then return nil, err end
    if found and not self:owns(found) then
      return nil, errors.unreachable(operation, "MicroVM '" .. id .. "' does not belong to this "
        .. "sandbox: it reports image " .. quoted(found.image_arn) .. ", not '" .. self.image .. "'")
    end
    -- A MicroVM AWS has just accepted may not read back yet: absent is waited on too.
    if found and found.endpoint then
      vm = found
      break
    end
    local left = deadline - wait.now()
    if left <= 0 then
      return nil, errors.unreachable(operation, string.format(
        "MicroVM '%s' published no endpoint within %gs (last state %s)", id, self.ready_timeout,
        found and tostring(found.state) or "unknown: the MicroVM did not read back"))
    end
    wait.sleep(math.min(self.ready_interval, left))
  end

  local base, err = self:endpoint_url(id, vm, operation)
  if not base then return nil, err end
  -- One token serves the whole wait: the probes cost no further reads or mints.
  local headers
  headers, err = self:mint(id, agent_endpoint.AGENT_PORT, agent_endpoint.AGENT_TOKEN_MINUTES, operation,
    "could not mint an endpoint token for '" .. id .. "'")
  if not headers then return nil, err end
  local ca_file = self.options.ca_file
  local probe = protocol.connection({
    prepare = function(_, _, path)
      local copy = {}
      for k, v in pairs(headers) do copy[k] = v end
      return { url = base .. path, headers = copy, ca_file = ca_file }
    end,
  }, self.options)
  local health
  health, err = readiness.wait(probe, { timeout = math.max(deadline - wait.now(), 0.001),
    interval = self.ready_interval, operation = operation })
  if not health then
    return nil, errors.unreachable(operation, "MicroVM '" .. id .. "' did not become servable: "
      .. err.message, { cause = err })
  end
  return vm, health
end

return agent_endpoint
