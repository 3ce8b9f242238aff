--- The `sandkit` command: thin scripts over the public API for automation.
--
--   sandkit [--provider local] [--root DIR] [--isolate bwrap] COMMAND …
--   sandkit --provider kubernetes --warm-pool POOL --signing-key KEY.pem --key-id ID … COMMAND …
--   sandkit run [--session NAME] [--timeout S] [--cwd DIR] [--env K=V]... -- ARGV...
--   sandkit create [NAME]            sandkit ls            sandkit rm NAME...
--   sandkit put NAME LOCAL REMOTE    sandkit get NAME REMOTE LOCAL|-
--   sandkit job start NAME [--id ID] [--timeout S] [--cwd DIR] [--env K=V]... -- ARGV...
--   sandkit job poll NAME JOB [--since N] [--follow]
--   sandkit job cancel NAME JOB
--
-- Exit status: the command's own for `run` and `job poll --follow` (128+N when a signal killed
-- it); 124 when it outlived its timeout; 125 when sandkit could not run it or lost its outcome;
-- 127 when it could not be started; 2 for a usage error; 1 for any other failure.

local sandkit = require "sandkit"

local cli = {}

local EXIT_USAGE, EXIT_FAILED = 2, 1
local EXIT_TIMEOUT, EXIT_SANDKIT, EXIT_SPAWN = 124, 125, 127
--- A CLI user rarely means a deadline; the protocol needs one, so a day stands in for none.
local DEFAULT_TIMEOUT = 86400

local USAGE = [[
usage: sandkit [--provider local] [--root DIR] [--isolate bwrap] COMMAND ...
       sandkit --provider kubernetes --warm-pool POOL --signing-key KEY.pem --key-id ID
               [--namespace NS] [--kubeconfig FILE] [--context NAME] [--transport direct|apiserver|router]
               [--router-url URL] [--agent-port N] [--ready-timeout S] [--capability-lifetime S]
               [--service-account-dir DIR] COMMAND ...

  run [--session NAME] [--timeout S] [--cwd DIR] [--env K=V]... -- ARGV...
        run ARGV in a session (a throwaway one without --session), streaming its output;
        exits with its exit status
  create [NAME]                      make a session and print its name
  ls                                 list sessions: name, state, generation
  rm NAME...                         terminate sessions and remove their files
  put NAME LOCAL REMOTE              copy a local file into a session
  get NAME REMOTE LOCAL              copy a file out of a session (LOCAL - is stdout)
  job start NAME [--id ID] [--timeout S] [--cwd DIR] [--env K=V]... -- ARGV...
                                     start a detached job; prints its id
  job poll NAME JOB [--since N] [--follow]
                                     print the job's output after seq N; with --follow, until
                                     it ends, exiting with its status
  job cancel NAME JOB                stop a job

exit status: the command's own; 124 timed out; 125 sandkit failed or lost the outcome;
127 could not start the command; 2 usage; 1 other failures
]]

local function fail(code, message)
  io.stderr:write("sandkit: ", message, "\n")
  return code
end

local function one_line(err)
  return (tostring(sandkit.errors.is_error(err) and (err.code .. ": " .. err.message) or err)
    :gsub("\n.*", ""))
end

--- Splits argv into options (per the spec table: name -> "flag" | "value" | "list") and
-- positionals; everything after "--" is positional.
local function parse(args, first, spec)
  local opts, rest = {}, {}
  local i = first
  while i <= #args do
    local a = args[i]
    if a == "--" then
      for j = i + 1, #args do rest[#rest + 1] = args[j] end
      return opts, rest, true
    end
    local name = a:match("^%-%-([%w%-]+)$")
    if name and spec[name] then
      if spec[name] == "flag" then
        opts[name] = true
      else
        i = i + 1
        if args[i] == nil then return nil, "--" .. name .. " needs a value" end
        if spec[name] == "list" then
          opts[name] = opts[name] or {}
          table.insert(opts[name], args[i])
        else
          opts[name] = args[i]
        end
      end
    elseif name then
      return nil, "unknown option --" .. name
    else
      rest[#rest + 1] = a
    end
    i = i + 1
  end
  return opts, rest, false
end

local function command_options(opts)
  local timeout = DEFAULT_TIMEOUT
  if opts.timeout then
    timeout = tonumber(opts.timeout)
    if not timeout or timeout <= 0 then return nil, "--timeout needs a positive number of seconds" end
  end
  local env
  for _, kv in ipairs(opts.env or {}) do
    local k, v = kv:match("^([^=]+)=(.*)$")
    if not k then return nil, "--env takes K=V, not " .. kv end
    env = env or {}
    env[k] = v
  end
  return { timeout = timeout, cwd = opts.cwd, env = env }
end

--- The exit status a command's ending maps to.
local function status_of_error(err)
  if sandkit.errors.is_error(err) then
    if err.failure == "timeoutExceeded" or err.failure == "deadlineExceeded" then return EXIT_TIMEOUT end
    if err.failure == "spawnFailed" then return EXIT_SPAWN end
    if err.code == "SANDBOX_COMMAND_FAILED" and err.failure == "agentRefused" then return EXIT_FAILED end
  end
  return EXIT_SANDKIT
end

local function write_frame(frame)
  local out = frame.type == "stdout" and io.stdout or io.stderr
  out:write(frame.data)
  out:flush()
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

local function run(sandbox, args, first)
  local opts, argv, saw_dashes = parse(args, first, { session = "value", timeout = "value",
    cwd = "value", env = "list" })
  if not opts then return fail(EXIT_USAGE, argv) end
  if not saw_dashes or #argv == 0 then return fail(EXIT_USAGE, "run needs -- ARGV...") end
  local copts, bad = command_options(opts)
  if not copts then return fail(EXIT_USAGE, bad) end
  local session, err
  local throwaway = opts.session == nil
  if throwaway then
    session, err = sandbox:create{}
    if not session then return fail(EXIT_SANDKIT, one_line(err)) end
  else
    session, err = sandbox:get_or_create{ id = opts.session }
    if not session then return fail(EXIT_SANDKIT, one_line(err)) end
  end
  local status
  local ok, failure = pcall(function()
    for frame in session:run(argv, copts) do
      if frame.type == "exit" then
        status = frame.code
      else
        write_frame(frame)
      end
    end
  end)
  if throwaway then sandbox:terminate(session.id) end
  if not ok then return fail(status_of_error(failure), one_line(failure)) end
  if status < 0 or status > 255 then status = EXIT_FAILED end
  return status
end

local function create(sandbox, args, first)
  local session, err = sandbox:create{ id = args[first] }
  if not session then return fail(EXIT_FAILED, one_line(err)) end
  io.stdout:write(session.id, "\n")
  return 0
end

local function ls(sandbox)
  local sessions, err = sandbox:list()
  if not sessions then return fail(EXIT_FAILED, one_line(err)) end
  for _, s in ipairs(sessions) do
    io.stdout:write(string.format("%s\t%s\t%d\n", s.id, s.state, s.generation))
  end
  return 0
end

local function rm(sandbox, args, first)
  if not args[first] then return fail(EXIT_USAGE, "rm needs a session name") end
  local status = 0
  for i = first, #args do
    local ok, err = sandbox:terminate(args[i])
    if not ok then status = fail(EXIT_FAILED, args[i] .. ": " .. one_line(err)) end
  end
  return status
end

local function put(sandbox, args, first)
  local name, src, dst = args[first], args[first + 1], args[first + 2]
  if not dst then return fail(EXIT_USAGE, "put needs NAME LOCAL REMOTE") end
  local f, ferr = io.open(src, "rb")
  if not f then return fail(EXIT_FAILED, ferr) end
  local bytes = f:read("a")
  f:close()
  local session, err = open_session(sandbox, name)
  if not session then return fail(EXIT_FAILED, err) end
  local ok
  ok, err = session:write_files{ [dst] = bytes }
  if not ok then return fail(EXIT_FAILED, one_line(err)) end
  return 0
end

local function get(sandbox, args, first)
  local name, src, dst = args[first], args[first + 1], args[first + 2]
  if not dst then return fail(EXIT_USAGE, "get needs NAME REMOTE LOCAL") end
  local session, err = open_session(sandbox, name)
  if not session then return fail(EXIT_FAILED, err) end
  local bytes
  bytes, err = session:read_file(src)
  if not bytes then return fail(EXIT_FAILED, one_line(err)) end
  if dst == "-" then
    io.stdout:write(bytes)
    return 0
  end
  local f, ferr = io.open(dst, "wb")
  if not f then return fail(EXIT_FAILED, ferr) end
  f:write(bytes)
  f:close()
  return 0
end

local function job(sandbox, args, first)
  local verb, name = args[first], args[first + 1]
  if not name then return fail(EXIT_USAGE, "job needs start|poll|cancel NAME …") end
  local session, err = open_session(sandbox, name)
  if not session then return fail(EXIT_FAILED, err) end
  if verb == "start" then
    local opts, argv, saw_dashes = parse(args, first + 2, { id = "value", timeout = "value",
      cwd = "value", env = "list" })
    if not opts then return fail(EXIT_USAGE, argv) end
    if not saw_dashes or #argv == 0 then return fail(EXIT_USAGE, "job start needs -- ARGV...") end
    local copts, bad = command_options(opts)
    if not copts then return fail(EXIT_USAGE, bad) end
    copts.id = opts.id
    local started
    started, err = session:start_job(argv, copts)
    if not started then return fail(status_of_error(err), one_line(err)) end
    io.stdout:write(started.id, "\n")
    return 0
  end
  local job_id = args[first + 2]
  if not job_id then return fail(EXIT_USAGE, "job " .. tostring(verb) .. " needs NAME JOB") end
  local handle = assert(session:job(job_id))
  if verb == "cancel" then
    local ok
    ok, err = handle:cancel()
    if not ok then return fail(EXIT_FAILED, one_line(err)) end
    return 0
  elseif verb == "poll" then
    local opts, bad = parse(args, first + 3, { since = "value", follow = "flag" })
    if not opts then return fail(EXIT_USAGE, bad) end
    local since = opts.since and math.tointeger(tonumber(opts.since))
    if opts.since and not since then return fail(EXIT_USAGE, "--since needs a seq number") end
    if opts.follow then
      local status
      local ok, failure = pcall(function()
        for frame in handle:frames{ since = since } do
          if frame.type == "exit" then status = frame.code else write_frame(frame) end
        end
      end)
      if not ok then return fail(status_of_error(failure), one_line(failure)) end
      return (status >= 0 and status <= 255) and status or EXIT_FAILED
    end
    local page
    page, err = handle:poll(since)
    if not page then return fail(EXIT_FAILED, one_line(err)) end
    local last = since
    for _, frame in ipairs(page.frames) do
      write_frame(frame)
      last = frame.seq
    end
    if page.running then
      io.stderr:write(string.format("sandkit: job %s running; next: --since %s\n", job_id,
        last and tostring(last) or "(none yet)"))
      return 0
    end
    if page.exit then return page.exit.code end
    local failure = sandkit.errors.command_failed(page.error and page.error.code or "unknown",
      page.error and page.error.message or "the job ended without an exit status")
    return fail(status_of_error(failure), one_line(failure))
  end
  return fail(EXIT_USAGE, "job needs start, poll or cancel")
end

local COMMANDS = { run = run, create = create, ls = ls, rm = rm, put = put, get = get, job = job }

--- Flags before the command, per provider: the local provider's own, or the CLI_OPTIONS a
-- provider module lists ({ flag =, option =, convert = }, as sandkit.providers.kubernetes does).
local LOCAL_FLAGS = { root = { option = "root" }, isolate = { option = "isolate" } }

local function provider_flags(name)
  if name == "local" then return LOCAL_FLAGS end
  local ok, module = pcall(require, "sandkit.providers." .. (name:match("^[%w_]+$") or "-"))
  if not ok or type(module) ~= "table" or type(module.CLI_OPTIONS) ~= "table" then return nil end
  local flags = {}
  for _, f in ipairs(module.CLI_OPTIONS) do flags[f.flag] = f end
  return flags
end

--- The sandbox options of the flags given for a provider, or nil and the usage error.
local function provider_options(provider, given)
  local flags = provider_flags(provider)
  if not flags then return nil, "unknown provider " .. provider .. " (local or kubernetes)" end
  local options = { provider = provider }
  for flag, value in pairs(given) do
    local spec = flags[flag]
    if not spec then return nil, "--" .. flag .. " is not an option of the " .. provider .. " provider" end
    if spec.convert then
      local converted, why = spec.convert(value)
      if converted == nil then return nil, "--" .. flag .. " takes " .. why .. ", not " .. value end
      value = converted
    end
    options[spec.option] = value
  end
  return options
end

--- Runs the command line in args (as the `arg` table) and returns the exit status.
function cli.main(args)
  local provider, flags = "local", {}
  local i = 1
  while args[i] and args[i]:match("^%-%-") do
    local name = args[i]:sub(3)
    if name == "help" then
      io.stdout:write(USAGE)
      return 0
    elseif args[i + 1] == nil then
      return fail(EXIT_USAGE, "unknown option " .. args[i] .. "\n" .. USAGE)
    elseif name == "provider" then
      provider = args[i + 1]
    else
      flags[name] = args[i + 1]
    end
    i = i + 2
  end
  local options, bad = provider_options(provider, flags)
  if not options then return fail(EXIT_USAGE, bad) end
  local command = COMMANDS[args[i] or ""]
  if not command then
    io.stderr:write(USAGE)
    return EXIT_USAGE
  end
  local sandbox, err = sandkit.sandbox(options)
  if not sandbox then return fail(EXIT_FAILED, one_line(err)) end
  return command(sandbox, args, i + 1)
end

return cli
