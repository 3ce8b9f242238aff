--- HTTP/1.1 over nginx cosockets: the transport sandkit.http uses inside OpenResty/nginx, where
-- nothing may block a worker. It offers exactly what the libcurl transport offers (http.lua):
-- `cosocket.send(spec)` returns a transfer once response headers arrived, and a transfer has
-- `read()`, `decode(decoder)`, `state()`, `headers()`, `close()`, plus `await(deadline)`, which
-- sandkit.wait's nginx scheduler calls: it parks the calling light thread on the socket read
-- and returns when the transfer has something for its reader, or the deadline passed.
--
-- The same guarantees as the libcurl transport:
--   * the header deadline bounds connecting, sending and the response headers, never a body;
--   * a request that may start a command (`fresh_connect`) goes out on a connection of its own
--     that is never pooled, so it is never resent on a pooled connection that turned out dead;
--     only idempotent requests use and refill the keep-alive pool (`setkeepalive`), and only
--     those are sent once more, on a fresh connection, when a pooled connection dies before
--     any byte of the answer arrived (what libcurl does for them too);
--   * redirects are answers like any other, never followed;
--   * bodies framed by Content-Length, chunked, or the end of the connection, each bounded
--     (`max_body` for a 2xx, `max_error_body` otherwise);
--   * backpressure: the socket is read only when the reader asks for more and nothing is
--     buffered, at most `buffer_size` bytes at a time, so a slow reader closes TCP's window and
--     slows the sender instead of filling memory.
--
-- A request body is a string (`body`), or streamed from `body_reader` (with `body_length`, or
-- chunked), on a connection of its own; the wait is then bounded by `stall_timeout` per piece
-- and by `header_timeout` once the whole body is out, as the libcurl transport does.
--
-- The HTTP/1.1 itself — URLs, request heads, response heads, body framing — is sandkit.http1's,
-- which touches no socket; this module owns the sockets, deadlines, pools and body bounds.
--
-- TLS is always verified (`sslhandshake` with verification on) against nginx's
-- `lua_ssl_trusted_certificate`: a cosocket cannot be given a CA per request. A request that
-- names its own CAs (`ca_pem`, `ca_file`) is verified against them as well, after the
-- handshake, so they stay the only CAs it trusts, as over libcurl: nginx must trust them too
-- (sandkit.cosocket.tls). Proxies are not supported.

local core = require "sandkit.core"
local http1 = require "sandkit.http1"
local tls = require "sandkit.cosocket.tls"

local cosocket = {}

local concat, format = table.concat, string.format
local floor, ceil, min = math.floor, math.ceil, math.min

local LIMITS = core.LIMITS
--- Body bytes one socket read takes, and so the most a transfer holds unread: the libcurl
-- transport's buffer, room for one whole 64 KiB output frame line.
local DEFAULT_BUFFER = LIMITS.BUFFER
--- Below this a reader would pay a socket read per few hundred bytes of a frame line.
local MIN_BUFFER = LIMITS.MIN_BUFFER
--- A socket read while the head arrives: a whole head at its bound and its end in one.
local HEAD_READ = LIMITS.MAX_HEADER_BYTES + 4
--- The most one socket read takes: just under 128 KiB, because LuaJIT's allocator maps a fresh
-- region for every string of 128 KiB or more, and a read's string, freed moments later, would
-- then cost page faults on every read. (nginx's lua_socket_buffer_size bounds a read too: at
-- its default of a page, a stream costs a system call per 4 KiB.)
local MAX_READ = 127 * 1024
local MAX_PEM = tls.MAX_PEM
local PEM_FIELDS = { "ca_pem", "client_cert_pem", "client_key_pem" }
--- How long a pooled connection may idle, and how many one origin keeps: an agent's keep-alive
-- connections are cheap for it, but an idle one past half a minute is likely closed by a proxy.
local KEEPALIVE_IDLE_MS = 30000
local POOL_SIZE = 16
--- A socket read needs a finite timeout; a wait with no deadline goes in slices this long.
local SLICE_MS = 60000
--- Connecting without a connect_timeout of the caller's: libcurl's own default is longer, but a
-- worker's light thread should not sit on a black-holed address for minutes.
local DEFAULT_CONNECT_MS = 30000

local function ms_until(deadline)
  if not deadline then return SLICE_MS end
  local left = ceil((deadline - core.now()) * 1000)
  if left < 1 then return 1 end
  if left > SLICE_MS then return SLICE_MS end
  return left
end

-- Transfers -----------------------------------------------------------------------------------

local transfer_mt = {}
transfer_mt.__index = transfer_mt

local function finish(t, ok, err)
  t.done = true
  t.ok = ok
  t.error = err
  if ok and t.poolable and t.body:reusable() then
    t.sock:setkeepalive(KEEPALIVE_IDLE_MS, POOL_SIZE)
  else
    t.sock:close()
  end
  t.sock = nil
end

local function deliver(t, bytes)
  t.received = t.received + #bytes
  if t.limit and t.received > t.limit then
    t.too_long = true
    finish(t, false, "the body exceeded its " .. t.limit .. "-byte bound")
    return false
  end
  t.out[#t.out + 1] = bytes
  return true
end

--- Moves what the body decoder makes of the bytes read into the reader's queue.
local function process(t)
  local body = t.body
  while true do
    local piece, why = body:next()
    if piece then
      if not deliver(t, piece) then return end
    elseif piece == false then
      return
    else
      return finish(t, why == nil, why)
    end
  end
end

--- Parks the calling light thread until the transfer has something for its reader (bytes, the
-- end, or a failure) or the deadline (core.now clock) passes. true when something arrived.
function transfer_mt:await(deadline)
  if self.done or #self.out > 0 then return true end
  local sock = self.sock
  sock:settimeout(ms_until(deadline))
  local want = min(self.buffer, MAX_READ)
  -- Inside a chunk, a read stops at its end: the read is then the body's bytes as they are,
  -- handed on without a copy (process), and what follows stays in the socket's buffer rather
  -- than waiting in Lua strings while the reader is busy with this chunk's frames. After a long
  -- chunk it takes the next chunk line alone (http1's want), so the next read starts that
  -- chunk's data; both come from nginx's socket buffer when they are there, no system call.
  local body_left = self.body:want()
  if body_left then want = min(want, body_left) end
  local data, err = sock:receiveany(want)
  if data then
    self.body:feed(data)
    process(self)
    return true
  end
  if err == "timeout" then return false end
  if err == "closed" then
    local ended, why = self.body:closed()
    finish(self, ended == true, why)
  else
    finish(self, false, tostring(err))
  end
  return true
end

--- Body bytes buffered for the reader; false when none are yet; nil once the body is over.
function transfer_mt:read()
  local out = self.out
  if #out > 0 then
    local s = #out == 1 and out[1] or concat(out)
    self.out = {}
    return s
  end
  if self.done then return nil end
  return false
end

--- The next frame through the C decoder: a frame table, false (needs bytes not yet here), nil
-- (the body is over), or nil, kind, message (the decoder failed) — as the libcurl transfer.
function transfer_mt:decode(decoder)
  while true do
    local frame, kind, message = decoder:next()
    if frame then return frame end
    if frame == nil then return nil, kind, message end
    -- Piece by piece: joining the pieces first would copy every byte once more.
    local out = self.out
    if #out == 0 then
      if self.done then return nil end
      return false
    end
    decoder:feed(table.remove(out, 1))
  end
end

function transfer_mt:state()
  return { sent = true, headers = true, status = self.status, done = self.done,
    ok = self.ok == true, too_long = self.too_long == true, error = self.error,
    received = self.received }
end

function transfer_mt:headers()
  return self.header_table
end

--- Stops the transfer. Mid-body the connection is closed, which an agent takes as the caller
-- leaving. Safe from a finalizer: a cosocket belongs to its request, and a collector running in
-- another one must not raise there.
function transfer_mt:close()
  local sock = self.sock
  if sock then
    self.sock = nil
    if not self.done then
      self.done = true
      self.ok = false
      self.error = "closed by its reader"
    end
    pcall(sock.close, sock)
  end
end

-- Sending -------------------------------------------------------------------------------------

local function pool_name(url, spec, fresh)
  local name = url.scheme .. "://" .. url.host .. ":" .. url.port .. "|" .. (spec.tls_server_name or "")
  if spec.unix_socket then name = name .. "|unix:" .. spec.unix_socket end
  if spec.client_cert_pem then name = name .. "|" .. ngx.md5(spec.client_cert_pem) end
  -- A connection verified against one request's CAs is no proof for another's.
  if spec.ca_pem then
    name = name .. "|ca:" .. ngx.md5(spec.ca_pem)
  elseif spec.ca_file then
    name = name .. "|ca-file:" .. spec.ca_file
  end
  -- A pool nothing is ever put back into: connecting through it always opens a new connection.
  if fresh then name = name .. "|fresh" end
  return name
end

local function timed_out(deadline)
  return deadline and core.now() >= deadline
end

--- Reads response heads until a final one (http1.head_reader's). Returns the head and the
-- bytes after it, or nil, kind ("timeout" | "failed"), detail, got_bytes.
local function read_head(sock, deadline)
  local reader = http1.head_reader()
  while true do
    local head, rest = reader:next()
    if head then return head, rest end
    if head == nil then return nil, "failed", rest, true end
    local got = reader:pending() > 0
    if timed_out(deadline) then return nil, "timeout", nil, got end
    sock:settimeout(ms_until(deadline))
    local data, err = sock:receiveany(HEAD_READ)
    if data then
      reader:feed(data)
    elseif err == "timeout" then
      if timed_out(deadline) then return nil, "timeout", nil, got end
    else
      return nil, "failed", err == "closed" and "the connection closed before the response headers"
        or tostring(err), got
    end
  end
end

--- Sends a streamed request body from spec.body_reader (sandkit.http's, which holds the source
-- to its body_length and reports progress: it returns the next piece, nil at the end, or nil,
-- detail and the source's error), each piece within spec.stall_timeout. Returns true, or nil
-- and a failure (the head went out).
local function send_body(sock, spec)
  local chunked = not spec.body_length
  local stall_ms = ceil((spec.stall_timeout or SLICE_MS / 1000) * 1000)
  while true do
    local piece, why, source_error = spec.body_reader()
    if piece == nil then
      if why ~= nil then
        return nil, { kind = "failed", sent = true, detail = why, source_error = source_error }
      end
      local ok, serr = true, nil
      if chunked then ok, serr = sock:send(http1.LAST_CHUNK) end
      if not ok then return nil, { kind = "failed", sent = true, detail = tostring(serr) } end
      return true
    end
    if #piece > 0 then
      sock:settimeout(stall_ms)
      local ok, serr = sock:send(chunked and http1.chunk(piece) or piece)
      if not ok then
        return nil, { kind = "failed", sent = true,
          detail = "sending the request body failed: " .. tostring(serr) }
      end
    end
  end
end

local function attempt(spec, url, head_bytes, fresh)
  local deadline = spec.header_deadline
  if spec.body_reader then deadline = core.now() + (spec.stall_timeout or SLICE_MS / 1000) end
  local sock = ngx.socket.tcp()
  local connect_ms = spec.connect_timeout and floor(spec.connect_timeout * 1000) or DEFAULT_CONNECT_MS
  if deadline then connect_ms = min(connect_ms, ms_until(deadline)) end
  sock:settimeout(connect_ms < 1 and 1 or connect_ms)
  local options = { pool = pool_name(url, spec, fresh), pool_size = POOL_SIZE }
  local ok, err
  if spec.unix_socket then
    ok, err = sock:connect("unix:" .. spec.unix_socket, options)
  else
    ok, err = sock:connect(url.host, url.port, options)
  end
  if not ok then
    if timed_out(deadline) then return nil, { kind = "timeout", sent = false } end
    return nil, { kind = "refused", sent = false, detail = "connecting to "
      .. (spec.unix_socket and ("unix:" .. spec.unix_socket) or (url.host .. ":" .. url.port))
      .. " failed: " .. tostring(err) }
  end
  local reused = (sock:getreusedtimes() or 0) > 0
  if url.scheme == "https" and not reused then
    sock:settimeout(ms_until(deadline))
    ok, err = tls.handshake(sock, url, spec)
    if not ok then
      sock:close()
      if timed_out(deadline) then return nil, { kind = "timeout", sent = false } end
      return nil, { kind = "refused", sent = false, detail = err }
    end
  end
  sock:settimeout(ms_until(deadline))
  ok, err = sock:send(spec.body and (head_bytes .. spec.body) or head_bytes)
  if not ok then
    sock:close()
    if timed_out(deadline) then return nil, { kind = "timeout", sent = true } end
    return nil, { kind = "failed", sent = true, detail = "sending the request failed: " .. tostring(err),
      stale = reused }
  end
  if spec.body_reader then
    local failure
    ok, failure = send_body(sock, spec)
    if not ok then
      sock:close()
      return nil, failure
    end
    -- Once the whole body is out, the answer's own bound starts.
    deadline = spec.header_timeout and core.now() + spec.header_timeout or spec.header_deadline
  end
  local head, rest, detail, got = read_head(sock, deadline)
  if not head then
    sock:close()
    -- Only a pooled connection that died before any byte of an answer is stale: one that
    -- took the request and said nothing by the deadline may be acting on it.
    return nil, { kind = rest, sent = true, detail = detail, stale = reused and rest == "failed" and not got }
  end
  return sock, head, rest
end

--- Sends a request and waits for its response headers, at most until spec.header_deadline.
-- Returns a transfer (above) and its status, or nil and a failure as http.send describes it.
function cosocket.send(spec)
  if spec.proxy then
    return nil, { kind = "refused", sent = false,
      detail = "proxies are not supported over nginx cosockets (proxy = " .. tostring(spec.proxy) .. ")" }
  end
  if type(spec.method) ~= "string" or spec.url == nil then
    error("a request needs a method and a url", 3)
  end
  if not spec.method:match("^%u+$") then error("invalid request method " .. spec.method, 3) end
  for _, field in ipairs(PEM_FIELDS) do
    local pem = spec[field]
    -- Refused before anything parses it, as the libcurl transport refuses it.
    if type(pem) == "string" and #pem > MAX_PEM then error(format("PEM text over %d bytes", MAX_PEM), 3) end
  end
  if spec.unix_socket and #spec.unix_socket > LIMITS.MAX_UNIX_SOCKET then
    error(format("a Unix socket's path over %d bytes", LIMITS.MAX_UNIX_SOCKET), 3)
  end
  local url, why = http1.parse_url(spec.url)
  if not url then return nil, { kind = "refused", sent = false, detail = why } end
  local head_bytes = http1.request_head(spec, url)
  -- A streamed body cannot be sent twice: it goes out on a connection of its own.
  local fresh = spec.fresh_connect == true or spec.body_reader ~= nil
  local sock, head, rest = attempt(spec, url, head_bytes, fresh)
  if not sock and head.stale and not fresh then
    -- A pooled connection the server had closed: the request cannot have been acted on (no
    -- byte of an answer came), it is idempotent, and it goes once more on a new connection.
    fresh = true
    sock, head, rest = attempt(spec, url, head_bytes, true)
  end
  if not sock then
    head.stale = nil
    return nil, head
  end
  local status = head.status
  local limit
  if status >= 200 and status < 300 then limit = spec.max_body else limit = spec.max_error_body end
  if limit == 0 then limit = nil end
  local buffer = spec.buffer_size
  if not buffer or buffer == 0 then buffer = DEFAULT_BUFFER end
  if buffer < MIN_BUFFER then buffer = MIN_BUFFER end
  local body = http1.body_decoder(head, spec.method)
  local t = setmetatable({
    sock = sock, status = status, header_table = head.headers, out = {}, body = body,
    received = 0, limit = limit, buffer = buffer, done = false,
    -- Only a connection from the shared pool goes back to it: one opened for a request that
    -- may start a command must never serve another request.
    poolable = not fresh,
  }, transfer_mt)
  local length = body:length()
  if limit and length and length > limit then
    t.too_long = true
    finish(t, false, "the body's Content-Length exceeds its " .. limit .. "-byte bound")
    return t, status
  end
  body:feed(rest)
  process(t)
  return t, status
end

return cosocket
