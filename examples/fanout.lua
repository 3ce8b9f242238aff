--- Fan out: N sessions, one command each, all at once from one Lua state. Output is
-- interleaved line by line with each session's name as a prefix; exit codes are gathered.
--   lua5.4 examples/fanout.lua [N]

local sandkit = require "sandkit"

local n = tonumber(arg and arg[1]) or 8
local sandbox = assert(sandkit.sandbox{ provider = "local" })

local _, codes = assert(sandkit.run(function()
  local tasks = {}
  for i = 1, n do
    tasks[i] = sandkit.spawn(function()
      local session = assert(sandbox:create{})
      local prefix = string.format("[shard %2d] ", i)
      local code
      -- Each shard prints a few lines at its own pace and exits with its own status; the last
      -- line has no newline. `lines = true` hands over one whole line per frame, that one too.
      local argv = { "sh", "-c", string.format("for step in 1 2 3; do echo step $step of shard %d; "
        .. "sleep 0.0%d; done; printf 'done'; exit %d", i, i % 10, i % 3) }
      for frame in session:run(argv, { timeout = 60, lines = true }) do
        if frame.type == "exit" then
          code = frame.code
        else
          io.write(prefix, frame.data, frame.data:sub(-1) == "\n" and "" or "\n")
        end
      end
      sandbox:terminate(session.id)
      return code
    end)
  end
  local gathered = {}
  for i, task in ipairs(tasks) do gathered[i] = assert(task:join()) end
  return gathered
end))

for i, code in ipairs(codes) do print(("shard %d exited %d"):format(i, code)) end
