-- sandkit-agent's interactive job routes (docs/protocol.md §6.4) on the wire: each bound crossed
-- and each refusal, the memory a job's input and a stalled follower may hold, and a write taken
-- over by the next.

local cjson = require "cjson"
local raw = require "support.raw_http"
local agent_process = require "support.agent_process"
local files = require "support.files"

local start_agent, within = agent_process.start_agent, agent_process.within

describe("sandkit-agent's interactive jobs", function()
  local A

  setup(function()
    A = assert(start_agent())
  end)

  teardown(function()
    assert.are.equal(0, A:stop())
  end)

  local function start(body)
    body.timeoutMs = body.timeoutMs or 30000
    local res, value = A:start_job(body)
    return res, value and value.jobId
  end

  local function stdin(id, offset, bytes, extra)
    return A:req("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=" .. offset .. (extra or ""), bytes or "")
  end

  local function code(res)
    return res.body:match("^([A-Z_]+):")
  end

  it("refuses a terminal of 0 or over 10000 columns or rows, and stdin that is no boolean", function()
    for _, pty in ipairs{ { cols = 0, rows = 24 }, { cols = 80, rows = 0 }, { cols = 10001, rows = 24 },
        { cols = 80, rows = 10001 }, { cols = 1.5, rows = 24 }, { cols = -1, rows = 24 }, { rows = 24 } } do
      local res = start{ command = { "true" }, pty = pty }
      assert.equal(400, res.status, cjson.encode(pty))
      assert.matches("pty cols and rows must be integers from 1 to 10000", res.body)
    end
    local res, id = start{ command = { "stty", "size" }, pty = { cols = 10000, rows = 1 } }
    assert.equal(200, res.status, res.body)
    local _, frames = A:poll_until_done(id, 10)
    assert.matches("1 10000", agent_process.frames_data(frames, "stdout"))
    res = start{ command = { "true" }, stdin = "yes" }
    assert.equal(400, res.status)
    assert.matches("stdin must be true or false", res.body)
  end)

  it("refuses stdin and pty on /v1/exec with a requestInvalid frame", function()
    local _, frames = A:exec{ command = { "true" }, timeoutMs = 5000, stdin = true }
    assert.equal("error", frames[1].t)
    assert.equal("requestInvalid", frames[1].code)
  end)

  it("refuses an offset or close that is no number, a gap, and input for a job without it", function()
    local _, id = start{ command = { "cat" }, stdin = true }
    assert.equal(400, stdin(id, "x").status)
    assert.equal(400, stdin(id, "-1").status)
    assert.equal(400, stdin(id, "0", "", "&close=2").status)
    local res = stdin(id, 5, "x")
    assert.equal(409, res.status)
    assert.equal("JOB_STDIN_GAP", code(res))
    assert.equal(404, stdin("nope", 0, "x").status)
    local _, plain = start{ command = { "sleep", "10" } }
    res = stdin(plain, 0, "x")
    assert.equal("JOB_STDIN_NONE", code(res))
    assert.equal(200, stdin(id, 0, "", "&close=1").status)
    res = stdin(id, 0, "late")
    assert.equal("JOB_STDIN_CLOSED", code(res))
    assert.equal(200, A:req("POST", "/v1/jobs/cancel", { jobId = plain }).status)
  end)

  it("takes a resend and answers how much it has", function()
    local _, id = start{ command = { "cat" }, stdin = true }
    local res, value = A:json("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=0", "abc")
    assert.equal(200, res.status)
    assert.same({ offset = 3, closed = false }, value)
    _, value = A:json("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=1", "bcde")
    assert.same({ offset = 5, closed = false }, value)
    _, value = A:json("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=0&close=1", "abcde")
    assert.same({ offset = 5, closed = true }, value)
    local _, frames = A:poll_until_done(id, 10)
    assert.equal("abcde", agent_process.frames_data(frames, "stdout"))
  end)

  it("refuses an unknown signal name, a resize of a job without a terminal, and both once it ended", function()
    local _, id = start{ command = { "sleep", "10" } }
    local res = A:req("POST", "/v1/jobs/signal", { jobId = id, signal = "STOP" })
    assert.equal(400, res.status)
    assert.matches("INT, TERM, HUP, KILL, QUIT, USR1, USR2 and WINCH", res.body)
    res = A:req("POST", "/v1/jobs/resize", { jobId = id, cols = 80, rows = 24 })
    assert.equal("JOB_NOT_PTY", code(res))
    assert.equal(204, A:req("POST", "/v1/jobs/signal", { jobId = id, signal = "KILL" }).status)
    local page = A:poll_until_done(id, 10)
    assert.equal(9, page.signal)
    res = A:req("POST", "/v1/jobs/signal", { jobId = id, signal = "INT" })
    assert.equal("JOB_ENDED", code(res))
  end)

  it("lists a command of any length within its bound, saying how many arguments it left out", function()
    local argv = { "true" }
    for i = 1, 2000 do argv[#argv + 1] = string.rep("a", 10) .. i end
    local _, id = start{ command = argv }
    local _, value = A:json("GET", "/v1/jobs/list")
    local found
    for _, job in ipairs(value.jobs) do if job.jobId == id then found = job end end
    assert.is_true(#cjson.encode(found.command) <= 4096 + 32)
    assert.matches("^%.%.%. %d+ more$", found.command[#found.command])
    local kept = #found.command - 1
    assert.equal(string.format("... %d more", #argv - kept), found.command[#found.command])
  end)

  it("holds a job's unread input bounded while a writer sends far more, the rest waiting in the socket", function()
    local _, id = start{ command = { "sleep", "30" }, stdin = true, timeoutMs = 60000 }
    local before = agent_process.vm_rss_kb(A.pid)
    local c = assert(raw.connect(A.port))
    local h = A:auth()
    h["Content-Length"] = tostring(64 * 1024 * 1024)
    assert(c:request("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=0", h))
    c:settimeout(0.05)
    local block = string.rep("w", 1024 * 1024)
    local sent = 0
    for _ = 1, 64 do
      local ok = c:send(block)
      if not ok then break end
      sent = sent + #block
    end
    local taken
    assert.is_true(within(10, function()
      local _, value = A:json("GET", "/v1/jobs/list")
      for _, job in ipairs(value.jobs) do if job.jobId == id then taken = job.stdinOffset end end
      return taken and taken > 0
    end))
    -- What the agent took: its buffer, a body piece, and what the command's pipe holds (its 32
    -- slots, each one TCP fragment of at most 32 KiB once the body is spliced into it).
    assert.is_true(taken <= 256 * 1024 + 64 * 1024 + 1024 * 1024, "took " .. taken)
    assert.is_true(sent < 64 * 1024 * 1024, "the sender was held back")
    assert.is_true(agent_process.vm_rss_kb(A.pid) - before < 8 * 1024, "the agent's memory stayed bounded")
    c:close(true)
    A:req("POST", "/v1/jobs/cancel", { jobId = id })
  end)

  it("moves a write into a pipe job's input in order, after what it buffered and past a resend's skips", function()
    local parts = {}
    for i = 1, 6 * 1024 * 1024 / 8 do parts[i] = string.format("%08x", i) end
    local input = table.concat(parts)
    local path = files.temp_name()
    local f = assert(io.open(path, "wb"))
    f:write(input)
    f:close()
    local p = assert(io.popen("cksum < " .. path))
    local want = p:read("a")
    p:close()
    os.remove(path)
    -- The command reads nothing for a second: what the agent buffers meanwhile must reach it
    -- before any byte that goes into the pipe from the socket.
    local _, id = start{ command = { "sh", "-c", "sleep 1; exec cksum" }, stdin = true }
    -- A few bytes the agent buffers; a resend that reaches 3 MiB past them, whose body goes
    -- into the pipe once they are written; one more from 2 MiB, its first MiB skipped.
    local _, value = A:json("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=0", input:sub(1, 100))
    assert.equal(100, value.offset)
    _, value = A:json("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=0",
      input:sub(1, 3 * 1024 * 1024))
    assert.equal(3 * 1024 * 1024, value.offset)
    _, value = A:json("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=" .. 2 * 1024 * 1024 .. "&close=1",
      input:sub(2 * 1024 * 1024 + 1))
    assert.same({ offset = #input, closed = true }, value)
    local _, frames = A:poll_until_done(id, 20)
    assert.equal(want, agent_process.frames_data(frames, "stdout"))
  end)

  it("refuses the rest of a write whose command stopped reading while its body went into the pipe", function()
    local _, id = start{ command = { "head", "-c", "10" }, stdin = true }
    local c = assert(raw.connect(A.port))
    local h = A:auth()
    h["Content-Length"] = tostring(64 * 1024 * 1024)
    assert(c:request("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=0", h))
    c:settimeout(0.05)
    local block = string.rep("h", 1024 * 1024)
    for _ = 1, 64 do
      if not c:send(block) then break end
    end
    c:settimeout(10)
    local status = c:read_head()
    assert.equal(409, status)
    local body = c:read_body()
    assert.truthy(body:match("^JOB_STDIN_CLOSED:") or body:match("^JOB_ENDED:"), body)
    c:close(true)
    local _, frames = A:poll_until_done(id, 10)
    assert.equal(string.rep("h", 10), agent_process.frames_data(frames, "stdout"))
  end)

  it("lets a new write take over one still being taken, refusing the old one's next new byte", function()
    -- A command that reads nothing: the old write stops once the agent's buffer is full.
    local _, id = start{ command = { "sleep", "30" }, stdin = true }
    local old = assert(raw.connect(A.port))
    local h = A:auth()
    h["Content-Length"] = tostring(2 * 1024 * 1024)
    assert(old:request("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=0", h))
    old:settimeout(0.05)
    old:send(string.rep("o", 1024 * 1024))
    local taken, last
    assert.is_true(within(10, function()
      local _, value = A:json("GET", "/v1/jobs/list")
      last = taken
      for _, job in ipairs(value.jobs) do if job.jobId == id then taken = job.stdinOffset end end
      return taken > 0 and taken == last
    end), "the old write stopped")
    local res, value = A:json("POST", "/v1/jobs/stdin?jobId=" .. id .. "&offset=" .. string.format("%d", taken)
      .. "&close=1", "new")
    assert.equal(200, res.status, res.body)
    assert.equal(taken + 3, value.offset)
    old:settimeout(10)
    old:send(string.rep("o", 1024 * 1024))
    local status = old:read_head()
    assert.equal(409, status)
    old:close(true)
    A:req("POST", "/v1/jobs/cancel", { jobId = id })
  end)

  it("streams a job live from a cursor with keep-alives, ending with its exit frame", function()
    local _, id = start{ command = { "sh", "-c", "echo one; sleep 0.5; echo two" } }
    local c = assert(raw.connect(A.port))
    local h = A:auth()
    h["Content-Type"] = "application/json"
    assert(c:request("POST", "/v1/jobs/stream", h, cjson.encode{ jobId = id, sinceSeq = cjson.null,
      keepaliveMs = 100 }))
    assert.equal(200, (c:read_head()))
    local kinds = {}
    while true do
      local line = c:next_line()
      if not line then break end
      local frame = cjson.decode(line)
      kinds[#kinds + 1] = frame.t
      if frame.t == "exit" then break end
    end
    c:close()
    assert.equal("stdout", kinds[1])
    assert.equal("exit", kinds[#kinds])
    local keepalives = 0
    for _, k in ipairs(kinds) do if k == "keepalive" then keepalives = keepalives + 1 end end
    assert.is_true(keepalives >= 1, table.concat(kinds, " "))
    local res = A:req("POST", "/v1/jobs/stream", { jobId = id, keepaliveMs = 5 })
    assert.equal(400, res.status)
  end)
end)
