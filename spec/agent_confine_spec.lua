-- sandkit-agent --isolate bwrap (src/agent/confine.h, network.h, preview.h): one set of
-- namespaces for the agent's session, built once by bubblewrap and joined by every command, and
-- previews forwarded into it. The real agent, bubblewrap and sandkit-init.

local agent_process = require "support.agent_process"
local files = require "support.files"
local socket = require "socket"

local start_agent, check_stream = agent_process.start_agent, agent_process.check_stream
local within, am_root = agent_process.within, agent_process.am_root
local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"

--- As root the sandbox user needs a host uid of its own; otherwise it is the agent's user.
--- What a test must undo, newest first, however it ended: busted keeps only the last
-- `finally` a test gives, and these tests set up several things each.
local undo = {}
local function defer(fn) undo[#undo + 1] = fn end
local function undo_all()
  while #undo > 0 do pcall(table.remove(undo)) end
end

local function confined_args(extra)
  local args = { "--isolate", "bwrap" }
  if am_root() then
    args[#args + 1] = "--host-uid"
    args[#args + 1] = tostring(1500000000 + math.random(0, 999999))
  end
  for _, a in ipairs(extra or {}) do args[#args + 1] = a end
  return args
end

--- Starts a confined agent, or marks the test pending when the machine cannot confine.
local function confined(extra)
  local A, log, status = start_agent{ args = confined_args(extra) }
  if not A and status == 3 then
    pending("this machine cannot confine commands: " .. tostring(log))
    return nil
  end
  assert(A, log)
  defer(function() A:stop() end)
  return A
end

local function run(A, script, extra)
  local body = { command = { "sh", "-c", script }, timeoutMs = 20000 }
  for k, v in pairs(extra or {}) do body[k] = v end
  local _, frames = A:exec(body)
  return check_stream(frames)
end

--- A Lua program run as a job inside the session: `script` after a listening socket `s` on
-- 127.0.0.1:port exists and /tmp/listening-<port> says so. Returns once it listens.
local function serve_inside(A, port, script)
  local marker = "/tmp/listening-" .. port
  local res = A:start_job({ command = { LUA, "-e", string.format([[
    local socket = require "socket"
    local s = assert(socket.bind("127.0.0.1", %d))
    io.open(%q, "w"):close()
    ]], port, marker) .. script }, timeoutMs = 120000 })
  assert.are.equal(200, res.status, res.body)
  local last = run(A, "while [ ! -e " .. marker .. " ]; do sleep 0.02; done")
  assert.are.equal(0, last.code)
end

--- The host port a preview of `port` listens on.
local function preview(A, port)
  local res, body = A:json("POST", "/v1/preview", { port = port })
  assert.are.equal(200, res.status, res.body)
  assert.are.equal(port, body.port)
  return tonumber(body.endpoint:match("^http://127%.0%.0%.1:(%d+)$"))
end

describe("sandkit-agent --isolate bwrap", function()
  after_each(undo_all)

  it("makes its root the commands' /, and writes nowhere else", function()
    local A = confined()
    if not A then return end
    local outside = A.dir .. "/escape-" .. tostring(math.random(1e9))
    local last, out, err = run(A, "echo in > /inside.txt; echo out > " .. outside
      .. "; echo x > /var/tmp/sandkit-escape-$$; ls -A / | grep -c .")
    assert.are.equal("in\n", files.read(A.root .. "/inside.txt"))
    assert.is_false(agent_process.exists(outside))
    assert.truthy(err:find("nonexistent", 1, true) or err:find("No such file", 1, true), err)
    assert.are.equal(0, last.code)
    assert.is_true(tonumber(out) <= 14, "/ holds the session's own entries only: " .. out)
  end)

  it("gives commands no network, not even the agent's own port", function()
    local A = confined()
    if not A then return end
    local _, frames = A:exec({ command = { "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/" .. A.port
      .. " && echo connected" }, timeoutMs = 10000 })
    local last, out = check_stream(frames)
    assert.are_not.equal(0, last.code)
    assert.is_nil(out:find("connected", 1, true))
  end)

  it("gives commands a private /tmp, which its file routes see", function()
    local A = confined()
    if not A then return end
    local name = "sandkit-agent-spec-" .. tostring(math.random(1e9))
    assert.are.equal(0, run(A, "echo inner > /tmp/" .. name).code)
    local res = A:req("GET", "/v1/files/raw?path=/tmp/" .. name)
    assert.are.equal(200, res.status)
    assert.are.equal("inner\n", res.body)
    assert.is_false(agent_process.exists("/tmp/" .. name))
  end)

  it("starts commands in the user's home, honours cwd, and reports what cannot start", function()
    local A = confined()
    if not A then return end
    assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/sub" }).status)
    local _, out = run(A, "pwd; echo $HOME $PWD")
    assert.are.equal("/home/user\n/home/user /home/user\n", out)
    _, out = run(A, "pwd; echo $PWD", { cwd = "/sub" })
    assert.are.equal("/sub\n/sub\n", out)
    local _, frames = A:exec({ command = { "no-such-program-here" }, timeoutMs = 10000 })
    local last = check_stream(frames)
    assert.are.equal("spawnFailed", last.code)
    assert.truthy(last.message:find("No such file", 1, true), last.message)
    _, frames = A:exec({ command = { "true" }, timeoutMs = 10000, cwd = "/no/such/dir" })
    assert.are.equal("spawnFailed", check_stream(frames).code)
  end)

  it("reports a command killed by a signal as killed by it, with the init --init names", function()
    local A = confined{ "--init", agent_process.AGENT:match("^(.*)/[^/]*$") .. "/sandkit-init" }
    if not A then return end
    local last = run(A, "kill -TERM $$")
    assert.are.equal(143, last.code)
    assert.are.equal(15, last.signal)
  end)

  it("kills a command's group at its deadline, and what left the group when the agent stops", function()
    local A = confined()
    if not A then return end
    local nap = string.format("9%d.%06d", math.random(10000, 99999), math.random(0, 999999))
    local _, frames = A:exec({ command = { "sh", "-c", "setsid sleep " .. nap .. " & exec sleep 600" },
      timeoutMs = 500 })
    assert.are.equal("timeoutExceeded", check_stream(frames).code)
    -- One set of namespaces for the session: what left the group lives on in it, as on a
    -- machine, until the session ends.
    assert.are.equal(1, #agent_process.processes{ "sleep", nap }, "the escapee lives on in the session")
    assert.are.equal(0, A:stop())
    assert.is_true(within(5, function() return #agent_process.processes{ "sleep", nap } == 0 end))
  end)

  it("confines an unprivileged agent's commands and terminal jobs as the sandbox user, mapped to the agent's own",
    function()
    if not am_root() then
      pending("only root can start the agent as another user")
      return
    end
    local U, log, status = start_agent{ shared = true, args = { "--isolate", "bwrap" },
      prefix = "setpriv --reuid=65534 --regid=65534 --clear-groups" }
    if not U and status == 3 then
      pending("this machine refuses an unprivileged user the namespaces: " .. tostring(log))
      return
    end
    assert(U, log)
    defer(function() U:stop() end)
    assert.truthy(files.read(U.log):find("as uid 1000 (host uid 65534)", 1, true))
    local last, out = run(U, "id -u; echo made > /home/user/made; grep Cap[EP] /proc/self/status")
    assert.are.equal(0, last.code)
    assert.are.equal("1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n", out)
    assert.are.equal("65534\n", agent_process.run("stat -c %u " .. files.shell_quote(U.root .. "/home/user/made")))
    -- Its interactive jobs too: a terminal of the size asked for, and input that reaches it.
    local res, job = U:start_job{ command = { "sh", "-c", "stty size; tty; read line; echo got:$line" },
      pty = { cols = 91, rows = 33 }, stdin = true, timeoutMs = 20000 }
    assert.are.equal(200, res.status, res.body)
    -- The input is sent once the terminal's name is out: the terminal echoes it as it arrives,
    -- which would otherwise land between the two lines this case reads.
    assert.is_true(U:poll_until(job.jobId, 10, function(_, frames)
      return agent_process.frames_data(frames, "stdout"):find("/dev/pts/%d+\r\n") ~= nil
    end), "the job did not print its terminal")
    res = U:req("POST", "/v1/jobs/stdin?jobId=" .. job.jobId .. "&offset=0", "hello\n")
    assert.are.equal(200, res.status, res.body)
    local page, frames = U:poll_until_done(job.jobId, 10)
    assert.are.equal(0, page.exitCode)
    local shown = agent_process.frames_data(frames, "stdout")
    assert.truthy(shown:find("33 91\r\n/dev/pts/", 1, true), shown)
    assert.truthy(shown:find("got:hello", 1, true), shown)
  end)

  it("refuses what it cannot honour: status 2 for a bad start, 3 without confinement, 4 without a stack",
    function()
      local cases = {
        { args = { "--network", "outbound" }, status = 2, says = "need --isolate bwrap" },
        { args = { "--host-uid", "1234" }, status = 2, says = "need --isolate bwrap" },
        { args = { "--isolate", "jail" }, status = 2, says = "--isolate must be bwrap or none" },
        { args = confined_args{ "--network", "wide" }, status = 2, says = "--network must be none or outbound" },
        { args = confined_args{ "--bwrap", "/nonexistent/bwrap" }, status = 3,
          says = "bubblewrap is not installed (/nonexistent/bwrap" },
        { args = confined_args{ "--init", "/nonexistent/init" }, status = 2, says = "/nonexistent/init" },
        { args = confined_args{ "--network", "outbound", "--pasta", "/nonexistent/pasta", "--slirp4netns",
          "/nonexistent/slirp4netns" }, status = 4, says = "Debian package passt" },
      }
      -- A stack that fails says why last, after lines of its own noise (pasta's, without syslog).
      local stack = files.temp_name()
      defer(function() os.remove(stack) end)
      files.write(stack, "#!/bin/sh\necho 'Failed to send 45 bytes to syslog' >&2\n"
        .. "echo 'Failed to open tun socket in namespace' >&2\nexit 1\n")
      assert(os.execute("chmod 755 " .. files.shell_quote(stack)))
      cases[#cases + 1] = { args = confined_args{ "--network", "outbound", "--pasta", stack }, status = 4,
        says = "pasta could not attach to the session (it exited): Failed to open tun socket in namespace" }
      if am_root() then
        cases[#cases + 1] = { args = { "--isolate", "bwrap" }, status = 2, says = "needs --host-uid" }
        cases[#cases + 1] = { args = { "--isolate", "bwrap", "--host-uid", "0" }, status = 2,
          says = "root on the host" }
      end
      for _, case in ipairs(cases) do
        local A, log, status = start_agent{ args = case.args }
        if A then A:stop() end
        assert.is_nil(A, case.says)
        assert.are.equal(case.status, status, log)
        assert.truthy(log:find(case.says, 1, true), log)
      end
    end)

  describe("previews", function()
    it("forward a port of the session's loopback from the host's, the same one each time", function()
      local A = confined()
      if not A then return end
      local _, health = A:json("GET", "/v1/health")
      assert.truthy(table.concat(health.features, " "):find("preview", 1, true))
      serve_inside(A, 8080, [[
        while true do
          local c = s:accept()
          c:receive("*l")
          c:send("HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\ninside")
          c:close()
        end]])
      local port = preview(A, 8080)
      assert.are.equal(port, preview(A, 8080))
      local res = assert(require("support.raw_http").request(port, "GET", "/"))
      assert.are.equal("inside", res.body)
      -- Nothing listens on 8081 inside: the caller's connection is closed.
      local closed = preview(A, 8081)
      local c = assert(socket.connect("127.0.0.1", closed))
      c:settimeout(5)
      c:send("GET / HTTP/1.1\r\n\r\n")
      local got, err = c:receive("*a")
      c:close()
      assert.are.equal("", got or "", tostring(err))
    end)

    it("refuse a port that is no port, a port named twice, the port past the bound, and an unconfined agent",
      function()
        local A = confined()
        if not A then return end
        for _, body in ipairs{ '{"port":0}', '{"port":65536}', '{"port":"80"}', '{"port":80.5}', '{}',
          '{"port":80,"port":81}', '[80]', '{"port":-1}' } do
          local res = A:req("POST", "/v1/preview", body)
          assert.are.equal(400, res.status, body)
          assert.truthy(res.body:find("REQUEST_INVALID", 1, true), res.body)
        end
        for port = 1, 16 do preview(A, 9000 + port) end
        assert.is_number(preview(A, 9001), "a port already previewed still answers")
        local res = A:req("POST", "/v1/preview", { port = 9100 })
        assert.are.equal(400, res.status)
        assert.truthy(res.body:find("at most 16 ports", 1, true), res.body)
        local U = assert(start_agent())
        defer(function() U:stop() end)
        local _, health = U:json("GET", "/v1/health")
        assert.is_nil(table.concat(health.features, " "):find("preview", 1, true))
        res = U:req("POST", "/v1/preview", { port = 8080 })
        assert.are.equal(400, res.status)
        assert.truthy(res.body:find("does not confine", 1, true), res.body)
      end)

    it("hold a connection's data to bounded buffers each way when the other side does not read", function()
      local A = confined()
      if not A then return end
      -- Inside, a server that writes to its caller without end and never reads, counting what
      -- the kernel took in /tmp/sent.
      serve_inside(A, 8080, [[
        local c = s:accept()
        c:settimeout(0.05)
        local block, sent = string.rep("x", 65536), 0
        while true do
          local n, _, partial = c:send(block)
          sent = sent + (n or partial or 0)
          local f = io.open("/tmp/sent.tmp", "w") f:write(sent) f:close()
          os.rename("/tmp/sent.tmp", "/tmp/sent")
        end]])
      local port = preview(A, 8080)
      local rss_before = agent_process.vm_rss_kb(A.pid)
      local c = assert(socket.connect("127.0.0.1", port))
      -- The caller writes and does not read, the server reads nothing: both directions fill.
      c:settimeout(0.05)
      local block, pushed, started = string.rep("y", 65536), 0, socket.gettime()
      while socket.gettime() - started < 2 do
        local n, _, partial = c:send(block)
        pushed = pushed + (n or partial or 0)
      end
      local sent = tonumber(A:req("GET", "/v1/files/raw?path=/tmp/sent").body)
      local rss_after = agent_process.vm_rss_kb(A.pid)
      c:close()
      -- Unthrottled, either side moves hundreds of MiB in 2 s; held, each is ahead of its
      -- reader only by the sockets' buffers and the agent's 64 KiB per direction.
      assert.is_true(sent < 32 * 1024 * 1024, "the server wrote " .. sent .. " bytes nobody read")
      assert.is_true(pushed < 32 * 1024 * 1024, "the caller wrote " .. pushed .. " bytes nobody read")
      if not agent_process.SANITIZED then
        assert.is_true(rss_after - rss_before < 16 * 1024, "the agent grew by " .. (rss_after - rss_before) .. " kB")
      end
    end)

    it("close a connection past the bound at once, and take one again once one ended", function()
      local A = confined()
      if not A then return end
      -- Inside, a server that takes connections and keeps them, answering nothing.
      serve_inside(A, 8080, [[
        local held = {}
        while true do held[#held + 1] = s:accept() end]])
      local port = preview(A, 8080)
      local open = {}
      defer(function() for _, c in ipairs(open) do c:close() end end)
      for i = 1, 64 do open[i] = assert(socket.connect("127.0.0.1", port)) end
      local function closed_at_once(c)
        c:settimeout(2)
        local _, err = c:receive(1)
        return err == "closed"
      end
      -- The 64 are spliced: each is answered nothing, and none is closed.
      open[1]:settimeout(0.5)
      assert.are.equal("timeout", select(2, open[1]:receive(1)))
      local extra = assert(socket.connect("127.0.0.1", port))
      assert.is_true(closed_at_once(extra), "the 65th connection was kept")
      extra:close()
      open[64]:close()
      table.remove(open)
      -- The agent notices the end; then a new connection is taken again.
      assert.is_true(within(5, function()
        local c = assert(socket.connect("127.0.0.1", port))
        c:settimeout(0.3)
        local _, err = c:receive(1)
        if err == "timeout" then
          open[#open + 1] = c
          return true
        end
        c:close()
        return false
      end), "no connection is taken after one ended")
    end)
  end)
end)
