--- The few helpers an OpenResty/nginx gateway needs on top of the API (README, "Inside
-- OpenResty/nginx"), for a content handler:
--
--   local sk_ngx = require "sandkit.ngx"
--   local exit, err = sk_ngx.stream(session, { "make", "test" }, { timeout = 600, format = "sse" })
--
-- stream() runs a command and writes its frames to the response as they come, flushing each
-- one: NDJSON (the agent protocol's own lines, §3.3) or server-sent events. The exit status is
-- always the last thing written; a failure is written as a last `error` line (`failure` event)
-- carrying only what err:external() shows a tenant. Each frame waits on ngx.flush(true) before
-- the next is read from the sandbox, so a slow HTTP client slows the command instead of filling
-- the worker's memory. With `lua_check_client_abort on`, a client that goes away ends the
-- request at once, which closes the stream and so stops the command; without it, the next
-- flush notices.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"

local sk_ngx = {}

local FORMATS = {
  ndjson = "application/x-ndjson",
  sse = "text/event-stream",
}

local b64encode, format = core.b64encode, string.format

--- A payload as base64: as it came off the wire, or encoded (a provider without an agent
-- hands over decoded bytes).
local function base64(frame)
  return frame.base64 or b64encode(frame.data)
end

-- Each encoder returns a frame's text as what goes before its payload and the payload with
-- what follows it (nil for a frame without payload), each a string or a table of pieces that
-- ngx.print copies into one buffer (a concatenation would first copy the payload into a new
-- string). The two are printed apart: ngx_lua hands out the most recently freed of a
-- request's output buffers to a print and to a flush alike, so a frame printed whole would
-- take the buffer the last flush used, and every stream would keep two frame-sized buffers
-- (and leak one into the request's pool each time a larger frame met a buffer that last served
-- a flush). Printed apart, the few bytes before the payload take that buffer, and the payload
-- always gets the one the last payload used (bench/RESULTS.md, "128 gateway streams").
local function ndjson(frame)
  local kind = frame.type
  if kind == "stdout" or kind == "stderr" then
    return '{"t":"' .. kind .. '","seq":' .. format("%d", frame.seq) .. ',"data":"',
      { base64(frame), '"}\n' }
  elseif kind == "exit" then
    return json.encode{ t = "exit", code = frame.code, truncated = frame.truncated == true,
      signal = frame.signal } .. "\n"
  end
  return json.encode{ t = "error", code = frame.code, message = frame.message } .. "\n"
end

local function sse(frame)
  local kind = frame.type
  if kind == "stdout" or kind == "stderr" then
    return "event: " .. kind .. "\nid: " .. format("%d", frame.seq) .. "\ndata: ",
      { base64(frame), "\n\n" }
  elseif kind == "exit" then
    return "event: exit\ndata: " .. json.encode{ code = frame.code,
      truncated = frame.truncated == true, signal = frame.signal } .. "\n\n"
  end
  -- Not `error`: an EventSource fires that name for its own connection errors.
  return "event: failure\ndata: " .. json.encode{ code = frame.code, message = frame.message }
    .. "\n\n"
end

local ENCODERS = { ndjson = ndjson, sse = sse }

--- Runs argv on session and streams its frames into the response.
-- opts: format = "ndjson" (default) | "sse", and every option session:run takes.
-- Returns the exit frame ({ type = "exit", code =, truncated =, signal = }) once it was written;
-- nil and the error when the command could not start (nothing was written: the handler picks
-- the status), when it failed mid-stream (its error line was written), or when the HTTP client
-- went away (err.client_gone; the stream is closed, which stops the command).
function sk_ngx.stream(session, argv, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("sandkit.ngx.stream: options are a table", 2) end
  local name = opts.format or "ndjson"
  local encode = ENCODERS[name]
  if not encode then error("sandkit.ngx.stream: format is \"ndjson\" or \"sse\"", 2) end
  -- Payloads stay in the base64 they arrived in: checked by the decoder, never decoded and
  -- encoded again on their way through — unless they are cut into lines, which needs the bytes.
  local run_opts = { keep_base64 = not opts.lines }
  for k, v in pairs(opts) do
    if k ~= "format" then run_opts[k] = v end
  end
  local stream, err = session:stream(argv, run_opts)
  if not stream then return nil, err end
  if not ngx.headers_sent then
    ngx.header["Content-Type"] = FORMATS[name]
    ngx.header["Cache-Control"] = "no-cache"
    -- A buffering proxy in front (nginx's own proxy_pass included) would hold frames back.
    ngx.header["X-Accel-Buffering"] = "no"
  end
  while true do
    local frame, failure = stream:next()
    local last = frame == nil or frame.type == "exit"
    if frame == nil then
      failure = failure or errors.unanswered("sandbox.runCommand",
        "the output stream ended without a terminal frame")
      local shown = failure:external()
      frame = { type = "error", code = shown.code, message = shown.message }
    end
    local head, payload = encode(frame)
    ngx.print(head)
    if payload then ngx.print(payload) end
    local flushed, why = ngx.flush(true)
    if not flushed then
      stream:close()
      return nil, errors.unanswered("sandbox.runCommand", "the HTTP client went away ("
        .. tostring(why) .. "); the stream was closed, which stops the command",
        { client_gone = true })
    end
    if last then
      stream:close()
      if failure then return nil, failure end
      return frame
    end
  end
end

return sk_ngx
