-- The real sandkit-agent under abuse: what a caller without a credential, or a caller that
-- misbehaves, can make it hold or do (docs/agent.md "Limits" and "Architecture"). Each case
-- crosses one bound and checks the agent stayed within it, read from /proc: memory (VmRSS),
-- CPU time, descriptors, its log. Counts are kept small (2 cores, a few seconds each); the
-- descriptor cases lower RLIMIT_NOFILE for the agent under test with prlimit instead of
-- opening thousands of connections. tools/abuse/ runs the same attacks at full size.

local files = require "support.files"
local raw = require "support.raw_http"
local agent_process = require "support.agent_process"
local cjson = require "cjson"
local socket = require "socket"
local core = require "sandkit.core"

local read_file, write_file = files.read, files.write
local start_agent, within, pid_alive = agent_process.start_agent, agent_process.within,
  agent_process.pid_alive
local vm_rss_kb, check_stream, b64 = agent_process.vm_rss_kb, agent_process.check_stream, agent_process.b64
local unb64, exists = agent_process.unb64, agent_process.exists

-- CPU seconds the process has used (user + system), from /proc/<pid>/stat.
local function cpu_seconds(pid)
  local stat = read_file("/proc/" .. pid .. "/stat")
  local rest = stat:match("^%d+ %b() (.*)$")
  local fields = {}
  for f in rest:gmatch("%S+") do fields[#fields + 1] = f end
  -- fields[1] is the state (field 3); utime and stime are fields 14 and 15, in clock ticks
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100
end

local function count_lines(text, needle)
  local n = 0
  for line in (text or ""):gmatch("[^\n]*") do
    if line:find(needle, 1, true) then n = n + 1 end
  end
  return n
end

-- Opens a connection and sends a head (and optionally the start of a body) without reading.
local function send_head(A, method, path, headers, body)
  local c = assert(raw.connect(A.port))
  local lines = { method .. " " .. path .. " HTTP/1.1", "Host: 127.0.0.1" }
  for k, v in pairs(headers) do lines[#lines + 1] = k .. ": " .. v end
  assert(c:send(table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or "")))
  return c
end

-- Writes up to total bytes of junk in pieces, giving up on the first error or stall; returns
-- how much the kernel took.
local function push(c, total, piece)
  piece = piece or string.rep("x", 65536)
  c:settimeout(0.2)
  local sent = 0
  while sent < total do
    local last, err, partial = c.sock:send(piece)
    local n = last or partial or 0
    sent = sent + n
    if not last then
      if err ~= "timeout" then break end
      if n == 0 then break end
    end
  end
  return sent
end

-- Sends text one byte every 50 ms (steady progress, inside any idle timeout) for at most 3 s;
-- returns how long the agent kept the connection, or nil when it outlived the trickle.
local function trickle(c, text)
  local t0 = socket.gettime()
  for i = 1, #text do
    if socket.gettime() - t0 >= 3 then return nil end
    if not c:send(text:sub(i, i)) then return socket.gettime() - t0 end
    c:settimeout(0.05)
    local data, err = c.sock:receive(1)
    if data or err ~= "timeout" then return socket.gettime() - t0 end
  end
end

-- The agent's side of each TCP connection to its port that is still open, as `ss` lists it:
-- { state =, timer = "keepalive,29sec,0" | nil }.
local function agent_sockets(port)
  local p = assert(io.popen("ss -tnoaH '( sport = :" .. port .. " )' 2>/dev/null"))
  local found = {}
  for line in p:lines() do
    local state = line:match("^(%S+)")
    if state ~= "LISTEN" then
      found[#found + 1] = { state = state, timer = line:match("timer:%(([^)]*)%)") }
    end
  end
  p:close()
  return found
end

local function established(port)
  local n = 0
  for _, s in ipairs(agent_sockets(port)) do
    if s.state == "ESTAB" then n = n + 1 end
  end
  return n
end

-- Whether process pid has path open, from its descriptors' links.
local function holds(pid, path)
  for _, fd in ipairs(core.listdir("/proc/" .. pid .. "/fd") or {}) do
    local p = io.popen("readlink /proc/" .. pid .. "/fd/" .. fd .. " 2>/dev/null")
    local target = p:read("*l")
    p:close()
    if target == path then return true end
  end
  return false
end

local function exec_ok(A)
  local t0 = socket.gettime()
  local res = assert(raw.request(A.port, "POST", "/v1/exec", { headers = A:auth(), timeout = 5,
    body = cjson.encode({ command = { "echo", "served" }, timeoutMs = 5000 }) }))
  assert.are.equal(200, res.status)
  local frames = agent_process.decode_lines(res.body)
  local last, out = check_stream(frames)
  assert.are.equal(0, last.code)
  assert.are.equal("served\n", out)
  return socket.gettime() - t0
end

describe("sandkit-agent under abuse", function()
  describe("a request without a valid credential", function()
    local A
    setup(function() A = assert(start_agent()) end)
    teardown(function() assert.are.equal(0, A:stop()) end)

    it("is refused after its head, before any of its body is read", function()
      for _, headers in ipairs({ {}, { Authorization = "Bearer " .. agent_process.new_token() } }) do
        headers["Content-Length"] = "44743000"
        local c = send_head(A, "PUT", "/v1/files", headers)
        c:settimeout(3)
        local status, h = c:read_head()
        c:close()
        assert.are.equal(headers.Authorization and 403 or 401, status)
        -- the body was never going to be read, so the connection ends with the refusal
        assert.are.equal("close", h.connection)
      end
    end)

    it("is never invited to send its body, and its connection ends with the refusal", function()
      local c = send_head(A, "PUT", "/v1/files", { ["Content-Length"] = "1000", Expect = "100-continue" })
      c:settimeout(3)
      local status, h = c:read_head()
      assert.are.equal(401, status)
      -- not invited, the caller may never send the body: the agent cannot wait for it and then
      -- read the caller's next request as the rest of it
      assert.are.equal("close", h.connection)
      assert(c:read_body())
      assert(c:send("GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n"))
      local data, err = c.sock:receive(1)
      assert.is_nil(data)
      assert.are.equal("closed", err)
      c:close()
    end)

    it("costs the agent no memory for the bodies it sends", function()
      local before = vm_rss_kb(A.pid)
      local conns = {}
      for i = 1, 10 do
        conns[i] = send_head(A, "PUT", "/v1/files", { ["Content-Length"] = "44743000" })
      end
      local sent = 0
      for _, c in ipairs(conns) do sent = sent + push(c, 4 * 1024 * 1024) end
      for _, c in ipairs(conns) do c:close() end
      local grown = vm_rss_kb(A.pid) - before
      if not agent_process.SANITIZED then
        assert.is_true(grown < 8 * 1024, "agent RSS grew by " .. grown .. " kB after " .. sent .. " bytes")
      end
      -- and the agent still answers
      assert.are.equal(200, A:req("GET", "/v1/health", nil, false).status)
    end)

    it("leaves authorized requests served while it is refused", function()
      local conns = {}
      for i = 1, 20 do conns[i] = send_head(A, "PUT", "/v1/files", { ["Content-Length"] = "44743000" }) end
      assert.is_true(exec_ok(A) < 2)
      for _, c in ipairs(conns) do c:close() end
    end)
  end)

  describe("a public route", function()
    it("takes no body: one announced reserves nothing of the bodies' budget and costs no memory", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      local before = vm_rss_kb(A.pid)
      local held = {}
      for i = 1, 2 do
        held[i] = send_head(A, "GET", "/v1/health", { ["Content-Length"] = "44743340" })
        held[i]:settimeout(3)
        local status, h = held[i]:read_head()
        -- answered from the head: the body is too long to drop, so the connection ends
        assert.are.equal(200, status)
        assert.are.equal("close", h.connection)
      end
      local sent = push(held[1], 40 * 1000 * 1000)
      -- an authorized body is not told the agent is busy
      local body = cjson.encode({ path = "/made", contentsBase64 = b64("x") })
      local res = A:req("PUT", "/v1/files", body)
      assert.are.equal(204, res.status, res.body)
      local grown = vm_rss_kb(A.pid) - before
      if not agent_process.SANITIZED then
        assert.is_true(grown < 8 * 1024, "agent RSS grew by " .. grown .. " kB after " .. sent .. " bytes")
      end
      for _, c in ipairs(held) do c:close() end
      assert.are.equal(0, A:stop())
    end)

    it("leaves a connection whose announced body never comes evictable", function()
      local A = assert(start_agent{ args = { "--max-connections", "8" } })
      finally(function() A:stop() end)
      local held = {}
      for i = 1, 8 do
        held[i] = send_head(A, "GET", "/v1/health", { ["Content-Length"] = "1" })
        held[i]:settimeout(3)
        assert.are.equal(200, (held[i]:read_head()))
        held[i]:read_body()
      end
      -- every allowed connection waits for a byte that never comes; a caller still gets in
      assert.is_true(exec_ok(A) < 2)
      for _, c in ipairs(held) do c:close() end
      assert.are.equal(0, A:stop())
    end)

    it("never invites a body with 100 Continue", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      local c = send_head(A, "GET", "/v1/health", { ["Content-Length"] = "10", Expect = "100-continue" })
      c:settimeout(3)
      local status, h = c:read_head()
      assert.are.equal(200, status)
      -- not invited, the body may never come: the connection ends with the answer
      assert.are.equal("close", h.connection)
      c:close()
      assert.are.equal(0, A:stop())
    end)
  end)

  describe("request bodies in flight", function()
    it("are bounded in total: past two of the largest, a request is answered 503 before its body", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      local limit = 44743340
      local held = {}
      for i = 1, 2 do
        held[i] = send_head(A, "PUT", "/v1/files", { Authorization = "Bearer " .. A.token,
          ["Content-Length"] = tostring(limit), Expect = "100-continue" })
        held[i]:settimeout(3)
        assert.are.equal(100, (held[i]:read_head()))
      end
      local c = send_head(A, "PUT", "/v1/files", { Authorization = "Bearer " .. A.token,
        ["Content-Length"] = tostring(limit) })
      c:settimeout(3)
      local status = c:read_head()
      assert.are.equal(503, status)
      assert.matches("^AGENT_BUSY: ", c:read_body())
      c:close()
      held[1]:close()
      -- a reservation is returned when its connection ends
      assert.is_true(within(3, function()
        local d = send_head(A, "PUT", "/v1/files", { Authorization = "Bearer " .. A.token,
          ["Content-Length"] = tostring(limit), Expect = "100-continue" })
        d:settimeout(3)
        local s = d:read_head()
        d:close()
        return s == 100
      end))
      held[2]:close()
      assert.are.equal(0, A:stop())
    end)
  end)

  describe("connections and descriptors", function()
    it("closes a connection whose head does not arrive whole within the header timeout", function()
      local A = assert(start_agent{ args = { "--header-timeout", "500" } })
      finally(function() A:stop() end)
      local c = assert(raw.connect(A.port))
      -- never a whole head
      local held = trickle(c, "GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Slow: " .. string.rep("a", 100))
      c:close()
      assert.truthy(held, "the connection outlived a head sent a byte at a time")
      assert.is_true(held >= 0.4 and held < 2, "held " .. held .. " s")
      assert.are.equal(0, A:stop())
    end)

    it("closes a connection whose body does not arrive whole within the body timeout", function()
      local A = assert(start_agent{ args = { "--body-timeout", "500" } })
      finally(function() A:stop() end)
      local c = send_head(A, "PUT", "/v1/files", { Authorization = "Bearer " .. A.token,
        ["Content-Length"] = "1000" })
      -- the whole body would take 50 s
      local held = trickle(c, string.rep("x", 1000))
      c:close()
      assert.truthy(held, "the connection outlived a body sent a byte at a time")
      assert.is_true(held >= 0.4 and held < 2, "held " .. held .. " s")
      assert.are.equal(0, A:stop())
    end)

    it("closes a connection whose refused request's body does not arrive within the body timeout", function()
      local A = assert(start_agent{ args = { "--header-timeout", "500", "--body-timeout", "500" } })
      finally(function() A:stop() end)
      local c = send_head(A, "PUT", "/v1/files", { ["Content-Length"] = "1000" })
      c:settimeout(3)
      local status, h = c:read_head()
      assert.are.equal(401, status)
      -- short enough to be dropped, so the connection was kept for the body...
      assert.is_nil(h.connection)
      c:read_body()
      -- ...which never comes: the wait for it ends with the body deadline, not never
      local t0 = socket.gettime()
      c:settimeout(5)
      local data, err = c.sock:receive(1)
      local held = socket.gettime() - t0
      c:close()
      assert.is_nil(data)
      assert.are.equal("closed", err)
      assert.is_true(held < 2, "held " .. held .. " s")
      assert.are.equal(0, A:stop())
    end)

    it("keeps the connection of a refused request whose short body arrives, and serves the next request", function()
      local A = assert(start_agent{ args = { "--body-timeout", "500" } })
      finally(function() A:stop() end)
      local c = send_head(A, "PUT", "/v1/files", { ["Content-Length"] = "1000" })
      c:settimeout(3)
      assert.are.equal(401, (c:read_head()))
      c:read_body()
      assert(c:send(string.rep("x", 1000)))
      assert(c:request("GET", "/v1/health"))
      assert.are.equal(200, (c:read_head()))
      c:close()
      assert.are.equal(0, A:stop())
    end)

    it("answers 503 AGENT_BUSY when every allowed connection is busy, and serves once one is free", function()
      local A = assert(start_agent{ args = { "--max-connections", "2" } })
      finally(function() A:stop() end)
      assert.truthy(read_file(A.log):find("at most 2 connections", 1, true))
      -- Each command runs until the spec creates its release file.
      local busy = {}
      for i = 1, 2 do
        busy[i] = A:stream({ command = { "sh", "-c", "echo started; while [ ! -e release-" .. i
          .. " ]; do sleep 0.01; done" }, timeoutMs = 60000 })
        local first = cjson.decode((assert(busy[i]:next_line())))
        assert.are.equal("started\n", unb64(first.data))
      end
      local c = assert(raw.connect(A.port))
      assert(c:request("POST", "/v1/exec", A:auth(), cjson.encode({ command = { "echo", "x" }, timeoutMs = 5000 })))
      c:settimeout(3)
      local status = c:read_head()
      assert.are.equal(503, status)
      assert.matches("^AGENT_BUSY: ", c:read_body())
      c:close()
      write_file(A.root .. "/release-1", "")
      repeat
        local line, err = busy[1]:next_line()
        assert.is_nil(err)
      until line == nil
      -- The finished command's connection is idle now, and gives way to a new one.
      assert.is_true(exec_ok(A) < 2)
      write_file(A.root .. "/release-2", "")
      for _, b in ipairs(busy) do b:close() end
      assert.are.equal(0, A:stop())
    end)

    it("evicts a connection lingering after its last reply before an idle one", function()
      local A = assert(start_agent{ args = { "--max-connections", "2" } })
      finally(function() A:stop() end)
      local idle = assert(raw.connect(A.port))
      local closing = assert(raw.connect(A.port))
      assert(closing:request("GET", "/v1/health", { Connection = "close" }))
      closing:settimeout(3)
      assert.are.equal(200, (closing:read_head()))
      assert(closing:read_body())
      -- the agent shut its side once the reply was out: it lingers now, reading what comes
      local data, err = closing.sock:receive(1)
      assert.is_nil(data)
      assert.are.equal("closed", err)
      -- a third caller takes the lingering connection's place, not the idle one's
      local third = assert(raw.connect(A.port))
      assert(third:request("GET", "/v1/health"))
      third:settimeout(3)
      assert.are.equal(200, (third:read_head()))
      assert(idle:request("GET", "/v1/health"))
      idle:settimeout(3)
      assert.are.equal(200, (idle:read_head()))
      for _, c in ipairs({ idle, closing, third }) do c:close() end
      assert.are.equal(0, A:stop())
    end)

    it("lets a caller over the cap read its 503 while it still sends its request", function()
      local A = assert(start_agent{ args = { "--max-connections", "1" } })
      finally(function() A:stop() end)
      local busy = A:stream({ command = { "sh", "-c", "echo started; exec sleep 30" }, timeoutMs = 60000 })
      assert(busy:next_line())
      local c = assert(raw.connect(A.port))
      c:settimeout(3)
      assert.are.equal(503, (c:read_head()))
      assert.matches("^AGENT_BUSY: ", c:read_body())
      -- what it sends meanwhile is read and dropped, not answered with a reset: none comes for
      -- half of the agent's bound on that reading (1 s, docs/agent.md)
      assert(c:request("PUT", "/v1/files", A:auth(), string.rep("x", 4096)))
      local failed
      assert.is_false(within(0.5, function()
        failed = c.sock:getoption("error")
        return failed ~= nil
      end), "the agent reset the caller's connection: " .. tostring(failed))
      c:close()
      busy:close()
      assert.are.equal(0, A:stop())
    end)

    it("serves the documented number of connections by default", function()
      local doc = read_file("docs/agent.md")
      local default = doc:match("| `%-%-max%-connections N` |[^\n]-Default (%d+)%.")
      assert.truthy(default, "docs/agent.md names no default for --max-connections")
      -- A descriptor limit with room for more than the default, so that it does not lower it.
      local A = assert(start_agent{ prefix = "prlimit --nofile=4096:4096" })
      finally(function() A:stop() end)
      assert.truthy(read_file(A.log):find("at most " .. default .. " connections", 1, true), read_file(A.log))
      assert.are.equal(0, A:stop())
    end)

    it("raises its descriptor limit to the hard one and gives commands the original", function()
      local A = assert(start_agent{ prefix = "prlimit --nofile=256:4096" })
      finally(function() A:stop() end)
      local limits = read_file("/proc/" .. A.pid .. "/limits")
      local soft, hard = limits:match("Max open files%s+(%d+)%s+(%d+)")
      assert.are.equal("4096", soft)
      assert.are.equal("4096", hard)
      local _, frames = A:exec({ command = { "sh", "-c", "ulimit -n" }, timeoutMs = 5000 })
      local _, out = check_stream(frames)
      assert.are.equal("256\n", out)
      assert.are.equal(0, A:stop())
    end)

    it("caps connections, evicting idle ones, and keeps serving authorized requests", function()
      -- 128 descriptors leave room for 10 connections (docs/agent.md); 150 idle callers would
      -- exhaust them without the cap
      local A = assert(start_agent{ prefix = "prlimit --nofile=128:128" })
      finally(function() A:stop() end)
      local cpu0 = cpu_seconds(A.pid)
      local idle = {}
      for i = 1, 150 do idle[i] = assert(raw.connect(A.port)) end
      local latency = exec_ok(A)
      assert.is_true(latency < 2, "an authorized exec took " .. latency .. " s")
      local fds = #core.listdir("/proc/" .. A.pid .. "/fd")
      assert.is_true(fds <= 128, fds .. " descriptors")
      for _, c in ipairs(idle) do c:close() end
      local cpu = cpu_seconds(A.pid) - cpu0
      assert.is_true(cpu < 1, "the agent used " .. cpu .. " s of CPU")
      assert.are.equal(0, count_lines(read_file(A.log), "Too many open files"))
      assert.truthy(read_file(A.log):find("at most 10 connections", 1, true))
      assert.are.equal(0, A:stop())
    end)

    it("backs off accept() when descriptors run out, logging it at most once per interval", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      -- Room for eight jobs of three descriptors each and the connection that starts them:
      -- after the eighth, nothing is left for accept().
      local in_use = #core.listdir("/proc/" .. A.pid .. "/fd")
      local limit = in_use + 8 * 3 + 1
      assert(files.execute(string.format("prlimit --pid %d --nofile=%d:%d", A.pid, limit, limit)))
      for i = 1, 8 do
        local res = A:start_job({ command = { "sleep", "3" }, timeoutMs = 60000, jobId = "fd" .. i })
        assert.are.equal(200, res.status)
      end
      local cpu0 = cpu_seconds(A.pid)
      local conns = {}
      for i = 1, 30 do conns[i] = raw.connect(A.port, nil, 1) end
      socket.sleep(1) -- the interval measured: accept() fails throughout it
      local cpu = cpu_seconds(A.pid) - cpu0
      assert.is_true(cpu < 0.3, "the agent used " .. cpu .. " s of CPU in 1 s of failing accepts")
      local lines = count_lines(read_file(A.log), "cannot accept connections")
      assert.is_true(lines >= 1 and lines <= 2, lines .. " log lines")
      for _, c in ipairs(conns) do c:close() end
      -- once the jobs end, descriptors come back and commands run again
      assert.is_true(within(10, function()
        local res = raw.request(A.port, "POST", "/v1/exec", { headers = A:auth(), timeout = 1,
          body = cjson.encode({ command = { "true" }, timeoutMs = 5000 }) })
        return res and res.status == 200 and res.body:find('"t":"exit","code":0', 1, true) ~= nil
      end))
      assert.are.equal(0, A:stop())
    end)
  end)

  describe("a caller that writes while its reply streams", function()
    it("is not read into memory: past one pipelined head the connection ends and the command dies", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      local before = vm_rss_kb(A.pid)
      local c = A:stream({ command = { "sh", "-c", "echo $$; exec sleep 1000" }, timeoutMs = 600000 })
      local f = cjson.decode((assert(c:next_line())))
      local pid = A:printed_pid(unb64(f.data))
      local sent = push(c, 16 * 1024 * 1024)
      local grown = vm_rss_kb(A.pid) - before
      assert.is_true(grown < 4 * 1024, "agent RSS grew by " .. grown .. " kB after " .. sent .. " bytes")
      assert.is_true(within(5, function() return not pid_alive(pid) end), "the command outlived its caller")
      c:close()
      assert.are.equal(0, A:stop())
    end)
  end)

  describe("a reader that stopped", function()
    -- The stall bound, short enough for a spec; docs/agent.md says what it is by default.
    local STALL = { "--stall-timeout", "500" }

    it("is given up on a streamed file: the connection and the file are let go", function()
      local A = assert(start_agent{ args = STALL })
      finally(function() A:stop() end)
      local path = A.root .. "/big"
      assert(files.execute("head -c 16777216 /dev/zero > " .. files.shell_quote(path)))
      local c = send_head(A, "GET", "/v1/files/raw?path=big", A:auth())
      c:settimeout(3)
      assert.are.equal(200, (c:read_head()))
      assert(c.sock:receive(100))
      assert.is_true(within(5, function() return not holds(A.pid, path) and established(A.port) == 0 end),
        "the agent still holds the file or the connection of a reader that stopped")
      -- and what the reader gets is a cut body, never a whole one
      local rest, err, partial = c.sock:receive(16777216 - 100)
      assert.is_nil(rest)
      assert.are.equal("closed", err)
      assert.is_true(#partial < 16777216 - 100)
      c:close()
      assert.are.equal(0, A:stop())
    end)

    it("is given up on a job poll, and on an exec stream, whose command then dies", function()
      local A = assert(start_agent{ args = STALL })
      finally(function() A:stop() end)
      local _, started = A:start_job({ command = { "head", "-c", "4194304", "/dev/zero" }, timeoutMs = 60000 })
      A:poll_until_done(started.jobId)
      local body = cjson.encode({ jobId = started.jobId })
      local poll = send_head(A, "POST", "/v1/jobs/poll", { Authorization = "Bearer " .. A.token,
        ["Content-Length"] = tostring(#body) }, body)
      local stream = A:stream({ command = { "sh", "-c", "echo $$; exec yes" }, timeoutMs = 600000 })
      local f = cjson.decode((assert(stream:next_line())))
      local pid = A:printed_pid(unb64(f.data))
      assert.is_true(within(5, function() return established(A.port) == 0 end),
        "the agent kept the connection of a reader that stopped")
      assert.is_true(within(5, function() return not pid_alive(pid) end), "the command outlived its reader")
      poll:close()
      stream:close()
      assert.are.equal(0, A:stop())
    end)

    it("is not what a stream waiting on a silent command is", function()
      local A = assert(start_agent{ args = STALL })
      finally(function() A:stop() end)
      local stream = A:stream({ command = { "sh", "-c", "echo $$; exec sleep 30" }, timeoutMs = 60000 })
      local f = cjson.decode((assert(stream:next_line())))
      local pid = A:printed_pid(unb64(f.data))
      -- three stall bounds of silence: nothing waits for the reader, so nothing is given up
      socket.sleep(1.5)
      assert.are.equal(1, established(A.port))
      assert.is_true(pid_alive(pid))
      stream:close()
      assert.are.equal(0, A:stop())
    end)
  end)

  describe("a caller that vanished without a FIN or a reset", function()
    it("is probed with TCP keep-alive, so its connection does not hold a slot for ever", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      local c = assert(raw.connect(A.port))
      local timer
      assert.is_true(within(5, function()
        local s = agent_sockets(A.port)[1]
        timer = s and s.timer
        return timer ~= nil
      end), "no timer on the agent's side of the connection")
      local kind, seconds = timer:match("^(%a+),(%d+)")
      assert.are.equal("keepalive", kind)
      -- the first probe goes within half a minute of silence (docs/agent.md)
      assert.is_true(tonumber(seconds) <= 30, timer)
      c:close()
      assert.are.equal(0, A:stop())
    end)
  end)

  describe("replies nobody reads", function()
    it("hold a bounded amount per connection for file reads", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      assert(files.execute("head -c 16777216 /dev/urandom > " .. files.shell_quote(A.root .. "/big")))
      local before = vm_rss_kb(A.pid)
      local conns = {}
      for i = 1, 8 do
        conns[i] = send_head(A, "GET", "/v1/files?path=big", { Authorization = "Bearer " .. A.token })
      end
      -- every request has been taken in once a later one on a fresh connection is answered
      assert.are.equal(200, A:req("GET", "/v1/health", nil, false).status)
      local grown = vm_rss_kb(A.pid) - before
      assert.is_true(grown < 16 * 1024, "agent RSS grew by " .. grown .. " kB")
      -- the replies are still whole for whoever reads them
      local status = conns[1]:read_head()
      assert.are.equal(200, status)
      local body = cjson.decode(conns[1]:read_body())
      assert.are.equal(read_file(A.root .. "/big"), unb64(body.contentsBase64))
      for _, c in ipairs(conns) do c:close() end
      assert.are.equal(0, A:stop())
    end)

    it("hold a bounded amount per connection for job polls", function()
      local A = assert(start_agent())
      finally(function() A:stop() end)
      local _, started = A:start_job({ command = { "sh", "-c",
        "head -c 4194304 /dev/urandom; head -c 4194304 /dev/urandom >&2" }, timeoutMs = 60000 })
      local _, frames = A:poll_until_done(started.jobId)
      local before = vm_rss_kb(A.pid)
      local conns = {}
      local body = cjson.encode({ jobId = started.jobId })
      for i = 1, 16 do
        conns[i] = send_head(A, "POST", "/v1/jobs/poll", { Authorization = "Bearer " .. A.token,
          ["Content-Length"] = tostring(#body) }, body)
      end
      assert.are.equal(200, A:req("GET", "/v1/health", nil, false).status)
      local grown = vm_rss_kb(A.pid) - before
      if not agent_process.SANITIZED then
        assert.is_true(grown < 16 * 1024, "agent RSS grew by " .. grown .. " kB")
      end
      -- each answer is still whole for whoever reads it
      assert.are.equal(200, (conns[16]:read_head()))
      local page = cjson.decode(conns[16]:read_body())
      assert.are.same(frames, page.frames)
      assert.are.equal(0, page.exitCode)
      for _, c in ipairs(conns) do c:close() end
      assert.are.equal(0, A:stop())
    end)
  end)

  describe("HTTP strictness", function()
    local A
    setup(function() A = assert(start_agent()) end)
    teardown(function() assert.are.equal(0, A:stop()) end)

    local function status_of(head_lines, body)
      local c = assert(raw.connect(A.port))
      assert(c:send(table.concat(head_lines, "\r\n") .. "\r\n\r\n" .. (body or "")))
      c:settimeout(3)
      local status = c:read_head()
      c:close()
      return status
    end

    it("finds a head's end however the head is split across writes, empty lines before it included", function()
      -- each split puts a write boundary inside the end (CR|LF|CR|LF) or the leading empty lines
      local head = "\r\n\r\nGET /v1/health HTTP/1.1\r\nHost: x\r\nX-Pad: " .. string.rep("a", 3000) .. "\r\n\r\n"
      for _, cut in ipairs({ 1, 3, #head - 3, #head - 2, #head - 1 }) do
        local c = assert(raw.connect(A.port))
        assert(c:send(head:sub(1, cut)))
        -- no answer to a head not yet whole (the wait also lets the agent read this piece alone)
        c:settimeout(0.1)
        local early, err = c.sock:receive(1)
        assert.is_nil(early)
        assert.are.equal("timeout", err)
        assert(c:send(head:sub(cut + 1)))
        c:settimeout(3)
        assert.are.equal(200, (c:read_head()), "split after byte " .. cut)
        c:close()
      end
      -- a head whose end arrives past 16 KiB, a piece at a time, is still refused
      local c = assert(raw.connect(A.port))
      local big = "GET /v1/health HTTP/1.1\r\nX-Big: " .. string.rep("a", 16400) .. "\r\n\r\n"
      for i = 1, #big, 4000 do assert(c:send(big:sub(i, i + 3999))) end
      c:settimeout(3)
      assert.are.equal(431, (c:read_head()))
      c:close()
    end)

    it("refuses two different Content-Length values and Content-Length with Transfer-Encoding", function()
      local auth = "Authorization: Bearer " .. A.token
      local body = '{"path":"/cl"}'
      assert.are.equal(400, status_of({ "POST /v1/mkdir HTTP/1.1", "Host: x", auth,
        "Content-Length: " .. #body, "Content-Length: " .. (#body + 5) }, body))
      assert.are.equal(400, status_of({ "POST /v1/mkdir HTTP/1.1", "Host: x", auth,
        "Content-Length: " .. #body .. ", " .. (#body + 1) }, body))
      assert.are.equal(400, status_of({ "POST /v1/mkdir HTTP/1.1", "Host: x", auth,
        "Content-Length: " .. #body, "Transfer-Encoding: chunked" }, body))
      assert.are.equal(501, status_of({ "POST /v1/mkdir HTTP/1.1", "Host: x", auth,
        "Transfer-Encoding: gzip, chunked" }))
      assert.is_false(exists(A.root .. "/cl"))
      -- the same length twice is one length (RFC 9112 §6.3), and chunked alone is a body
      assert.are.equal(204, status_of({ "POST /v1/mkdir HTTP/1.1", "Host: x", auth,
        "Content-Length: " .. #body, "Content-Length: " .. #body }, body))
      assert.are.equal(204, status_of({ "POST /v1/mkdir HTTP/1.1", "Host: x", auth,
        "Transfer-Encoding: chunked" }, string.format("%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n",
        5, body:sub(1, 5), #body - 5, body:sub(6))))
    end)

    it("refuses malformed heads with 400 and no side effect", function()
      local auth = "Authorization: Bearer " .. A.token
      local cases = {
        { "POST /v1/mkdir HTTP/1.1", "Host: x", auth, "Content-Length : 2" },
        { "POST /v1/mkdir HTTP/1.1", "Host: x", auth, " folded: x" },
        { "POST http://x/v1/mkdir HTTP/1.1", "Host: x", auth },
        { "POST /v1/mkdir HTTP/1.1", "Host: x", "Host: y", auth },
        { "POST /v1/mkdir HTTP/1.1", "Host: x", auth, "Content-Length: -1" },
      }
      for i, lines in ipairs(cases) do
        assert.are.equal(400, status_of(lines), "case " .. i)
      end
      assert.are.equal(505, status_of({ "GET /v1/health HTTP/2.0", "Host: x" }))
      assert.are.equal(431, status_of({ "GET /v1/health HTTP/1.1", "X-Big: " .. string.rep("a", 17000) }))
    end)

    it("refuses a file path with a trailing slash instead of dropping it", function()
      local res = A:req("PUT", "/v1/files", { path = "newfile/", contentsBase64 = b64("x") })
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      assert.is_false(exists(A.root .. "/newfile"))
      write_file(A.root .. "/there", "x")
      res = A:req("GET", "/v1/files?path=there/")
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      -- a directory path for mkdir may end in '/'
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "made/" }).status)
    end)
  end)
end)
