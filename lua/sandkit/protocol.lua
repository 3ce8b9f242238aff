--- The sandbox agent protocol (docs/protocol.md §3–4), written once over a transport.
--
-- A connection `conn` says where requests go and how long to wait:
--   conn.transport:prepare(method, path, operation) -> { url =, headers = {…}, ca_file =,
--       ca_pem =, client_cert_pem =, client_key_pem =, tls_server_name =, unix_socket = }
--       | nil, err
--     (the only thing providers disagree on: how a request to a session's agent is authorized;
--     the TLS fields are http.send's, for agents reached through a server that wants them)
--   conn.transport:settle(operation, err, target, replayed) -> "replay" | nil [, err] (optional)
--     called with every failed attempt before it is returned, the one replay included
--     (`replayed` true; its answer is not asked for again); a transport that caches routes
--     drops a bad one here, and may ask for the request to be sent once more — only where it
--     can prove the first attempt was not delivered. A second result replaces the error
--     returned (say, why the route could not be refreshed).
--   conn.header_timeout, conn.grace, conn.error_body_timeout, conn.body_timeout,
--   conn.connect_timeout (seconds), conn.features (set of health `features`),
--   conn.keepalive (seconds of a stream's silence after which an agent offering `keepalive`
--     sends a keep-alive; nil or false: none asked for)
--
-- Classification (§4): no headers, a 5xx, an unreadable non-2xx body or a failed 2xx body is
-- *unanswered* — SANDBOX_OUTCOME_UNKNOWN for the two operations that may start a command,
-- SANDBOX_UNREACHABLE (retryable) for the rest; any other non-2xx (a 4xx, a 3xx) is the agent
-- refusing.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local http = require "sandkit.http"
local json = require "sandkit.json"
local options = require "sandkit.options"
local wait = require "sandkit.wait"

local encode = json.encode
local to_integer = json.integer

local protocol = {}

local RUN = "sandbox.runCommand"
local JOB_START = "sandbox.jobStart"
local JOB_POLL = "sandbox.jobPoll"
local JOB_CANCEL = "sandbox.jobCancel"
local READ_FILE = "sandbox.readFile"
local WRITE_FILES = "sandbox.writeFiles"
local MKDIR = "sandbox.mkdir"
local HEALTH = "sandbox.health"
local ACTIVATE = "sandbox.activate"
local PREVIEW = "sandbox.preview"

protocol.PROTOCOL_VERSION = 1

--- Limits (docs/protocol.md §5). Each is a bound on what one answer can make this process hold.
protocol.MAX_ERROR_BODY = 4096            -- an error body longer than this is not an answer
protocol.MAX_FILE_BYTES = 32 * 1024 * 1024
-- A file read's JSON envelope: the file's base64 plus room for the member name.
local MAX_READ_BODY = math.floor(protocol.MAX_FILE_BYTES / 3) * 4 + 4 + 4096
-- Polls return every frame after the cursor: two streams at the default 4 MiB cap, inflated
-- by base64 and JSON framing, fit in 16 MiB; an agent configured far higher is refused here.
local MAX_POLL_BODY = 16 * 1024 * 1024
-- Health, activation, job start and cancel answers are a few hundred bytes.
local MAX_SMALL_BODY = 64 * 1024
-- Milliseconds a timeout saturates at: past 10^14 (about 3,000 years) lua-cjson would write
-- the number in exponent form, which is not an integer on the wire.
local MAX_TIMEOUT_MS = 99999999999999

protocol.DEFAULTS = {
  header_timeout = 60,      -- seconds for response headers (never cuts a body)
  grace = 60,               -- seconds an exec body may outlive its command's timeout
  error_body_timeout = 10,  -- seconds to read a non-2xx body (at most 4096 bytes); never more
                            -- than header_timeout unless set
  body_timeout = 120,       -- seconds to read a 2xx body that is not a stream
  connect_timeout = 30,
}

--- Converts a timeout in seconds to the wire's milliseconds: saturated, not wrapped, and
-- refused when it is no number of seconds (NaN, infinity) or not positive once converted (a
-- sub-millisecond timeout floors to 0). The refusal is the caller's input, so INVALID_INPUT;
-- nothing is sent either way (§4).
function protocol.timeout_ms(timeout, operation)
  local ms = options.is("seconds", timeout) and math.floor(timeout * 1000) or 0
  if ms <= 0 then
    return nil, errors.invalid_input(operation, "timeout", timeout == nil
      and "a command needs a timeout in seconds (or the sandbox's command_timeout)"
      or "a command must carry a non-zero timeout of at least 0.001 seconds, and a finite one")
  end
  if ms > MAX_TIMEOUT_MS then ms = MAX_TIMEOUT_MS end
  return to_integer(ms) or ms
end

--- SANDBOX_COMMAND_FAILED for a command's own ending (an error frame, a job's error). The
-- agent counts its deadline in milliseconds; the API counts seconds, so its timeout sentence
-- is said again in seconds, the agent's own text kept after it.
function protocol.command_error(code, message, fields)
  if code == "timeoutExceeded" or code == "deadlineExceeded" then
    local ms = tonumber(tostring(message):match("(%d+)ms"))
    if ms then
      message = string.format("the command did not finish within its %gs timeout (the agent: %s)",
        ms / 1000, message)
    end
  end
  return errors.command_failed(code, message, fields)
end

--- The agent's error code from an error body ("CODE: message"), or nil.
local function agent_reason(text)
  return text:match("^([A-Z][A-Z0-9_]+):")
end

--- Whether the agent refused a request's credential (§2): a 401, or the 403 whose body is a
-- SANDBOX_CAPABILITY_REFUSED. Such a refusal comes before anything runs, so a transport whose
-- credential can change may send the request once more with a fresh one.
function protocol.credential_refused(err)
  return err.status == 401 or (err.status == 403 and err.code == "SANDBOX_COMMAND_FAILED"
    and err.reason == "SANDBOX_CAPABILITY_REFUSED")
end

--- Who answers the protocol's requests, as the transport failures' wording names it.
local PEER = "the agent"

--- One attempt: sends the request and waits for its headers. A 2xx comes back as the
-- response; anything else becomes the error §4 says it is, with the agent's own text kept.
-- `body` is JSON text, or a raw byte stream { reader =, length =, on_body =, file = } (rawFiles;
-- file: the open file the reader reads, which the libcurl transport reads itself).
local function attempt(conn, target, operation, method, body, max_body)
  local headers = {}
  for k, v in pairs(target.headers or {}) do headers[k] = v end
  local spec = {
    method = method,
    url = target.url,
    headers = headers,
    fresh_connect = not errors.is_idempotent(operation),
    ca_file = target.ca_file,
    ca_pem = target.ca_pem,
    client_cert_pem = target.client_cert_pem,
    client_key_pem = target.client_key_pem,
    tls_server_name = target.tls_server_name,
    unix_socket = target.unix_socket,
    connect_timeout = math.min(conn.connect_timeout, conn.header_timeout),
    max_body = max_body,
    max_error_body = protocol.MAX_ERROR_BODY,
    header_deadline = core.now() + conn.header_timeout,
  }
  if type(body) == "table" and body.bytes then
    -- Bytes held whole (a job's input): sent like JSON text, and so as safe to send again.
    headers["Content-Type"] = body.content_type or "application/octet-stream"
    spec.body = body.bytes
  elseif type(body) == "table" then
    headers["Content-Type"] = body.content_type or "application/octet-stream"
    spec.body_reader, spec.body_length, spec.on_body = body.reader, body.length, body.on_body
    spec.body_file = body.file
    -- The bytes may take long to send; what bounds the wait is their stopping.
    spec.stall_timeout, spec.header_timeout = conn.body_timeout, conn.header_timeout
  elseif body then
    headers["Content-Type"] = "application/json"
    spec.body = body
  end
  local resp, failure = http.send(spec)
  if not resp then
    if failure.source_error ~= nil then
      return nil, errors.invalid_input(operation, "source", (type(body) == "table" and body.what
        or "the file to send") .. " could not be read: " .. tostring(failure.source_error))
    end
    return nil, errors.transport_failure(operation, failure, nil,
      { peer = PEER, seconds = conn.header_timeout })
  end
  local status = resp.status
  if status >= 200 and status < 300 then return resp end

  -- The agent puts the cause in the body; a bare status would turn a specific refusal into a
  -- guess. A body that cannot be read in full is not an empty body: it is no answer at all.
  local text, bad = resp:read_all(core.now() + conn.error_body_timeout)
  if not text then
    bad.sent, bad.status = true, status
    return nil, errors.transport_failure(operation, bad, nil,
      { peer = PEER, seconds = conn.error_body_timeout, bytes = protocol.MAX_ERROR_BODY })
  end
  -- A 5xx proves nothing: proxies write 5xx pages too, and a 504 means the request reached the
  -- guest. Every other status is the agent answering before it did anything: a 4xx refusal,
  -- and a 3xx too (nothing follows redirects, and the same request gets the same one again).
  if status < 500 then
    return nil, errors.command_failed("agentRefused",
      string.format("%s returned %d: %s", operation, status, text),
      { operation = operation, status = status, body = text, reason = agent_reason(text) })
  end
  return nil, errors.unanswered(operation,
    string.format("the sandbox host returned %d: %s", status, text),
    { status = status, sent = true, body = text, reason = agent_reason(text) })
end

--- Sends a request, letting the transport settle a failure; at most one replay, and only at
-- the transport's word. `body` is JSON text, or a raw byte stream { reader =, length =,
-- on_body =, content_type =, what = (what the reader reads, for its failure) }.
local function send(conn, operation, method, path, body, max_body)
  local transport = conn.transport
  local replayed = false
  while true do
    local target, err = transport:prepare(method, path, operation)
    if not target then return nil, err end
    local resp
    resp, err = attempt(conn, target, operation, method, body, max_body)
    if resp then return resp end
    local verdict, replacement
    if transport.settle then
      verdict, replacement = transport:settle(operation, err, target, replayed)
    end
    -- A streamed body was read as it went: there is nothing left to send again.
    if replayed or verdict ~= "replay" or (type(body) == "table" and not body.bytes) then
      return nil, replacement or err
    end
    replayed = true
  end
end

-- Bytes of a repeated member name an error quotes: enough to recognise any protocol name.
local MAX_QUOTED_NAME = 64

--- Reads a 2xx body of at most `max_body` bytes whole, within body_timeout; `unreadable` says
-- what an unreadable body means for this operation. The text, or nil and the error.
function protocol.read_text(conn, resp, operation, unreadable, max_body)
  local text, bad = resp:read_all(core.now() + conn.body_timeout)
  if not text then
    bad.sent, bad.status = true, resp.status
    return nil, errors.transport_failure(operation, bad, nil, { peer = PEER,
      seconds = conn.body_timeout, bytes = max_body, context = unreadable })
  end
  return text
end

--- Reads and decodes a 2xx JSON body of at most `max_body` bytes; `unreadable` says what an
-- unreadable body means for this operation (the context of its errors.transport_failure). A
-- body that names a member twice in one object comes back as an unexpected format, with a
-- third result, true, saying so.
local function read_json(conn, resp, operation, unreadable, max_body)
  local text, bad = protocol.read_text(conn, resp, operation, unreadable, max_body)
  if not text then return nil, bad end
  -- lua-cjson keeps a repeated member's last copy; the agent, the frame decoder and other
  -- readers refuse it or keep the first. A text read two ways is no answer, so it is checked
  -- by the frame decoder's JSON reader (names compared unescaped) before lua-cjson sees it.
  local unique, name, at = core.json_unique(text)
  if unique == false then
    return nil, errors.unexpected(operation, "body", string.format(
      "it names the member %q twice in one object (at byte %d)", name:sub(1, MAX_QUOTED_NAME), at)),
      true
  end
  local value, jerr
  if unique then
    value, jerr = json.decode(text)
  else
    jerr = string.format("%s at byte %d", name, at)
  end
  if type(value) ~= "table" then
    return nil, errors.unexpected(operation, "body", "not a JSON object: " .. tostring(jerr))
  end
  return value
end

-- For the protocol's extension modules (sandkit.protocol_fs): the one way to send a request
-- and read a JSON answer.
protocol.send = send
protocol.read_json = read_json

local function check_argv(argv)
  if type(argv) ~= "table" then error("sandkit: a command is an argv table", 3) end
  local n = #argv
  for k, v in pairs(argv) do
    if type(k) ~= "number" or k < 1 or k > n or k % 1 ~= 0 then
      error("sandkit: argv must be a sequence of strings", 3)
    end
    if type(v) ~= "string" then error("sandkit: argv entries must be strings", 3) end
  end
  return n > 0
end

local function check_string_map(map, what)
  if map == nil then return end
  if type(map) ~= "table" then error("sandkit: " .. what .. " must be a table", 3) end
  for k, v in pairs(map) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error("sandkit: " .. what .. " must map strings to strings", 3)
    end
  end
end

--- The body /v1/exec and /v1/jobs/start both take. `output_cap` goes only to an agent that
-- advertises outputCap (§6), and only for exec: jobs keep the agent's cap, and an agent that
-- does not know the field keeps its own.
local function command_body(operation, argv, opts, conn)
  if not check_argv(argv) then
    return nil, errors.invalid_input(operation, "command", "a command needs at least a program")
  end
  check_string_map(opts.env, "env")
  if opts.cwd ~= nil and type(opts.cwd) ~= "string" then error("sandkit: cwd must be a string", 3) end
  local cap = opts.output_cap
  if cap ~= nil and (not to_integer(cap) or cap < 0) then
    return nil, errors.invalid_input(operation, "output_cap", "output_cap is a whole number of bytes (0: none)")
  end
  local ms, err = protocol.timeout_ms(opts.timeout, operation)
  if not ms then return nil, err end
  local body = { command = argv, timeoutMs = ms, cwd = opts.cwd }
  if opts.env and next(opts.env) then body.env = opts.env end
  if opts.job_id then body.jobId = opts.job_id end
  -- jobStdin and jobPty (§6): sent only when asked, so a start without them is the same
  -- request to every agent.
  if opts.stdin then body.stdin = true end
  if opts.pty then body.pty = { cols = opts.pty.cols, rows = opts.pty.rows } end
  -- A stream needs no cap: backpressure already bounds what is held. Unless asked, none.
  if operation == RUN and conn and conn.features and conn.features.outputCap then
    body.outputCap = to_integer(cap or 0)
  end
  if operation == RUN and protocol.wants_keepalive(conn) then
    body.keepaliveMs = to_integer(math.floor(conn.keepalive * 1000))
  end
  if operation == RUN and protocol.wants_binary(conn) then body.framing = "binary" end
  return encode(body)
end

--- Whether a stream over `conn` asks for binary frames (§6 binaryFrames): only an agent that
-- said it writes them is asked; every other one is read as NDJSON, the protocol's default.
function protocol.wants_binary(conn)
  return conn ~= nil and conn.features ~= nil and conn.features.binaryFrames == true
end

--- The media type of a body of binary frames (§6 binaryFrames).
local BINARY_FRAMES = "application/vnd.sandkit.frames"

--- Whether a stream's answer is binary frames: it was asked for, and the answer says it is one
-- (an agent answers a request it refuses in NDJSON, whatever it asked for).
local function answered_binary(conn, resp)
  if not protocol.wants_binary(conn) then return false end
  local media = (resp:headers()["content-type"] or ""):match("^%s*([^;%s]*)")
  return media:lower() == BINARY_FRAMES
end

--- Whether a stream over `conn` asks for keep-alives (§6 keepalive): the connection wants them
-- and the agent said it sends them. One that did not say is never asked: it would refuse the
-- member, or ignore it and leave the stream as silent as before.
function protocol.wants_keepalive(conn)
  return conn ~= nil and conn.keepalive and conn.features ~= nil and conn.features.keepalive == true
    or false
end

-- Frame readers -----------------------------------------------------------------------------
-- What an output stream (exec, job) and a watch share: frames read from one transfer through
-- one decoder until a last frame, a failure or a deadline; `words` name the stream in errors.

local frame_reader = {}
protocol.frame_reader = frame_reader

--- Ends the stream. Closing mid-body drops the connection, which the agent takes as the reader
-- leaving: it cancels the command, or ends the watch.
function frame_reader.close(self)
  if not self.finished then
    self.finished = true
    self.transfer:close()
    self.decoder:close()
  end
end

--- Ends the stream with err, which every later read returns.
function frame_reader.fail(self, err)
  self:close()
  self.failed = err
  return nil, err
end

--- The next decoded frame; false when none is here yet and `block` is false; or nil and an
-- error (the stream ended with it) when its deadline passed, a frame did not read, or the body
-- ended or failed before a last frame.
function frame_reader.pull(self, block, operation, words)
  local t = self.transfer
  while true do
    local frame, kind, detail = t:decode(self.decoder)
    if frame then return frame end
    if frame == false then
      if core.now() >= self.deadline then
        return frame_reader.fail(self, errors.unanswered(operation, string.format(words.late, self.grace)))
      end
      if not block then return false end
      wait.ready(t, self.deadline)
    elseif kind then
      -- A frame arrived, so the agent acted: a frame that cannot be read leaves the outcome
      -- unknown — reported as a format problem it would look safe to repeat.
      local what = kind == "undecodable" and words.undecodable or words.unparsable
      local cause = errors.unexpected(operation, what[2], detail)
      return frame_reader.fail(self, errors.unanswered(operation, what[1], { cause = cause }))
    else
      local st = t:state()
      return frame_reader.fail(self, errors.unanswered(operation,
        st.ok and words.ended or (words.failed .. tostring(st.error))))
    end
  end
end

-- Output streams ----------------------------------------------------------------------------

local stream_mt = {}
stream_mt.__index = stream_mt

--- A stream's operation: errors name it (RUN for exec, the job stream's for a job).
local function stream_operation(self)
  return self.operation or RUN
end

stream_mt.close = frame_reader.close
stream_mt.__close = frame_reader.close
stream_mt.__gc = frame_reader.close

local STREAM_WORDS = {
  late = "no terminal frame arrived within %gs of the command's timeout",
  undecodable = { "an output frame did not decode", "data" },
  unparsable = { "an output frame did not parse", "frame" },
  ended = "the output stream ended without a terminal frame",
  failed = "the output stream failed: ",
}

--- The next frame: a table (stdout/stderr with seq and data, or the exit frame), nil when the
-- stream ended with its exit frame, or nil and an error. After an error, or once the exit
-- frame was delivered, it returns nil (and the same error) for ever.
local function step(self, block)
  if self.finished then return nil, self.failed end
  local frame, err = frame_reader.pull(self, block, stream_operation(self), STREAM_WORDS)
  if not frame then return frame, err end
  local ftype = frame.type
  if ftype == "exit" then
    self:close()
  elseif ftype == "error" then
    -- The command's own ending: it surfaces as a failure, never as a stream that stopped.
    return frame_reader.fail(self, protocol.command_error(frame.code, frame.message,
      { operation = stream_operation(self), job_id = self.job_id }))
  end
  return frame
end

function stream_mt:next()
  return step(self, true)
end

--- As next, without waiting: false when no frame has arrived yet (the stream is a pollable:
-- stream:pollfd(), :events() and :timeout() say what to wait on with others).
function stream_mt:poll()
  return step(self, false)
end

function stream_mt:pollfd() return self.transfer:pollfd() end
function stream_mt:events() return self.transfer:events() end
function stream_mt:timeout() return self.transfer:timeout() end

--- Starts a command and returns its output stream once the agent's headers arrived. With
-- opts.keep_base64, stdout/stderr frames carry `base64` (the wire's text, checked) instead of
-- `data`: for a relay that writes payloads on as base64 (sandkit.ngx).
function protocol.exec(conn, argv, opts)
  local body, err = command_body(RUN, argv, opts, conn)
  if not body then return nil, err end
  local started = core.now()
  local resp
  resp, err = send(conn, RUN, "POST", "/v1/exec", body)
  if not resp then return nil, err end
  -- The whole body is bounded by the command's timeout plus a grace: a sandbox frozen
  -- mid-command must not hold its caller for ever.
  return protocol.frame_stream(conn, resp, { deadline = started + opts.timeout + conn.grace,
    keep_base64 = opts.keep_base64 })
end

--- The stream of frames of a 2xx answer whose body is exec-shaped (§3.3): an exec's, or a
-- job's live stream (§6 jobStream). how: deadline (absolute: past it without a terminal frame
-- the stream fails; math.huge for none), keep_base64, operation and job_id (what its errors
-- name).
function protocol.frame_stream(conn, resp, how)
  local decoder = core.decoder(nil, how.keep_base64 == true)
  if answered_binary(conn, resp) then decoder:binary() end
  -- Keep-alives are consumed by the decoder, never yielded; one that comes unasked fails the
  -- stream as any frame it cannot read does.
  if protocol.wants_keepalive(conn) then decoder:admit("keepalive") end
  return setmetatable({
    transfer = resp.transfer,
    client = resp.client,
    decoder = decoder,
    deadline = how.deadline,
    grace = conn.grace,
    operation = how.operation,
    job_id = how.job_id,
    finished = false,
  }, stream_mt)
end

-- Jobs --------------------------------------------------------------------------------------

function protocol.job_start(conn, argv, opts)
  local bad = opts.id ~= nil and options.id(JOB_START, opts.id, options.JOB_ID)
  if bad then return nil, bad end
  local body, err = command_body(JOB_START, argv, { timeout = opts.timeout, cwd = opts.cwd,
    env = opts.env, job_id = opts.id, stdin = opts.stdin, pty = opts.pty })
  if not body then return nil, err end
  -- Resending a start is safe only when it names its job and the agent promised to start a
  -- named job once (§6 jobIdempotency).
  local resendable = opts.id ~= nil and conn.features and conn.features.jobIdempotency
  local resp
  resp, err = send(conn, JOB_START, "POST", "/v1/jobs/start", body, MAX_SMALL_BODY)
  if resp then
    local value
    value, err = read_json(conn, resp, JOB_START, "the job started and its id could not be read",
      MAX_SMALL_BODY)
    if value then
      if type(value.jobId) == "string" and value.jobId ~= "" then return value.jobId end
      -- The job is running and nothing can now poll or cancel it: its end is unknown, not
      -- merely unreadable.
      err = errors.unanswered(JOB_START, "the job started and its id could not be read",
        { cause = errors.unexpected(JOB_START, "jobId", "missing from the answer") })
    elseif err.code == "UNEXPECTED_RESPONSE_FORMAT" then
      err = errors.unanswered(JOB_START, "the job started and its id could not be read",
        { cause = err })
    end
  end
  if resendable and err.code == "SANDBOX_OUTCOME_UNKNOWN" then err.retryable = true end
  return nil, err
end

-- The members the stream's decoder reads (src/common/frames.c).
local FRAME_MEMBERS = { "t", "seq", "data", "code", "message", "truncated", "signal", "oom" }

--- A value of the page as JSON text again. lua-cjson read the page and its numbers are floats:
-- a whole one is written in full (lua-cjson would write 14 digits and an exponent), any other
-- (a fraction, an infinity) so that the decoder refuses it where it wants an integer.
local function json_text(value)
  if type(value) ~= "number" then return encode(value) end
  if value % 1 == 0 then return string.format("%.0f", value) end
  return string.format("%.17g", value)
end

--- One frame of a poll (as lua-cjson read it), or its envelope's ending as an exit frame, read
-- by the stream's own decoder, so it means what it would on a stream: output, an exit, or an
-- error (the job's failure). nil and why when it cannot be read.
local function poll_frame(raw)
  local line
  if type(raw) == "table" then
    local members = {}
    for _, name in ipairs(FRAME_MEMBERS) do
      if raw[name] ~= nil then members[#members + 1] = encode(name) .. ":" .. json_text(raw[name]) end
    end
    line = "{" .. table.concat(members, ",") .. "}"
  else
    line = json_text(raw)
  end
  local decoder = core.decoder()
  decoder:feed(line .. "\n")
  local frame, _, why = decoder:next()
  decoder:close()
  if not frame then return nil, why end
  return frame
end

--- A poll whose answer arrived and cannot be read as one: the job ran, and its end is unknown.
local function outcome_unknown(what, cause)
  return errors.new("SANDBOX_OUTCOME_UNKNOWN", { operation = JOB_POLL,
    message = JOB_POLL .. ": " .. what .. ", so the job's outcome is unknown", cause = cause })
end

function protocol.job_poll(conn, job_id, since)
  if type(job_id) ~= "string" then error("sandkit: a job id is a string", 2) end
  if since ~= nil and (not to_integer(since) or since < 0) then
    error("sandkit: since is a non-negative integer seq", 2)
  end
  local body = since == nil and encode{ jobId = job_id, sinceSeq = json.null }
    or encode{ jobId = job_id, sinceSeq = since }
  local resp, err = send(conn, JOB_POLL, "POST", "/v1/jobs/poll", body, MAX_POLL_BODY)
  if not resp then return nil, err end
  local value, twice
  value, err, twice = read_json(conn, resp, JOB_POLL, "the poll's body could not be read", MAX_POLL_BODY)
  if twice then
    -- Not merely unreadable: the page arrived whole, and a member given twice in its envelope
    -- (`exitCode`, `running`, `frames`) can hide an exit exactly as a frame's `code` given
    -- twice can. The agent answers the same cursor with the same page, so a retry would loop
    -- for ever; the job's outcome is unknown, as for a frame that cannot be read.
    return nil, outcome_unknown("the poll's page names a member twice", err)
  end
  if not value then
    -- Nothing about the job changed; the same poll can simply be sent again.
    if err.code == "UNEXPECTED_RESPONSE_FORMAT" then
      err = errors.unanswered(JOB_POLL, "the poll's body could not be read", { cause = err })
    end
    return nil, err
  end
  if type(value.running) ~= "boolean" then
    return nil, errors.unanswered(JOB_POLL, "the poll's body could not be read",
      { cause = errors.unexpected(JOB_POLL, "running", "missing or not a boolean") })
  end
  -- `next` is the cursor for the following poll: the highest seq seen, or `since` again.
  local page = { running = value.running, frames = {}, next = since }
  if value.exitCode ~= nil and value.exitCode ~= json.null then
    -- The envelope's members are optional, null as good as absent (as exitCode's is), and
    -- otherwise held to the exit frame's types and ranges.
    local function member(v) if v ~= json.null then return v end end
    local exit, why = poll_frame{ t = "exit", code = value.exitCode, signal = member(value.signal),
      truncated = member(value.truncated), oom = member(value.oom) }
    -- An ending that cannot be read is the job's outcome unknown, as for such a frame.
    if not exit then
      return nil, outcome_unknown("the poll's ending (exitCode, truncated, signal) could not be read",
        errors.unexpected(JOB_POLL, "exitCode", why))
    end
    page.exit = { code = exit.code, truncated = exit.truncated, signal = exit.signal, oom = exit.oom }
  end
  if type(value.frames) == "table" then
    for _, raw in ipairs(value.frames) do
      local frame, why = poll_frame(raw)
      if not frame then
        -- A frame arrived, so the command ran, and asking again returns the same frame: its
        -- outcome is unknown, never worth a retry (the exec stream's rule, §4).
        return nil, outcome_unknown("a frame in the poll could not be read",
          errors.unexpected(JOB_POLL, "frames", why))
      end
      if frame.type == "error" then
        return nil, protocol.command_error(frame.code, frame.message, { operation = JOB_POLL })
      elseif frame.type == "exit" then
        -- The ending of an agent that reports it as a frame; the envelope's, when both, wins.
        page.exit = page.exit or { code = frame.code, truncated = frame.truncated, signal = frame.signal,
          oom = frame.oom }
      else
        page.frames[#page.frames + 1] = frame
        if page.next == nil or frame.seq > page.next then page.next = frame.seq end
      end
    end
  end
  if type(value.error) == "table" then
    page.error = { code = tostring(value.error.code), message = tostring(value.error.message) }
  end
  return page
end

function protocol.job_cancel(conn, job_id)
  if type(job_id) ~= "string" then error("sandkit: a job id is a string", 2) end
  local resp, err = send(conn, JOB_CANCEL, "POST", "/v1/jobs/cancel", encode{ jobId = job_id },
    MAX_SMALL_BODY)
  if not resp then return nil, err end
  resp:close()
  return true
end

-- Files -------------------------------------------------------------------------------------

local function check_path(path)
  if type(path) ~= "string" then error("sandkit: a path is a string", 3) end
end

local function query_escape(s)
  return (s:gsub("[^%w%-%._~/]", function(c) return string.format("%%%02X", c:byte()) end))
end
protocol.query_escape = query_escape

function protocol.read_file(conn, path)
  check_path(path)
  local resp, err = send(conn, READ_FILE, "GET", "/v1/files?path=" .. query_escape(path), nil,
    MAX_READ_BODY)
  if not resp then return nil, err end
  local value
  value, err = read_json(conn, resp, READ_FILE, "the file's body could not be read", MAX_READ_BODY)
  if not value then return nil, err end
  if type(value.contentsBase64) ~= "string" then
    return nil, errors.unexpected(READ_FILE, "contentsBase64", "missing from the answer")
  end
  local bytes, at = core.b64decode(value.contentsBase64)
  if not bytes then
    return nil, errors.unexpected(READ_FILE, "contentsBase64",
      "contentsBase64 was not valid base64 (at symbol " .. at .. ")")
  end
  return bytes
end

--- One PUT per path, in sorted path order, stopping at the first failure: which files landed
-- is then predictable from the error alone.
function protocol.write_files(conn, files)
  if type(files) ~= "table" then error("sandkit: write_files takes a { [path] = bytes } table", 2) end
  local paths = {}
  for path, bytes in pairs(files) do
    if type(path) ~= "string" or type(bytes) ~= "string" then
      error("sandkit: write_files takes a { [path] = bytes } table", 2)
    end
    if #bytes > protocol.MAX_FILE_BYTES then
      return nil, errors.invalid_input(WRITE_FILES, "files",
        path .. " is larger than the 33554432-byte file limit")
    end
    paths[#paths + 1] = path
  end
  table.sort(paths)
  for _, path in ipairs(paths) do
    local body = encode{ path = path, contentsBase64 = core.b64encode(files[path]) }
    local resp, err = send(conn, WRITE_FILES, "PUT", "/v1/files", body, MAX_SMALL_BODY)
    if not resp then
      err.path = path
      return nil, err
    end
    resp:close()
  end
  return true
end

-- Raw files (§6 rawFiles): a file's bytes as the body, streamed both ways, of any size. ------

local RAW_FILES = "/v1/files/raw?path="

--- One step of a body's read into its sink: the byte count that went to it, false (none has
-- come yet), nil (the body is over), or nil and the sink's error. A transfer that can write its
-- buffer to a file itself (libcurl's; a cosocket's has no buffer of its own to write) is given
-- the open file and leaves Lua out of the bytes' way.
local function body_step(t, write, file)
  if file and t.read_to_file then return t:read_to_file(file) end
  local chunk = t:read()
  if not chunk then return chunk end
  local ok, werr = write(chunk)
  if ok == false or (ok == nil and werr ~= nil) then return nil, tostring(werr) end
  http.let_go(#chunk)
  return #chunk
end

--- Reads the rest of a 2xx body into write(bytes) (a false or nil-and-error result stops it),
-- a chunk at a time, or into `file` when given (the open file write writes to); progress(done,
-- total) hears each chunk (total from Content-Length, nil for a chunked body); `what` names the
-- bytes in errors ("the file's bytes"). Returns the byte count, or nil and an error. The wait
-- is bounded by the bytes stopping for body_timeout seconds, not by the whole transfer, whose
-- length is the sender's.
function protocol.read_body_into(conn, operation, resp, write, progress, what, file)
  local t = resp.transfer
  local total = to_integer(tonumber(resp:headers()["content-length"]))
  local done = 0
  local idle = core.now() + conn.body_timeout
  while true do
    local got, werr = body_step(t, write, file)
    if got then
      done = done + got
      if progress then progress(done, total) end
      idle = core.now() + conn.body_timeout
    elseif werr then
      t:close()
      return nil, errors.invalid_input(operation, "destination",
        what .. " could not be written: " .. werr)
    elseif got == nil then
      local st = t:state()
      t:close()
      if not st.ok then
        return nil, errors.unanswered(operation, what .. " stopped short: " .. tostring(st.error),
          { sent = true })
      end
      if total and done ~= total then
        return nil, errors.unanswered(operation, string.format(
          "%s ended after %d of %d", what, done, total), { sent = true })
      end
      return done
    elseif core.now() >= idle then
      t:close()
      return nil, errors.unanswered(operation, string.format(
        "%s stopped coming for %gs", what, conn.body_timeout), { sent = true })
    else
      wait.ready(t, idle)
    end
  end
end

--- Reads a file out of the session into write(bytes), or into `file` when given (as
-- protocol.read_body_into). Returns the byte count, or nil and an error.
function protocol.read_file_raw(conn, path, write, progress, file)
  check_path(path)
  local resp, err = send(conn, READ_FILE, "GET", RAW_FILES .. query_escape(path), nil, nil)
  if not resp then return nil, err end
  return protocol.read_body_into(conn, READ_FILE, resp, write, progress, "the file's bytes", file)
end

--- Writes the bytes source.read() returns (chunks, then nil; or nil and an error) to a file of
-- the session; `source.length` (bytes, or nil: chunked) goes out as Content-Length, and
-- `source.file`, when given, is the open file read() reads (sandkit.localfile's sources). The
-- agent renames the file into place only once the whole body arrived. Returns the byte count,
-- or nil and an error.
function protocol.write_file_raw(conn, path, source, progress)
  check_path(path)
  local sent = 0
  local length = source.length
  local resp, err = send(conn, WRITE_FILES, "PUT", RAW_FILES .. query_escape(path), {
    reader = source.read, length = length, file = source.file,
    on_body = function(n)
      sent = n
      if progress then progress(n, length) end
    end,
  }, MAX_SMALL_BODY)
  if not resp then
    err.path = path
    return nil, err
  end
  resp:close()
  return sent
end

function protocol.mkdir(conn, path)
  check_path(path)
  local resp, err = send(conn, MKDIR, "POST", "/v1/mkdir", encode{ path = path }, MAX_SMALL_BODY)
  if not resp then return nil, err end
  resp:close()
  return true
end

-- Health and activation ---------------------------------------------------------------------

--- The agent's health: { protocolVersion = 1, bootId =, status =, imageCommand =, features = {set} }.
function protocol.health(conn)
  local resp, err = send(conn, HEALTH, "GET", "/v1/health?version=1", nil, MAX_SMALL_BODY)
  if not resp then return nil, err end
  local value
  value, err = read_json(conn, resp, HEALTH, "the health body could not be read", MAX_SMALL_BODY)
  -- Whatever the body, something answered at the agent's address: its status says so.
  if not value then
    err.status = resp.status
    return nil, err
  end
  if to_integer(value.protocolVersion) ~= protocol.PROTOCOL_VERSION then
    return nil, errors.unexpected(HEALTH, "protocolVersion",
      "the agent speaks protocol version " .. tostring(value.protocolVersion) .. ", not 1",
      { status = resp.status })
  end
  local features = {}
  if type(value.features) == "table" then
    for _, name in ipairs(value.features) do
      if type(name) == "string" then features[name] = true end
    end
  end
  value.features = features
  if type(value.imageCommand) ~= "table" then value.imageCommand = nil end
  return value
end

function protocol.activate(conn)
  local resp, err = send(conn, ACTIVATE, "POST", "/v1/activate", "{}", MAX_SMALL_BODY)
  if not resp then return nil, err end
  resp:close()
  return true
end

--- POST /v1/preview (the `preview` extension, docs/protocol.md §6): the address on this
-- machine's loopback that reaches `port` inside a confined session, made or found by its agent.
function protocol.preview(conn, port)
  local resp, err = send(conn, PREVIEW, "POST", "/v1/preview", encode{ port = port }, MAX_SMALL_BODY)
  if not resp then return nil, err end
  local value
  value, err = read_json(conn, resp, PREVIEW, "the preview body could not be read")
  if not value then return nil, err end
  -- The endpoint is handed to callers as where to connect: only the agent's own loopback
  -- listener is an answer, never an address elsewhere.
  local endpoint = value.endpoint
  if type(endpoint) ~= "string" or not endpoint:match("^http://127%.0%.0%.1:%d+$") then
    return nil, errors.unexpected(PREVIEW, "endpoint", "not http://127.0.0.1:PORT: "
      .. tostring(endpoint):sub(1, 64))
  end
  return endpoint
end

--- nil when every timing option of `given` (protocol.DEFAULTS' names) is a number of seconds
-- and `keepalive` one the agent takes (or false), else INVALID_INPUT for `operation` naming the
-- first in sorted order.
function protocol.check_timings(operation, given)
  local names = {}
  for name in pairs(protocol.DEFAULTS) do names[#names + 1] = name end
  table.sort(names)
  return select(2, options.each(options.seconds, operation, given, names))
    or select(2, options.keepalive(operation, given, "keepalive"))
end

--- Fills the timing fields of a connection from `given` (checked by protocol.check_timings
-- when the sandbox was made), with the protocol's defaults.
function protocol.connection(transport, given)
  given = given or {}
  local conn = { transport = transport, features = {}, keepalive = given.keepalive or nil }
  for name, default in pairs(protocol.DEFAULTS) do conn[name] = given[name] or default end
  -- An error body is part of the answer the header timeout bounds: a sandbox told to give up
  -- on headers after half a second must not wait ten for a stalled 403's body.
  if given.error_body_timeout == nil then
    conn.error_body_timeout = math.min(conn.error_body_timeout, conn.header_timeout)
  end
  return conn
end

protocol.OPERATIONS = { run = RUN, job_start = JOB_START, job_poll = JOB_POLL,
  job_cancel = JOB_CANCEL, read_file = READ_FILE, write_files = WRITE_FILES, mkdir = MKDIR,
  health = HEALTH, activate = ACTIVATE, preview = PREVIEW }

return protocol
