--- HTTP/1.1 as sandkit's nginx transport speaks it, with no sockets: URLs, request heads,
-- response heads and body framing as plain functions and small decoders fed bytes as they
-- arrive, so that every rule can be tried byte by byte without a server (spec/http1_spec.lua).
-- The transport (sandkit.cosocket) owns the sockets, the deadlines and the body bounds.
--
--   http1.parse_url(url)              -> { scheme, host, port, target, ip } | nil, why
--   http1.request_head(spec, url)     -> the request's head as bytes (raises on misuse)
--   http1.chunk(piece), http1.LAST_CHUNK  -- a streamed request body's chunked framing
--   http1.head_reader()               -> :feed(bytes), :next() -> head, rest | false | nil, why
--                                        :pending() -> bytes held
--   http1.body_decoder(head, method)  -> :feed(bytes), :next() -> piece | false | nil | nil, why
--                                        :want(), :length(), :closed(), :reusable()
--
-- A response is read as RFC 9112 frames it, and where a server could make two readers frame
-- it differently the stricter reading wins or the response is refused: Content-Length given
-- twice with different values, or not a plain number, is refused; Transfer-Encoding overrides
-- Content-Length; a Transfer-Encoding whose last coding is not chunked runs to the close.
-- A bare LF ends a line as CRLF does; a CR anywhere else is a byte of its line.

local core = require "sandkit.core"

local http1 = {}

local concat, find, sub, byte, format = table.concat, string.find, string.sub, string.byte, string.format
local min, max = math.min, math.max

local LIMITS = core.LIMITS
--- Bytes of status line and headers one response may have: as much as the libcurl transport
-- keeps of them; no answer sandkit reads comes near it.
local MAX_HEAD = LIMITS.MAX_HEADER_BYTES
--- Response headers kept by name; past this they are dropped, as the libcurl transport does,
-- so a server cannot make a head's table grow with it (the head's bytes are bounded anyway).
local MAX_HEADERS = LIMITS.MAX_HEADERS
--- Request headers a caller may add, as over libcurl.
local MAX_REQUEST_HEADERS = LIMITS.MAX_REQUEST_HEADERS
--- A chunk-size line with its extensions, and each trailer line; servers write a few dozen
-- bytes, and a line is held whole until its LF arrives.
local MAX_CHUNK_LINE = 4096
--- Hex digits of a chunk size: 12 reach 2^48 - 1 bytes, more than any body and still exact in a
-- double (LuaJIT's only number), so a longer size is an overflow, not a chunk.
local MAX_CHUNK_DIGITS = 12
--- Bytes of a head's end ("\r\n\r\n" at the longest) that can have arrived while the end is not
-- found yet: a buffer with no end may run this far past the bound and still end within it, and
-- the next search for the end starts this far back.
local HEAD_END_SLACK = 3
--- A chunk at least this long is followed by a read of its chunk line alone (want): cutting the
-- next chunk out of a larger read would copy it, while shorter chunks are better read many at
-- once, so that a reader sees them together (sandkit.ngx joins frames already here in one flush
-- of 64 KiB of text; two frames of 32 KiB, as base64, never fit one).
local LINE_READ_AFTER = 32 * 1024

http1.MAX_CHUNK_LINE = MAX_CHUNK_LINE
http1.LINE_READ_AFTER = LINE_READ_AFTER
http1.USER_AGENT = "sandkit/" .. core._VERSION

local DEFAULT_PORT = { http = 80, https = 443 }

-- URLs ----------------------------------------------------------------------------------------

--- { scheme, host (brackets kept for IPv6), port, target, ip = bare address | nil }, or nil, why.
function http1.parse_url(url)
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

-- The request ---------------------------------------------------------------------------------

local function valid_header_text(s)
  return not find(s, "[\r\n%z]")
end

--- The head of spec's request to url (parse_url's): its request line, the caller's headers,
-- Host and User-Agent unless given, and the body's framing. Raises, at the level of the
-- transport's caller, for a request no server should see.
function http1.request_head(spec, url)
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
    if n > MAX_REQUEST_HEADERS then error(format("more than %d request headers", MAX_REQUEST_HEADERS), 3) end
    given[name:lower()] = true
    lines[#lines + 1] = name .. ": " .. value
  end
  if not given.host then
    local host = url.host
    if url.port ~= DEFAULT_PORT[url.scheme] then host = host .. ":" .. url.port end
    lines[#lines + 1] = "Host: " .. host
  end
  if not given["user-agent"] then lines[#lines + 1] = "User-Agent: " .. http1.USER_AGENT end
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

--- One piece of a chunked request body, as the pieces a socket sends without joining them.
function http1.chunk(piece)
  return { format("%x\r\n", #piece), piece, "\r\n" }
end
--- The end of a chunked request body: the last chunk and no trailers.
http1.LAST_CHUNK = "0\r\n\r\n"

-- The response head ---------------------------------------------------------------------------

--- Parses one head (the bytes before the blank line). Returns { status, headers, reuse,
-- chunked, length }, or nil and why.
local function parse_head(text)
  local major, minor, status = text:match("^HTTP/(%d)%.(%d) (%d%d%d)")
  if not status then return nil, "the answer is not an HTTP/1.x response" end
  local head = { status = tonumber(status), headers = {}, reuse = major == "1" and minor == "1" }
  local count = 0
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
        -- An obsolete folded continuation of the header before. It extends the value the
        -- headers table shows and not the framing already read from its first line, which is
        -- what libcurl does too.
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
        if head.headers[name] ~= nil or count < MAX_HEADERS then
          if head.headers[name] == nil then count = count + 1 end
          head.headers[name] = value
          last = name
        else
          last = nil
        end
      end
    end
  end
  -- A 101 hands the connection to another protocol: nothing after it is HTTP/1.1.
  if head.status == 101 then head.reuse = false end
  if codings then
    -- The last coding decides the framing; without chunked last, the body runs to the close.
    -- With a Content-Length too, the sender framed the body two ways (RFC 9112 §6.1: a server
    -- must not): the coding is read, and the connection, whose next bytes another reader could
    -- place elsewhere, is never reused.
    head.chunked = codings:lower():match("([^,%s]+)%s*$") == "chunked"
    head.reuse = head.reuse and head.chunked and #lengths == 0
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

local head_reader_mt = {}
head_reader_mt.__index = head_reader_mt

--- A reader of response heads fed the bytes of a connection from its first.
function http1.head_reader()
  -- `from`: where the search for a head's end resumes. A head is searched only where it grew,
  -- so a server sending its head a byte at a time costs a bounded amount per byte, not a
  -- search of everything it sent before.
  return setmetatable({ buf = "", from = 1 }, head_reader_mt)
end

function head_reader_mt:feed(bytes)
  self.buf = self.buf .. bytes
end

--- The final head (interim 1xx answers are skipped, but for 101) and the bytes after it;
-- false while its end has not arrived; nil and why when it cannot be one, which is final.
function head_reader_mt:next()
  if self.failed then return nil, self.failed end
  while true do
    local buf = self.buf
    local s, e = find(buf, "\r?\n\r?\n", self.from)
    -- The bound is on where a head ends, so a head is refused or taken the same whichever
    -- reads its bytes came in.
    if (s or #buf - HEAD_END_SLACK) > MAX_HEAD then
      self.failed = "response headers longer than " .. MAX_HEAD .. " bytes"
      return nil, self.failed
    end
    if not s then
      -- An end not in the buffer yet may have begun in its last HEAD_END_SLACK bytes.
      self.from = max(1, #buf - HEAD_END_SLACK + 1)
      return false
    end
    local head, why = parse_head(sub(buf, 1, s))
    if not head then
      self.failed = why
      return nil, why
    end
    self.buf, self.from = sub(buf, e + 1), 1
    if head.status >= 200 or head.status == 101 then
      local rest = self.buf
      self.buf = ""
      return head, rest
    end
  end
end

--- Bytes held that are not yet a head: whether anything of an answer arrived.
function head_reader_mt:pending()
  return #self.buf
end

-- The response body ---------------------------------------------------------------------------

local body_mt = {}
body_mt.__index = body_mt

--- A decoder of the body that follows `head` (head_reader's) in answer to `method`: framed by
-- Content-Length, chunked, or by the end of the connection (RFC 9112 §6.3).
function http1.body_decoder(head, method)
  local d = { raw = "", pos = 1, reuse = head.reuse, ended = false }
  local status = head.status
  if method == "HEAD" or status == 204 or status == 304 or status == 101 then
    d.mode, d.left = "length", 0
  elseif head.chunked then
    d.mode, d.state = "chunked", "size"
  elseif head.length then
    d.mode, d.left = "length", head.length
  else
    d.mode = "close"
  end
  d.announced = d.left
  return setmetatable(d, body_mt)
end

--- Hands over bytes of the connection; call after next() returned false.
function body_mt:feed(bytes)
  local raw, pos = self.raw, self.pos
  if pos > #raw then
    self.raw = bytes
  else
    self.raw = (pos == 1 and raw or sub(raw, pos)) .. bytes
  end
  self.pos = 1
end

local function fail(d, why)
  d.failed = why
  return nil, why
end

--- The next piece of the body, taken from what was fed (never empty); false when it needs more
-- bytes; nil once the body ended (the bytes after it are kept: see reusable); nil and why when
-- the framing failed, and for ever after.
function body_mt:next()
  if self.failed then return nil, self.failed end
  if self.ended then return nil end
  local raw, pos = self.raw, self.pos
  local n = #raw
  local mode = self.mode
  if mode == "length" or mode == "close" then
    if mode == "length" and self.left == 0 then
      self.ended = true
      return nil
    end
    if pos > n then return false end
    local take = n - pos + 1
    if mode == "length" then
      take = min(take, self.left)
      self.left = self.left - take
    end
    self.pos = pos + take
    -- A read that is all body goes on as it is, uncopied.
    if pos == 1 and take == n then return raw end
    return sub(raw, pos, pos + take - 1)
  end
  while true do
    local state = self.state
    if state == "data" then
      if pos > n then break end
      local take = min(n - pos + 1, self.left)
      self.left = self.left - take
      if self.left == 0 then self.state = "crlf" end
      self.pos = pos + take
      if pos == 1 and take == n then return raw end
      return sub(raw, pos, pos + take - 1)
    end
    local e = find(raw, "\n", pos, true)
    -- Bounded while it arrives and once it is whole alike, so a line is refused or taken the
    -- same whichever reads its bytes came in.
    if (e and e - pos or n - pos + 1) > MAX_CHUNK_LINE then
      return fail(self, "a chunk line longer than " .. MAX_CHUNK_LINE .. " bytes")
    end
    if not e then break end
    local line = sub(raw, pos, e - 1):gsub("\r$", "")
    local line_bytes = e - pos + 1
    pos = e + 1
    self.pos = pos
    if state == "crlf" then
      if line ~= "" then return fail(self, "a chunk not followed by CRLF") end
      self.state = "size"
    elseif state == "size" then
      -- Extensions (after ';') are allowed and ignored; nothing else may follow the size.
      local hex = line:match("^(%x+)[ \t]*$") or line:match("^(%x+)[ \t]*;")
      if not hex or #hex > MAX_CHUNK_DIGITS then return fail(self, "a malformed chunk size line") end
      local size = tonumber(hex, 16)
      self.size_line = size >= LINE_READ_AFTER and line_bytes or nil
      if size == 0 then
        self.state, self.trailer = "trailer", 0
      else
        self.state, self.left = "data", size
      end
    else -- trailer lines, up to the blank line that ends the body; read past, never kept
      self.trailer = self.trailer + #line
      if self.trailer > MAX_HEAD then return fail(self, "trailers longer than the head bound") end
      if line == "" then
        self.ended = true
        return nil
      end
    end
  end
  self.raw, self.pos = pos > n and "" or sub(raw, pos), 1
  return false
end

--- How many bytes the next read should take: inside a chunk or a Content-Length body, what is
-- left of it (all body, nothing after); right after the data of a chunk of LINE_READ_AFTER or
-- more, its CRLF and a size line as long as the last one, so that the read after those starts
-- at the next chunk's first byte (a server whose chunks are its frames, as the agent's, then
-- has no frame cut out of a read and copied: bench/RESULTS.md, "Reads cut at chunk lines");
-- nil when the framing cannot say or a larger read is better (the first size line, after a
-- short chunk, a body running to the close). A guess that was wrong costs only a read cut
-- elsewhere: any split of the bytes decodes the same.
function body_mt:want()
  if self.mode == "length" or self.state == "data" then return self.left end
  local state, size_line = self.state, self.size_line
  if size_line and (state == "crlf" or state == "size") then
    -- Less what of them is already here (a read that came back short). A line longer than the
    -- guess is read as any other bytes: reads of a byte each would let a server's long chunk
    -- lines cost the worker a Lua call per byte.
    local line = (state == "crlf" and 2 or 0) + size_line - (#self.raw - self.pos + 1)
    if line > 0 then return line end
  end
  return nil
end

--- The body's announced length (0 for an answer that has no body), or nil when it is not known
-- before its end.
function body_mt:length()
  return self.announced
end

--- The connection closed: true when that ends the body, else nil and why it was cut short.
function body_mt:closed()
  if self.ended then return true end
  if self.failed then return nil, self.failed end
  if self.mode == "close" or (self.mode == "length" and self.left == 0) then
    self.ended = true
    return true
  end
  if self.mode == "length" then
    return fail(self, format("the connection closed with %d bytes of the body outstanding", self.left))
  end
  return fail(self, "the connection closed before the chunked body ended")
end

--- Whether the connection may carry another request: the answer allowed it, its body ended by
-- its framing (not by the close), and nothing arrived after it.
function body_mt:reusable()
  return self.reuse == true and self.ended and self.mode ~= "close" and self.pos > #self.raw
end

return http1
