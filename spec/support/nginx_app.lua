--- The handlers the nginx specs' test server runs (spec/support/nginx.lua puts spec/ on its
-- lua_package_path): each location calls one function here, which uses sandkit inside the
-- worker exactly as a gateway would, and answers what it saw as JSON or as a stream.

local cjson = require "cjson"
local sandkit = require "sandkit"
local sk_ngx = require "sandkit.ngx"
local fs_roundtrip = require "support.fs_roundtrip"
local interactive_roundtrip = require "support.interactive_roundtrip"
local protocol_cases = require "support.protocol_cases"

local app = {}

--- Sessions opened by one request and used by the next (a session holds no connection, so it
-- may outlive the request that made it); one worker serves every spec request.
local sessions = {}
local opened = 0

local function body_json()
  ngx.req.read_body()
  return cjson.decode(ngx.req.get_body_data() or "{}")
end

local function reply(value)
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(value))
end

--- Writes text to path through a rename, so a spec reading it sees all of it or none.
local function write_whole(path, text)
  local f = assert(io.open(path .. ".tmp", "wb"))
  f:write(text)
  f:close()
  assert(os.rename(path .. ".tmp", path))
end

local function fail(status, text)
  ngx.status = status
  ngx.say(text)
  return ngx.exit(status)
end

--- POST { url, index } -> { handle }: a session on the fake agent at url, with case index's options.
function app.case_open()
  local req = body_json()
  opened = opened + 1
  -- The case's own options, as the table holds them (a JSON trip would lose what is not data).
  sessions[opened] = protocol_cases.open(req.url, protocol_cases.cases[req.index].options)
  reply{ handle = opened }
end

--- POST { handle, index } -> the case's act result, as protocol_cases.act writes it.
function app.case_act()
  local req = body_json()
  local session = sessions[req.handle]
  sessions[req.handle] = nil
  ngx.header["Content-Type"] = "application/json"
  ngx.say(protocol_cases.act(req.index, session))
end

--- The local sandbox every other handler uses, under the root the spec passed in the query
-- (and with its agents' output cap, when it passed one).
local function local_sandbox()
  local root = ngx.var.arg_root
  if not root then return fail(400, "root?") end
  return assert(sandkit.sandbox{ provider = "local", root = ngx.unescape_uri(root),
    output_cap = tonumber(ngx.var.arg_output_cap) })
end

local function session_of(sandbox)
  local session, err = sandbox:get(ngx.var.arg_session or "")
  if not session then return fail(404, "no session: " .. tostring(err)) end
  return session
end

--- POST ?root=R[&output_cap=N] -> { id }: a local session created inside the worker.
function app.create()
  local session, err = local_sandbox():create{}
  if not session then return fail(500, tostring(err)) end
  reply{ id = session.id }
end

--- POST ?root=R&session=ID&format=F, body: the argv as JSON -> the command's frames, streamed.
function app.stream()
  local argv = body_json()
  local session = session_of(local_sandbox())
  local exit, err = sk_ngx.stream(session, argv, { timeout = 120, format = ngx.var.arg_format })
  if not exit and not ngx.headers_sent then return fail(502, tostring(err)) end
end

--- POST ?format=F, body { frames = [ frame… ], error = { code, message, internal } | nil,
-- polled = true | nil } -> what sandkit.ngx.stream writes for a session whose command gives
-- those frames, in that order, and then, when `error` is given, fails with it instead of
-- ending. With `polled`, the stream has poll() as a protocol stream does: a frame marked
-- `here = true` has already arrived, any other is not here yet (poll returns false).
function app.scripted_stream()
  local script = body_json()
  local given = 0
  local session = {}
  function session.stream()
    local stream = {
      next = function()
        given = given + 1
        if script.frames[given] then return script.frames[given] end
        if script.error then
          return nil, require("sandkit.errors").new(script.error.code, { message = script.error.message,
            internal = script.error.internal })
        end
        return nil
      end,
      close = function() end,
    }
    if script.polled then
      stream.poll = function()
        local frame = script.frames[given + 1]
        if not (frame and frame.here) then return false end
        given = given + 1
        return frame
      end
    end
    return stream
  end
  local exit, err = sk_ngx.stream(session, { "scripted" }, { timeout = 1, format = ngx.var.arg_format })
  if not exit and not ngx.headers_sent then return fail(502, tostring(err)) end
end

--- POST ?seconds=S -> a text stream of 100-byte lines, every one already here when asked
-- for (its poll never says false), for S seconds, then its exit: a stream that never waits, so
-- its light thread parks only when sandkit.ngx.stream lets the worker's other work run.
function app.busy_stream()
  local now = require("sandkit.core").now
  local ends = now() + tonumber(ngx.var.arg_seconds)
  local line, seq = string.rep("x", 99) .. "\n", -1
  local function frame()
    if now() >= ends then return { type = "exit", code = 0, truncated = false } end
    seq = seq + 1
    return { type = "stdout", seq = seq, data = line }
  end
  local session = {}
  function session.stream() return { next = frame, poll = frame, close = function() end } end
  sk_ngx.stream(session, { "busy" }, { format = "text" })
end

--- POST ?root=R&session=ID, body: the argv as JSON -> { code, stdout, stderr } of exec.
function app.exec()
  local argv = body_json()
  local result, err = session_of(local_sandbox()):exec(argv, { timeout = 60 })
  if not result then return fail(502, tostring(err)) end
  reply{ code = result.code, stdout = result.stdout, stderr = result.stderr }
end

--- POST ?root=R&session=ID, body: { src = a local directory } -> what fs_roundtrip saw of the
-- session's files as a filesystem, and a watch's events while a file is written.
function app.files()
  local req = body_json()
  local session = session_of(local_sandbox())
  local ok, seen = pcall(fs_roundtrip.run, session, req.src, "/tree")
  if not ok then return fail(500, tostring(seen)) end
  -- The watch answered, so it sees the write that follows.
  local events = session:watch("/", { timeout = 0.5 })
  local written, err = session:write_files{ ["/watched.txt"] = "x" }
  if not written then return fail(500, tostring(err)) end
  seen.watch = {}
  ok, err = pcall(function()
    for event in events do seen.watch[#seen.watch + 1] = event.type .. " " .. event.path end
  end)
  if not ok then return fail(500, tostring(err)) end
  seen.reason = events.reason
  reply(seen)
end

--- POST ?root=R&session=ID -> what an interactive job did over cosockets: input written and
-- resent (taken once), its frames followed live, a terminal job resized, a job signalled, the
-- list of jobs.
function app.interactive()
  local session = session_of(local_sandbox())
  local seen
  local ok, err = pcall(function()
    local tour = interactive_roundtrip.run(session)
    local jobs = 0
    for _ in pairs(tour.jobs) do jobs = jobs + 1 end
    seen = { first = tour.first, rest = tour.rest, size = tour.size, code = tour.code,
      signal = tour.signal, jobs = jobs }
  end)
  if not ok then return fail(500, tostring(err)) end
  reply(seen)
end

--- POST ?root=R&session=ID, body: a list of argvs -> their stdout, run as sandkit.run tasks.
function app.fanout()
  local argvs = body_json()
  local session = session_of(local_sandbox())
  local ok, out = sandkit.run(function()
    local tasks = {}
    for i, argv in ipairs(argvs) do
      tasks[i] = sandkit.spawn(function() return session:exec(argv, { timeout = 60 }) end)
    end
    local all = {}
    for i, task in ipairs(tasks) do all[i] = assert(task:join()).stdout end
    return all
  end)
  if not ok then return fail(500, tostring(out)) end
  reply(out)
end

--- POST ?root=R&session=ID&mode=M, body: the argv -> the first frame read, then the handler
-- leaves the loop: mode "close" closes the iterator, "leave" only ends the request (which
-- must close the stream by itself, before any collection).
function app.leave_early()
  local argv = body_json()
  local session = session_of(local_sandbox())
  local frames = session:run(argv, { timeout = 60 })
  local first = frames()
  if ngx.var.arg_mode == "close" then frames:close() end
  -- Keeps the stream reachable until the request ends: nothing may wait for the collector.
  ngx.ctx.frames = frames
  reply(first)
end

--- POST [ request, … ] -> [ { status, headers, body } | { failure }, … ]: each request (an
-- http.exchange spec with `timeout` in seconds for its deadline) sent in turn from the worker.
function app.exchange()
  local http = require "sandkit.http"
  local answers = {}
  for i, spec in ipairs(body_json()) do
    spec.deadline = require("sandkit.core").now() + (spec.timeout or 10)
    local answer, failure = http.exchange(spec)
    answers[i] = answer and { status = answer.status, headers = answer.headers, body = answer.body }
      or { failure = failure }
  end
  reply(answers)
end

--- POST { url, pieces, length, fail_after } -> { status, body, progress } | { failure }: a PUT
-- whose body a reader hands over piece by piece (failing after `fail_after` pieces, if given).
function app.upload()
  local http = require "sandkit.http"
  local core = require "sandkit.core"
  local req = body_json()
  local i, progress = 0, nil
  local resp, failure = http.send{ method = "PUT", url = req.url, body_length = req.length,
    stall_timeout = 5, header_timeout = 5, on_body = function(n) progress = n end,
    body_reader = function()
      i = i + 1
      if req.fail_after and i > req.fail_after then return nil, "the source went away" end
      return req.pieces[i]
    end }
  if not resp then return reply{ failure = failure } end
  local body = resp:read_all(core.now() + 5)
  reply{ status = resp.status, body = body, progress = progress }
end

--- What one session's life looks like from the worker: created with the sandbox options (and
-- `id`, when given), argv streamed, a file written and read back, listed when `list` is set,
-- the session terminated. A table for JSON: { id, state, frames, listed } or { failed, err }.
local function roundtrip(req)
  local function failed(step, err) return { failed = step, err = tostring(err) } end
  local sandbox, err = sandkit.sandbox(req.options)
  if not sandbox then return failed("sandbox", err) end
  local session
  session, err = sandbox:create{ id = req.id }
  if not session then return failed("create", err) end
  local frames = {}
  local ok, run_err = pcall(function()
    for frame in session:run(req.argv, { timeout = 20 }) do frames[#frames + 1] = frame end
  end)
  if not ok then return failed("run", run_err) end
  local bytes = "through the gateway\0and back"
  ok, err = session:write_files{ ["/notes/a.txt"] = bytes }
  if not ok then return failed("write_files", err) end
  local back
  back, err = session:read_file("/notes/a.txt")
  if back ~= bytes then return failed("read_file", err or "read back other bytes") end
  local listed
  if req.list then
    local all
    all, err = sandbox:list()
    if not all then return failed("list", err) end
    for _, s in ipairs(all) do
      if s.id == session.id then listed = s.state end
    end
  end
  ok, err = session:terminate()
  if not ok then return failed("terminate", err) end
  return { id = session.id, state = session.state, frames = frames, listed = listed }
end

--- POST { options, argv, timeout } -> { result } of one exec in a session of a sandbox made
-- with the options, or { err = { code, message } }.
function app.exec_once()
  local req = body_json()
  local function failed(err) return reply{ err = { code = err.code, message = tostring(err) } } end
  local sandbox, err = sandkit.sandbox(req.options)
  if not sandbox then return failed(err) end
  local session
  session, err = sandbox:create{}
  if not session then return failed(err) end
  local result
  result, err = session:exec(req.argv, { timeout = req.timeout })
  if not result then return failed(err) end
  reply{ result = result }
end

--- POST { options, argv, id, list } -> the roundtrip above, run by this request.
function app.provider_roundtrip()
  reply(roundtrip(body_json()))
end

--- POST ?out=PATH, body as /roundtrip -> 204 at once; a timer then runs the roundtrip and
-- writes its JSON to PATH.
function app.provider_roundtrip_in_timer()
  local req = body_json()
  local out = ngx.unescape_uri(ngx.var.arg_out)
  assert(ngx.timer.at(0, function()
    local ok, result = pcall(roundtrip, req)
    if not ok then result = { failed = "timer", err = tostring(result) } end
    write_whole(out, cjson.encode(result))
  end))
  return ngx.exit(204)
end

--- POST ?root=R&session=ID&out=PATH, body: the argv -> 204 at once; a timer then runs the
-- command and writes its stdout to PATH.
function app.in_timer()
  local argv = body_json()
  local root, id, out = ngx.var.arg_root, ngx.var.arg_session, ngx.unescape_uri(ngx.var.arg_out)
  assert(ngx.timer.at(0, function()
    local sandbox = assert(sandkit.sandbox{ provider = "local", root = ngx.unescape_uri(root) })
    local result = assert(assert(sandbox:get(id)):exec(argv, { timeout = 60 }))
    write_whole(out, result.stdout)
  end))
  return ngx.exit(204)
end

--- GET -> what sandkit says when called in a phase without cosockets (set_by_lua).
function app.phase_refusal()
  local ok, err = pcall(function()
    return local_sandbox():create{}
  end)
  return ok and "no refusal" or tostring(err)
end

--- What sandkit says when asked for a local session under root in the phase this runs in.
function app.phase_probe(root)
  local ok, err = pcall(function()
    return assert(sandkit.sandbox{ provider = "local", root = root }):create{}
  end)
  return ok and "no refusal" or tostring(err)
end

--- Runs phase_probe in a phase that answers no request (init_by_lua, init_worker_by_lua) and
-- keeps what it said in the shared dict `phase_probe` under the phase's name, for
-- phase_report.
function app.probe_into_dict(root)
  ngx.shared.phase_probe:set(ngx.get_phase(), app.phase_probe(root))
end

--- GET ?phase=P -> what phase_probe said in phase P (probe_into_dict), or 404.
function app.phase_report()
  local said = ngx.shared.phase_probe:get(ngx.var.arg_phase or "")
  if not said then return fail(404, "nothing probed in that phase") end
  ngx.say(said)
end

--- POST ?root=R&session=ID, body: a list of argvs -> their stdout, each run by session:exec on
-- a light thread of its own (ngx.thread.spawn), all waited for with ngx.thread.wait.
function app.thread_fanout()
  local argvs = body_json()
  local session = session_of(local_sandbox())
  local threads = {}
  for i, argv in ipairs(argvs) do
    threads[i] = ngx.thread.spawn(function() return session:exec(argv, { timeout = 10 }) end)
  end
  local out = {}
  for i, thread in ipairs(threads) do
    local ok, result, err = ngx.thread.wait(thread)
    if not ok or not result then return fail(500, "thread " .. i .. ": " .. tostring(err or result)) end
    out[i] = result.stdout
  end
  reply(out)
end

--- POST { options, ids } -> the state of each session (or "absent"), read by one sandbox from
-- sandkit.run tasks at the same time, as requests of one worker sharing a sandbox would.
function app.fanout_get()
  local req = body_json()
  local sandbox = assert(sandkit.sandbox(req.options))
  local ok, states = sandkit.run(function()
    local tasks = {}
    for i, id in ipairs(req.ids) do
      tasks[i] = sandkit.spawn(function() return sandbox:get(id) end)
    end
    local out = {}
    for i, task in ipairs(tasks) do
      local session, err = task:join()
      out[i] = session and session.state or (err and tostring(err)) or "absent"
    end
    return out
  end)
  if not ok then return fail(500, tostring(states)) end
  reply(states)
end

--- Sandboxes made by shared_get, one per options document, as a gateway keeps one per worker.
local shared_sandboxes = {}

--- POST { options, id } -> { state } of the session (or "absent"), read by the sandbox every
-- request with the same options shares.
function app.shared_get()
  ngx.req.read_body()
  local text = ngx.req.get_body_data() or "{}"
  local req = cjson.decode(text)
  local key = cjson.encode(req.options)
  if not shared_sandboxes[key] then shared_sandboxes[key] = assert(sandkit.sandbox(req.options)) end
  local session, err = shared_sandboxes[key]:get(req.id)
  reply{ state = session and session.state or (err and tostring(err)) or "absent" }
end

--- GET ?options=PATH -> what sandkit says when a sandbox made from the JSON options in PATH
-- is asked for a session in a phase without cosockets (set_by_lua).
function app.get_refusal()
  local f = assert(io.open(ngx.unescape_uri(ngx.var.arg_options), "rb"))
  local options = cjson.decode(f:read("*a"))
  f:close()
  local sandbox = assert(sandkit.sandbox(options))
  local ok, err = pcall(function() return sandbox:get("phase-probe") end)
  return ok and "no refusal" or tostring(err)
end

--- Handlers sandkit.ngx.handle runs for /handled?case=NAME, each ending one way. The argument
-- is the one handled() passes on.
local HANDLED = {
  -- The README's idiom: a sandkit call's `nil, err` turned into a raise by assert.
  sandkit_error = function()
    assert(sandkit.sandbox{ provider = "local", root = "/nonexistent", rooot = true })
  end,
  internal_error = function()
    error(require("sandkit.errors").new("SANDBOX_UNREACHABLE", { operation = "sandbox.create", internal = true,
      message = "sandbox.create: refused for arn:aws:iam::123456789012:role/private" }))
  end,
  plain_error = function() assert(false, "the handler's own words") end,
  returns = function(argument)
    ngx.say("the handler ran with ", argument)
    return "its result", 2
  end,
  exits = function()
    ngx.status = 404
    ngx.say("not here")
    return ngx.exit(404)
  end,
  raises_after_output = function()
    ngx.say("the first line")
    ngx.flush(true)
    assert(sandkit.sandbox{ provider = "nosuch" })
  end,
}

--- The pause in effect, read by setting it (it has no getter) and setting it back.
local function current_pause()
  local pause = collectgarbage("setpause", 200)
  collectgarbage("setpause", pause)
  return pause
end

--- The most the heap held, and the collector's cycles, while `rounds` strings of 1 KiB were
-- made and dropped at once: small enough that the collector's steps keep pace with them, so
-- that when a cycle starts is what decides how many there are.
local function churn(rounds)
  local cycles, counting = 0, true
  -- A userdata's finalizer runs once per cycle when each makes the next (LuaJIT's tables have
  -- none).
  local function count()
    if not counting then return end
    cycles = cycles + 1
    getmetatable(rawget(_G, "newproxy")(true)).__gc = count
  end
  count()
  cycles = 0
  local peak, last = 0, nil
  for i = 1, rounds do
    last = string.rep("x", 1024) .. i
    local kb = collectgarbage("count")
    if kb > peak then peak = kb end
  end
  counting = false
  return { peak = peak * 1024, cycles = cycles, last_bytes = #last }
end

--- GET ?bytes=N -> what sandkit.ngx.collector_floor(N) does to this worker's collector: the
-- pause after a full cycle with a small live heap and with one larger than N, what churning
-- garbage costs with and without the floor, and the pause once the floor is taken away.
function app.collector_floor()
  local floor = tonumber(ngx.var.arg_bytes)
  local seen = { base_pause = current_pause() }
  sk_ngx.collector_floor(floor)
  collectgarbage("collect")
  seen.live = collectgarbage("count") * 1024
  seen.pause = current_pause()
  local held = { strings = {} }
  for i = 1, math.ceil(2 * floor / (64 * 1024)) do held.strings[i] = string.rep("k", 64 * 1024) .. i end
  collectgarbage("collect")
  seen.live_large = collectgarbage("count") * 1024
  seen.pause_large = current_pause()
  seen.held_strings = #held.strings
  held.strings = nil
  collectgarbage("collect")
  seen.base = collectgarbage("count") * 1024
  seen.with_floor = churn(40000)
  sk_ngx.collector_floor(nil)
  seen.pause_after_nil = current_pause()
  collectgarbage("collect")
  seen.pause_after_cycle = current_pause()
  seen.without_floor = churn(40000)
  reply(seen)
end

--- GET ?case=NAME -> what sandkit.ngx.handle makes of HANDLED[NAME]; for a handler that
-- returns, its results are said after its own output.
function app.handled()
  local results = { sk_ngx.handle(HANDLED[ngx.var.arg_case], "an argument") }
  ngx.say("handle returned ", table.concat(results, " "))
end

return app
