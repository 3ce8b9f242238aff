--- The `sandkit` commands over interactive jobs: `run -i` (standard input forwarded), `run -t`
-- (on a terminal), `shell NAME`, `job ls NAME` and `job attach NAME JOB`. cli.lua's table
-- describes them (arguments, options, help) and loads this file to run one, handing it its
-- helpers.
--
-- An interactive command is one loop: the job's live stream and this process's standard input
-- are waited on together (core.poll); output is written as it comes, input sent as it is read,
-- and a SIGWINCH resizes the remote terminal. On a terminal (-t) the local terminal is put in
-- raw mode, so every key — Ctrl-C and Ctrl-D included — goes to the remote terminal, whose
-- line discipline acts on it; the local settings are restored on every way out.

local core = require "sandkit.core"
local json = require "sandkit.json"
local protocol_jobs = require "sandkit.protocol_jobs"
local time = require "sandkit.time"

local cli_jobs = {}

--- Bytes of standard input read and sent at once: one keystroke burst, or one pipe read.
local READ_MAX = 64 * 1024
--- Longest wait for input or output before looking again at the clock and the signals.
local LOOK_AGAIN = 1
--- A terminal's size when this process has none to give (input is not a terminal).
local DEFAULT_COLS, DEFAULT_ROWS = 80, 24
--- What `sandkit shell` runs: the session's bash when it has one, else its sh, as a login shell.
local SHELL = { "/bin/sh", "-c", 'if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi' }

--- This process's standard input as a pollable.
local STDIN = { pollfd = function() return 0 end, events = function() return "r" end,
  timeout = function() return nil end }

--- The local terminal's size, or the default.
local function local_size()
  local cols, rows = core.tty_size(0)
  if not cols or cols < 1 or rows < 1 then return DEFAULT_COLS, DEFAULT_ROWS end
  return cols, rows
end

--- Follows job `job` of `session` until it ends: its output to stdout and stderr, and with
-- `forward` this process's standard input to it (`close_at_end`: the job's input is closed when
-- ours ends). `raw`: the local terminal is in raw mode meanwhile. Returns the exit frame, or
-- raises (h.interruptible catches it).
local function follow(h, session, job, forward, close_at_end)
  local stream, err = protocol_jobs.stream(session.conn, job.id, nil, job.timeout)
  if not stream then error(err, 0) end
  h.on_close(function() stream:close() end)
  local reading = forward
  local function follow_resize()
    if h.take_winch() and job.pty then
      local ok, rerr = job:resize(local_size())
      if not ok then error(rerr, 0) end
    end
  end
  while true do
    while true do
      local frame, ferr = stream:poll()
      if frame == false then break end
      if not frame then error(ferr or "the job's stream ended without its exit", 0) end
      if frame.type == "exit" then return frame end
      h.write_frame(frame)
    end
    follow_resize()
    local waits = reading and { STDIN, stream } or { stream }
    local curl_wait = stream:timeout()
    local limit = LOOK_AGAIN
    if curl_wait and curl_wait >= 0 then limit = math.min(limit, curl_wait / 1000) end
    core.poll(waits, limit)
    h.check_signals()
    -- A resize that came with keys goes first: what they run (stty size) sees the new size.
    follow_resize()
    if reading then
      local bytes, rerr = core.read_ready(0, READ_MAX)
      if bytes == nil then error("standard input: " .. tostring(rerr), 0) end
      if bytes == "" then
        reading = false
        if close_at_end then
          local ok, cerr = job:close_stdin()
          if not ok then error(cerr, 0) end
        end
      elseif bytes then
        local ok, werr = job:write(bytes)
        if not ok then error(werr, 0) end
      end
    end
  end
end

--- Runs `fn` with the local terminal raw when `raw`, restoring it however fn ends.
local function with_terminal(raw, fn)
  local saved
  if raw then
    local why
    saved, why = core.tty_raw(0)
    if not saved then return false, "standard input: " .. tostring(why) end
  end
  local ok, result = pcall(fn)
  if saved then core.tty_restore(0, saved) end
  return ok, result
end

--- Starts argv in session with its input forwarded (`tty`: on a terminal) and follows it to
-- its end; cli.lua's run -i/-t and shell. Returns the exit status.
function cli_jobs.interactive(h, session, argv, copts, tty)
  local raw = tty and core.isatty(0)
  local spawn_opts = { timeout = copts.timeout, cwd = copts.cwd, env = copts.env, id = copts.id }
  if tty then
    local cols, rows = local_size()
    spawn_opts.pty = { cols = cols, rows = rows }
  else
    spawn_opts.stdin = true
  end
  local job
  local closers = {}
  local helpers = setmetatable({ on_close = function(fn) closers[#closers + 1] = fn end }, { __index = h })
  local exit
  local ok, failure = h.interruptible(function()
    local err
    job, err = session:spawn(argv, spawn_opts)
    if not job then error(err, 0) end
    local fine, result = with_terminal(raw, function() return follow(helpers, session, job, true, true) end)
    if not fine then error(result, 0) end
    exit = result
  end)
  for _, close in ipairs(closers) do close() end
  if not ok and job then job:cancel() end
  if h.interrupted() then return h.interrupted_status() end
  if not ok then return h.fail_error(failure) end
  return h.command_ended(exit)
end

local function shell(h)
  return function(ctx)
    return cli_jobs.interactive(h, ctx.session, SHELL, { timeout = ctx.opts.timeout or h.DEFAULT_TIMEOUT,
      cwd = ctx.opts.cwd, env = h.env_map(ctx.opts.env) }, core.isatty(0))
  end
end

local function job_state(job)
  if job.running then return "running" end
  if job.code then return "exit " .. job.code end
  return "error " .. tostring(job.error)
end

local function job_ls(h)
  return function(ctx)
    local list, err = ctx.session:jobs()
    if not list then return h.fail(h.EXIT_FAILED, h.one_line(err)) end
    table.sort(list, function(a, b) return a.started_at < b.started_at end)
    if ctx.opts.json then
      local out = json.array{}
      for i, job in ipairs(list) do
        out[i] = { id = job.id, argv = json.array(job.argv), running = job.running,
          started_at = time.rfc3339(job.started_at), code = job.code or json.null,
          signal = job.signal or json.null, error = job.error or json.null, stdin = job.stdin,
          pty = job.pty }
      end
      h.print_json{ jobs = out }
      return 0
    end
    for _, job in ipairs(list) do
      io.stdout:write(string.format("%-36s  %-10s  %s  %-5s  %s\n", job.id, job_state(job),
        time.rfc3339(job.started_at), job.pty and "pty" or job.stdin and "stdin" or "-",
        table.concat(job.argv, " ")))
    end
    return 0
  end
end

local function job_attach(h)
  return function(ctx)
    local job_id = ctx.args[2]
    local list, err = ctx.session:jobs()
    if not list then return h.fail(h.EXIT_FAILED, h.one_line(err)) end
    local found
    for _, job in ipairs(list) do
      if job.id == job_id then found = job end
    end
    if not found then return h.fail(h.EXIT_FAILED, "no job " .. job_id .. " in session " .. ctx.args[1]) end
    local job = assert(ctx.session:job(job_id))
    job.pty = found.pty
    local forward = found.running and found.stdin
    local raw = found.pty and forward and core.isatty(0)
    local closers = {}
    local helpers = setmetatable({ on_close = function(fn) closers[#closers + 1] = fn end }, { __index = h })
    local exit
    local ok, failure = h.interruptible(function()
      if raw then
        local resized, rerr = job:resize(local_size())
        if not resized then error(rerr, 0) end
      end
      local fine, result = with_terminal(raw, function()
        -- The job outlives an attachment: the end of this input is not the end of its.
        return follow(helpers, ctx.session, job, forward, false)
      end)
      if not fine then error(result, 0) end
      exit = result
    end)
    for _, close in ipairs(closers) do close() end
    if h.interrupted() then return h.interrupted_status() end
    if not ok then return h.fail_error(failure) end
    return h.command_ended(exit)
  end
end

--- The handlers of these commands by name, with cli.lua's helpers `h`.
function cli_jobs.handlers(h)
  return { shell = shell(h), ["job ls"] = job_ls(h), ["job attach"] = job_attach(h) }
end

return cli_jobs
