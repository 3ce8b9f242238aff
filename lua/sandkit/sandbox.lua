--- Sandbox, Session and Job objects: the public API (README.md) over any provider.
--
-- Capabilities are checked here, before a provider is asked anything: an operation a provider
-- cannot do fails with OPERATION_NOT_SUPPORTED and sends nothing.
--
-- A provider implements:
--   provider.name
--   provider:capabilities()                         -> { files=, jobs=, reconnect=, preview=,
--                                                        pause_resume=, snapshot=, list=, fs=,
--                                                        watch= }
--   provider:create(opts)                           -> record | nil, err
--   provider:get(id)                                -> record | nil (absent) | nil, err
--   provider:list(labels)                           -> { record… } | nil, err (labels, when
--                                                        given, may narrow what it reads; this
--                                                        file keeps only the records matching)
--   provider:terminate(id)                          -> true | nil, err
--   provider:connection(record)                     -> conn (see protocol.lua) | nil, err
-- and optionally check_create(opts, operation) -> nil | err (what create refuses, asked of
-- get_or_create before it looks); serve(record, operation) -> record | nil, err (an existing
-- session made ready to hand back: one still starting waited for); get_or_create(opts) ->
-- record, created (opts.id is set), for a provider whose needs the two do not cover;
-- session_capabilities(record); preview(record, port); pause(record); resume(record);
-- snapshot(record); set_lifetime(record, ends) -> true | nil, err (capability set_lifetime:
-- the session now ends at `ends`, Unix seconds); expires_at(record) -> the end the session now
-- has, when another process may have changed it; enforced_limits() -> the limits this machine
-- enforces, which capabilities() hands out as `limits` (asked only there, as the answer may cost
-- a process: the capabilities gating every call leave it out); and refusals = { [capability] =
-- "why not, and what to do instead" }. Capability `labels` says create{ labels } is stored.
-- The provider's module exports OPTIONS (sandbox options besides the common ones) and may export
-- CREATE_OPTIONS (create options besides id and env) and ID (what its session ids are, an
-- options.id rule); unknown keys and ids that are none are refused before it is asked.
-- A record is { id =, state =, generation = } plus whatever the provider keeps (boot_id,
-- created_at, expires_at = Unix seconds or nil for no end, labels = { key = value }).
-- A connection may carry `ops`, replacing protocol functions for sessions without an agent.

local errors = require "sandkit.errors"
local localfile = require "sandkit.localfile"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local wait = require "sandkit.wait"

--- Output cut into lines (run's `lines = true`), loaded by the first run that asks for it.
local function lines() return require "sandkit.lines" end

local sandbox = {}

local sandbox_mt, session_mt, job_mt = {}, {}, {}
sandbox_mt.__index = sandbox_mt
job_mt.__index = job_mt

--- Which capability each gated operation needs, and the operation name errors carry.
local NEEDS = {
  read_file = { "files", "sandbox.readFile" },
  write_files = { "files", "sandbox.writeFiles" },
  read_file_to = { "files", "sandbox.readFile" },
  write_file_from = { "files", "sandbox.writeFiles" },
  mkdir = { "files", "sandbox.mkdir" },
  start_job = { "jobs", "sandbox.jobStart" },
  job = { "jobs", "sandbox.jobPoll" },
  preview = { "preview", "sandbox.preview" },
  pause = { "pause_resume", "sandbox.pause" },
  resume = { "pause_resume", "sandbox.resume" },
  snapshot = { "snapshot", "sandbox.snapshot" },
  list = { "list", "sandbox.list" },
  get = { "reconnect", "sandbox.get" },
  set_lifetime = { "set_lifetime", "sandbox.setLifetime" },
  labels = { "labels", "sandbox.create" },
}
-- A session's files as a filesystem (sandkit.session_fs: `fs`, and `watch` for a watch) and
-- interactive jobs (sandkit.session_jobs: `stdin`, `pty`, and `jobs` for the list and signals)
-- add their own as they load (below): only their own methods ask for those.

--- A provider may say why it lacks a capability (provider.refusals[capability]), e.g. where
-- to turn instead; otherwise the refusal names the provider and the capability.
local function refuse(caps, what, provider)
  local need = NEEDS[what]
  if caps[need[1]] then return nil end
  local reason = provider.refusals and provider.refusals[need[1]]
  return errors.not_supported(need[2],
    reason or ("the " .. provider.name .. " provider does not offer " .. need[1]))
end

--- Options each call knows (options.check refuses the rest, naming the nearest).
local CREATE_OPTIONS = options_check.set{ "id", "env", "labels" }
local LIST_OPTIONS = options_check.set{ "labels" }
local COMMAND_OPTIONS = options_check.set{ "timeout", "cwd", "env" }
-- keep_base64 is a relay's (sandkit.ngx): stdout/stderr frames carry the wire's base64, checked,
-- instead of decoded `data`. It cannot be cut into lines, which needs the bytes.
local RUN_OPTIONS = options_check.set{ "output_cap", "lines", "keep_base64", "stdin" }
local EXEC_OPTIONS = options_check.set{ "output_cap", "max_output", "stdin" }
local JOB_OPTIONS = options_check.set{ "id" }
local FRAMES_OPTIONS = options_check.set{ "since", "interval" }
local TRANSFER_OPTIONS = options_check.set{ "progress" }

--- `module` is the provider's module, for its CREATE_OPTIONS and ID.
function sandbox.new(provider, options, module)
  return setmetatable({ provider = provider, options = options or {},
    create_options = module and module.CREATE_OPTIONS or {}, id_rule = module and module.ID }, sandbox_mt)
end

--- A copy of `caps`, with the limits the provider enforces where it has any.
local function public_capabilities(provider, caps)
  local copy = {}
  for k, v in pairs(caps) do copy[k] = v end
  if provider.enforced_limits then copy.limits = provider:enforced_limits() end
  return copy
end

function sandbox_mt:capabilities()
  return public_capabilities(self.provider, self.provider:capabilities())
end

local function new_session(sb, record)
  local labels = {}
  for k, v in pairs(record.labels or {}) do labels[k] = v end
  return setmetatable({
    id = record.id,
    state = record.state,
    generation = record.generation or 1,
    boot_id = record.boot_id,
    created_at = record.created_at,
    expires_at = record.expires_at,
    labels = labels,
    sandbox = sb,
    record = record,
  }, session_mt)
end

--- nil when `id` is one of the provider's session ids, else the INVALID_INPUT refusal. An id
-- that is no string at all is a caller's mistake, and raised.
local function refuse_id(sb, id, operation)
  if type(id) ~= "string" then error("sandkit: " .. operation .. ": a session id is a string", 3) end
  return sb.id_rule and options_check.id(operation, id, sb.id_rule)
end

local CREATE = "sandbox.create"
local GET_OR_CREATE = "sandbox.getOrCreate"

--- create's options with their labels checked (options.labels, the one check) and copied, or
-- nil and the refusal; labels on a provider that cannot keep them are refused, not dropped: a
-- session listed by a label it never got would go unfound.
local function checked_labels(sb, opts, operation)
  local labels, bad = options_check.labels(operation, opts, "labels")
  if bad then return nil, bad end
  if labels and next(labels) then
    local refusal = refuse(sb.provider:capabilities(), "labels", sb.provider)
    if refusal then
      refusal.operation = operation
      return nil, refusal
    end
  end
  local copy = {}
  for k, v in pairs(opts) do copy[k] = v end
  copy.labels = labels
  return copy
end

function sandbox_mt:create(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("sandkit: create takes an options table", 2) end
  local refusal = opts.id ~= nil and refuse_id(self, opts.id, CREATE)
    or options_check.check(CREATE, opts, CREATE_OPTIONS, self.create_options)
  if refusal then return nil, refusal end
  opts, refusal = checked_labels(self, opts, CREATE)
  if not opts then return nil, refusal end
  local record, err = self.provider:create(opts)
  if not record then return nil, err end
  return new_session(self, record)
end

function sandbox_mt:get(id)
  if id == nil then error("sandkit: get needs an id", 2) end
  local refusal = refuse_id(self, id, "sandbox.get") or refuse(self.provider:capabilities(), "get", self.provider)
  if refusal then return nil, refusal end
  local record, err = self.provider:get(id)
  if not record then return nil, err end
  return new_session(self, record)
end

--- Returns the session with opts.id, creating it when absent; `created` comes from the path
-- taken. Not atomic: two callers racing on one id may both see created = true. Without an
-- id there is nothing to get: it creates. An existing session is handed back once the
-- provider's `serve` made it ready; what create would refuse is refused before anything is
-- read. A provider's own get_or_create sees only ids.
function sandbox_mt:get_or_create(opts)
  opts = opts or {}
  if type(opts) ~= "table" then error("sandkit: get_or_create takes an options table", 2) end
  local refusal = opts.id ~= nil and refuse_id(self, opts.id, GET_OR_CREATE)
    or options_check.check(GET_OR_CREATE, opts, CREATE_OPTIONS, self.create_options)
  if refusal then return nil, refusal end
  opts, refusal = checked_labels(self, opts, GET_OR_CREATE)
  if not opts then return nil, refusal end
  if opts.id == nil then
    local session, err = self:create(opts)
    if not session then return nil, err end
    return session, true
  end
  local provider = self.provider
  if provider.get_or_create then
    local record, created = provider:get_or_create(opts)
    if not record then return nil, created end
    return new_session(self, record), created
  end
  refusal = provider.check_create and provider:check_create(opts, GET_OR_CREATE)
  if refusal then return nil, refusal end
  local record, err = provider:get(opts.id)
  if record and provider.serve then record, err = provider:serve(record, GET_OR_CREATE) end
  if record then return new_session(self, record), false end
  if err then return nil, err end
  local session
  session, err = self:create(opts)
  if not session then return nil, err end
  return session, true
end

--- Every session, or with opts.labels only those carrying each of those labels.
function sandbox_mt:list(opts)
  if opts ~= nil and type(opts) ~= "table" then error("sandkit: list takes an options table", 2) end
  local refusal = refuse(self.provider:capabilities(), "list", self.provider)
    or options_check.check("sandbox.list", opts, LIST_OPTIONS)
  if refusal then return nil, refusal end
  local wanted
  wanted, refusal = options_check.labels("sandbox.list", opts, "labels")
  if refusal then return nil, refusal end
  local records, err = self.provider:list(wanted)
  if not records then return nil, err end
  local sessions = {}
  for _, record in ipairs(records) do
    if options_check.labels_match(record.labels, wanted) then
      sessions[#sessions + 1] = new_session(self, record)
    end
  end
  return sessions
end

--- Idempotent: terminating an absent session succeeds.
function sandbox_mt:terminate(id)
  if id == nil then error("sandkit: terminate needs an id", 2) end
  local refusal = refuse_id(self, id, "sandbox.terminate")
  if refusal then return nil, refusal end
  return self.provider:terminate(id)
end

-- Images ------------------------------------------------------------------------------------

--- Root filesystems sessions start from, where the provider keeps them (the local provider:
-- docs/agent.md and README, Images). Each returns what the provider's method does:
--   sandbox:image_import(name, dir | tar_path | "-" | reader, { max_entries =, max_bytes = })
--   sandbox:image_build(name, { suite =, packages =, variant =, mirror = })
--   sandbox:image_commit(session_id, name)
--   sandbox:image_list()  -> { { name =, size =, entries =, created_at =, origin = }, … }
--   sandbox:image_remove(name)
local IMAGE_OPERATIONS = { image_import = "sandbox.imageImport", image_build = "sandbox.imageBuild",
  image_commit = "sandbox.imageCommit", image_list = "sandbox.imageList", image_remove = "sandbox.imageRemove" }

for method, operation in pairs(IMAGE_OPERATIONS) do
  sandbox_mt[method] = function(self, ...)
    local provider = self.provider
    if not provider[method] then
      return nil, errors.not_supported(operation, "the " .. provider.name .. " provider keeps no images")
    end
    return provider[method](provider, ...)
  end
end

-- Sessions ----------------------------------------------------------------------------------

--- What the session's provider offers it, as the gates read it.
local function session_capabilities(session)
  local provider = session.sandbox.provider
  return provider.session_capabilities and provider:session_capabilities(session.record)
    or provider:capabilities()
end

function session_mt:capabilities()
  return public_capabilities(self.sandbox.provider, session_capabilities(self))
end

local function gate(session, what)
  return refuse(session_capabilities(session), what, session.sandbox.provider)
end

--- Failures that may be the session's lifetime ending: a request the agent never answered.
local UNANSWERED = { SANDBOX_OUTCOME_UNKNOWN = true, SANDBOX_UNREACHABLE = true }

--- The one place a failure is read as the end of the session's lifetime: an unanswered request
-- once the session's end has passed (the provider's word on it when it has one, since another
-- process may have moved it) is errors.session_ended's. Anything else comes back as it was.
local function explain_end(session, err)
  if not errors.is_error(err) or not UNANSWERED[err.code] then return err end
  local provider = session.sandbox.provider
  local ends = provider.expires_at and provider:expires_at(session.record) or session.record.expires_at
  if ends == nil or os.time() < ends then return err end
  return errors.session_ended(err, session.id, ends)
end

--- `...` as a call returned it, with its error (nil, err) read by explain_end.
local function ended(session, value, err, ...)
  if value == nil and err ~= nil then return nil, explain_end(session, err) end
  return value, err, ...
end

--- A command's stream whose failures are read by explain_end.
local function ending_stream(session, stream)
  local inner = stream.next
  stream.next = function(st)
    local frame, err = inner(st)
    if frame == nil and err ~= nil then err = explain_end(session, err) end
    return frame, err
  end
  return stream
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

local function check_command_options(opts, operation, extra, level)
  if opts ~= nil and type(opts) ~= "table" then error("sandkit: command options are a table", level + 1) end
  return options_check.check(operation, opts, COMMAND_OPTIONS, extra)
end

-- Files as a filesystem and interactive jobs -----------------------------------------------

-- sandkit.session_fs and sandkit.session_jobs install their methods on sessions (and jobs) when
-- the first call needs one of them: a program that never lists a session's files nor writes to
-- a job (most `sandkit` commands) would otherwise compile a quarter of this API's source for
-- nothing. Each adds its capabilities to NEEDS as it installs.
local installed = {}

--- Loads and installs the module `name` once; `install(module)` installs its methods.
local function install_once(name, install)
  local module = installed[name]
  if not module then
    module = require(name)
    for what, need in pairs(module.NEEDS) do NEEDS[what] = need end
    install(module)
    installed[name] = module
  end
  return module
end

local function session_fs()
  return install_once("sandkit.session_fs", function(module)
    module.install(session_mt, { gate = gate, connection = connection, ended = ended,
      ending_stream = ending_stream })
  end)
end

--- Loaded before any job exists (start_job, job, spawn, run with stdin), as it adds to and
-- replaces job methods (live frames).
local function session_jobs()
  return install_once("sandkit.session_jobs", function(module)
    module.install(session_mt, job_mt, { gate = gate, connection = connection,
      command_options = command_options })
  end)
end

--- The session methods those modules install, each loading its module when first looked up.
-- spec/sandkit_spec.lua checks that every method they install is here.
local LOADED_BY = { list = session_fs, stat = session_fs, remove = session_fs, rename = session_fs,
  write_dir_from = session_fs, read_dir_to = session_fs, watch = session_fs,
  spawn = session_jobs, jobs = session_jobs }

function session_mt.__index(_, key)
  local method = session_mt[key]
  if method == nil and LOADED_BY[key] then
    LOADED_BY[key]()
    method = session_mt[key]
  end
  return method
end

--- Starts a command once its options were checked; the stream of protocol.exec, or of lines.
local function open_stream(session, argv, opts)
  if opts and opts.lines and opts.keep_base64 then
    return nil, errors.invalid_input(protocol.OPERATIONS.run, "lines",
      "lines = true needs the output's bytes, and keep_base64 keeps them encoded")
  end
  if opts and opts.stdin ~= nil and opts.keep_base64 then
    return nil, errors.invalid_input(protocol.OPERATIONS.run, "stdin",
      "a command with stdin runs as a job, whose frames carry bytes, not keep_base64's base64")
  end
  local conn, err = connection(session)
  if not conn then return nil, err end
  local stream
  if opts and opts.stdin ~= nil then
    stream, err = session_jobs().input_stream(session, argv, command_options(session, opts, conn), opts.stdin)
  else
    stream, err = ops(conn).exec(conn, argv, command_options(session, opts, conn))
  end
  if not stream then return nil, explain_end(session, err) end
  stream = ending_stream(session, stream)
  if opts and opts.lines then return lines().wrap(stream) end
  return stream
end

--- Starts a command and returns its output stream: stream:next() -> frame | nil (ended with
-- its exit frame) | nil, err; stream:close() stops it. Takes run's options.
function session_mt:stream(argv, opts)
  local unknown = check_command_options(opts, protocol.OPERATIONS.run, RUN_OPTIONS, 2)
  if unknown then return nil, unknown end
  return open_stream(self, argv, opts)
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
-- With `lines = true` each stdout/stderr frame is one whole line (sandkit/lines.lua).
-- `output_cap` (bytes per stream; default none) asks an agent that offers outputCap to keep
-- that much; the exit frame's `truncated` says whether any output was dropped.
function session_mt:run(argv, opts)
  local unknown = check_command_options(opts, protocol.OPERATIONS.run, RUN_OPTIONS, 2)
  local stream, err
  if unknown then err = unknown else stream, err = open_stream(self, argv, opts) end
  local frames = setmetatable({ stream = stream, failed = not stream and err or nil }, frames_mt)
  return frames, nil, nil, frames
end

--- Default bytes exec keeps per stream; the head is kept, the rest counted as truncated.
local DEFAULT_MAX_OUTPUT = 1024 * 1024

--- Runs a command to its end: { code =, stdout =, stderr =, truncated =, signal =, oom = } or
-- nil, err (oom: true when a memory limit killed it).
-- A failure after the command started (its timeout, a lost stream) carries what output had
-- arrived as err.stdout and err.stderr.
function session_mt:exec(argv, opts)
  local unknown = check_command_options(opts, protocol.OPERATIONS.run, EXEC_OPTIONS, 2)
  if unknown then return nil, unknown end
  opts = opts or {}
  local limit
  limit, unknown = options_check.whole_number(protocol.OPERATIONS.run, opts, "max_output", DEFAULT_MAX_OUTPUT)
  if not limit then return nil, unknown end
  -- The agent need not send what would be cut here anyway (0 would mean no cap at all).
  local stream_opts = opts
  if opts.output_cap == nil and limit > 0 then
    stream_opts = {}
    for k, v in pairs(opts) do stream_opts[k] = v end
    stream_opts.output_cap = limit
  end
  local stream, err = open_stream(self, argv, stream_opts)
  if not stream then return nil, err end
  local kept = { stdout = {}, stderr = {} }
  local size = { stdout = 0, stderr = 0 }
  local cut = false
  while true do
    local frame
    frame, err = stream:next()
    if not frame then
      stream:close()
      err = err or errors.unanswered("sandbox.runCommand",
        "the output stream ended without a terminal frame")
      err.stdout = table.concat(kept.stdout)
      err.stderr = table.concat(kept.stderr)
      return nil, err
    end
    local kind = frame.type
    if kind == "exit" then
      return {
        code = frame.code,
        stdout = table.concat(kept.stdout),
        stderr = table.concat(kept.stderr),
        truncated = frame.truncated or cut,
        signal = frame.signal,
        oom = frame.oom,
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
  local unknown = check_command_options(opts, protocol.OPERATIONS.job_start, JOB_OPTIONS, 2)
  if unknown then return nil, unknown end
  local conn, err = connection(self)
  if not conn then return nil, err end
  local id
  id, err = ops(conn).job_start(conn, argv, command_options(self, opts, conn))
  if not id then return nil, explain_end(self, err) end
  session_jobs()
  return setmetatable({ id = id, session = self }, job_mt)
end

--- A handle on a job by id: reattaching needs no request (the first poll tells).
function session_mt:job(id)
  if type(id) ~= "string" then error("sandkit: a job id is a string", 2) end
  local refusal = gate(self, "job")
  if refusal then return nil, refusal end
  session_jobs()
  return setmetatable({ id = id, session = self }, job_mt)
end

function session_mt:read_file(path)
  local refusal = gate(self, "read_file")
  if refusal then return nil, refusal end
  local conn, err = connection(self)
  if not conn then return nil, err end
  return ended(self, ops(conn).read_file(conn, path))
end

function session_mt:write_files(files)
  local refusal = gate(self, "write_files")
  if refusal then return nil, refusal end
  local conn, err = connection(self)
  if not conn then return nil, err end
  return ended(self, ops(conn).write_files(conn, files))
end

--- Why a file over 32 MiB cannot move to or from this session.
local WITHOUT_RAW = "this agent does not offer the rawFiles extension, so a file moves in one "
  .. "request of at most 33554432 bytes (32 MiB)"

local function raw_files(conn)
  return conn.ops == nil and conn.features ~= nil and conn.features.rawFiles == true
end

--- What both file transfers check first: the path, the capability, the options; then the
-- connection. Returns the options and the connection, or nil and an error.
local function start_transfer(session, what, path, opts)
  if type(path) ~= "string" then error("sandkit: a path is a string", 3) end
  if opts ~= nil and type(opts) ~= "table" then error("sandkit: transfer options are a table", 3) end
  local refusal = gate(session, what) or options_check.check(NEEDS[what][2], opts, TRANSFER_OPTIONS)
  if refusal then return nil, refusal end
  opts = opts or {}
  if opts.progress ~= nil and type(opts.progress) ~= "function" then
    error("sandkit: progress is a function(done, total)", 3)
  end
  local conn, err = connection(session)
  if not conn then return nil, err end
  return opts, conn
end

--- Sends a file of any size into the session, in bounded memory: `source` is a local path, an
-- object with :read(n) (io.stdin), or a function returning the next chunk and nil at the end.
-- opts.progress(done, total) hears the bytes as they go (total nil when unknown). Returns the
-- byte count, or nil and an error. Without the agent's rawFiles extension the file goes in one
-- request, and one over 32 MiB is refused before anything is sent.
function session_mt:write_file_from(path, source, opts)
  local topts, conn = start_transfer(self, "write_file_from", path, opts)
  if not topts then return nil, conn end
  local src, err = localfile.source(source, NEEDS.write_file_from[2])
  if not src then return nil, err end
  local sent
  if raw_files(conn) then
    sent, err = protocol.write_file_raw(conn, path, src, topts.progress)
  else
    local parts, size = {}, 0
    while true do
      local chunk, rerr = src.read()
      if chunk == nil then
        if rerr ~= nil then
          src.close()
          return nil, errors.invalid_input(NEEDS.write_file_from[2], "source",
            "the file to send could not be read: " .. tostring(rerr))
        end
        break
      end
      size = size + #chunk
      if size > protocol.MAX_FILE_BYTES then
        src.close()
        return nil, errors.invalid_input(NEEDS.write_file_from[2], "source", path
          .. " is larger than 32 MiB, and " .. WITHOUT_RAW)
      end
      parts[#parts + 1] = chunk
    end
    sent, err = ops(conn).write_files(conn, { [path] = table.concat(parts) })
    if sent then
      sent = size
      if topts.progress then topts.progress(size, size) end
    end
  end
  src.close()
  if not sent then return nil, explain_end(self, err) end
  return sent
end

--- Brings a file of any size out of the session, in bounded memory: `sink` is a local path
-- (written beside it and renamed into place once whole), an object with :write(bytes)
-- (io.stdout), or a function(bytes). opts.progress(done, total) as for write_file_from.
-- Returns the byte count, or nil and an error.
function session_mt:read_file_to(path, sink, opts)
  local topts, conn = start_transfer(self, "read_file_to", path, opts)
  if not topts then return nil, conn end
  local dst, err = localfile.sink(sink, NEEDS.read_file_to[2])
  if not dst then return nil, err end
  local done
  if raw_files(conn) then
    done, err = protocol.read_file_raw(conn, path, dst.write, topts.progress, dst.file)
  else
    local bytes
    bytes, err = ops(conn).read_file(conn, path)
    if bytes then
      local ok, werr = dst.write(bytes)
      -- As protocol.read_file_raw reads a writer: false, or nil with an error, stops it.
      if ok ~= false and (ok ~= nil or werr == nil) then
        done = #bytes
        if topts.progress then topts.progress(done, done) end
      else
        err = errors.invalid_input(NEEDS.read_file_to[2], "destination",
          "the file's bytes could not be written: " .. tostring(werr))
      end
    elseif err.reason == "REQUEST_INVALID" and tostring(err.body):find("limit", 1, true) then
      err.message = err.message .. " (" .. WITHOUT_RAW .. ")"
    end
  end
  if not done then
    dst.abort()
    return nil, explain_end(self, err)
  end
  local ok, cerr = dst.commit()
  if not ok then
    return nil, errors.invalid_input(NEEDS.read_file_to[2], "destination", tostring(cerr))
  end
  return done
end

function session_mt:mkdir(path)
  local refusal = gate(self, "mkdir")
  if refusal then return nil, refusal end
  local conn, err = connection(self)
  if not conn then return nil, err end
  return ended(self, ops(conn).mkdir(conn, path))
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

--- Makes the session end `seconds` from now (longer or shorter than before), where the
-- provider can (capabilities().set_lifetime; elsewhere OPERATION_NOT_SUPPORTED, sending
-- nothing): true, with session.expires_at the new end (Unix seconds), or nil and an error.
function session_mt:set_lifetime(seconds)
  local refusal = gate(self, "set_lifetime")
  if refusal then return nil, refusal end
  local ends, bad = options_check.lifetime_end(NEEDS.set_lifetime[2], seconds, "seconds")
  if not ends then return nil, bad end
  local ok, err = provider_call(self, "set_lifetime", ends)
  if not ok then return nil, err end
  self.expires_at, self.record.expires_at = ends, ends
  return true
end

function session_mt:terminate()
  local ok, err = self.sandbox.provider:terminate(self.id)
  if ok then self.state = "terminated" end
  return ok, err
end

-- Jobs --------------------------------------------------------------------------------------

--- One poll: { running =, frames = {…}, next =, exit = { code =, truncated =, signal = } | nil,
-- error = { code =, message = } | nil }. `since` is the highest seq already seen (nil: from the
-- start); `next` is the cursor for the following poll.
function job_mt:poll(since)
  local conn, err = connection(self.session)
  if not conn then return nil, err end
  return ended(self.session, ops(conn).job_poll(conn, self.id, since))
end

function job_mt:cancel()
  local conn, err = connection(self.session)
  if not conn then return nil, err end
  return ended(self.session, ops(conn).job_cancel(conn, self.id))
end

--- for frame in job:frames{ since = nil, interval = 0.2 } do … end
-- Polls with a cursor and yields each frame once, in order, ending with the exit frame; a job
-- that ended in an error raises it, as a failed poll does.
function job_mt:frames(opts)
  local interval, refusal = nil, options_check.check("sandbox.jobPoll", opts, FRAMES_OPTIONS)
  if not refusal then interval, refusal = options_check.seconds("sandbox.jobPoll", opts, "interval", 0.2) end
  -- An iterator has no `err` to return: its refusal is raised by the loop's first call.
  if refusal then return function() error(refusal, 0) end end
  opts = opts or {}
  local since = opts.since
  -- The queue's length is kept apart: taken slots are cleared, and `#` of a table with holes at
  -- its start is any border under LuaJIT.
  local queue, head, count = {}, 1, 0
  local finished, failure = false, nil
  local job = self
  local function push(frame)
    count = count + 1
    queue[count] = frame
  end
  return function()
    while true do
      if head <= count then
        local frame = queue[head]
        queue[head] = nil
        head = head + 1
        return frame
      end
      -- Raised only once every frame before it was delivered: output that arrived is never lost.
      if failure then error(failure, 0) end
      if finished then return nil end
      queue, head, count = {}, 1, 0
      local page, err = job:poll(since)
      if not page then error(err, 0) end
      for _, frame in ipairs(page.frames) do
        -- The agent's cursor is exclusive; this only guards against a peer that repeats itself.
        if since == nil or frame.seq > since then
          push(frame)
          since = frame.seq
        end
      end
      if not page.running then
        finished = true
        if page.exit then
          push({ type = "exit", code = page.exit.code,
            truncated = page.exit.truncated, signal = page.exit.signal })
        elseif page.error then
          failure = protocol.command_error(page.error.code, page.error.message,
            { operation = "sandbox.jobPoll", job_id = job.id })
        else
          failure = errors.unanswered("sandbox.jobPoll",
            "the job ended and reported neither an exit nor an error", { job_id = job.id })
        end
      elseif count == 0 then
        wait.sleep(interval)
      end
    end
  end
end

sandbox.session_metatable = session_mt
sandbox.job_metatable = job_mt

return sandbox
