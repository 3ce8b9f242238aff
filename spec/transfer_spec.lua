-- The C core's transfers on one libcurl multi handle, against fake servers over real sockets
-- (and a real agent on a Unix socket).

local core = require "sandkit.core"
local http = require "sandkit.http"
local agent_process = require "support.agent_process"
local fake_http = require "support.fake_http"
local files = require "support.files"

local function run_until(client, pred, limit)
  local deadline = core.now() + (limit or 10)
  while not pred() do
    if core.now() > deadline then error("condition not reached in time") end
    client:step()
    core.wait(client, 0.05)
  end
end

describe("a transfer", function()
  local server
  after_each(function() if server then server:stop() end end)

  it("pauses a body its reader does not take, holding at most its buffer, then resumes it whole", function()
    -- 64 MiB of a repeating pattern: far more than every buffer between the two processes.
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn)
        local block = string.rep("0123456789abcdef", 4096)
        respond.raw(conn, "HTTP/1.1 200 OK\r\nContent-Length: " .. (#block * 1024) .. "\r\n\r\n")
        for _ = 1, 1024 do conn:write(block) end
      end }
    ]])
    local client = core.client()
    local buffer = 64 * 1024
    local t = client:request{ method = "GET", url = server.url .. "/big", buffer_size = buffer }
    run_until(client, function() return t:state().received > 0 end)
    -- Keep driving the transfer without reading: whatever time passes, what it accepted must
    -- stay within its buffer (plus one libcurl chunk), not race to 64 MiB.
    local deadline = core.now() + 0.5
    while core.now() < deadline do
      client:step()
      core.wait(client, 0.05)
    end
    assert.is_true(t:state().received <= buffer + 16384,
      "accepted " .. t:state().received .. " bytes without a reader")
    assert.is_false(t:state().done)
    local total, bad = 0, false
    local pattern = "0123456789abcdef"
    while true do
      local chunk = t:read()
      if chunk then
        if not bad then
          local offset = total % 16
          local expect = (pattern:sub(offset + 1) .. string.rep(pattern, math.floor(#chunk / 16) + 2)):sub(1, #chunk)
          bad = chunk ~= expect
        end
        total = total + #chunk
      elseif chunk == nil then
        break
      else
        core.wait(client, 1)
      end
    end
    assert.is_true(t:state().ok)
    assert.is_false(bad, "the bytes arrived in order, none lost or repeated")
    assert.equal(64 * 1024 * 1024, total)
  end)

  it("writes into a file core.create_new made only where no name was, and refuses it closed", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn)
        local body = string.rep("0123456789abcdef", 20000)
        respond.raw(conn, "HTTP/1.1 200 OK\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body)
      end }
    ]])
    local path = files.temp_name(".got")
    local f = assert(core.create_new(path))
    assert.is_true(f:write("before "))
    local client = core.client()
    local t = client:request{ method = "GET", url = server.url .. "/body" }
    local written = 0
    repeat
      local n = t:read_to_file(f)
      if n == false then core.wait(client, 1) elseif n then written = written + n end
    until n == nil
    assert.is_true(t:state().ok)
    assert.is_true(f:close())
    assert.is_true(f:close(), "a second close is harmless")
    assert.equal(320000, written)
    assert.equal("before " .. string.rep("0123456789abcdef", 20000), files.read(path))
    local ok, err = pcall(t.read_to_file, t, f)
    assert.is_false(ok)
    assert.matches("file is closed", err, 1, true)
    assert.is_false((pcall(f.write, f, "more")))
    local again, why, name = core.create_new(path)
    assert.is_nil(again)
    assert.matches("File exists", why, 1, true)
    assert.equal("EEXIST", name)
    t:close()
    client:close()
  end)

  it("stops a body past its bound and says so", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn) respond.status(conn, "200 OK", string.rep("x", 5000)) end }
    ]])
    local client = core.client()
    local t = client:request{ method = "GET", url = server.url .. "/", max_body = 4096 }
    run_until(client, function() return t:state().done end)
    local st = t:state()
    assert.is_true(st.too_long)
    assert.is_false(st.ok)
  end)

  it("bounds an error body separately from a success body", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn) respond.status(conn, "404 Not Found", string.rep("x", 5000)) end }
    ]])
    local client = core.client()
    local t = client:request{ method = "GET", url = server.url .. "/", max_error_body = 4096 }
    run_until(client, function() return t:state().done end)
    assert.is_true(t:state().too_long)
    assert.equal(404, t:state().status)
  end)

  it("never follows a redirect", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn)
        if req.path == "/elsewhere" then return respond.status(conn, "200 OK", "followed") end
        respond.raw(conn, "HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
      end }
    ]])
    local client = core.client()
    local t = client:request{ method = "GET", url = server.url .. "/start" }
    run_until(client, function() return t:state().done end)
    assert.equal(302, t:state().status)
    assert.equal(0, #server:requests_to("/elsewhere"))
  end)

  it("reports response headers by lower-case name", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn)
        respond.raw(conn, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\n"
          .. "X-Amzn-ErrorType: ThrottlingException\r\nContent-Length: 0\r\n\r\n")
      end }
    ]])
    local client = core.client()
    local t = client:request{ method = "GET", url = server.url .. "/" }
    run_until(client, function() return t:state().headers end)
    local h = t:headers()
    assert.equal("7", h["retry-after"])
    assert.equal("ThrottlingException", h["x-amzn-errortype"])
  end)

  it("sends its method, headers and body as given", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn) respond.status(conn, "204 No Content", "") end }
    ]])
    local client = core.client()
    local t = client:request{ method = "PUT", url = server.url .. "/files",
      headers = { ["Content-Type"] = "application/json", ["X-Test"] = "yes" }, body = '{"a":1}' }
    run_until(client, function() return t:state().done end)
    local req = server:requests()[1]
    assert.equal("PUT", req.method)
    assert.equal('{"a":1}', req.body)
    assert.equal("yes", req.headers["x-test"])
    assert.is_nil(req.headers.expect, "no 100-continue round trip")
  end)

  it("refuses a header that would smuggle another header", function()
    local client = core.client()
    assert.has_error(function()
      client:request{ method = "GET", url = "http://127.0.0.1:1/", headers = { X = "a\r\nEvil: 1" } }
    end)
  end)

  it("keeps many transfers apart on one client", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn)
        conn:sleep(0.05)
        respond.status(conn, "200 OK", req.path)
      end }
    ]])
    local client = core.client()
    local transfers = {}
    for i = 1, 20 do
      transfers[i] = client:request{ method = "GET", url = server.url .. "/t" .. i }
    end
    run_until(client, function()
      for _, t in ipairs(transfers) do if not t:state().done then return false end end
      return true
    end)
    for i, t in ipairs(transfers) do assert.equal("/t" .. i, t:read()) end
  end)

  it("streams a request body the caller feeds, holding at most its send buffer, chunked without a length", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn) respond.status(conn, "204 No Content") end }
    ]])
    local client = core.client()
    local t = client:request{ method = "PUT", url = server.url .. "/up", body_stream = true }
    local block = string.rep("z", 100 * 1024)
    -- Before libcurl has read anything the buffer takes 256 KiB and no more.
    assert.equal(#block, t:feed(block))
    assert.equal(#block, t:feed(block))
    assert.equal(56 * 1024, t:feed(block), "the third feed fills the 256 KiB buffer")
    assert.equal(0, t:feed(block))
    local fed, total = 256 * 1024, 1024 * 1024
    while fed < total do
      client:step()
      local n = t:feed(block:sub(1, math.min(#block, total - fed)))
      fed = fed + n
      if n == 0 then core.wait(t, 1) end
    end
    t:finish()
    assert.has_error(function() t:feed("late") end)
    run_until(client, function() return t:state().done end)
    assert.is_true(t:state().ok)
    assert.equal(204, t:state().status)
    assert.equal(total, t:state().uploaded)
    local req = server:requests_to("/up")[1]
    assert.equal("chunked", req.headers["transfer-encoding"])
    assert.equal(total, req.body_length)
    t:close()
  end)

  it("takes no body byte past the length it announced, and fails a body finished short", function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn) respond.status(conn, "204 No Content") end }
    ]])
    local client = core.client()
    local longer = client:request{ method = "PUT", url = server.url .. "/longer", body_stream = true,
      body_length = 5 }
    assert.equal(3, longer:feed("abc"))
    assert.has_error(function() longer:feed("defg") end)
    longer:close()
    local shorter = client:request{ method = "PUT", url = server.url .. "/shorter", body_stream = true,
      body_length = 5 }
    assert.equal(3, shorter:feed("abc"))
    shorter:finish()
    run_until(client, function() return shorter:state().done end)
    assert.is_false(shorter:state().ok)
    shorter:close()
  end)

  it("never lets another request reuse the connection of a fresh_connect or streamed-body request", function()
    server = fake_http.numbered()
    local client = core.client()
    local function body_of(t)
      run_until(client, function() return t:state().done end)
      local body = t:read()
      t:close()
      return body
    end
    local fresh = body_of(client:request{ method = "POST", url = server.url .. "/run", fresh_connect = true })
    local after_fresh = body_of(client:request{ method = "GET", url = server.url .. "/a" })
    local stream = client:request{ method = "PUT", url = server.url .. "/up", body_stream = true, body_length = 1 }
    assert.equal(1, stream:feed("x"))
    stream:finish()
    local streamed = body_of(stream)
    local after_stream = body_of(client:request{ method = "GET", url = server.url .. "/b" })
    assert.are_not.equal(fresh, after_fresh)
    assert.are_not.equal(streamed, after_stream)
    assert.equal(after_fresh, after_stream, "an idempotent request's connection is pooled")
  end)

  it("holds requests and answers to the bounds core.LIMITS names, which the nginx transport reads", function()
    local limits = core.LIMITS
    server = fake_http.start(string.format([[
      local respond = require "support.respond"
      return { handle = function(req, conn)
        local lines = { "HTTP/1.1 200 OK\r\n" }
        for i = 1, %d do lines[#lines + 1] = "X-" .. i .. ": v\r\n" end
        respond.raw(conn, table.concat(lines) .. "Content-Length: 0\r\n\r\n")
      end }
    ]], limits.MAX_HEADERS + 5))
    local client = core.client()
    local headers = {}
    for i = 1, limits.MAX_REQUEST_HEADERS do headers["X-" .. i] = "v" end
    local t = client:request{ method = "GET", url = server.url .. "/", headers = headers }
    run_until(client, function() return t:state().done end)
    local kept = 0
    for _ in pairs(t:headers()) do kept = kept + 1 end
    assert.equal(limits.MAX_HEADERS, kept)
    local sent = 0
    for name in pairs(server:requests()[1].headers) do
      if name:match("^x%-%d+$") then sent = sent + 1 end
    end
    assert.equal(limits.MAX_REQUEST_HEADERS, sent)
    headers["X-One-More"] = "v"
    assert.has_error(function() client:request{ method = "GET", url = server.url .. "/", headers = headers } end,
      "more than " .. limits.MAX_REQUEST_HEADERS .. " request headers")
    assert.has_error(function()
      client:request{ method = "GET", url = server.url .. "/", ca_pem = string.rep("\n", limits.MAX_PEM + 1) }
    end, "PEM text over " .. limits.MAX_PEM .. " bytes")
  end)

  it("reads large while its client's read buffers stay within their budget, small beyond it", function()
    local limits = core.LIMITS
    assert.is_true(limits.READ_BUDGET >= limits.READ_MAX and limits.READ_SIZE < limits.READ_MAX)
    local client = core.client()
    -- What the client's open transfers hold, and so what the next one must read at once.
    local open, held = {}, 0
    local function expected()
      return held + limits.READ_MAX <= limits.READ_BUDGET and limits.READ_MAX or limits.READ_SIZE
    end
    -- Nothing listens on port 9: the transfers fail, but each holds its read size until closed.
    local function request()
      local want = expected()
      local t = client:request{ method = "GET", url = "http://127.0.0.1:9/" }
      assert.equal(want, t:state().read_size, #open + 1)
      open[#open + 1], held = t, held + want
      return t
    end
    local function close(i)
      held = held - open[i]:state().read_size
      open[i]:close()
      table.remove(open, i)
    end
    local large = math.floor(limits.READ_BUDGET / limits.READ_MAX)
    for _ = 1, large + 3 do request() end
    assert.equal(limits.READ_SIZE, open[#open]:state().read_size)
    -- Closed transfers give their share back, small ones and large ones.
    for _ = 1, 3 do close(#open) end
    close(1)
    assert.equal(limits.READ_MAX, request():state().read_size)
    assert.equal(limits.READ_SIZE, request():state().read_size)
    for _ = 1, 4 do close(1) end
    for _ = 1, 5 do request() end
    assert.is_true(held <= limits.READ_BUDGET + #open * limits.READ_SIZE)
  end)

  it("refuses a request with both a body and a body stream", function()
    local client = core.client()
    assert.has_error(function()
      client:request{ method = "PUT", url = "http://127.0.0.1:9/", body = "x", body_stream = true }
    end)
  end)
end)

describe("a streamed request body over the libcurl transport", function()
  local server
  before_each(function()
    server = fake_http.start([[
      local respond = require "support.respond"
      return { handle = function(req, conn) respond.status(conn, "204 No Content") end }
    ]])
  end)
  after_each(function() server:stop() end)

  --- A PUT whose body a reader hands over piece by piece (failing after `fail_after` pieces).
  local function upload(pieces, length, fail_after)
    local i, progress = 0, nil
    local resp, failure = http.send{ method = "PUT", url = server.url .. "/up", body_length = length,
      stall_timeout = 5, header_timeout = 5, on_body = function(n) progress = n end,
      body_reader = function()
        i = i + 1
        if fail_after and i > fail_after then return nil, "the source went away" end
        return pieces[i]
      end }
    if resp then resp:close() end
    return resp, failure, progress
  end

  it("goes out whole with the length announced, reporting its progress", function()
    local resp, _, progress = upload({ "abc", "", "defg" }, 7)
    assert.equal(204, resp.status)
    assert.equal(7, progress)
    assert.equal("abcdefg", server:requests_to("/up")[1].body)
  end)

  it("fails a streamed body whose source fails, or gives other than the length announced", function()
    local _, broken = upload({ "abc", "defg" }, nil, 1)
    assert.equal("the source went away", broken.source_error)
    assert.matches("the request body's source failed", broken.detail, 1, true)
    local started = core.now()
    local _, longer = upload({ "abc", "defg" }, 5)
    assert.matches("more than the 5 bytes announced", longer and longer.detail or "", 1, true)
    local _, shorter = upload({ "abc" }, 5)
    assert.matches("gave 3 bytes, not the 5 announced", shorter and shorter.detail or "", 1, true)
    -- Refused when the source went wrong, not when a server gave up waiting for the rest.
    assert.is_true(core.now() - started < 5, "failed at once")
    assert.equal(0, #server:requests_to("/up"), "no request with a wrong body reached the server")
  end)

  --- A PUT of the file at `path` (length bytes announced), which the transfer reads itself; the
  -- reader given beside it fails the request if it is ever called.
  local function upload_file(path, length)
    local f = assert(io.open(path, "rb"))
    local progress = {}
    local resp, failure = http.send{ method = "PUT", url = server.url .. "/up", body_length = length,
      stall_timeout = 5, header_timeout = 5, body_file = f,
      on_body = function(n) progress[#progress + 1] = n end,
      body_reader = function() return nil, "the reader was called beside its file" end }
    f:close()
    if resp then resp:close() end
    return resp, failure, progress
  end

  it("reads a body_file itself, whole and in order, past its send buffer, reporting its progress", function()
    -- Two and a half send buffers of a pattern that shows a piece sent twice or out of order.
    local size = 640 * 1024 + 7
    local path = files.temp_name(".put")
    files.write_pattern(path, size)
    local resp, failure, progress = upload_file(path, size)
    assert.is_nil(failure)
    assert.equal(204, resp.status)
    assert.equal(files.pattern(size), server:requests_to("/up")[1].body)
    assert.is_true(#progress >= 3, "progress heard as the buffer refilled")
    assert.equal(size, progress[#progress])
    for i = 2, #progress do assert.is_true(progress[i] > progress[i - 1]) end
  end)

  it("refuses a body_file that holds more or fewer bytes than announced, sending nothing", function()
    local path = files.temp_name(".put")
    files.write(path, "abcdefg")
    local _, longer = upload_file(path, 5)
    assert.matches("gave more than the 5 bytes announced", longer and longer.detail or "", 1, true)
    local _, shorter = upload_file(path, 9)
    assert.matches("gave 7 bytes, not the 9 announced", shorter and shorter.detail or "", 1, true)
    assert.equal(0, #server:requests_to("/up"), "no request with a wrong body reached the server")
  end)

  it("fails a body_file that cannot be read with the read's own error", function()
    local dir = files.temp_dir()
    local _, failure = upload_file(dir, 5)
    assert.matches("the request body's source failed", failure and failure.detail or "", 1, true)
    assert.matches("directory", tostring(failure and failure.source_error), 1, true)
    assert.equal(0, #server:requests_to("/up"))
  end)

  it("refuses feed_file on a closed file or a transfer without a streamed body", function()
    local path = files.temp_name(".put")
    files.write(path, "abc")
    local client = core.client()
    local streamed = client:request{ method = "PUT", url = server.url .. "/up", body_stream = true,
      body_length = 3 }
    local closed = assert(io.open(path, "rb"))
    closed:close()
    local ok, err = pcall(streamed.feed_file, streamed, closed)
    assert.is_false(ok)
    assert.matches("file is closed", err, 1, true)
    local f = assert(io.open(path, "rb"))
    local plain = client:request{ method = "GET", url = server.url .. "/up" }
    ok, err = pcall(plain.feed_file, plain, f)
    assert.is_false(ok)
    assert.matches("takes no more body bytes", err, 1, true)
    assert.equal(3, streamed:feed_file(f))
    streamed:finish()
    assert.is_false((pcall(streamed.feed_file, streamed, f)))
    f:close()
    streamed:close()
    plain:close()
  end)

  it("refuses read_to_file into a pipe, whose stalled reader would hold the client", function()
    local client = core.client()
    local t = client:request{ method = "GET", url = server.url .. "/up" }
    -- Refused for what it is: were the pipe's reader to stall, a write past the pipe's 64 KiB
    -- would wait for it.
    local pipe = assert(io.popen("cat > /dev/null", "w"))
    local ok, err = pcall(t.read_to_file, t, pipe)
    assert.is_false(ok)
    assert.matches("a pipe or a socket may block a write", err, 1, true)
    t:close()
    client:close()
    pipe:close()
  end)
end)

describe("a request with unix_socket", function()
  local agent, path
  setup(function()
    path = agent_process.tmpdir() .. "/agent.sock"
    agent = assert(agent_process.start_agent{ args = { "--listen", "unix:" .. path } })
  end)
  teardown(function() agent:stop() end)

  --- http.exchange of a GET of `route` on port 1 of 127.0.0.1, where nothing listens.
  local function get(route, socket_path)
    return http.exchange{ method = "GET", url = "http://127.0.0.1:1" .. route, unix_socket = socket_path,
      headers = { Authorization = "Bearer " .. agent.token }, deadline = core.now() + 10 }
  end

  it("goes to the socket it names, the URL's host and port only naming the request", function()
    local answer, failure = get("/v1/jobs/list", path)
    assert(answer, failure and failure.detail)
    assert.equal(200, answer.status)
    assert.same({}, answer.json.jobs)
    assert.equal(agent.boot_id, assert(get("/v1/health?version=1", path)).json.bootId)
  end)

  it("is refused, unsent, where no socket listens at the path", function()
    local answer, failure = get("/v1/jobs/list", path .. ".none")
    assert.is_nil(answer)
    assert.equal("refused", failure.kind)
    assert.is_false(failure.sent)
  end)

  it("refuses a path longer than a Unix socket's 107 bytes before connecting, and tries one of 107", function()
    assert.equal(107, core.LIMITS.MAX_UNIX_SOCKET)
    local client = core.client()
    local ok, err = pcall(client.request, client, { method = "GET", url = "http://127.0.0.1:1/",
      unix_socket = "/" .. string.rep("s", 107) })
    client:close()
    assert.is_false(ok)
    assert.matches("a Unix socket's path over 107 bytes", err, 1, true)
    local answer, failure = get("/v1/jobs/list", "/" .. string.rep("s", 106))
    assert.is_nil(answer)
    assert.equal("refused", failure.kind)
    assert.is_false(failure.sent)
  end)

  --- The send buffers (`ss`'s tb) of this process's connected Unix stream sockets.
  local function own_send_buffers()
    local pid = assert(files.read("/proc/self/stat")):match("^(%d+)")
    local listing = assert(io.popen("ss -xmpH state established 2>&1"))
    local sizes = {}
    for line in listing:lines() do
      if line:find("pid=" .. pid .. ",", 1, true) then sizes[#sizes + 1] = tonumber(line:match("tb(%d+)")) end
    end
    listing:close()
    return sizes
  end

  it("gives a request body's socket UNIX_SEND_BUFFER of send room, within the kernel's cap", function()
    -- Linux doubles what it is asked for, after capping it at net.core.wmem_max.
    local cap = tonumber(assert(files.read("/proc/sys/net/core/wmem_max")))
    local wanted = 2 * math.min(core.LIMITS.UNIX_SEND_BUFFER, cap)
    local function count(sizes, size)
      local n = 0
      for _, s in ipairs(sizes) do if s == size then n = n + 1 end end
      return n
    end
    local before = count(own_send_buffers(), wanted)
    local client = core.client()
    -- A body announced and never fed: the agent holds the connection open, waiting for it.
    local held = client:request{ method = "PUT", url = "http://127.0.0.1:1/v1/files/raw?path=/held",
      unix_socket = path, body_stream = true, body_length = 3,
      headers = { Authorization = "Bearer " .. agent.token } }
    run_until(client, function() return count(own_send_buffers(), wanted) > before end)
    held:close()
    client:close()
  end)
end)
