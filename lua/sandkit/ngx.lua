--- The few helpers an OpenResty/nginx gateway needs on top of the API (README, "Inside
-- OpenResty/nginx"), for a content handler:
--
--   local sk_ngx = require "sandkit.ngx"
--   local exit, err = sk_ngx.stream(session, { "make", "test" }, { timeout = 600, format = "sse" })
--   sk_ngx.handle(function() … assert(sandbox:get(id)) … end)
--
-- stream() runs a command and writes its frames to the response as they come: NDJSON (the
-- agent protocol's own lines, §3.3), server-sent events, or plain text (the output bytes
-- themselves, for curl). The exit status is always the last thing written; a failure is written
-- as a last `error` line (`failure` event, `sandkit: error` line) carrying only what
-- err:external() shows a tenant. A frame is flushed as soon as no other is already here; frames
-- that arrived together are flushed together, up to FLUSH_BYTES. Each flush waits on
-- ngx.flush(true) before anything more is read from the sandbox, so a slow HTTP client slows the
-- command instead of filling the worker's memory. With `lua_check_client_abort on`, a client
-- that goes away ends the request at once, which closes the stream and so stops the command;
-- without it, the next flush notices.
--
-- handle() runs a handler and answers a raised error for it: logged whole, shown to the client
-- as err:external() with a 500.
--
-- collector_floor(bytes), from init_worker_by_lua, keeps LuaJIT's collector from starting a
-- cycle before that many bytes were allocated since the last one.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"

local sk_ngx = {}

local pack = table.pack or function(...) return { n = select("#", ...), ... } end
local unpack = table.unpack or rawget(_G, "unpack")

local FORMATS = {
  ndjson = "application/x-ndjson",
  sse = "text/event-stream",
  -- No charset: the bytes are the command's, whatever they are.
  text = "text/plain",
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
-- string). What one flush writes goes out in two prints: the first frame's head, then
-- everything else (print_batch). ngx_lua hands out the most recently freed of a request's
-- output buffers to a print and to a flush alike, so a flush's bytes printed whole would take
-- the buffer the last flush used, and every stream would keep two flush-sized buffers (and
-- leak one into the request's pool each time a larger flush met a buffer that last served a
-- flush). Printed apart, the few bytes of the first head take that buffer, and the rest
-- always gets the one the last flush's rest used (bench/RESULTS.md, "128 gateway streams").
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

--- The exit status or failure of a text stream, as its last line says it and as the trailer
-- (below) carries it.
local function text_ending(frame)
  if frame.type == "exit" then
    local line, value = "sandkit: exit code " .. format("%d", frame.code), format("%d", frame.code)
    if frame.signal then
      line = line .. ", signal " .. format("%d", frame.signal)
      value = value .. "; signal=" .. format("%d", frame.signal)
    end
    if frame.truncated then
      line, value = line .. ", output truncated", value .. "; truncated"
    end
    return line .. "\n", value
  end
  return "sandkit: error " .. frame.code .. ": " .. frame.message .. "\n", "error; code=" .. frame.code
end

--- Plain text: the bytes as they come, stdout and stderr in the order their frames arrived,
-- then the ending on a line of its own. Printed whole (there is nothing to print apart from the
-- payload), what one flush carries costs a stream two output buffers rather than one (see
-- above).
local function text(frame)
  local kind = frame.type
  if kind == "stdout" or kind == "stderr" then return frame.data end
  return (text_ending(frame))
end

local ENCODERS = { ndjson = ndjson, sse = sse, text = text }

--- Writes what one flush carries (stream's batch): apart, as the encoders say why; text's
-- frames have no head to print apart and go in one print, as one text frame always did.
local function print_batch(batch, whole)
  if whole then
    ngx.print(batch.head, batch.rest)
    return
  end
  ngx.print(batch.head)
  if #batch.rest > 0 then ngx.print(batch.rest) end
end

--- Bytes one flush writes at most when frames that are already here are joined (a longer frame
-- goes alone). Joined, they cost one write and one wake-up of the client instead of one each:
-- a fast command's frames are a few KiB to 64 KiB, as the agent found them in the pipe, and
-- several arrive in one socket read. It bounds a stream's output buffer in nginx (one, see
-- the encoders): 64 KiB, below one full frame's base64 (87 KB), adds nothing to the most a
-- stream of full frames holds.
local FLUSH_BYTES = 64 * 1024
sk_ngx.FLUSH_BYTES = FLUSH_BYTES
--- Seconds one stream's light thread may run without nginx's event loop getting a turn. It
-- parks only when its socket has nothing or its client is full, so a stream whose agent and
-- client both keep up would hold the worker for as long as they do (over 100 ms was seen),
-- and every other request with it. A turn is let go only once it took this long, so it costs
-- a stream that is alone one pass of the loop each time.
local TURN_SECONDS = 0.005

--- Lets nginx's event loop run once and then resumes: a timer due at once posts a semaphore
-- this thread waits on. (ngx.sleep(0) would do it in OpenResty's nginx, and logs a warning for
-- every call in any other; ngx.sleep(0.001) idles the worker for that millisecond.)
local semaphore_ok, semaphore = pcall(require, "ngx.semaphore")
local function let_others_run()
  if semaphore_ok then
    local turn = semaphore.new()
    if ngx.timer.at(0, function() turn:post(1) end) then
      turn:wait(1)
      return
    end
  end
  -- No semaphore, or no timer to be had (lua_max_pending_timers).
  ngx.sleep(0.001)
end

--- The nginx variable whose value the `Sandkit-Exit` trailer carries (docs/openresty.md: the
-- location declares it with `set` and sends it with `add_trailer`).
local TRAILER_VARIABLE = "sandkit_exit"

--- Whether the client said it takes trailers (TE: trailers, RFC 9110 §10.1.4): a trailer the
-- client did not ask for is one it may drop unseen, and the last line already says the same.
local function client_takes_trailers()
  local te = ngx.var.http_te
  if not te then return false end
  for member in te:lower():gmatch("[^,]+") do
    if member:match("^%s*trailers%s*$") then return true end
  end
  return false
end

--- Sets the trailer's value, when the client takes trailers and the location declared the
-- variable (without it there is no trailer to send: ngx.var raises for an undeclared one).
local function set_trailer(value)
  if client_takes_trailers() then
    pcall(function() ngx.var[TRAILER_VARIABLE] = value end)
  end
end

--- Runs argv on session and streams its frames into the response.
-- opts: format = "ndjson" (default) | "sse" | "text", and every option session:run takes.
-- Returns the exit frame ({ type = "exit", code =, truncated =, signal = }) once it was written;
-- nil and the error when the command could not start (nothing was written: the handler picks
-- the status), when it failed mid-stream (its error line was written), or when the HTTP client
-- went away (err.client_gone; the stream is closed, which stops the command).
function sk_ngx.stream(session, argv, opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("sandkit.ngx.stream: options are a table", 2) end
  local name = opts.format or "ndjson"
  local encode = ENCODERS[name]
  if not encode then error("sandkit.ngx.stream: format is \"ndjson\", \"sse\" or \"text\"", 2) end
  -- Payloads stay in the base64 they arrived in: checked by the decoder, never decoded and
  -- encoded again on their way through — unless they are cut into lines or written as
  -- text, which needs the bytes.
  local as_text = name == "text"
  local run_opts = { keep_base64 = not opts.lines and not as_text }
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
  -- Whether text output so far ends a line: its ending must begin one of its own.
  local at_line_start = true
  --- Renders a frame into `batch` (what one flush writes: the first frame's head, then
  -- everything else in order in `rest`, see print_batch) and counts its bytes there.
  local function render(frame, last, batch)
    local head, payload = encode(frame)
    if as_text then
      if last then
        if not at_line_start then head = "\n" .. head end
        set_trailer(select(2, text_ending(frame)))
      elseif #head > 0 then
        at_line_start = head:sub(-1) == "\n"
      end
    end
    local rest = batch.rest
    if batch.head == nil then batch.head = head else rest[#rest + 1] = head end
    local bytes = #head
    if payload then
      for i = 1, #payload do
        rest[#rest + 1] = payload[i]
        bytes = bytes + #payload[i]
      end
    end
    batch.bytes, batch.last = batch.bytes + bytes, last
    return batch
  end
  local function new_batch() return { rest = {}, bytes = 0 } end
  -- Only a stream that can say what is already here without waiting (protocol streams) has
  -- frames joined in one flush; any other flushes each frame.
  local poll = type(stream.poll) == "function" and stream.poll or nil
  -- A frame polled for a flush it would have taken past FLUSH_BYTES, rendered: the next
  -- flush's first.
  local held
  -- nginx's cached clock, which moves only when its event loop runs, as this thread last saw
  -- it, and when (core.now) it saw it move: how long the thread has held the worker.
  local loop_clock, turn_began = nil, core.now()
  while true do
    local batch, frame, failure = held
    held = nil
    if batch then
      frame = batch.frame
    else
      frame, failure = stream:next()
      local last = frame == nil or frame.type == "exit"
      if frame == nil then
        failure = failure or errors.unanswered("sandbox.runCommand",
          "the output stream ended without a terminal frame")
        local shown = failure:external()
        frame = { type = "error", code = shown.code, message = shown.message }
      end
      batch = render(frame, last, new_batch())
    end
    -- Frames already decodable join this flush, up to FLUSH_BYTES. poll's false (nothing here
    -- without waiting) flushes at once what was printed; its nil (the stream ended) too, and
    -- next() then returns that ending again, as a stream's next does once it ended.
    while not batch.last and poll and batch.bytes < FLUSH_BYTES do
      local more = poll(stream)
      if not more then break end
      local alone = render(more, more.type == "exit", new_batch())
      if batch.bytes + alone.bytes > FLUSH_BYTES then
        alone.frame, held = more, alone
        break
      end
      local rest = batch.rest
      rest[#rest + 1] = alone.head
      for i = 1, #alone.rest do rest[#rest + 1] = alone.rest[i] end
      batch.bytes, batch.last = batch.bytes + alone.bytes, alone.last
      frame = more
    end
    print_batch(batch, as_text)
    local flushed, why = ngx.flush(true)
    if not flushed then
      stream:close()
      return nil, errors.unanswered("sandbox.runCommand", "the HTTP client went away ("
        .. tostring(why) .. "); the stream was closed, which stops the command",
        { client_gone = true })
    end
    if batch.last then
      stream:close()
      if failure then return nil, failure end
      return frame
    end
    local clock = ngx.now()
    if clock ~= loop_clock then
      loop_clock, turn_began = clock, core.now()
    elseif core.now() - turn_began >= TURN_SECONDS then
      let_others_run()
      loop_clock, turn_began = ngx.now(), core.now()
    end
  end
end

--- The collector's floor (collector_floor): bytes a cycle waits for at least, and the pause in
-- effect when it was set, which stays the least pause. nil: no floor.
local floor_bytes, floor_base_pause
--- Whether a sentinel is armed: one per Lua state, whatever the floor.
local floor_armed = false
local newproxy = rawget(_G, "newproxy")

--- A userdata whose finalizer runs at the end of the cycle that collects it, so once per cycle
-- when each run makes the next (LuaJIT's tables have no __gc).
local function new_sentinel(on_collect)
  local sentinel = newproxy(true)
  getmetatable(sentinel).__gc = on_collect
  return sentinel
end

--- Sets the pause of the cycle that just ended so that the next begins once the heap grew by
-- the larger of its size (the base pause's doing) and floor_bytes. Runs as a finalizer: it may
-- not raise, and it arms the next cycle's sentinel.
local function apply_floor()
  if not floor_bytes then
    floor_armed = false
    return
  end
  local live = collectgarbage("count") * 1024
  local pause = math.floor(100 * (live + floor_bytes) / live)
  collectgarbage("setpause", pause > floor_base_pause and pause or floor_base_pause)
  new_sentinel(apply_floor)
end

--- Keeps LuaJIT's collector from starting a cycle before `bytes` more were allocated since the
-- last one ended, for a worker whose heap is small; nil (or 0) takes the floor away. Without
-- it, a cycle starts once the heap doubled (the default pause, 200): a worker relaying one
-- stream keeps 1 to 2 MB alive and allocates a Lua string for each socket read and each frame's
-- base64, so it runs a whole cycle for every megabyte or two moved, each marking all it keeps.
-- With a floor, memory grows by at most `bytes` over the default, and not at all once the
-- live heap is larger than `bytes` at the default pause (many streams: their bound is as it
-- was). Call it from
-- init_worker_by_lua; it sets the collector's pause after every cycle, from the pause in
-- effect at the call (never below it).
function sk_ngx.collector_floor(bytes)
  if bytes ~= nil and (type(bytes) ~= "number" or bytes < 0 or bytes ~= math.floor(bytes)) then
    error("sandkit.ngx.collector_floor: bytes is a whole number of bytes, or nil", 2)
  end
  -- Lua 5.4 ignores collectgarbage inside a finalizer: the floor would silently do nothing.
  if not newproxy then error("sandkit.ngx.collector_floor: needs LuaJIT (nginx's Lua)", 2) end
  if bytes == nil or bytes == 0 then
    if floor_bytes then collectgarbage("setpause", floor_base_pause) end
    floor_bytes = nil
    return
  end
  if not floor_bytes then
    -- Read by setting it: the pause has no getter.
    floor_base_pause = collectgarbage("setpause", 200)
    collectgarbage("setpause", floor_base_pause)
  end
  floor_bytes = bytes
  if not floor_armed then
    floor_armed = true
    new_sentinel(apply_floor)
  end
end

--- What a client is shown of an error that is not sandkit's (a handler's own assert, a bug):
-- its text may hold anything, so it goes to the error log alone.
local NOT_SHOWN = "Internal server error"

--- A raised value and where it was raised, kept by handle's message handler.
local function caught(raised)
  return { raised = raised, trace = debug.traceback("", 2) }
end

--- Runs handler(...) for a request and answers for it when it raises: nginx's Lua module would
-- log a raised sandkit error (a table) as "unknown reason" and answer a bare 500. Here the
-- error log gets the whole text (tostring: every cause, internal ones included) and the
-- traceback, and the client a 500 with { code, message, retryable } of err:external() as JSON;
-- an error that is not sandkit's shows the client only "Internal server error". When the
-- response had begun, its status cannot change: the connection is cut instead
-- (ngx.exit(ngx.ERROR)), so a client never takes a response that stopped short for a whole
-- one. Returns handler's results when it returns; ngx.exit inside it works as usual.
function sk_ngx.handle(handler, ...)
  if type(handler) ~= "function" then error("sandkit.ngx.handle: the handler is a function", 2) end
  local results = pack(xpcall(handler, caught, ...))
  if results[1] then return unpack(results, 2, results.n) end
  local raised, trace = results[2].raised, results[2].trace
  ngx.log(ngx.ERR, "sandkit.ngx.handle: ", tostring(raised), trace)
  if ngx.headers_sent then return ngx.exit(ngx.ERROR) end
  local shown = { message = NOT_SHOWN }
  if errors.is_error(raised) then
    local external = raised:external()
    shown = { code = external.code, message = external.message, retryable = external.retryable }
  end
  ngx.status = 500
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Content-Length"] = nil
  ngx.say(json.encode(shown))
  return ngx.exit(500)
end

return sk_ngx
