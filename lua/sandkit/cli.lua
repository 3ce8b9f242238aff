--- The `sandkit` command: thin scripts over the public API for automation. `sandkit --help`
-- prints the commands and the exit statuses; README's command section is the same text.
--
-- The command line is read from tables: COMMANDS (each command's arguments and options, OPTIONS
-- describing every option) and the chosen provider's CLI_OPTIONS (`--provider NAME`, default
-- local): a provider module lists the flags it takes, and they are accepted before the command
-- and after it alike (`convert` turns a flag's text into the option's value; `secret_file` says
-- the value is read from the file the flag names).
--
-- A SIGINT, SIGTERM, SIGHUP or SIGPIPE ends any wait at once (core.trap): the remote command is
-- stopped, a throwaway session removed, and the status is 128 + the signal. While a session is
-- being made the signal is held until it exists, so that it can be removed.

local core = require "sandkit.core"
local json = require "sandkit.json"
local localfile = require "sandkit.localfile"
local options_check = require "sandkit.options"
local time = require "sandkit.time"
local sandkit = require "sandkit"
local wait = require "sandkit.wait"

--- The commands over interactive jobs and over a session's files, loaded by the command that
-- runs one of them: every other command, and parsing and help, need only the tables here.
local function cli_jobs() return require "sandkit.cli_jobs" end
local function cli_files() return require "sandkit.cli_files" end

local cli = {}

--- "512 MiB" for 536870912: the limit as the user likely wrote it.
local function limits_text(bytes)
  local units, i = { "bytes", "KiB", "MiB", "GiB", "TiB" }, 1
  while bytes >= 1024 and bytes % 1024 == 0 and i < #units do
    bytes = math.floor(bytes / 1024)
    i = i + 1
  end
  return string.format("%d %s", bytes, units[i])
end

local pack = table.pack or function(...) return { n = select("#", ...), ... } end
local unpack = table.unpack or rawget(_G, "unpack")

local EXIT_FAILED, EXIT_USAGE = 1, 2
local EXIT_TIMEOUT, EXIT_SANDKIT, EXIT_SPAWN = 124, 125, 127
--- Linux's errno for a write to a pipe nobody reads.
local EPIPE = 32
--- A cancelled job's status: the agent kills its process group with SIGKILL.
local EXIT_CANCELLED = 128 + 9
--- A CLI user rarely means a deadline; the protocol needs one, so a day stands in for none.
local DEFAULT_TIMEOUT = 86400
local DEFAULT_PROVIDER = "local"
local SIGNAL_NAMES = { [core.SIGINT] = "SIGINT", [core.SIGTERM] = "SIGTERM", [core.SIGHUP] = "SIGHUP",
  [core.SIGPIPE] = "SIGPIPE" }

local EXIT_STATUS = [[
exit status:
  N    run, and job poll (without --json) once the job has ended: the command's own
       status (128+N when signal N killed it; 137 for a cancelled job); 0 when any other
       command succeeds, and when job poll sees the job still running
  1    sandkit could not do what was asked: a refused file, a failed call
  2    the command line is wrong
  124  the command outlived --timeout (default a day)
  125  no such session (whichever command names it; rm -f takes it as removed), or
       sandkit could not run the command (none could be made) or lost its outcome
       (the message says when the session's lifetime ended it), or could not remove
       the throwaway session of a run whose command succeeded
  127  the command could not be started: its program or --cwd is missing, or the agent
       refused it (a --cwd outside the session, a bad --env)
  129, 130, 141, 143
       sandkit was stopped by SIGHUP, SIGINT, SIGPIPE or SIGTERM: the command was stopped
       and a throwaway session removed
]]

-- Values ------------------------------------------------------------------------------------

local function env_pair(text)
  local k, v = text:match("^([^=]+)=(.*)$")
  if not k then return nil, "K=V" end
  return { k, v }
end

--- Bytes a secret's file may hold: a token is tens of characters, so a bigger file is not one.
local MAX_SECRET_FILE = 4096

--- A secret from the file a provider's `--…-file` flag names (`secret_file` in its CLI_OPTIONS):
-- on a command line `ps` would show it to everyone.
local function secret_from_file(path)
  local secret, why, detail = localfile.read_secret(path, MAX_SECRET_FILE)
  if secret then return secret end
  if why == "unreadable" then return nil, "a readable regular file (" .. detail .. ")" end
  if why == "too_long" then return nil, "a file of at most " .. MAX_SECRET_FILE .. " bytes" end
  if why == "empty" then return nil, "a file holding the secret (this one is empty)" end
  return nil, "a file holding one secret (this one has spaces or control characters inside it)"
end

--- The command's environment from the --env pairs, the last of a name winning.
local function env_map(pairs_list)
  if not pairs_list then return nil end
  local env = {}
  for _, kv in ipairs(pairs_list) do env[kv[1]] = kv[2] end
  return env
end

--- Binary multiples a size's suffix names (512M is 512 MiB), as free(1) and docker read them.
local SIZE_UNITS = { [""] = 1, K = 1024, M = 1024 ^ 2, G = 1024 ^ 3, T = 1024 ^ 4 }

--- A byte size: digits with an optional K, M, G or T (and an optional "iB" or "B" after it).
local function byte_size(text)
  local digits, unit = text:match("^(%d+)([KMGT]?)i?B?$")
  if not digits or (unit == "" and text:match("[iB]$")) then return nil, "a size such as 512M, 2G or 1048576" end
  local n = tonumber(digits) * SIZE_UNITS[unit]
  if n > options_check.MAX_WHOLE then return nil, "a size of at most " .. options_check.MAX_WHOLE .. " bytes" end
  return math.floor(n)
end

--- A number of cores: digits with at most two decimals (1.5, 0.25).
local function cores(text)
  if not text:match("^%d+%.?%d?%d?$") or text:match("%.$") then return nil, "a number of cores such as 1.5" end
  return tonumber(text)
end

--- Every option a command may take. `arg` names its value (a flag has none), `list` repeats,
-- `convert` turns the text into the value or says what it should be, `short` is the letter of
-- its one-dash form (`-f`, for a flag), where the command it mirrors has one.
local OPTIONS = {
  session = { arg = "NAME", help = "run in this session; it must exist unless --create" },
  create = { help = "make the --session when it does not exist" },
  lifetime = { arg = "S", convert = options_check.flag.lifetime,
    help = "a session this creates ends after S seconds: its agent exits, its files go" },
  timeout = { arg = "S", convert = options_check.flag.seconds,
    help = "the command's deadline in seconds (default a day)" },
  cwd = { arg = "DIR", help = "the working directory, inside the session" },
  env = { arg = "K=V", list = true, convert = env_pair, help = "an environment variable for the command (repeatable)" },
  label = { arg = "K=V", list = true, convert = env_pair,
    help = "a label: create gives the session it, ls lists only sessions with it (repeatable)" },
  ["output-cap"] = { arg = "BYTES", convert = options_check.flag.whole_number,
    help = "keep at most BYTES of each stream (default: everything, where the agent allows)" },
  lines = { help = "write the output a whole line at a time" },
  id = { arg = "ID", help = "the job's id (1-64 of [A-Za-z0-9_-]): starting it again starts nothing" },
  since = { arg = "N", convert = options_check.flag.whole_number, help = "only the output after seq N" },
  follow = { help = "print until the job ends, then exit with its status" },
  json = { help = "print one JSON document instead of text" },
  force = { short = "f", help = "a session that does not exist is no error (exit 0), as with rm -f" },
  help = { help = "print this help" },
  memory = { arg = "SIZE", convert = byte_size,
    help = "the memory the session's commands may use together (512M, 2G)" },
  pids = { arg = "N", convert = options_check.flag.whole_number,
    help = "the processes and threads the session's commands may have together" },
  cpus = { arg = "CORES", convert = cores, help = "the CPU time the session's commands may take (1.5 cores)" },
  disk = { arg = "SIZE", convert = byte_size, help = "the bytes the session may write (where enforced)" },
  image = { arg = "NAME", help = "start the session from this image (sandkit image ls)" },
  suite = { arg = "SUITE", help = "the Debian suite to build from (default bookworm)" },
  packages = { arg = "P,Q", help = "packages to install besides Debian's essential ones (python3,git)" },
  mirror = { arg = "URL", help = "the Debian mirror to build from (default mmdebstrap's)" },
  ["max-bytes"] = { arg = "SIZE", convert = byte_size, help = "refuse an import of more bytes (default 16G)" },
  ["max-entries"] = { arg = "N", convert = options_check.flag.whole_number,
    help = "refuse an import of more entries (default 1000000)" },
  -- cli_jobs.lua's commands take these two
  interactive = { short = "i", help = "forward standard input to the command" },
  tty = { short = "t", help = "run the command on a terminal (standard input forwarded)" },
  -- and cli_files.lua's these three
  recursive = { short = "r", help = "a directory and everything in it" },
  depth = { arg = "N", convert = options_check.flag.whole_number,
    help = "list N levels down (default 1, at most 32)" },
  overwrite = { help = "replace what is at the new name" },
}

--- Options every command takes (and that may come before the command).
local GLOBAL = {
  provider = { arg = "NAME", help = "the provider sessions live in (default local)" },
  help = OPTIONS.help,
  version = { help = "print sandkit's version" },
}

-- Interruption ------------------------------------------------------------------------------

--- Raised through sandkit's code when a signal ends a wait.
local INTERRUPTED = setmetatable({}, { __tostring = function() return "interrupted" end })
local interrupt = { pending = nil, armed = false, winch = false }

--- Takes note of a caught signal; raises INTERRUPTED when one is pending and waits may end. A
-- SIGWINCH is news for an interactive command's terminal (take_winch), never an interruption.
local function check_signals()
  local sig = core.caught()
  if sig == core.SIGWINCH then
    interrupt.winch = true
  elseif sig and not interrupt.pending then
    interrupt.pending = sig
  end
  if interrupt.pending and interrupt.armed then error(INTERRUPTED, 0) end
end

local function install_signals()
  assert(core.trap{ core.SIGINT, core.SIGTERM, core.SIGHUP, core.SIGPIPE, core.SIGWINCH })
  -- Every wait of the command goes through here (sandkit.wait): a trapped signal wakes
  -- core.wait at once, and the wait then ends by raising.
  wait.register{
    name = "sandkit.cli",
    active = function() return true end,
    wait = function(pollable, deadline)
      check_signals()
      local ready = core.wait(pollable, deadline and math.max(0, deadline - core.now()) or nil)
      check_signals()
      return ready
    end,
  }
end

--- Calls fn(...) with signals ending its waits: true and its results, or false and the error
-- (INTERRUPTED when a signal ended it).
local function interruptible(fn, ...)
  interrupt.armed = true
  local results = pack(pcall(function(...)
    check_signals()
    return fn(...)
  end, ...))
  interrupt.armed = false
  return unpack(results, 1, results.n)
end

local function interrupted_status()
  -- A reader that went away (SIGPIPE) is how pipelines end, not news for the terminal.
  if interrupt.pending ~= core.SIGPIPE then
    io.stderr:write("sandkit: stopped by ", SIGNAL_NAMES[interrupt.pending] or tostring(interrupt.pending), "\n")
  end
  return 128 + interrupt.pending
end

-- Output ------------------------------------------------------------------------------------

local function fail(code, message)
  io.stderr:write("sandkit: ", message, "\n")
  return code
end

local function one_line(err)
  return (tostring(sandkit.errors.is_error(err) and (err.code .. ": " .. err.message) or err)
    :gsub("\n.*", ""))
end

local function print_json(document)
  io.stdout:write(json.encode_document(document), "\n")
end

--- Writes a frame's bytes to stdout or stderr. A reader that went away (a pipe closed: SIGPIPE)
-- ends the command like any signal; another write failure ends it as sandkit's own.
local function write_frame(frame)
  local out = frame.type == "stdout" and io.stdout or io.stderr
  local ok, err, code = out:write(frame.data)
  if ok then ok, err, code = out:flush() end
  if not ok and frame.type == "stdout" then
    -- EPIPE without the signal: this process was started with SIGPIPE ignored.
    if code == EPIPE and not interrupt.pending then interrupt.pending = core.SIGPIPE end
    check_signals()
    error("standard output: " .. tostring(err), 0)
  end
end

--- The exit status a command's failure maps to (EXIT_STATUS).
local function status_of_error(err)
  if err == INTERRUPTED then return 128 + interrupt.pending end
  if sandkit.errors.is_error(err) then
    if err.failure == "timeoutExceeded" or err.failure == "deadlineExceeded" then return EXIT_TIMEOUT end
    if err.failure == "spawnFailed" or err.failure == "agentRefused" then return EXIT_SPAWN end
    if err.failure == "cancelled" then return EXIT_CANCELLED end
  end
  return EXIT_SANDKIT
end

local function exit_status(code)
  if code < 0 or code > 255 then return EXIT_FAILED end
  return code
end

--- Says on stderr when the agent dropped output of a command that ended (its exit frame, or a
-- job page's `exit`): stdout alone cannot tell a script that it did. `cap` is the cap the
-- command asked for (nil: the agent's own).
local function say_if_truncated(exit, cap)
  if exit.truncated then
    io.stderr:write("sandkit: the output was truncated: the agent kept at most "
      .. (cap and (cap .. " bytes") or "its own cap") .. " of each stream\n")
  end
end

--- Says on stderr when the session's memory limit killed the command: its status alone (137)
-- says only that something sent SIGKILL.
local function say_if_oom(exit, session)
  if not exit.oom then return end
  local memory = session and session.record and session.record.limits and session.record.limits.memory
  io.stderr:write("sandkit: killed: memory limit" .. (memory and (" (" .. limits_text(memory) .. ")") or "")
    .. "\n")
end

--- The status of a command that ran to its end.
local function command_ended(exit, cap, session)
  say_if_truncated(exit, cap)
  say_if_oom(exit, session)
  return exit_status(exit.code)
end

local function iso_time(t)
  return t and time.rfc3339(t) or nil
end

local function size_text(bytes)
  local units, i = { "B", "KiB", "MiB", "GiB", "TiB" }, 1
  while bytes >= 1024 and i < #units do
    bytes = bytes / 1024
    i = i + 1
  end
  return i == 1 and string.format("%.0f B", bytes) or string.format("%.1f %s", bytes, units[i])
end

--- Seconds a transfer runs before its progress bar appears: a shorter one is over before a
-- person could read it.
local PROGRESS_AFTER = 1
--- Seconds between redraws of the bar.
local PROGRESS_EVERY = 0.1

--- A progress bar on stderr for a transfer that takes more than a second: bytes, rate and
-- time left. Nothing at all when stderr is not a terminal.
local function progress_bar()
  if not core.isatty(2) then return { finish = function() end } end
  local started, last, drawn = core.now(), 0, false
  local bar = {}
  local function draw(done, total)
    local elapsed = core.now() - started
    local rate = done / math.max(elapsed, 0.001)
    local text = size_text(done)
    if total then text = text .. " / " .. size_text(total) end
    text = text .. "  " .. size_text(rate) .. "/s"
    if total and rate > 0 then
      local left = math.floor((total - done) / rate + 0.5)
      text = text .. string.format("  ETA %d:%02d", math.floor(left / 60), left % 60)
    end
    io.stderr:write("\r", text, "\027[K")
    drawn = true
  end
  function bar.update(done, total)
    local now = core.now()
    bar.done, bar.total = done, total
    if now - started < PROGRESS_AFTER or now - last < PROGRESS_EVERY then return end
    last = now
    draw(done, total)
  end
  --- A transfer that completed knows its size, even one read from a pipe of unknown length.
  function bar.finish(complete)
    if drawn then
      draw(bar.done, bar.total or (complete and bar.done or nil))
      io.stderr:write("\n")
    end
  end
  return bar
end

--- Says once on stderr that standard input holds bytes `run` will not forward (it is no
-- terminal, and not empty): `echo hi | sandkit run -- cat` must not pass for a run that read
-- it. Returns whether it said so.
local function warn_unforwarded(state)
  if state.warned or core.isatty(0) then return false end
  local bytes = core.read_ready(0, 1)
  if type(bytes) == "string" and bytes ~= "" then
    state.warned = true
    io.stderr:write("sandkit: standard input is not forwarded to the command (run -i forwards it)\n")
    return true
  end
  return false
end

-- Sessions ----------------------------------------------------------------------------------

--- Every command that names a session fails alike when it cannot have it (absent, not running,
-- its provider unreachable): a status of sandkit's own, which `run` and `job poll` must keep
-- apart from the 1 a command exits with.
local function no_session(message)
  return fail(EXIT_SANDKIT, message)
end

local function open_session(sandbox, name)
  local session, err = sandbox:get(name)
  if session then
    if session.state ~= "running" then
      return nil, "session " .. name .. " is " .. session.state
    end
    return session
  end
  return nil, err and one_line(err) or ("no session named " .. name)
end

--- The named session for `run`: served again when its agent is gone (its files are kept),
-- made only when --create says so.
local function run_session(sandbox, name, create, life)
  local existing, err = sandbox:get(name)
  if err then return nil, one_line(err) end
  if not existing and not create then
    return nil, "no session named " .. name .. " (--create makes it)"
  end
  if existing and existing.state == "running" then return existing end
  local session
  session, err = sandbox:get_or_create{ id = name, lifetime = not existing and life or nil }
  if not session then return nil, one_line(err) end
  return session
end

--- Removes a session made for one command: true, or false once stderr says it was left behind
-- (README promises it is removed afterwards; a script must hear when it was not).
local function remove_throwaway(sandbox, id)
  local ok, err = sandbox:terminate(id)
  if ok then return true end
  io.stderr:write("sandkit: session ", id, " was not removed: ", one_line(err), "\n")
  return false
end

-- Commands ----------------------------------------------------------------------------------

local function run(ctx)
  local o = ctx.opts
  if o.create and not o.session then return fail(EXIT_USAGE, "--create needs --session") end
  if o.lifetime and o.session and not o.create then
    return fail(EXIT_USAGE, "--lifetime is for a session this run creates (--create, or no --session)")
  end
  if (o.interactive or o.tty) and (o.lines or o.output_cap) then
    return fail(EXIT_USAGE, "-i and -t follow a job, which keeps the agent's cap and writes output as it comes: "
      .. "--lines and --output-cap are for a run without them")
  end
  local copts = { timeout = o.timeout or DEFAULT_TIMEOUT, cwd = o.cwd, env = env_map(o.env),
    output_cap = o.output_cap, lines = o.lines }
  local sandbox = ctx.sandbox
  local session, err
  local throwaway = o.session == nil
  if throwaway then
    session, err = sandbox:create{ lifetime = o.lifetime }
    if not session then return fail(EXIT_SANDKIT, one_line(err)) end
  else
    session, err = run_session(sandbox, o.session, o.create, o.lifetime)
    if not session then return no_session(err) end
  end
  if o.interactive or o.tty then
    local status = cli_jobs().interactive(ctx.helpers, session, ctx.argv, copts, o.tty)
    local removed = not throwaway or remove_throwaway(sandbox, session.id)
    if status == 0 and not removed then return EXIT_SANDKIT end
    return status
  end
  local unforwarded = {}
  warn_unforwarded(unforwarded)
  local exit
  local ok, failure = interruptible(function()
    local stream, serr = session:stream(ctx.argv, copts)
    if not stream then error(serr, 0) end
    ctx.stream = stream
    while true do
      local frame, ferr = stream:next()
      if not frame then
        if ferr then error(ferr, 0) end
        break
      end
      if frame.type == "exit" then
        exit = frame
      else
        write_frame(frame)
      end
    end
  end)
  -- Closing mid-stream drops the connection, which the agent takes as: stop the command.
  if ctx.stream then ctx.stream:close() end
  warn_unforwarded(unforwarded)
  local removed = not throwaway or remove_throwaway(sandbox, session.id)
  local status
  if interrupt.pending then
    status = interrupted_status()
  elseif not ok then
    status = fail(status_of_error(failure), one_line(failure))
  else
    status = command_ended(exit, o.output_cap, session)
  end
  -- A session left behind is news a script must not miss, unless the command's own failure
  -- already is.
  if status == 0 and not removed then return EXIT_SANDKIT end
  return status
end

--- The labels of the --label pairs, the last of a key winning (sandbox.lua checks them).
local function label_map(pairs_list)
  return pairs_list and env_map(pairs_list) or nil
end

--- A session's labels for --json: an object ({} when there are none).
local function labels_json(labels)
  local out = {}
  for k, v in pairs(labels or {}) do out[k] = v end
  return out
end

--- A session's labels as ls prints them: K=V,K=V in key order, or "-".
local function labels_text(labels)
  local keys = {}
  for k in pairs(labels or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for i, k in ipairs(keys) do keys[i] = k .. "=" .. labels[k] end
  return #keys > 0 and table.concat(keys, ",") or "-"
end

local function create(ctx)
  -- --env here is the session's: every command of it starts with these, under its own.
  local o = ctx.opts
  local env = o.env and next(o.env) and env_map(o.env) or nil
  local limits
  if o.memory or o.pids or o.cpus or o.disk then
    limits = { memory = o.memory, pids = o.pids, cpu = o.cpus, disk = o.disk }
  end
  local session, err = ctx.sandbox:create{ id = ctx.args[1], lifetime = o.lifetime, env = env,
    labels = label_map(o.label), image = o.image, limits = limits }
  if interrupt.pending then
    if session then remove_throwaway(ctx.sandbox, session.id) end
    return interrupted_status()
  end
  if not session then return fail(EXIT_FAILED, one_line(err)) end
  if ctx.opts.json then
    print_json{ id = session.id, state = session.state, generation = session.generation,
      created_at = iso_time(session.created_at) or json.null, boot_id = session.boot_id or json.null,
      expires_at = iso_time(session.expires_at) or json.null, labels = labels_json(session.labels) }
  else
    io.stdout:write(session.id, "\n")
  end
  return 0
end

local function ls(ctx)
  local sessions, err = ctx.sandbox:list{ labels = label_map(ctx.opts.label) }
  if not sessions then return fail(EXIT_FAILED, one_line(err)) end
  if ctx.opts.json then
    local list = json.array{}
    for i, s in ipairs(sessions) do
      list[i] = { id = s.id, state = s.state, generation = s.generation,
        created_at = iso_time(s.created_at) or json.null,
        expires_at = iso_time(s.expires_at) or json.null, labels = labels_json(s.labels) }
    end
    print_json{ sessions = list }
    return 0
  end
  local rows = { { "NAME", "STATE", "GENERATION", "CREATED", "EXPIRES", "LABELS" } }
  for _, s in ipairs(sessions) do
    rows[#rows + 1] = { s.id, s.state, tostring(s.generation), iso_time(s.created_at) or "-",
      iso_time(s.expires_at) or "-", labels_text(s.labels) }
  end
  local widths = {}
  for _, row in ipairs(rows) do
    for c, cell in ipairs(row) do widths[c] = math.max(widths[c] or 0, #cell) end
  end
  for _, row in ipairs(rows) do
    io.stdout:write(string.format("%-" .. widths[1] .. "s  %-" .. widths[2] .. "s  %" .. widths[3]
      .. "s  %-" .. widths[4] .. "s  %-" .. widths[5] .. "s  %s\n", unpack(row, 1, 6)))
  end
  return 0
end

--- sandkit lifetime NAME S: the session ends S seconds from now, sooner or later than before.
local function lifetime(ctx)
  local name = ctx.args[1]
  local seconds, why = options_check.flag.lifetime(ctx.args[2])
  if not seconds then return fail(EXIT_USAGE, "lifetime: SECONDS is " .. why .. ", not " .. ctx.args[2]) end
  local session, err = ctx.sandbox:get(name)
  if not session then
    return no_session(err and (name .. ": " .. one_line(err)) or ("no session named " .. name))
  end
  local ok
  ok, err = session:set_lifetime(seconds)
  if not ok then return fail(EXIT_FAILED, one_line(err)) end
  if ctx.opts.json then
    print_json{ id = session.id, expires_at = iso_time(session.expires_at) }
  else
    io.stdout:write(iso_time(session.expires_at), "\n")
  end
  return 0
end

local function rm(ctx)
  local status = 0
  for _, name in ipairs(ctx.args) do
    -- A name rm does not know is a mistake to report, as rm(1) does, not a removal that happened;
    -- with --force, as with rm -f, it is already what was asked for (terminate says so too).
    local existing, err = true, nil
    if not ctx.opts.force then existing, err = ctx.sandbox:get(name) end
    if not existing then
      status = no_session(err and (name .. ": " .. one_line(err)) or ("no session named " .. name))
    else
      local ok
      ok, err = ctx.sandbox:terminate(name)
      if not ok then status = fail(EXIT_FAILED, name .. ": " .. one_line(err)) end
    end
  end
  return status
end

local function prune(ctx)
  local sessions, err = ctx.sandbox:list()
  if not sessions then return fail(EXIT_FAILED, one_line(err)) end
  local removed, status = json.array{}, 0
  for _, s in ipairs(sessions) do
    if s.state == "terminated" then
      local ok, terr = ctx.sandbox:terminate(s.id)
      if ok then
        removed[#removed + 1] = s.id
      else
        status = fail(EXIT_FAILED, s.id .. ": " .. one_line(terr))
      end
    end
  end
  if ctx.opts.json then
    print_json{ removed = removed }
  else
    for _, id in ipairs(removed) do io.stdout:write(id, "\n") end
  end
  return status
end

--- Runs a transfer with a progress bar, signals ending it; the exit status.
local function transfer(fn, ...)
  local bar = progress_bar()
  local args = pack(...)
  args[args.n + 1] = { progress = bar.update }
  local ok, result, err = interruptible(fn, unpack(args, 1, args.n + 1))
  bar.finish(ok and result and not interrupt.pending)
  if interrupt.pending then return interrupted_status() end
  if not ok then return fail(EXIT_FAILED, one_line(result)) end
  if not result then return fail(EXIT_FAILED, one_line(err)) end
  return 0
end

local function put(ctx)
  local session, src, dst = ctx.session, ctx.args[2], ctx.args[3]
  if src ~= "-" and localfile.is_directory(src) then
    return fail(EXIT_FAILED, src .. " is a directory: put copies one file (sandkit cp -r " .. src .. " "
      .. ctx.args[1] .. ":" .. dst .. " copies a directory)")
  end
  return transfer(session.write_file_from, session, dst, src == "-" and io.stdin or src)
end

local function get(ctx)
  local session, src, dst = ctx.session, ctx.args[2], ctx.args[3]
  local entry = session:stat(src)
  if entry and entry.type == "dir" then
    return fail(EXIT_FAILED, src .. " is a directory: get copies one file (sandkit cp -r " .. ctx.args[1]
      .. ":" .. src .. " " .. dst .. " copies a directory)")
  end
  -- Into a directory, as cp does: under the remote file's own name.
  if dst ~= "-" and localfile.is_directory(dst) then
    dst = dst:gsub("/+$", "") .. "/" .. (src:match("([^/]+)/*$") or src)
  end
  return transfer(session.read_file_to, session, src, dst == "-" and io.stdout or dst)
end

local function job_start(ctx)
  local o = ctx.opts
  local started, err = ctx.session:start_job(ctx.argv, { timeout = o.timeout or DEFAULT_TIMEOUT, cwd = o.cwd,
    env = env_map(o.env), id = o.id })
  if not started then return fail(status_of_error(err), one_line(err)) end
  if o.json then print_json{ id = started.id } else io.stdout:write(started.id, "\n") end
  return 0
end

local function job_cancel(ctx)
  local ok, err = assert(ctx.session:job(ctx.args[2])):cancel()
  if not ok then return fail(EXIT_FAILED, one_line(err)) end
  return 0
end

local function job_ending_status(page, job_id, session)
  if page.exit then return command_ended(page.exit, nil, session) end
  local failure = sandkit.errors.command_failed(page.error and page.error.code or "unknown",
    page.error and page.error.message or "the job ended without an exit status")
  return fail(status_of_error(failure), "job " .. job_id .. ": " .. one_line(failure))
end

local function job_poll(ctx)
  local job_id, o = ctx.args[2], ctx.opts
  if o.follow and o.json then return fail(EXIT_USAGE, "--follow streams output; --json prints one poll") end
  local handle = assert(ctx.session:job(job_id))
  if o.follow then
    local exit
    local ok, failure = interruptible(function()
      for frame in handle:frames{ since = o.since } do
        if frame.type == "exit" then exit = frame else write_frame(frame) end
      end
    end)
    if interrupt.pending then return interrupted_status() end
    if not ok then return fail(status_of_error(failure), "job " .. job_id .. ": " .. one_line(failure)) end
    return command_ended(exit, nil, ctx.session)
  end
  local page, err = handle:poll(o.since)
  if not page then return fail(EXIT_FAILED, one_line(err)) end
  if o.json then
    local frames = json.array{}
    for i, f in ipairs(page.frames) do
      frames[i] = { type = f.type, seq = f.seq, data_base64 = core.b64encode(f.data) }
    end
    print_json{ id = job_id, running = page.running, frames = frames, next = page.next or json.null,
      exit = page.exit and { code = page.exit.code, truncated = page.exit.truncated,
        signal = page.exit.signal or json.null } or json.null,
      error = page.error and { code = page.error.code, message = page.error.message } or json.null }
    if page.exit then say_if_truncated(page.exit) end
    return 0
  end
  for _, frame in ipairs(page.frames) do write_frame(frame) end
  if page.running then
    io.stderr:write(string.format("sandkit: job %s running; next: --since %s\n", job_id,
      page.next and tostring(page.next) or "(none yet)"))
    return 0
  end
  return job_ending_status(page, job_id, ctx.session)
end

-- Images ------------------------------------------------------------------------------------

local function image_result(meta, err, json_out)
  if interrupt.pending then return interrupted_status() end
  if not meta then return fail(EXIT_FAILED, one_line(err)) end
  if json_out then
    print_json{ name = meta.name, size = meta.size, entries = meta.entries,
      created_at = iso_time(meta.created_at) or json.null, origin = meta.origin }
  else
    io.stdout:write(meta.name, "\n")
  end
  return 0
end

local function image_build(ctx)
  local o = ctx.opts
  local ok, meta, err = interruptible(ctx.sandbox.image_build, ctx.sandbox, ctx.args[1],
    { suite = o.suite, packages = o.packages, mirror = o.mirror })
  if not ok then meta, err = nil, meta end
  return image_result(meta, err, o.json)
end

local function image_import(ctx)
  local o = ctx.opts
  local ok, meta, err = interruptible(ctx.sandbox.image_import, ctx.sandbox, ctx.args[1], ctx.args[2],
    { max_bytes = o.max_bytes, max_entries = o.max_entries })
  if not ok then meta, err = nil, meta end
  return image_result(meta, err, o.json)
end

local function image_commit(ctx)
  local ok, meta, err = interruptible(ctx.sandbox.image_commit, ctx.sandbox, ctx.args[1], ctx.args[2])
  if not ok then meta, err = nil, meta end
  return image_result(meta, err, ctx.opts.json)
end

local function image_ls(ctx)
  local list, err = ctx.sandbox:image_list()
  if not list then return fail(EXIT_FAILED, one_line(err)) end
  if ctx.opts.json then
    local out = json.array{}
    for i, m in ipairs(list) do
      out[i] = { name = m.name, size = m.size, entries = m.entries,
        created_at = iso_time(m.created_at) or json.null, origin = m.origin }
    end
    print_json{ images = out }
    return 0
  end
  local rows = { { "NAME", "SIZE", "CREATED", "ORIGIN" } }
  for _, m in ipairs(list) do
    rows[#rows + 1] = { m.name, size_text(m.size or 0), iso_time(m.created_at) or "-", tostring(m.origin) }
  end
  local widths = {}
  for _, row in ipairs(rows) do
    for c, cell in ipairs(row) do widths[c] = math.max(widths[c] or 0, #cell) end
  end
  for _, row in ipairs(rows) do
    io.stdout:write(string.format("%-" .. widths[1] .. "s  %" .. widths[2] .. "s  %-" .. widths[3]
      .. "s  %s\n", row[1], row[2], row[3], row[4]))
  end
  return 0
end

local function image_rm(ctx)
  local status = 0
  for _, name in ipairs(ctx.args) do
    local ok, err = ctx.sandbox:image_remove(name)
    if not ok then status = fail(EXIT_FAILED, name .. ": " .. one_line(err)) end
  end
  return status
end

--- What the commands of cli_files.lua and cli_jobs.lua use of this file.
local HELPERS = {
  fail = fail, one_line = one_line, print_json = print_json,
  interruptible = interruptible, interrupted = function() return interrupt.pending ~= nil end,
  interrupted_status = interrupted_status, open_session = open_session, no_session = no_session,
  write_frame = write_frame, check_signals = check_signals, command_ended = command_ended,
  take_winch = function()
    local winch = interrupt.winch
    interrupt.winch = false
    return winch
  end,
  fail_error = function(err) return fail(status_of_error(err), one_line(err)) end,
  env_map = env_map, transfer = transfer,
  EXIT_FAILED = EXIT_FAILED, EXIT_USAGE = EXIT_USAGE, DEFAULT_TIMEOUT = DEFAULT_TIMEOUT,
}

--- The handler of command `name` in `module` (cli_files.lua, cli_jobs.lua), loaded when it runs.
local function handled_by(module, name)
  return function(ctx) return module().handlers(HELPERS)[name](ctx) end
end

--- One of the commands `fs NAME …`, over a session's files (cli_files.lua).
local function fs_command(name, args, options, synopsis, summary)
  return { name = "fs " .. name, handler = handled_by(cli_files, "fs " .. name), args = args,
    options = options, session = 1, synopsis = synopsis, summary = summary }
end

--- The commands, in the order --help lists them. `args` are the positional arguments (a
-- trailing "..." repeats the last; brackets make one optional), `argv` a command after --,
-- `session` the argument naming the session the command works in (opened before it runs).
local COMMANDS = {
  { name = "run", handler = run, argv = true,
    options = { "session", "create", "lifetime", "timeout", "cwd", "env", "output-cap", "lines",
      "interactive", "tty" },
    synopsis = "run [-i | -t] [--session NAME [--create]] [--timeout S] [--cwd DIR] [--env K=V]...\n"
      .. "      [--output-cap BYTES] [--lines] [--lifetime S] -- ARGV...",
    summary = "run ARGV in a session (a throwaway one without --session), streaming its\n"
      .. "output as it comes; exits with its status. -i forwards standard input, -t\n"
      .. "runs ARGV on a terminal (this one raw meanwhile; Ctrl-C reaches ARGV)" },
  { name = "shell", handler = handled_by(cli_jobs, "shell"), args = { "NAME" }, session = 1,
    options = { "timeout", "cwd", "env" },
    synopsis = "shell NAME [--cwd DIR] [--env K=V]...",
    summary = "open an interactive shell in a session (on a terminal when this is one)" },
  { name = "create", handler = create, args = { "[NAME]" },
    options = { "lifetime", "env", "label", "image", "memory", "pids", "cpus", "disk", "json" },
    synopsis = "create [NAME] [--lifetime S] [--env K=V]... [--label K=V]... [--image NAME]\n"
      .. "      [--memory SIZE] [--pids N] [--cpus CORES] [--disk SIZE] [--json]",
    summary = "make a session and print its name; --env sets what every command of it\n"
      .. "starts with, --label what ls --label finds it by, --image what its / is, the\n"
      .. "limits what its commands may use" },
  { name = "ls", handler = ls, options = { "label", "json" }, synopsis = "ls [--label K=V]... [--json]",
    summary = "list sessions: name, state, generation, creation time, end of lifetime\n"
      .. "(- for none) and labels; with --label only those carrying every one" },
  { name = "lifetime", handler = lifetime, args = { "NAME", "SECONDS" }, options = { "json" },
    synopsis = "lifetime NAME SECONDS [--json]",
    summary = "make the session end SECONDS from now (sooner or later than before) and\n"
      .. "print the new end; a command cut by the end fails naming the lifetime" },
  { name = "rm", handler = rm, args = { "NAME..." }, options = { "force" }, synopsis = "rm [-f] NAME...",
    summary = "terminate sessions and remove their files; one that does not exist is\n"
      .. "status 125, and with -f no error" },
  { name = "prune", handler = prune, options = { "json" }, synopsis = "prune [--json]",
    summary = "remove the sessions whose agent died and print their names (one past\n"
      .. "its lifetime is gone already: any listing removed it, unnamed)" },
  { name = "put", handler = put, args = { "NAME", "LOCAL", "REMOTE" }, session = 1,
    synopsis = "put NAME LOCAL|- REMOTE",
    summary = "copy a local file (- : standard input) into a session" },
  { name = "get", handler = get, args = { "NAME", "REMOTE", "LOCAL" }, session = 1,
    synopsis = "get NAME REMOTE LOCAL|-",
    summary = "copy a file out of a session (- : standard output)" },
  { name = "cp", handler = handled_by(cli_files, "cp"), args = { "SRC", "DST" }, options = { "recursive" },
    synopsis = "cp [-r] SRC DST",
    summary = "copy between this machine and a session, one side NAME:PATH: a file, or\n"
      .. "with -r a directory (into DST when it is a directory, as cp does); - is a\n"
      .. "tar stream on standard input or output" },
  fs_command("ls", { "NAME", "[PATH]..." }, { "depth", "json" }, "fs NAME ls [PATH]... [--depth N] [--json]",
    "list a session's directories (default /): mode, size, time, path"),
  fs_command("stat", { "NAME", "PATH..." }, { "json" }, "fs NAME stat PATH... [--json]",
    "describe paths of a session; exits 1 when one is absent"),
  fs_command("rm", { "NAME", "PATH..." }, { "recursive" }, "fs NAME rm [-r] PATH...",
    "remove files, links or empty directories (-r: whole trees); an absent path\n"
      .. "is removed already"),
  fs_command("mv", { "NAME", "FROM", "TO" }, { "overwrite" }, "fs NAME mv FROM TO [--overwrite]",
    "rename within a session; what is at TO stays unless --overwrite"),
  fs_command("mkdir", { "NAME", "PATH..." }, nil, "fs NAME mkdir PATH...",
    "make directories, with their parents"),
  fs_command("watch", { "NAME", "PATH" }, { "recursive", "timeout", "json" },
    "fs NAME watch PATH [-r] [--timeout S] [--json]",
    "print a path's changes as they happen (create, modify, remove, rename,\n"
      .. "overflow), until --timeout (default a day) or the path goes"),
  { name = "job start", handler = job_start, args = { "NAME" }, argv = true, session = 1,
    options = { "id", "timeout", "cwd", "env", "json" },
    synopsis = "job start NAME [--id ID] [--timeout S] [--cwd DIR] [--env K=V]... [--json]\n"
      .. "      -- ARGV...",
    summary = "start a detached job; prints its id" },
  { name = "job poll", handler = job_poll, args = { "NAME", "JOB" }, session = 1,
    options = { "since", "follow", "json" },
    synopsis = "job poll NAME JOB [--since N] [--follow | --json]",
    summary = "print the job's output after seq N, exiting with its status once it has\n"
      .. "ended; with --follow, print until it ends" },
  { name = "job cancel", handler = job_cancel, args = { "NAME", "JOB" }, session = 1, synopsis = "job cancel NAME JOB",
    summary = "stop a job" },
  { name = "job ls", handler = handled_by(cli_jobs, "job ls"), args = { "NAME" }, session = 1,
    options = { "json" },
    synopsis = "job ls NAME [--json]",
    summary = "list a session's jobs: id, running or its ending, start time, stdin/pty,\n"
      .. "command" },
  { name = "job attach", handler = handled_by(cli_jobs, "job attach"), args = { "NAME", "JOB" }, session = 1,
    synopsis = "job attach NAME JOB",
    summary = "follow a job's output to its end and, for a stdin or pty job still\n"
      .. "running, send it this input (on a terminal, raw); exits with its status" },
  { name = "image build", handler = image_build, args = { "NAME" },
    options = { "suite", "packages", "mirror", "json" },
    synopsis = "image build NAME [--suite SUITE] [--packages P,Q] [--mirror URL] [--json]",
    summary = "make an image of a Debian system with mmdebstrap" },
  { name = "image import", handler = image_import, args = { "NAME", "SOURCE" },
    options = { "max-bytes", "max-entries", "json" },
    synopsis = "image import NAME DIR|FILE.tar|- [--max-bytes SIZE] [--max-entries N] [--json]",
    summary = "make an image of a directory or a tar archive (- : standard input), such\n"
      .. "as docker export writes" },
  { name = "image commit", handler = image_commit, args = { "SESSION", "NAME" }, options = { "json" },
    synopsis = "image commit SESSION NAME [--json]",
    summary = "make an image of a session's current tree (a session from an image)" },
  { name = "image ls", handler = image_ls, options = { "json" }, synopsis = "image ls [--json]",
    summary = "list images: name, size, creation time, origin" },
  { name = "image rm", handler = image_rm, args = { "NAME..." }, synopsis = "image rm NAME...",
    summary = "remove images; one a session uses is refused" },
  { name = "help", args = { "[COMMAND]" }, synopsis = "help [COMMAND]",
    summary = "this text, or a command's own" },
}
local BY_NAME = {}
for _, command in ipairs(COMMANDS) do BY_NAME[command.name] = command end
--- `job` alone is no command but the name of three: its help describes them all.
BY_NAME.job = { name = "job", group = {} }
for _, command in ipairs(COMMANDS) do
  if command.name:match("^job ") then table.insert(BY_NAME.job.group, command) end
end
--- `image` is the name of five.
BY_NAME.image = { name = "image", group = {} }
for _, command in ipairs(COMMANDS) do
  if command.name:match("^image ") then table.insert(BY_NAME.image.group, command) end
end
--- `fs` is the name of six, each after the session's NAME: fs NAME ls …
BY_NAME.fs = { name = "fs", group = {}, before = "NAME" }
for _, command in ipairs(COMMANDS) do
  if command.name:match("^fs ") then table.insert(BY_NAME.fs.group, command) end
end

-- Help --------------------------------------------------------------------------------------

--- The chosen provider's flags, by name: { arg =, option =, help =, convert = }, its module,
-- and why it could not be loaded when it is one sandkit has but it failed to load.
local function provider_flags(name)
  if not name:match("^[%w_]+$") then return {}, nil end
  local found, module = pcall(require, "sandkit.providers." .. name)
  local flags = {}
  if found and type(module) == "table" then
    for _, f in ipairs(module.CLI_OPTIONS or {}) do flags[f.flag] = f end
    return flags, module
  end
  for _, known in ipairs(sandkit.PROVIDERS) do
    if known == name then
      -- sandkit.sandbox says why a provider it knows cannot be had (absent, or failing to
      -- load); LuaJIT remembers a failed require as a "loop", so the load is forgotten first.
      package.loaded["sandkit.providers." .. name] = nil
      return flags, nil, one_line(select(2, sandkit.sandbox{ provider = name }))
    end
  end
  return flags, nil
end

local function option_line(name, spec)
  local left = "  " .. (spec.short and ("-" .. spec.short .. ", ") or "") .. "--" .. name
    .. (spec.arg and (" " .. spec.arg) or "")
  if #left >= 22 then return left .. "\n" .. string.rep(" ", 22) .. spec.help .. "\n" end
  return left .. string.rep(" ", 22 - #left) .. spec.help .. "\n"
end

local function indent(text, by)
  return (text:gsub("\n", "\n" .. string.rep(" ", by)))
end

local function provider_synopsis(provider, pflags)
  local names, parts = {}, { "[--provider " .. provider .. "]" }
  for name in pairs(pflags) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do parts[#parts + 1] = "[--" .. name .. " " .. pflags[name].arg .. "]" end
  return table.concat(parts, " ")
end

--- Each command's synopsis and summary, as --help lists them.
local function command_list(commands)
  local out = {}
  for _, c in ipairs(commands) do
    out[#out + 1] = "  " .. c.synopsis .. "\n" .. "        " .. indent(c.summary, 8) .. "\n"
  end
  return table.concat(out)
end

local function global_help(provider, pflags)
  local out = { "usage: sandkit " .. provider_synopsis(provider, pflags) .. " COMMAND ...\n\n",
    command_list(COMMANDS) }
  out[#out + 1] = "\n`sandkit COMMAND --help` describes a command's options; `sandkit --version` prints\n"
    .. "the version. Provider options go before or after the command.\n\n"
  out[#out + 1] = EXIT_STATUS
  return table.concat(out)
end

--- A group's help (`help job`): what each of its commands does, and where each one's options are.
local function group_help(group)
  local subs = {}
  for i, c in ipairs(group.group) do subs[i] = c.name:sub(#group.name + 2) end
  return "usage: sandkit " .. group.name .. " " .. (group.before and (group.before .. " ") or "")
    .. table.concat(subs, "|") .. " ...\n\n"
    .. command_list(group.group)
    .. "\n`sandkit " .. group.name .. (group.before and (" " .. group.before) or "")
    .. " COMMAND --help` describes a command's options.\n"
end

local function command_help(command, provider, pflags)
  if command.group then return group_help(command) end
  local out = { "usage: sandkit " .. command.synopsis .. "\n\n" .. command.summary .. "\n" }
  if command.options and #command.options > 0 then
    out[#out + 1] = "\noptions:\n"
    for _, name in ipairs(command.options) do out[#out + 1] = option_line(name, OPTIONS[name]) end
  end
  local own, names = {}, {}
  for _, name in ipairs(command.options or {}) do own[name] = true end
  -- A provider flag the command takes as its own option means that option after the command.
  for name in pairs(pflags) do if not own[name] then names[#names + 1] = name end end
  table.sort(names)
  out[#out + 1] = "\nprovider options (" .. provider .. "):\n" .. option_line("provider", GLOBAL.provider)
  for _, name in ipairs(names) do out[#out + 1] = option_line(name, pflags[name]) end
  return table.concat(out)
end

-- Parsing -----------------------------------------------------------------------------------

--- Which provider the command line names: its flags can be parsed only once that is known.
local function provider_of(args)
  for i = 1, #args do
    local a = args[i]
    if a == "--" then break end
    local value = a:match("^%-%-provider=(.*)$")
    if value then return value end
    if a == "--provider" and args[i + 1] then return args[i + 1] end
  end
  return DEFAULT_PROVIDER
end

--- Reads the command line: { command =, opts = { [name] = value }, provider_opts =, args =,
-- argv = } or nil, a message and the command it was about (for its help).
local function parse(args, pflags, provider)
  local p = { opts = {}, provider_opts = {}, args = {} }
  local command, pending_job, pending_image
  -- After `fs`: its session's NAME, then which of its commands.
  local pending_fs
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "--" then
      local rest = {}
      for j = i + 1, #args do rest[#rest + 1] = args[j] end
      if command and command.argv then p.argv = rest
      else for _, r in ipairs(rest) do p.args[#p.args + 1] = r end end
      break
    elseif a:sub(1, 2) == "--" and #a > 2 then
      local name, value = a:match("^%-%-([^=]+)=(.*)$")
      name = name or a:sub(3)
      local spec, into = GLOBAL[name], p.opts
      -- The command's own option first: a provider flag of the same name (kubernetes'
      -- --lifetime) sets the sandbox's default, which the command's option overrides anyway.
      if not spec and command and command.options then
        for _, allowed in ipairs(command.options) do
          if allowed == name then spec = OPTIONS[name] end
        end
      end
      if not spec and pflags[name] then spec, into = pflags[name], p.provider_opts end
      if not spec then
        local known = {}
        for k in pairs(GLOBAL) do known[k] = true end
        for k in pairs(pflags) do known[k] = true end
        for _, k in ipairs(command and command.options or {}) do known[k] = true end
        for _, other in ipairs(sandkit.PROVIDERS) do
          if other ~= provider and provider_flags(other)[name] then
            return nil, "--" .. name .. " is not an option of the " .. provider .. " provider (it is the "
              .. other .. " provider's)", command
          end
        end
        local near = options_check.nearest(name, known)
        local where = command and (" for " .. command.name) or (OPTIONS[name] and " before the command" or "")
        return nil, "unknown option --" .. name .. where .. (near and ("; did you mean --" .. near .. "?") or ""),
          command
      end
      local key = name:gsub("%-", "_")
      if spec.arg then
        if value == nil then
          i = i + 1
          value = args[i]
          if value == nil then return nil, "--" .. name .. " needs a value (" .. spec.arg .. ")", command end
        end
        local converted, why = value, nil
        if spec.secret_file then converted, why = secret_from_file(value)
        elseif spec.convert then converted, why = spec.convert(value) end
        if converted == nil then return nil, "--" .. name .. " takes " .. why .. ", not " .. value, command end
        if spec.list then
          into[key] = into[key] or {}
          table.insert(into[key], converted)
        elseif into[key] ~= nil then
          return nil, "--" .. name .. " is given twice", command
        else
          into[key] = converted
        end
      else
        if value ~= nil then return nil, "--" .. name .. " takes no value", command end
        into[key] = true
      end
    elseif a:sub(1, 1) == "-" and a ~= "-" then
      -- A one-dash option is the letter of one of the command's own flags, alone.
      local short
      for _, allowed in ipairs(command and command.options or {}) do
        if OPTIONS[allowed].short and a == "-" .. OPTIONS[allowed].short then short = allowed end
      end
      if not short then return nil, "unknown option " .. a, command end
      p.opts[short:gsub("%-", "_")] = true
    elseif pending_fs == "name" then
      p.args[#p.args + 1] = a
      pending_fs = "command"
    elseif pending_fs == "command" then
      command = BY_NAME["fs " .. a]
      if not command then return nil, "fs NAME needs ls, stat, rm, mv, mkdir or watch, not " .. a, BY_NAME.fs end
      pending_fs = nil
    elseif pending_job then
      command = BY_NAME["job " .. a]
      if not command then return nil, "job needs start, poll or cancel, not " .. a, BY_NAME.job end
      pending_job = false
    elseif pending_image then
      command = BY_NAME["image " .. (a == "list" and "ls" or a)]
      if not command then
        return nil, "image needs build, import, commit, ls or rm, not " .. a, BY_NAME.image
      end
      pending_image = false
    elseif not command then
      if a == "job" then
        pending_job = true
      elseif a == "image" then
        pending_image = true
      elseif a == "fs" then
        pending_fs = "name"
      else
        command = BY_NAME[a]
        if not command then
          local names = {}
          for name in pairs(BY_NAME) do if not name:find(" ") then names[name] = true end end
          local near = options_check.nearest(a, names)
          return nil, "unknown command " .. a .. (near and ("; did you mean " .. near .. "?") or "")
        end
      end
    else
      p.args[#p.args + 1] = a
    end
    i = i + 1
  end
  if pending_job then
    -- `job --help` asks what `help job` does; anything else lacks the job's own command.
    if not p.opts.help then return nil, "job needs start, poll or cancel", BY_NAME.job end
    command = BY_NAME.job
  end
  if pending_image then
    if not p.opts.help then return nil, "image needs build, import, commit, ls or rm", BY_NAME.image end
    command = BY_NAME.image
  end
  if pending_fs then
    if not p.opts.help then
      return nil, "fs needs a session's NAME, then ls, stat, rm, mv, mkdir or watch", BY_NAME.fs
    end
    command = BY_NAME.fs
  end
  p.command = command
  return p
end

--- Checks the positional arguments and the command after -- against the command's table.
local function check_arguments(p)
  local c = p.command
  local spec = c.args or {}
  local min, max = 0, 0
  for _, a in ipairs(spec) do
    if a:match("%.%.%.$") then max = math.huge else max = max + 1 end
    if not a:match("^%[") then min = min + 1 end
  end
  if #p.args < min then return nil, c.name .. " needs " .. table.concat(spec, " ") end
  if #p.args > max then
    return nil, c.name .. (max == 0 and " takes no arguments" or (" takes " .. table.concat(spec, " ")))
      .. "; extra: " .. p.args[max + 1]
  end
  if c.argv and not (p.argv and #p.argv > 0) then return nil, c.name .. " needs -- ARGV..." end
  return true
end

--- Runs the command line in args (as the `arg` table) and returns the exit status.
function cli.main(args)
  local provider = provider_of(args)
  local pflags, module, broken = provider_flags(provider)
  -- A provider sandkit knows but cannot load is the installation's fault, not the command
  -- line's: said before its flags, which are unknown without it, are read.
  if broken then return fail(EXIT_SANDKIT, broken) end
  local p, err, about = parse(args, pflags, provider)
  if not p then
    return fail(EXIT_USAGE, err .. " (see `sandkit " .. (about and (about.name .. " ") or "") .. "--help`)")
  end
  local command = p.command
  if p.opts.version then
    io.stdout:write("sandkit ", sandkit.VERSION, "\n")
    return 0
  end
  if command and command.name == "help" then
    local topic = p.args[1] and table.concat(p.args, " ")
    if topic and not BY_NAME[topic] then return fail(EXIT_USAGE, "no command " .. topic) end
    io.stdout:write(topic and command_help(BY_NAME[topic], provider, pflags) or global_help(provider, pflags))
    return 0
  end
  if p.opts.help then
    io.stdout:write(command and command_help(command, provider, pflags) or global_help(provider, pflags))
    return 0
  end
  if not command then
    io.stderr:write(global_help(provider, pflags))
    return EXIT_USAGE
  end
  local ok, bad = check_arguments(p)
  if not ok then return fail(EXIT_USAGE, bad .. " (see `sandkit " .. command.name .. " --help`)") end
  if not module then return fail(EXIT_USAGE, "unknown provider " .. provider) end

  local sandbox_options = { provider = provider }
  for key, value in pairs(p.provider_opts) do
    local spec = pflags[key:gsub("_", "-")]
    sandbox_options[spec.option or key] = value
  end
  local sandbox
  sandbox, err = sandkit.sandbox(sandbox_options)
  if not sandbox then
    return fail(err.code == "INVALID_INPUT" and EXIT_USAGE or EXIT_FAILED, one_line(err))
  end
  install_signals()
  local ctx = { sandbox = sandbox, opts = p.opts, args = p.args, argv = p.argv, helpers = HELPERS }
  if command.session then
    ctx.session, err = open_session(sandbox, p.args[command.session])
    if not ctx.session then return no_session(err) end
  end
  return command.handler(ctx)
end

return cli
