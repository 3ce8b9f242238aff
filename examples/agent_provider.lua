--- The `agent` provider: talk to a sandkit-agent someone already runs, by URL and token.
-- This example starts one itself the way an image entrypoint would — the `sandkit-agent`
-- command with a token file — then uses it through the public API only.
--   lua5.4 examples/agent_provider.lua      (needs sandkit-agent on $PATH or $SANDKIT_AGENT)

local sandkit = require "sandkit"

local function sh_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- A private folder for the agent's root and its token: 32 random bytes, base64, mode 0600.
local dir = assert(io.popen("mktemp -d")):read("l")
local root, token_file = dir .. "/root", dir .. "/token"
assert(os.execute("mkdir " .. sh_quote(root) .. " && (umask 077 && head -c 32 /dev/urandom | base64 -w0 > "
  .. sh_quote(token_file) .. ")"))
local token = assert(io.open(token_file)):read("a")

-- Once it listens the agent writes one line, {"port":…,"pid":…,"bootId":…}, to its ready
-- descriptor; here that is the pipe this process reads.
local agent = os.getenv("SANDKIT_AGENT") or "sandkit-agent"
local ready = assert(io.popen("exec " .. sh_quote(agent) .. " --root " .. sh_quote(root)
  .. " --token-file " .. sh_quote(token_file) .. " --listen 127.0.0.1:0 --ready-fd 3 --log quiet"
  .. " 3>&1 >/dev/null"))
local line = assert(ready:read("l"), "sandkit-agent did not start")
local port = assert(tonumber(line:match('"port":(%d+)')))
local pid = assert(tonumber(line:match('"pid":(%d+)')))

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

-- SIGTERM: the agent stops its commands and leaves; closing the pipe waits for that.
os.execute("kill " .. pid)
ready:close()
os.execute("rm -rf " .. sh_quote(dir))
