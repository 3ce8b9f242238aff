--- Runs a command against the specs' fake Kubernetes cluster (spec/support/kube_cluster.lua)
-- instead of a real one: an API server over TLS with agent-sandbox's resources, its controller
-- with a warm pool `sandkit-pool` in namespace `sandkit` whose pods are real sandkit-agents,
-- and its router. The command runs with KUBECONFIG naming the cluster, and in its arguments
-- @pool@, @key@, @key_id@, @namespace@ and @router@ stand for the warm pool, the signing key's
-- path, its id, the namespace and the router's URL. The cluster stops when the command ends,
-- and the command's status is this one's.
--
--   make kube-example          (runs examples/kubernetes.lua through it)
--   SANDKIT_AGENT=build/sandkit-agent LUA_PATH='./lua/?.lua;./lua/?/init.lua;./spec/?.lua;;' \
--     LUA_CPATH='./build/lua5.4/?.so;;' lua5.4 tools/fake_cluster.lua lua5.4 my_script.lua @key@

local files = require "support.files"
local kube_cluster = require "support.kube_cluster"

if #arg == 0 then
  io.stderr:write("usage: lua5.4 tools/fake_cluster.lua COMMAND [ARG...]  (@pool@ @key@ @key_id@ "
    .. "@namespace@ @router@ are replaced)\n")
  os.exit(2)
end

local POOL, NAMESPACE = "sandkit-pool", "sandkit"
local cluster = kube_cluster.start{ pools = { [POOL] = {} }, namespace = NAMESPACE }
local ok, status = pcall(function()
  local values = { pool = POOL, key = cluster.key_path, key_id = cluster.key_id, namespace = NAMESPACE,
    router = cluster.router_url }
  local words = {}
  for k, v in pairs{ KUBECONFIG = cluster:kubeconfig(), HOME = cluster.dir } do
    words[#words + 1] = k .. "=" .. files.shell_quote(v)
  end
  for _, a in ipairs(arg) do
    words[#words + 1] = files.shell_quote((a:gsub("@([%w_]+)@", function(name) return values[name] end)))
  end
  -- Through the shell, which finds the command in PATH and leaves it this process's output.
  local done, how, code = os.execute("env " .. table.concat(words, " "))
  if type(done) == "number" then return math.floor(done / 256) end
  return how == "exit" and code or 128 + code
end)
cluster:stop()
if not ok then
  io.stderr:write(tostring(status), "\n")
  os.exit(1)
end
os.exit(status)
