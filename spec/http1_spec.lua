-- The nginx transport's HTTP/1.1 (sandkit.http1), fed bytes directly: no socket, no nginx.

local core = require "sandkit.core"
local http1 = require "sandkit.http1"

local LIMITS = core.LIMITS
local MAX_HEAD = LIMITS.MAX_HEADER_BYTES
local MAX_CHUNK_LINE = http1.MAX_CHUNK_LINE

--- What a head reader makes of the chunks, fed one after another: { head =, rest = },
-- { failed = why } or { waiting = true }.
local function read_head(chunks)
  local reader = http1.head_reader()
  for i, chunk in ipairs(chunks) do
    reader:feed(chunk)
    local head, rest = reader:next()
    -- What the reads after this one bring is the body's too.
    if head then return { head = head, rest = rest .. table.concat(chunks, "", i + 1) } end
    if head == nil then return { failed = rest } end
  end
  return { waiting = true }
end

--- Runs fn and returns the text of the error it raised.
local function raised(fn)
  local ok, err = pcall(fn)
  assert.is_false(ok, "it raised no error")
  return tostring(err)
end

--- The bytes one at a time.
local function bytes_of(text)
  local chunks = {}
  for i = 1, #text do chunks[i] = text:sub(i, i) end
  return chunks
end

--- The text cut into two reads at each of `cuts`; without cuts, at every byte boundary and
-- into one read per byte as well.
local function splits(text, cuts)
  local out = {}
  if not cuts then
    out[1] = bytes_of(text)
    cuts = {}
    for i = 0, #text do cuts[#cuts + 1] = i end
  end
  for _, i in ipairs(cuts) do out[#out + 1] = { text:sub(1, i), text:sub(i + 1) } end
  return out
end

--- What a body decoder makes of the chunks: { body =, ended =, failed =, reusable = }, the
-- connection closing after the last chunk when `closes`.
local function read_body(head_text, chunks, opts)
  opts = opts or {}
  local head = assert(read_head{ head_text }.head, "the head must parse")
  local decoder = http1.body_decoder(head, opts.method or "GET")
  local pieces, result = {}, {}
  local function drain()
    while true do
      local piece, why = decoder:next()
      if piece then
        assert.is_true(#piece > 0, "a piece is never empty")
        pieces[#pieces + 1] = piece
      elseif piece == false then
        return true
      else
        result.failed = why
        result.ended = why == nil
        return false
      end
    end
  end
  local going = true
  -- The first read is what came with the head, fed before the body is asked for at all.
  if #chunks == 0 then chunks = { "" } end
  for _, chunk in ipairs(chunks) do
    decoder:feed(chunk)
    going = drain()
    if not going then break end
  end
  if going and opts.closes then
    local ended, why = decoder:closed()
    result.ended, result.failed = ended == true, why
  end
  result.body = table.concat(pieces)
  result.ended = result.ended == true
  result.reusable = decoder:reusable()
  return result
end

local OK = "HTTP/1.1 200 OK\r\n"
local CHUNKED = OK .. "Transfer-Encoding: chunked\r\n\r\n"

describe("http1.parse_url", function()
  it("takes scheme, host, port and target, with the scheme's port by default", function()
    assert.same({ scheme = "https", host = "agent.example", port = 443, target = "/v1/health?version=1" },
      http1.parse_url("HTTPS://agent.example/v1/health?version=1#ignored"))
    assert.same({ scheme = "http", host = "127.0.0.1", port = 8080, target = "/?q=1", ip = "127.0.0.1" },
      http1.parse_url("http://127.0.0.1:8080?q=1"))
    assert.same({ scheme = "http", host = "[::1]", port = 80, target = "/", ip = "::1" },
      http1.parse_url("http://[::1]"))
  end)

  for _, case in ipairs{
    { "credentials", "http://user:pw@agent.example/", "credentials" },
    { "another scheme", "ftp://agent.example/", "not an http or https URL" },
    { "no scheme", "agent.example/", "not an http or https URL" },
    { "port 0", "http://agent.example:0/", "bad port" },
    { "port 65536", "http://agent.example:65536/", "bad port" },
    { "a host with a space", "http://agent example/", "valid host" },
    { "an empty host", "http:///path", "valid host" },
    { "a target with a space", "http://agent.example/a b", "control characters" },
    { "a target with a line break", "http://agent.example/a\r\nHost: evil", "control characters" },
  } do
    it("refuses " .. case[1], function()
      local url, why = http1.parse_url(case[2])
      assert.is_nil(url)
      assert.matches(case[3], why, 1, true)
    end)
  end
end)

describe("http1.request_head", function()
  local url = assert(http1.parse_url("http://agent.example:8971/v1/exec"))

  it("writes the request line, Host with its port, sandkit's User-Agent and the body's length", function()
    local head = http1.request_head({ method = "POST", body = "{}", headers = { ["X-A"] = "1" } }, url)
    assert.equal("POST /v1/exec HTTP/1.1\r\nX-A: 1\r\nHost: agent.example:8971\r\nUser-Agent: "
      .. http1.USER_AGENT .. "\r\nContent-Length: 2\r\n\r\n", head)
  end)

  it("keeps a caller's Host and User-Agent instead of its own, whatever their case", function()
    local head = http1.request_head({ method = "GET", headers = { host = "h", ["USER-AGENT"] = "u" } }, url)
    assert.equal(1, select(2, head:gsub("\r\n[Hh][Oo][Ss][Tt]:", "")))
    assert.equal(1, select(2, head:gsub("\r\n[Uu][Ss][Ee][Rr]%-[Aa][Gg][Ee][Nn][Tt]:", "")))
    assert.is_nil(head:find("Content-Length", 1, true), "a GET without a body announces none")
  end)

  it("frames a streamed body by its length when known, else chunked, and an empty POST by a zero length", function()
    local reader = function() end
    assert.matches("\r\nContent%-Length: 7\r\n\r\n$",
      http1.request_head({ method = "PUT", body_reader = reader, body_length = 7 }, url))
    local chunked = http1.request_head({ method = "PUT", body_reader = reader }, url)
    assert.matches("\r\nTransfer%-Encoding: chunked\r\n\r\n$", chunked)
    assert.is_nil(chunked:find("Content-Length", 1, true))
    assert.matches("\r\nContent%-Length: 0\r\n\r\n$", http1.request_head({ method = "POST" }, url))
    assert.equal("5\r\nhello\r\n", table.concat(http1.chunk("hello")))
    assert.equal("1000\r\n", http1.chunk(string.rep("x", 4096))[1])
    assert.equal("0\r\n\r\n", http1.LAST_CHUNK)
  end)

  for _, case in ipairs{
    { "a CR LF in a value", { X = "a\r\nEvil: 1" } },
    { "a bare LF in a value", { X = "a\nEvil: 1" } },
    { "a NUL in a value", { X = "a\0b" } },
    { "a CR in a name", { ["X\rY"] = "1" } },
    { "a colon in a name", { ["X:Y"] = "1" } },
    { "an empty name", { [""] = "1" } },
    { "a value that is not a string", { X = 1 } },
  } do
    it("raises for " .. case[1] .. ", which could start a header of its own", function()
      assert.has_error(function() http1.request_head({ method = "GET", headers = case[2] }, url) end)
    end)
  end

  it("takes as many headers as the libcurl transport does, and raises for one more", function()
    local headers = {}
    for i = 1, LIMITS.MAX_REQUEST_HEADERS do headers["X-" .. i] = "v" end
    local head = http1.request_head({ method = "GET", headers = headers }, url)
    assert.equal(LIMITS.MAX_REQUEST_HEADERS + 3, select(2, head:gsub("\r\n", "")) - 1)
    headers["X-One-More"] = "v"
    assert.matches("more than " .. LIMITS.MAX_REQUEST_HEADERS .. " request headers",
      raised(function() http1.request_head({ method = "GET", headers = headers }, url) end), 1, true)
  end)
end)

describe("a response head", function()
  it("reads the same head and the same bytes after it whichever reads its bytes come in", function()
    local crlf = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
      .. "X-Folded: one\r\n\ttwo\r\nContent-Length: 5\r\n\r\nhello\r\n\r\n"
    for _, text in ipairs{ crlf, (crlf:gsub("\r\n", "\n")), (crlf:gsub("\r\n\r\n", "\n\r\n")) } do
      local whole = read_head{ text }
      assert.equal(200, whole.head.status)
      assert.equal("one two", whole.head.headers["x-folded"])
      assert.equal(5, whole.head.length)
      assert.matches("^hello", whole.rest)
      for _, chunks in ipairs(splits(text)) do
        local got = read_head(chunks)
        assert.same(whole.head, got.head)
        assert.equal(whole.rest, got.rest)
      end
    end
  end)

  it("waits while its end has not arrived, holding what came", function()
    local reader = http1.head_reader()
    reader:feed(OK .. "Content-Length: 0\r\n\r")
    assert.is_false(reader:next())
    assert.equal(#OK + 20, reader:pending())
    reader:feed("\n")
    local head, rest = reader:next()
    assert.equal(0, head.length)
    assert.equal("", rest)
  end)

  it("skips interim 1xx answers, but not 101 Switching Protocols", function()
    local got = read_head{ "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\nX: 1\r\n\r\n"
      .. OK .. "Content-Length: 0\r\n\r\n" }
    assert.equal(200, got.head.status)
    assert.is_nil(got.head.headers.x, "an interim answer's headers are not the final one's")
    assert.equal(101, read_head{ "HTTP/1.1 101 Switching Protocols\r\n\r\n" }.head.status)
  end)

  it("ends lines at a bare LF as at CRLF, and keeps a CR elsewhere in a value as a byte of it", function()
    local got = read_head{ "HTTP/1.1 200 OK\nX-A: 1\r\nX-B: a\rb\nContent-Length: 2\n\nhi" }
    assert.equal("1", got.head.headers["x-a"])
    assert.equal("a\rb", got.head.headers["x-b"], "a bare CR does not start a header")
    assert.is_nil(got.head.headers.b)
    assert.equal(2, got.head.length)
    assert.equal("hi", got.rest)
  end)

  it("reads names in any case, values without their surrounding blanks", function()
    local got = read_head{ OK .. "X-MiXeD:  \t spaced out \t \r\nX-Empty:\r\n\r\n" }
    assert.equal("spaced out", got.head.headers["x-mixed"])
    assert.equal("", got.head.headers["x-empty"])
  end)

  for _, case in ipairs{
    { "a status line that is not HTTP/1.x", "HTTP/2 200\r\n\r\n", "not an HTTP/1.x response" },
    { "an answer that starts with an empty line", "\r\n" .. OK .. "\r\n", "not an HTTP/1.x response" },
    { "a header without a colon", OK .. "X-A 1\r\n\r\n", "malformed response header" },
    { "blanks before a header's colon", OK .. "Content-Length : 5\r\n\r\nhello", "malformed response header" },
    { "a folded line with no header before it", OK .. " folded\r\n\r\n", "malformed response header" },
    { "a CR inside a name", OK .. "X\rY: 1\r\n\r\n", "malformed response header" },
    { "an empty name", OK .. ": 1\r\n\r\n", "malformed response header" },
  } do
    it("refuses " .. case[1], function()
      local got = read_head{ case[2] }
      assert.is_nil(got.head)
      assert.matches(case[3], got.failed, 1, true)
    end)
  end

  it("says nothing more once it refused a head", function()
    local reader = http1.head_reader()
    reader:feed("SSH-2.0\r\n\r\n")
    assert.is_nil(reader:next())
    reader:feed(OK .. "\r\n")
    local head, why = reader:next()
    assert.is_nil(head)
    assert.matches("not an HTTP/1.x response", why, 1, true)
  end)

  describe("framing a body", function()
    it("lets Transfer-Encoding override Content-Length", function()
      local got = read_head{ OK .. "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n" }
      assert.is_true(got.head.chunked)
      assert.is_nil(got.head.length)
      assert.equal("abcdef", read_body(OK .. "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
        { "6\r\nabcdef\r\n0\r\n\r\n" }).body)
    end)

    it("reads a Content-Length given twice with one value as that value", function()
      assert.equal(4, read_head{ OK .. "Content-Length: 4\r\nContent-Length: 4\r\n\r\n" }.head.length)
    end)

    for _, case in ipairs{
      { "two different Content-Lengths", "Content-Length: 3\r\nContent-Length: 4" },
      { "a Content-Length list", "Content-Length: 4, 4" },
      { "a signed Content-Length", "Content-Length: +4" },
      { "a negative Content-Length", "Content-Length: -1" },
      { "a hexadecimal Content-Length", "Content-Length: 0x4" },
      { "an empty Content-Length", "Content-Length:" },
    } do
      it("refuses " .. case[1], function()
        local got = read_head{ OK .. case[2] .. "\r\n\r\nabcd" }
        assert.is_nil(got.head)
        assert.matches("Content-Length is malformed or repeated", got.failed, 1, true)
      end)
    end

    it("runs a body to the close when the last transfer coding is not chunked, never reusing the connection", function()
      for _, codings in ipairs{ "gzip", "chunked, gzip", "chunkedx", "chunked\r\nTransfer-Encoding: identity" } do
        local text = OK .. "Transfer-Encoding: " .. codings .. "\r\n\r\n"
        local head = read_head{ text }.head
        assert.is_false(head.chunked, codings)
        local got = read_body(text, { "3\r\nabc\r\n0\r\n\r\n" }, { closes = true })
        assert.equal("3\r\nabc\r\n0\r\n\r\n", got.body, codings)
        assert.is_true(got.ended)
        assert.is_false(got.reusable, codings)
      end
      for _, codings in ipairs{ "gzip, chunked", "gzip\r\nTransfer-Encoding: CHUNKED", "chunked " } do
        assert.is_true(read_head{ OK .. "Transfer-Encoding: " .. codings .. "\r\n\r\n" }.head.chunked, codings)
      end
    end)

    it("frames by the first line of a folded Content-Length or Transfer-Encoding, as libcurl does", function()
      local length = read_head{ OK .. "Content-Length: 2\r\n 3\r\n\r\n" }.head
      assert.equal(2, length.length)
      assert.equal("2 3", length.headers["content-length"])
      local coding = read_head{ OK .. "Transfer-Encoding: gzip\r\n chunked\r\n\r\n" }.head
      assert.is_false(coding.chunked)
    end)

    it("reuses a connection only after an HTTP/1.1 answer that does not ask to close it", function()
      local function reuse(text) return read_head{ text .. "Content-Length: 0\r\n\r\n" }.head.reuse end
      assert.is_true(reuse(OK))
      assert.is_false(reuse("HTTP/1.0 200 OK\r\n"))
      assert.is_false(reuse(OK .. "Connection: keep-alive, Close\r\n"))
    end)
  end)

  describe("bounds", function()
    --- A head whose end (the line break closing its last line, then the empty line) starts at
    -- byte `at`: the bound counts the bytes before its end and the end's first byte.
    local function head_ending_at(at, line_break)
      local fixed = OK .. "Content-Length: 0\r\nX-Pad: "
      return fixed .. string.rep("p", at - 1 - #fixed) .. line_break
    end

    it("takes a head that ends at its bound and refuses one a byte longer, whichever reads it came in", function()
      for _, line_break in ipairs{ "\r\n\r\n", "\n\n", "\n\r\n" } do
        for _, at in ipairs{ MAX_HEAD - 1, MAX_HEAD, MAX_HEAD + 1 } do
          local text = head_ending_at(at, line_break)
          -- Every cut around the end, where a bound on the bytes held would tell reads apart.
          local cuts = { 0, 1, #OK }
          for i = at - 4, #text do cuts[#cuts + 1] = i end
          for _, chunks in ipairs(splits(text, cuts)) do
            local got = read_head(chunks)
            local what = string.format("%q ending at %d, cut at %d", line_break, at, #chunks[1])
            if at <= MAX_HEAD then
              assert.is_table(got.head, what)
              assert.equal(at - 1, #OK + 19 + 7 + #got.head.headers["x-pad"], what)
            else
              assert.is_nil(got.head, what)
              assert.equal("response headers longer than " .. MAX_HEAD .. " bytes", got.failed, what)
            end
          end
        end
      end
    end)

    it("refuses a head with no end once its end could no longer start within the bound", function()
      -- Its last three bytes may be the start of a four-byte end ("\r\n\r" of "\r\n\r\n").
      local reader = http1.head_reader()
      reader:feed(OK .. string.rep("x", MAX_HEAD + 3 - #OK))
      assert.is_false(reader:next(), "an end may still start at the bound")
      reader:feed("x")
      local head, why = reader:next()
      assert.is_nil(head)
      assert.equal("response headers longer than " .. MAX_HEAD .. " bytes", why)
    end)

    it("keeps as many headers by name as libcurl does, dropping later names but not their framing, "
        .. "and refuses a fold onto a dropped one", function()
      local lines = { OK }
      for i = 1, LIMITS.MAX_HEADERS do lines[#lines + 1] = "X-" .. i .. ": " .. i .. "\r\n" end
      lines[#lines + 1] = "X-Dropped: d\r\n"
      lines[#lines + 1] = "X-1: again\r\nContent-Length: 3\r\n\r\n"
      local text = table.concat(lines)
      local head = read_head{ text }.head
      local count = 0
      for _ in pairs(head.headers) do count = count + 1 end
      assert.equal(LIMITS.MAX_HEADERS, count)
      assert.is_nil(head.headers["x-dropped"])
      assert.equal("again", head.headers["x-1"], "a name already kept is updated")
      assert.is_nil(head.headers["content-length"])
      assert.equal(3, head.length, "a dropped header still frames the body")
      local folded = read_head{ (text:gsub("X%-Dropped: d\r\n", "X-Dropped: d\r\n\tfolded\r\n")) }
      assert.matches("malformed response header", folded.failed, 1, true)
    end)
  end)
end)

describe("a response body", function()
  it("framed by Content-Length ends at its length, keeping what follows off the body", function()
    local text = OK .. "Content-Length: 5\r\n\r\n"
    for _, chunks in ipairs(splits("hello" .. "HTTP/1.1")) do
      local got = read_body(text, chunks)
      assert.equal("hello", got.body)
      assert.is_true(got.ended)
    end
    local doubt = read_body(text, { "hel", "loHTTP/1.1" })
    assert.is_false(doubt.reusable, "bytes after the body leave the connection in doubt")
    local clean = read_body(text, { "hel", "lo" })
    assert.is_true(clean.ended)
    assert.is_true(clean.reusable)
  end)

  it("framed by Content-Length is cut short by a close before its length", function()
    local got = read_body(OK .. "Content-Length: 5\r\n\r\n", { "hel" }, { closes = true })
    assert.equal("hel", got.body)
    assert.is_false(got.ended)
    assert.equal("the connection closed with 2 bytes of the body outstanding", got.failed)
  end)

  it("is empty for HEAD, 204 and 304 whatever their Content-Length, and for 101", function()
    local got = read_body(OK .. "Content-Length: 5\r\n\r\n", {}, { method = "HEAD" })
    assert.equal("", got.body)
    assert.is_true(got.ended)
    assert.is_true(got.reusable)
    for _, status in ipairs{ "204 No Content", "304 Not Modified", "101 Switching Protocols" } do
      got = read_body("HTTP/1.1 " .. status .. "\r\nContent-Length: 5\r\n\r\n", { "hello" })
      assert.equal("", got.body, status)
      assert.is_true(got.ended, status)
      assert.is_false(got.reusable, status .. ": bytes came that no body frames")
    end
  end)

  it("never leaves the connection reusable after a 101, nor after a body framed two ways", function()
    local got = read_body("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", {})
    assert.is_true(got.ended)
    assert.is_false(got.reusable)
    got = read_body(OK .. "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", { "3\r\nabc\r\n0\r\n\r\n" })
    assert.equal("abc", got.body)
    assert.is_true(got.ended)
    assert.is_false(got.reusable)
    -- either alone still is
    assert.is_true(read_body(OK .. "Transfer-Encoding: chunked\r\n\r\n", { "3\r\nabc\r\n0\r\n\r\n" }).reusable)
    assert.is_true(read_body(OK .. "Content-Length: 3\r\n\r\n", { "abc" }).reusable)
  end)

  it("without framing runs to the close and never leaves the connection reusable", function()
    local got = read_body(OK .. "\r\n", { "until ", "the end" }, { closes = true })
    assert.equal("until the end", got.body)
    assert.is_true(got.ended)
    assert.is_false(got.reusable)
  end)

  it("announces its length and how much of it a read may take", function()
    local head = read_head{ OK .. "Content-Length: 10\r\n\r\n" }.head
    local d = http1.body_decoder(head, "GET")
    assert.equal(10, d:length())
    assert.equal(10, d:want())
    d:feed("abcd")
    assert.equal("abcd", d:next())
    assert.equal(6, d:want())
    assert.equal(10, d:length())
    d = http1.body_decoder(read_head{ CHUNKED }.head, "GET")
    assert.is_nil(d:length())
    assert.is_nil(d:want(), "a chunk's size line has no length")
    d:feed("a\r\n01")
    assert.equal("01", d:next())
    assert.equal(8, d:want(), "inside a chunk a read takes its rest")
    assert.is_nil(http1.body_decoder(read_head{ OK .. "\r\n" }.head, "GET"):want())
  end)

  it("after a long chunk's data asks for its CRLF and a size line as long as the last, less what came", function()
    local long = http1.LINE_READ_AFTER
    local d = http1.body_decoder(read_head{ CHUNKED }.head, "GET")
    d:feed(string.format("%x\r\n", long) .. string.rep("x", long))
    assert.equal(string.rep("x", long), d:next())
    assert.equal(2 + #string.format("%x\r\n", long), d:want(), "CRLF and a size line as long")
    d:feed("\r\n8")
    assert.is_false(d:next())
    assert.equal(#string.format("%x\r\n", long) - 1, d:want(), "the rest of a size line read short")
    d:feed(string.format("%x\r\n", long + 1):sub(2))
    assert.is_false(d:next())
    assert.equal(long + 1, d:want(), "the next chunk's data, read whole")
    d:feed(string.rep("y", long + 1) .. "\r\n")
    assert.equal(string.rep("y", long + 1), d:next())
    assert.equal(#string.format("%x\r\n", long), d:want(), "the CRLF that came with the data counts")
    d:feed("1f;ext=")
    assert.is_false(d:next())
    assert.is_nil(d:want(), "a line longer than the guess is read as any bytes")
    d = http1.body_decoder(read_head{ CHUNKED }.head, "GET")
    d:feed(string.format("%x\r\n", long - 1) .. string.rep("x", long - 1))
    assert.equal(long - 1, #d:next())
    assert.is_nil(d:want(), "after a shorter chunk a read takes what is there, many chunks at once")
  end)

  describe("chunked", function()
    local body = "3;name=value\r\nabc\r\n1\r\nd\r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n"

    it("reads the same bytes and the same ending whichever reads they come in", function()
      for _, chunks in ipairs(splits(body)) do
        local got = read_body(CHUNKED, chunks)
        assert.equal("abcd0123456789", got.body)
        assert.is_true(got.ended)
        assert.is_true(got.reusable)
      end
    end)

    it("ends its lines at a bare LF as at CRLF, and allows blanks before the extensions", function()
      local got = read_body(CHUNKED, { "3 \t;ext\nabc\n2\t\r\nde\r\n0\n\n" })
      assert.equal("abcde", got.body)
      assert.is_true(got.ended)
    end)

    it("takes a size of twelve hex digits in either case", function()
      local d = http1.body_decoder(read_head{ CHUNKED }.head, "GET")
      d:feed("00000000000A\r\n")
      assert.is_false(d:next())
      assert.equal(10, d:want())
      d = http1.body_decoder(read_head{ CHUNKED }.head, "GET")
      d:feed("ffffffffffff\r\nx")
      assert.equal("x", d:next())
      assert.equal(2 ^ 48 - 2, d:want())
    end)

    for _, case in ipairs{
      { "a size of thirteen hex digits, however small", "0000000000001\r\nx\r\n0\r\n\r\n" },
      { "a size that is not hexadecimal", "g\r\n" },
      { "a size written with 0x", "0x3\r\nabc\r\n" },
      { "a negative size", "-3\r\n" },
      { "a size after blanks", " 3\r\nabc\r\n" },
      { "an empty size line", "\r\n" },
      { "something other than extensions after the size", "3 abc\r\n" },
      { "a size line that ends in a bare CR", "3\rabc\r\n0\r\n\r\n" },
    } do
      it("refuses " .. case[1], function()
        local got = read_body(CHUNKED, { case[2] })
        assert.equal("", got.body)
        assert.equal("a malformed chunk size line", got.failed)
      end)
    end

    it("refuses a chunk whose data is not followed by its line break, delivering what came before", function()
      local got = read_body(CHUNKED, { "3\r\nabcd\r\n0\r\n\r\n" })
      assert.equal("abc", got.body)
      assert.equal("a chunk not followed by CRLF", got.failed)
      got = read_body(CHUNKED, { "3\r\nabc\r\r\n0\r\n\r\n" })
      assert.equal("a chunk not followed by CRLF", got.failed)
    end)

    it("takes a chunk line at its bound and refuses one a byte longer, whichever reads it came in", function()
      for _, extra in ipairs{ 0, 1 } do
        -- The line's bytes before its LF, its CR included.
        local line = "1;" .. string.rep("e", MAX_CHUNK_LINE - 3 + extra) .. "\r"
        assert.equal(MAX_CHUNK_LINE + extra, #line)
        local text = line .. "\nx\r\n0\r\n\r\n"
        local cuts = { 0, 1, 2 }
        for i = #line - 3, #line + 2 do cuts[#cuts + 1] = i end
        for _, chunks in ipairs(splits(text, cuts)) do
          local got = read_body(CHUNKED, chunks)
          if extra == 0 then
            assert.equal("x", got.body)
            assert.is_true(got.ended)
          else
            assert.equal("", got.body)
            assert.equal("a chunk line longer than " .. MAX_CHUNK_LINE .. " bytes", got.failed)
          end
        end
      end
    end)

    it("holds each trailer line to the chunk line's bound, and all of them to the head's", function()
      local long = read_body(CHUNKED, { "0\r\nX-T: " .. string.rep("t", MAX_CHUNK_LINE) .. "\r\n\r\n" })
      assert.equal("a chunk line longer than " .. MAX_CHUNK_LINE .. " bytes", long.failed)
      local line = "X-T: " .. string.rep("t", MAX_CHUNK_LINE - 10) .. "\r\n"
      local lines = { "1\r\nx\r\n0\r\n" }
      -- Just enough lines for their bytes, line breaks not counted, to pass the bound.
      for i = 2, math.floor(MAX_HEAD / (#line - 2)) + 2 do lines[i] = line end
      local many = read_body(CHUNKED, { table.concat(lines) .. "\r\n" })
      assert.equal("x", many.body)
      assert.equal("trailers longer than the head bound", many.failed)
      table.remove(lines)
      local fewer = read_body(CHUNKED, { table.concat(lines) .. "\r\n" })
      assert.is_true(fewer.ended)
    end)

    it("is cut short by a close before its last chunk and its trailers' end", function()
      for _, cut in ipairs{ "3\r\nab", "3\r\nabc\r\n", "3\r\nabc\r\n0\r\n", "3\r\nabc\r\n0\r\nX: 1\r\n" } do
        local got = read_body(CHUNKED, { cut }, { closes = true })
        assert.is_false(got.ended, cut)
        assert.equal("the connection closed before the chunked body ended", got.failed)
      end
    end)

    it("says nothing more once its framing failed", function()
      local d = http1.body_decoder(read_head{ CHUNKED }.head, "GET")
      d:feed("zz\r\n")
      assert.is_nil(d:next())
      d:feed("3\r\nabc\r\n0\r\n\r\n")
      local piece, why = d:next()
      assert.is_nil(piece)
      assert.equal("a malformed chunk size line", why)
      assert.is_nil(d:closed())
      assert.is_false(d:reusable())
    end)
  end)
end)
