--- Writing HTTP responses byte by byte from a fake server's scenario (see fake_http_server.lua).
local cjson = require "cjson"

local respond = {}

function respond.raw(conn, bytes)
  conn:write(bytes)
end

--- A complete response with a Content-Length body.
function respond.status(conn, status, body, content_type)
  body = body or ""
  conn:write(string.format("HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s",
    status, content_type or "text/plain", #body, body))
end

function respond.json(conn, status, value)
  respond.status(conn, status, cjson.encode(value), "application/json")
end

--- A JSON answer that closes its connection (Connection: close), so the client's next request
-- goes on a new one, never on a pooled connection a transport could send it on twice.
function respond.json_last(conn, status, value)
  local body = cjson.encode(value)
  conn:write(string.format("HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
    .. "Connection: close\r\n\r\n%s", status, #body, body))
  conn:close()
end

function respond.chunked_start(conn, status, content_type)
  conn:write(string.format("HTTP/1.1 %s\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n",
    status, content_type or "application/x-ndjson"))
end

function respond.chunk(conn, bytes)
  conn:write(string.format("%x\r\n%s\r\n", #bytes, bytes))
end

function respond.chunked_end(conn)
  conn:write("0\r\n\r\n")
end

--- An NDJSON exec body: each element of chunks is written as one chunk, in order.
function respond.frames(conn, chunks, pause)
  respond.chunked_start(conn, "200 OK")
  for _, c in ipairs(chunks) do
    if pause then conn:sleep(pause) end
    respond.chunk(conn, c)
  end
  respond.chunked_end(conn)
end

--- n as width bytes, big-endian (string.pack is not LuaJIT's).
local function big_endian(n, width)
  local bytes = {}
  for i = width, 1, -1 do
    bytes[i] = string.char(n % 256)
    n = (n - n % 256) / 256
  end
  return table.concat(bytes)
end

--- One binary frame (docs/protocol.md §6 binaryFrames): kind "o"/"e" with seq and the output's
-- bytes, or "j" (or any other kind byte, for a malformed one) with its JSON text as `seq_or_text`.
function respond.binary_frame(kind, seq_or_text, data)
  local body = type(seq_or_text) == "number" and big_endian(seq_or_text, 8) .. data or seq_or_text
  return kind .. big_endian(#body, 4) .. body
end

--- An exec body of binary frames: each element of chunks is written as one chunk, in order.
function respond.binary_frames(conn, chunks, pause)
  respond.chunked_start(conn, "200 OK", "application/vnd.sandkit.frames")
  for _, c in ipairs(chunks) do
    if pause then conn:sleep(pause) end
    respond.chunk(conn, c)
  end
  respond.chunked_end(conn)
end

--- The health answer of a ready agent.
function respond.health(conn, fields)
  local body = { protocolVersion = 1, bootId = "boot-1", status = "ready", features = { "jobIdempotency" } }
  for k, v in pairs(fields or {}) do body[k] = v end
  respond.json(conn, "200 OK", body)
end

--- A scenario for a fake agent: health answers ready (with `health` fields, such as the
-- features it advertises); every other request goes to route.
function respond.agent(route, health)
  return {
    handle = function(req, conn)
      if req.path == "/v1/health" then return respond.health(conn, health) end
      return route(req, conn)
    end,
  }
end

return respond
