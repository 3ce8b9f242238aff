-- sandkit inside a real nginx worker (worker_processes 1): local sessions made and used from
-- request handlers (support/nginx_app), never blocking the worker — pings answered while 64
-- streams run, concurrent commands overlapping, sandkit.run on light threads — and streams that
-- end with their request: a client that goes away, a handler that leaves its loop, a slow
-- client holding the command back. Timing bounds here are the behaviour itself.

local cjson = require "cjson"
local core = require "sandkit.core"
local socket = require "socket"
local files = require "support.files"
local local_state = require "support.local_state"
local nginx = require "support.nginx"
local processes = require "support.processes"
local agent_process = require "support.agent_process"
local fs_roundtrip = require "support.fs_roundtrip"
local raw_http = require "support.raw_http"

local LOCATIONS = [[
    location = /ping { content_by_lua_block { ngx.say("pong") } }
    location = /create { content_by_lua_block { require("support.nginx_app").create() } }
    location = /stream { content_by_lua_block { require("support.nginx_app").stream() } }
    location = /exec { content_by_lua_block { require("support.nginx_app").exec() } }
    location = /busy { content_by_lua_block { require("support.nginx_app").busy_stream() } }
    location = /fanout { content_by_lua_block { require("support.nginx_app").fanout() } }
    location = /files { content_by_lua_block { require("support.nginx_app").files() } }
    location = /interactive { content_by_lua_block { require("support.nginx_app").interactive() } }
    location = /thread_fanout { content_by_lua_block { require("support.nginx_app").thread_fanout() } }
    location = /leave { content_by_lua_block { require("support.nginx_app").leave_early() } }
    location = /timer { content_by_lua_block { require("support.nginx_app").in_timer() } }
    location = /phase {
      set_by_lua_block $refusal { return require("support.nginx_app").phase_refusal() }
      return 200 $refusal;
    }
]]

local within, alive = processes.within, processes.alive

--- The nearest-rank percentile p (0..1) of a list of numbers.
local function percentile(list, p)
  local sorted = {}
  for i, v in ipairs(list) do sorted[i] = v end
  table.sort(sorted)
  return sorted[math.max(1, math.ceil(p * #sorted))]
end

--- Frames of an NDJSON body as sandkit.ngx writes them, stdout payloads decoded.
local function ndjson_frames(body)
  local frames = {}
  for line in body:gmatch("([^\n]+)\n") do
    local f = cjson.decode(line)
    if f.data then f.data = core.b64decode(f.data) end
    frames[#frames + 1] = f
  end
  return frames
end

describe("sandkit inside an nginx worker", function()
  local gateway, root, session_id, files_dir
  --- The names the session's folder held once made, and the clients a case started.
  local made_with, clients = {}, {}

  local function query(extra)
    return "?root=" .. root .. "&session=" .. tostring(session_id) .. (extra or "")
  end

  local function post(path, value, extra)
    return assert(raw_http.request(gateway.port, "POST", path .. query(extra),
      { body = cjson.encode(value), timeout = 60 }))
  end

  --- A curl of ours, ended after the case if it is still running then.
  local function client(argv)
    local pid = assert(core.spawn(argv, { setsid = true, env = processes.env() }))
    clients[#clients + 1] = pid
    return pid
  end

  local function curl(path, value, out, extra)
    return client({ "curl", "-sN", "-o", out, "-X", "POST", "--data-binary", cjson.encode(value),
      gateway.url .. path .. query(extra) })
  end

  --- nginx with a local session made through it, which the cases use.
  local function start_gateway()
    root = local_state.new()
    -- Loading sandkit in the master, before the workers fork, is allowed: it waits for nothing.
    gateway = nginx.start{ server = LOCATIONS,
      http = "  lua_check_client_abort on;\n  init_by_lua_block { require 'sandkit' }" }
    -- Past the output cap an agent drops output instead of holding the command back; with a
    -- cap above what any command here writes, every byte is delivered.
    local answer = post("/create", {}, "&output_cap=1073741824")
    assert.equal(200, answer.status, answer.body .. gateway:error_log())
    session_id = cjson.decode(answer.body).id
    files_dir = root .. "/sessions/" .. session_id .. "/files"
    made_with = {}
    for _, name in ipairs(core.listdir(files_dir)) do made_with[name] = true end
  end

  local function stop_gateway()
    if gateway then gateway:stop() end
    gateway = nil
    if root then local_state.clean(root) end
    root = nil
  end

  -- One nginx and one session serve every case: starting nginx and making a confined session
  -- took more CPU than most cases, and the cases need neither fresh but the one that measures
  -- the worker's peak memory, which starts its own. After each case the clients it left running
  -- are ended and the files it wrote in the session removed, so that the next one finds the
  -- session as it was made (the ring's marker files, say, would otherwise let the next ring
  -- pass without its commands ever waiting on each other).
  setup(start_gateway)
  teardown(stop_gateway)

  after_each(function()
    if os.getenv("DEBUG_NGINX") and gateway then io.stderr:write(gateway:error_log()) end
    for _, pid in ipairs(clients) do
      -- Not reaped yet is still ours: a pid the case reaped may be another process's by now.
      if not core.reap(pid) then
        core.kill(pid, core.SIGKILL)
        core.reap(pid, true)
      end
    end
    clients = {}
    if files_dir then
      for _, name in ipairs(core.listdir(files_dir) or {}) do
        if not made_with[name] then core.remove_tree(files_dir .. "/" .. name) end
      end
    end
  end)

  it("creates a local session and streams a command's frames, exit status last", function()
    local answer = post("/stream", { "sh", "-c", "echo one; echo two >&2; exit 3" })
    assert.equal(200, answer.status)
    assert.equal("application/x-ndjson", answer.headers["content-type"])
    local frames = ndjson_frames(answer.body)
    assert.same({ t = "stdout", seq = 0, data = "one\n" }, frames[1])
    assert.same({ t = "stderr", seq = 1, data = "two\n" }, frames[2])
    assert.same({ t = "exit", code = 3, truncated = false }, frames[3])
  end)

  it("makes a session whose agent listens on 127.0.0.1, which reads faster into the worker than a Unix socket",
    function()
    local text = files.read(root .. "/sessions/" .. session_id .. "/record.json")
    assert.is_string(text)
    local record = cjson.decode(text)
    assert.is_number(record.port)
    assert.is_nil(record.socket)
    assert.is_nil(files.read(root .. "/sessions/" .. session_id .. "/agent.sock"))
  end)

  it("uses a session's files over cosockets: a tree in and out, listed, stated, renamed, removed, watched", function()
    local src = fs_roundtrip.tree()
    finally(function() core.remove_tree(src) end)
    local answer = post("/files", { src = src })
    assert.equal(200, answer.status, answer.body .. gateway:error_log())
    local seen = cjson.decode(answer.body)
    fs_roundtrip.check(seen, "/tree")
    assert.equal("create /watched.txt", seen.watch[1])
    assert.equal("timeout", seen.reason)
  end)

  it("writes a job's input, follows its frames live, resizes its terminal and signals it over cosockets",
    function()
      local answer = post("/interactive", {})
      assert.equal(200, answer.status, answer.body .. gateway:error_log())
      local seen = cjson.decode(answer.body)
      assert.equal("live\n", seen.first)
      assert.equal("more\nexit 0", seen.rest)
      assert.equal("43 132", seen.size)
      assert.equal(130, seen.code)
      assert.equal(2, seen.signal)
      assert.equal(3, seen.jobs)
    end)

  it("streams server-sent events, the exit status as the last event", function()
    local answer = post("/stream", { "sh", "-c", "printf 'a b'; exit 4" }, "&format=sse")
    assert.equal("text/event-stream", answer.headers["content-type"])
    local first, exit_data = answer.body:match("^(.-\n\n)event: exit\ndata: ([^\n]*)\n\n$")
    assert.equal("event: stdout\nid: 0\ndata: " .. core.b64encode("a b") .. "\n\n", first)
    assert.same({ code = 4, truncated = false }, cjson.decode(exit_data))
  end)

  it("answers pings within 20 ms at the 99th percentile while 64 streams run", function()
    local n, rounds, line = 64, 200, string.rep("x", 1023) .. "\n"
    -- Each command copies what the spec writes into its FIFO: the streams carry traffic, and
    -- they run until the spec closes the FIFOs.
    local fifos, paths = {}, {}
    -- One mkfifo for all, and the shell's own redirection to say a command started: each
    -- process spared is one start of a program, 64 times over.
    for i = 1, n do paths[i] = files.shell_quote(files_dir .. "/fifo-" .. i) end
    assert(files.execute("mkfifo " .. table.concat(paths, " ")))
    -- One curl reads the 64 streams (--parallel), its options in a file as 64 transfers' pass
    -- the bound on a spawn's arguments: 64 readers would be 64 more processes woken at each
    -- round, and a ping would measure how the scheduler shares two cores among them more than
    -- the worker's own turns. A stream cut short loses the rounds after it, which the checks
    -- of every stream's bytes below find.
    local config = {}
    for i = 1, n do
      local command = { "sh", "-c", ": >/started-" .. i .. "; exec cat /fifo-" .. i }
      config[i] = ("-sN\n-o %q\n-X POST\n--data-binary %q\nurl = %q\n"):format(
        files_dir .. "/out-" .. i, cjson.encode(command), gateway.url .. "/stream" .. query())
    end
    files.write(files_dir .. "/streams.curl", table.concat(config, "next\n"))
    local argv = { "curl", "--parallel", "--parallel-immediate", "--parallel-max", tostring(n),
      "-K", files_dir .. "/streams.curl" }
    local reader = client(argv)
    local started = within(30, function()
      for i = 1, n do
        if not files.read(files_dir .. "/started-" .. i) then return false end
      end
      return true
    end)
    assert.is_true(started, "the 64 commands did not start\n" .. gateway:error_log())
    -- Opened after every curl started, which would otherwise inherit them and keep each FIFO
    -- open for writing; read and write, so opening never waits for the other end.
    for i = 1, n do fifos[i] = assert(io.open(files_dir .. "/fifo-" .. i, "r+")) end
    local function write_round()
      for i = 1, n do
        fifos[i]:write(line)
        fifos[i]:flush()
      end
    end
    -- Whether every stream has passed on nearly all of `written` bytes: their base64 alone is
    -- 4/3 of them, a frame's few bytes of JSON around it the "nearly". Waiting for this before
    -- the next round keeps one round in flight at each ping: written as fast as pings come
    -- back, the rounds pile up in the FIFOs and the machine's two cores run 130 busy processes,
    -- and a ping then measures how long the scheduler keeps the worker from a core — it waited
    -- before reaching the worker, by the worker's own clock, while the worker used a third of
    -- a core — instead of how long the worker's own turns are.
    local function delivered(written)
      local floor = math.ceil(written * 4 / 3)
      for i = 1, n do
        local out = io.open(files_dir .. "/out-" .. i, "rb")
        local size = out and out:seek("end") or 0
        if out then out:close() end
        if size < floor then return false end
      end
      return true
    end
    -- A first round before any ping: each stream's first frame sends its response head and
    -- the worker compiles the frame path's traces, once per stream and worker.
    write_round()
    assert.is_true(within(30, function() return delivered(#line) end), "the first round did not arrive")
    local latencies = {}
    for round = 2, rounds + 1 do
      write_round()
      local t0 = core.now()
      local pong = assert(raw_http.request(gateway.port, "GET", "/ping"))
      latencies[#latencies + 1] = core.now() - t0
      assert.equal("pong\n", pong.body)
      assert.is_true(within(30, function() return delivered(round * #line) end),
        "round " .. round .. " did not arrive")
    end
    assert.is_true(alive(reader), "the streams ended before the pings did")
    for i = 1, n do fifos[i]:close() end
    assert.is_true(within(30, function() return core.reap(reader) end), "the streams did not end")
    for i = 1, n do
      local frames = ndjson_frames(assert(files.read(files_dir .. "/out-" .. i)))
      local bytes = 0
      for _, f in ipairs(frames) do bytes = bytes + (f.data and #f.data or 0) end
      assert.equal((rounds + 1) * #line, bytes, "stream " .. i .. " lost or repeated bytes")
      assert.same({ t = "exit", code = 0, truncated = false }, frames[#frames])
    end
    local p99 = percentile(latencies, 0.99)
    assert.is_true(p99 < 0.020, string.format("ping p50 %.1f ms, p99 %.1f ms, max %.1f ms",
      percentile(latencies, 0.5) * 1000, p99 * 1000, percentile(latencies, 1) * 1000))
  end)

  it("answers pings while a stream whose frames never keep it waiting runs, in turns of the worker",
    function()
    local seconds = 4
    local out = files_dir .. "/busy.out"
    local busy = client({ "curl", "-sN", "-o", out, "-X", "POST", gateway.url .. "/busy?seconds=" .. seconds })
    --- The size of what curl wrote so far and its last bytes (the output runs to hundreds of MB).
    local function written()
      local f = io.open(out, "rb")
      if not f then return 0, "" end
      local size = f:seek("end")
      f:seek("set", math.max(0, size - 64))
      local last = f:read("a")
      f:close()
      return size, last
    end
    local t0 = core.now()
    assert.is_true(within(seconds / 2, function() return written() > 0 end),
      "the busy stream did not start\n" .. gateway:error_log())
    -- Each ping comes back long before the stream ends: a stream that never parks on its own
    -- lets the worker run its other work every few milliseconds.
    local latencies = {}
    for _ = 1, 5 do
      local p0 = core.now()
      local pong = assert(raw_http.request(gateway.port, "GET", "/ping", { timeout = seconds * 2 }))
      latencies[#latencies + 1] = core.now() - p0
      assert.equal("pong\n", pong.body)
    end
    assert.is_true(core.now() - t0 < seconds, "the pings outlasted the busy stream: it was not busy")
    assert.is_true(percentile(latencies, 1) < 0.5, string.format("the slowest ping took %.0f ms",
      percentile(latencies, 1) * 1000))
    assert.is_true(within(seconds * 3, function() return core.reap(busy) end))
    assert.matches("\nsandkit: exit code 0\n$", select(2, written()))
  end)

  it("runs 8 concurrent two-second commands in under 3 s in all", function()
    local pids = {}
    local t0 = core.now()
    for i = 1, 8 do
      pids[i] = curl("/exec", { "sh", "-c", "sleep 2; echo " .. i }, files_dir .. "/exec-" .. i)
    end
    assert.is_true(within(30, function()
      for i = 1, 8 do
        if not core.reap(pids[i]) then return false end
      end
      return true
    end))
    local elapsed = core.now() - t0
    for i = 1, 8 do
      local text = assert(files.read(files_dir .. "/exec-" .. i))
      assert.same({ code = 0, stdout = i .. "\n", stderr = "" }, cjson.decode(text))
    end
    assert.is_true(elapsed < 3, string.format("8 concurrent sleeps took %.2f s", elapsed))
  end)

  --- Runs three commands through the handler at path, which must run them at the same time:
  -- command i starts, then waits for command i+1 (mod 3) and for the spec's `go`, so one after
  -- another the first would wait until its timeout. `bound` (seconds, below that timeout)
  -- fails a serialising worker instead of waiting on it. While they wait, the worker serves
  -- other requests.
  local function ring_fanout(path, bound)
    local n, argvs = 3, {}
    for i = 1, n do
      argvs[i] = { "sh", "-c", string.format("touch /ring-%d; while [ ! -e /ring-%d ] || [ ! -e /go ]; "
        .. "do sleep 0.01; done; echo done %d", i, i % n + 1, i) }
    end
    local out = files_dir .. "/fanout.out"
    local fanout = curl(path, argvs, out)
    assert.is_true(within(bound, function()
      for i = 1, n do
        if not files.read(files_dir .. "/ring-" .. i) then return false end
      end
      return true
    end), "the commands did not all start\n" .. gateway:error_log())
    local pong = assert(raw_http.request(gateway.port, "GET", "/ping", { timeout = 2 }))
    assert.equal("pong\n", pong.body)
    files.write(files_dir .. "/go", "")
    assert.is_true(within(bound, function() return core.reap(fanout) end))
    assert.same({ "done 1\n", "done 2\n", "done 3\n" }, cjson.decode((assert(files.read(out)))))
  end

  it("runs sandkit.run tasks at the same time, on light threads that leave the worker free", function()
    ring_fanout("/fanout", 20) -- each task's exec has 60 s
  end)

  it("runs session:exec calls on plain ngx.thread light threads at the same time", function()
    ring_fanout("/thread_fanout", 8) -- each thread's exec has 10 s
  end)

  it("runs a command from a timer, after the request that scheduled it ended", function()
    local answer = post("/timer", { "sh", "-c", "sleep 0.2; echo from a timer" },
      "&out=" .. files_dir .. "/timer.out")
    assert.equal(204, answer.status)
    assert.is_true(within(10, function() return files.read(files_dir .. "/timer.out") ~= nil end),
      gateway:error_log())
    assert.equal("from a timer\n", files.read(files_dir .. "/timer.out"))
  end)

  --- Starts a command that sleeps, through a request to path; returns the raw connection (its
  -- first frame read) and a function telling whether the command still runs. The agent runs
  -- commands in a PID namespace of their own, so the command's `$$` is not a host pid: it is
  -- found by its argv, made unique here (the shell's and then sleep's both hold it).
  local function start_sleeper(path, extra)
    local nap = string.format("60.%08d", math.random(0, 99999999))
    local conn = assert(raw_http.connect(gateway.port))
    assert(conn:request("POST", path .. query(extra), {},
      cjson.encode{ "sh", "-c", "echo started; exec sleep " .. nap }))
    local status = conn:read_head()
    assert.equal(200, status)
    local first = assert(conn:next_line())
    return conn, function() return #agent_process.processes{ nap } > 0 end, first
  end

  it("stops the command within a second when the HTTP client goes away", function()
    local conn, running, first = start_sleeper("/stream")
    assert.equal("started\n", ndjson_frames(first .. "\n")[1].data)
    -- Read in the instant of the shell's exec, a process's argv is empty: look until it is back.
    assert.is_true(within(2, running), "the command runs while its client reads")
    conn:close(true)
    assert.is_true(within(1, function() return not running() end),
      "the command outlived its client by a second")
  end)

  -- In the two below the handler leaves right after the first frame, so the command may be gone
  -- before the spec looks: that it started is what the "started" frame proves.
  --- The handler's reply: the first frame it read, which must be the command's first line.
  local function assert_started(first)
    local frame = cjson.decode(first)
    assert.same({ type = "stdout", seq = 0, data = "started\n" }, frame)
  end

  it("stops the command when its handler leaves the loop and closes the iterator", function()
    local conn, running, first = start_sleeper("/leave", "&mode=close")
    assert_started(first)
    assert.is_true(within(1, function() return not running() end), "the command outlived its stream")
    conn:close()
  end)

  it("stops the command when its handler leaves the loop without closing, as the request ends", function()
    local conn, running, first = start_sleeper("/leave", "&mode=leave")
    assert_started(first)
    assert.is_true(within(1, function() return not running() end),
      "the stream outlived its request")
    conn:close()
  end)

  it("holds back a command its HTTP client reads slowly, in bounded worker memory", function()
    -- The worker's peak is measured: a worker of its own, which no case before ran in.
    stop_gateway()
    start_gateway()
    local block = 65536
    local writer = local_state.writer(block)
    local conn = assert(raw_http.connect(gateway.port))
    assert(conn:request("POST", "/stream" .. query(), {}, cjson.encode(writer)))
    assert.equal(200, (conn:read_head()))
    local wire = 0
    local t0 = core.now()
    while core.now() - t0 < 1.5 do
      local chunk = assert(conn:read_chunk())
      wire = wire + #chunk
      socket.sleep(0.01) -- the slow client: 10 ms per chunk read
    end
    local written = tonumber(files.read(files_dir .. "/written")) * block
    local status = files.read("/proc/" .. gateway:worker_pid() .. "/status")
    conn:close()
    -- Base64 makes the wire 4/3 of the payload. Unthrottled, the writer manages hundreds of
    -- MiB in 1.5 s; held back, it is ahead of the client only by what the buffers between
    -- hold (the agent's queue, pipes, sockets, nginx's output, the transfer's 128 KiB).
    local read = wire * 3 / 4
    assert.is_true(read > 0)
    assert.is_true(written - read < 32 * 1024 * 1024, string.format(
      "the command wrote %.0f bytes while the client read %.0f", written, read))
    local peak = tonumber(status:match("VmHWM:%s*(%d+) kB")) * 1024
    assert.is_true(peak < 64 * 1024 * 1024, "the worker's peak RSS was " .. peak .. " bytes")
  end)

  it("refuses to wait in a phase without cosockets, naming the phase, and starts nothing", function()
    local answer = assert(raw_http.request(gateway.port, "GET", "/phase" .. query()))
    assert.matches("cannot wait in nginx's set phase", answer.body, 1, true)
    assert.equal(1, #core.listdir(root .. "/sessions"), "only the spec's own session exists")
  end)
end)

-- The phases where nginx offers no cosockets and no ngx.sleep: init_by_lua and
-- init_worker_by_lua (probed as nginx starts, what sandkit said kept in a shared dict that a
-- location then reports), set_by_lua (above), header_filter_by_lua and body_filter_by_lua.
-- Each must refuse, naming the phase, before anything starts.
describe("sandkit in an nginx phase without cosockets", function()
  local server, root

  -- One nginx for every case, and nothing cleaned between them: each case asserts that nothing
  -- was ever started under root, after its own phase's attempt and the init phases' (which ran
  -- as nginx started), so a session or agent any of them made fails it still.
  setup(function()
    root = local_state.new()
    local probe = string.format("require('support.nginx_app').probe_into_dict(%q)", root)
    server = nginx.start{
      http = "  lua_shared_dict phase_probe 64k;\n"
        .. "  init_by_lua_block { " .. probe .. " }\n"
        .. "  init_worker_by_lua_block { " .. probe .. " }",
      server = [[
    location = /report { content_by_lua_block { require("support.nginx_app").phase_report() } }
    location = /filters {
      content_by_lua_block { ngx.say("body") }
      header_filter_by_lua_block {
        local said = require("support.nginx_app").phase_probe(ngx.unescape_uri(ngx.var.arg_root))
        ngx.header["X-Header-Filter"] = said
      }
      body_filter_by_lua_block {
        if ngx.arg[2] then
          ngx.arg[1] = ngx.arg[1] .. require("support.nginx_app").phase_probe(ngx.unescape_uri(ngx.var.arg_root))
        end
      }
    }
]] }
  end)

  teardown(function()
    if server then server:stop() end
    -- An agent started against the rule has no session record to be terminated by: end it here.
    for _, pid in ipairs(agent_process.processes{ root }) do core.kill(pid, core.SIGTERM) end
    local_state.clean(root)
  end)

  --- Asserts that said is sandkit's refusal naming phase, and that nothing was started.
  local function refused(phase, said)
    assert.matches("cannot wait in nginx's " .. phase .. " phase", said, 1, true)
    assert.equal(0, #(core.listdir(root .. "/sessions") or {}), "a session was made")
    assert.equal(0, #agent_process.processes{ root }, "an agent was started")
  end

  local function report(phase)
    local answer = assert(raw_http.request(server.port, "GET", "/report?phase=" .. phase))
    assert.equal(200, answer.status, answer.body .. server:error_log())
    return answer.body
  end

  it("refuses in init_by_lua, naming the phase, and starts nothing", function()
    refused("init", report("init"))
  end)

  it("refuses in init_worker_by_lua, naming the phase, and starts nothing", function()
    refused("init_worker", report("init_worker"))
  end)

  it("refuses in header_filter_by_lua, naming the phase, and starts nothing", function()
    local answer = assert(raw_http.request(server.port, "GET", "/filters?root=" .. root))
    refused("header_filter", answer.headers["x-header-filter"] or "")
  end)

  it("refuses in body_filter_by_lua, naming the phase, and starts nothing", function()
    local answer = assert(raw_http.request(server.port, "GET", "/filters?root=" .. root))
    assert.equal("body\n", answer.body:sub(1, 5))
    refused("body_filter", answer.body:sub(6))
  end)
end)
