--- A running job's input, terminal, signals, live stream and the list of jobs, over the agent
-- protocol's extensions jobStdin, jobPty, jobSignal, jobStream and jobList (docs/protocol.md
-- §6). Written once over protocol.send, like the rest of the protocol, so every transport and
-- provider carries them alike.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local protocol = require "sandkit.protocol"

local encode = json.encode
local to_integer = json.integer
local read_json, query_escape = protocol.read_json, protocol.query_escape

local jobs = {}

local WRITE = "sandbox.jobWrite"
local RESIZE = "sandbox.jobResize"
local SIGNAL = "sandbox.jobSignal"
local STREAM = "sandbox.jobStream"
local LIST = "sandbox.jobList"

jobs.OPERATIONS = { write = WRITE, resize = RESIZE, signal = SIGNAL, stream = STREAM, list = LIST }

--- Answers of a write, a resize and a signal are a line of JSON.
local MAX_SMALL_BODY = 64 * 1024
--- The list: sixteen jobs, each with at most 4 KiB of its command, and their other members.
local MAX_LIST_BODY = 256 * 1024

--- The signals a job may be sent by name (the agent's table, jobs_live.c).
jobs.SIGNALS = { INT = true, TERM = true, HUP = true, KILL = true, QUIT = true, USR1 = true,
  USR2 = true, WINCH = true }
--- A terminal's columns and rows are each from 1 to this (the agent's REQUEST_PTY_MAX).
jobs.PTY_MAX = 10000

--- protocol.send, where an agent without the route is OPERATION_NOT_SUPPORTED: it did nothing.
local function send(conn, operation, method, path, body, max_body)
  local resp, err = protocol.send(conn, operation, method, path, body, max_body)
  if not resp and err.status == 404 and err.reason == "ROUTE_NOT_FOUND" then
    return nil, errors.not_supported(operation, "the session's agent has no route " .. path:match("^[^?]*")
      .. ": it does not offer docs/protocol.md §6's interactive job extensions (a newer sandkit-agent does)")
  end
  return resp, err
end

--- Sends `bytes` as the job's input from byte `offset` (the agent skips what it already took
-- and refuses a gap); `close` ends the input after them. Returns { offset = bytes the agent has
-- taken in all, closed = bool }, or nil and an error.
function jobs.write(conn, job_id, offset, bytes, close)
  local path = "/v1/jobs/stdin?jobId=" .. query_escape(job_id) .. "&offset=" .. string.format("%d", offset)
    .. (close and "&close=1" or "")
  local resp, err = send(conn, WRITE, "POST", path, { bytes = bytes }, MAX_SMALL_BODY)
  if not resp then return nil, err end
  local value
  value, err = read_json(conn, resp, WRITE, "the write's answer could not be read", MAX_SMALL_BODY)
  if not value then
    -- Whether the bytes were taken is unknown; sending them again at the same offset is safe.
    if err.code == "UNEXPECTED_RESPONSE_FORMAT" then
      err = errors.unanswered(WRITE, "the write's answer could not be read", { cause = err })
    end
    return nil, err
  end
  local taken = to_integer(value.offset)
  if not taken or taken < 0 or type(value.closed) ~= "boolean" then
    return nil, errors.unanswered(WRITE, "the write's answer could not be read",
      { cause = errors.unexpected(WRITE, "offset", "missing, or not a byte count") })
  end
  return { offset = taken, closed = value.closed }
end

--- A request with a small JSON body answered 204.
local function command(conn, operation, path, body)
  local resp, err = send(conn, operation, "POST", path, encode(body), MAX_SMALL_BODY)
  if not resp then return nil, err end
  resp:close()
  return true
end

function jobs.resize(conn, job_id, cols, rows)
  return command(conn, RESIZE, "/v1/jobs/resize", { jobId = job_id, cols = cols, rows = rows })
end

function jobs.signal(conn, job_id, name)
  return command(conn, SIGNAL, "/v1/jobs/signal", { jobId = job_id, signal = name })
end

--- The job's frames after `since` (nil: from its first kept frame) as they come, ending with
-- its terminal frame: a stream as protocol.exec's. `timeout` (seconds, or nil when unknown)
-- bounds its wait past the job's own, with the connection's grace.
function jobs.stream(conn, job_id, since, timeout)
  local body = { jobId = job_id, sinceSeq = since == nil and json.null or since }
  if protocol.wants_keepalive(conn) then body.keepaliveMs = to_integer(math.floor(conn.keepalive * 1000)) end
  local started = core.now()
  local resp, err = send(conn, STREAM, "POST", "/v1/jobs/stream", encode(body))
  if not resp then return nil, err end
  return protocol.frame_stream(conn, resp, { operation = STREAM, job_id = job_id,
    deadline = timeout and started + timeout + conn.grace or math.huge })
end

--- { { id =, argv =, running =, started_at = (seconds since the epoch), code =, signal =,
-- error =, stdin =, pty =, stdin_offset = }, … }
function jobs.list(conn)
  local resp, err = send(conn, LIST, "GET", "/v1/jobs/list", nil, MAX_LIST_BODY)
  if not resp then return nil, err end
  local value
  value, err = read_json(conn, resp, LIST, "the list could not be read", MAX_LIST_BODY)
  if not value then return nil, err end
  if type(value.jobs) ~= "table" then
    return nil, errors.unexpected(LIST, "jobs", "missing, or not a list")
  end
  local list = {}
  for _, raw in ipairs(value.jobs) do
    if type(raw) ~= "table" or type(raw.jobId) ~= "string" or type(raw.command) ~= "table"
        or type(raw.running) ~= "boolean" or type(raw.startedAt) ~= "number" then
      return nil, errors.unexpected(LIST, "jobs", "an entry lacks jobId, command, running or startedAt")
    end
    local argv = {}
    for i, arg in ipairs(raw.command) do argv[i] = tostring(arg) end
    list[#list + 1] = {
      id = raw.jobId, argv = argv, running = raw.running, started_at = raw.startedAt / 1000,
      code = to_integer(raw.exitCode), signal = to_integer(raw.signal),
      error = type(raw.error) == "table" and tostring(raw.error.code) or nil,
      stdin = raw.stdin == true, pty = raw.pty == true, stdin_offset = to_integer(raw.stdinOffset),
    }
  end
  return list
end

return jobs
