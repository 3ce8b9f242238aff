--- The `agent` provider: talk to a sandkit-agent someone already runs, by URL and token.
-- This example starts one itself (what an image entrypoint would do), then uses it.
--   lua5.4 examples/agent_provider.lua      (needs sandkit-agent on $PATH or $SANDKIT_AGENT)

local sandkit = require "sandkit"
local core = require "sandkit.core"

local root = os.tmpname()
os.remove(root)
assert(core.mkdir(root, 448))
local token = core.b64encode(core.random(32))
local token_file = root .. ".token"
assert(core.write_private(token_file, token))

local agent = os.getenv("SANDKIT_AGENT") or "sandkit-agent"
local pid, ready = assert(core.spawn({ agent, "--root", root, "--token-file", token_file,
  "--ready-fd", "3", "--log", "quiet" }, { ready_fd = 3 }))
-- The agent writes one line once it listens: {"port":…,"pid":…,"bootId":…}.
local line = ""
while not line:find("\n") do
  local chunk = ready:read()
  if chunk == nil then error("sandkit-agent did not start") end
  if chunk then line = line .. chunk else core.wait(ready, 5) end
end
local port = assert(tonumber(line:match('"port":(%d+)')))

local sandbox = assert(sandkit.sandbox{ provider = "agent", url = "http://127.0.0.1:" .. port,
  token = token })
local session = assert(sandbox:create{ id = "example" })
print("agent boot " .. session.boot_id)
for frame in session:run({ "sh", "-c", "echo hello from the agent; exit 7" }, { timeout = 10 }) do
  if frame.type == "exit" then print("exit " .. frame.code) else io.write(frame.data) end
end

-- What the agent provider cannot do is refused before anything is sent.
local ok, err = session:terminate()
print(ok, err and err.code)

core.kill(pid, core.SIGTERM)
core.reap(pid, true)
core.remove_tree(root)
os.remove(token_file)
