-- The agent protocol client (docs/protocol.md §4) against fake agents that send exact bytes over
-- real sockets. Every failure case of the original protocol client's tests has a spec here
-- with the same meaning, named after what it establishes.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local agent_session = require "support.agent_session"

local errors = sandkit.errors
local collect = agent_session.collect

local function is_error(v) return errors.is_error(v) end

describe("the exec stream", function()
  local session, server
  after_each(function() if server then server:stop() end end)

  it("decodes frames in order with a real exit code", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, {
        '{"t":"stdout","seq":0,"data":"aGk="}\n',
        '{"t":"stderr","seq":1,"data":"b29wcw=="}\n',
        '{"t":"exit","code":7,"truncated":false}\n' })
    end]])
    local items = collect(session)
    assert.equal(3, #items)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.same({ type = "stderr", seq = 1, data = "oops" }, items[2])
    assert.same({ type = "exit", code = 7, truncated = false }, items[3])
  end)

  it("reassembles a frame split across chunks", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"stdo', 'ut","seq":0,"data":"aGk="}\n{"t":"ex',
        'it","code":0,"truncated":false}\n' }, 0.02)
    end]])
    local items = collect(session)
    assert.equal(2, #items, "a split frame must not become two frames or an error")
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end)

  it("reads a frame line longer than the transfer's buffer, arriving in small pieces", function()
    -- 200 KiB of payload is a line of about 273 KB: longer than the 128 KiB a transfer holds,
    -- so the line must be handed to the decoder while it is still arriving. ("zzz" is "enp6".)
    session, server = agent_session.open([[function(req, conn)
      local line = '{"t":"stdout","seq":0,"data":"' .. string.rep("enp6", 68267) .. '"}\n'
      local chunks = {}
      for i = 1, #line, 7000 do chunks[#chunks + 1] = line:sub(i, i + 6999) end
      chunks[#chunks + 1] = '{"t":"exit","code":0}\n'
      respond.frames(conn, chunks)
    end]])
    local items = collect(session)
    assert.equal(2, #items)
    assert.equal(204801, #items[1].data)
    assert.equal(string.rep("z", 204801), items[1].data)
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end)

  it("tolerates CRLF line ends, unknown fields and a missing truncated", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"stdout","seq":0,"data":"aGk=","extra":{"a":[1,2]}}\r\n\r\n',
        '{"t":"exit","code":0}\r\n' })
    end]])
    local items = collect(session)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end)

  it("leaves the outcome unknown when a frame arrives but does not decode", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"stdout","seq":0,"data":"!!not base64!!"}\n' })
    end]])
    local items = collect(session)
    local err = items[1]
    assert.is_true(is_error(err))
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable, "the command ran; a repeat would run it twice")
    assert.matches("base64", tostring(err), 1, true)
  end)

  it("leaves the outcome unknown when a frame does not parse", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{not json at all}\n' })
    end]])
    local err = collect(session)[1]
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
    assert.matches("did not parse", tostring(err), 1, true)
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", err.cause.code)
  end)

  it("leaves the outcome unknown when a frame gives a member twice", function()
    for _, line in ipairs{ '{"t":"error","t":"exit","code":0}\n', '{"t":"exit","code":1,"code":0}\n' } do
      session, server = agent_session.open("function(req, conn) respond.frames(conn, { "
        .. string.format("%q", line) .. " }) end")
      local items = collect(session)
      assert.equal(1, #items, line)
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code, line)
      assert.is_false(items[1].retryable)
      assert.matches("appears twice", tostring(items[1]), 1, true)
      server:stop()
      server = nil
    end
  end)

  it("ends the stream mid-chunk at an unestablished outcome, delivering no later exit", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{not json at all}\n{"t":"exit","code":0,"truncated":false}\n' })
    end]])
    local items = collect(session)
    assert.equal(1, #items, "the exit frame must not follow the failure")
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
  end)

  it("ends the stream mid-chunk at a decode failure, delivering no later exit", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"stdout","seq":0,"data":"!!"}\n{"t":"exit","code":0,"truncated":false}\n' })
    end]])
    local items = collect(session)
    assert.equal(1, #items, "the exit frame must not follow the failure")
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
  end)

  it("reports a stream without a terminal frame as an unknown outcome, after its output", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"stdout","seq":0,"data":"aGk="}\n' })
    end]])
    local items = collect(session)
    assert.equal(2, #items)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1], "the stdout frame still arrives")
    local err = items[2]
    assert.matches("without a terminal frame", tostring(err), 1, true)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
  end)

  it("does not count a final line without its newline as the terminal frame", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"exit","code":0}' })
    end]])
    local items = collect(session)
    assert.equal(1, #items)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
  end)

  it("surfaces an error frame as an error, not a silent end", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"error","code":"deadlineExceeded","message":"exceeded its 300ms deadline"}\n' })
    end]])
    local items = collect(session)
    assert.equal(1, #items)
    local err = items[1]
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("deadlineExceeded", err.failure)
    assert.matches("deadlineExceeded", tostring(err), 1, true)
    assert.matches("exceeded its 300ms deadline", tostring(err), 1, true)
  end)

  it("reports a body that fails mid-way as an unknown outcome", function()
    session, server = agent_session.open([[function(req, conn)
      respond.chunked_start(conn, "200 OK")
      respond.chunk(conn, '{"t":"stdout","seq":0,"data":"aGk="}\n')
      conn:close()
    end]])
    local items = collect(session)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[2].code)
    assert.matches("the output stream failed", tostring(items[2]), 1, true)
  end)

  it("does not cut off a slow body after prompt headers", function()
    -- Each frame comes after a pause twice the header bound.
    session, server = agent_session.open(string.format([[function(req, conn)
      respond.frames(conn, { '{"t":"stdout","seq":0,"data":"aGk="}\n',
        '{"t":"exit","code":0,"truncated":false}\n' }, %g)
    end]], 2 * agent_session.HEADER_TIMEOUT))
    local items = collect(session)
    assert.equal(2, #items, "every frame arrived")
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end)

  it("fails an open stream that outlives the command's timeout plus the grace", function()
    session, server = agent_session.open([[function(req, conn)
      respond.chunked_start(conn, "200 OK")
      respond.chunk(conn, '{"t":"stdout","seq":0,"data":"aGk="}\n')
      conn:sleep(30)
    end]], { grace = 0.3 })
    local started = core.now()
    local items = collect(session, { "sleep", "600" }, { timeout = 0.2 })
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[2].code)
    assert.matches("no terminal frame arrived within", tostring(items[2]), 1, true)
    -- The bound is the behaviour: timeout + grace is 0.5 s; the agent would stall for 30.
    assert.is_true(core.now() - started < 5, "refused at the bound, not at the agent's leisure")
  end)

  it("sends the argv, the timeout in milliseconds, cwd and env", function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"exit","code":0}\n' })
    end]])
    collect(session, { "sh", "-c", "echo hi" }, { timeout = 2.5, cwd = "/app", env = { K = "V" } })
    local sent = require("cjson").decode(server:requests_to("/v1/exec")[1].body)
    assert.same({ "sh", "-c", "echo hi" }, sent.command)
    assert.equal(2500, sent.timeoutMs)
    assert.equal("/app", sent.cwd)
    assert.same({ K = "V" }, sent.env)
    assert.equal("Bearer test-token", server:requests_to("/v1/exec")[1].headers.authorization)
  end)
end)

describe("an exec answer", function()
  local session, server
  after_each(function() if server then server:stop() end end)

  local function exec_error(route)
    session, server = agent_session.open(route)
    local result, err = session:exec({ "true" }, { timeout = 10 })
    assert.is_nil(result)
    assert.is_true(is_error(err))
    return err
  end

  it("that is a bodyless 502 is not the agent refusing but an unknown outcome", function()
    local err = exec_error([[function(req, conn) respond.status(conn, "502 Bad Gateway", "") end]])
    assert.is_nil(tostring(err):find("agentRefused", 1, true), "a proxy 502 is not the agent refusing")
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
  end)

  it("that is a 500 with a body is an unknown outcome that keeps the body's text", function()
    local err = exec_error([[function(req, conn)
      respond.status(conn, "500 Internal Server Error", "spawn failed: ENOMEM") end]])
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.matches("spawn failed: ENOMEM", tostring(err), 1, true)
  end)

  it("that is a 504 with an HTML page is an unknown outcome and not retryable", function()
    local err = exec_error([[function(req, conn)
      respond.status(conn, "504 Gateway Time-out", "<html><body>504 Gateway Time-out</body></html>",
        "text/html") end]])
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable, "the command may still be running behind the gateway")
  end)

  it("that is a 3xx is the agent answering, never a sandbox out of reach", function()
    for _, status in ipairs{ "302 Found", "301 Moved Permanently", "307 Temporary Redirect" } do
      session, server = agent_session.open(string.format([[function(req, conn)
        respond.raw(conn, "HTTP/1.1 %s\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 5\r\n\r\nmoved")
      end]], status))
      for _, call in ipairs{
        function() return session:mkdir("/d") end,
        function() return session:exec({ "true" }, { timeout = 10 }) end,
      } do
        local ok, err = call()
        assert.is_nil(ok)
        assert.equal("SANDBOX_COMMAND_FAILED", err.code, status)
        assert.equal("agentRefused", err.failure)
        assert.is_false(err.retryable, "asking again gets the same redirect")
        assert.equal(tonumber(status:match("^%d+")), err.status)
      end
      server:stop()
      server = nil
    end
  end)

  it("that is a 400 is the agent answering", function()
    local err = exec_error([[function(req, conn)
      respond.status(conn, "400 Bad Request", "PATH_REFUSED: Path '/..' refused") end]])
    assert.are_not.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("agentRefused", err.failure)
    assert.equal(400, err.status)
    assert.matches("PATH_REFUSED: Path '/..' refused", tostring(err), 1, true)
  end)
end)

describe("a request the agent does not answer", function()
  local session, server
  after_each(function() if server then server:stop() end end)

  local stall = [[function(req, conn) conn:sleep(60) end]]

  it("is refused within the bound, saying the agent did not answer", function()
    session, server = agent_session.open(stall)
    local started = core.now()
    local result, err = session:exec({ "true" }, { timeout = 10 })
    assert.is_nil(result)
    -- The agent would answer after 60 s; refusing near the 0.3 s bound is the property.
    assert.is_true(core.now() - started < 3, "refused at the bound")
    assert.matches("did not answer", tostring(err), 1, true)
  end)

  it("is not retryable for runCommand: the command may have started", function()
    session, server = agent_session.open(stall)
    local _, err = session:exec({ "true" }, { timeout = 10 })
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
    assert.matches("did not answer", tostring(err), 1, true)
    assert.matches("may have taken effect", tostring(err), 1, true)
  end)

  it("stays retryable for a file read, which is idempotent", function()
    session, server = agent_session.open(stall)
    local bytes, err = session:read_file("/a.txt")
    assert.is_nil(bytes)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_true(err.retryable)
    assert.matches("did not answer", tostring(err), 1, true)
  end)

  it("whose connection drops before any headers is a runCommand that is not retryable", function()
    session, server = agent_session.open([[function(req, conn) conn:close() end]])
    local _, err = session:exec({ "true" }, { timeout = 10 })
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
    assert.matches("may have taken effect", tostring(err), 1, true)
  end)

  it("is delivered exactly once even when its pooled connection died", function()
    -- Health leaves a pooled keep-alive connection; the agent then reads the exec and closes
    -- without answering. A client that reused the pooled connection would have libcurl send
    -- the exec a second time on a fresh one.
    session, server = agent_session.open([[function(req, conn) conn:close() end]])
    local _, err = session:exec({ "true" }, { timeout = 10 })
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.equal(1, #server:requests_to("/v1/exec"), "the command must reach the agent once")
  end)

  it("on a closed connection is reported as never reached when nothing listens", function()
    session, server = agent_session.open([[function(req, conn) end]])
    server:stop()
    local _, err = session:read_file("/a.txt")
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_false(err.sent)
    assert.matches("never reached the agent", tostring(err), 1, true)
  end)
end)

describe("a zero timeout", function()
  local session, server
  after_each(function() if server then server:stop() end end)

  it("is refused locally and sends nothing", function()
    session, server = agent_session.open([[function(req, conn) respond.status(conn, "200 OK", "") end]])
    for _, timeout in ipairs({ 0, -1, 0.0004 }) do
      local result, err = session:exec({ "true" }, { timeout = timeout })
      assert.is_nil(result)
      assert.equal("INVALID_INPUT", err.code)
      assert.equal("timeout", err.field)
      assert.matches("non-zero timeout", tostring(err), 1, true)
      local job, jerr = session:start_job({ "true" }, { timeout = timeout })
      assert.is_nil(job)
      assert.equal("INVALID_INPUT", jerr.code)
    end
    assert.equal(0, #server:requests_to("/v1/exec"))
    assert.equal(0, #server:requests_to("/v1/jobs/start"))
  end)

  it("is the refusal a command without any timeout gets too", function()
    session, server = agent_session.open([[function(req, conn) respond.status(conn, "200 OK", "") end]])
    local _, err = session:exec({ "true" })
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("needs a timeout in seconds", err.message, 1, true)
    assert.equal(0, #server:requests_to("/v1/exec"))
  end)
end)

describe("jobs", function()
  local session, server
  after_each(function() if server then server:stop() end end)

  it("start, poll from their cursor and cancel", function()
    session, server = agent_session.open([[function(req, conn)
      local cjson = require "cjson"
      if req.path == "/v1/jobs/start" then return respond.json(conn, "200 OK", { jobId = "j1" }) end
      if req.path == "/v1/jobs/cancel" then return respond.json(conn, "200 OK", {}) end
      local body = cjson.decode(req.body)
      if body.sinceSeq == cjson.null then
        respond.json(conn, "200 OK", { running = true,
          frames = { { t = "stdout", seq = 0, data = "aGk=" } } })
      else
        respond.json(conn, "200 OK", { running = false, frames = {}, exitCode = 7, truncated = false })
      end
    end]])
    local job = assert(session:start_job({ "/bin/sleep", "600" }, { timeout = 600 }))
    assert.equal("j1", job.id)
    local first = assert(job:poll())
    assert.is_true(first.running)
    assert.same({ { type = "stdout", seq = 0, data = "hi" } }, first.frames, "base64 is decoded")
    assert.is_nil(first.exit)
    assert.is_nil(first.error)
    assert.equal(0, first.next, "the page names the cursor for the next poll")
    local second = assert(job:poll(first.next))
    assert.is_false(second.running)
    assert.same({}, second.frames, "nothing follows the last frame")
    assert.equal(0, second.next, "a page without frames keeps the cursor it was given")
    assert.same({ code = 7, truncated = false }, second.exit, "the ending is the envelope's")
    assert.is_true(job:cancel())
    local cursors = {}
    for _, r in ipairs(server:requests_to("/v1/jobs/poll")) do
      cursors[#cursors + 1] = require("cjson").decode(r.body).sinceSeq
    end
    assert.same({ require("cjson").null, 0 }, cursors,
      "the caller's cursor has to reach the agent, or every poll replays the whole output")
  end)

  it("whose start meets a server error leave the outcome unknown", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "500 Internal Server Error", "spawn failed") end]])
    local job, err = session:start_job({ "/bin/sleep", "600" }, { timeout = 600 })
    assert.is_nil(job)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable, "the agent may have taken the command")
    assert.matches("sandbox.jobStart", tostring(err), 1, true)
  end)

  it("whose poll meets a server error stay retryable", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "503 Service Unavailable", "") end]])
    local page, err = session:job("j1"):poll(4)
    assert.is_nil(page)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_true(err.retryable, "the job is untouched")
  end)

  it("whose poll body ends early stay retryable", function()
    session, server = agent_session.open([[function(req, conn)
      respond.chunked_start(conn, "200 OK", "application/json")
      respond.chunk(conn, '{"running":tr')
      conn:close()
    end]])
    local page, err = session:job("j1"):poll()
    assert.is_nil(page)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_true(err.retryable, "polling again costs nothing")
  end)

  it("whose cancel is refused hear the agent's answer, its code as err.reason", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "404 Not Found", "JOB_NOT_FOUND: no job j1") end]])
    local ok, err = session:job("j1"):cancel()
    assert.is_nil(ok)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("JOB_NOT_FOUND", err.reason)
    assert.matches("JOB_NOT_FOUND", tostring(err), 1, true)
  end)

  it("whose start names an id may be resent only when the agent promises idempotency", function()
    session, server = agent_session.open([[function(req, conn) conn:close() end]])
    local _, err = session:start_job({ "true" }, { timeout = 10, id = "build-1" })
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_true(err.retryable, "the agent advertised jobIdempotency and the start named its job")
    local _, anonymous = session:start_job({ "true" }, { timeout = 10 })
    assert.is_false(anonymous.retryable, "an anonymous start could run twice")
    assert.equal("build-1", require("cjson").decode(server:requests_to("/v1/jobs/start")[1].body).jobId)
  end)

  it("deliver their frames once each and end with the exit frame", function()
    session, server = agent_session.open([[function(req, conn)
      local cjson = require "cjson"
      local since = cjson.decode(req.body).sinceSeq
      local all = { { t = "stdout", seq = 0, data = "b25l" }, { t = "stderr", seq = 1, data = "dHdv" },
        { t = "stdout", seq = 3, data = "Zm91cg==" } }
      local frames = {}
      for _, f in ipairs(all) do
        if since == cjson.null or f.seq > since then frames[#frames + 1] = f end
      end
      if since == cjson.null then
        respond.json(conn, "200 OK", { running = true, frames = { all[1], all[2] } })
      else
        respond.json(conn, "200 OK", { running = false, frames = frames, exitCode = 0, truncated = true })
      end
    end]])
    local seen = {}
    for frame in session:job("j1"):frames{ interval = 0.01 } do seen[#seen + 1] = frame end
    assert.same({ { type = "stdout", seq = 0, data = "one" }, { type = "stderr", seq = 1, data = "two" },
      { type = "stdout", seq = 3, data = "four" }, { type = "exit", code = 0, truncated = true } }, seen)
  end)

  it("whose poll carries a frame that cannot be read leave the outcome unknown", function()
    -- Polling the same cursor again returns the same frame: a retry would loop for ever.
    for _, frame in ipairs{
      '{"t":"stdout","seq":0,"data":"!!not base64!!"}',
      '{"t":"stdin","seq":0,"data":"aGk="}',
      '{"t":"stdout","data":"aGk="}',
    } do
      session, server = agent_session.open(string.format([[function(req, conn)
        respond.status(conn, "200 OK", '{"running":true,"frames":[%s]}', "application/json")
      end]], frame))
      local page, err = session:job("j1"):poll()
      assert.is_nil(page, frame)
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code, frame)
      assert.is_false(err.retryable, frame)
      assert.equal("sandbox.jobPoll", err.operation)
      server:stop()
      server = nil
    end
  end)

  it("whose poll carries an exit frame take it, and an error frame is the job's failure", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "200 OK", '{"running":false,"frames":[{"t":"stdout","seq":0,"data":"aGk="},'
        .. '{"t":"exit","code":3,"truncated":true}]}', "application/json")
    end]])
    local page = assert(session:job("j1"):poll())
    assert.same({ { type = "stdout", seq = 0, data = "hi" } }, page.frames)
    assert.same({ code = 3, truncated = true }, page.exit)
    local seen = {}
    for frame in session:job("j1"):frames() do seen[#seen + 1] = frame end
    assert.same({ { type = "stdout", seq = 0, data = "hi" }, { type = "exit", code = 3, truncated = true } },
      seen)
    server:stop()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "200 OK", '{"running":false,"frames":[{"t":"error","code":"timeoutExceeded",'
        .. '"message":"over its 100ms"}]}', "application/json")
    end]])
    local _, err = session:job("j1"):poll()
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("timeoutExceeded", err.failure)
    assert.matches("over its 100ms", tostring(err), 1, true)
  end)

  it("that end in an error raise it after delivering their output", function()
    session, server = agent_session.open([[function(req, conn)
      respond.json(conn, "200 OK", { running = false, frames = { { t = "stdout", seq = 0, data = "aGk=" } },
        error = { code = "timeoutExceeded", message = "exceeded its 100ms timeout" } })
    end]])
    local seen = {}
    local ok, err = pcall(function()
      for frame in session:job("j1"):frames() do seen[#seen + 1] = frame end
    end)
    assert.is_false(ok)
    assert.same({ { type = "stdout", seq = 0, data = "hi" } }, seen)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("timeoutExceeded", err.failure)
  end)
end)

describe("files", function()
  local session, server
  after_each(function() if server then server:stop() end end)

  it("are written one PUT per path in sorted order, stopping at the first failure", function()
    session, server = agent_session.open([[function(req, conn)
      local body = require("cjson").decode(req.body)
      if body.path == "/b" then return respond.status(conn, "400 Bad Request", "PATH_REFUSED: no") end
      respond.status(conn, "204 No Content", "")
    end]])
    local ok, err = session:write_files{ ["/c"] = "3", ["/a"] = "1", ["/b"] = "2" }
    assert.is_nil(ok)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("/b", err.path)
    local paths = {}
    for _, r in ipairs(server:requests_to("/v1/files")) do
      paths[#paths + 1] = require("cjson").decode(r.body).path
    end
    assert.same({ "/a", "/b" }, paths)
  end)

  it("are read back as bytes, binary-safe", function()
    session, server = agent_session.open([[function(req, conn)
      respond.json(conn, "200 OK", { contentsBase64 = "AAEC/w==" })
    end]])
    assert.equal("\0\1\2\255", assert(session:read_file("/bin.dat")))
    assert.equal("path=/bin.dat", server:requests_to("/v1/files")[1].query)
  end)

  it("read back with bad base64 are an unexpected format, naming the field", function()
    session, server = agent_session.open([[function(req, conn)
      respond.json(conn, "200 OK", { contentsBase64 = "a" })
    end]])
    local _, err = session:read_file("/x")
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", err.code)
    assert.matches("contentsBase64", tostring(err), 1, true)
  end)
end)

describe("an error body", function()
  local server
  after_each(function() if server then server:stop() end end)

  local OPERATIONS = {
    { "sandbox.runCommand", function(s) return s:exec({ "true" }, { timeout = 10 }) end },
    { "sandbox.jobStart", function(s) return s:start_job({ "true" }, { timeout = 10 }) end },
    { "sandbox.readFile", function(s) return s:read_file("/x") end },
  }

  local function check(route, status_line, expect_text)
    for _, op in ipairs(OPERATIONS) do
      local session
      session, server = agent_session.open(string.format(route, status_line))
      local started = core.now()
      local result, err = op[2](session)
      local elapsed = core.now() - started
      server:stop()
      assert.is_nil(result)
      local idempotent = op[1] == "sandbox.readFile"
      assert.equal(idempotent and "SANDBOX_UNREACHABLE" or "SANDBOX_OUTCOME_UNKNOWN", err.code,
        status_line .. " " .. op[1])
      assert.equal(idempotent, err.retryable)
      assert.matches(expect_text, tostring(err), 1, true)
      -- The server would keep the body open for 60 s: giving up near the 0.3 s bound is the
      -- behaviour under test.
      assert.is_true(elapsed < 3, op[1] .. " was held for " .. elapsed .. "s")
    end
  end

  it("longer than 4096 bytes is not an answer, whatever its status", function()
    for _, status in ipairs({ "401 Unauthorized", "403 Forbidden", "404 Not Found",
                              "500 Internal Server Error" }) do
      check([[function(req, conn)
        respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100000\r\n\r\n" .. string.rep("x", 4097))
        conn:sleep(60)
      end]], status, "4096")
    end
  end)

  it("that stalls is not an answer, and says its body stalled", function()
    for _, status in ipairs({ "403 Forbidden", "500 Internal Server Error" }) do
      check([[function(req, conn)
        respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100\r\n\r\npartial error")
        conn:sleep(60)
      end]], status, "body")
    end
  end)

  it("of a 404 that never finishes is not an answer, stalled or cut", function()
    check([[function(req, conn)
      respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100\r\n\r\nPATH_NOT_FOUND:")
      conn:sleep(60)
    end]], "404 Not Found", "stalled")
    check([[function(req, conn)
      respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100\r\n\r\nPATH_NOT_FOUND:")
      conn:close()
    end]], "404 Not Found", "could not be read")
  end)
end)

describe("the bound on an error body", function()
  local server
  after_each(function() if server then server:stop() end end)

  it("is the sandbox's header timeout when that is shorter than the default", function()
    server = require("support.fake_http").start([[local respond = require 'support.respond'
      return respond.agent(function(req, conn)
        respond.raw(conn, "HTTP/1.1 403 Forbidden\r\nContent-Length: 100\r\n\r\npartial")
        conn:sleep(60)
      end)]])
    local sb = assert(sandkit.sandbox{ provider = "agent", url = server.url, token = "t",
      header_timeout = 0.5 })
    local session = assert(sb:create{ id = "s1" })
    local started = core.now()
    local ok, err = session:mkdir("/d")
    local elapsed = core.now() - started
    assert.is_nil(ok)
    assert.matches("stalled: not complete within 0.5s", tostring(err), 1, true)
    assert.is_true(elapsed < 3, "a stalled 403 body held the caller " .. elapsed .. "s")
    -- Set explicitly, it is what it says.
    sb = assert(sandkit.sandbox{ provider = "agent", url = server.url, token = "t",
      header_timeout = 0.5, error_body_timeout = 0.2 })
    ok, err = assert(sb:create{ id = "s2" }):mkdir("/d")
    assert.is_nil(ok)
    assert.matches("within 0.2s", tostring(err), 1, true)
  end)
end)

describe("capabilities of the agent provider", function()
  local session, server
  after_each(function() if server then server:stop() end end)

  it("refuse what it cannot do without sending anything", function()
    session, server = agent_session.open([[function(req, conn) respond.status(conn, "200 OK", "") end]])
    local before = #server:requests()
    for _, call in ipairs({
      function() return session:preview(8080) end,
      function() return session:pause() end,
      function() return session:resume() end,
      function() return session:snapshot() end,
      function() return session.sandbox:list() end,
      function() return session:terminate() end,
    }) do
      local ok, err = call()
      assert.is_nil(ok)
      assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    end
    assert.equal(before, #server:requests(), "a refusal costs no request")
  end)
end)
