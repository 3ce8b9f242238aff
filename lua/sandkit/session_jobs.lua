--- Interactive processes (README, "Interactive processes"): session:spawn and session:jobs, and
-- on a job p:write, p:close_stdin, p:resize, p:signal, p:wait and live p:frames, over
-- sandkit.protocol_jobs; and the input of session:run and session:exec ({ stdin = S }). Each
-- checks the session's capability, its arguments and that the session's agent offers the
-- extension, before anything is sent.

local errors = require "sandkit.errors"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local protocol_jobs = require "sandkit.protocol_jobs"

local session_jobs = {}

local OPS = protocol_jobs.OPERATIONS
local START = protocol.OPERATIONS.job_start

--- Which capability and extension each call needs (sandbox.lua's NEEDS holds the capabilities;
-- the extension is the agent's, docs/protocol.md §6).
session_jobs.NEEDS = {
  spawn_stdin = { "stdin", START }, spawn_pty = { "pty", START }, jobs = { "jobs", OPS.list },
  write = { "stdin", OPS.write }, resize = { "pty", OPS.resize }, signal = { "jobs", OPS.signal },
}
local EXTENSION = { spawn_stdin = "jobStdin", spawn_pty = "jobPty", jobs = "jobList",
  write = "jobStdin", resize = "jobPty", signal = "jobSignal" }

local SPAWN_OPTIONS = options_check.set{ "id", "stdin", "pty" }

--- Bytes of input one request carries: a string of any size goes in pieces this large, each
-- written exactly once, so a lost answer costs one piece sent again, and neither side holds
-- more than a piece of it in a request.
session_jobs.WRITE_PIECE = 4 * 1024 * 1024
--- Sends of one piece whose answer was lost, before its failure is the write's.
local WRITE_ATTEMPTS = 3
--- Reattaching a live stream that failed: as many times in a row as this, without a frame.
local STREAM_ATTEMPTS = 3

--- Whether err says the request's answer never came: the bytes may or may not have been taken,
-- and the same bytes at the same offset are safe to send again.
local function unanswered(err)
  return err.code == "SANDBOX_UNREACHABLE" or err.code == "SANDBOX_OUTCOME_UNKNOWN"
end

--- Installs the methods; `h` is sandbox.lua's: gate(session, what), connection(session),
-- job_metatable, and command_options(session, opts, conn).
function session_jobs.install(session_mt, job_mt, h)
  --- The connection, once the capability and the agent's extension were checked; or nil and
  -- the refusal.
  local function ready(session, what)
    local refusal = h.gate(session, what)
    if refusal then return nil, refusal end
    local conn, err = h.connection(session)
    if not conn then return nil, err end
    -- Features the session has read are the agent's word; a session that never read them
    -- (reached by id without a health check) asks, and an agent without the route says so.
    local extension, features = EXTENSION[what], conn.features
    if conn.ops or (features and next(features) ~= nil and not features[extension]) then
      return nil, errors.not_supported(session_jobs.NEEDS[what][2], "this session's agent does not offer the "
        .. extension .. " extension (docs/protocol.md §6); a newer sandkit-agent does")
    end
    return conn
  end

  --- A terminal's size as the caller gave it: nil, or the INVALID_INPUT refusal.
  local function check_size(operation, cols, rows)
    for _, d in ipairs{ { "cols", cols }, { "rows", rows } } do
      local v = d[2]
      if type(v) ~= "number" or v % 1 ~= 0 or v < 1 or v > protocol_jobs.PTY_MAX then
        return errors.invalid_input(operation, d[1], string.format(
          "%s is a whole number from 1 to %d", d[1], protocol_jobs.PTY_MAX))
      end
    end
  end

  --- p = session:spawn(argv, { timeout =, stdin = true, pty = { cols =, rows = }, id =, cwd =,
  -- env = }): a job (p.id, p:poll, p:frames, p:cancel) that also takes input. A pty job's
  -- standard input, output and error are a terminal, its output arrives as stdout.
  function session_mt:spawn(argv, opts)
    if opts ~= nil and type(opts) ~= "table" then error("sandkit: spawn options are a table", 2) end
    opts = opts or {}
    local refusal = options_check.check(START, opts, options_check.set{ "timeout", "cwd", "env" },
      SPAWN_OPTIONS)
    if refusal then return nil, refusal end
    if opts.stdin ~= nil and type(opts.stdin) ~= "boolean" then
      return nil, errors.invalid_input(START, "stdin", "stdin is true (a pipe the job reads) or false")
    end
    local pty = opts.pty
    if pty ~= nil then
      if type(pty) ~= "table" then
        return nil, errors.invalid_input(START, "pty", "pty is { cols =, rows = }")
      end
      refusal = check_size(START, pty.cols, pty.rows)
      if refusal then return nil, refusal end
    end
    local conn, err
    if pty then
      conn, err = ready(self, "spawn_pty")
    elseif opts.stdin then
      conn, err = ready(self, "spawn_stdin")
    else
      refusal = h.gate(self, "start_job")
      if refusal then return nil, refusal end
      conn, err = h.connection(self)
    end
    if not conn then return nil, err end
    local filled = h.command_options(self, opts, conn)
    local id
    id, err = (conn.ops or protocol).job_start(conn, argv, filled)
    if not id then return nil, err end
    return setmetatable({ id = id, session = self, timeout = filled.timeout,
      stdin_offset = (opts.stdin or pty) and 0 or nil, pty = pty ~= nil }, job_mt)
  end

  --- { { id =, argv =, running =, started_at =, code =, signal =, error =, stdin =, pty =,
  -- stdin_offset = }, … }: the jobs the session's agent holds, running and ended.
  function session_mt:jobs()
    local conn, err = ready(self, "jobs")
    if not conn then return nil, err end
    return protocol_jobs.list(conn)
  end

  --- One piece at the job's offset, sent again while its answer is lost: the agent skips what
  -- it already took, so each byte is taken once. Returns the answer or nil, err.
  local function write_piece(job, conn, piece, close)
    local attempts = 0
    while true do
      local answer, err = protocol_jobs.write(conn, job.id, job.stdin_offset, piece, close)
      if answer then return answer end
      attempts = attempts + 1
      if not unanswered(err) or attempts >= WRITE_ATTEMPTS then return nil, err end
    end
  end

  --- The offset the job's input is at, asked of the agent for a handle that does not know it
  -- (one made by session:job(id)): an empty write answers with it.
  local function known_offset(job, conn)
    if job.stdin_offset then return true end
    job.stdin_offset = 0
    local answer, err = write_piece(job, conn, "", false)
    if not answer then
      job.stdin_offset = nil
      return nil, err
    end
    job.stdin_offset = answer.offset
    return true
  end

  --- Writes bytes to the job's input; returns true once the agent has taken every one, each
  -- exactly once however often an answer is lost. `offset` (optional) is where bytes starts in
  -- the job's input — another process resuming a write gives the offset it started from.
  function job_mt:write(bytes, offset)
    if type(bytes) ~= "string" then error("sandkit: write takes a string", 2) end
    if offset ~= nil and (type(offset) ~= "number" or offset % 1 ~= 0 or offset < 0) then
      error("sandkit: an input offset is a non-negative whole number", 2)
    end
    local conn, err = ready(self.session, "write")
    if not conn then return nil, err end
    if offset then
      self.stdin_offset = offset
    else
      local ok
      ok, err = known_offset(self, conn)
      if not ok then return nil, err end
    end
    local at = 1
    repeat
      -- A string of one piece goes as it is: a copy of it would cost as much as its sending.
      local piece = #bytes <= session_jobs.WRITE_PIECE and bytes or bytes:sub(at, at + session_jobs.WRITE_PIECE - 1)
      local answer
      answer, err = write_piece(self, conn, piece, false)
      if not answer then return nil, err end
      -- What the agent has is where the next byte goes: past this piece when an earlier
      -- writer had sent further.
      self.stdin_offset = math.max(answer.offset, self.stdin_offset + #piece)
      at = at + #piece
    until at > #bytes
    return true
  end

  --- Ends the job's input once what was written is read (a terminal gets its end-of-file
  -- character, ^D, instead: it stays the job's terminal).
  function job_mt:close_stdin()
    local conn, err = ready(self.session, "write")
    if not conn then return nil, err end
    local ok
    ok, err = known_offset(self, conn)
    if not ok then return nil, err end
    local answer
    answer, err = write_piece(self, conn, "", true)
    if not answer then return nil, err end
    self.stdin_offset = answer.offset
    return true
  end

  function job_mt:resize(cols, rows)
    local refusal = check_size(OPS.resize, cols, rows)
    if refusal then return nil, refusal end
    local conn, err = ready(self.session, "resize")
    if not conn then return nil, err end
    return protocol_jobs.resize(conn, self.id, cols, rows)
  end

  --- Sends a signal by name (INT, TERM, HUP, KILL, QUIT, USR1, USR2, WINCH) to the job's
  -- process group.
  function job_mt:signal(name)
    if type(name) ~= "string" or not protocol_jobs.SIGNALS[name] then
      return nil, errors.invalid_input(OPS.signal, "signal",
        "a signal is one of INT, TERM, HUP, KILL, QUIT, USR1, USR2 and WINCH")
    end
    local conn, err = ready(self.session, "signal")
    if not conn then return nil, err end
    return protocol_jobs.signal(conn, self.id, name)
  end

  --- Whether the job's frames can be followed live (§6 jobStream); else they are polled.
  local function live(job)
    local conn = h.connection(job.session)
    return conn and conn.ops == nil and conn.features and conn.features.jobStream == true and conn
  end

  local polled_frames = job_mt.frames

  --- for frame in p:frames{ since = nil } do … end: each frame once, in order, ending with the
  -- exit frame, as they happen where the agent streams jobs (a stream that fails is followed
  -- again from the last frame seen), polled every `interval` seconds elsewhere.
  function job_mt:frames(opts)
    local conn = live(self)
    if not conn then return polled_frames(self, opts) end
    local refusal = options_check.check("sandbox.jobPoll", opts, options_check.set{ "since", "interval" })
    if refusal then return function() error(refusal, 0) end end
    local since = opts and opts.since
    local job, stream, failures, done = self, nil, 0, false
    return function()
      while not done do
        if not stream then
          local err
          stream, err = protocol_jobs.stream(conn, job.id, since, job.timeout)
          if not stream then error(err, 0) end
        end
        local frame, err = stream:next()
        if frame then
          failures = 0
          if frame.type == "exit" then
            done = true
          elseif since == nil or frame.seq > since then
            since = frame.seq
          else
            frame = nil -- a frame already delivered, from a stream followed again
          end
          if frame then return frame end
        else
          stream = nil
          if not err then
            done = true
          else
            failures = failures + 1
            if not unanswered(err) or failures >= STREAM_ATTEMPTS then
              done = true
              error(err, 0)
            end
          end
        end
      end
      return nil
    end
  end

  --- Waits for the job's end: its exit code, and the signal that ended it as a second value.
  function job_mt:wait()
    local ok, code, signal = pcall(function()
      for frame in self:frames() do
        if frame.type == "exit" then return frame.code, frame.signal end
      end
      error(errors.unanswered("sandbox.jobPoll", "the job's frames ended without its exit", { job_id = self.id }), 0)
    end)
    if not ok then return nil, code end
    return code, signal
  end
end

--- The bytes of `source` (a string, an object with :read(n), or a function returning chunks
-- then nil) as a reader of pieces: a string goes whole, the others a chunk at a time.
local function pieces(source)
  if type(source) == "string" then
    local given = false
    return function()
      if given then return nil end
      given = true
      return source
    end
  end
  if type(source) == "function" then return source end
  if (type(source) == "table" or type(source) == "userdata") and source.read then
    return function() return source:read(64 * 1024) end
  end
  error("sandkit: stdin is a string, an object with :read(n), or a function returning chunks", 4)
end

--- For session:run and session:exec with { stdin = S }: a job with stdin that takes all of S,
-- then its frames as an output stream (stream:next, stream:close), live where the agent
-- streams jobs. Its output is kept by the agent, so a command that writes more than the agent's
-- output cap before it is read is truncated (the exit frame says so).
function session_jobs.input_stream(session, argv, opts, source)
  local read = pieces(source)
  local spawn_opts = { timeout = opts.timeout, cwd = opts.cwd, env = opts.env, stdin = true }
  local job, err = session:spawn(argv, spawn_opts)
  if not job then return nil, err end
  local function fail(e)
    job:cancel()
    return nil, e
  end
  local pending = {}
  while true do
    local chunk, rerr = read()
    if chunk == nil then
      if rerr ~= nil then
        return fail(errors.invalid_input(START, "stdin", "the input could not be read: " .. tostring(rerr)))
      end
      break
    end
    pending[#pending + 1] = chunk
    -- Small chunks are gathered into one request, up to a piece.
    local size = 0
    for _, c in ipairs(pending) do size = size + #c end
    if size >= session_jobs.WRITE_PIECE then
      local ok, werr = job:write(table.concat(pending))
      if not ok then return fail(werr) end
      pending = {}
    end
  end
  if #pending > 0 then
    local ok, werr = job:write(table.concat(pending))
    if not ok then return fail(werr) end
  end
  local ok, cerr = job:close_stdin()
  if not ok then return fail(cerr) end
  local frames = job:frames()
  -- Called with a colon, as protocol.exec's stream's methods are.
  local stream = { finished = false }
  function stream:next()
    if self.finished then return nil, self.failed end
    local fine, frame = pcall(frames)
    if not fine then
      self.finished, self.failed = true, frame
      return nil, frame
    end
    if frame == nil or frame.type == "exit" then self.finished = true end
    return frame
  end
  function stream:close()
    if not self.finished then
      self.finished = true
      job:cancel()
    end
  end
  return stream
end

return session_jobs
