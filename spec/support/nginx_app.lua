--- The handlers the nginx specs' test server runs (spec/support/nginx.lua puts spec/ on its
-- lua_package_path): each location calls one function here, which uses sandkit inside the
-- worker exactly as a gateway would, and answers what it saw as JSON or as a stream.

local cjson = require "cjson"
local sandkit = require "sandkit"
local sk_ngx = require "sandkit.ngx"
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

--- POST ?root=R&session=ID, body: the argv as JSON -> { code, stdout, stderr } of exec.
function app.exec()
  local argv = body_json()
  local result, err = session_of(local_sandbox()):exec(argv, { timeout = 60 })
  if not result then return fail(502, tostring(err)) end
  reply{ code = result.code, stdout = result.stdout, stderr = result.stderr }
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

--- POST { options, argv } -> what one session's life looked like from the worker: created with
-- the sandbox options, argv streamed, a file written and read back, the session terminated.
function app.provider_roundtrip()
  local req = body_json()
  local function failed(step, err) return reply{ failed = step, err = tostring(err) } end
  local sandbox, err = sandkit.sandbox(req.options)
  if not sandbox then return failed("sandbox", err) end
  local session
  session, err = sandbox:create{}
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
  ok, err = session:terminate()
  if not ok then return failed("terminate", err) end
  reply{ id = session.id, state = session.state, frames = frames }
end

--- POST ?root=R&session=ID&out=PATH, body: the argv -> 204 at once; a timer then runs the
-- command and writes its stdout to PATH (through a rename, so a reader sees all of it or none).
function app.in_timer()
  local argv = body_json()
  local root, id, out = ngx.var.arg_root, ngx.var.arg_session, ngx.unescape_uri(ngx.var.arg_out)
  assert(ngx.timer.at(0, function()
    local sandbox = assert(sandkit.sandbox{ provider = "local", root = ngx.unescape_uri(root) })
    local result = assert(assert(sandbox:get(id)):exec(argv, { timeout = 60 }))
    local f = assert(io.open(out .. ".tmp", "wb"))
    f:write(result.stdout)
    f:close()
    assert(os.rename(out .. ".tmp", out))
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

return app
