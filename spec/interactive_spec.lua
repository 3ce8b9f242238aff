-- Interactive processes (README, "Interactive processes"): input written at byte offsets and
-- taken exactly once, terminals, signals, live job streams and the list of jobs, through the
-- Lua API on a confined local session and its real agent.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local files = require "support.files"
local local_state = require "support.local_state"
local procs = require "support.processes"
local protocol_jobs = require "sandkit.protocol_jobs"
local agent_session = require "support.agent_session"

local q = local_state.shell_quote
local within = procs.within
local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"

--- Every frame's bytes of a finished job, and its exit frame.
local function drain(p)
  local out, exit = {}, nil
  for frame in p:frames() do
    if frame.type == "exit" then exit = frame else out[#out + 1] = frame.data end
  end
  return table.concat(out), exit
end

--- The host pids of the session's agent: the processes whose command line names root.
local function agent_pids(root)
  local pids = {}
  for _, name in ipairs(core.listdir("/proc") or {}) do
    if name:match("^%d+$") then
      local cmdline = files.read("/proc/" .. name .. "/cmdline") or ""
      if cmdline:find("sandkit-agent", 1, true) and cmdline:find(root, 1, true) then
        pids[#pids + 1] = tonumber(name)
      end
    end
  end
  return pids
end

local function rss_kib(pid)
  local status = files.read("/proc/" .. pid .. "/status") or ""
  return tonumber(status:match("VmRSS:%s*(%d+)"))
end

describe("an interactive job of a confined local session", function()
  local root, session

  setup(function()
    root = local_state.new()
    local sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
    local err
    session, err = sandbox:create{}
    if not session and err.code == "INVALID_INPUT" and err.field == "isolate" then
      session = nil
      return
    end
    assert(session, err)
  end)

  teardown(function()
    local_state.clean(root)
  end)

  before_each(function()
    if not session then pending("this machine cannot confine a session") end
  end)

  it("says it takes stdin and a pty among its capabilities", function()
    local caps = session:capabilities()
    assert.is_true(caps.stdin)
    assert.is_true(caps.pty)
  end)

  it("reads what was written to its stdin, and ends once stdin is closed", function()
    local p = assert(session:spawn({ "cat" }, { timeout = 30, stdin = true }))
    assert(p:write("hello "))
    assert(p:write("world\n"))
    assert(p:close_stdin())
    local out, exit = drain(p)
    assert.equal("hello world\n", out)
    assert.equal(0, exit.code)
    assert.equal(0, assert(p:wait()))
  end)

  it("takes a resend of bytes it already has once, and refuses an offset past what it has", function()
    local p = assert(session:spawn({ "cat" }, { timeout = 30, stdin = true }))
    assert(p:write("abc"))
    assert(p:write("abc", 0), "a resend of the same bytes at the same offset")
    assert(p:write("abcdef", 0), "a resend that brings three new bytes")
    local ok, err = p:write("x", 100)
    assert.is_nil(ok)
    assert.equal("JOB_STDIN_GAP", err.reason, tostring(err))
    assert(p:write("!", 6))
    assert(p:close_stdin())
    assert.equal("abcdef!", (drain(p)))
  end)

  it("takes 64 MiB of input in bounded pieces, each byte once", function()
    local p = assert(session:spawn({ "wc", "-c" }, { timeout = 60, stdin = true }))
    local block = string.rep("z", 8 * 1024 * 1024)
    for _ = 1, 8 do assert(p:write(block)) end
    assert(p:close_stdin())
    assert.equal("67108864", (drain(p)):match("%d+"))
  end)

  it("delivers each byte once when a writer is killed mid-write and another process writes again from the same offset",
    function()
      assert(session:spawn({ "sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.02; done; exec wc -c" },
        { timeout = 60, stdin = true, id = "killed-writer" }))
      local size = 8 * 1024 * 1024
      -- A second process writes 8 MiB to a command that reads nothing yet: the agent takes its
      -- buffer's worth and the rest waits in the writer's socket, until it is killed.
      local script = string.format([[
        local sandkit = require "sandkit"
        local sb = assert(sandkit.sandbox{ provider = "local", root = %q })
        local s = assert(sb:get(%q))
        local p = assert(s:job("killed-writer"))
        assert(p:write(string.rep("k", %d), 0))
        os.exit(3)]], root, session.id, size)
      local writer = assert(core.spawn({ "sh", "-c", local_state.lua_env() .. " exec " .. LUA
        .. " -e " .. q(script) }))
      assert.is_true(within(20, function()
        for _, job in ipairs(assert(session:jobs())) do
          if job.id == "killed-writer" and job.stdin_offset > 0 then return true end
        end
      end), "the agent took some of the first writer's bytes")
      core.kill(writer, 9)
      core.reap(writer, true)
      -- The command reads from now on; the second writer's bytes up to what the agent took of
      -- the first one's are skipped.
      assert(session:exec({ "touch", "/tmp/go" }, { timeout = 10 }))
      local again = assert(session:job("killed-writer"))
      assert(again:write(string.rep("k", size), 0))
      assert(again:close_stdin())
      local out = drain(again)
      assert.equal(tostring(size), out:match("%d+"))
    end)

  it("runs on a terminal: a session leader whose controlling terminal it is, with TERM and the size asked",
    function()
      local p = assert(session:spawn({ "sh", "-c",
        'tty; stty size; echo "TERM=$TERM"; [ "$(ps -o sid= -p $$ | tr -d " ")" = "$$" ] && echo leader' },
        { timeout = 30, pty = { cols = 100, rows = 30 } }))
      local out, exit = drain(p)
      assert.equal(0, exit.code, out)
      assert.truthy(out:find("/dev/pts/", 1, true), out)
      assert.truthy(out:find("30 100\r\n", 1, true), out)
      assert.truthy(out:find("TERM=xterm-256color", 1, true), out)
      assert.truthy(out:find("leader", 1, true), out)
    end)

  it("follows a resize of its terminal, and echoes what is typed on it", function()
    local p = assert(session:spawn({ "sh", "-c", "read line; stty size; echo \"got $line\"" },
      { timeout = 30, pty = { cols = 80, rows = 24 } }))
    assert(p:resize(120, 40))
    assert(p:write("typed\r"))
    local out = drain(p)
    assert.truthy(out:find("typed", 1, true), "the terminal echoes: " .. out)
    assert.truthy(out:find("40 120", 1, true), out)
    assert.truthy(out:find("got typed", 1, true), out)
  end)

  it("streams its frames live, each as it happens, before the job ends", function()
    local p = assert(session:spawn({ "cat" }, { timeout = 30, stdin = true }))
    local frames = p:frames()
    assert(p:write("first\n"))
    local frame = frames()
    assert.equal("stdout", frame.type)
    assert.equal("first\n", frame.data)
    assert(p:write("second\n"))
    assert.equal("second\n", frames().data)
    assert(p:close_stdin())
    assert.equal("exit", frames().type)
    assert.is_nil(frames())
  end)

  it("streams from a cursor, to any process that reattaches", function()
    local p = assert(session:spawn({ "sh", "-c", "echo one; echo two; echo three" }, { timeout = 30 }))
    local all = {}
    for frame in p:frames() do all[#all + 1] = frame end
    local again = assert(session:job(p.id))
    local later = {}
    for frame in again:frames{ since = all[1].seq } do later[#later + 1] = frame end
    assert.equal(#all - 1, #later)
    assert.equal(all[2].seq, later[1].seq)
    assert.equal("exit", later[#later].type)
  end)

  it("ends on a signal sent by name to its process group, and says which", function()
    local p = assert(session:spawn({ "sh", "-c", "sleep 30 & wait" }, { timeout = 60 }))
    assert(p:signal("TERM"))
    local code, signal = p:wait()
    assert.equal(143, code)
    assert.equal(15, signal)
    local ok, err = p:signal("STOP")
    assert.is_nil(ok)
    assert.equal("INVALID_INPUT", err.code)
    ok, err = p:signal("INT")
    assert.is_nil(ok)
    assert.equal("JOB_ENDED", err.reason, tostring(err))
  end)

  it("lists its jobs: id, argv, running or ended with the exit, when it started, stdin and pty", function()
    local before = os.time()
    local running = assert(session:spawn({ "sleep", "30" }, { timeout = 60, id = "listed-running" }))
    local ended = assert(session:spawn({ "sh", "-c", "exit 7" },
      { timeout = 30, stdin = true, id = "listed-ended" }))
    assert.equal(7, assert(ended:wait()))
    local by_id = {}
    for _, job in ipairs(assert(session:jobs())) do by_id[job.id] = job end
    local r, e = by_id["listed-running"], by_id["listed-ended"]
    assert.same({ "sleep", "30" }, r.argv)
    assert.is_true(r.running)
    assert.is_false(r.stdin)
    assert.is_false(r.pty)
    assert.is_true(r.started_at >= before - 1 and r.started_at <= os.time() + 1)
    assert.is_false(e.running)
    assert.equal(7, e.code)
    assert.is_true(e.stdin)
    assert(running:cancel())
  end)

  it("refuses each bad input with a clear reason", function()
    local plain = assert(session:spawn({ "sleep", "30" }, { timeout = 60 }))
    local ok, err = plain:write("x")
    assert.is_nil(ok)
    assert.equal("JOB_STDIN_NONE", err.reason, tostring(err))
    ok, err = plain:resize(80, 24)
    assert.is_nil(ok)
    assert.equal("JOB_NOT_PTY", err.reason, tostring(err))
    assert(plain:cancel())

    local closed = assert(session:spawn({ "sleep", "30" }, { timeout = 60, stdin = true }))
    assert(closed:close_stdin())
    ok, err = closed:write("late")
    assert.is_nil(ok)
    assert.equal("JOB_STDIN_CLOSED", err.reason, tostring(err))
    assert(closed:cancel())

    local ended = assert(session:spawn({ "true" }, { timeout = 30, stdin = true }))
    assert(ended:wait())
    ok, err = ended:write("x")
    assert.is_nil(ok)
    assert.truthy(err.reason == "JOB_ENDED" or err.reason == "JOB_STDIN_CLOSED", tostring(err))

    for _, size in ipairs{ { 0, 24 }, { 80, 0 }, { 10001, 24 }, { 80, 10001 }, { 1.5, 24 } } do
      local p
      p, err = session:spawn({ "true" }, { timeout = 30, pty = { cols = size[1], rows = size[2] } })
      assert.is_nil(p)
      assert.equal("INVALID_INPUT", err.code)
    end
    local edge = assert(session:spawn({ "stty", "size" }, { timeout = 30, pty = { cols = 10000, rows = 1 } }))
    assert.truthy((drain(edge)):find("1 10000", 1, true))
  end)

  it("refuses a terminal size past the bound at the agent too", function()
    local conn = assert(session.conn)
    local p = assert(session:spawn({ "sleep", "30" }, { timeout = 60, pty = { cols = 80, rows = 24 } }))
    local ok, err = protocol_jobs.resize(conn, p.id, 10001, 24)
    assert.is_nil(ok)
    assert.equal("REQUEST_INVALID", err.reason)
    ok, err = protocol_jobs.resize(conn, p.id, 0, 24)
    assert.is_nil(ok)
    assert.equal("REQUEST_INVALID", err.reason)
    assert(p:cancel())
  end)

  it("gives input to run and exec as a string, a file handle or a function", function()
    local text = string.rep("line\n", 20000)
    local res = assert(session:exec({ "wc", "-c" }, { timeout = 30, stdin = text }))
    assert.equal(tostring(#text), res.stdout:match("%d+"))
    local path = files.temp_name()
    files.write(path, "from a file\n")
    local f = assert(io.open(path, "rb"))
    res = assert(session:exec({ "cat" }, { timeout = 30, stdin = f }))
    f:close()
    os.remove(path)
    assert.equal("from a file\n", res.stdout)
    local parts = { "a", "b", "c" }
    local i = 0
    local seen = {}
    for frame in session:run({ "cat" }, { timeout = 30, stdin = function()
      i = i + 1
      return parts[i]
    end }) do
      seen[#seen + 1] = frame.type == "exit" and "exit" or frame.data
    end
    assert.equal("abc", table.concat(seen, "", 1, #seen - 1))
    assert.equal("exit", seen[#seen])
  end)

  it("holds its agent's memory bounded while a reader stops reading a terminal job's output", function()
    local pids = agent_pids(root)
    assert.is_true(#pids >= 1, "the session's agent is found")
    local p = assert(session:spawn({ "sh", "-c", "head -c 64000000 /dev/zero | tr '\\0' x" },
      { timeout = 120, pty = { cols = 80, rows = 24 } }))
    -- A follower that reads nothing.
    local stalled = assert(protocol_jobs.stream(session.conn, p.id, nil, 120))
    local peak = 0
    assert.is_true(within(110, function()
      for _, pid in ipairs(pids) do peak = math.max(peak, rss_kib(pid) or 0) end
      for _, job in ipairs(assert(session:jobs())) do
        if job.id == p.id then return not job.running end
      end
    end), "the job ends")
    stalled:close()
    -- The job keeps its latest 4 MiB; the stalled reader 128 KiB; far below what went by.
    if not files.SANITIZED then assert.is_true(peak < 64 * 1024, "agent RSS peaked at " .. peak .. " KiB") end
    local page = assert(p:poll())
    local kept = 0
    for _, frame in ipairs(page.frames) do kept = kept + #frame.data end
    assert.is_true(kept <= 4 * 1024 * 1024, "kept " .. kept)
    assert.is_true(page.frames[1].seq > 0, "the oldest frames went")
  end)
end)

describe("an interactive job's input against a fake agent", function()
  local FEATURES = { "jobIdempotency", "jobStdin", "jobPty", "jobSignal", "jobStream", "jobList" }

  it("is sent again at the same offset when an answer is lost, and counts on what the agent has", function()
    local session, server = agent_session.open([[function(req, conn)
      local respond = require "support.respond"
      if req.path == "/v1/jobs/start" then return respond.json(conn, "200 OK", { jobId = "j1" }) end
      conn.state.writes = (conn.state.writes or 0) + 1
      -- The first write's answer is lost: the connection closes once its body was read.
      if conn.state.writes == 1 then return conn:close() end
      local offset = tonumber(req.query:match("offset=(%d+)"))
      respond.json(conn, "200 OK", { offset = offset + #req.body, closed = false })
    end]], nil, FEATURES)
    local p = assert(session:spawn({ "cat" }, { timeout = 10, stdin = true }))
    assert(p:write("hello"))
    assert(p:write("!"))
    local writes = server:requests_to("/v1/jobs/stdin")
    server:stop()
    assert.equal(3, #writes)
    assert.equal("jobId=j1&offset=0", writes[1].query)
    assert.equal("hello", writes[1].body)
    assert.equal("jobId=j1&offset=0", writes[2].query, "the resend names the same offset")
    assert.equal("jobId=j1&offset=5", writes[3].query)
  end)

  it("gives up after three sends whose answers were all lost, saying so", function()
    local session, server = agent_session.open([[function(req, conn)
      local respond = require "support.respond"
      if req.path == "/v1/jobs/start" then return respond.json(conn, "200 OK", { jobId = "j1" }) end
      return conn:close()
    end]], nil, FEATURES)
    local p = assert(session:spawn({ "cat" }, { timeout = 10, stdin = true }))
    local ok, err = p:write("x")
    local writes = server:requests_to("/v1/jobs/stdin")
    server:stop()
    assert.is_nil(ok)
    assert.equal("SANDBOX_UNREACHABLE", err.code, tostring(err))
    -- Three of sandkit's, and the transport's own resend of a pooled connection found closed.
    assert.is_true(#writes >= 3 and #writes <= 4, #writes .. " sends")
    for _, w in ipairs(writes) do assert.equal("jobId=j1&offset=0", w.query) end
  end)
end)

describe("an interactive job on an agent without the extensions", function()
  it("is refused before anything is sent", function()
    local session, server = agent_session.open([[function(req, conn, respond)
      respond(conn, 500, "unexpected " .. req.path)
    end]], nil, { "jobIdempotency" })
    local p, err = session:spawn({ "cat" }, { timeout = 10, stdin = true })
    assert.is_nil(p)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code, tostring(err))
    p, err = session:spawn({ "sh" }, { timeout = 10, pty = { cols = 80, rows = 24 } })
    assert.is_nil(p)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    local list
    list, err = session:jobs()
    assert.is_nil(list)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    server:stop()
  end)
end)
