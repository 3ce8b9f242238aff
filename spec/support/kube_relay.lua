--- The two ways the fake cluster of spec/support/kube_api.lua passes a request on to a pod's
-- agent, as the real ones do where a client can tell:
--
-- * the API server's pods proxy (pods/{name}:{port}/proxy/...): Authorization (the API
--   server's own credential) dropped, a refused connection a 503 Status, no read timeout;
-- * agent-sandbox's router (sandbox-router/sandbox_router.py, v0.5): ROUTER_AUTH_TOKEN checked
--   and Authorization dropped; X-Sandbox-ID and X-Sandbox-Namespace must be DNS labels and
--   X-Sandbox-Port a port, else 400 {"detail": …}; a connection refused is 502; and a per-read
--   timeout (PROXY_TIMEOUT_SECONDS, 180 s by default, scaled down by the specs as
--   `router_read_timeout`): no answer by then is 504, and an answer that goes quiet that long
--   is cut mid-body, as uvicorn drops a streaming response whose source raised.
--
-- Not modelled: the router's refusal of loopback pod addresses (the fake's pods live on
-- 127.a.b.c), its retries, and the Go router's whole-request bound.

local socket = require "cqueues.socket"

local kube_relay = {}

--- The router's per-read timeout unless the config scales it down (seconds).
kube_relay.ROUTER_READ_TIMEOUT = 180

--- Headers that go no further: hop-by-hop, the credential the hop consumed, the fake's own.
local HOP = { authorization = true, host = true, connection = true, ["content-length"] = true,
  ["transfer-encoding"] = true, ["x-fake-client-verify"] = true, ["x-fake-client-subject"] = true,
  ["x-fake-sni"] = true, ["x-fake-host"] = true, ["x-sandbox-id"] = true, ["x-sandbox-namespace"] = true,
  ["x-sandbox-port"] = true, ["x-sandbox-pod-ip"] = true }

--- Sends req on to ip:port at target and copies the answer back as it comes. answer(code,
-- body) replies when nothing was passed back yet: "refused" (no connection) or "timeout"
-- (nothing within read_timeout, when one is set).
local function relay(req, conn, ip, port, target, read_timeout, answer)
  local s = socket.connect{ host = ip, port = port }
  s:setmode("b", "b")
  if not s:connect(3) then return answer("refused") end
  local lines = { req.method .. " " .. target .. " HTTP/1.1", "Host: " .. ip .. ":" .. port,
    "Connection: close", "Content-Length: " .. #req.body }
  for k, v in pairs(req.headers) do
    if not HOP[k] then lines[#lines + 1] = k .. ": " .. v end
  end
  s:write(table.concat(lines, "\r\n") .. "\r\n\r\n" .. req.body)
  s:flush()
  if read_timeout then s:settimeout(read_timeout) end
  local passed = false
  while true do
    local data, err = s:read("-65536")
    if not data then
      if err and not passed then
        s:close()
        return answer("timeout")
      end
      break
    end
    passed = true
    conn:write(data)
  end
  s:close()
  conn:close()
end

--- The pods proxy's relay, its refusal in the API server's words.
function kube_relay.pods_proxy(req, conn, ip, port, target, status)
  relay(req, conn, ip, port, target, nil, function()
    status(conn, 503, "ServiceUnavailable", "error trying to reach service: dial tcp " .. ip .. ":" .. port
      .. ": connect: connection refused")
  end)
end

--- A DNS-1123 label, as the router checks the sandbox id and namespace.
local function dns_label(s)
  return #s <= 63 and (s:match("^[a-z0-9]$") or s:match("^[a-z0-9][a-z0-9%-]*[a-z0-9]$")) ~= nil
end

--- The router. send(conn, code, body) answers; log(entry) notes what was routed.
function kube_relay.router(req, conn, config, send, log)
  local function detail(code, text)
    return send(conn, code, '{"detail":"' .. text .. '"}')
  end
  if config.router_token and req.headers.authorization ~= "Bearer " .. config.router_token then
    return detail(401, "Missing or invalid Authorization header.")
  end
  local id = req.headers["x-sandbox-id"]
  if not id or id == "" then return detail(400, "X-Sandbox-ID header is required.") end
  if not dns_label(id) then return detail(400, "Invalid sandbox ID format.") end
  if not dns_label(req.headers["x-sandbox-namespace"] or "default") then
    return detail(400, "Invalid namespace format.")
  end
  local port = tonumber(req.headers["x-sandbox-port"] or "8888")
  if not port or port % 1 ~= 0 or port < 1 or port > 65535 then return detail(400, "Invalid port format.") end
  local ip = req.headers["x-sandbox-pod-ip"]
  -- The fake has no cluster DNS to send an id alone to.
  if not ip then return detail(400, "Invalid target IP address format.") end
  log{ routed = id, namespace = req.headers["x-sandbox-namespace"] }
  relay(req, conn, ip, port, req.target, config.router_read_timeout or kube_relay.ROUTER_READ_TIMEOUT,
    function(why)
      if why == "refused" then return detail(502, "Could not connect to the backend sandbox: " .. id) end
      detail(504, "Timed out waiting for the backend sandbox: " .. id)
    end)
end

return kube_relay
