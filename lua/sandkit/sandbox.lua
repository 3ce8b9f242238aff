--- Sandbox, Session and Job objects: the public API (README.md) over any provider.
--
-- Capabilities are checked here, before a provider is asked anything: an operation a provider
-- cannot do fails with OPERATION_NOT_SUPPORTED and sends nothing.
--
-- A provider implements:
--   provider.name
--   provider:capabilities()                         -> { files=, jobs=, reconnect=, preview=,
--                                                        pause_resume=, snapshot=, list= }
--   provider:create(opts)                           -> record | nil, err
--   provider:get(id)                                -> record | nil (absent) | nil, err
--   provider:list()                                 -> { record… } | nil, err
--   provider:terminate(id)                          -> true | nil, err
--   provider:connection(record)                     -> conn (see protocol.lua) | nil, err
-- and optionally get_or_create(opts) -> record, created (opts.id is set); session_capabilities(record);
-- preview(record, port); pause(record); resume(record); snapshot(record); and
-- refusals = { [capability] = "why not, and what to do instead" }.
-- A record is { id =, state =, generation = } plus whatever the provider keeps.
-- A connection may carry `ops`, replacing protocol functions for sessions without an agent.

local errors = require "sandkit.errors"
local protocol = require "sandkit.protocol"
local wait = require "sandkit.wait"

local sandbox = {}

local sandbox_mt, session_mt, job_mt = {}, {}, {}
sandbox_mt.__index = sandbox_mt
session_mt.__index = session_mt
job_mt.__index = job_mt

--- Which capability each gated operation needs, and the operation name errors carry.
local NEEDS = {
  read_file = { "files", "sandbox.readFile" },
  write_files = { "files", "sandbox.writeFiles" },
  mkdir = { "files", "sandbox.mkdir" },
  start_job = { "jobs", "sandbox.jobStart" },
  job = { "jobs", "sandbox.jobPoll" },
  preview = { "preview", "sandbox.preview" },
  pause = { "pause_resume", "sandbox.pause" },
  resume = { "pause_resume", "sandbox.resume" },
  snapshot = { "snapshot", "sandbox.snapshot" },
  list = { "list", "sandbox.list" },
  get = { "reconnect", "sandbox.get" },
}

--- A provider may say why it lacks a capability (provider.refusals[capability]), e.g. where
-- to turn instead; otherwise the refusal names the provider and the capability.
local function refuse(caps, what, provider)
  local need = NEEDS[what]
  if caps[need[1]] then return nil end
  local reason = provider.refusals and provider.refusals[need[1]]
  return errors.not_supported(need[2],
    reason or ("the " .. provider.name .. " provider does not offer " .. need[1]))
end

function sandbox.new(provider, options)
  return setmetatable({ provider = provider, options = options or {} }, sandbox_mt)
end

function sandbox_mt:capabilities()
  local caps = {}
  for k, v in pairs(self.provider:capabilities()) do caps[k] = v end
  return caps
end

local function new_session(sb, record)
  return setmetatable({
    id = record.id,
    state = record.state,
    generation = record.generation or 1,
    boot_id = record.boot_id,
    sandbox = sb,
    record = record,
  }, session_mt)
end

local function check_id(id, operation)
  if id ~= nil and type(id) ~= "string" then
    error("sandkit: " .. operation .. ": a session id is a string", 3)
  end
end

function sandbox_mt:create(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("sandkit: create takes an options table", 2) end
  check_id(opts.id, "create")
  local record, err = self.provider:create(opts)
  if not record then return nil, err end
  return new_session(self, record)
end

function sandbox_mt:get(id)
  check_id(id, "get")
  if id == nil then error("sandkit: get needs an id", 2) end
  local refusal = refuse(self.provider:capabilities(), "get", self.provider)
  if refusal then return nil, refusal end
  local record, err = self.provider:get(id)
  if not record then return nil, err end
  return new_session(self, record)
end

--- Returns the session with opts.id, creating it when absent; `created` comes from the path
-- taken. Not atomic: two callers racing on one id may both see created = true. Without an
-- id there is nothing to get: it creates. A provider's own get_or_create sees only ids.
function sandbox_mt:get_or_create(opts)
  opts = opts or {}
  check_id(opts.id, "get_or_create")
  if opts.id == nil then
    local session, err = self:create(opts)
    if not session then return nil, err end
    return session, true
  end
  if self.provider.get_or_create then
    local record, created = self.provider:get_or_create(opts)
    if not record then return nil, created end
    return new_session(self, record), created
  end
  local record, err = self.provider:get(opts.id)
  if record then return new_session(self, record), false end
  if err then return nil, err end
  local session
  session, err = self:create(opts)
  if not session then return nil, err end
  return session, true
end

function sandbox_mt:list()
  local refusal = refuse(self.provider:capabilities(), "list", self.provider)
  if refusal then return nil, refusal end
  local records, err = self.provider:list()
  if not records then return nil, err end
  local sessions = {}
  for i, record in ipairs(records) do sessions[i] = new_session(self, record) end
  return sessions
end

--- Idempotent: terminating an absent session succeeds.
function sandbox_mt:terminate(id)
  check_id(id, "terminate")
  if id == nil then error("sandkit: terminate needs an id", 2) end
  return self.provider:terminate(id)
end

-- Sessions ----------------------------------------------------------------------------------

function session_mt:capabilities()
  local provider = self.sandbox.provider
  local caps = provider.session_capabilities and provider:session_capabilities(self.record)
    or provider:capabilities()
  local copy = {}
  for k, v in pairs(caps) do copy[k] = v end
  return copy
end

local function gate(session, what)
  return refuse(session:capabilities(), what, session.sandbox.provider)
end

--- The protocol connection to this session's agent, made on first use and kept.
local function connection(session)
  if session.conn then return session.conn end
  local conn, err = session.sandbox.provider:connection(session.record)
  if not conn then return nil, err end
  session.conn = conn
  return conn
end

local function ops(conn)
  return conn.ops or protocol
end

--- A command's options with the sandbox's default timeout and the session's default
-- environment (conn.default_env, from create{ env = … }) filled in; the command's own wins.
local function command_options(session, opts, conn)
  if opts ~= nil and type(opts) ~= "table" then error("sandkit: command options are a table", 3) end
  opts = opts or {}
  local filled = {}
  for k, v in pairs(opts) do filled[k] = v end
  if filled.timeout == nil then filled.timeout = session.sandbox.options.command_timeout end
  if conn.default_env and next(conn.default_env) then
    local env = {}
    for k, v in pairs(conn.default_env) do env[k] = v end
    if type(opts.env) == "table" then
      for k, v in pairs(opts.env) do env[k] = v end
    end
    filled.env = env
  end
  return filled
end

--- Starts a command and returns its output stream (stream:next() -> frame | nil, err).
function session_mt:stream(argv, opts)
  local conn, err = connection(self)
  if not conn then return nil, err end
  return ops(conn).exec(conn, argv, command_options(self, opts, conn))
end

local function next_frame(stream)
  local frame, err = stream:next()
  if frame then return frame end
  if err then error(err, 0) end
  return nil
end

--- The iterator session:run returns: called by the `for` loop, closed by :close() — or, on
-- Lua 5.4, by the loop itself, as its to-be-closed value.
local frames_mt = {}
frames_mt.__index = frames_mt

function frames_mt:__call()
  if self.failed then error(self.failed, 0) end
  return next_frame(self.stream)
end

--- Closes the stream (idempotent): the connection drops, which cancels a command still running.
function frames_mt:close()
  if self.stream then self.stream:close() end
end
frames_mt.__close = frames_mt.close

--- for frame in session:run(argv, opts) do … end
-- Frames are tables ({ type = "stdout"|"stderr", seq =, data = } then { type = "exit", code =,
-- truncated =, signal = }). Any failure raises a sandkit error from the loop, so a stream that
-- stops short can never look like success. The iterator has :close(), which drops the
-- connection and so cancels the command. On Lua 5.4 it is the loop's to-be-closed value:
-- `break` or an error closes it at once. LuaJIT has no to-be-closed variables, so a loop
-- there that may end early keeps the iterator and closes it (README, "Leaving a loop early"):
--   local frames = session:run(argv, opts)
--   for frame in frames do … end
--   frames:close()
function session_mt:run(argv, opts)
  local stream, err = self:stream(argv, opts)
  local frames = setmetatable({ stream = stream, failed = not stream and err or nil }, frames_mt)
  return frames, nil, nil, frames
end

--- Default bytes exec keeps per stream; the head is kept, the rest counted as truncated.
local DEFAULT_MAX_OUTPUT = 1024 * 1024

--- Runs a command to its end: { code =, stdout =, stderr =, truncated =, signal = } or nil, err.
function session_mt:exec(argv, opts)
  if opts ~= nil and type(opts) ~= "table" then error("sandkit: command options are a table", 2) end
  opts = opts or {}
  local limit = opts.max_output or DEFAULT_MAX_OUTPUT
  if type(limit) ~= "number" or limit < 0 then error("sandkit: max_output must be a byte count", 2) end
  local stream, err = self:stream(argv, opts)
  if not stream then return nil, err end
  local kept = { stdout = {}, stderr = {} }
  local size = { stdout = 0, stderr = 0 }
  local cut = false
  while true do
    local frame
    frame, err = stream:next()
    if not frame then
      stream:close()
      return nil, err or errors.unanswered("sandbox.runCommand",
        "the output stream ended without a terminal frame")
    end
    local kind = frame.type
    if kind == "exit" then
      return {
        code = frame.code,
        stdout = table.concat(kept.stdout),
        stderr = table.concat(kept.stderr),
        truncated = frame.truncated or cut,
        signal = frame.signal,
      }
    end
    local room = limit - size[kind]
    local data = frame.data
    if #data > room then
      cut = true
      data = data:sub(1, room)
    end
    if #data > 0 then
      kept[kind][#kept[kind] + 1] = data
      size[kind] = size[kind] + #data
    end
  end
end

function session_mt:start_job(argv, opts)
  local refusal = gate(self, "start_job")
  if refusal then return nil, refusal end
  local conn, err = connection(self)
  if not conn then return nil, err end
  local id
  id, err = ops(conn).job_start(conn, argv, command_options(self, opts, conn))
  if not id then return nil, err end
  return setmetatable({ id = id, session = self }, job_mt)
end

--- A handle on a job by id: reattaching needs no request (the first poll tells).
function session_mt:job(id)
  if type(id) ~= "string" then error("sandkit: a job id is a string", 2) end
  local refusal = gate(self, "job")
  if refusal then return nil, refusal end
  return setmetatable({ id = id, session = self }, job_mt)
end

function session_mt:read_file(path)
  local refusal = gate(self, "read_file")
  if refusal then return nil, refusal end
  local conn, err = connection(self)
  if not conn then return nil, err end
  return ops(conn).read_file(conn, path)
end

function session_mt:write_files(files)
  local refusal = gate(self, "write_files")
  if refusal then return nil, refusal end
  local conn, err = connection(self)
  if not conn then return nil, err end
  return ops(conn).write_files(conn, files)
end

function session_mt:mkdir(path)
  local refusal = gate(self, "mkdir")
  if refusal then return nil, refusal end
  local conn, err = connection(self)
  if not conn then return nil, err end
  return ops(conn).mkdir(conn, path)
end

local function provider_call(session, what, ...)
  local refusal = gate(session, what)
  if refusal then return nil, refusal end
  local provider = session.sandbox.provider
  if not provider[what] then
    return nil, errors.not_supported(NEEDS[what][2], "the " .. provider.name
      .. " provider does not offer " .. NEEDS[what][1])
  end
  return provider[what](provider, session.record, ...)
end

--- { endpoint =, headers = {…}, allowed_ports = {…}, expires_in = seconds }
function session_mt:preview(port)
  if type(port) ~= "number" or port % 1 ~= 0 or port < 1 or port > 65535 then
    error("sandkit: preview needs a port number", 2)
  end
  return provider_call(self, "preview", port)
end

function session_mt:pause()
  local ok, err = provider_call(self, "pause")
  if ok then self.state = "paused" end
  return ok, err
end

function session_mt:resume()
  local ok, err = provider_call(self, "resume")
  if ok then
    self.state = "running"
    self.conn = nil -- a woken sandbox may sit behind a fresh route
  end
  return ok, err
end

function session_mt:snapshot()
  return provider_call(self, "snapshot")
end

function session_mt:terminate()
  local ok, err = self.sandbox.provider:terminate(self.id)
  if ok then self.state = "terminated" end
  return ok, err
end

-- Jobs --------------------------------------------------------------------------------------

--- One poll: { running =, frames = {…}, exit = { code =, truncated = } | nil,
-- error = { code =, message = } | nil }. `since` is the highest seq already seen.
function job_mt:poll(since)
  local conn, err = connection(self.session)
  if not conn then return nil, err end
  return ops(conn).job_poll(conn, self.id, since)
end

function job_mt:cancel()
  local conn, err = connection(self.session)
  if not conn then return nil, err end
  return ops(conn).job_cancel(conn, self.id)
end

--- for frame in job:frames{ since = nil, interval = 0.2 } do … end
-- Polls with a cursor and yields each frame once, in order, ending with the exit frame; a job
-- that ended in an error raises it, as a failed poll does.
function job_mt:frames(opts)
  opts = opts or {}
  local interval = opts.interval or 0.2
  if type(interval) ~= "number" or interval <= 0 then
    error("sandkit: interval must be a positive number of seconds", 2)
  end
  local since = opts.since
  local queue, head = {}, 1
  local finished, failure = false, nil
  local job = self
  return function()
    while true do
      -- Delivered frames stay in the page until the next one replaces it: a hole at its head
      -- would leave #queue to the interpreter's choice of border.
      if head <= #queue then
        head = head + 1
        return queue[head - 1]
      end
      -- Raised only once every frame before it was delivered: output that arrived is never lost.
      if failure then error(failure, 0) end
      if finished then return nil end
      queue, head = {}, 1
      local page, err = job:poll(since)
      if not page then error(err, 0) end
      for _, frame in ipairs(page.frames) do
        -- The agent's cursor is exclusive; this only guards against a peer that repeats itself.
        if since == nil or frame.seq > since then
          queue[#queue + 1] = frame
          since = frame.seq
        end
      end
      if not page.running then
        finished = true
        if page.exit then
          queue[#queue + 1] = { type = "exit", code = page.exit.code,
            truncated = page.exit.truncated, signal = page.exit.signal }
        elseif page.error then
          failure = errors.command_failed(page.error.code, page.error.message,
            { operation = "sandbox.jobPoll", job_id = job.id })
        else
          failure = errors.unanswered("sandbox.jobPoll",
            "the job ended and reported neither an exit nor an error", { job_id = job.id })
        end
      elseif #queue == 0 then
        wait.sleep(interval)
      end
    end
  end
end

sandbox.session_metatable = session_mt
sandbox.job_metatable = job_mt

return sandbox
