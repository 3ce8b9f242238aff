--- The `kubernetes` provider: a session claimed from an agent-sandbox warm pool, a command
-- streamed from its pod, a file moved in and out, and the claim deleted again.
--   lua5.4 examples/kubernetes.lua WARM_POOL SIGNING_KEY.pem KEY_ID [NAMESPACE [TRANSPORT]]
-- with a kubeconfig as kubectl would find it (or in a pod, its service account), and the
-- manifests of deploy/kubernetes applied (docs/kubernetes.md).

local sandkit = require "sandkit"

local pool, key, key_id, namespace, transport = arg[1], arg[2], arg[3], arg[4], arg[5]
if not (pool and key and key_id) then
  io.stderr:write("usage: lua5.4 examples/kubernetes.lua WARM_POOL SIGNING_KEY.pem KEY_ID "
    .. "[NAMESPACE [TRANSPORT]]\n")
  os.exit(2)
end

local sandbox = assert(sandkit.sandbox{ provider = "kubernetes", warm_pool = pool,
  signing_key = key, key_id = key_id, namespace = namespace, transport = transport or "direct",
  lifetime = 600 })
local session = assert(sandbox:create{})
print("session " .. session.id)

assert(session:write_files{ ["/work/hello.txt"] = "hello from sandkit\n" })
for frame in session:run({ "sh", "-c", "cat work/hello.txt; hostname; exit 3" }, { timeout = 30 }) do
  if frame.type == "exit" then print("exit", frame.code) else io.write(frame.data) end
end
print(assert(session:read_file("/work/hello.txt")))

-- Any process with the same options reaches it by id: nothing is kept on this machine.
local again = assert(sandbox:get(session.id))
print("state", again.state)
assert(session:terminate())
