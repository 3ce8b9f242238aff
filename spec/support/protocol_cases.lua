--- The agent protocol client (docs/protocol.md §4) against fake agents that send exact bytes
-- over real sockets, as one table of cases that each transport runs: spec/protocol_spec.lua
-- over libcurl, spec/nginx_protocol_spec.lua over cosockets inside a real nginx. Every
-- failure case of the original protocol client's tests is here with the same meaning.
--
-- A case is { group, name, route, health, options, between, act, check }:
--   route    the fake agent's answer to every request but health: a Lua function expression
--            (req, conn) run in the fake server's process, with `respond` in scope
--   health   optional: a Lua table expression of fields the health answer sets (its features)
--   options  sandbox options on top of the short timeouts below
--   between  optional function(server), run in the spec's process once the session is open
--   act      function(session, h) run where the transport runs (the spec's process, or an
--            nginx worker); returns plain data (h.plain turns errors into tables)
--   check    function(result, server) run in the spec's process with busted's asserts; the
--            result has made a JSON round trip on both transports, so both see the same shapes
-- This module is loaded inside nginx too: nothing here may need busted itself.

local core = require "sandkit.core"
local sandkit = require "sandkit"
local cjson = require "cjson"
-- busted's assert is luassert; a module required by a spec does not see the spec's globals.
local assert = require "luassert"

local protocol_cases = {}

--- Timeouts short enough that a stall is exercised in a fraction of a second. The header bound
-- is given by the cases whose behaviour it is (an agent that does not answer, a slow body after
-- prompt headers); every other case has ANSWER_TIMEOUT, as its fake answers at once and a bound of
-- 0.3 s would fail a prompt answer whenever a busy machine delays the fake's process that long.
protocol_cases.HEADER_TIMEOUT = 0.3
protocol_cases.ANSWER_TIMEOUT = 5
protocol_cases.ERROR_BODY_TIMEOUT = 0.3

--- A sandkit error as plain data; anything else as it is.
local function plain(v)
  if not sandkit.errors.is_error(v) then return v end
  return { is_error = true, code = v.code, retryable = v.retryable, failure = v.failure,
    status = v.status, sent = v.sent, path = v.path, field = v.field, reason = v.reason,
    operation = v.operation, message = v.message, text = tostring(v), cause = plain(v.cause) }
end
protocol_cases.plain = plain

--- Every item a run loop yields: frames, then the error that ended it, if any.
local function collect(session, argv, opts)
  local items = {}
  local frames = session:run(argv or { "true" }, opts or { timeout = 10 })
  local ok, err = pcall(function()
    for frame in frames do items[#items + 1] = frame end
  end)
  frames:close()
  if not ok then items[#items + 1] = plain(err) end
  return items
end

local helpers = { plain = plain, collect = collect, now = core.now }

--- A case's option with this value is left out, so the sandbox's default applies.
protocol_cases.UNSET = setmetatable({}, { __tostring = function() return "unset" end })

--- Opens a session on the fake agent at url through the public API (the agent provider).
function protocol_cases.open(url, options)
  local sb_options = { provider = "agent", url = url, token = "test-token",
    header_timeout = protocol_cases.ANSWER_TIMEOUT,
    error_body_timeout = protocol_cases.ERROR_BODY_TIMEOUT, grace = 1 }
  for k, v in pairs(options or {}) do
    if v == protocol_cases.UNSET then sb_options[k] = nil else sb_options[k] = v end
  end
  local sandbox = assert(sandkit.sandbox(sb_options))
  return assert(sandbox:create{ id = "s1" })
end

--- Starts the fake agent of a case: health answers ready (with the case's health fields), the
-- route answers the rest.
function protocol_cases.fake_agent(route, health)
  return require("support.fake_http").start("local respond = require 'support.respond'\n"
    .. "return respond.agent(" .. route .. ", " .. (health or "nil") .. ")\n")
end

--- Declares every case as a test, grouped as the table groups them. `busted` holds busted's
-- describe, it and after_each (a module does not see a spec's globals); run(i, case, server)
-- opens a session on the case's fake agent where the transport under test runs, runs the
-- case's `between`, then its act, and returns protocol_cases.act's text.
function protocol_cases.declare(busted, run)
  local list, by_name = {}, {}
  for i, c in ipairs(protocol_cases.cases) do
    if not by_name[c.group] then
      by_name[c.group] = { name = c.group, indexes = {} }
      list[#list + 1] = by_name[c.group]
    end
    table.insert(by_name[c.group].indexes, i)
  end
  for _, group in ipairs(list) do
    busted.describe(group.name, function()
      local server
      busted.after_each(function()
        if server then server:stop() end
        server = nil
      end)
      for _, i in ipairs(group.indexes) do
        local c = protocol_cases.cases[i]
        busted.it(c.name, function()
          server = protocol_cases.fake_agent(c.route, c.health)
          c.check(protocol_cases.result(run(i, c, server)), server)
        end)
      end
    end)
  end
end

--- Runs case number i's act on session and returns its result as JSON text.
function protocol_cases.act(i, session)
  return cjson.encode({ result = protocol_cases.cases[i].act(session, helpers) })
end

--- The result of protocol_cases.act, back as data.
function protocol_cases.result(text)
  return cjson.decode(text).result
end

local cases = {}
protocol_cases.cases = cases

local group
local function case(name, t)
  t.group, t.name = group, name
  cases[#cases + 1] = t
end

local function items_of(session) return collect(session) end

local function exec_error(session)
  local result, err = session:exec({ "true" }, { timeout = 10 })
  return { result = result, err = plain(err) }
end

local function found(text, needle) return text:find(needle, 1, true) ~= nil end

-- The exec stream -------------------------------------------------------------------------------

group = "the exec stream"

case("decodes frames in order with a real exit code", {
  route = [[function(req, conn)
    respond.frames(conn, {
      '{"t":"stdout","seq":0,"data":"aGk="}\n',
      '{"t":"stderr","seq":1,"data":"b29wcw=="}\n',
      '{"t":"exit","code":7,"truncated":false}\n' })
  end]],
  act = items_of,
  check = function(items)
    assert.equal(3, #items)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.same({ type = "stderr", seq = 1, data = "oops" }, items[2])
    assert.same({ type = "exit", code = 7, truncated = false }, items[3])
  end,
})

case("reassembles a frame split across chunks", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"stdo', 'ut","seq":0,"data":"aGk="}\n{"t":"ex',
      'it","code":0,"truncated":false}\n' }, 0.02)
  end]],
  act = items_of,
  check = function(items)
    assert.equal(2, #items, "a split frame must not become two frames or an error")
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end,
})

case("reads a frame line longer than the transfer's buffer, arriving in small pieces", {
  -- 200 KiB of payload is a line of about 273 KB: longer than the 128 KiB a transfer holds,
  -- so the line must be handed to the decoder while it is still arriving. ("zzz" is "enp6".)
  route = [[function(req, conn)
    local line = '{"t":"stdout","seq":0,"data":"' .. string.rep("enp6", 68267) .. '"}\n'
    local chunks = {}
    for i = 1, #line, 7000 do chunks[#chunks + 1] = line:sub(i, i + 6999) end
    chunks[#chunks + 1] = '{"t":"exit","code":0}\n'
    respond.frames(conn, chunks)
  end]],
  act = items_of,
  check = function(items)
    assert.equal(2, #items)
    assert.equal(204801, #items[1].data)
    assert.equal(string.rep("z", 204801), items[1].data)
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end,
})

case("tolerates CRLF line ends, unknown fields and a missing truncated", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"stdout","seq":0,"data":"aGk=","extra":{"a":[1,2]}}\r\n\r\n',
      '{"t":"exit","code":0}\r\n' })
  end]],
  act = items_of,
  check = function(items)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end,
})

case("leaves the outcome unknown when a frame arrives but does not decode", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"stdout","seq":0,"data":"!!not base64!!"}\n' })
  end]],
  act = items_of,
  check = function(items)
    local err = items[1]
    assert.is_true(err.is_error)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable, "the command ran; a repeat would run it twice")
    assert.is_true(found(err.text, "base64"))
  end,
})

case("leaves the outcome unknown when a frame does not parse", {
  route = [[function(req, conn) respond.frames(conn, { '{not json at all}\n' }) end]],
  act = items_of,
  check = function(items)
    local err = items[1]
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
    assert.is_true(found(err.text, "did not parse"))
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", err.cause.code)
  end,
})

for what, line in pairs{ type = '{"t":"error","t":"exit","code":0}\n', code = '{"t":"exit","code":1,"code":0}\n' } do
  case("leaves the outcome unknown when a frame gives a member twice (its " .. what .. ")", {
    route = "function(req, conn) respond.frames(conn, { " .. string.format("%q", line) .. " }) end",
    act = items_of,
    check = function(items)
      assert.equal(1, #items, "neither reading of the frame is delivered")
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
      assert.is_false(items[1].retryable)
      assert.is_true(found(items[1].text, "appears twice"), items[1].text)
    end,
  })
end

-- The decoder reads an exit code as a 32-bit integer (src/common/frames.c): past it the frame is not an ending.
for _, pair in ipairs{ { "2^31", '{"t":"exit","code":2147483648}\n' },
    { "-2^31 - 1", '{"t":"exit","code":-2147483649}\n' } } do
  local what, line = pair[1], pair[2]
  case("leaves the outcome unknown when an exit code is outside 32 bits (" .. what .. ")", {
    route = "function(req, conn) respond.frames(conn, { " .. string.format("%q", line) .. " }) end",
    act = items_of,
    check = function(items)
      assert.equal(1, #items, "no exit is delivered")
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
      assert.is_false(items[1].retryable)
      assert.is_true(found(items[1].text, "did not parse"), items[1].text)
    end,
  })
end

-- A signal is a number from 0 to 2^31 - 1: outside it the exit stands, without a signal.
for _, pair in ipairs{ { "9", 9 }, { "-1" }, { "2147483648" } } do
  local signal, kept = pair[1], pair[2]
  case("keeps an exit frame's signal only from 0 to 2^31 - 1 (" .. signal .. ")", {
    route = string.format([[function(req, conn)
      respond.frames(conn, { '{"t":"exit","code":1,"signal":%s}\n' })
    end]], signal),
    act = items_of,
    check = function(items)
      assert.same({ type = "exit", code = 1, truncated = false, signal = kept }, items[1])
    end,
  })
end

--- A failure mid-chunk ends the stream there: the exit frame behind it never surfaces.
local function only_the_failure(items)
  assert.equal(1, #items, "the exit frame must not follow the failure")
  assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
end

case("ends the stream mid-chunk at an unestablished outcome, delivering no later exit", {
  route = [[function(req, conn)
    respond.frames(conn, { '{not json at all}\n{"t":"exit","code":0,"truncated":false}\n' })
  end]],
  act = items_of,
  check = only_the_failure,
})

case("ends the stream mid-chunk at a decode failure, delivering no later exit", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"stdout","seq":0,"data":"!!"}\n{"t":"exit","code":0,"truncated":false}\n' })
  end]],
  act = items_of,
  check = only_the_failure,
})

case("reports a stream without a terminal frame as an unknown outcome, after its output", {
  route = [[function(req, conn) respond.frames(conn, { '{"t":"stdout","seq":0,"data":"aGk="}\n' }) end]],
  act = items_of,
  check = function(items)
    assert.equal(2, #items)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1], "the stdout frame still arrives")
    local err = items[2]
    assert.is_true(found(err.text, "without a terminal frame"))
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
  end,
})

case("does not count a final line without its newline as the terminal frame", {
  route = [[function(req, conn) respond.frames(conn, { '{"t":"exit","code":0}' }) end]],
  act = items_of,
  check = function(items)
    assert.equal(1, #items)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
  end,
})

case("surfaces an error frame as an error, not a silent end", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"error","code":"deadlineExceeded","message":"exceeded its 300ms deadline"}\n' })
  end]],
  act = items_of,
  check = function(items)
    assert.equal(1, #items)
    local err = items[1]
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("deadlineExceeded", err.failure)
    assert.is_true(found(err.text, "deadlineExceeded"))
    assert.is_true(found(err.text, "exceeded its 300ms deadline"))
  end,
})

case("reports a body that fails mid-way as an unknown outcome", {
  route = [[function(req, conn)
    respond.chunked_start(conn, "200 OK")
    respond.chunk(conn, '{"t":"stdout","seq":0,"data":"aGk="}\n')
    conn:close()
  end]],
  act = items_of,
  check = function(items)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, items[1])
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[2].code)
    assert.is_true(found(items[2].text, "the output stream failed"))
  end,
})

case("does not cut off a slow body after prompt headers", {
  -- Each frame comes after a pause twice the header bound.
  route = string.format([[function(req, conn)
    respond.frames(conn, { '{"t":"stdout","seq":0,"data":"aGk="}\n',
      '{"t":"exit","code":0,"truncated":false}\n' }, %g)
  end]], 2 * protocol_cases.HEADER_TIMEOUT),
  options = { header_timeout = protocol_cases.HEADER_TIMEOUT },
  act = items_of,
  check = function(items)
    assert.equal(2, #items, "every frame arrived")
    assert.same({ type = "exit", code = 0, truncated = false }, items[2])
  end,
})

case("fails an open stream that outlives the command's timeout plus the grace", {
  route = [[function(req, conn)
    respond.chunked_start(conn, "200 OK")
    respond.chunk(conn, '{"t":"stdout","seq":0,"data":"aGk="}\n')
    conn:sleep(30)
  end]],
  options = { grace = 0.3 },
  act = function(session, h)
    local started = h.now()
    local items = h.collect(session, { "sleep", "600" }, { timeout = 0.2 })
    return { items = items, elapsed = h.now() - started }
  end,
  check = function(r)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, r.items[1])
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.items[2].code)
    assert.is_true(found(r.items[2].text, "no terminal frame arrived within"))
    -- The bound is the behaviour: timeout + grace is 0.5 s; the agent would stall for 30.
    assert.is_true(r.elapsed < 5, "refused at the bound, not at the agent's leisure")
  end,
})

case("sends the argv, the timeout in milliseconds, cwd and env", {
  route = [[function(req, conn) respond.frames(conn, { '{"t":"exit","code":0}\n' }) end]],
  act = function(session, h)
    return h.collect(session, { "sh", "-c", "echo hi" }, { timeout = 2.5, cwd = "/app", env = { K = "V" } })
  end,
  check = function(_, server)
    local sent = cjson.decode(server:requests_to("/v1/exec")[1].body)
    assert.same({ "sh", "-c", "echo hi" }, sent.command)
    assert.equal(2500, sent.timeoutMs)
    assert.equal("/app", sent.cwd)
    assert.same({ K = "V" }, sent.env)
    assert.equal("Bearer test-token", server:requests_to("/v1/exec")[1].headers.authorization)
  end,
})

case("ends once its iterator is closed, without raising", {
  route = [[function(req, conn)
    respond.chunked_start(conn, "200 OK")
    respond.chunk(conn, '{"t":"stdout","seq":0,"data":"aGk="}\n')
    conn:sleep(30)
  end]],
  act = function(session)
    local frames = session:run({ "yes" }, { timeout = 60 })
    local first = frames()
    frames:close()
    local ok, after = pcall(frames)
    return { first = first, ok = ok, after = plain(after) }
  end,
  check = function(r)
    assert.same({ type = "stdout", seq = 0, data = "hi" }, r.first)
    assert.is_true(r.ok, "a closed iterator ends, it does not raise")
    assert.is_nil(r.after)
  end,
})

-- Keep-alives (docs/protocol.md §6 keepalive) ----------------------------------------------------

group = "keep-alives"

--- Frames with keep-alives between and inside chunks; the exec body the agent got is echoed
-- in the stdout frame, so the check sees what was asked.
local KEEPALIVE_ROUTE = [[function(req, conn)
  respond.frames(conn, { '{"t":"keepalive"}\n{"t":"keep', 'alive"}\n',
    '{"t":"stdout","seq":0,"data":"' .. require("sandkit.core").b64encode(req.body) .. '"}\n',
    '{"t":"keepalive"}\n', '{"t":"exit","code":0}\n' }, 0.02)
end]]

--- The exec body the agent got, from the stdout frame KEEPALIVE_ROUTE writes, and the kinds of
-- every item the loop yielded.
local function asked(items)
  local kinds = {}
  for i, item in ipairs(items) do kinds[i] = item.type or item.code end
  return { body = items[1].data and cjson.decode(items[1].data), kinds = kinds, items = items }
end

case("are asked of an agent that offers them, consumed, and never yielded", {
  route = KEEPALIVE_ROUTE,
  health = [[{ features = { "keepalive" } }]],
  options = { keepalive = 0.25 },
  act = function(session) return asked(collect(session)) end,
  check = function(r)
    assert.equal(250, r.body.keepaliveMs)
    assert.same({ "stdout", "exit" }, r.kinds)
  end,
})

case("are never asked of an agent that does not offer them", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"stdout","seq":0,"data":"' .. require("sandkit.core").b64encode(req.body)
      .. '"}\n', '{"t":"exit","code":0}\n' })
  end]],
  options = { keepalive = 0.25 },
  act = function(session) return asked(collect(session)) end,
  check = function(r)
    assert.is_nil(r.body.keepaliveMs)
    assert.same({ "stdout", "exit" }, r.kinds)
  end,
})

case("are not asked for without the keepalive option, and one sent unasked fails the stream", {
  route = KEEPALIVE_ROUTE,
  health = [[{ features = { "keepalive" } }]],
  options = { keepalive = false },
  act = function(session) return collect(session) end,
  check = function(items)
    assert.equal(1, #items)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
    assert.matches("a keepalive frame, which this stream did not ask for", items[1].text, 1, true)
  end,
})

case("fail the stream when one carries a seq", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"keepalive","seq":0}\n', '{"t":"exit","code":0}\n' })
  end]],
  health = [[{ features = { "keepalive" } }]],
  options = { keepalive = 1 },
  act = function(session) return collect(session) end,
  check = function(items)
    assert.equal(1, #items)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[1].code)
    assert.matches("a keepalive frame carries nothing but `t`", items[1].text, 1, true)
  end,
})

-- Binary frames (docs/protocol.md §6 binaryFrames) ----------------------------------------------

group = "binary frames"

local BINARY = [[{ features = { "binaryFrames" } }]]

--- Output with a NUL, a newline and a byte past ASCII, the exec body the agent got as a second
-- output frame, and an exit, cut across frames and inside them, with pauses between.
local BINARY_ROUTE = [[function(req, conn)
  local f = respond.binary_frame
  local body = f("o", 0, "a\0\n\255") .. f("e", 1, req.body) .. f("j", '{"t":"exit","code":4}')
  respond.binary_frames(conn, { body:sub(1, 3), body:sub(4, 20), body:sub(21) }, 0.02)
end]]

case("are asked of an agent that offers them, and carry output as its bytes", {
  route = BINARY_ROUTE,
  health = BINARY,
  act = function(session) return collect(session) end,
  check = function(items)
    assert.equal(3, #items)
    assert.same({ type = "stdout", seq = 0, data = "a\0\n\255" }, items[1])
    assert.equal("binary", cjson.decode(items[2].data).framing)
    assert.same({ type = "exit", code = 4, truncated = false }, items[3])
  end,
})

case("are never asked of an agent that does not offer them, whose NDJSON is read as ever", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"stdout","seq":0,"data":"' .. require("sandkit.core").b64encode(req.body)
      .. '"}\n', '{"t":"exit","code":0}\n' })
  end]],
  act = function(session) return collect(session) end,
  check = function(items)
    assert.equal(2, #items)
    assert.is_nil(cjson.decode(items[1].data).framing)
    assert.equal("exit", items[2].type)
  end,
})

case("are read as NDJSON when the answer says it is NDJSON, as an agent refusing the request writes it", {
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"error","code":"requestInvalid","message":"no"}\n' })
  end]],
  health = BINARY,
  act = function(session) return collect(session) end,
  check = function(items)
    assert.equal(1, #items)
    assert.equal("SANDBOX_COMMAND_FAILED", items[1].code)
    assert.equal("requestInvalid", items[1].failure)
  end,
})

case("take the keep-alives a stream asked for as frames of their own", {
  route = [[function(req, conn)
    local f = respond.binary_frame
    local ka = f("j", '{"t":"keepalive"}')
    respond.binary_frames(conn, { ka .. f("o", 0, "x") .. ka:sub(1, 7), ka:sub(8) .. ka,
      f("j", '{"t":"exit","code":0}') }, 0.02)
  end]],
  health = [[{ features = { "binaryFrames", "keepalive" } }]],
  options = { keepalive = 0.25 },
  act = function(session) return collect(session) end,
  check = function(items)
    assert.same({ { type = "stdout", seq = 0, data = "x" }, { type = "exit", code = 0, truncated = false } },
      items)
  end,
})

for _, bad in ipairs({
  { "a frame whose length is over the decoder's limit", [["o\0\16\0\1" .. string.rep("x", 64)]],
    "a frame exceeded the decoder's limit" },
  { "a frame of a kind it does not know", [[respond.binary_frame("x", "{}")]], "unknown binary frame kind" },
  { "output in a JSON frame", [[respond.binary_frame("j", '{"t":"stdout","seq":0,"data":"YQ=="}')]],
    "output in a JSON frame" },
}) do
  case("fail the stream on " .. bad[1] .. ", the outcome unknown and nothing after it", {
    route = [[function(req, conn)
      respond.binary_frames(conn, { respond.binary_frame("o", 0, "ok") .. ]] .. bad[2] .. [[,
        respond.binary_frame("j", '{"t":"exit","code":0}') })
    end]],
    health = BINARY,
    act = function(session) return collect(session) end,
    check = function(items)
      assert.equal(2, #items)
      assert.same({ type = "stdout", seq = 0, data = "ok" }, items[1])
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[2].code)
      assert.matches(bad[3], items[2].text, 1, true)
    end,
  })
end

case("fail the stream when the body ends inside a frame, the outcome unknown", {
  route = [[function(req, conn)
    respond.binary_frames(conn, { respond.binary_frame("o", 0, "ok") .. respond.binary_frame("j",
      '{"t":"exit","code":0}'):sub(1, 12) })
  end]],
  health = BINARY,
  act = function(session) return collect(session) end,
  check = function(items)
    assert.equal(2, #items)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", items[2].code)
    assert.matches("ended without a terminal frame", items[2].text, 1, true)
  end,
})

-- An exec answer --------------------------------------------------------------------------------

group = "an exec answer"

case("that is a bodyless 502 is not the agent refusing but an unknown outcome", {
  route = [[function(req, conn) respond.status(conn, "502 Bad Gateway", "") end]],
  act = exec_error,
  check = function(r)
    assert.is_nil(r.result)
    assert.is_false(found(r.err.text, "agentRefused"), "a proxy 502 is not the agent refusing")
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_false(r.err.retryable)
  end,
})

case("that is a 500 with a body is an unknown outcome that keeps the body's text", {
  route = [[function(req, conn) respond.status(conn, "500 Internal Server Error", "spawn failed: ENOMEM") end]],
  act = exec_error,
  check = function(r)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_true(found(r.err.text, "spawn failed: ENOMEM"))
  end,
})

case("that is a 504 with an HTML page is an unknown outcome and not retryable", {
  route = [[function(req, conn)
    respond.status(conn, "504 Gateway Time-out", "<html><body>504 Gateway Time-out</body></html>", "text/html")
  end]],
  act = exec_error,
  check = function(r)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_false(r.err.retryable, "the command may still be running behind the gateway")
  end,
})

case("that is a 400 is the agent answering", {
  route = [[function(req, conn) respond.status(conn, "400 Bad Request", "PATH_REFUSED: Path '/..' refused") end]],
  act = exec_error,
  check = function(r)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("agentRefused", r.err.failure)
    assert.equal(400, r.err.status)
    assert.is_true(found(r.err.text, "PATH_REFUSED: Path '/..' refused"))
  end,
})

local REDIRECT = [[function(req, conn)
  if req.path == "/elsewhere" then return respond.frames(conn, { '{"t":"exit","code":0}\n' }) end
  respond.raw(conn, "HTTP/1.1 307 Temporary Redirect\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
end]]

case("that is a redirect is not followed, and is the agent answering", {
  route = REDIRECT,
  act = exec_error,
  check = function(r, server)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("agentRefused", r.err.failure)
    assert.is_false(r.err.retryable, "asking again gets the same redirect")
    assert.equal(307, r.err.status)
    assert.equal(0, #server:requests_to("/elsewhere"), "the redirect was followed")
    assert.equal(1, #server:requests_to("/v1/exec"))
  end,
})

case("to a file read that is a redirect is not followed, and is the agent answering", {
  route = REDIRECT,
  act = function(session)
    local bytes, err = session:read_file("/a.txt")
    return { bytes = bytes, err = plain(err) }
  end,
  check = function(r, server)
    assert.is_nil(r.bytes)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("agentRefused", r.err.failure)
    assert.is_false(r.err.retryable, "asking again gets the same redirect")
    assert.equal(0, #server:requests_to("/elsewhere"), "the redirect was followed")
  end,
})

for _, status in ipairs{ "301 Moved Permanently", "302 Found" } do
  case("that is a " .. status .. " is the agent answering, for a command and a mkdir alike", {
    route = string.format([[function(req, conn)
      respond.raw(conn, "HTTP/1.1 %s\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 5\r\n\r\nmoved")
    end]], status),
    act = function(session)
      local _, mkdir_err = session:mkdir("/d")
      local _, exec_err = session:exec({ "true" }, { timeout = 10 })
      return { plain(mkdir_err), plain(exec_err) }
    end,
    check = function(errs)
      for _, err in ipairs(errs) do
        assert.equal("SANDBOX_COMMAND_FAILED", err.code, err.operation)
        assert.equal("agentRefused", err.failure)
        assert.is_false(err.retryable, "asking again gets the same redirect")
        assert.equal(tonumber(status:match("^%d+")), err.status)
      end
    end,
  })
end

-- A request the agent does not answer -----------------------------------------------------------

group = "a request the agent does not answer"

local STALL = [[function(req, conn) conn:sleep(60) end]]

case("is refused within the bound, saying the agent did not answer", {
  route = STALL,
  options = { header_timeout = protocol_cases.HEADER_TIMEOUT },
  act = function(session, h)
    local started = h.now()
    local r = exec_error(session)
    r.elapsed = h.now() - started
    return r
  end,
  check = function(r)
    assert.is_nil(r.result)
    -- The agent would answer after 60 s; refusing near the 0.3 s bound is the property.
    assert.is_true(r.elapsed < 3, "refused at the bound")
    assert.is_true(found(r.err.text, "did not answer"))
  end,
})

case("is not retryable for runCommand: the command may have started", {
  route = STALL,
  options = { header_timeout = protocol_cases.HEADER_TIMEOUT },
  act = exec_error,
  check = function(r)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_false(r.err.retryable)
    assert.is_true(found(r.err.text, "did not answer"))
    assert.is_true(found(r.err.text, "may have taken effect"))
  end,
})

case("stays retryable for a file read, which is idempotent", {
  route = STALL,
  options = { header_timeout = protocol_cases.HEADER_TIMEOUT },
  act = function(session)
    local bytes, err = session:read_file("/a.txt")
    return { bytes = bytes, err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.bytes)
    assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    assert.is_true(r.err.retryable)
    assert.is_true(found(r.err.text, "did not answer"))
  end,
})

case("whose connection drops before any headers is a runCommand that is not retryable", {
  route = [[function(req, conn) conn:close() end]],
  act = exec_error,
  check = function(r)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_false(r.err.retryable)
    assert.is_true(found(r.err.text, "may have taken effect"))
  end,
})

case("is delivered exactly once even when its pooled connection died", {
  -- Health leaves a pooled keep-alive connection; the agent then reads the exec and closes
  -- without answering. A client that reused the pooled connection would have libcurl send
  -- the exec a second time on a fresh one.
  route = [[function(req, conn) conn:close() end]],
  act = exec_error,
  check = function(r, server)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.equal(1, #server:requests_to("/v1/exec"), "the command must reach the agent once")
  end,
})

case("on a closed connection is reported as never reached when nothing listens", {
  route = [[function(req, conn) end]],
  between = function(server) server:stop() end,
  act = function(session)
    local bytes, err = session:read_file("/a.txt")
    return { bytes = bytes, err = plain(err) }
  end,
  check = function(r)
    assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    assert.is_false(r.err.sent)
    assert.is_true(found(r.err.text, "never reached the agent"))
  end,
})

case("that never connected is still a runCommand with an unknown outcome, whose error says it was not sent", {
  route = [[function(req, conn) end]],
  between = function(server) server:stop() end,
  act = exec_error,
  check = function(r)
    assert.is_nil(r.result)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_false(r.err.retryable)
    assert.is_false(r.err.sent)
    assert.is_true(found(r.err.text, "never reached the agent"))
  end,
})

-- A zero timeout --------------------------------------------------------------------------------

group = "a zero timeout"

local OK = [[function(req, conn) respond.status(conn, "200 OK", "") end]]

case("is refused locally and sends nothing", {
  route = OK,
  act = function(session)
    local seen = {}
    for _, timeout in ipairs({ 0, -1, 0.0004 }) do
      local result, err = session:exec({ "true" }, { timeout = timeout })
      local job, jerr = session:start_job({ "true" }, { timeout = timeout })
      seen[#seen + 1] = { result = result, err = plain(err), job = job and job.id, jerr = plain(jerr) }
    end
    return seen
  end,
  check = function(seen, server)
    assert.equal(3, #seen)
    for _, s in ipairs(seen) do
      assert.is_nil(s.result)
      assert.equal("INVALID_INPUT", s.err.code)
      assert.equal("timeout", s.err.field)
      assert.is_true(found(s.err.text, "non-zero timeout"))
      assert.is_nil(s.job)
      assert.equal("INVALID_INPUT", s.jerr.code)
    end
    assert.equal(0, #server:requests_to("/v1/exec"))
    assert.equal(0, #server:requests_to("/v1/jobs/start"))
  end,
})

case("is the refusal a command without any timeout gets too", {
  route = OK,
  act = function(session)
    local _, err = session:exec({ "true" })
    return plain(err)
  end,
  check = function(err, server)
    assert.equal("INVALID_INPUT", err.code)
    assert.is_true(found(err.message, "needs a timeout in seconds"), err.message)
    assert.equal(0, #server:requests_to("/v1/exec"))
  end,
})

-- Jobs ------------------------------------------------------------------------------------------

group = "jobs"

case("start, poll from their cursor and cancel", {
  route = [[function(req, conn)
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
  end]],
  act = function(session)
    local job = assert(session:start_job({ "/bin/sleep", "600" }, { timeout = 600 }))
    local first = assert(job:poll())
    local second = assert(job:poll(first.next))
    return { id = job.id, first = first, second = second, cancelled = job:cancel() }
  end,
  check = function(r, server)
    assert.equal("j1", r.id)
    assert.is_true(r.first.running)
    assert.same({ { type = "stdout", seq = 0, data = "hi" } }, r.first.frames, "base64 is decoded")
    assert.is_nil(r.first.exit)
    assert.is_nil(r.first.error)
    assert.equal(0, r.first.next, "the page names the cursor for the next poll")
    assert.is_false(r.second.running)
    assert.equal(0, #r.second.frames, "nothing follows the last frame")
    assert.equal(0, r.second.next, "a page without frames keeps the cursor it was given")
    assert.same({ code = 7, truncated = false }, r.second.exit, "the ending is the envelope's")
    assert.is_true(r.cancelled)
    local cursors = {}
    for _, req in ipairs(server:requests_to("/v1/jobs/poll")) do
      cursors[#cursors + 1] = cjson.decode(req.body).sinceSeq
    end
    assert.same({ cjson.null, 0 }, cursors,
      "the caller's cursor has to reach the agent, or every poll replays the whole output")
  end,
})

case("whose start meets a server error leave the outcome unknown", {
  route = [[function(req, conn) respond.status(conn, "500 Internal Server Error", "spawn failed") end]],
  act = function(session)
    local job, err = session:start_job({ "/bin/sleep", "600" }, { timeout = 600 })
    return { job = job and job.id, err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.job)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_false(r.err.retryable, "the agent may have taken the command")
    assert.is_true(found(r.err.text, "sandbox.jobStart"))
  end,
})

case("whose poll meets a server error stay retryable", {
  route = [[function(req, conn) respond.status(conn, "503 Service Unavailable", "") end]],
  act = function(session)
    local page, err = session:job("j1"):poll(4)
    return { page = page, err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.page)
    assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    assert.is_true(r.err.retryable, "the job is untouched")
  end,
})

case("whose poll body ends early stay retryable", {
  route = [[function(req, conn)
    respond.chunked_start(conn, "200 OK", "application/json")
    respond.chunk(conn, '{"running":tr')
    conn:close()
  end]],
  act = function(session)
    local page, err = session:job("j1"):poll()
    return { page = page, err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.page)
    assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    assert.is_true(r.err.retryable, "polling again costs nothing")
  end,
})

case("whose cancel is refused hear the agent's answer, its code as err.reason", {
  route = [[function(req, conn) respond.status(conn, "404 Not Found", "JOB_NOT_FOUND: no job j1") end]],
  act = function(session)
    local ok, err = session:job("j1"):cancel()
    return { ok = ok, err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.ok)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("JOB_NOT_FOUND", r.err.reason)
    assert.is_true(found(r.err.text, "JOB_NOT_FOUND"))
  end,
})

case("whose start names an id the agent holds for another request hear JOB_ID_CONFLICT, never retryable", {
  route = [[function(req, conn)
    respond.status(conn, "409 Conflict", "JOB_ID_CONFLICT: job 'build-7' was started with another command")
  end]],
  act = function(session)
    local id, err = session:start_job({ "make", "other" }, { timeout = 10, id = "build-7" })
    return { id = id, err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.id)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("JOB_ID_CONFLICT", r.err.reason)
    assert.is_false(r.err.retryable, "the same start gets the same refusal")
    assert.equal(409, r.err.status)
  end,
})

case("whose start names an id may be resent only when the agent promises idempotency", {
  route = [[function(req, conn) conn:close() end]],
  act = function(session)
    local _, err = session:start_job({ "true" }, { timeout = 10, id = "build-1" })
    local _, anonymous = session:start_job({ "true" }, { timeout = 10 })
    return { err = plain(err), anonymous = plain(anonymous) }
  end,
  check = function(r, server)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_true(r.err.retryable, "the agent advertised jobIdempotency and the start named its job")
    assert.is_false(r.anonymous.retryable, "an anonymous start could run twice")
    assert.equal("build-1", cjson.decode(server:requests_to("/v1/jobs/start")[1].body).jobId)
  end,
})

case("deliver their frames once each and end with the exit frame", {
  route = [[function(req, conn)
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
  end]],
  act = function(session)
    local seen = {}
    for frame in session:job("j1"):frames{ interval = 0.01 } do seen[#seen + 1] = frame end
    return seen
  end,
  check = function(seen)
    assert.same({ { type = "stdout", seq = 0, data = "one" }, { type = "stderr", seq = 1, data = "two" },
      { type = "stdout", seq = 3, data = "four" }, { type = "exit", code = 0, truncated = true } }, seen)
  end,
})

-- Polling the same cursor again returns the same frame: a retry would loop for ever.
for what, frame in pairs{ ["bad base64"] = '{"t":"stdout","seq":0,"data":"!!not base64!!"}',
    ["an unknown type"] = '{"t":"stdin","seq":0,"data":"aGk="}', ["no seq"] = '{"t":"stdout","data":"aGk="}',
    ["an exit code of 2^31"] = '{"t":"exit","code":2147483648}',
    ["an exit code of -2^31 - 1"] = '{"t":"exit","code":-2147483649}',
    -- Read by the stream's decoder (src/common/frames.c), a member is held to its type as on the stream.
    ["a truncated that is no boolean"] = '{"t":"exit","code":0,"truncated":"yes"}',
    ["a signal that is no integer"] = '{"t":"exit","code":1,"signal":"9"}',
    ["a signal that is null"] = '{"t":"exit","code":1,"signal":null}' } do
  case("whose poll carries a frame that cannot be read leave the outcome unknown (" .. what .. ")", {
    route = string.format([[function(req, conn)
      respond.status(conn, "200 OK", '{"running":true,"frames":[%s]}', "application/json")
    end]], frame),
    act = function(session)
      local page, err = session:job("j1"):poll()
      return { page = page, err = plain(err) }
    end,
    check = function(r)
      assert.is_nil(r.page)
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
      assert.is_false(r.err.retryable)
      assert.equal("sandbox.jobPoll", r.err.operation)
    end,
  })
end

-- The envelope's ending is held to the frame's ranges: an exitCode that is no 32-bit integer is
-- no ending to read, and the poll's answer stays the same however often it is asked.
for _, pair in ipairs{ { "2^31", "2147483648" }, { "-2^31 - 1", "-2147483649" }, { "a string", '"0"' },
    { "with a truncated that is no boolean", '0,"truncated":1' },
    { "with a signal that is no integer", '1,"signal":1.5' } } do
  case("whose poll's envelope carries an exitCode that cannot be read leave the outcome unknown ("
      .. pair[1] .. ")", {
    route = string.format([[function(req, conn)
      respond.status(conn, "200 OK", '{"running":false,"frames":[],"exitCode":%s}', "application/json")
    end]], pair[2]),
    act = function(session)
      local page, err = session:job("j1"):poll()
      return { page = page, err = plain(err) }
    end,
    check = function(r)
      assert.is_nil(r.page)
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
      assert.is_false(r.err.retryable)
      assert.is_true(found(r.err.text, "exitCode"), r.err.text)
    end,
  })
end

-- A page that names a member twice is one page to a reader keeping the first copy and another to
-- one keeping the last: each of these is read as a successful exit by lua-cjson.
for what, text in pairs{
    ["a frame's type"] = '{"running":false,"frames":[{"t":"error","t":"exit","code":0}]}',
    ["a frame's code"] = '{"running":false,"frames":[{"t":"exit","code":1,"code":0}]}',
    ["a frame's code, escaped"] = '{"running":false,"frames":[{"t":"exit","code":1,"\\u0063ode":0}]}',
    ["the envelope's exitCode"] = '{"running":false,"frames":[],"exitCode":1,"exitCode":0}',
    ["the envelope's running"] = '{"running":true,"running":false,"frames":[],"exitCode":0}',
    ["the envelope's frames"] = '{"running":false,"frames":[{"t":"error","code":"timeoutExceeded",'
      .. '"message":"over"}],"frames":[{"t":"exit","code":0}]}' } do
  case("whose poll names a member twice leave the outcome unknown (" .. what .. ")", {
    route = string.format([[function(req, conn)
      respond.status(conn, "200 OK", %q, "application/json")
    end]], text),
    act = function(session)
      local page, err = session:job("j1"):poll()
      return { page = page, err = plain(err) }
    end,
    check = function(r)
      assert.is_nil(r.page, "neither reading of the page is an answer")
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
      assert.is_false(r.err.retryable, "the agent answers the same poll with the same page")
      assert.equal("sandbox.jobPoll", r.err.operation)
      assert.is_true(found(r.err.text, "twice"), r.err.text)
    end,
  })
end

case("whose start answers with its id twice leave the outcome unknown", {
  route = [[function(req, conn)
    respond.status(conn, "200 OK", '{"jobId":"a","jobId":"b"}', "application/json")
  end]],
  act = function(session)
    local job, err = session:start_job({ "true" }, { timeout = 10 })
    return { job = job and job.id, err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.job, "neither id is the job's")
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", r.err.code)
    assert.is_false(r.err.retryable)
    assert.is_true(found(r.err.text, "twice"), r.err.text)
  end,
})

-- As on the stream, a signal outside 0..2^31 - 1 is no signal, and the exit stands: in an exit
-- frame of the poll and in its envelope alike.
local SIGNAL_PAGES = {
  { "whose poll carries an exit frame keep its signal",
    '{"running":false,"frames":[{"t":"exit","code":1,"signal":%s}]}' },
  { "whose poll's envelope carries a signal keep it",
    '{"running":false,"frames":[],"exitCode":1,"signal":%s}' },
}
for _, page in ipairs(SIGNAL_PAGES) do
  for _, pair in ipairs{ { "9", 9 }, { "-1" }, { "2147483648" } } do
    local signal, kept = pair[1], pair[2]
    case(page[1] .. " only from 0 to 2^31 - 1 (" .. signal .. ")", {
      route = string.format([[function(req, conn)
        respond.status(conn, "200 OK", %q, "application/json")
      end]], string.format(page[2], signal)),
      act = function(session) return assert(session:job("j1"):poll()).exit end,
      check = function(exit)
        assert.same({ code = 1, truncated = false, signal = kept }, exit)
      end,
    })
  end
end

-- The envelope's members are optional, and null is as good as absent (as for exitCode).
case("whose poll's envelope gives truncated and signal as null read them as absent", {
  route = [[function(req, conn)
    respond.status(conn, "200 OK", '{"running":false,"frames":[],"exitCode":3,"truncated":null,"signal":null}',
      "application/json")
  end]],
  act = function(session) return assert(session:job("j1"):poll()).exit end,
  check = function(exit)
    assert.same({ code = 3, truncated = false }, exit)
  end,
})

case("whose poll carries an exit frame take it as the job's ending", {
  route = [[function(req, conn)
    respond.status(conn, "200 OK", '{"running":false,"frames":[{"t":"stdout","seq":0,"data":"aGk="},'
      .. '{"t":"exit","code":3,"truncated":true}]}', "application/json")
  end]],
  act = function(session)
    local page = assert(session:job("j1"):poll())
    local seen = {}
    for frame in session:job("j1"):frames() do seen[#seen + 1] = frame end
    return { page = page, seen = seen }
  end,
  check = function(r)
    assert.same({ { type = "stdout", seq = 0, data = "hi" } }, r.page.frames)
    assert.same({ code = 3, truncated = true }, r.page.exit)
    assert.same({ { type = "stdout", seq = 0, data = "hi" }, { type = "exit", code = 3, truncated = true } },
      r.seen)
  end,
})

case("whose poll carries an error frame fail with it", {
  route = [[function(req, conn)
    respond.status(conn, "200 OK", '{"running":false,"frames":[{"t":"error","code":"timeoutExceeded",'
      .. '"message":"over its 100ms"}]}', "application/json")
  end]],
  act = function(session)
    local _, err = session:job("j1"):poll()
    return plain(err)
  end,
  check = function(err)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("timeoutExceeded", err.failure)
    assert.is_true(found(err.text, "over its 100ms"), err.text)
  end,
})

case("that end in an error raise it after delivering their output", {
  route = [[function(req, conn)
    respond.json(conn, "200 OK", { running = false, frames = { { t = "stdout", seq = 0, data = "aGk=" } },
      error = { code = "timeoutExceeded", message = "exceeded its 100ms timeout" } })
  end]],
  act = function(session)
    local seen = {}
    local ok, err = pcall(function()
      for frame in session:job("j1"):frames() do seen[#seen + 1] = frame end
    end)
    return { ok = ok, seen = seen, err = plain(err) }
  end,
  check = function(r)
    assert.is_false(r.ok)
    assert.same({ { type = "stdout", seq = 0, data = "hi" } }, r.seen)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("timeoutExceeded", r.err.failure)
  end,
})

-- Interactive jobs (docs/protocol.md §6 jobStdin, jobPty, jobSignal, jobList, jobStream) ------------

group = "an interactive job"

local INTERACTIVE = [[{ features = { "jobStdin", "jobPty", "jobSignal", "jobList", "jobStream" } }]]

--- Writes "abc" to job j1 through a handle that does not know where its input is.
local function write_abc(session)
  local ok, err = session:job("j1"):write("abc")
  return { ok = ok, err = plain(err) }
end

--- The input requests a fake agent received: each one's offset, body and whether it closed.
local function input_requests(server)
  local seen = {}
  for _, req in ipairs(server:requests_to("/v1/jobs/stdin")) do
    assert.equal("jobId=j1", req.query:match("^[^&]*"))
    seen[#seen + 1] = { offset = tonumber(req.query:match("[?&]?offset=(%d+)")), body = req.body,
      close = req.query:find("close=1", 1, true) ~= nil }
  end
  return seen
end

case("takes each byte of its input once when an answer is lost, the piece sent again at its offset", {
  health = INTERACTIVE,
  route = [[(function()
    -- The agent's rule: bytes before what it has taken are skipped, so a piece sent twice counts once.
    local taken, lost_one = 0, false
    return function(req, conn)
      local offset = tonumber(req.query:match("offset=(%d+)"))
      taken = math.max(taken, offset + #req.body)
      if #req.body > 0 and not lost_one then
        lost_one = true
        return conn:close()
      end
      respond.json_last(conn, "200 OK", { offset = taken, closed = req.query:find("close=1", 1, true) ~= nil })
    end
  end)()]],
  act = function(session)
    local job = session:job("j1")
    local wrote, err = job:write("hello")
    local more, more_err = job:write(" world")
    local closed, close_err = job:close_stdin()
    return { wrote = wrote, more = more, closed = closed, errs = { plain(err), plain(more_err), plain(close_err) } }
  end,
  check = function(r, server)
    assert.same({}, r.errs)
    assert.is_true(r.wrote)
    assert.is_true(r.more)
    assert.is_true(r.closed)
    assert.same({
      { offset = 0, body = "", close = false },       -- a handle by id asks where the input is
      { offset = 0, body = "hello", close = false },  -- taken, its answer lost
      { offset = 0, body = "hello", close = false },  -- the same piece at the same offset
      { offset = 5, body = " world", close = false },
      { offset = 11, body = "", close = true },
    }, input_requests(server))
  end,
})

case("gives up on a piece of input after three sends whose answers were lost, saying the write went unanswered", {
  health = INTERACTIVE,
  route = [[function(req, conn)
    if #req.body > 0 then return conn:close() end
    respond.json_last(conn, "200 OK", { offset = 0, closed = false })
  end]],
  act = write_abc,
  check = function(r, server)
    assert.is_nil(r.ok)
    assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    assert.is_true(r.err.retryable, "the same bytes at the same offset are taken once")
    assert.equal("sandbox.jobWrite", r.err.operation)
    -- The look for the offset, then three sends of the piece, each on a connection of its own
    -- (every answer closes its connection, so no transport resends on a pooled one).
    local seen = input_requests(server)
    assert.equal(4, #seen)
    for i = 2, 4 do assert.same({ offset = 0, body = "abc", close = false }, seen[i]) end
  end,
})

case("reads a write's answer without an offset as unanswered, and sends the piece again", {
  health = INTERACTIVE,
  route = [[function(req, conn)
    if #req.body > 0 then return respond.json_last(conn, "200 OK", { closed = false }) end
    respond.json_last(conn, "200 OK", { offset = 0, closed = false })
  end]],
  act = write_abc,
  check = function(r, server)
    assert.is_nil(r.ok)
    assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", r.err.cause.code)
    assert.equal(4, #input_requests(server), "one look for the offset, then three sends of the piece")
  end,
})

case("sends a signal and a terminal size with the job's id, and an agent without the route cannot", {
  health = INTERACTIVE,
  route = [[function(req, conn)
    if req.path == "/v1/jobs/signal" then return respond.status(conn, "204 No Content") end
    respond.status(conn, "404 Not Found", "ROUTE_NOT_FOUND: No route " .. req.path .. " in this agent")
  end]],
  act = function(session)
    local job = session:job("j1")
    local signalled, serr = job:signal("INT")
    local resized, rerr = job:resize(120, 40)
    return { signalled = signalled, serr = plain(serr), resized = resized, rerr = plain(rerr) }
  end,
  check = function(r, server)
    assert.is_true(r.signalled)
    assert.is_nil(r.serr)
    assert.same({ jobId = "j1", signal = "INT" }, cjson.decode(server:requests_to("/v1/jobs/signal")[1].body))
    assert.is_nil(r.resized)
    assert.equal("OPERATION_NOT_SUPPORTED", r.rerr.code)
    assert.equal("sandbox.jobResize", r.rerr.operation)
    assert.same({ jobId = "j1", cols = 120, rows = 40 }, cjson.decode(server:requests_to("/v1/jobs/resize")[1].body))
  end,
})

case("lists the jobs the agent holds, running and ended, with their times in seconds", {
  health = INTERACTIVE,
  route = [[function(req, conn)
    respond.json(conn, "200 OK", { jobs = {
      { jobId = "a", command = { "sh", "-c", "cat" }, running = true, startedAt = 1700000000250, stdin = true,
        stdinOffset = 5, pty = false },
      { jobId = "b", command = { "false" }, running = false, startedAt = 1700000001000, exitCode = 1 },
      { jobId = "c", command = { "sleep", "9" }, running = false, startedAt = 1700000002000, signal = 9,
        error = { code = "timeoutExceeded", message = "exceeded its timeout" } },
    } })
  end]],
  act = function(session) return { session:jobs() } end,
  check = function(r, server)
    assert.same({
      { id = "a", argv = { "sh", "-c", "cat" }, running = true, started_at = 1700000000.25, stdin = true,
        pty = false, stdin_offset = 5 },
      { id = "b", argv = { "false" }, running = false, started_at = 1700000001, code = 1, stdin = false,
        pty = false },
      { id = "c", argv = { "sleep", "9" }, running = false, started_at = 1700000002, signal = 9,
        error = "timeoutExceeded", stdin = false, pty = false },
    }, r[1])
    assert.equal("GET", server:requests_to("/v1/jobs/list")[1].method)
  end,
})

--- The session's list of jobs, or the error that came instead.
local function list_jobs(session)
  local list, err = session:jobs()
  return { list = list, err = plain(err) }
end

case("refuses a list whose entry lacks its id, command, state or start", {
  health = INTERACTIVE,
  route = [[function(req, conn)
    respond.json(conn, "200 OK", { jobs = { { jobId = "a", command = { "true" }, running = false } } })
  end]],
  act = list_jobs,
  check = function(r)
    assert.is_nil(r.list)
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", r.err.code)
    assert.equal("jobs", r.err.field)
  end,
})

case("refuses a list longer than its bound before reading it whole", {
  health = INTERACTIVE,
  route = [[function(req, conn)
    -- 256 KiB is the most sixteen jobs' answer can take (protocol_jobs.lua); this is past it.
    local command = {}
    for i = 1, 40000 do command[i] = "argument" end
    respond.json(conn, "200 OK", { jobs = { { jobId = "a", command = command, running = true, startedAt = 1 } } })
  end]],
  act = list_jobs,
  check = function(r)
    assert.is_nil(r.list)
    assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    assert.is_true(found(r.err.text, "262144"), r.err.text)
  end,
})

case("follows a live stream again from its last frame when it breaks, each frame delivered once", {
  health = INTERACTIVE,
  route = [[(function()
    local follows = 0
    local function line(f) return require("cjson").encode(f) .. "\n" end
    return function(req, conn)
      follows = follows + 1
      respond.chunked_start(conn, "200 OK")
      if follows == 1 then
        respond.chunk(conn, line{ t = "stdout", seq = 0, data = "b25l" }
          .. line{ t = "stdout", seq = 1, data = "dHdv" })
        -- Cut inside the next frame: the stream breaks, the job runs on.
        respond.chunk(conn, '{"t":"stdout","se')
        return conn:close()
      end
      -- The agent answers from its own kept frames, which may start before the cursor.
      respond.chunk(conn, line{ t = "stdout", seq = 1, data = "dHdv" }
        .. line{ t = "stderr", seq = 2, data = "dGhyZWU=" } .. line{ t = "exit", code = 0 })
      respond.chunked_end(conn)
    end
  end)()]],
  act = function(session)
    local seen = {}
    local ok, err = pcall(function()
      for frame in session:job("j1"):frames() do seen[#seen + 1] = frame end
    end)
    return { ok = ok, err = plain(err), seen = seen }
  end,
  check = function(r, server)
    assert.is_true(r.ok, r.err and r.err.text)
    assert.same({ { type = "stdout", seq = 0, data = "one" }, { type = "stdout", seq = 1, data = "two" },
      { type = "stderr", seq = 2, data = "three" }, { type = "exit", code = 0, truncated = false } }, r.seen)
    local cursors = {}
    for _, req in ipairs(server:requests_to("/v1/jobs/stream")) do
      local body = cjson.decode(req.body)
      assert.equal("j1", body.jobId)
      cursors[#cursors + 1] = body.sinceSeq
    end
    assert.same({ cjson.null, 1 }, cursors, "followed again from the last frame delivered")
    assert.equal(0, #server:requests_to("/v1/jobs/poll"), "a live stream is never polled")
  end,
})

--- Follows job j1's frames to their end; whether that raised, and the error it raised.
local function follow_to_end(session)
  local ok, err = pcall(function()
    for _ in session:job("j1"):frames() do end
  end)
  return { ok = ok, err = plain(err) }
end

case("ends a live stream with the agent's refusal, not following it again", {
  health = INTERACTIVE,
  route = [[function(req, conn) respond.status(conn, "404 Not Found", "JOB_NOT_FOUND: no job j1") end]],
  act = follow_to_end,
  check = function(r, server)
    assert.is_false(r.ok)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("JOB_NOT_FOUND", r.err.reason)
    assert.equal(1, #server:requests_to("/v1/jobs/stream"))
  end,
})

case("gives up a live stream that breaks three times in a row without a frame", {
  health = INTERACTIVE,
  route = [[function(req, conn)
    respond.chunked_start(conn, "200 OK")
    conn:close()
  end]],
  act = follow_to_end,
  check = function(r, server)
    assert.is_false(r.ok)
    assert.equal("sandbox.jobStream", r.err.operation)
    assert.equal(3, #server:requests_to("/v1/jobs/stream"))
  end,
})

-- Files -----------------------------------------------------------------------------------------

group = "files"

case("are written one PUT per path in sorted order, stopping at the first failure", {
  route = [[function(req, conn)
    local body = require("cjson").decode(req.body)
    if body.path == "/b" then return respond.status(conn, "400 Bad Request", "PATH_REFUSED: no") end
    respond.status(conn, "204 No Content", "")
  end]],
  act = function(session)
    local ok, err = session:write_files{ ["/c"] = "3", ["/a"] = "1", ["/b"] = "2" }
    return { ok = ok, err = plain(err) }
  end,
  check = function(r, server)
    assert.is_nil(r.ok)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("/b", r.err.path)
    local paths = {}
    for _, req in ipairs(server:requests_to("/v1/files")) do paths[#paths + 1] = cjson.decode(req.body).path end
    assert.same({ "/a", "/b" }, paths)
  end,
})

case("are read back as bytes, binary-safe", {
  route = [[function(req, conn) respond.json(conn, "200 OK", { contentsBase64 = "AAEC/w==" }) end]],
  act = function(session) return { bytes = core.b64encode(assert(session:read_file("/bin.dat"))) } end,
  check = function(r, server)
    assert.equal("\0\1\2\255", core.b64decode(r.bytes))
    assert.equal("path=/bin.dat", server:requests_to("/v1/files")[1].query)
  end,
})

case("read back with bad base64 are an unexpected format, naming the field", {
  route = [[function(req, conn) respond.json(conn, "200 OK", { contentsBase64 = "a" }) end]],
  act = function(session)
    local _, err = session:read_file("/x")
    return plain(err)
  end,
  check = function(err)
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", err.code)
    assert.is_true(found(err.text, "contentsBase64"))
  end,
})

case("read back with contentsBase64 given twice are an unexpected format", {
  route = [[function(req, conn)
    respond.status(conn, "200 OK", '{"contentsBase64":"AAEC","contentsBase64":"/w=="}', "application/json")
  end]],
  act = function(session)
    local bytes, err = session:read_file("/x")
    return { bytes = bytes and core.b64encode(bytes), err = plain(err) }
  end,
  check = function(r)
    assert.is_nil(r.bytes, "neither copy is the file")
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", r.err.code)
    assert.is_true(found(r.err.text, "contentsBase64"), r.err.text)
    assert.is_true(found(r.err.text, "twice"), r.err.text)
  end,
})

case("of any size go out from a path as one raw PUT and come back into a path whole, with rawFiles", {
  health = '{ features = { "rawFiles" } }',
  route = [[function(req, conn)
    if req.method == "PUT" then return respond.status(conn, "204 No Content", "") end
    local size = 300 * 1024 + 11
    conn:write("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: "
      .. size .. "\r\n\r\n")
    for piece in require("support.files").pattern_pieces(size) do conn:write(piece) end
  end]],
  act = function(session)
    local files = require "support.files"
    local dir = files.temp_dir()
    files.write(dir .. "/out.bin", files.pattern(200 * 1024 + 3))
    local sent, err = session:write_file_from("/f.bin", dir .. "/out.bin")
    local got, gerr = session:read_file_to("/f.bin", dir .. "/back.bin")
    local back = files.read(dir .. "/back.bin")
    core.remove_tree(dir)
    return { sent = sent, err = plain(err), got = got, gerr = plain(gerr),
      back_whole = back == files.pattern(300 * 1024 + 11) }
  end,
  check = function(r, server)
    assert.is_nil(r.err)
    assert.is_nil(r.gerr)
    assert.equal(200 * 1024 + 3, r.sent)
    assert.equal(300 * 1024 + 11, r.got)
    assert.is_true(r.back_whole, "the file came back byte for byte")
    local put = server:requests_to("/v1/files/raw")[1]
    assert.equal("PUT", put.method)
    assert.equal(require("support.files").pattern(200 * 1024 + 3), put.body)
  end,
})

-- Files as a filesystem --------------------------------------------------------------------------

group = "files as a filesystem"

local FS = '{ features = { "fs", "fsTar", "fsWatch" } }'

case("are listed with path, depth and limit, following next across pages", {
  health = FS,
  route = [[function(req, conn)
    local entry = function(name) return { name = name, path = "/d/" .. name, type = "file", size = 1, mode = 420,
      mtime = 1700000000.5 } end
    if not req.query:find("cursor=", 1, true) then
      return respond.json(conn, "200 OK", { entries = { entry("a"), entry("b") }, next = "b" })
    end
    respond.json(conn, "200 OK", { entries = { entry("c") }, next = require("cjson").null })
  end]],
  act = function(session)
    local entries, err = session:list("/d x", { depth = 3 })
    return { entries = entries, err = plain(err) }
  end,
  check = function(r, server)
    assert.is_nil(r.err)
    assert.equal(3, #r.entries)
    assert.same({ name = "c", path = "/d/c", type = "file", size = 1, mode = 420, mtime = 1700000000.5 }, r.entries[3])
    local lists = server:requests_to("/v1/fs/list")
    assert.equal(2, #lists)
    assert.equal("path=/d%20x&depth=3&limit=10000", lists[1].query)
    assert.equal("path=/d%20x&depth=3&limit=10000&cursor=b", lists[2].query)
  end,
})

case("stat an absent path as nil and no error, and a page or an entry out of shape as unexpected", {
  health = FS,
  route = [[function(req, conn)
    if req.path == "/v1/fs/stat" then return respond.json(conn, "200 OK", { exists = false }) end
    respond.json(conn, "200 OK", { entries = { { name = "a", path = "/a", size = 1, mode = 1, mtime = 1 } },
      next = require("cjson").null })
  end]],
  act = function(session)
    local entry, err = session:stat("/none")
    local listed, lerr = session:list("/")
    return { entry = entry, err = plain(err), listed = listed, lerr = plain(lerr) }
  end,
  check = function(r)
    assert.is_nil(r.entry)
    assert.is_nil(r.err)
    assert.is_nil(r.listed)
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", r.lerr.code)
  end,
})

case("are removed and renamed with their JSON bodies; a 409 is the agent's refusal with its reason", {
  health = FS,
  route = [[function(req, conn)
    if req.path == "/v1/fs/rename" then
      return respond.status(conn, "409 Conflict", "PATH_EXISTS: Path '/b' is in the way")
    end
    respond.status(conn, "204 No Content", "")
  end]],
  act = function(session)
    local removed, rerr = session:remove("/a", { recursive = true })
    local renamed, err = session:rename("/a", "/b")
    return { removed = removed, rerr = plain(rerr), renamed = renamed, err = plain(err) }
  end,
  check = function(r, server)
    assert.is_true(r.removed)
    assert.is_nil(r.renamed)
    assert.equal("SANDBOX_COMMAND_FAILED", r.err.code)
    assert.equal("PATH_EXISTS", r.err.reason)
    assert.is_false(r.err.retryable)
    assert.same({ path = "/a", recursive = true }, cjson.decode(server:requests_to("/v1/fs/remove")[1].body))
    assert.same({ from = "/a", to = "/b", overwrite = false },
      cjson.decode(server:requests_to("/v1/fs/rename")[1].body))
  end,
})

case("whose removal meets a 503 went unanswered and may be asked again", {
  health = FS,
  route = [[function(req, conn) respond.status(conn, "503 Service Unavailable", "AGENT_BUSY: later") end]],
  act = function(session)
    local _, err = session:remove("/a")
    return plain(err)
  end,
  check = function(err)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_true(err.retryable)
  end,
})

case("are watched as a stream of events ending with the agent's reason", {
  health = FS,
  route = [[function(req, conn)
    respond.frames(conn, { '{"t":"event","event":"create","path":"/w/a"}\n',
      '{"t":"event","event":"rename","from":"/w/a","path":"/w/b"}\n{"t":"event","event":"overflow"}\n',
      '{"t":"end","reason":"removed"}\n' })
  end]],
  act = function(session)
    local events = session:watch("/w", { timeout = 5, recursive = true })
    local seen = {}
    for event in events do seen[#seen + 1] = event end
    return { seen = seen, reason = events.reason }
  end,
  check = function(r, server)
    assert.same({ { type = "create", path = "/w/a" }, { type = "rename", from = "/w/a", path = "/w/b" },
      { type = "overflow" } }, r.seen)
    assert.equal("removed", r.reason)
    assert.same({ path = "/w", recursive = true, timeoutMs = 5000 },
      cjson.decode(server:requests_to("/v1/fs/watch")[1].body))
  end,
})

case("are watched by a stream that fails on a frame a watch does not carry, or without its end", {
  health = FS,
  route = [[function(req, conn)
    if req.index % 2 == 0 then return respond.frames(conn, { '{"t":"event","event":"create","path":"/a"}\n' }) end
    respond.frames(conn, { '{"t":"stdout","seq":0,"data":""}\n' })
  end]],
  act = function(session)
    local out = {}
    for i = 1, 2 do
      local ok, err = pcall(function() for _ in session:watch("/", { timeout = 5 }) do end end)
      out[i] = { ok = ok, err = plain(err) }
    end
    return out
  end,
  check = function(out)
    for _, r in ipairs(out) do
      assert.is_false(r.ok)
      assert.equal("SANDBOX_UNREACHABLE", r.err.code)
    end
    assert.is_true(found(out[1].err.text, "a stdout frame, which this stream did not ask for")
      or found(out[2].err.text, "a stdout frame, which this stream did not ask for"))
  end,
})

case("are watched with keep-alives asked of an agent that offers them, consumed and never yielded", {
  health = '{ features = { "fs", "fsTar", "fsWatch", "keepalive" } }',
  options = { keepalive = 0.25 },
  route = [[function(req, conn)
    local body = require("cjson").decode(req.body)
    respond.frames(conn, { '{"t":"keepalive"}\n', '{"t":"event","event":"create","path":"/k'
      .. string.format("%d", body.keepaliveMs) .. '"}\n{"t":"keepalive"}\n', '{"t":"end","reason":"timeout"}\n' }, 0.02)
  end]],
  act = function(session)
    local seen = {}
    local events = session:watch("/", { timeout = 5 })
    for event in events do seen[#seen + 1] = event.type .. " " .. event.path end
    return { seen = seen, reason = events.reason }
  end,
  check = function(r)
    assert.same({ "create /k250" }, r.seen)
    assert.equal("timeout", r.reason)
  end,
})

case("of a directory go out as one chunked tar PUT with their bounds, and come back from a GET", {
  health = FS,
  route = [[function(req, conn)
    if req.method == "PUT" then return respond.status(conn, "204 No Content", "") end
    local tar = require "support.tar"
    respond.chunked_start(conn, "200 OK", "application/x-tar")
    respond.chunk(conn, tar.archive(tar.entry({ name = "back.txt" }, "came back")))
    respond.chunked_end(conn)
  end]],
  act = function(session)
    local files = require "support.files"
    local dir = files.temp_dir()
    files.write(dir .. "/out.txt", "went out")
    local sent, err = session:write_dir_from("/proj", dir, { max_entries = 10, max_bytes = 1000 })
    local got, gerr = session:read_dir_to("/proj", dir .. "/back")
    local back = files.read(dir .. "/back/back.txt")
    core.remove_tree(dir)
    return { sent = sent, err = plain(err), got = got, gerr = plain(gerr), back = back }
  end,
  check = function(r, server)
    assert.is_nil(r.err)
    assert.is_nil(r.gerr)
    assert.equal("came back", r.back)
    local put = server:requests_to("/v1/fs/tar")[1]
    assert.equal("PUT", put.method)
    assert.equal("path=/proj&maxEntries=10&maxBytes=1000", put.query)
    assert.equal("chunked", put.headers["transfer-encoding"])
    assert.equal("application/x-tar", put.headers["content-type"])
    assert.equal(r.sent, put.body_length)
  end,
})

case("of a directory from an archive that climbs out are refused, nothing landing outside", {
  health = FS,
  route = [[function(req, conn)
    local tar = require "support.tar"
    respond.chunked_start(conn, "200 OK", "application/x-tar")
    respond.chunk(conn, tar.archive(tar.entry({ name = "../escaped-by-archive" }, "x")))
    respond.chunked_end(conn)
  end]],
  act = function(session)
    local files = require "support.files"
    local dir = files.temp_dir()
    local ok, err = session:read_dir_to("/proj", dir .. "/dest")
    local landed = files.read(dir .. "/escaped-by-archive") ~= nil
    local made = files.read(dir .. "/dest") ~= nil
    core.remove_tree(dir)
    return { ok = ok, err = plain(err), landed = landed, made = made }
  end,
  check = function(r)
    assert.is_nil(r.ok)
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", r.err.code)
    assert.equal("ARCHIVE_REFUSED", r.err.reason)
    assert.is_false(r.landed)
    assert.is_false(r.made, "the directory it made was removed")
  end,
})

-- An error body ---------------------------------------------------------------------------------

group = "an error body"

local OPERATIONS = {
  { "sandbox.runCommand", function(s) return s:exec({ "true" }, { timeout = 10 }) end },
  { "sandbox.jobStart", function(s) return s:start_job({ "true" }, { timeout = 10 }) end },
  { "sandbox.readFile", function(s) return s:read_file("/x") end },
}

--- One case per operation: the body `route` (a format string taking the status line) sends is
-- no answer, so the outcome is unknown for what may start a command and retryable for a read.
local function error_body(name, route, status_line, expect_text)
  for _, op in ipairs(OPERATIONS) do
    case(name .. " (" .. status_line .. ", " .. op[1] .. ")", {
      route = string.format(route, status_line),
      act = function(session, h)
        local started = h.now()
        local result, err = op[2](session)
        return { result = result and true, err = plain(err), elapsed = h.now() - started }
      end,
      check = function(r)
        assert.is_nil(r.result)
        local idempotent = op[1] == "sandbox.readFile"
        assert.equal(idempotent and "SANDBOX_UNREACHABLE" or "SANDBOX_OUTCOME_UNKNOWN", r.err.code)
        assert.equal(idempotent, r.err.retryable)
        assert.is_true(found(r.err.text, expect_text), r.err.text)
        -- The server would keep the body open for 60 s: giving up near the 0.3 s bound is the
        -- behaviour under test.
        assert.is_true(r.elapsed < 3, op[1] .. " was held for " .. r.elapsed .. "s")
      end,
    })
  end
end

for _, status in ipairs({ "401 Unauthorized", "403 Forbidden", "404 Not Found", "500 Internal Server Error" }) do
  error_body("longer than 4096 bytes is not an answer, whatever its status", [[function(req, conn)
    respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100000\r\n\r\n" .. string.rep("x", 4097))
    conn:sleep(60)
  end]], status, "4096")
end

for _, status in ipairs({ "403 Forbidden", "500 Internal Server Error" }) do
  error_body("that stalls is not an answer, and says its body stalled", [[function(req, conn)
    respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100\r\n\r\npartial error")
    conn:sleep(60)
  end]], status, "body")
end

error_body("of a 404 that never finishes is not an answer, stalled", [[function(req, conn)
  respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100\r\n\r\nPATH_NOT_FOUND:")
  conn:sleep(60)
end]], "404 Not Found", "stalled")

error_body("of a 404 cut short is not an answer", [[function(req, conn)
  respond.raw(conn, "HTTP/1.1 %s\r\nContent-Length: 100\r\n\r\nPATH_NOT_FOUND:")
  conn:close()
end]], "404 Not Found", "could not be read")

error_body("sent chunked and longer than 4096 bytes is not an answer", [[function(req, conn)
  respond.raw(conn, "HTTP/1.1 %s\r\nTransfer-Encoding: chunked\r\n\r\n")
  respond.chunk(conn, string.rep("x", 3000))
  respond.chunk(conn, string.rep("y", 3000))
  conn:sleep(60)
end]], "500 Internal Server Error", "4096")

local STALLED_403 = [[function(req, conn)
  respond.raw(conn, "HTTP/1.1 403 Forbidden\r\nContent-Length: 100\r\n\r\npartial")
  conn:sleep(60)
end]]

local function timed_mkdir(session, h)
  local started = h.now()
  local ok, err = session:mkdir("/d")
  return { ok = ok, err = plain(err), elapsed = h.now() - started }
end

case("is bounded by the sandbox's header timeout when that is shorter than the default", {
  route = STALLED_403,
  options = { header_timeout = 0.5, error_body_timeout = protocol_cases.UNSET },
  act = timed_mkdir,
  check = function(r)
    assert.is_nil(r.ok)
    assert.is_true(found(r.err.text, "stalled: not complete within 0.5s"), r.err.text)
    assert.is_true(r.elapsed < 3, "a stalled 403 body held the caller " .. r.elapsed .. "s")
  end,
})

case("is bounded by error_body_timeout when it is given", {
  route = STALLED_403,
  options = { header_timeout = 0.5, error_body_timeout = 0.2 },
  act = timed_mkdir,
  check = function(r)
    assert.is_nil(r.ok)
    assert.is_true(found(r.err.text, "within 0.2s"), r.err.text)
  end,
})

-- Capabilities ----------------------------------------------------------------------------------

group = "capabilities of the agent provider"

case("refuse what it cannot do without sending anything", {
  route = OK,
  act = function(session)
    local codes = {}
    for _, call in ipairs({
      function() return session:preview(8080) end,
      function() return session:pause() end,
      function() return session:resume() end,
      function() return session:snapshot() end,
      function() return session.sandbox:list() end,
      function() return session:terminate() end,
    }) do
      local ok, err = call()
      codes[#codes + 1] = { ok = ok, code = err and err.code }
    end
    return codes
  end,
  check = function(codes, server)
    assert.equal(6, #codes)
    for _, c in ipairs(codes) do
      assert.is_nil(c.ok)
      assert.equal("OPERATION_NOT_SUPPORTED", c.code)
    end
    assert.equal(0, #server:requests() - #server:requests_to("/v1/health"), "a refusal costs no request")
  end,
})

return protocol_cases
