--- A tour of sandkit on this machine: a local session, a file in, a command that reads it with
-- its output streamed as it comes, a detached job, and reattaching to that job by id.
--   make demo      (or: lua5.4 examples/quickstart.lua, with sandkit installed)

local sandkit = require "sandkit"

local sandbox = assert(sandkit.sandbox{ provider = "local" })
local session = assert(sandbox:create{})
print(("session %s is %s"):format(session.id, session.state))

-- Paths are relative to the session's own root, even with a leading '/'.
assert(session:write_files{ ["/app/greeting.txt"] = "hello from a file\n" })

-- Frames arrive while the command runs; the loop raises if the stream ever stops short.
local argv = { "sh", "-c", "cat app/greeting.txt; for i in 1 2 3; do echo tick $i; sleep 0.2; done; "
  .. "echo 'a warning' >&2; exit 3" }
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
