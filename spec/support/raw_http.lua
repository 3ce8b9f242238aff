-- raw_http.lua — a small HTTP/1.1 client over LuaSocket for specs that must control the bytes:
-- send an exact request, read the status, headers and body (Content-Length, chunked or
-- close-delimited), read a chunked body incrementally, stop reading, or close abruptly.
-- Every read has a timeout, so a spec fails instead of hanging when a server stalls.

local socket = require "socket"

local M = {}

local Conn = {}
Conn.__index = Conn

local DEFAULT_TIMEOUT = 10

-- Opens a connection to host:port (host defaults to 127.0.0.1).
function M.connect(port, host, timeout)
  local sock = assert(socket.tcp())
  sock:settimeout(timeout or DEFAULT_TIMEOUT)
  local ok, err = sock:connect(host or "127.0.0.1", port)
  if not ok then
    sock:close()
    return nil, err
  end
  sock:setoption("tcp-nodelay", true)
  return setmetatable({ sock = sock, pending = "" }, Conn)
end

function Conn:settimeout(t)
  self.sock:settimeout(t)
end

-- Sends bytes exactly as given.
function Conn:send(data)
  local i = 1
  while i <= #data do
    local last, err = self.sock:send(data, i)
    if not last then return nil, err end
    i = last + 1
  end
  return true
end

-- Sends a request. headers is a map; Host and (when body is given) Content-Length are added
-- unless present. Returns true or nil, err.
function Conn:request(method, path, headers, body)
  self.head_request = method == "HEAD"
  local lines = { method .. " " .. path .. " HTTP/1.1" }
  local have = {}
  for k, v in pairs(headers or {}) do
    lines[#lines + 1] = k .. ": " .. v
    have[k:lower()] = true
  end
  if not have.host then lines[#lines + 1] = "Host: 127.0.0.1" end
  if body and not have["content-length"] then
    lines[#lines + 1] = "Content-Length: " .. #body
  end
  return self:send(table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or ""))
end

local function receive(self, what)
  local data, err, partial = self.sock:receive(what)
  if not data then return nil, err, partial end
  return data
end

-- Reads the status line and headers: status (number), headers (lower-case names; repeated
-- names joined with ", "), or nil, err.
function Conn:read_head()
  local line, err = receive(self, "*l")
  if not line then return nil, err end
  local status = tonumber(line:match("^HTTP/1%.[01] (%d%d%d)"))
  if not status then return nil, "bad status line: " .. line end
  local headers = {}
  while true do
    local h, herr = receive(self, "*l")
    if not h then return nil, herr end
    if h == "" then break end
    local name, value = h:match("^([^:]+):%s*(.-)%s*$")
    if not name then return nil, "bad header line: " .. h end
    name = name:lower()
    headers[name] = headers[name] and (headers[name] .. ", " .. value) or value
  end
  self.status = status
  self.headers = headers
  self.chunked = (headers["transfer-encoding"] or ""):lower():find("chunked") ~= nil
  return status, headers
end

-- Next chunk of a chunked body: its bytes, or "" after the last chunk (its trailers then in
-- self.trailers, lower-case names), or nil, err.
function Conn:read_chunk()
  local line, err = receive(self, "*l")
  if not line then return nil, err end
  local size = tonumber(line:match("^(%x+)"), 16)
  if not size then return nil, "bad chunk size line: " .. line end
  if size == 0 then
    self.trailers = {}
    while true do -- trailers, then the empty line
      local t, terr = receive(self, "*l")
      if not t then return nil, terr end
      if t == "" then break end
      local name, value = t:match("^([^:]+):%s*(.-)%s*$")
      if not name then return nil, "bad trailer line: " .. t end
      self.trailers[name:lower()] = value
    end
    return ""
  end
  local data, derr = receive(self, size)
  if not data then return nil, derr end
  local crlf, cerr = receive(self, 2)
  if crlf ~= "\r\n" then return nil, cerr or "chunk not followed by CRLF" end
  return data
end

-- The rest of the body as one string (after read_head), or nil, err.
function Conn:read_body()
  local h = self.headers
  -- RFC 9112 §6.3: these statuses never have a body, whatever the headers say.
  if self.status == 204 or self.status == 304 or self.status < 200 or self.head_request then
    return ""
  end
  if self.chunked then
    local parts = {}
    while true do
      local c, err = self:read_chunk()
      if not c then return nil, err end
      if c == "" then break end
      parts[#parts + 1] = c
    end
    return table.concat(parts)
  elseif h["content-length"] then
    local n = tonumber(h["content-length"])
    if n == 0 then return "" end
    return receive(self, n)
  else
    local data, err, partial = receive(self, "*a")
    return data or partial, err
  end
end

-- Iterates over the lines of a chunked NDJSON body as they arrive: each call returns the next
-- complete line (without "\n"), or nil at the end of the body, or nil, err.
function Conn:next_line()
  while true do
    local nl = self.pending:find("\n", 1, true)
    if nl then
      local line = self.pending:sub(1, nl - 1)
      self.pending = self.pending:sub(nl + 1)
      return line
    end
    local c, err = self:read_chunk()
    if not c then return nil, err end
    if c == "" then
      if self.pending ~= "" then return nil, "body ended inside a line" end
      return nil
    end
    self.pending = self.pending .. c
  end
end

-- Closes the connection. With abort, the kernel resets it (SO_LINGER 0) instead of a FIN.
function Conn:close(abort)
  if abort then self.sock:setoption("linger", { on = true, timeout = 0 }) end
  self.sock:close()
end

-- One request on a fresh connection: { status=, headers=, body=, trailers= } or nil, err
-- (trailers: those of a chunked body, else nil).
-- opts: headers (map), body (string), timeout (seconds).
function M.request(port, method, path, opts)
  opts = opts or {}
  local c, err = M.connect(port, opts.host, opts.timeout)
  if not c then return nil, err end
  local ok, serr = c:request(method, path, opts.headers, opts.body)
  if not ok then
    c:close()
    return nil, serr
  end
  local status, headers = c:read_head()
  if not status then
    c:close()
    return nil, headers
  end
  local body, berr = c:read_body()
  c:close()
  if not body then return nil, berr end
  return { status = status, headers = headers, body = body, trailers = c.trailers }
end

return M
