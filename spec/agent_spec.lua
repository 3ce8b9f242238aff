-- Conformance of the real sandkit-agent binary (src/agent), driven over real sockets.
--
-- Covers docs/protocol.md §2, §3, §3.6, §5, §6 as the agent implements them: the conformance cases
-- every agent of this protocol answers in bearer mode (health and its version check, refusals
-- of missing, wrong and malformed credentials, streamed output with a real exit code, the
-- timeout frame, files, path refusals, mkdir, jobs polled across calls, exec creating no job,
-- unknown jobs, unauthorized job starts), then the job, output, process and confinement rules.
-- Not here because sandkit-agent does not have them: a `POST /` envelope for proxies that
-- cannot choose path or method, peer-based transport authorization, cloud lifecycle hooks, and
-- signed capability tokens — sandkit-agent checks a per-boot bearer token instead.
--
-- Every agent is started with --ready-fd on a pipe, so the spec learns its port from the line
-- the agent writes after binding; nothing waits by sleeping. Waits for a process to die are
-- bounded polls of /proc: the bound is the property under test.
--
-- SANDKIT_AGENT names the binary. Run: SANDKIT_AGENT=$PWD/build/agent/sandkit-agent
--   busted --lua=lua5.4 spec/agent_spec.lua

local files = require "support.files"
local raw = require "support.raw_http"
local agent_process = require "support.agent_process"
local cjson = require "cjson"
local socket = require "socket"

local shell_quote, read_file, write_file = files.shell_quote, files.read, files.write
local DEFAULT_PATH, run, tmpdir = agent_process.DEFAULT_PATH, agent_process.run, agent_process.tmpdir
local exists, is_dir, b64, unb64 = agent_process.exists, agent_process.is_dir, agent_process.b64,
  agent_process.unb64
local pid_alive, within, new_token = agent_process.pid_alive, agent_process.within,
  agent_process.new_token
local is_terminal, check_stream = agent_process.is_terminal, agent_process.check_stream
local start_agent, vm_rss_kb, wchar = agent_process.start_agent, agent_process.vm_rss_kb,
  agent_process.wchar
local frames_data = agent_process.frames_data

describe("sandkit-agent (bearer mode)", function()
  local A

  setup(function()
    A = assert(start_agent{ env = { SANDKIT_SECRET_PROBE = "must-not-leak" } })
  end)

  teardown(function()
    assert.are.equal(0, A:stop())
  end)

  describe("protocol conformance", function()
    it("health reports the protocol version, a boot id and readiness without a credential", function()
      local res, body = A:json("GET", "/v1/health", nil, false)
      assert.are.equal(200, res.status)
      assert.are.equal("application/json", res.headers["content-type"])
      assert.are.equal(1, body.protocolVersion)
      assert.are.equal(A.boot_id, body.bootId)
      assert.matches("^%x+%-%x+%-4%x+%-[89ab]%x+%-%x+$", body.bootId)
      assert.are.equal("ready", body.status)
      assert.are.same({ "binaryFrames", "jobIdempotency", "keepalive", "outputCap", "rawFiles", "fs", "fsTar",
        "fsWatch", "jobStdin", "jobPty", "jobSignal", "jobStream", "jobList" },
        body.features)
    end)

    it("a version mismatch is a typed 400 naming both versions", function()
      local res = A:req("GET", "/v1/health?version=2", nil, false)
      assert.are.equal(400, res.status)
      assert.matches("^text/plain", res.headers["content-type"])
      assert.matches("^PROTOCOL_VERSION_MISMATCH: ", res.body)
      assert.truthy(res.body:find("v2", 1, true))
      assert.truthy(res.body:find("v1", 1, true))
      assert.are.equal(200, A:req("GET", "/v1/health?version=1", nil, false).status)
    end)

    it("a request without a credential is refused with 401", function()
      local res = A:req("POST", "/v1/exec", { command = { "true" }, timeoutMs = 1000 }, false)
      assert.are.equal(401, res.status)
      assert.are.equal("a capability is required", res.body)
    end)

    it("wrong and malformed bearer tokens are refused alike with 403", function()
      local bad = {
        "Bearer " .. new_token(), "Bearer not-a-token", "Bearer a.b.c", "Bearer !!!!",
        "Bearer eyJhbGciOiJub25lIn0.", "Bearer ", "bearer " .. A.token, "Basic " .. A.token,
        "Bearer " .. A.token .. "x", "Bearer " .. A.token:sub(1, 43), A.token,
      }
      for _, value in ipairs(bad) do
        for _, r in ipairs({ { "GET", "/v1/files?path=x" }, { "POST", "/v1/mkdir" } }) do
          local res = A:req(r[1], r[2], r[1] == "POST" and { path = "/made" } or nil,
            { Authorization = value })
          assert.are.equal(403, res.status, value)
          assert.matches("^SANDBOX_CAPABILITY_REFUSED: Sandbox capability refused: ", res.body)
        end
      end
      assert.is_false(exists(A.root .. "/made"))
    end)

    it("a command streams its output as NDJSON and reports its real exit code", function()
      local res, frames = A:exec({ command = { "sh", "-c", "echo out; echo err 1>&2; exit 7" },
        timeoutMs = 10000 })
      assert.are.equal(200, res.status)
      assert.are.equal("application/x-ndjson", res.headers["content-type"])
      assert.truthy(res.headers["transfer-encoding"]:find("chunked"))
      local last, out, err = check_stream(frames)
      assert.are.same({ t = "exit", code = 7, truncated = false }, last)
      assert.are.equal("out\n", out)
      assert.are.equal("err\n", err)
    end)

    it("a command that overruns its timeout ends the stream with timeoutExceeded", function()
      local t0 = socket.gettime()
      local _, frames = A:exec({ command = { "sleep", "30" }, timeoutMs = 300 })
      local last = check_stream(frames)
      assert.are.equal("error", last.t)
      assert.are.equal("timeoutExceeded", last.code)
      assert.truthy(last.message:find("300", 1, true))
      local elapsed = socket.gettime() - t0
      assert.is_true(elapsed >= 0.3 and elapsed < 5, "ended after " .. elapsed .. " s")
    end)

    it("a file round-trips through the protocol and lands under the root", function()
      local contents = "print('hi')\n\0\255binary"
      local res = A:req("PUT", "/v1/files", { path = "/work/main.py", contentsBase64 = b64(contents) })
      assert.are.equal(204, res.status)
      local got, body = A:json("GET", "/v1/files?path=/work/main.py")
      assert.are.equal(200, got.status)
      assert.are.equal(b64(contents), body.contentsBase64)
      assert.are.equal(contents, read_file(A.root .. "/work/main.py"))
    end)

    it("path traversal is refused before anything happens", function()
      local res = A:req("GET", "/v1/files?path=/../../etc/passwd")
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: Path '/%.%./%.%./etc/passwd' refused: ", res.body)
      res = A:req("PUT", "/v1/files", { path = "../escaped.txt", contentsBase64 = b64("x") })
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      assert.is_false(exists(A.dir .. "/escaped.txt"))
      res = A:req("POST", "/v1/exec", { command = { "touch", "/tmp/never" }, timeoutMs = 1000,
        cwd = "/../.." })
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      res = A:req("POST", "/v1/exec", { command = { "touch", "ran-anyway" }, timeoutMs = 1000,
        workingDirectory = "/../.." })
      assert.are.equal(400, res.status)
      assert.is_false(exists(A.root .. "/ran-anyway"))
      assert.is_false(exists(A.dir .. "/ran-anyway"))
    end)

    it("mkdir creates a directory inside the root", function()
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/work/build" }).status)
      assert.is_true(is_dir(A.root .. "/work/build"))
    end)

    it("a job completes and its output is polled across calls", function()
      local res, body = A:start_job({ command = { "sh", "-c", "echo one; sleep 0.2; echo two" },
        timeoutMs = 10000 })
      assert.are.equal(200, res.status)
      assert.matches("^%x+%-%x+%-4%x+%-%x+%-%x+$", body.jobId)
      local page, frames = A:poll_until_done(body.jobId)
      assert.are.equal(0, page.exitCode)
      assert.are.equal(false, page.truncated)
      assert.is_nil(page.error)
      assert.are.equal("one\ntwo\n", frames_data(frames, "stdout"))
    end)

    it("a poll for an unknown job is a 404 JOB_NOT_FOUND", function()
      local res = A:req("POST", "/v1/jobs/poll", { jobId = "nonexistent" })
      assert.are.equal(404, res.status)
      assert.matches("^JOB_NOT_FOUND: ", res.body)
      res = A:req("POST", "/v1/jobs/cancel", { jobId = "nonexistent" })
      assert.are.equal(404, res.status)
      assert.matches("^JOB_NOT_FOUND: ", res.body)
    end)

    it("starting a job without a credential is refused and creates no job", function()
      local res = A:req("POST", "/v1/jobs/start", { command = { "touch", "job-ran" },
        timeoutMs = 1000, jobId = "refused-job" }, false)
      assert.are.equal(401, res.status)
      assert.are.equal(404, A:req("POST", "/v1/jobs/poll", { jobId = "refused-job" }).status)
      assert.is_false(exists(A.root .. "/job-ran"))
    end)
  end)

  describe("execution", function()
    it("does not inherit the agent's environment: PATH, HOME, USER, LOGNAME, LANG, PWD and the request's env",
      function()
      local _, frames = A:exec({ command = { "sh", "-c", "env | sort" }, timeoutMs = 5000,
        env = { K = "V", LANG = "C" } })
      local last, out = check_stream(frames)
      assert.are.equal(0, last.code)
      assert.is_nil(out:find("SANDKIT_SECRET_PROBE", 1, true))
      -- Unconfined, the root is the home: what tools keep there stays in the sandbox.
      local user = run("id -un"):gsub("\n$", "")
      assert.are.equal(table.concat({ "HOME=" .. A.root, "K=V", "LANG=C", "LOGNAME=" .. user,
        "PATH=" .. DEFAULT_PATH, "PWD=" .. A.root, "USER=" .. user, "" }, "\n"), out)
      _, frames = A:exec({ command = { "sh", "-c", "echo $PATH" }, timeoutMs = 5000,
        env = { PATH = "/usr/bin:/bin:/opt/x" } })
      local _, out2 = check_stream(frames)
      assert.are.equal("/usr/bin:/bin:/opt/x\n", out2)
    end)

    it("starts a command with no signal ignored, caught or blocked, whatever the agent ignores and catches",
      function()
      local function masks(status)
        return { status:match("\nSigBlk:%s*(%x+)"), status:match("\nSigIgn:%s*(%x+)"),
          status:match("\nSigCgt:%s*(%x+)") }
      end
      -- Signals 32 and 33 are the C library's own, which no program can set: a process
      -- started by posix_spawn (the agent here) has them ignored, and passes that on.
      local LIBC_OWN = 0x180000000
      -- The agent's own: SIGPIPE and SIGXFSZ ignored, SIGTERM and SIGINT caught.
      local agent = masks(read_file("/proc/" .. A.pid .. "/status"))
      assert.are_not.equal(0, tonumber(agent[2], 16) & ~LIBC_OWN)
      assert.are_not.equal(0, tonumber(agent[3], 16))
      for _ = 1, 3 do
        local _, frames = A:exec({ command = { "cat", "/proc/self/status" }, timeoutMs = 5000 })
        local last, out = check_stream(frames)
        assert.are.equal(0, last.code)
        local command = masks(out)
        assert.are.same({ 0, 0, 0 }, { tonumber(command[1], 16), tonumber(command[2], 16) & ~LIBC_OWN,
          tonumber(command[3], 16) })
      end
    end)

    it("accepts the older names deadlineMs and workingDirectory, the newer winning", function()
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/old" }).status)
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/new" }).status)
      local _, frames = A:exec({ command = { "pwd" }, deadlineMs = 5000, workingDirectory = "/old" })
      local last, out = check_stream(frames)
      assert.are.equal(0, last.code)
      assert.are.equal(A.root .. "/old\n", out)
      _, frames = A:exec({ command = { "pwd" }, timeoutMs = 5000, deadlineMs = 1,
        cwd = "/new", workingDirectory = "/old" })
      last, out = check_stream(frames)
      assert.are.equal("exit", last.t)
      assert.are.equal(A.root .. "/new\n", out)
    end)

    it("refuses an invalid request after the 200 with one requestInvalid frame", function()
      local bodies = {
        '{"command":["touch","inv1"],"timeoutMs":0}',
        '{"command":["touch","inv2"]}',
        '{"command":["touch","inv3"],"timeoutMs":1.5}',
        '{"command":["touch","inv4"],"timeoutMs":-1}',
        '{"command":[],"timeoutMs":1000}',
        '{"command":"touch inv5","timeoutMs":1000}',
        '{"timeoutMs":1000}',
        '{"command":["touch","inv6"],"timeoutMs":1000,"env":{"A=B":"x"}}',
        '{"command":["touch","inv7"],"timeoutMs":1000,"env":{"":"x"}}',
        '{"command":["touch","inv8"],"timeoutMs":1000,"env":{"A":"x\\u0000y"}}',
        '{"command":["touch","inv9"],"timeoutMs":1000,"env":{"A":1}}',
        '{"command":["touch","inv10\\u0000"],"timeoutMs":1000}',
      }
      for _, body in ipairs(bodies) do
        local res, frames = A:exec(body)
        assert.are.equal(200, res.status, body)
        assert.are.equal(1, #frames, body)
        assert.are.equal("error", frames[1].t, body)
        assert.are.equal("requestInvalid", frames[1].code, body)
      end
      local listing = run("ls -A " .. shell_quote(A.root))
      assert.is_nil(listing:find("inv", 1, true))
    end)

    it("answers a body that is not JSON with 400 REQUEST_INVALID", function()
      local res = A:req("POST", "/v1/exec", "{not json")
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: ", res.body)
    end)

    it("reports a missing program or working directory as spawnFailed", function()
      local _, frames = A:exec({ command = { "/nonexistent/program" }, timeoutMs = 5000 })
      local last = check_stream(frames)
      assert.are.equal("spawnFailed", last.code)
      _, frames = A:exec({ command = { "no-such-program-here" }, timeoutMs = 5000 })
      assert.are.equal("spawnFailed", check_stream(frames).code)
      _, frames = A:exec({ command = { "true" }, timeoutMs = 5000, cwd = "/does/not/exist" })
      assert.are.equal("spawnFailed", check_stream(frames).code)
    end)

    it("reports a signal death as 128 + signal with the signal's number", function()
      local _, frames = A:exec({ command = { "sh", "-c", "kill -9 $$" }, timeoutMs = 5000 })
      assert.are.same({ t = "exit", code = 137, signal = 9, truncated = false }, check_stream(frames))
    end)

    it("carries at most 64 KiB per frame and numbers frames from 0 across both streams", function()
      local _, frames = A:exec({ command = { "sh", "-c",
        "head -c 1000000 /dev/zero; echo e >&2; head -c 300000 /dev/zero" }, timeoutMs = 20000 })
      local last, out, err = check_stream(frames)
      assert.are.equal(0, last.code)
      assert.are.equal(false, last.truncated)
      assert.are.equal(1300000, #out)
      assert.are.equal("e\n", err)
      local expected = 0
      for _, f in ipairs(frames) do
        if f.t == "stdout" or f.t == "stderr" then
          assert.are.equal(expected, f.seq)
          expected = expected + 1
          assert.is_true(#unb64(f.data) <= 65536)
        end
      end
    end)

    it("kills what the command left in its group when it exits, and ends promptly", function()
      local t0 = socket.gettime()
      local _, frames = A:exec({ command = { "sh", "-c", "sleep 1000 & echo $!" }, timeoutMs = 60000 })
      local last, out = check_stream(frames)
      assert.are.equal(0, last.code)
      assert.is_true(socket.gettime() - t0 < 5)
      local pid = A:printed_pid(out)
      assert.is_true(within(5, function() return not pid_alive(pid) end))
    end)

    it("on timeout kills the command and what it forked, then says timeoutExceeded", function()
      local c = A:stream({ command = { "sh", "-c", "sleep 1000 & echo $!; wait" }, timeoutMs = 500 })
      local frames = {}
      while true do
        local line = assert(c:next_line())
        frames[#frames + 1] = cjson.decode(line)
        if is_terminal(frames[#frames]) then break end
      end
      assert.is_nil(c:next_line())
      c:close()
      local last, out = check_stream(frames)
      assert.are.equal("timeoutExceeded", last.code)
      local pid = A:printed_pid(out)
      assert.is_true(within(5, function() return not pid_alive(pid) end), "grandchild survived")
    end)

    it("kills a silent command when its caller closes the connection", function()
      local c = A:stream({ command = { "sh", "-c", "echo $$; exec sleep 1000" }, timeoutMs = 600000 })
      local f = cjson.decode((assert(c:next_line())))
      local pid = A:printed_pid(unb64(f.data))
      assert.is_true(pid_alive(pid))
      c:close()
      assert.is_true(within(5, function() return not pid_alive(pid) end))
    end)

    it("kills a command and its descendants when its caller resets the connection", function()
      local c = A:stream({ command = { "sh", "-c", "sleep 1000 & echo $!; wait" }, timeoutMs = 600000 })
      local f = cjson.decode((assert(c:next_line())))
      local pid = A:printed_pid(unb64(f.data))
      assert.is_true(pid_alive(pid))
      c:close(true)
      assert.is_true(within(5, function() return not pid_alive(pid) end))
    end)

    it("blocks a command whose reader stops reading, with the agent's memory flat", function()
      local before = vm_rss_kb(A.pid)
      local c = A:stream({ command = { "sh", "-c", "echo $$; exec yes 0123456789abcdef" },
        timeoutMs = 600000 })
      local first = cjson.decode((assert(c:next_line())))
      local pid = A:printed_pid(unb64(first.data))
      assert.truthy(pid)
      -- Stop reading. The writer must come to a halt: its write count stops growing.
      local last, stable = wchar(pid), 0
      local halted = within(20, function()
        socket.sleep(0.2)
        local now = wchar(pid)
        stable = (now == last) and stable + 1 or 0
        last = now
        return stable >= 3
      end)
      assert.is_true(halted, "the command kept writing to a reader that stopped")
      local state = read_file("/proc/" .. pid .. "/stat"):match("^%d+ %b() (%a)")
      assert.are.equal("S", state)
      local wchan = read_file("/proc/" .. pid .. "/wchan")
      if wchan and wchan ~= "" and wchan ~= "0" then -- hidden on some kernels
        assert.matches("pipe_write", wchan)
      end
      -- kernel socket and pipe buffers plus 16 frames: nowhere near what yes writes unblocked
      assert.is_true(last < 64 * 1024 * 1024, "wrote " .. last .. " bytes")
      local grown = vm_rss_kb(A.pid) - before
      assert.is_true(grown < 48 * 1024, "agent RSS grew by " .. grown .. " kB")
      c:close()
      assert.is_true(within(5, function() return not pid_alive(pid) end))
    end)

    it("creates no job for /v1/exec, so 16 jobs still fit afterwards", function()
      local B = assert(start_agent())
      finally(function() B:stop() end)
      local _, frames = B:exec({ command = { "true" }, timeoutMs = 5000 })
      assert.are.equal(0, check_stream(frames).code)
      for i = 1, 16 do
        local res = B:start_job({ command = { "sleep", "1000" }, timeoutMs = 600000 })
        assert.are.equal(200, res.status, "job " .. i)
      end
      local res = B:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000 })
      assert.are.equal(429, res.status)
      assert.are.equal(0, B:stop())
    end)
  end)

  describe("HTTP surface", function()
    it("answers 404 for an unknown path and 405 for a wrong method", function()
      local res = A:req("GET", "/nope")
      assert.are.equal(404, res.status)
      res = A:req("GET", "/v1/exec")
      assert.are.equal(405, res.status)
      assert.are.equal("POST", res.headers["allow"])
      res = A:req("DELETE", "/v1/files")
      assert.are.equal(405, res.status)
      assert.are.equal("GET, PUT", res.headers["allow"])
      assert.are.equal(405, A:req("POST", "/v1/health", "").status)
    end)

    it("takes a body of exactly the documented limit and refuses one byte more with 413", function()
      -- The limit is read from docs/agent.md, so the documentation and the agent cannot differ.
      local doc = read_file("docs/agent.md")
      local limit = tonumber((doc:match("| Request body | [^|]-%(([%d ]+) bytes%)"):gsub(" ", "")))
      assert.truthy(limit, "docs/agent.md names no request body limit")
      local function head_for(length)
        local c = assert(raw.connect(A.port))
        local h = A:auth()
        h["Content-Length"] = tostring(length)
        h["Expect"] = "100-continue"
        assert(c:request("PUT", "/v1/files", h))
        local status = c:read_head()
        c:close()
        return status
      end
      assert.are.equal(100, head_for(limit))
      assert.are.equal(413, head_for(limit + 1))
    end)

    it("errors are text/plain CODE: message", function()
      local res = A:req("GET", "/v1/files?path=/missing.txt")
      assert.are.equal(404, res.status)
      assert.matches("^text/plain", res.headers["content-type"])
      assert.are.equal("PATH_NOT_FOUND: No such file in the sandbox: /missing.txt", res.body)
    end)
  end)

  describe("files and paths", function()
    it("keeps absolute-looking paths inside the root", function()
      assert.are.equal(204, A:req("PUT", "/v1/files", { path = "/abs/x.txt", contentsBase64 = b64("in") }).status)
      assert.are.equal("in", read_file(A.root .. "/abs/x.txt"))
      for _, p in ipairs({ "abs/x.txt", "//abs/./x.txt", "/abs//x.txt" }) do
        local res, body = A:json("GET", "/v1/files?path=" .. p)
        assert.are.equal(200, res.status, p)
        assert.are.equal(b64("in"), body.contentsBase64)
      end
    end)

    it("refuses empty paths and .. components", function()
      local res = A:req("GET", "/v1/files?path=")
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      res = A:req("PUT", "/v1/files", { path = "", contentsBase64 = "" })
      assert.matches("^PATH_REFUSED: ", res.body)
      res = A:req("POST", "/v1/mkdir", { path = "" })
      assert.matches("^PATH_REFUSED: ", res.body)
      res = A:req("POST", "/v1/mkdir", { path = "/a/../b" })
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      assert.is_false(exists(A.root .. "/a"))
      assert.is_false(exists(A.root .. "/b"))
    end)

    it("refuses symlinks a command planted, to /etc and to a file outside the root", function()
      write_file(A.dir .. "/outside.txt", "outside")
      local _, frames = A:exec({ command = { "sh", "-c",
        "ln -s /etc etc_link && ln -s " .. A.dir .. "/outside.txt out_link" }, timeoutMs = 5000 })
      assert.are.equal(0, check_stream(frames).code)
      local probe = "sandkit-agent-spec-" .. tostring(math.random(1e9))
      local checks = {
        A:req("GET", "/v1/files?path=etc_link/passwd"),
        A:req("GET", "/v1/files?path=/etc_link/hostname"),
        A:req("GET", "/v1/files?path=out_link"),
        A:req("PUT", "/v1/files", { path = "etc_link/" .. probe, contentsBase64 = b64("x") }),
        A:req("PUT", "/v1/files", { path = "out_link", contentsBase64 = b64("overwritten") }),
        A:req("POST", "/v1/mkdir", { path = "etc_link/" .. probe }),
        A:req("POST", "/v1/exec", { command = { "touch", probe }, timeoutMs = 1000, cwd = "etc_link" }),
      }
      for i, res in ipairs(checks) do
        assert.are.equal(400, res.status, "check " .. i)
        assert.matches("^PATH_REFUSED: ", res.body)
      end
      assert.is_false(exists("/etc/" .. probe))
      assert.are.equal("outside", read_file(A.dir .. "/outside.txt"))
    end)

    it("refuses a symlink in an intermediate component even when it points inside", function()
      local _, frames = A:exec({ command = { "sh", "-c",
        "mkdir -p real && echo hi > real/f && ln -s real inner" }, timeoutMs = 5000 })
      assert.are.equal(0, check_stream(frames).code)
      assert.are.equal(200, A:req("GET", "/v1/files?path=real/f").status)
      local res = A:req("GET", "/v1/files?path=inner/f")
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      res = A:req("PUT", "/v1/files", { path = "inner/g", contentsBase64 = b64("x") })
      assert.matches("^PATH_REFUSED: ", res.body)
      assert.is_false(exists(A.root .. "/real/g"))
      res = A:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000, cwd = "/inner" })
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
    end)

    it("does not hang reading a FIFO a command planted, nor write into it", function()
      local _, frames = A:exec({ command = { "mkfifo", "fifo" }, timeoutMs = 5000 })
      assert.are.equal(0, check_stream(frames).code)
      local res = assert(raw.request(A.port, "GET", "/v1/files?path=fifo",
        { headers = A:auth(), timeout = 5 }))
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: .*not a regular file", res.body)
      res = A:req("PUT", "/v1/files", { path = "fifo", contentsBase64 = b64("x") })
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: ", res.body)
      assert.are.equal(400, A:req("GET", "/v1/files?path=/").status)
    end)

    it("creates parents, behaves like mkdir -p, and refuses a file in the way", function()
      assert.are.equal(204, A:req("PUT", "/v1/files", { path = "/p/q/r/file", contentsBase64 = "" }).status)
      assert.are.equal("", read_file(A.root .. "/p/q/r/file"))
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/m/n/o" }).status)
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/m/n/o" }).status)
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/" }).status)
      assert.is_true(is_dir(A.root .. "/m/n/o"))
      local res = A:req("POST", "/v1/mkdir", { path = "/p/q/r/file/sub" })
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: ", res.body)
      res = A:req("POST", "/v1/mkdir", { path = "/p/q/r/file" })
      assert.are.equal(400, res.status)
    end)

    it("refuses bad base64 and contents over 32 MiB in both directions", function()
      local res = A:req("PUT", "/v1/files", { path = "/b64", contentsBase64 = "aGk" })
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: Request invalid: contents are not valid base64", res.body)
      res = A:req("PUT", "/v1/files", { path = "/b64", contentsBase64 = "aGl=" })
      assert.are.equal(400, res.status)
      assert.is_false(exists(A.root .. "/b64"))
      local big = string.rep("A", 44739244) -- 33554433 bytes once decoded
      res = A:req("PUT", "/v1/files", '{"path":"/big","contentsBase64":"' .. big .. '"}')
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: .*33554432 byte transfer limit", res.body)
      assert.is_false(exists(A.root .. "/big"))
      assert(files.execute("truncate -s 33554433 " .. shell_quote(A.root .. "/sparse")))
      res = A:req("GET", "/v1/files?path=/sparse")
      assert.are.equal(400, res.status)
      assert.matches("33554432 byte transfer limit", res.body)
      assert(files.execute("truncate -s 33554432 " .. shell_quote(A.root .. "/sparse")))
      local ok, body = A:json("GET", "/v1/files?path=/sparse")
      assert.are.equal(200, ok.status)
      assert.are.equal(44739244, #body.contentsBase64)
    end)
  end)

  describe("refused requests", function()
    it("have no side effect, whether the credential is missing or wrong", function()
      for _, headers in ipairs({ false, { Authorization = "Bearer " .. new_token() } }) do
        local tag = headers and "403" or "401"
        local expect = headers and 403 or 401
        assert.are.equal(expect, A:req("PUT", "/v1/files",
          { path = "/side-" .. tag, contentsBase64 = b64("x") }, headers).status)
        assert.are.equal(expect, A:req("POST", "/v1/mkdir", { path = "/sidedir-" .. tag }, headers).status)
        assert.are.equal(expect, A:req("POST", "/v1/exec",
          { command = { "touch", "exec-" .. tag }, timeoutMs = 5000 }, headers).status)
        assert.are.equal(expect, A:req("POST", "/v1/jobs/start",
          { command = { "touch", "job-" .. tag }, timeoutMs = 5000, jobId = "side-" .. tag }, headers).status)
        assert.are.equal(expect, A:req("POST", "/v1/activate", "", headers).status)
      end
      -- A command that runs after the refused ones has seen nothing they would have made.
      local _, frames = A:exec({ command = { "ls", "-A" }, timeoutMs = 5000 })
      local _, out = check_stream(frames)
      for _, name in ipairs({ "side-401", "side-403", "sidedir-", "exec-", "job-" }) do
        assert.is_nil(out:find(name, 1, true), name)
      end
      assert.are.equal(404, A:req("POST", "/v1/jobs/poll", { jobId = "side-401" }).status)
      assert.are.equal(404, A:req("POST", "/v1/jobs/poll", { jobId = "side-403" }).status)
    end)
  end)

  describe("jobs", function()
    it("reconstructs the stream exactly once from overlapping and rewound cursors", function()
      local _, started = A:start_job({ command = { "sh", "-c",
        "echo a; sleep 0.05; echo b >&2; sleep 0.05; echo c; sleep 0.05; echo d >&2" },
        timeoutMs = 10000 })
      local _, frames = A:poll_until_done(started.jobId)
      assert.is_true(#frames >= 2)
      assert.are.equal("a\nc\n", frames_data(frames, "stdout"))
      assert.are.equal("b\nd\n", frames_data(frames, "stderr"))
      local _, all = A:poll(started.jobId)
      assert.are.same(frames, all.frames)
      for k = 1, #frames do
        local _, page = A:poll(started.jobId, frames[k].seq)
        local expected = {}
        for i = k + 1, #frames do expected[#expected + 1] = frames[i] end
        assert.are.same(expected, page.frames)
        assert.is_false(page.running)
      end
      -- a rewound window after a later one: merged by seq, every frame exactly once
      local seen, merged = {}, {}
      local windows = { frames[#frames - 1].seq, frames[1].seq, false } -- false: from the start
      for _, since in ipairs(windows) do
        local _, page = A:poll(started.jobId, since or nil)
        for _, f in ipairs(page.frames) do
          if not seen[f.seq] then
            seen[f.seq] = true
            merged[#merged + 1] = f
          end
        end
      end
      table.sort(merged, function(x, y) return x.seq < y.seq end)
      assert.are.same(frames, merged)
      local _, beyond = A:poll(started.jobId, frames[#frames].seq + 1000)
      assert.are.same({}, beyond.frames)
      assert.are.equal(0, beyond.exitCode)
    end)

    it("answers a retried poll with the same frames", function()
      local _, started = A:start_job({ command = { "sh", "-c", "echo x; echo y >&2" }, timeoutMs = 10000 })
      A:poll_until_done(started.jobId)
      local body = string.format('{"jobId":"%s","sinceSeq":0}', started.jobId)
      local first = A:req("POST", "/v1/jobs/poll", body)
      local second = A:req("POST", "/v1/jobs/poll", body)
      assert.are.equal(200, first.status)
      assert.are.equal(first.body, second.body)
    end)

    it("keeps a job running after the connection that started it is gone", function()
      local _, started = A:start_job({ command = { "sh", "-c", "sleep 0.3; echo done" }, timeoutMs = 10000 })
      local page, frames = A:poll_until_done(started.jobId)
      assert.are.equal(0, page.exitCode)
      assert.are.equal("done\n", frames_data(frames, "stdout"))
    end)

    it("cancel kills forked grandchildren, records cancelled, and a second cancel changes nothing", function()
      local _, started = A:start_job({ command = { "sh", "-c", "sleep 1000 & echo $!; wait" },
        timeoutMs = 600000 })
      local pid
      assert.is_true(within(10, function()
        local _, page = A:poll(started.jobId)
        pid = page.frames[1] and A:printed_pid(unb64(page.frames[1].data))
        return pid ~= nil
      end))
      assert.is_true(pid_alive(pid))
      local res, body = A:json("POST", "/v1/jobs/cancel", { jobId = started.jobId })
      assert.are.equal(200, res.status)
      assert.are.same({}, body)
      assert.is_true(within(5, function() return not pid_alive(pid) end))
      local _, page = A:poll(started.jobId)
      assert.is_false(page.running)
      assert.are.equal("cancelled", page.error.code)
      assert.are.equal(200, A:req("POST", "/v1/jobs/cancel", { jobId = started.jobId }).status)
      local _, again = A:poll(started.jobId)
      assert.are.same(page, again)
    end)

    it("cancelling a finished job answers 200 and keeps its first outcome", function()
      local _, started = A:start_job({ command = { "sh", "-c", "exit 3" }, timeoutMs = 10000 })
      local page = A:poll_until_done(started.jobId)
      assert.are.equal(3, page.exitCode)
      assert.are.equal(200, A:req("POST", "/v1/jobs/cancel", { jobId = started.jobId }).status)
      local _, after = A:poll(started.jobId)
      assert.are.equal(3, after.exitCode)
      assert.is_nil(after.error)
    end)

    it("reports a job's timeout and spawn failure as its ending", function()
      local _, started = A:start_job({ command = { "sleep", "1000" }, timeoutMs = 300 })
      assert.are.equal("timeoutExceeded", A:poll_until_done(started.jobId).error.code)
      _, started = A:start_job({ command = { "/no/such/program" }, timeoutMs = 1000 })
      assert.are.equal("spawnFailed", A:poll_until_done(started.jobId).error.code)
      local res
      res, started = A:start_job({ command = { "sh", "-c", "kill -9 $$" }, timeoutMs = 5000 })
      assert.are.equal(200, res.status)
      local page = A:poll_until_done(started.jobId)
      assert.are.equal(137, page.exitCode)
      assert.are.equal(9, page.signal)
    end)

    it("refuses an invalid start with a status", function()
      local res = A:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 0 })
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: ", res.body)
      res = A:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000, jobId = "has space" })
      assert.are.equal(400, res.status)
      res = A:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000, jobId = string.rep("a", 65) })
      assert.are.equal(400, res.status)
      res = A:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000, cwd = "/../x" })
      assert.are.equal(400, res.status)
      assert.matches("^PATH_REFUSED: ", res.body)
      res = A:req("POST", "/v1/jobs/poll", { sinceSeq = 1 })
      assert.are.equal(400, res.status)
    end)
  end)
end)

describe("sandkit-agent job registry", function()
  local B

  before_each(function()
    B = assert(start_agent())
  end)

  after_each(function()
    assert.are.equal(0, B:stop())
  end)

  local function start(id, argv)
    return B:start_job({ command = argv or { "sleep", "1000" }, timeoutMs = 600000, jobId = id })
  end

  it("evicts the oldest finished job whose ending a poll returned", function()
    for i = 1, 16 do
      assert.are.equal(200, start("j" .. i, { "true" }).status)
    end
    for i = 1, 16 do B:poll_until_done("j" .. i) end
    assert.are.equal(200, start("j17", { "true" }).status)
    assert.are.equal(404, B:poll("j1").status)
    assert.are.equal(200, B:poll("j2").status)
    assert.are.equal(200, start("j18", { "true" }).status)
    assert.are.equal(404, B:poll("j2").status)
    assert.are.equal(200, B:poll("j3").status)
  end)

  it("never evicts a finished job whose ending no poll has returned", function()
    assert.are.equal(200, start("unread").status)
    assert.are.equal(200, B:req("POST", "/v1/jobs/cancel", { jobId = "unread" }).status)
    for i = 2, 16 do assert.are.equal(200, start("r" .. i).status) end
    local res = B:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000 })
    assert.are.equal(429, res.status)
    assert.matches("^JOB_LIMIT_REACHED: ", res.body)
    local _, page = B:poll("unread")
    assert.are.equal("cancelled", page.error.code)
    assert.are.equal(200, B:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000 }).status)
    assert.are.equal(404, B:poll("unread").status)
  end)

  it("refuses with JOB_LIMIT_REACHED when every slot runs, and an invalid start holds no slot", function()
    for i = 1, 15 do assert.are.equal(200, start("s" .. i).status) end
    assert.are.equal(400, B:req("POST", "/v1/jobs/start", { command = {}, timeoutMs = 1000 }).status)
    assert.are.equal(400, B:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000,
      cwd = "/../.." }).status)
    assert.are.equal(200, start("s16").status)
    local res = B:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000 })
    assert.are.equal(429, res.status)
    assert.matches("^JOB_LIMIT_REACHED: ", res.body)
    assert.are.equal(400, B:req("POST", "/v1/jobs/start", '{"command":[],"timeoutMs":1}').status)
    assert.are.equal(200, start("s1").status) -- an existing id still answers when full
  end)

  it("runs a job once when its start is sent twice with the same jobId", function()
    local argv = { "sh", "-c", "echo ran >> count.txt; while [ ! -e go ]; do sleep 0.01; done" }
    local r1, b1 = start("build-42", argv)
    local r2, b2 = start("build-42", argv)
    assert.are.equal(200, r1.status)
    assert.are.equal(200, r2.status)
    assert.are.equal("build-42", b1.jobId)
    assert.are.equal("build-42", b2.jobId)
    -- the registry holds one job: 15 more fit, the 16th does not
    for i = 1, 15 do assert.are.equal(200, start("o" .. i).status) end
    assert.are.equal(429, start("o16").status)
    write_file(B.root .. "/go", "")
    assert.are.equal(0, B:poll_until_done("build-42").exitCode)
    assert.are.equal("ran\n", read_file(B.root .. "/count.txt"))
    local _, b3 = start("build-42", argv)
    assert.are.equal("build-42", b3.jobId)
  end)

  it("refuses a start naming a known job with another request, and starts nothing for it", function()
    local first = { command = { "touch", "first" }, timeoutMs = 5000, jobId = "build-7" }
    assert.are.equal(200, B:start_job(first).status)
    B:poll_until_done("build-7")
    local others = {
      { command = { "touch", "second" } },
      { cwd = "sub" },
      { env = { X = "1" } },
      { timeoutMs = 6000 },
    }
    assert(files.execute("mkdir " .. files.shell_quote(B.root .. "/sub")))
    for i, change in ipairs(others) do
      local body = {}
      for k, v in pairs(first) do body[k] = v end
      for k, v in pairs(change) do body[k] = v end
      local res = B:req("POST", "/v1/jobs/start", body)
      assert.are.equal(409, res.status, "change " .. i)
      assert.matches("^JOB_ID_CONFLICT: ", res.body)
    end
    assert.is_false(exists(B.root .. "/second"))
    -- the same request, however it spells what it means, still names the job
    for _, same in ipairs({ {}, { cwd = "/" }, { cwd = "." }, { env = {} } }) do
      local body = {}
      for k, v in pairs(first) do body[k] = v end
      for k, v in pairs(same) do body[k] = v end
      local res, started = B:json("POST", "/v1/jobs/start", body)
      assert.are.equal(200, res.status, res.body)
      assert.are.equal("build-7", started.jobId)
    end
    local res, started = B:json("POST", "/v1/jobs/start",
      '{"command":["touch","first"],"deadlineMs":5000,"workingDirectory":"/","jobId":"build-7"}')
    assert.are.equal(200, res.status, res.body)
    assert.are.equal("build-7", started.jobId)
  end)
end)

describe("sandkit-agent output cap", function()
  local C

  setup(function()
    C = assert(start_agent{ args = { "--output-cap", "100000" } })
  end)

  teardown(function()
    assert.are.equal(0, C:stop())
  end)

  it("keeps the head of each stream, counts dropped output in seq, and says truncated", function()
    local _, frames = C:exec({ command = { "sh", "-c", "head -c 1000000 /dev/zero; echo done >&2" },
      timeoutMs = 20000 })
    local last, out, err = check_stream(frames)
    assert.are.equal("exit", last.t)
    assert.are.equal(0, last.code)
    assert.is_true(last.truncated)
    assert.are.equal(100000, #out)
    assert.are.equal("done\n", err)
    local prev, gap = -1, false
    for _, f in ipairs(frames) do
      if f.seq then
        assert.is_true(f.seq > prev)
        if f.seq ~= prev + 1 then gap = true end
        prev = f.seq
      end
    end
    assert.is_true(gap, "no gap in seq although output was dropped")
  end)

  it("truncates a job's output the same way and reports it in the poll", function()
    local _, started = C:start_job({ command = { "sh", "-c", "head -c 1000000 /dev/zero" }, timeoutMs = 20000 })
    local page, frames = C:poll_until_done(started.jobId)
    assert.are.equal(0, page.exitCode)
    assert.is_true(page.truncated)
    local kept = #frames_data(frames, "stdout")
    assert.is_true(kept > 0 and kept <= 100000, "kept " .. kept)
  end)
end)

describe("sandkit-agent activation", function()
  local D

  setup(function()
    D = assert(start_agent{ args = { "--require-activation" } })
  end)

  teardown(function()
    assert.are.equal(0, D:stop())
  end)

  it("serves nothing but health and activate until activated, then is ready", function()
    local _, health = D:json("GET", "/v1/health", nil, false)
    assert.are.equal("awaiting-network-verification", health.status)
    local res = D:req("POST", "/v1/exec", { command = { "touch", "early" }, timeoutMs = 1000 })
    assert.are.equal(503, res.status)
    assert.matches("^AGENT_NOT_ACTIVATED: ", res.body)
    res = D:req("PUT", "/v1/files", { path = "/early-file", contentsBase64 = b64("x") })
    assert.are.equal(503, res.status)
    assert.are.equal(503, D:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 1000 }).status)
    assert.are.equal(401, D:req("POST", "/v1/activate", "", false).status)
    assert.are.equal(403, D:req("POST", "/v1/activate", "", { Authorization = "Bearer " .. new_token() }).status)
    _, health = D:json("GET", "/v1/health", nil, false)
    assert.are.equal("awaiting-network-verification", health.status)
    assert.is_false(exists(D.root .. "/early"))
    assert.is_false(exists(D.root .. "/early-file"))

    assert.are.equal(204, D:req("POST", "/v1/activate", "").status)
    _, health = D:json("GET", "/v1/health", nil, false)
    assert.are.equal("ready", health.status)
    assert.are.equal(204, D:req("POST", "/v1/activate", "").status)
    local _, frames = D:exec({ command = { "true" }, timeoutMs = 5000 })
    assert.are.equal(0, check_stream(frames).code)
  end)
end)

describe("sandkit-agent start-up and shutdown", function()
  it("tells each start apart with a fresh boot id", function()
    local a, b = assert(start_agent()), assert(start_agent())
    finally(function() a:stop(); b:stop() end)
    assert.are_not.equal(a.boot_id, b.boot_id)
    assert.are.equal(0, a:stop())
    assert.are.equal(0, b:stop())
  end)

  it("listens on a Unix socket of mode 0600 with --listen unix:PATH, reports port 0 and removes it at exit",
    function()
    local path = tmpdir() .. "/agent.sock"
    local a = assert(start_agent{ args = { "--listen", "unix:" .. path } })
    finally(function() a:stop() end)
    assert.equal(0, a.port)
    assert.equal("socket 600\n", run("stat -c '%F %a' " .. shell_quote(path)))
    local function get(route, token)
      -- curl without the sanitizer runtime check-asan preloads (files.SANITIZER_ENV).
      return run("env -u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS curl -s -w ' %{http_code}' --unix-socket "
        .. shell_quote(path)
        .. (token and (" -H " .. shell_quote("Authorization: Bearer " .. token)) or "")
        .. " " .. shell_quote("http://127.0.0.1" .. route))
    end
    local body, status = get("/v1/health?version=1"):match("^(.*) (%d+)$")
    assert.equal("200", status)
    assert.equal(a.boot_id, cjson.decode(body).bootId)
    assert.matches(" 200$", get("/v1/jobs/list", a.token))
    assert.matches(" 401$", get("/v1/jobs/list"))
    assert.truthy(read_file(a.log):find("on unix:" .. path, 1, true), "the log names the socket")
    assert.equal(0, a:stop())
    assert.is_false(exists(path), "the socket outlived the agent")
  end)

  it("refuses a --listen unix: path that is relative, too long to bind, or taken", function()
    local dir = tmpdir()
    local taken = dir .. "/taken"
    write_file(taken, "")
    for path, said in pairs{ ["relative.sock"] = "takes an absolute path of at most 107 bytes",
        ["/" .. string.rep("s", 107)] = "takes an absolute path of at most 107 bytes",
        [taken] = "cannot listen on unix:" .. taken .. ": Address already in use" } do
      local a, log, status = start_agent{ args = { "--listen", "unix:" .. path } }
      if a then a:stop() end
      assert.is_nil(a, path)
      assert.are_not.equal(0, status)
      assert.truthy(log:find(said, 1, true), log)
    end
    assert.equal("", read_file(taken), "the file in the way was left as it was")
  end)

  it("serves without a credential in --no-auth mode", function()
    local N = assert(start_agent{ no_token = true, args = { "--no-auth" } })
    finally(function() N:stop() end)
    local _, frames = N:exec({ command = { "echo", "hi" }, timeoutMs = 5000 }, false)
    local last, out = check_stream(frames)
    assert.are.equal(0, last.code)
    assert.are.equal("hi\n", out)
    assert.are.equal(0, N:stop())
  end)

  it("refuses to start without exactly one way to authorize, or with a bad token file", function()
    local a, log = start_agent{ no_token = true }
    assert.is_nil(a)
    assert.truthy(log:find("one of --token-file and --no-auth is required", 1, true))
    a, log = start_agent{ args = { "--no-auth" } }
    assert.is_nil(a)
    assert.truthy(log:find("exclude each other", 1, true))
    local dir = tmpdir()
    write_file(dir .. "/short", "c2hvcnQ=\n")
    a, log = start_agent{ no_token = true, args = { "--token-file", dir .. "/short" } }
    assert.is_nil(a)
    assert.truthy(log:find("44 characters", 1, true))
    a, log = start_agent{ args = { "--root", dir .. "/missing" } }
    assert.is_nil(a)
    assert.truthy(log:find("cannot be used", 1, true))
    os.execute("rm -rf " .. shell_quote(dir))
  end)

  it("refuses an output cap of 0, which an exec's outputCap takes to mean no cap", function()
    local a, log, status = start_agent{ args = { "--output-cap", "0" } }
    assert.is_nil(a)
    assert.equal(2, status)
    assert.truthy(log:find("--output-cap must be at least 1 byte", 1, true), log)
    a = assert(start_agent{ args = { "--output-cap", "1" } })
    a:stop()
  end)

  it("takes a body timeout within the documented range, from a flag or the environment", function()
    local doc = read_file("docs/agent.md")
    local low, high = doc:match("| `%-%-body%-timeout MS` |[^\n]-from (%d+) to (%d+)%.")
    assert.truthy(low, "docs/agent.md names no range for --body-timeout")
    -- An agent that starts when it should not is stopped before the spec fails.
    local function refusal(opts)
      local a, log, status = start_agent(opts)
      if a then a:stop() end
      assert.is_nil(a, "the agent started")
      assert.equal(2, status)
      return log
    end
    local log = refusal{ args = { "--body-timeout", tostring(low - 1) } }
    assert.truthy(log:find("--body-timeout must be at least " .. low .. " ms", 1, true), log)
    log = refusal{ env = { SANDKIT_AGENT_BODY_TIMEOUT = tostring(high + 1) } }
    assert.truthy(log:find("--body-timeout must be a whole number of at most " .. high, 1, true), log)
    assert(start_agent{ args = { "--body-timeout", low } }):stop()
    assert(start_agent{ env = { SANDKIT_AGENT_BODY_TIMEOUT = high } }):stop()
  end)

  it("takes a stall timeout within the documented range, as it takes the body's", function()
    local doc = read_file("docs/agent.md")
    local low, high = doc:match("| `%-%-stall%-timeout MS` |[^\n]-from (%d+) to (%d+)%.")
    assert.truthy(low, "docs/agent.md names no range for --stall-timeout")
    local a, log, status = start_agent{ args = { "--stall-timeout", tostring(low - 1) } }
    if a then a:stop() end
    assert.equal(2, status)
    assert.truthy(log:find("--stall-timeout must be at least " .. low .. " ms", 1, true), log)
    a, log, status = start_agent{ env = { SANDKIT_AGENT_STALL_TIMEOUT = tostring(high + 1) } }
    if a then a:stop() end
    assert.equal(2, status)
    assert.truthy(log:find("--stall-timeout must be a whole number of at most " .. high, 1, true), log)
    assert(start_agent{ env = { SANDKIT_AGENT_STALL_TIMEOUT = high } }):stop()
  end)

  it("reads a number an option takes in decimal digits only", function()
    for _, text in ipairs({ "0x10", "1e3", "+16", " 16", "16 ", "16.0", "-1", "" }) do
      for _, opts in ipairs({ { args = { "--output-cap", text } }, { env = { SANDKIT_AGENT_OUTPUT_CAP = text } },
          { args = { "--max-connections", text } }, { args = { "--listen", "127.0.0.1:" .. text } } }) do
        local a, log, status = start_agent(opts)
        if a then a:stop() end
        assert.is_nil(a, "the agent took '" .. text .. "'")
        assert.equal(2, status)
        assert.truthy(log:find("must be a whole number", 1, true), log)
      end
    end
    assert(start_agent{ args = { "--output-cap", "0016" } }):stop()
  end)

  it("refuses a token file that is a FIFO, a directory or a device before it can block on it", function()
    local dir = tmpdir()
    assert(files.execute("mkfifo " .. shell_quote(dir .. "/fifo")))
    for path, kind in pairs({ [dir .. "/fifo"] = "a FIFO", [dir] = "a directory",
        ["/dev/zero"] = "a character device" }) do
      -- an agent that blocks in the open is killed by the bound instead of hanging the spec
      local a, log, status = start_agent{ no_token = true, prefix = "timeout -s KILL 10",
        args = { "--token-file", path } }
      if a then a:stop() end
      assert.is_nil(a)
      assert.equal(2, status, log)
      assert.truthy(log:find("cannot open the token file " .. path .. ": it is " .. kind, 1, true), log)
    end
    os.execute("rm -rf " .. shell_quote(dir))
  end)

  it("prints in --help the defaults and bounds docs/agent.md gives", function()
    local help = run(shell_quote(agent_process.AGENT) .. " --help")
    local doc = read_file("docs/agent.md")
    for _, flag in ipairs({ "output-cap", "max-connections", "header-timeout", "body-timeout", "stall-timeout" }) do
      local row = doc:match("| `%-%-" .. flag:gsub("%-", "%%-") .. " [^\n]*")
      assert.truthy(row, flag)
      local default = row:match("Default (%d+)")
      assert.truthy(default, flag)
      local entry = (help:match("%-%-" .. flag:gsub("%-", "%%-") .. " .-\n  %-%-") or ""):gsub("%s+", " ")
      assert.truthy(entry:find("default " .. default, 1, true), flag .. ": " .. entry)
      local low, high = row:match("from (%d+) to (%d+)")
      if low then
        assert.truthy(entry:find("from " .. low, 1, true), flag .. ": " .. entry)
        assert.truthy(entry:find(high, 1, true), flag .. ": " .. entry)
      end
    end
  end)

  it("kills every running command's group on SIGTERM and exits 0", function()
    local S = assert(start_agent())
    finally(function() S:stop() end)
    local c = S:stream({ command = { "sh", "-c", "sleep 1000 & echo $!; wait" }, timeoutMs = 600000 })
    local f = cjson.decode((assert(c:next_line())))
    local streamed = S:printed_pid(unb64(f.data))
    assert.is_true(pid_alive(streamed))
    local _, started = S:start_job({ command = { "sh", "-c", "sleep 1000 & echo $!; wait" }, timeoutMs = 600000 })
    local job_pid
    assert.is_true(within(10, function()
      local _, page = S:poll(started.jobId)
      job_pid = page.frames[1] and S:printed_pid(unb64(page.frames[1].data))
      return job_pid ~= nil
    end))
    assert.are.equal(0, S:stop())
    c:close()
    assert.is_true(within(5, function() return not pid_alive(streamed) and not pid_alive(job_pid) end))
  end)

  it("writes the ready line atomically to --ready-file", function()
    local dir = tmpdir()
    local R = assert(start_agent{ args = { "--ready-file", dir .. "/ready.json" } })
    finally(function() R:stop() end)
    local ready = cjson.decode(read_file(dir .. "/ready.json"))
    assert.are.same({ port = R.port, pid = R.pid, bootId = R.boot_id }, ready)
    assert.are.equal(0, R:stop())
    os.execute("rm -rf " .. shell_quote(dir))
  end)
end)
