-- The local provider end to end: real sandkit-agent processes under a private state folder.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local files = require "support.files"
local local_state = require "support.local_state"

local function stat_mode(path)
  local p = io.popen("stat -c %a " .. local_state.shell_quote(path))
  local mode = p:read("l")
  p:close()
  return mode
end

describe("the local provider", function()
  local root, sandbox
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  end)
  after_each(function() local_state.clean(root) end)

  it("is the provider a sandbox gets when none is named", function()
    local sb = assert(sandkit.sandbox{ root = root })
    assert.equal("local", sb.provider.name)
  end)

  it("creates a session that can already serve, its token private to its user", function()
    local session = assert(sandbox:create{ id = "alpha" })
    assert.equal("alpha", session.id)
    assert.equal("running", session.state)
    assert.equal(1, session.generation)
    assert.equal("600", stat_mode(root .. "/sessions/alpha/token"))
    assert.equal("700", stat_mode(root .. "/sessions/alpha"))
    local token = io.open(root .. "/sessions/alpha/token"):read("a")
    assert.equal(44, #token)
    assert.equal(32, #core.b64decode(token))
    local result = assert(session:exec({ "echo", "ready" }, { timeout = 10 }))
    assert.equal("ready\n", result.stdout)
  end)

  it("serves a session over a Unix socket in its folder that only its user may open, on no port", function()
    local session = assert(sandbox:create{ id = "sock" })
    local path = root .. "/sessions/sock/agent.sock"
    assert.equal(path, session.record.socket)
    assert.is_nil(session.record.port)
    assert.equal("600", stat_mode(path))
    assert.truthy(io.open(root .. "/sessions/sock/agent.log"):read("a"):find("on unix:" .. path, 1, true))
    -- Found again from the record, as another process would.
    local again = assert(assert(sandkit.sandbox{ provider = "local", root = root }):get("sock"))
    assert.equal(path, again.record.socket)
    assert.equal("here\n", assert(again:exec({ "echo", "here" }, { timeout = 10 })).stdout)
    assert(session:terminate())
    assert.is_nil(io.open(path), "the socket outlived its session")
  end)

  it("sends a session's token to no socket but its own folder's, whatever its record names", function()
    local session = assert(sandbox:create{ id = "own" })
    local token = io.open(root .. "/sessions/own/token"):read("a")
    -- A listener elsewhere that keeps what one connection sends, then hangs up: a reader of
    -- the record who connected there would have sent it the token before its answer came.
    local planted, heard = root .. "/planted.sock", root .. "/heard"
    local listener = io.popen("exec python3 -u -c " .. local_state.shell_quote([[
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(4)
print(os.getpid(), flush=True)
while True:
    c, _ = s.accept()
    data = c.recv(65536)
    with open(sys.argv[2], "ab") as f: f.write(data)
    c.close()
]]) .. " " .. local_state.shell_quote(planted) .. " " .. local_state.shell_quote(heard))
    local pid = assert(tonumber(listener:read("l")), "the listener did not start")
    finally(function()
      os.execute("kill " .. pid)
      listener:close()
    end)
    local path = root .. "/sessions/own/record.json"
    local text = io.open(path):read("a")
    local edited = text:gsub('"socket":"[^"]*"', '"socket":"' .. planted .. '"')
    assert.are_not.equal(text, edited)
    local f = io.open(path, "w")
    f:write(edited)
    f:close()
    local again = assert(sandkit.sandbox{ provider = "local", root = root })
    assert.is_nil(again:get("own"), "a record naming another socket was served")
    local sent = files.read(heard)
    assert.is_nil(sent, "the planted socket was sent " .. tostring(sent and (sent:find(token, 1, true)
      and "the session's token" or sent)))
    -- A record refused for serving still names the agent that terminate must stop.
    assert(session:terminate())
    assert.is_false(core.alive(session.record.pid), "the agent outlived its terminated session")
  end)

  it("serves a session on 127.0.0.1 where its socket's path would pass 107 bytes", function()
    local deep = root .. "/" .. string.rep("d", 100 - #root)
    local sb = assert(sandkit.sandbox{ provider = "local", root = deep })
    local session = assert(sb:create{ id = "far" })
    assert.is_nil(session.record.socket)
    assert.is_number(session.record.port)
    assert.is_nil(io.open(deep .. "/sessions/far/agent.sock"))
    assert.equal("far\n", assert(session:exec({ "echo", "far" }, { timeout = 10 })).stdout)
    assert.equal("far\n", assert(assert(sb:get("far")):exec({ "echo", "far" }, { timeout = 10 })).stdout)
    assert(session:terminate())
  end)

  it("refuses ids outside [A-Za-z0-9_-] of 1 to 63 before touching the disk", function()
    for _, id in ipairs({ "", "a/b", "..", "a b", string.rep("x", 64), "é" }) do
      local session, err = sandbox:create{ id = id }
      assert.is_nil(session)
      assert.equal("INVALID_INPUT", err.code, id)
    end
    assert.is_nil(core.listdir(root .. "/sessions/.."  .. "/sessions/a"))
  end)

  it("refuses to create an id that exists", function()
    assert(sandbox:create{ id = "twice" })
    local again, err = sandbox:create{ id = "twice" }
    assert.is_nil(again)
    assert.equal("INVALID_INPUT", err.code)
  end)

  it("keeps files under the session, where its commands find them at the same paths", function()
    local session = assert(sandbox:create{ id = "files" })
    assert(session:write_files{ ["/app/in.txt"] = "payload\0with NUL" })
    assert(session:mkdir("/app/build"))
    local result = assert(session:exec({ "sh", "-c", "cat /app/in.txt | wc -c; test -d /app/build && echo dir" },
      { timeout = 10 }))
    assert.equal("16\ndir\n", result.stdout)
    assert.equal("payload\0with NUL", assert(session:read_file("/app/in.txt")))
    local f = io.open(root .. "/sessions/files/files/app/in.txt", "rb")
    assert.equal("payload\0with NUL", f:read("a"))
    f:close()
  end)

  it("gives every command the session's default environment, the command's own winning", function()
    local session = assert(sandbox:create{ id = "envs", env = { A = "session", B = "session" } })
    local result = assert(session:exec({ "sh", "-c", "echo $A $B" }, { timeout = 10, env = { B = "command" } }))
    assert.equal("session command\n", result.stdout)
    local again = assert(sandbox:get("envs"))
    result = assert(again:exec({ "sh", "-c", "echo $A" }, { timeout = 10 }))
    assert.equal("session\n", result.stdout, "the default survives a reconnect")
  end)

  it("lists its sessions and finds one by id", function()
    assert(sandbox:create{ id = "one" })
    assert(sandbox:create{ id = "two" })
    local ids = {}
    for _, s in ipairs(assert(sandbox:list())) do ids[#ids + 1] = s.id .. ":" .. s.state end
    assert.same({ "one:running", "two:running" }, ids)
    assert.equal("running", assert(sandbox:get("two")).state)
  end)

  it("reads an absent id as absent, not as an error", function()
    local session, err = sandbox:get("nobody")
    assert.is_nil(session)
    assert.is_nil(err)
  end)

  it("terminates a session: its agent is gone and its files removed; again succeeds", function()
    local session = assert(sandbox:create{ id = "doomed" })
    local record = session.record
    assert.is_true(core.alive(record.pid))
    assert(sandbox:terminate("doomed"))
    assert.is_false(core.alive(record.pid))
    assert.is_nil(io.open(root .. "/sessions/doomed/record.json"))
    assert.is_true(sandbox:terminate("doomed"), "terminating an absent session succeeds")
    assert.is_nil((sandbox:get("doomed")))
  end)

  it("terminates a session whatever tree its files became, at any depth", function()
    local session = assert(sandbox:create{ id = "deep" })
    -- As deep as the agent's own paths go, then far deeper than any path can name, built by a
    -- command one directory at a time; a directory left unreadable and one left read-only.
    assert(session:write_files{ [("d/"):rep(300) .. "f"] = "x" })
    local built = assert(session:exec({ "sh", "-c", "mkdir -p locked/in open && touch locked/in/f "
      .. "&& chmod 0 locked/in && chmod 500 locked && exec perl -e 'for (1..3000) { mkdir \"n\" "
      .. "or die; chdir \"n\" or die } open(F, \">f\") or die'" }, { timeout = 60 }))
    assert.equal(0, built.code, built.stderr)
    assert(sandbox:terminate("deep"))
    assert.is_nil(core.listdir(root .. "/sessions/deep"), "the session's directory is gone")
  end)

  it("reports a removal that will fail again as not retryable", function()
    local session = assert(sandbox:create{ id = "pinned" })
    local mount = root .. "/sessions/pinned/files/mnt"
    assert(session:mkdir("/mnt"))
    -- A mount point cannot be removed by anyone but whoever unmounts it: it fails every time.
    local mounted = os.execute("mount -t tmpfs sandkit-spec " .. local_state.shell_quote(mount) .. " 2>/dev/null")
    if mounted ~= true and mounted ~= 0 then
      pending("mounting a tmpfs needs root")
      return
    end
    finally(function() local_state.sh("umount " .. local_state.shell_quote(mount)) end)
    local ok, err = sandbox:terminate("pinned")
    assert.is_nil(ok)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_false(err.retryable, tostring(err))
    assert.truthy(err.message:find("busy", 1, true), err.message)
  end)

  it("reads a session whose agent died as terminated, promptly", function()
    local session = assert(sandbox:create{ id = "crashed" })
    core.kill(session.record.pid, core.SIGKILL)
    core.reap(session.record.pid, true)
    local started = core.now()
    local found = assert(sandbox:get("crashed"))
    assert.equal("terminated", found.state)
    assert.is_true(core.now() - started < 3, "a dead agent must not read as a hang")
  end)

  it("serves a dead session again from get_or_create, files kept and generation advanced", function()
    local session, created = sandbox:get_or_create{ id = "phoenix" }
    assert.is_true(created)
    assert(session:write_files{ ["/keep.txt"] = "kept" })
    core.kill(session.record.pid, core.SIGKILL)
    core.reap(session.record.pid, true)
    local revived, again = sandbox:get_or_create{ id = "phoenix" }
    assert.is_false(again)
    assert.equal("running", revived.state)
    assert.equal(2, revived.generation)
    assert.equal(session.record.host_uid, revived.record.host_uid, "the same sandbox user on the host")
    assert.equal("bwrap", revived.record.isolate)
    assert.equal("again\n", assert(revived:exec({ "sh", "-c", "echo again > /keep2.txt && cat /keep2.txt" },
      { timeout = 10 })).stdout, "the revived session's user owns its files still")
    assert.is_string(revived.boot_id)
    assert.are_not.equal(session.boot_id, revived.boot_id, "a fresh agent has a fresh boot id")
    assert.equal("kept", assert(revived:read_file("/keep.txt")))
    local same, third = sandbox:get_or_create{ id = "phoenix" }
    assert.is_false(third)
    assert.equal(2, same.generation)
  end)

  it("lets a second process reattach to a job and read it to its end", function()
    local session = assert(sandbox:create{ id = "jobs" })
    local job = assert(session:start_job({ "sh", "-c", "echo first; sleep 0.3; echo second; exit 5" },
      { timeout = 30 }))
    local out, status = local_state.run_lua(string.format([[
      local sandkit = require "sandkit"
      local sb = assert(sandkit.sandbox{ provider = "local", root = %q })
      local session = assert(sb:get("jobs"))
      for frame in session:job(%q):frames{ interval = 0.05 } do
        if frame.type == "exit" then io.write("exit ", frame.code, "\n") else io.write(frame.data) end
      end
    ]], root, job.id))
    assert.equal(0, status, out)
    assert.equal("first\nsecond\nexit 5\n", out)
  end)

  it("sees a session another process created, through its record", function()
    local out, status = local_state.run_lua(string.format([[
      local sandkit = require "sandkit"
      local sb = assert(sandkit.sandbox{ provider = "local", root = %q })
      assert(sb:create{ id = "theirs" })
    ]], root))
    assert.equal(0, status, out)
    local session = assert(sandbox:get("theirs"))
    assert.equal("running", session.state)
    assert.equal("theirs\n", assert(session:exec({ "echo", "theirs" }, { timeout = 10 })).stdout)
  end)

  it("describes what it can do, and refuses pause and snapshot without asking the agent", function()
    local caps = sandbox:capabilities()
    assert.is_true(caps.files and caps.jobs and caps.reconnect and caps.list and caps.preview and caps.fs
      and caps.watch)
    assert.is_false(caps.pause_resume)
    assert.is_false(caps.snapshot)
    assert.equal("bwrap", caps.isolation, "sessions are confined unless asked otherwise")
    assert.equal(io.open("/usr/bin/bwrap") ~= nil, caps.bwrap)
    local session = assert(sandbox:create{ id = "caps" })
    for _, call in ipairs({ session.pause, session.resume, session.snapshot }) do
      local ok, err = call(session)
      assert.is_nil(ok)
      assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    end
  end)

  it("previews a port a command listens on: forwarded when confined, the port itself when not", function()
    for _, isolate in ipairs{ "bwrap", "none" } do
      local sb = assert(sandkit.sandbox{ provider = "local", root = root, isolate = isolate })
      local session = assert(sb:create{ id = "web-" .. isolate })
      -- A one-request HTTP server inside the session; it writes its port once it listens.
      local server_job = assert(session:start_job({ os.getenv("SANDKIT_TEST_LUA") or "lua5.4", "-e", [[
        local socket = require "socket"
        local s = assert(socket.bind("127.0.0.1", 0))
        local _, port = s:getsockname()
        local f = io.open("port", "w") f:write(port) f:close()
        local c = s:accept()
        c:receive("*l")
        c:send("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\npreview")
        c:close()
      ]] }, { timeout = 30 }))
      local port
      for frame in session:run({ "sh", "-c", "while [ ! -s port ]; do sleep 0.02; done; cat port" },
          { timeout = 20 }) do
        if frame.type == "stdout" then port = tonumber(frame.data) end
      end
      local cap = assert(session:preview(port))
      if isolate == "none" then
        assert.equal("http://127.0.0.1:" .. port, cap.endpoint, "an unconfined session's port is the host's")
      else
        assert.matches("^http://127%.0%.0%.1:%d+$", cap.endpoint)
      end
      assert.same({ port }, cap.allowed_ports)
      assert.equal(math.huge, cap.expires_in, "a loopback preview never expires")
      local http = require "sandkit.http"
      local answer = assert(http.exchange{ method = "GET", url = cap.endpoint .. "/", headers = cap.headers,
        deadline = core.now() + 10 })
      assert.equal("preview", answer.body)
      server_job:cancel()
    end
  end)

  it("keeps the agent's code of a refusal as err.reason", function()
    local session = assert(sandbox:create{ id = "reasons" })
    local bytes, err = session:read_file("/no/such/file")
    assert.is_nil(bytes)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("PATH_NOT_FOUND", err.reason)
    local _, perr = session:read_file("../outside")
    assert.equal("PATH_REFUSED", perr.reason)
  end)

  it("starts a job id's command once, and refuses the id for another command", function()
    local session = assert(sandbox:create{ id = "one-id" })
    local job = assert(session:start_job({ "touch", "/first" }, { timeout = 10, id = "build-7" }))
    local again = assert(session:start_job({ "touch", "/first" }, { timeout = 10, id = "build-7" }))
    assert.equal(job.id, again.id)
    local other, err = session:start_job({ "touch", "/second" }, { timeout = 10, id = "build-7" })
    assert.is_nil(other)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("JOB_ID_CONFLICT", err.reason)
    assert.is_false(err.retryable)
    for _ in session:job("build-7"):frames{ interval = 0.05 } do end
    assert.truthy(session:read_file("/first"))
    local _, missing = session:read_file("/second")
    assert.equal("PATH_NOT_FOUND", missing.reason)
  end)

  it("says a command's timeout in seconds, and hands back the output that arrived before it", function()
    local session = assert(sandbox:create{ id = "slow" })
    local result, err = session:exec({ "sh", "-c", "echo partial; echo warned >&2; exec sleep 30" },
      { timeout = 0.5 })
    assert.is_nil(result)
    assert.equal("timeoutExceeded", err.failure)
    assert.matches("^the command did not finish within its 0.5s timeout", err.message)
    assert.equal("partial\n", err.stdout)
    assert.equal("warned\n", err.stderr)
  end)

  it("records when a session was created", function()
    local before = os.time()
    local session = assert(sandbox:create{ id = "dated" })
    assert.is_true(session.created_at >= before and session.created_at <= os.time())
    assert.equal(session.created_at, assert(sandbox:get("dated")).created_at)
  end)

  it("ends a session with a lifetime: its agent leaves and the session reads as absent", function()
    -- Three seconds: a session started on a loaded machine must still be seen serving first.
    local session = assert(sandbox:create{ id = "brief", lifetime = 3 })
    local pid = session.record.pid
    assert.equal("ok\n", assert(session:exec({ "echo", "ok" }, { timeout = 5 })).stdout)
    -- The agent leaves on its own once the three seconds are over; bounded wait for that.
    local deadline = core.now() + 15
    while core.alive(pid) and not core.reap(pid) and core.now() < deadline do
      require("sandkit.wait").sleep(0.05)
    end
    assert.is_false(core.alive(pid), "the agent left at the end of its lifetime")
    assert.is_nil((sandbox:get("brief")))
    assert.is_nil(io.open(root .. "/sessions/brief/record.json"), "its files went with it")
    local _, err = sandbox:create{ id = "never", lifetime = 0 }
    assert.equal("lifetime", err.field)
  end)

  it("refuses an endless lifetime before anything starts, leaving nothing under the root", function()
    for _, lifetime in ipairs{ math.huge, 0 / 0 } do
      local session, err = sandbox:create{ id = "endless", lifetime = lifetime }
      assert.is_nil(session)
      assert.equal("INVALID_INPUT", err.code, tostring(err))
      assert.equal("lifetime", err.field)
      assert.same({}, core.listdir(root .. "/sessions") or {}, "nothing is left under the root")
    end
  end)

  it("stops the agent it started and leaves nothing when anything fails after the start", function()
    local started
    local real = sandbox.provider.await_agent
    -- The record is written and then something raises, as a failing encoder or disk would.
    sandbox.provider.await_agent = function(...)
      started = real(...)
      error("the disk went away", 0)
    end
    local session, err = sandbox:create{ id = "halfway" }
    sandbox.provider.await_agent = nil
    assert.is_nil(session)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.matches("the disk went away", err.message, 1, true)
    assert.is_table(started, "the agent had started")
    assert.is_false(core.alive(started.pid), "the agent it started is gone")
    assert.is_nil(core.listdir(root .. "/sessions/halfway"), "its folder is gone")
  end)

  it("refuses a sandkit-agent that does not exist as bad input, not as an unsupported operation", function()
    local missing = assert(sandkit.sandbox{ provider = "local", root = root, agent_path = "/no/such/sandkit-agent" })
    local session, err = missing:create{ id = "orphan" }
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("agent_path", err.field)
    assert.matches("/no/such/sandkit-agent", err.message, 1, true)
  end)

  it("reports an agent that cannot start instead of waiting for it", function()
    local broken = assert(sandkit.sandbox{ provider = "local", root = root, agent_path = "/bin/false" })
    local session, err = broken:create{ id = "broken" }
    assert.is_nil(session)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_nil(io.open(root .. "/sessions/broken/record.json"), "a failed create leaves nothing")
  end)
end)
