-- The real sandkit-agent's HTTP/1.x as a front-end in its way would meet it (docs/agent.md "What
-- it serves"): the versions it answers and how, and the syntax it refuses where a lenient reader
-- would guess — the request line, Host, the target's bytes, chunk lines and trailers — each as
-- llhttp refuses it; and the 100 Continue that only a request its handler takes is given.

local raw = require "support.raw_http"
local agent_process = require "support.agent_process"
local cjson = require "cjson"
local socket = require "socket"

local start_agent, exists = agent_process.start_agent, agent_process.exists

describe("sandkit-agent's HTTP", function()
  local A
  setup(function() A = assert(start_agent()) end)
  teardown(function() assert.are.equal(0, A:stop()) end)

  -- Sends bytes exactly as given on a fresh connection; returns the connection, its status
  -- and headers.
  local function send(bytes)
    local c = assert(raw.connect(A.port))
    assert(c:send(bytes))
    c:settimeout(3)
    local status, headers = c:read_head()
    return c, status, headers
  end

  local function status_of(bytes)
    local c, status = send(bytes)
    c:close()
    return status
  end

  local function auth() return "Authorization: Bearer " .. A.token .. "\r\n" end

  -- A chunked mkdir of /name whose body is `chunks` as given.
  local function chunked_mkdir(chunks)
    return "POST /v1/mkdir HTTP/1.1\r\nHost: x\r\n" .. auth() .. "Transfer-Encoding: chunked\r\n\r\n" .. chunks
  end

  describe("HTTP/1.0", function()
    it("is answered with a body that ends with the connection when its length is not known first", function()
      local body = cjson.encode({ command = { "echo", "one-oh" }, timeoutMs = 5000 })
      local c, status, h = send("POST /v1/exec HTTP/1.0\r\n" .. auth() .. "Content-Length: " .. #body
        .. "\r\n\r\n" .. body)
      assert.are.equal(200, status)
      -- RFC 9112 §6.1: no transfer coding for a 1.0 caller, which would not know it
      assert.is_nil(h["transfer-encoding"])
      assert.is_nil(h["content-length"])
      assert.are.equal("close", h.connection)
      local text = assert(c:read_body())
      c:close()
      local last, out = agent_process.check_stream(agent_process.decode_lines(text))
      assert.are.equal(0, last.code)
      assert.are.equal("one-oh\n", out)
    end)

    it("gets a length where one is known, and keeps its connection only when it asks to", function()
      local c, status, h = send("GET /v1/health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
      assert.are.equal(200, status)
      assert.truthy(h["content-length"])
      assert.is_nil(h.connection)
      assert(c:read_body())
      assert(c:send("GET /v1/health HTTP/1.0\r\n\r\n"))
      local again, h2 = c:read_head()
      assert.are.equal(200, again)
      assert.are.equal("close", h2.connection)
      c:close()
    end)
  end)

  it("answers every version but 1.0 and 1.1 with 505, and text that is no version with 400", function()
    for _, version in ipairs({ "HTTP/1.2", "HTTP/1.5", "HTTP/1.9", "HTTP/2.0", "HTTP/0.9" }) do
      assert.are.equal(505, status_of("GET /v1/health " .. version .. "\r\nHost: x\r\n\r\n"), version)
    end
    for _, version in ipairs({ "HTTP/1.10", "HTTP/1", "HTTP/1.x", "http/1.1", "HTTP/11" }) do
      assert.are.equal(400, status_of("GET /v1/health " .. version .. "\r\nHost: x\r\n\r\n"), version)
    end
  end)

  it("refuses an HTTP/1.1 request without Host, and serves an HTTP/1.0 one", function()
    assert.are.equal(400, status_of("GET /v1/health HTTP/1.1\r\n\r\n"))
    assert.are.equal(200, status_of("GET /v1/health HTTP/1.0\r\n\r\n"))
  end)

  it("refuses a target holding a byte of 0x80 or above, which percent-encoding carries instead", function()
    for _, b in ipairs({ 0x80, 0xc3, 0xff }) do
      assert.are.equal(400, status_of("GET /v1/health?x=" .. string.char(b) .. " HTTP/1.1\r\nHost: x\r\n\r\n"), b)
    end
    assert.are.equal(200, status_of("GET /v1/health?x=%C3%A9 HTTP/1.1\r\nHost: x\r\n\r\n"))
  end)

  it("holds a chunk line to chunk-size [ chunk-ext ] CRLF", function()
    local refused = { "2 zz\r\n", "2 \r\n", "2;\r\n", "2;a=\r\n", "2;a=b c\r\n", "2;a=\"x\r\n",
      "2;a b\r\n", "2zz\r\n", "2;a=\"\1\"\r\n" }
    for i, line in ipairs(refused) do
      local body = '{"path":"/bad' .. i .. '"}'
      local chunks = line:gsub("^2", string.format("%x", #body)) .. body .. "\r\n0\r\n\r\n"
      assert.are.equal(400, status_of(chunked_mkdir(chunks)), line)
      assert.is_false(exists(A.root .. "/bad" .. i), line)
    end
    local taken = { "2;a=b\r\n", "2 ; a = \"x y\" \r\n", "2;a=\"q\\\"x\";b\r\n", "2;a;b=c\r\n" }
    for i, line in ipairs(taken) do
      local body = '{"path":"/good' .. i .. '"}'
      local chunks = line:gsub("^2", string.format("%x", #body)) .. body .. "\r\n0\r\n\r\n"
      assert.are.equal(204, status_of(chunked_mkdir(chunks)), line)
      assert.is_true(exists(A.root .. "/good" .. i), line)
    end
  end)

  it("holds trailers to field lines", function()
    local refused = { "GET / HTTP/1.1\r\n", "X-A: 1\r\n folded\r\n", "no colon\r\n", "X-A : 1\r\n",
      "X-A: \1\r\n" }
    for i, trailer in ipairs(refused) do
      local body = '{"path":"/trail' .. i .. '"}'
      local chunks = string.format("%x\r\n%s\r\n0\r\n%s\r\n", #body, body, trailer)
      assert.are.equal(400, status_of(chunked_mkdir(chunks)), trailer)
    end
    local body = '{"path":"/trailed"}'
    assert.are.equal(204, status_of(chunked_mkdir(string.format("%x\r\n%s\r\n0\r\nX-A: 1\r\nX-B:\r\n\r\n",
      #body, body))))
    assert.is_true(exists(A.root .. "/trailed"))
  end)

  -- A caller learns that its command started when the head comes: a silent command's caller
  -- must not wait for the command's end to hear it, or take the agent for stalled.
  it("sends an exec stream's head while its silent command still runs", function()
    local body = cjson.encode({ command = { "sleep", "4" }, timeoutMs = 10000 })
    local t0 = socket.gettime()
    local c, status = send("POST /v1/exec HTTP/1.1\r\nHost: x\r\n" .. auth() .. "Content-Length: "
      .. #body .. "\r\n\r\n" .. body)
    local took = socket.gettime() - t0
    assert.are.equal(200, status)
    assert.is_true(took < 2, ("the head came after %.2f s"):format(took))
    c:settimeout(10)
    local last = agent_process.check_stream(agent_process.decode_lines(assert(c:read_body())))
    c:close()
    assert.are.equal(0, last.code)
  end)

  describe("100 Continue", function()
    local function raw_put(path)
      return "PUT /v1/files/raw?path=" .. path .. " HTTP/1.1\r\nHost: x\r\n" .. auth()
        .. "Content-Length: 5\r\nExpect: 100-continue\r\n\r\n"
    end

    it("is never sent to a raw upload its handler refuses", function()
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "a-dir" }).status)
      for _, path in ipairs({ "/../x", "a-dir", "a-dir/" }) do
        local c, status, h = send(raw_put(path))
        assert.are.equal(400, status, path)
        assert.are.equal("close", h.connection)
        c:close()
      end
    end)

    it("is sent to a raw upload its handler takes, which then arrives", function()
      local c, status = send(raw_put("taken"))
      assert.are.equal(100, status)
      assert(c:send("hello"))
      assert.are.equal(204, (c:read_head()))
      c:close()
      assert.are.equal("hello", agent_process.run("cat " .. A.root .. "/taken"))
    end)
  end)
end)
