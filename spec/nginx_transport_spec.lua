-- The cosocket transport's own rules, from inside a real nginx worker (support/nginx_app's
-- /exchange runs http.exchange there): TLS always verified — by IP address, by
-- tls_server_name, against a request's own CA too, with a client certificate — proxies
-- refused, connections pooled only for idempotent requests, and every bound on what a server
-- sends.

local cjson = require "cjson"
local agent_process = require "support.agent_process"
local fake_http = require "support.fake_http"
local files = require "support.files"
local nginx = require "support.nginx"
local raw_http = require "support.raw_http"
local tls = require "support.tls"

local TLS_SERVERS = [[
  lua_ssl_trusted_certificate ${dir}/ca.crt;
  lua_ssl_verify_depth 2;
  server {
    listen 127.0.0.1:${good} ssl;
    ssl_certificate ${dir}/good.crt;
    ssl_certificate_key ${dir}/good.key;
    ssl_client_certificate ${dir}/ca.crt;
    ssl_verify_client optional;
    location / { return 200 "sni=$ssl_server_name client=$ssl_client_verify $ssl_client_s_dn"; }
  }
  server {
    listen 127.0.0.1:${untrusted} ssl;
    ssl_certificate ${dir}/untrusted.crt;
    ssl_certificate_key ${dir}/untrusted.key;
    location / { return 200 "untrusted"; }
  }
  server {
    listen 127.0.0.1:${dns_only} ssl;
    ssl_certificate ${dir}/dns_only.crt;
    ssl_certificate_key ${dir}/dns_only.key;
    location / { return 200 "dns only"; }
  }
]]

local function certificates(dir)
  local ca = tls.ca(dir, "ca")
  tls.issue(dir, ca, "good", { "IP:127.0.0.1", "DNS:localhost" })
  tls.issue(dir, ca, "dns_only", { "DNS:localhost" })
  tls.issue(dir, ca, "client", nil, "client")
  tls.issue(dir, tls.ca(dir, "other"), "untrusted", { "IP:127.0.0.1", "DNS:localhost" })
end

describe("the cosocket transport", function()
  local gateway, server

  setup(function()
    gateway = nginx.start{
      server = [[
    location = /exchange { content_by_lua_block { require("support.nginx_app").exchange() } }
    location = /upload { content_by_lua_block { require("support.nginx_app").upload() } }
    location = /pem_bound { content_by_lua_block {
      -- A request with one PEM field padded in the worker with newlines to `size` bytes (as a
      -- request body it would pass nginx's own bound): its status, failure or raised error.
      local cjson = require "cjson"
      ngx.req.read_body()
      local spec = cjson.decode(ngx.req.get_body_data())
      local field, size = spec.pad, spec.size
      spec.pad, spec.size = nil, nil
      spec[field] = (spec[field] or "") .. string.rep("\n", size - #(spec[field] or ""))
      spec.deadline = require("sandkit.core").now() + 10
      local ok, answer, failure = pcall(require("sandkit.http").exchange, spec)
      ngx.print(cjson.encode(not ok and { error = tostring(answer) }
        or answer and { status = answer.status } or { failure = failure }))
    } }
    location = /echo { content_by_lua_block {
      ngx.req.read_body()
      ngx.print(ngx.var.http_transfer_encoding or "length", " ", ngx.req.get_body_data() or "")
    } }
]],
      http = TLS_SERVERS, ports = { "good", "untrusted", "dns_only" }, prepare = certificates,
    }
  end)
  teardown(function() if gateway then gateway:stop() end end)
  after_each(function()
    if server then server:stop() end
    server = nil
  end)

  --- Sends each request from inside the worker; returns the answers.
  local function exchange(...)
    local answer = assert(raw_http.request(gateway.port, "POST", "/exchange",
      { body = cjson.encode({ ... }), timeout = 30 }))
    assert(answer.status == 200, answer.body .. gateway:error_log())
    return cjson.decode(answer.body)
  end

  local function tls_url(name)
    return "https://127.0.0.1:" .. gateway.ports[name] .. "/"
  end

  describe("over TLS", function()
    it("verifies a server reached by IP address against its certificate's addresses, sending no SNI", function()
      local a = exchange{ method = "GET", url = tls_url("good") }[1]
      assert.equal(200, a.status, cjson.encode(a))
      assert.equal("sni= client=NONE ", a.body)
    end)

    it("refuses a certificate that does not name the address it was reached at", function()
      local a = exchange{ method = "GET", url = tls_url("dns_only") }[1]
      assert.equal("refused", a.failure.kind)
      assert.is_false(a.failure.sent)
      assert.matches("does not name 127.0.0.1", a.failure.detail, 1, true)
    end)

    it("refuses a server whose certificate no trusted CA signed", function()
      local a = exchange{ method = "GET", url = tls_url("untrusted") }[1]
      assert.equal("refused", a.failure.kind)
      assert.is_false(a.failure.sent)
      assert.matches("certificate", a.failure.detail, 1, true)
    end)

    it("checks tls_server_name instead of the URL's host, and sends it as SNI", function()
      local answers = exchange({ method = "GET", url = tls_url("good"), tls_server_name = "localhost" },
        { method = "GET", url = tls_url("dns_only"), tls_server_name = "other.example" })
      local good, wrong = answers[1], answers[2]
      assert.equal("sni=localhost client=NONE ", good.body)
      assert.equal("refused", wrong.failure.kind)
      assert.matches("host mismatch", wrong.failure.detail, 1, true)
    end)

    it("verifies a request's own CA (ca_pem, ca_file) on top of nginx's, pooling by the CA verified", function()
      local ca, other = files.read(gateway.dir .. "/ca.crt"), files.read(gateway.dir .. "/other.crt")
      local answers = exchange({ method = "GET", url = tls_url("good"), ca_pem = ca },
        -- The same origin, the connection above idle in the pool: a request trusting another CA
        -- must not be handed a connection verified against the first.
        { method = "GET", url = tls_url("good"), ca_pem = other },
        { method = "GET", url = tls_url("good"), ca_file = gateway.dir .. "/ca.crt" },
        { method = "GET", url = tls_url("good"), ca_file = gateway.dir .. "/other.crt" },
        { method = "GET", url = tls_url("good"), ca_file = gateway.dir .. "/absent.crt" },
        { method = "GET", url = tls_url("good"), ca_pem = "not a certificate" })
      assert.equal(200, answers[1].status, cjson.encode(answers[1]))
      assert.equal(200, answers[3].status, cjson.encode(answers[3]))
      for _, refusal in ipairs{ { 2, "trusts (ca_pem): unable to get local issuer certificate" },
          { 4, "trusts (ca_file " .. gateway.dir .. "/other.crt): unable to get local issuer certificate" },
          { 5, "the request's CA file cannot be read" }, { 6, "trusts (ca_pem): it holds no PEM certificate" } } do
        local i, words = refusal[1], refusal[2]
        local failure = answers[i].failure
        assert(failure, i .. ": " .. cjson.encode(answers[i]))
        assert.equal("refused", failure.kind, i)
        assert.is_false(failure.sent, i)
        assert.matches(words, failure.detail, 1, true)
      end
    end)

    it("bounds the PEM text a request hands in as the libcurl transport does, refusing it before parsing", function()
      local ca = files.read(gateway.dir .. "/ca.crt")
      local function padded(field, size, spec)
        spec = spec or {}
        spec.method, spec.url, spec.pad, spec.size = "GET", tls_url("good"), field, size
        local answer = assert(raw_http.request(gateway.port, "POST", "/pem_bound",
          { body = cjson.encode(spec), timeout = 30 }))
        assert(answer.status == 200, answer.body .. gateway:error_log())
        return cjson.decode(answer.body)
      end
      local bound = 1024 * 1024
      assert.equal(200, padded("ca_pem", bound, { ca_pem = ca }).status, "at the bound exactly: accepted")
      assert.matches("PEM text over 1048576 bytes", padded("ca_pem", bound + 1, { ca_pem = ca }).error, 1, true)
      local client = { client_cert_pem = files.read(gateway.dir .. "/client.crt"),
        client_key_pem = files.read(gateway.dir .. "/client.key") }
      assert.matches("PEM text over 1048576 bytes", padded("client_cert_pem", bound + 1, client).error, 1, true)
      assert.matches("PEM text over 1048576 bytes", padded("client_key_pem", bound + 1, client).error, 1, true)
      -- A CA file is read no further than one byte past the bound.
      local at, over = gateway.dir .. "/ca_at_bound.crt", gateway.dir .. "/ca_over_bound.crt"
      files.write(at, ca .. string.rep("\n", bound - #ca))
      files.write(over, ca .. string.rep("\n", bound + 1 - #ca))
      local answers = exchange({ method = "GET", url = tls_url("good"), ca_file = at },
        { method = "GET", url = tls_url("good"), ca_file = over })
      assert.equal(200, answers[1].status, cjson.encode(answers[1]))
      assert.equal("refused", answers[2].failure.kind)
      assert.matches("is over 1048576 bytes", answers[2].failure.detail, 1, true)
    end)

    it("presents client_cert_pem and client_key_pem for mutual TLS", function()
      local a = exchange{ method = "GET", url = tls_url("good"),
        client_cert_pem = files.read(gateway.dir .. "/client.crt"),
        client_key_pem = files.read(gateway.dir .. "/client.key") }[1]
      assert.equal("sni= client=SUCCESS CN=client", a.body)
    end)
  end)

  it("goes to the Unix socket unix_socket names, the URL only naming the request, and pools by it", function()
    local agents, paths = {}, {}
    finally(function() for _, a in ipairs(agents) do a:stop() end end)
    for i = 1, 2 do
      paths[i] = agent_process.tmpdir() .. "/agent.sock"
      agents[i] = assert(agent_process.start_agent{ args = { "--listen", "unix:" .. paths[i] } })
    end
    local function get(socket_path)
      return { method = "GET", url = "http://127.0.0.1:1/v1/health?version=1", unix_socket = socket_path }
    end
    -- The same URL each time: a connection pooled by the URL alone would take the second
    -- agent's request to the first.
    local answers = exchange(get(paths[1]), get(paths[2]), get(paths[1]), get(paths[1] .. ".none"))
    -- The libcurl transport's bound (core.LIMITS.MAX_UNIX_SOCKET): one byte past it raises
    -- there and here alike; a path of the bound itself is tried, and nothing listens there.
    local function padded(size)
      local answer = assert(raw_http.request(gateway.port, "POST", "/pem_bound",
        { body = cjson.encode({ method = "GET", url = "http://127.0.0.1:1/", pad = "unix_socket", size = size,
          unix_socket = "/" }), timeout = 30 }))
      assert(answer.status == 200, answer.body .. gateway:error_log())
      return cjson.decode(answer.body)
    end
    assert.matches("a Unix socket's path over 107 bytes", padded(108).error, 1, true)
    assert.equal("refused", padded(107).failure.kind)
    for i, which in ipairs{ 1, 2, 1 } do
      assert.equal(200, answers[i].status, cjson.encode(answers[i]))
      assert.equal(agents[which].boot_id, cjson.decode(answers[i].body).bootId)
    end
    assert.equal("refused", answers[4].failure.kind)
    assert.is_false(answers[4].failure.sent)
    assert.matches("connecting to unix:" .. paths[1] .. ".none failed", answers[4].failure.detail, 1, true)
  end)

  it("refuses a proxy, sending nothing", function()
    local a = exchange{ method = "GET", url = tls_url("good"), proxy = "http://127.0.0.1:3128" }[1]
    assert.equal("refused", a.failure.kind)
    assert.is_false(a.failure.sent)
    assert.matches("proxies are not supported", a.failure.detail, 1, true)
  end)

  it("pools connections for idempotent requests and gives each fresh_connect request its own", function()
    server = fake_http.numbered()
    local a = exchange({ method = "GET", url = server.url .. "/a" }, { method = "GET", url = server.url .. "/b" },
      { method = "POST", url = server.url .. "/c", fresh_connect = true },
      { method = "POST", url = server.url .. "/d", fresh_connect = true },
      { method = "GET", url = server.url .. "/e" })
    assert.equal(a[1].body, a[2].body, "an idempotent request reuses the pooled connection")
    assert.equal(a[1].body, a[5].body, "a fresh connection is never put back into the pool")
    assert.are_not.equal(a[1].body, a[3].body)
    assert.are_not.equal(a[3].body, a[4].body)
    assert.are_not.equal(a[1].body, a[4].body)
  end)

  it("sends an idempotent request on a new connection when the server closed the pooled one, once", function()
    -- Each connection answers one request and closes, without saying so in its headers.
    server = fake_http.numbered("if req.path == '/a' then respond.status(conn, '200 OK', 'a') return conn:close() end")
    local a = exchange({ method = "GET", url = server.url .. "/a" }, { method = "GET", url = server.url .. "/b" })
    assert.equal("a", a[1].body)
    assert.equal(200, a[2].status, cjson.encode(a[2]))
    assert.equal(1, #server:requests_to("/b"))
  end)

  it("never resends a request whose pooled connection took it and gave no answer by the deadline", function()
    -- The server keeps the connection open and says nothing: the request may be in hand, so
    -- sending it again would repeat it after its deadline already passed.
    server = fake_http.numbered("if req.path == '/slow' then return conn:sleep(30) end")
    local a = exchange({ method = "GET", url = server.url .. "/a" },
      { method = "GET", url = server.url .. "/slow", timeout = 1 })
    assert.equal(200, a[1].status, cjson.encode(a[1]))
    assert.equal("timeout", a[2].failure and a[2].failure.kind, cjson.encode(a[2]))
    assert.equal(1, #server:requests_to("/slow"))
  end)

  --- Sends a PUT to the gateway's own /echo with a body from a reader, from inside the worker.
  local function upload(request)
    request.url = gateway.url .. "/echo"
    local answer = assert(raw_http.request(gateway.port, "POST", "/upload",
      { body = cjson.encode(request), timeout = 30 }))
    assert(answer.status == 200, answer.body .. gateway:error_log())
    return cjson.decode(answer.body)
  end

  it("streams a request body from a reader, chunked or with its length announced", function()
    local chunked = upload{ pieces = { "abc", "", "defg" } }
    assert.equal("chunked abcdefg", chunked.body)
    assert.equal(7, chunked.progress)
    local counted = upload{ pieces = { "abc", "defg" }, length = 7 }
    assert.equal("length abcdefg", counted.body)
  end)

  it("fails a streamed body whose source fails, or gives other than the length announced", function()
    local broken = upload{ pieces = { "abc", "defg" }, fail_after = 1 }
    assert.equal("failed", broken.failure.kind)
    assert.equal("the source went away", broken.failure.source_error)
    local longer = upload{ pieces = { "abc", "defg" }, length = 5 }
    assert.matches("more than the 5 bytes announced", longer.failure.detail, 1, true)
    local shorter = upload{ pieces = { "abc" }, length = 5 }
    assert.matches("gave 3 bytes, not the 5 announced", shorter.failure.detail, 1, true)
  end)

  --- A server answering every request with exactly `bytes`.
  local function raw_server(bytes)
    return fake_http.start(string.format([[
      local respond = require "support.respond"
      return { handle = function(req, conn) respond.raw(conn, %q) conn:close() end }
    ]], bytes))
  end

  it("refuses response headers longer than 16 KiB", function()
    server = raw_server("HTTP/1.1 200 OK\r\nX-Big: " .. string.rep("b", 17000) .. "\r\nContent-Length: 0\r\n\r\n")
    local a = exchange{ method = "GET", url = server.url .. "/" }[1]
    assert.equal("failed", a.failure.kind)
    assert.matches("longer than 16384 bytes", a.failure.detail, 1, true)
  end)

  it("refuses a response with two different Content-Lengths", function()
    server = raw_server("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd")
    local a = exchange{ method = "GET", url = server.url .. "/" }[1]
    assert.equal("failed", a.failure.kind)
    assert.matches("Content-Length", a.failure.detail, 1, true)
  end)

  it("refuses a chunk size line longer than 4096 bytes", function()
    server = raw_server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;" .. string.rep("e", 5000))
    local a = exchange{ method = "GET", url = server.url .. "/" }[1]
    assert.equal("failed", a.failure.kind)
    assert.matches("chunk line longer than 4096", a.failure.detail, 1, true)
  end)

  it("stops a success body past max_body and says it was too long", function()
    server = raw_server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n")
    local a = exchange{ method = "GET", url = server.url .. "/", max_body = 10 }[1]
    assert.equal("too_long", a.failure.kind)
  end)

  it("reads a body that runs until the server closes the connection", function()
    server = raw_server("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
    local a = exchange{ method = "GET", url = server.url .. "/" }[1]
    assert.equal("until the end", a.body)
  end)

  it("reads chunks longer than a socket read, and many in one read, byte for byte", function()
    -- Distinct bytes everywhere, so a piece delivered twice, dropped or out of order shows.
    local function text(n, seed)
      local parts = {}
      for i = 1, math.ceil(n / 8) do parts[i] = string.format("%07x|", (seed * 100003 + i) % 0xfffffff) end
      return table.concat(parts):sub(1, n)
    end
    local pieces, chunks = {}, {}
    for i, n in ipairs({ 300000, 1, 2, 3, 130000, 131072, 127 * 1024, 5 }) do
      pieces[i] = text(n, i)
      chunks[i] = string.format("%x\r\n%s\r\n", n, pieces[i])
    end
    server = raw_server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      .. table.concat(chunks) .. "0\r\n\r\n")
    local a = exchange{ method = "GET", url = server.url .. "/", max_body = 0 }[1]
    assert.equal(table.concat(pieces), a.body)
    server:stop()
    local body = text(400000, 99)
    -- Bytes past the announced length are not the body's.
    server = raw_server("HTTP/1.1 200 OK\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body .. "not the body")
    a = exchange{ method = "GET", url = server.url .. "/", max_body = 0 }[1]
    assert.equal(body, a.body)
  end)

  it("reads chunked bodies with extensions and trailers", function()
    server = raw_server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
      .. "3;name=value\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n")
    local a = exchange{ method = "GET", url = server.url .. "/" }[1]
    assert.equal("abcde", a.body)
  end)
end)
