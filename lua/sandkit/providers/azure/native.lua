--- Protocol operations for an Azure session without an agent (conn.ops), over the data
-- plane: a command runs through executeShellCommand under a deadline the sandbox itself keeps,
-- and its output comes back as the frames the agent would have streamed, once it ended; files
-- go through the data plane's file calls; jobs are not offered.

local errors = require "sandkit.errors"
local protocol = require "sandkit.protocol"
local sessions = require "sandkit.providers.azure.sessions"

local native = {}

local RUN = protocol.OPERATIONS.run
local READ_FILE = protocol.OPERATIONS.read_file
local WRITE_FILES = protocol.OPERATIONS.write_files
local MKDIR = protocol.OPERATIONS.mkdir

--- The deadline is enforced inside the sandbox, so it has bounds of its own.
local MAX_NATIVE_MS = 24 * 3600 * 1000

local gone = sessions.gone

--- Runs argv under a deadline inside the sandbox: draws a 32-hex nonce (stderr's first line),
-- runs the command in its own session, and on the deadline repeats the nonce and kills the
-- whole group. Exit 126 before the nonce means the image cannot bound a command (no setsid,
-- /dev/urandom, od or fractional sleep) and nothing ran.
local DEADLINE_PROGRAM = [[
n=$(od -An -N16 -tx1 /dev/urandom 2>/dev/null | tr -d ' \n')
case $n in ????????????????????????????????) ;; *) exit 126 ;; esac
command -v setsid >/dev/null 2>&1 || exit 126
sleep 0.001 </dev/null >/dev/null 2>&1 || exit 126
printf '%s\n' "$n" >&2
t=$1
shift
setsid "$@" &
p=$!
(
  trap 'kill "$s" 2>/dev/null; exit 0' TERM
  sleep "$t" </dev/null >/dev/null 2>&1 &
  s=$!
  wait "$s"
  printf '%s\n' "$n" >&2
  kill -s KILL -- -"$p" 2>/dev/null
) &
w=$!
wait "$p" 2>/dev/null
c=$?
kill "$w" 2>/dev/null
wait "$w" 2>/dev/null
exit "$c"
]]

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function check_command(argv, opts)
  if type(argv) ~= "table" then error("sandkit: a command is an argv table", 3) end
  for k, v in pairs(argv) do
    if type(k) ~= "number" or k % 1 ~= 0 or k < 1 or k > #argv or type(v) ~= "string" then
      error("sandkit: argv must be a sequence of strings", 3)
    end
  end
  if opts.cwd ~= nil and type(opts.cwd) ~= "string" then error("sandkit: cwd must be a string", 3) end
  if opts.env ~= nil and type(opts.env) ~= "table" then error("sandkit: env must be a table", 3) end
  if #argv == 0 then return errors.invalid_input(RUN, "command", "a command needs at least a program") end
  for _, v in ipairs(argv) do
    if v:find("%z") then return errors.invalid_input(RUN, "command", "an argument holds a NUL byte") end
  end
  for k, v in pairs(opts.env or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then error("sandkit: env must map strings to strings", 3) end
    if not k:match("^[%a_][%w_]*$") or v:find("%z") then
      return errors.invalid_input(RUN, "env", "an environment name is [A-Za-z_][A-Za-z0-9_]* and no value holds NUL")
    end
  end
end

--- The shell command string for argv under a deadline of `ms` milliseconds.
local function deadline_command(argv, env, ms)
  local words = { "sh", "-c", shell_quote(DEADLINE_PROGRAM), "sandkit-deadline",
    string.format("%d.%03d", math.floor(ms / 1000), ms % 1000) }
  local names = {}
  for name in pairs(env or {}) do names[#names + 1] = name end
  if #names > 0 then
    table.sort(names)
    words[#words + 1] = "env"
    for _, name in ipairs(names) do words[#words + 1] = shell_quote(name .. "=" .. env[name]) end
  end
  for _, arg in ipairs(argv) do words[#words + 1] = shell_quote(arg) end
  return table.concat(words, " ")
end

local list_stream_mt = {}
list_stream_mt.__index = list_stream_mt

--- Frames delivered in order, then the failure (if any) for ever.
function list_stream_mt:next()
  local i = self.at
  if i <= #self.frames then
    self.at = i + 1
    return self.frames[i]
  end
  return nil, self.failure
end

--- The command already ended and its output is in memory: nothing is held open.
function list_stream_mt.close() end
list_stream_mt.__close = list_stream_mt.close

--- Frames rebuilt from a finished command's result, as the agent would have streamed them.
local function rebuild(result, ms)
  local stderr = result.stderr or ""
  local nonce = stderr:match("^(%x+)\n")
  if not nonce or #nonce ~= 32 then
    return nil, errors.command_failed("commandNotBounded",
      "sandbox.runCommand: the sandbox image cannot bound a command's time (it needs sh, setsid, od, "
        .. "/dev/urandom and a sleep that takes fractions), so nothing ran", { operation = RUN })
  end
  local rest, repeats = stderr:sub(#nonce + 2):gsub(nonce .. "\n", "")
  local frames, seq = {}, 0
  if (result.stdout or "") ~= "" then
    frames[#frames + 1] = { type = "stdout", seq = seq, data = result.stdout }
    seq = seq + 1
  end
  if rest ~= "" then frames[#frames + 1] = { type = "stderr", seq = seq, data = rest } end
  local stream = setmetatable({ frames = frames, at = 1 }, list_stream_mt)
  if result.exit_code == 137 and repeats > 0 then
    stream.failure = errors.command_failed("timeoutExceeded",
      string.format("sandbox.runCommand: the command exceeded its %dms timeout", ms), { operation = RUN })
  else
    frames[#frames + 1] = { type = "exit", code = result.exit_code or -1, truncated = false }
  end
  return stream
end

function native.exec(conn, argv, opts)
  local bad = check_command(argv, opts)
  if bad then return nil, bad end
  local ms, err = protocol.timeout_ms(opts.timeout, RUN)
  if not ms then return nil, err end
  if ms > MAX_NATIVE_MS then
    return nil, errors.invalid_input(RUN, "timeout", "a command on a session without an agent runs at most 24 hours")
  end
  local p, id = conn.provider, conn.session_id
  local raw
  raw, err = p:ensure_running(id, RUN)
  if not raw then return nil, err end
  local result
  result, err = p.dataplane:execute_shell_command(p.group, id, deadline_command(argv, opts.env, ms),
    opts.cwd, { timeout = ms / 1000 + p.times.native_grace })
  if not result then
    if err then return nil, errors.wrap(RUN, "the command could not be run", err) end
    return nil, gone(RUN, id)
  end
  return rebuild(result, ms)
end

function native.read_file(conn, path)
  if type(path) ~= "string" then error("sandkit: a path is a string", 2) end
  local p, id = conn.provider, conn.session_id
  local bytes, err = p.dataplane:read_file(p.group, id, path)
  if bytes then return bytes end
  if err then return nil, errors.wrap(READ_FILE, "the file could not be read", err) end
  return nil, errors.command_failed("pathNotFound", READ_FILE .. ": no such file in the sandbox: " .. path,
    { operation = READ_FILE, status = 404 })
end

local function unsupported_files(operation)
  return errors.not_supported(operation, "this data plane object offers no " .. operation .. " call")
end

function native.write_files(conn, files)
  if type(files) ~= "table" then error("sandkit: write_files takes a { [path] = bytes } table", 2) end
  local p, id = conn.provider, conn.session_id
  if not p.dataplane.write_file then return nil, unsupported_files(WRITE_FILES) end
  local paths = {}
  for path, bytes in pairs(files) do
    if type(path) ~= "string" or type(bytes) ~= "string" then
      error("sandkit: write_files takes a { [path] = bytes } table", 2)
    end
    paths[#paths + 1] = path
  end
  table.sort(paths)
  for _, path in ipairs(paths) do
    local ok, err = p.dataplane:write_file(p.group, id, path, files[path])
    if not ok then
      err = err and errors.wrap(WRITE_FILES, "the file could not be written", err) or gone(WRITE_FILES, id)
      err.path = path
      return nil, err
    end
  end
  return true
end

function native.mkdir(conn, path)
  if type(path) ~= "string" then error("sandkit: a path is a string", 2) end
  local p, id = conn.provider, conn.session_id
  if not p.dataplane.mkdir then return nil, unsupported_files(MKDIR) end
  local ok, err = p.dataplane:mkdir(p.group, id, path)
  if ok then return true end
  return nil, err and errors.wrap(MKDIR, "the directory could not be made", err) or gone(MKDIR, id)
end

local function no_jobs()
  return nil, errors.not_supported("sandbox.jobStart", "a session without an agent runs no jobs")
end
native.job_start, native.job_poll, native.job_cancel = no_jobs, no_jobs, no_jobs

return native
