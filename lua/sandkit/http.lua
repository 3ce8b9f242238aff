--- HTTP requests over the C core, with sandkit's waiting policy. This module reports facts —
-- whether a request left, whether headers came, the status, whether a body ended cleanly,
-- within which bounds — and never decides what they mean: the agent protocol and each cloud
-- client classify them.
--
-- Two transports sit under the same interface. Outside nginx every transfer in a Lua state
-- shares one libcurl client of the C core: one pool of connections and one pollable, so a
-- scheduler can wait on all of them at once. Inside an nginx worker requests go over cosockets
-- (sandkit.cosocket), which park the request's light thread instead of blocking the worker;
-- in an nginx phase without cosockets a request is refused, naming the phase. Callers see the
-- same responses and transfers from both.

local json_codec = require "sandkit.json"
local core = require "sandkit.core"
local localfile = require "sandkit.localfile"
local wait = require "sandkit.wait"

local http = {}

local VERSION = core._VERSION
local shared_client

--- The client every request in this Lua state goes through, made on first use (never at
-- require time: an nginx master must not own it across fork).
function http.client()
  if not shared_client then
    shared_client = core.client{ user_agent = "sandkit/" .. VERSION }
  end
  return shared_client
end

local response_mt = {}
response_mt.__index = response_mt

--- Starts a request and waits for its response headers, at most until `header_deadline`.
-- spec: method, url, headers, body, fresh_connect, ca_file, proxy, connect_timeout,
--       max_body, max_error_body, buffer_size, header_deadline (absolute, core.now clock),
--       ca_pem, client_cert_pem, client_key_pem (PEM text: the only CA trusted, and a client
--       certificate for mTLS), tls_server_name (the name the certificate is verified against
--       and sent as SNI, when it is not the URL's host), unix_socket (the path of a Unix socket
--       to connect to instead of the URL's host and port, which then only name the request)
-- A body of any size can instead come from `body_reader`, a function returning the next chunk,
-- nil at the end, or nil and an error; `body_length` (bytes) sends it with a Content-Length,
-- without it the body is chunked. It goes out on a fresh connection, in bounded memory, while
-- this waits; the wait is then bounded by `stall_timeout` (seconds the body may stop moving)
-- until it is all sent and by `header_timeout` (seconds) after that — a deadline fixed before
-- a large upload would cut it — and `on_body(bytes_sent)` hears its progress. With it may
-- come `body_file`, the open file (io.open's, seekable) the reader reads: the libcurl transport
-- then reads the file itself, straight into its send buffer (no Lua string a piece), and the
-- reader is left unused; cosockets take the reader's pieces.
-- Returns a response, or nil and a failure: { kind = "refused" (nothing was sent) |
-- "timeout" (no headers in time) | "failed" (the connection failed after sending),
-- sent = bool, detail = the transport's sentence, source_error = the reader's error when it failed }.
--
-- A source that gives more or fewer bytes than its body_length fails the request as soon as
-- it does, over either transport: bytes past a Content-Length would reach the server as the
-- start of another request, and a body cut short would leave it waiting for the rest.

--- Tells the collector that a body's piece of `bytes` became garbage (written out, or taken by
-- the transport). Its own pace lets garbage grow to the live heap's size again before a cycle
-- (LuaJIT's lets the heap double), which over a body of many MiB is pieces enough to take a
-- reader or a writer past its memory bound; a step the piece's size keeps collecting them in
-- time with their coming.
function http.let_go(bytes)
  collectgarbage("step", math.floor(bytes / 1024))
end

--- What a streamed body's source may not do, worded once for both kinds of source.
local function past_length(length)
  return string.format("the request body's source gave more than the %d bytes announced", length)
end

local function short_of_length(sent, length)
  return string.format("the request body's source gave %d bytes, not the %d announced", sent, length)
end

--- The body_reader a transport calls: spec.body_reader's pieces, held to spec.body_length, with
-- spec.on_body told of every piece the transport took (it asks for the next one only then).
-- Returns a piece, nil at the end, or nil, detail, the source's own error.
local function counted_reader(spec)
  local reader, length, on_body = spec.body_reader, spec.body_length, spec.on_body
  local sent, handed = 0, 0
  return function()
    if handed > 0 then
      sent = sent + handed
      http.let_go(handed)
      handed = 0
      if on_body then on_body(sent) end
    end
    local piece, err = reader()
    if piece == nil then
      if err ~= nil then return nil, "the request body's source failed: " .. tostring(err), err end
      if length and sent ~= length then return nil, short_of_length(sent, length) end
      return nil
    end
    if length and sent + #piece > length then return nil, past_length(length) end
    handed = #piece
    return piece
  end
end

--- Feeders of a libcurl transfer's streamed body. Each call feeds what fits and returns the
-- bytes taken and whether the send buffer is full (wait for the transfer, then call again); nil
-- at the body's end; or nil, nil, detail, the source's own error when the source failed.

--- From a reader's pieces (counted_reader's), keeping the part of a piece that did not fit.
local function piece_feeder(t, reader)
  local pending
  return function()
    if not pending then
      local chunk, why, source_error = reader()
      if chunk == nil then return nil, nil, why, source_error end
      pending = chunk
    end
    local taken = t:feed(pending)
    local full = taken < #pending
    pending = full and pending:sub(taken + 1) or nil
    return taken, full
  end
end

--- From an open file the transfer reads itself (t:feed_file), held to length as a reader is.
local function file_feeder(t, file, length, on_body)
  local sent = 0
  return function()
    local taken, err = t:feed_file(file)
    if taken == false then return nil, nil, past_length(length) end
    if taken == nil then
      if err ~= nil then return nil, nil, "the request body's source failed: " .. err, err end
      if length and sent ~= length then return nil, nil, short_of_length(sent, length) end
      return nil
    end
    if taken > 0 then
      sent = sent + taken
      if on_body then on_body(sent) end
    end
    return taken, taken == 0
  end
end

function http.send(spec)
  local reader, file, on_body = nil, spec.body_file, spec.on_body
  if spec.body_reader then
    local request = {}
    for k, v in pairs(spec) do request[k] = v end
    reader = counted_reader(spec)
    request.body_reader, request.on_body, request.body_file = reader, nil, nil
    spec = request
  end
  if wait.check_nginx() then
    local t, status = require("sandkit.cosocket").send(spec)
    if not t then return nil, status end
    return setmetatable({ transfer = t, status = status }, response_mt)
  end
  if spec.ca_file ~= nil and spec.ca_pem == nil then
    -- libcurl would open the file itself, where a FIFO hangs it past every deadline: it is
    -- read as every configuration file is, and libcurl gets its text, the only CAs trusted, as
    -- over cosockets.
    local pem, why = localfile.read_ca_file(spec.ca_file)
    if not pem then return nil, { kind = "refused", sent = false, detail = why } end
    local request = {}
    for k, v in pairs(spec) do request[k] = v end
    request.ca_file, request.ca_pem = nil, pem
    spec = request
  end
  local client = http.client()
  if reader then spec.body_reader, spec.body_stream = nil, true end
  local t = client:request(spec)
  local feed
  if reader and file then
    feed = file_feeder(t, file, spec.body_length, on_body)
  elseif reader then
    feed = piece_feeder(t, reader)
  end
  local deadline = spec.header_deadline
  if feed then deadline = core.now() + spec.stall_timeout end
  while true do
    while feed do
      local taken, full, detail, source_error = feed()
      if taken == nil then
        if detail ~= nil then
          local st = t:state()
          t:close()
          return nil, { kind = st.sent and "failed" or "refused", sent = st.sent, detail = detail,
            source_error = source_error }
        end
        t:finish()
        feed = nil
        deadline = core.now() + spec.header_timeout
        break
      end
      if taken > 0 then deadline = core.now() + spec.stall_timeout end
      if full then break end
    end
    client:step()
    local st = t:state()
    if st.headers then
      return setmetatable({ transfer = t, status = st.status, client = client }, response_mt)
    end
    if st.done then
      t:close()
      return nil, { kind = st.sent and "failed" or "refused", sent = st.sent, detail = st.error }
    end
    if deadline and core.now() >= deadline then
      t:close()
      return nil, { kind = "timeout", sent = st.sent }
    end
    wait.ready(t, deadline)
  end
end

function response_mt:headers()
  if not self.header_table then self.header_table = self.transfer:headers() end
  return self.header_table
end

function response_mt:close()
  self.transfer:close()
end

--- Reads the rest of the body, at most until deadline. Returns the body, or nil and a
-- failure: { kind = "too_long" (past the transfer's bound) | "stalled" (not over by the
-- deadline) | "failed" (the connection failed), detail = …, partial = bytes read }.
-- The transfer is closed either way.
function response_mt:read_all(deadline)
  local t, chunks = self.transfer, {}
  while true do
    local chunk = t:read()
    if chunk then
      chunks[#chunks + 1] = chunk
    elseif chunk == nil then
      local st = t:state()
      t:close()
      local body = table.concat(chunks)
      if st.ok then return body end
      return nil, { kind = st.too_long and "too_long" or "failed", detail = st.error, partial = body }
    elseif deadline and core.now() >= deadline then
      t:close()
      return nil, { kind = "stalled", partial = table.concat(chunks) }
    else
      wait.ready(t, deadline)
    end
  end
end

--- Bytes a control-plane answer may have by default: every AWS and Azure answer sandkit reads
-- is a small JSON document.
http.MAX_EXCHANGE_BODY = 1024 * 1024

--- A whole request and answer, for control-plane APIs whose answers are small documents:
-- spec as for http.send, plus `deadline` (absolute) bounding the exchange from start to end,
-- and `max_body` (default http.MAX_EXCHANGE_BODY) bounding the answer whatever its status.
-- Returns { status =, headers =, body =, json = <decoded table, or nil when not JSON> },
-- or nil and a failure as http.send and response:read_all describe it.
function http.exchange(spec)
  local limit = spec.max_body or http.MAX_EXCHANGE_BODY
  local request = {}
  for k, v in pairs(spec) do request[k] = v end
  request.max_body = limit
  request.max_error_body = limit
  request.header_deadline = spec.deadline
  local resp, failure = http.send(request)
  if not resp then return nil, failure end
  local headers = resp:headers()
  local body
  body, failure = resp:read_all(spec.deadline)
  if not body then
    failure.sent = true
    failure.status = resp.status
    return nil, failure
  end
  local json = body ~= "" and json_codec.decode(body) or nil
  return { status = resp.status, headers = headers, body = body,
    json = type(json) == "table" and json or nil }
end

return http
