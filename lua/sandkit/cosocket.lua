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
-- TLS is always verified (`sslhandshake` with verification on) against nginx's
-- `lua_ssl_trusted_certificate`: a cosocket cannot be given a CA per request. A request that
-- names its own CAs (`ca_pem`, `ca_file`) is verified against them as well, after the
-- handshake, so they stay the only CAs it trusts, as over libcurl: nginx must trust them too.
-- The name checked and sent as SNI is `tls_server_name`, else the URL's host; nginx checks DNS
-- names only, so a host that is an IP address is sent no SNI and checked here against the
-- certificate's IP addresses. `client_cert_pem` and `client_key_pem` are presented through
-- `tcpsock:setclientcert`. Proxies are not supported.

local core = require "sandkit.core"

local cosocket = {}

local concat, find, sub, byte, format = table.concat, string.find, string.sub, string.byte, string.format
local floor, ceil, min = math.floor, math.ceil, math.min

--- Bytes of status line and headers one response may have: as much as the libcurl transport
-- keeps (SK_TRANSFER_MAX_HEADER_BYTES); no answer sandkit reads comes near it.
local MAX_HEAD = 16 * 1024
--- Response headers kept by name; past this they are dropped, as the libcurl transport does.
local MAX_HEADERS = 64
--- Request headers a caller may add (SK_TRANSFER_MAX_REQUEST_HEADERS).
local MAX_REQUEST_HEADERS = 64
--- Body bytes one socket read takes, and so the most a transfer holds unread: the libcurl
-- transport's buffer (SK_TRANSFER_BUFFER), room for one whole 64 KiB output frame line.
local DEFAULT_BUFFER = 128 * 1024
--- Below this a reader would pay a socket read per few hundred bytes of a frame line.
local MIN_BUFFER = 16 * 1024
--- The most one socket read takes: just under 128 KiB, because LuaJIT's allocator maps a fresh
-- region for every string of 128 KiB or more, and a read's string, freed moments later, would
-- then cost page faults on every read. (nginx's lua_socket_buffer_size bounds a read too: at
-- its default of a page, a stream costs a system call per 4 KiB.)
local MAX_READ = 127 * 1024
--- PEM text a request may hand in (ca_pem, client_cert_pem, client_key_pem, a ca_file's
-- contents): the libcurl transport's bound (SK_TRANSFER_MAX_PEM, a megabyte, several times
-- a whole system CA bundle), so both transports refuse the same requests.
local MAX_PEM = core.MAX_PEM
local PEM_FIELDS = { "ca_pem", "client_cert_pem", "client_key_pem" }
--- A chunk-size line with its extensions; servers write a few dozen bytes.
local MAX_CHUNK_LINE = 4096
--- How long a pooled connection may idle, and how many one origin keeps: an agent's keep-alive
-- connections are cheap for it, but an idle one past half a minute is likely closed by a proxy.
local KEEPALIVE_IDLE_MS = 30000
local POOL_SIZE = 16
--- A socket read needs a finite timeout; a wait with no deadline goes in slices this long.
local SLICE_MS = 60000
--- Connecting without a connect_timeout of the caller's: libcurl's own default is longer, but a
-- worker's light thread should not sit on a black-holed address for minutes.
local DEFAULT_CONNECT_MS = 30000

local USER_AGENT = "sandkit/" .. core._VERSION

local function ms_until(deadline)
  if not deadline then return SLICE_MS end
  local left = ceil((deadline - core.now()) * 1000)
  if left < 1 then return 1 end
  if left > SLICE_MS then return SLICE_MS end
  return left
end

-- URLs ----------------------------------------------------------------------------------------

local DEFAULT_PORT = { http = 80, https = 443 }

--- { scheme, host (brackets kept for IPv6), port, target, ip = bare address | nil }, or nil, why.
local function parse_url(url)
  if type(url) ~= "string" then return nil, "the URL is not a string" end
  local scheme, authority, rest = url:match("^(%a[%w+.-]*)://([^/?#]*)(.*)$")
  scheme = scheme and scheme:lower()
  if not DEFAULT_PORT[scheme] then return nil, "not an http or https URL: " .. url end
  if authority:find("@", 1, true) then return nil, "credentials in a URL are refused" end
  local host, port
  if authority:sub(1, 1) == "[" then
    host, port = authority:match("^(%[[%x:.]+%]):?(%d*)$")
  else
    host, port = authority:match("^([%w.%-_]+):?(%d*)$")
  end
  if not host then return nil, "a URL without a valid host: " .. url end
  port = port ~= "" and tonumber(port) or DEFAULT_PORT[scheme]
  if port < 1 or port > 65535 then return nil, "a URL with a bad port: " .. url end
  local target = rest:gsub("#.*$", "")
  if target == "" then target = "/" elseif target:sub(1, 1) == "?" then target = "/" .. target end
  if target:find("[%s%c]") then return nil, "a URL with spaces or control characters" end
  local ip
  if host:sub(1, 1) == "[" then
    ip = host:sub(2, -2)
  elseif host:match("^%d+%.%d+%.%d+%.%d+$") then
    ip = host
  end
  return { scheme = scheme, host = host, port = port, target = target, ip = ip }
end

-- TLS -----------------------------------------------------------------------------------------

local x509

--- Declares what the checks below call of the OpenSSL nginx is linked with, once.
local function openssl()
  if not x509 then
    local ffi = require "ffi"
    for _, decl in ipairs{ "typedef struct x509_st X509;", "typedef struct bio_st BIO;",
        "typedef struct x509_store_st X509_STORE;", "typedef struct x509_store_ctx_st X509_STORE_CTX;",
        "X509 *SSL_SESSION_get0_peer(void *session);",
        "int X509_check_ip_asc(X509 *x, const char *address, unsigned int flags);",
        "BIO *BIO_new_mem_buf(const void *buf, int len);", "int BIO_free(BIO *a);",
        "X509 *PEM_read_bio_X509(BIO *bp, X509 **x, void *cb, void *u);", "void X509_free(X509 *a);",
        "X509_STORE *X509_STORE_new(void);", "void X509_STORE_free(X509_STORE *v);",
        "int X509_STORE_add_cert(X509_STORE *ctx, X509 *x);",
        "int X509_STORE_set_flags(X509_STORE *ctx, unsigned long flags);",
        "X509_STORE_CTX *X509_STORE_CTX_new(void);", "void X509_STORE_CTX_free(X509_STORE_CTX *ctx);",
        "int X509_STORE_CTX_init(X509_STORE_CTX *ctx, X509_STORE *store, X509 *x509, void *chain);",
        "int X509_verify_cert(X509_STORE_CTX *ctx);", "int X509_STORE_CTX_get_error(X509_STORE_CTX *ctx);",
        "const char *X509_verify_cert_error_string(long n);", "void ERR_clear_error(void);" } do
      -- Another module may have declared it already; a second declaration is an error.
      pcall(ffi.cdef, decl)
    end
    x509 = { ffi = ffi, C = ffi.C }
  end
  return x509
end

--- X509_V_FLAG_PARTIAL_CHAIN: a certificate of the request's own CAs is an anchor even when it
-- is an intermediate, as it is for libcurl's CAINFO.
local PARTIAL_CHAIN = 0x80000

--- The check nginx does not do: a peer reached by IP address must name that address among its
-- certificate's IP addresses (X509_check_ip_asc).
local function names_ip(peer, address)
  return openssl().C.X509_check_ip_asc(peer, address, 0) == 1
end

--- Whether the peer certificate chains to a CA of the PEM bundle `anchors` alone: nil when it
-- does, else why not. nginx has already verified the chain against its own trusted CAs; this
-- keeps a request's CA meaning what it means over libcurl, the only CAs trusted. The chain
-- the server sent is not kept in the session, so an intermediate between the certificate and
-- the request's CA must be in the bundle itself.
local function chains_to(peer, anchors)
  local o = openssl()
  local C, ffi = o.C, o.ffi
  local store = C.X509_STORE_new()
  local ctx = C.X509_STORE_CTX_new()
  local bio = C.BIO_new_mem_buf(anchors, #anchors)
  local why
  if store == nil or ctx == nil or bio == nil then
    why = "out of memory"
  else
    local count = 0
    while true do
      local cert = C.PEM_read_bio_X509(bio, nil, nil, nil)
      if cert == nil then break end
      count = count + 1
      -- The store holds its own reference; this one is released either way.
      local added = C.X509_STORE_add_cert(store, cert)
      C.X509_free(cert)
      if added ~= 1 then
        why = "a certificate of it could not be used"
        break
      end
    end
    if not why and count == 0 then why = "it holds no PEM certificate" end
    if not why then
      C.X509_STORE_set_flags(store, PARTIAL_CHAIN)
      if C.X509_STORE_CTX_init(ctx, store, peer, nil) ~= 1 then
        why = "out of memory"
      elseif C.X509_verify_cert(ctx) ~= 1 then
        why = ffi.string(C.X509_verify_cert_error_string(C.X509_STORE_CTX_get_error(ctx)))
      end
    end
  end
  if bio ~= nil then C.BIO_free(bio) end
  if ctx ~= nil then C.X509_STORE_CTX_free(ctx) end
  if store ~= nil then C.X509_STORE_free(store) end
  -- The end of the bundle leaves "no start line" queued, and nginx reads the queue after its
  -- own TLS calls on this worker.
  C.ERR_clear_error()
  return why
end

--- A request's own CAs, as PEM text: ca_pem, else the file ca_file. nil when it names none;
-- nil, why when the file cannot be read.
local function request_anchors(spec)
  if spec.ca_pem ~= nil then return spec.ca_pem, "ca_pem" end
  if spec.ca_file == nil then return nil end
  local f, err = io.open(spec.ca_file, "rb")
  if not f then return nil, "the request's CA file cannot be read: " .. tostring(err) end
  -- One byte past the bound tells a file over it from one exactly at it, without reading more.
  local text = f:read(MAX_PEM + 1) or ""
  f:close()
  if #text > MAX_PEM then
    return nil, format("the request's CA file %s is over %d bytes", spec.ca_file, MAX_PEM)
  end
  return text, "ca_file " .. spec.ca_file
end

local function present_client_certificate(sock, spec)
  if spec.client_cert_pem == nil and spec.client_key_pem == nil then return true end
  if type(spec.client_cert_pem) ~= "string" or type(spec.client_key_pem) ~= "string" then
    return nil, "a client certificate needs both client_cert_pem and client_key_pem"
  end
  local ssl = require "ngx.ssl"
  local cert, err = ssl.parse_pem_cert(spec.client_cert_pem)
  if not cert then return nil, "the client certificate did not parse: " .. tostring(err) end
  local key
  key, err = ssl.parse_pem_priv_key(spec.client_key_pem)
  if not key then return nil, "the client key did not parse: " .. tostring(err) end
  return sock:setclientcert(cert, key)
end

--- Verifies the server and, for mTLS, presents the client certificate. true, or nil and why.
local function handshake(sock, url, spec)
  local anchors, source = request_anchors(spec)
  if source and not anchors then return nil, source end
  local ok, err = present_client_certificate(sock, spec)
  if not ok then return nil, err end
  local name = spec.tls_server_name
  if name == nil and not url.ip then name = url.host end
  local peer_name = name or url.ip
  local session
  session, err = sock:sslhandshake(nil, name, true)
  if not session then return nil, "TLS handshake with " .. peer_name .. " failed: " .. tostring(err) end
  -- The handshake verified the chain against nginx's CAs (and a DNS name); what it did not
  -- check is read from the session's peer certificate.
  local peer = session ~= nil and openssl().C.SSL_SESSION_get0_peer(session) or nil
  if peer == nil then
    return nil, "TLS handshake with " .. peer_name .. " failed: no peer certificate to check"
  end
  if not name and not names_ip(peer, url.ip) then
    return nil, "TLS handshake with " .. url.ip .. " failed: the certificate does not name "
      .. url.ip .. " (certificate host mismatch)"
  end
  if anchors then
    local why = chains_to(peer, anchors)
    if why then
      return nil, "TLS handshake with " .. peer_name .. " failed: its certificate does not chain "
        .. "to the CA this request trusts (" .. source .. "): " .. why
    end
  end
  return true
end

-- The request ---------------------------------------------------------------------------------

local function valid_header_text(s)
  return not find(s, "[\r\n%z]")
end

local function request_head(spec, url)
  local lines = { spec.method .. " " .. url.target .. " HTTP/1.1" }
  local given = {}
  local n = 0
  for name, value in pairs(spec.headers or {}) do
    if type(name) ~= "string" then error("request header names must be strings", 3) end
    if type(value) ~= "string" then error("invalid request header " .. name, 3) end
    -- A CR or LF in a header would let a value start a header of its own.
    if name == "" or not valid_header_text(name) or not valid_header_text(value)
        or find(name, ":", 1, true) then
      error("invalid request header " .. name, 3)
    end
    n = n + 1
    if n > MAX_REQUEST_HEADERS then error("more than 64 request headers", 3) end
    given[name:lower()] = true
    lines[#lines + 1] = name .. ": " .. value
  end
  if not given.host then
    local host = url.host
    if url.port ~= DEFAULT_PORT[url.scheme] then host = host .. ":" .. url.port end
    lines[#lines + 1] = "Host: " .. host
  end
  if not given["user-agent"] then lines[#lines + 1] = "User-Agent: " .. USER_AGENT end
  local body = spec.body
  if body ~= nil and type(body) ~= "string" then error("a request body is a string", 3) end
  if spec.body_reader then
    -- A streamed body: its length when the caller knows it, else chunked.
    if spec.body_length then
      lines[#lines + 1] = "Content-Length: " .. format("%d", spec.body_length)
    else
      lines[#lines + 1] = "Transfer-Encoding: chunked"
    end
  elseif body or spec.method == "POST" or spec.method == "PUT" or spec.method == "PATCH" then
    lines[#lines + 1] = "Content-Length: " .. (body and #body or 0)
  end
  lines[#lines + 1] = "\r\n"
  return concat(lines, "\r\n")
end

-- The response head ---------------------------------------------------------------------------

--- Parses one head (the bytes before the blank line). Returns { status, headers, framing…, reuse },
-- or nil and why.
local function parse_head(text)
  local major, minor, status = text:match("^HTTP/(%d)%.(%d) (%d%d%d)")
  if not status then return nil, "the answer is not an HTTP/1.x response" end
  local head = { status = tonumber(status), headers = {}, count = 0,
    reuse = major == "1" and minor == "1" }
  local lengths, codings = {}, nil
  local last
  local first = true
  for line in text:gmatch("([^\n]*)\n?") do
    line = line:gsub("\r$", "")
    if first then
      first = false
    elseif line ~= "" then
      local c = byte(line, 1)
      if (c == 32 or c == 9) and last then
        -- An obsolete folded continuation of the header before.
        head.headers[last] = head.headers[last] .. " " .. line:match("^%s*(.-)%s*$")
      else
        local name, value = line:match("^([^:%s]+):[ \t]*(.-)[ \t]*$")
        if not name then return nil, "a malformed response header: " .. line:sub(1, 80) end
        name = name:lower()
        if name == "content-length" then
          lengths[#lengths + 1] = value
        elseif name == "transfer-encoding" then
          codings = codings and (codings .. "," .. value) or value
        elseif name == "connection" and value:lower():find("close", 1, true) then
          head.reuse = false
        end
        if head.headers[name] ~= nil or head.count < MAX_HEADERS then
          if head.headers[name] == nil then head.count = head.count + 1 end
          head.headers[name] = value
          last = name
        else
          last = nil
        end
      end
    end
  end
  if codings then
    -- The last coding decides the framing; without chunked last, the body runs to the close.
    head.chunked = codings:lower():match("([^,%s]+)%s*$") == "chunked"
    head.reuse = head.reuse and head.chunked
  elseif #lengths > 0 then
    for i = 1, #lengths do
      -- Two different lengths are how a response smuggles a second one past a proxy.
      if not lengths[i]:match("^%d+$") or lengths[i] ~= lengths[1] then
        return nil, "the response's Content-Length is malformed or repeated with another value"
      end
    end
    head.length = tonumber(lengths[1])
  end
  return head
end

-- Transfers -----------------------------------------------------------------------------------

local transfer_mt = {}
transfer_mt.__index = transfer_mt

local function finish(t, ok, err)
  t.done = true
  t.ok = ok
  t.error = err
  if ok and t.poolable and t.raw == "" then
    t.sock:setkeepalive(KEEPALIVE_IDLE_MS, POOL_SIZE)
  else
    t.sock:close()
  end
  t.sock = nil
end

local function deliver(t, bytes)
  if bytes == "" then return true end
  t.received = t.received + #bytes
  if t.limit and t.received > t.limit then
    t.too_long = true
    finish(t, false, "the body exceeded its " .. t.limit .. "-byte bound")
    return false
  end
  t.out[#t.out + 1] = bytes
  return true
end

--- Moves what the raw bytes hold of the body into the reader's queue, following the framing.
local function process(t)
  local raw = t.raw
  if t.mode == "length" then
    local take = min(#raw, t.left)
    t.left = t.left - take
    if take == #raw then
      t.raw = ""
    else
      t.raw = sub(raw, take + 1)
      raw = sub(raw, 1, take)
    end
    if deliver(t, raw) and t.left == 0 then finish(t, true) end
    return
  elseif t.mode == "close" then
    t.raw = ""
    deliver(t, raw)
    return
  end
  -- chunked
  local pos, n = 1, #raw
  while not t.done do
    local state = t.chunk_state
    if state == "data" then
      if pos > n then break end
      local take = min(n - pos + 1, t.left)
      -- A read that is all chunk data (see await) goes on as it is, uncopied.
      if not deliver(t, take == n and raw or sub(raw, pos, pos + take - 1)) then return end
      pos = pos + take
      t.left = t.left - take
      if t.left == 0 then t.chunk_state = "crlf" end
    else
      local e = find(raw, "\n", pos, true)
      if not e then
        if n - pos + 1 > MAX_CHUNK_LINE then
          return finish(t, false, "a chunk line longer than " .. MAX_CHUNK_LINE .. " bytes")
        end
        break
      end
      local line = sub(raw, pos, e - 1):gsub("\r$", "")
      pos = e + 1
      if state == "crlf" then
        if line ~= "" then return finish(t, false, "a chunk not followed by CRLF") end
        t.chunk_state = "size"
      elseif state == "size" then
        local hex = line:match("^(%x+)[ \t]*$") or line:match("^(%x+)[ \t]*;")
        if not hex or #hex > 12 then return finish(t, false, "a malformed chunk size line") end
        local size = tonumber(hex, 16)
        if size == 0 then
          t.chunk_state = "trailer"
          t.trailer = 0
        else
          t.left = size
          t.chunk_state = "data"
        end
      else -- trailer lines, up to the blank line that ends the body
        t.trailer = t.trailer + #line
        if t.trailer > MAX_HEAD then return finish(t, false, "trailers longer than the head bound") end
        if line == "" then
          t.raw = sub(raw, pos)
          return finish(t, true)
        end
      end
    end
  end
  if not t.done then t.raw = sub(raw, pos) end
end

local function ended_early(t)
  if t.mode == "close" then return finish(t, true) end
  if t.mode == "length" then
    return finish(t, false, string.format(
      "the connection closed with %d bytes of the body outstanding", t.left))
  end
  return finish(t, false, "the connection closed before the chunked body ended")
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
  -- than waiting in Lua strings while the reader is busy with this chunk's frames.
  if self.mode == "length" or (self.mode == "chunked" and self.chunk_state == "data") then
    want = min(want, self.left)
  end
  local data, err = sock:receiveany(want)
  if data then
    self.raw = self.raw == "" and data or (self.raw .. data)
    process(self)
    return true
  end
  if err == "timeout" then return false end
  if err == "closed" then
    ended_early(self)
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

--- Reads response heads until a final one (1xx answers are skipped). Returns the head and the
-- bytes after it, or nil, kind ("timeout" | "failed"), detail, got_bytes.
local function read_head(sock, deadline)
  local buf = ""
  while true do
    local s, e = find(buf, "\r?\n\r?\n")
    if (s or #buf) > MAX_HEAD then
      return nil, "failed", "response headers longer than " .. MAX_HEAD .. " bytes", true
    elseif s then
      local head, why = parse_head(sub(buf, 1, s))
      if not head then return nil, "failed", why, true end
      buf = sub(buf, e + 1)
      if head.status >= 200 or head.status == 101 then return head, buf end
    else
      if timed_out(deadline) then return nil, "timeout", nil, #buf > 0 end
      sock:settimeout(ms_until(deadline))
      local data, err = sock:receiveany(MAX_HEAD + 4)
      if data then
        buf = buf .. data
      elseif err == "timeout" then
        if timed_out(deadline) then return nil, "timeout", nil, #buf > 0 end
      else
        return nil, "failed", err == "closed" and "the connection closed before the response headers"
          or tostring(err), #buf > 0
      end
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
      if chunked then ok, serr = sock:send("0\r\n\r\n") end
      if not ok then return nil, { kind = "failed", sent = true, detail = tostring(serr) } end
      return true
    end
    if #piece > 0 then
      sock:settimeout(stall_ms)
      local ok, serr = sock:send(chunked and { format("%x\r\n", #piece), piece, "\r\n" } or piece)
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
  local ok, err = sock:connect(url.host, url.port, { pool = pool_name(url, spec, fresh),
    pool_size = POOL_SIZE })
  if not ok then
    if timed_out(deadline) then return nil, { kind = "timeout", sent = false } end
    return nil, { kind = "refused", sent = false,
      detail = "connecting to " .. url.host .. ":" .. url.port .. " failed: " .. tostring(err) }
  end
  local reused = (sock:getreusedtimes() or 0) > 0
  if url.scheme == "https" and not reused then
    sock:settimeout(ms_until(deadline))
    ok, err = handshake(sock, url, spec)
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
  local url, why = parse_url(spec.url)
  if not url then return nil, { kind = "refused", sent = false, detail = why } end
  local head_bytes = request_head(spec, url)
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
  local t = setmetatable({
    sock = sock, status = status, header_table = head.headers, out = {}, raw = rest,
    received = 0, limit = limit, buffer = buffer, done = false,
    -- Only a connection from the shared pool goes back to it: one opened for a request that
    -- may start a command must never serve another request.
    poolable = head.reuse and not fresh,
  }, transfer_mt)
  if spec.method == "HEAD" or status == 204 or status == 304 or status == 101 then
    t.mode = "length"
    t.left = 0
  elseif head.chunked then
    t.mode = "chunked"
    t.chunk_state = "size"
  elseif head.length then
    t.mode = "length"
    t.left = head.length
    if limit and head.length > limit then
      t.too_long = true
      finish(t, false, "the body's Content-Length exceeds its " .. limit .. "-byte bound")
      return t, status
    end
  else
    t.mode = "close"
    t.poolable = false
  end
  if t.mode == "length" and t.left == 0 then
    finish(t, true)
  elseif t.raw ~= "" then
    process(t)
  end
  return t, status
end

cosocket.parse_url = parse_url

return cosocket
