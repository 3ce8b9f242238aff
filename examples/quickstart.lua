--- A tour of sandkit on this machine: a local session (a sandbox: its own /, an unprivileged
-- user, no network), a file in, a command that reads it with its output streamed as it comes, a
-- loop left early, a file larger than one request carries, a detached job, and reattaching to
-- that job by id.
--   make demo      (or: lua5.4 examples/quickstart.lua, or luajit, with sandkit installed)

local sandkit = require "sandkit"

-- Confined by default (isolate = "bwrap"; isolate = "none" runs commands on this machine as you).
local sandbox = assert(sandkit.sandbox{ provider = "local" })
-- A lifetime bounds how long the session outlives this script should it die before the end.
local session = assert(sandbox:create{ lifetime = 600, env = { GREETING = "hello" } })
print(("session %s is %s, isolation %s"):format(session.id, session.state,
  sandbox:capabilities().isolation))

-- The session's / is its own: the path a file is written at is the path its commands read.
assert(session:write_files{ ["/app/greeting.txt"] = "hello from a file\n" })

-- Frames arrive while the command runs; the loop raises if the stream ever stops short.
local argv = { "sh", "-c", "cat /app/greeting.txt; echo \"$GREETING from $(id -un) in $PWD\"; "
  .. "for i in 1 2 3; do echo tick $i; sleep 0.2; done; echo 'a warning' >&2; exit 3" }
for frame in session:run(argv, { timeout = 10 }) do
  if frame.type == "stdout" or frame.type == "stderr" then
    io.write(("[%s #%d] %s"):format(frame.type, frame.seq, frame.data))
  elseif frame.type == "exit" then
    print(("exit code %d%s"):format(frame.code, frame.truncated and " (output truncated)" or ""))
  end
end

-- The same, collected: at most max_output bytes kept per stream.
local result = assert(session:exec({ "uname", "-sr" }, { timeout = 10 }))
io.write("uname: ", result.stdout)

-- Leaving a loop early closes the connection, which stops the command. Lua 5.4 closes the
-- iterator when the loop ends; LuaJIT cannot, so it is closed here by hand (closing twice is
-- harmless), on the path where the loop raised too.
local frames = session:run({ "sh", "-c", "echo ready; sleep 30" }, { timeout = 60 })
local ok, err = pcall(function()
  for frame in frames do
    if frame.type == "stdout" and frame.data:find("ready", 1, true) then break end
  end
end)
frames:close()
if not ok then error(err, 0) end
print("left a 30-second command at its first line")

-- Files of any size move in bounded memory: here 48 MiB, more than one request may carry,
-- from a function that makes the bytes and into one that counts them.
local size, chunk = 48 * 1024 * 1024, string.rep("sandkit\n", 8192)
local made = 0
local sent = assert(session:write_file_from("/data/big.bin", function()
  if made >= size then return nil end
  made = made + #chunk
  return chunk
end))
local received = assert(session:read_file_to("/data/big.bin", function() end))
print(("moved %d MiB in and %d MiB back out"):format(math.floor(sent / 1048576),
  math.floor(received / 1048576)))

-- A job outlives the connection that started it; anyone holding its id can read it.
local job = assert(session:start_job({ "sh", "-c", "echo building; sleep 0.5; echo done" },
  { timeout = 60 }))
print("started job " .. job.id)

-- Reattach as another process would: a fresh sandbox object, the session by id, the job by id.
local elsewhere = assert(sandkit.sandbox{ provider = "local" })
local same_session = assert(elsewhere:get(session.id))
for frame in same_session:job(job.id):frames{ interval = 0.1 } do
  if frame.type == "exit" then
    print("job exited with " .. frame.code)
  else
    io.write("[job] ", frame.data)
  end
end

assert(sandbox:terminate(session.id))
print("session " .. session.id .. " terminated")
