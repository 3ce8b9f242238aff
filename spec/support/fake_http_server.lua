--- A scriptable HTTP/1.1 server for specs, run as its own process:
--   lua5.4 spec/support/fake_http_server.lua <scenario.lua> <log-file>
-- It listens on 127.0.0.1 (port chosen by the kernel), writes "<port>\n" to descriptor 3 once
-- it is listening, and serves every connection in its own cqueues coroutine, so one
-- connection can stall while another is served.
--
-- The scenario file returns a table:
--   handle(req, conn)   called per request once its headers and body are read (a
--                       Content-Length body, or a chunked one decoded);
--                       req = { method, path, query, headers = {lower-case}, body, index }
--   accept(conn)        optional: called on accept before anything is read; returning false
--                       ends the connection without reading (e.g. accept and close)
-- conn offers write(bytes), sleep(seconds), close(), log(table), and state (a table shared by
-- every connection). Every request is appended to the log file as one JSON line before
-- `handle` runs, so a spec reading the log after its call returns sees every delivery; a body
-- over LOG_BODY bytes is logged by its length and checksum alone (body_length, body_sum).

local cqueues = require "cqueues"
local socket = require "cqueues.socket"
local cjson = require "cjson"
local body_sum = require("support.files").checksum

local scenario = dofile(arg[1])
local log = assert(io.open(arg[2], "a"))
log:setvbuf("line")

local shared = {}
local request_count = 0
--- Bodies larger than this (a big file upload) are not copied into the log.
local LOG_BODY = 1024 * 1024

local function record(entry)
  log:write(cjson.encode(entry), "\n")
end

local function wrap(sock)
  local conn = { state = shared, closed = false }
  function conn.write(_, bytes)
    if conn.closed then return end
    sock:write(bytes)
    sock:flush()
  end
  function conn.sleep(_, seconds) cqueues.sleep(seconds) end
  function conn.close()
    if not conn.closed then
      conn.closed = true
      sock:shutdown("rw")
      sock:close()
    end
  end
  function conn.log(_, entry) record(entry) end
  return conn
end

local function read_request(sock)
  local line = sock:read("*l")
  if not line then return nil end
  local method, target = line:match("^(%u+) (%S+) HTTP/1%.%d\r?$")
  if not method then return nil end
  local headers = {}
  while true do
    local h = sock:read("*l")
    if not h then return nil end
    h = h:gsub("\r$", "")
    if h == "" then break end
    local name, value = h:match("^([^:]+):%s*(.-)%s*$")
    if name then headers[name:lower()] = value end
  end
  local body = ""
  local length = tonumber(headers["content-length"] or "0")
  if (headers["transfer-encoding"] or ""):lower() == "chunked" then
    local parts = {}
    while true do
      local size_line = sock:read("*l")
      local size = size_line and tonumber(size_line:match("^%x+"), 16)
      if not size then return nil end
      if size == 0 then
        sock:read("*l") -- the empty line after the last chunk (no trailers are sent)
        break
      end
      parts[#parts + 1] = sock:read(size) or ""
      sock:read("*l")
    end
    body = table.concat(parts)
  elseif length and length > 0 then
    body = sock:read(length) or ""
  end
  local path, query = target:match("^([^?]*)%??(.*)$")
  return { method = method, path = path, query = query, target = target, headers = headers, body = body }
end

local function serve(sock)
  sock:setmode("b", "b")
  local conn = wrap(sock)
  if scenario.accept and scenario.accept(conn) == false then
    conn:close()
    return
  end
  while not conn.closed do
    local req = read_request(sock)
    if not req then break end
    request_count = request_count + 1
    req.index = request_count
    local large = #req.body > LOG_BODY
    record{ method = req.method, path = req.path, query = req.query,
      body = not large and req.body or nil, body_length = #req.body,
      body_sum = large and body_sum(req.body) or nil, headers = req.headers, index = req.index }
    scenario.handle(req, conn)
    if req.headers.connection == "close" then break end
  end
  conn:close()
end

local cq = cqueues.new()
local server = socket.listen{ host = "127.0.0.1", port = 0, reuseaddr = true }
local _, _, port = server:localname()
cq:wrap(function()
  for sock in server:clients() do
    -- A client that goes away mid-answer (a stream closed after its exit frame, say) makes the
    -- next write fail: that ends its connection, never the server the next spec talks to.
    cq:wrap(function()
      local ok, err = pcall(serve, sock)
      if not ok then
        record{ connection_error = tostring(err) }
        pcall(sock.close, sock)
      end
    end)
  end
end)
local ready = assert(io.open("/dev/fd/3", "w"))
ready:write(port, "\n")
ready:close()
assert(cq:loop())
