--- A small sandbox gateway inside OpenResty/nginx, on sandkit's local provider: a client with
-- the gateway's token creates sessions, runs commands in them and watches the output live,
-- moves files in and out, and removes them. Everything runs in the nginx worker without
-- blocking it (sandkit waits on cosockets and ngx.sleep there).
--
--   POST   /sessions                       -> 201 { "id": … }
--   POST   /sessions/{id}/run              { "argv": […], "timeout": s } -> text/event-stream
--                                           (?format=text: the output as plain text, for curl)
--   POST   /sessions/{id}/runs             { "argv": […], "timeout": s } -> 201 { "events": "/runs/{ticket}" }
--   GET    /runs/{ticket}                  -> text/event-stream (for EventSource, which cannot POST
--                                             or send headers: the ticket is single-use, 60 s)
--   POST   /sessions/{id}/terminals        -> 201 { "socket": "/terminals/{ticket}" }
--   GET    /terminals/{ticket}?cols=C&rows=R  a WebSocket to a shell on a terminal of the session
--                                           (the ticket instead of the token, as for /runs/)
--   GET    /sessions/{id}/jobs             -> { "jobs": [ { id, argv, running, pty, … } ] }
--   PUT    /sessions/{id}/files?path=/p    body: the bytes -> 204
--   GET    /sessions/{id}/files?path=/p    -> the bytes
--   DELETE /sessions/{id}                  -> 204
--
-- Every request but GET /runs/{ticket} carries `Authorization: Bearer <token>`, the token nginx
-- passes in $SANDKIT_GATEWAY_TOKEN. Events: `stdout`/`stderr` (data: base64 of the bytes, id:
-- the frame's seq), then `exit` (data: {"code":…,"truncated":…}) or `failure` (data: {"code":…,
-- "message":…}, what err:external() shows a tenant). As text: the output bytes, then
-- `sandkit: exit code N` (or `sandkit: error …`) as the last line and, for a client sending
-- `TE: trailers`, in the Sandkit-Exit trailer. nginx.conf has the directives it needs, and runs
-- each route under sandkit.ngx.handle, which logs what a route raises and answers it with a 500.

local cjson = require "cjson.safe"
local ws_server = require "nginx.websocket.server"
local sandkit = require "sandkit"
local sk_ngx = require "sandkit.ngx"

local gateway = {}

--- A command's timeout when the request gives none, and the most a request may ask for.
local DEFAULT_TIMEOUT = 60
local MAX_TIMEOUT = 3600
--- How long a run ticket waits for its EventSource.
local TICKET_TTL = 60
--- A terminal's shell lives at most this long, like any command of the gateway.
local TERMINAL_TIMEOUT = MAX_TIMEOUT
--- A terminal's size when the page gives none, and the most it may ask for (sandkit's bound).
local DEFAULT_COLS, DEFAULT_ROWS, MAX_SIZE = 80, 24, 10000
--- One WebSocket message from the page: keystrokes or a paste, far under this.
local MAX_MESSAGE = 64 * 1024
--- What a terminal runs: the session's bash when it has one, else its sh, as a login shell.
local SHELL = { "/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi" }
--- Arguments and bytes of one command: far more than a command line needs.
local MAX_ARGS = 256
local MAX_ARG_BYTES = 64 * 1024

local function token()
  return os.getenv("SANDKIT_GATEWAY_TOKEN")
end

--- The sandbox of this worker: local sessions under $SANDKIT_STATE, made on first use, whose
-- agents keep at most $SANDKIT_OUTPUT_CAP bytes per command stream (else the agent's default).
local sandbox
local function the_sandbox()
  if not sandbox then
    sandbox = assert(sandkit.sandbox{ provider = "local", root = os.getenv("SANDKIT_STATE"),
      output_cap = tonumber(os.getenv("SANDKIT_OUTPUT_CAP") or "") })
  end
  return sandbox
end

local function json_reply(status, value)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.say(cjson.encode(value))
  return ngx.exit(status)
end

local function refuse(status, message)
  return json_reply(status, { error = message })
end

--- n bytes from the kernel's generator (a read of a few bytes, which never waits).
local function random_bytes(n)
  local f = assert(io.open("/dev/urandom", "rb"))
  local bytes = f:read(n)
  f:close()
  assert(bytes and #bytes == n, "/dev/urandom gave too few bytes")
  return bytes
end

--- Compares the MACs of the two under a key of this worker's: how long the comparison takes
-- says nothing about how much of a guessed token was right.
local compare_key
local function same(a, b)
  if type(a) ~= "string" or type(b) ~= "string" then return false end
  compare_key = compare_key or random_bytes(32)
  return ngx.hmac_sha1(compare_key, a) == ngx.hmac_sha1(compare_key, b)
end

local function authorized()
  local expected = token()
  local given = (ngx.var.http_authorization or ""):match("^Bearer%s+(%S+)$")
  return expected ~= nil and expected ~= "" and same(given, expected)
end

--- The session named in the URL, or a 404.
local function session_of(id)
  local session, err = the_sandbox():get(id)
  if not session then
    if err then return refuse(502, err:external().message) end
    return refuse(404, "no session " .. id)
  end
  return session
end

--- The command of a run request: { argv, timeout }, or a 400.
local function command_of(text)
  local req = cjson.decode(text or "")
  if type(req) ~= "table" or type(req.argv) ~= "table" or #req.argv == 0 or #req.argv > MAX_ARGS then
    return refuse(400, "the body is { \"argv\": [\"program\", …], \"timeout\": seconds }")
  end
  local bytes = 0
  for i, v in ipairs(req.argv) do
    if type(v) ~= "string" then return refuse(400, "argv[" .. i .. "] is not a string") end
    bytes = bytes + #v
  end
  if bytes > MAX_ARG_BYTES then return refuse(400, "the command line is too long") end
  local timeout = tonumber(req.timeout) or DEFAULT_TIMEOUT
  if timeout <= 0 or timeout > MAX_TIMEOUT then
    return refuse(400, "timeout is between 0 and " .. MAX_TIMEOUT .. " seconds")
  end
  return { argv = req.argv, timeout = timeout }
end

local function read_body()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if not body and ngx.req.get_body_file() then
    local f = assert(io.open(ngx.req.get_body_file(), "rb"))
    body = f:read("*a")
    f:close()
  end
  return body or ""
end

--- Streams the command's output as server-sent events, or as text. A command that could not
-- start gets an error status; once the stream began, its end (exit or failure) comes last.
local function stream(session, command, format)
  local exit, err = sk_ngx.stream(session, command.argv, { timeout = command.timeout, format = format or "sse" })
  if not exit and not ngx.headers_sent then return refuse(502, err:external().message) end
end

local function new_ticket()
  return (random_bytes(24):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function files(session, method)
  local path = ngx.var.arg_path and ngx.unescape_uri(ngx.var.arg_path)
  if not path or path == "" then return refuse(400, "files need ?path=/a/file") end
  if method == "PUT" then
    local ok, err = session:write_files{ [path] = read_body() }
    if not ok then return refuse(err.code == "SANDBOX_COMMAND_FAILED" and 400 or 502, err:external().message) end
    return ngx.exit(204)
  end
  local bytes, err = session:read_file(path)
  if not bytes then
    return refuse(err.status == 404 and 404 or err.code == "SANDBOX_COMMAND_FAILED" and 400 or 502,
      err:external().message)
  end
  ngx.header["Content-Type"] = "application/octet-stream"
  ngx.print(bytes)
end

--- location /sessions
function gateway.sessions()
  if not authorized() then return refuse(401, "a bearer token is required") end
  local method = ngx.req.get_method()
  local uri = ngx.var.uri
  if uri == "/sessions" and method == "POST" then
    local session, err = the_sandbox():create{}
    if not session then return refuse(502, err:external().message) end
    return json_reply(201, { id = session.id })
  end
  local id, rest = uri:match("^/sessions/([%w_%-]+)(.*)$")
  if not id then return refuse(404, "no such route") end
  if rest == "" and method == "DELETE" then
    local ok, err = the_sandbox():terminate(id)
    if not ok then return refuse(502, err:external().message) end
    return ngx.exit(204)
  end
  if rest == "/run" and method == "POST" then
    local command = command_of(read_body())
    return stream(session_of(id), command, ngx.var.arg_format == "text" and "text" or "sse")
  end
  if rest == "/runs" and method == "POST" then
    local command = command_of(read_body())
    session_of(id)
    local ticket = new_ticket()
    local ok, err = ngx.shared.sandkit_runs:add(ticket, cjson.encode{ session = id, argv = command.argv,
      timeout = command.timeout }, TICKET_TTL)
    if not ok then return refuse(503, "no room for another run ticket: " .. tostring(err)) end
    return json_reply(201, { events = "/runs/" .. ticket })
  end
  if rest == "/terminals" and method == "POST" then
    session_of(id)
    local ticket = new_ticket()
    local ok, err = ngx.shared.sandkit_runs:add(ticket, cjson.encode{ session = id, terminal = true }, TICKET_TTL)
    if not ok then return refuse(503, "no room for another terminal ticket: " .. tostring(err)) end
    return json_reply(201, { socket = "/terminals/" .. ticket })
  end
  if rest == "/jobs" and method == "GET" then
    local list, err = session_of(id):jobs()
    if not list then return refuse(502, err:external().message) end
    return json_reply(200, { jobs = list })
  end
  if rest == "/files" and (method == "PUT" or method == "GET") then
    return files(session_of(id), method)
  end
  return refuse(404, "no such route")
end

--- location /runs/ — an EventSource's GET, with a ticket instead of the token.
function gateway.runs()
  local ticket = ngx.var.uri:match("^/runs/(%x+)$")
  local runs = ngx.shared.sandkit_runs
  -- Single use: taken out before anything runs, so a reconnecting EventSource cannot run the
  -- command twice (it gets a 404, which stops it).
  local text = ticket and runs:get(ticket)
  if not text or not runs:add("used:" .. ticket, true, TICKET_TTL) then return refuse(404, "no such run") end
  runs:delete(ticket)
  local run = cjson.decode(text)
  return stream(session_of(run.session), run)
end

--- A size from the page's query: an integer from 1 to MAX_SIZE, or the default.
local function dimension(text, default)
  local n = tonumber(text)
  if not n or n % 1 ~= 0 or n < 1 or n > MAX_SIZE then return default end
  return n
end

--- location /terminals/ — a WebSocket to a shell on a terminal of the session (a ticket made by
-- POST /sessions/{id}/terminals, single use). The page sends text messages, JSON: {"input":
-- "…"} (what was typed) or {"resize": [cols, rows]}; the gateway sends the terminal's output as
-- binary messages, and {"exit": code} as text when the shell ends. When the page goes, the
-- shell goes with it: its job is cancelled, which kills its process group.
function gateway.terminal()
  local ticket = ngx.var.uri:match("^/terminals/(%x+)$")
  local runs = ngx.shared.sandkit_runs
  local text = ticket and runs:get(ticket)
  if not text or not runs:add("used:" .. ticket, true, TICKET_TTL) then return refuse(404, "no such terminal") end
  runs:delete(ticket)
  local entry = cjson.decode(text)
  if not entry.terminal then return refuse(404, "no such terminal") end
  local session = session_of(entry.session)
  local cols, rows = dimension(ngx.var.arg_cols, DEFAULT_COLS), dimension(ngx.var.arg_rows, DEFAULT_ROWS)
  local wb, werr = ws_server:new{ max_payload_len = MAX_MESSAGE }
  if not wb then return refuse(400, "a WebSocket is needed: " .. tostring(werr)) end
  local shell, err = session:spawn(SHELL, { timeout = TERMINAL_TIMEOUT, pty = { cols = cols, rows = rows } })
  if not shell then
    wb:send_text(cjson.encode{ failure = err:external().message })
    return wb:send_close()
  end
  -- nginx.conf's lua_check_client_abort would end this request at once when the page goes,
  -- before anything below could run: the shell is cancelled first.
  ngx.on_abort(function()
    shell:cancel()
    ngx.exit(499)
  end)
  -- Output on a light thread of its own, input here: a cosocket takes one reader and one writer.
  local output = ngx.thread.spawn(function()
    local ok, failure = pcall(function()
      for frame in shell:frames() do
        if frame.type == "exit" then
          wb:send_text(cjson.encode{ exit = frame.code })
        elseif not wb:send_binary(frame.data) then
          return
        end
      end
    end)
    if not ok then wb:send_text(cjson.encode{ failure = tostring(failure) }) end
  end)
  while true do
    local data, kind, rerr = wb:recv_frame()
    if not data and not (rerr and rerr:find("timeout", 1, true)) then break end
    if kind == "close" then break end
    if kind == "ping" then wb:send_pong(data) end
    if kind == "text" then
      local message = cjson.decode(data)
      if type(message) == "table" and type(message.input) == "string" then
        if not shell:write(message.input) then break end
      elseif type(message) == "table" and type(message.resize) == "table" then
        local c = dimension(message.resize[1], nil)
        local r = dimension(message.resize[2], nil)
        if c and r then shell:resize(c, r) end
      end
    end
  end
  shell:cancel()
  ngx.thread.kill(output)
  wb:send_close()
end

return gateway
