-- deploy/ as it is shipped: the Role is enough for everything the provider does over each
-- transport (and holds nothing of pods/exec); the template's agent command is a real
-- sandkit-agent invocation that answers its readiness probe and the tokens for its UID; the
-- NetworkPolicy's peers admit the router where agent-sandbox runs it and the client Deployment,
-- and no one else; and the key ring and signing key reach the pods as documented. The agent
-- image's Containerfile is spec/agent_containerfile_spec.lua's.

local cjson = require "cjson"
local core = require "sandkit.core"
local lyaml = require "lyaml"
local capability = require "sandkit.providers.kubernetes.capability"
local fake_http = require "support.fake_http"
local files = require "support.files"
local kube_cluster = require "support.kube_cluster"
local processes = require "support.processes"
local raw = require "support.raw_http"
local tls = require "support.tls"

local function manifests(name)
  return lyaml.load(assert(files.read("deploy/kubernetes/" .. name)), { all = true })
end

--- The "verb resource" pairs the Roles named allow.
local function allowed(roles)
  local set = {}
  for _, doc in ipairs(manifests("rbac.yaml")) do
    if doc.kind == "Role" and roles[doc.metadata.name] then
      for _, rule in ipairs(doc.rules) do
        for _, resource in ipairs(rule.resources) do
          for _, verb in ipairs(rule.verbs) do set[verb .. " " .. resource] = true end
        end
      end
    end
  end
  return set
end

--- Where agent-sandbox runs its router: the namespace its manifests install to, and the label
-- its own default NetworkPolicy admits the router by (extensions/controllers/
-- sandboxtemplate_controller.go, buildDefaultNetworkPolicySpec, v0.5).
local ROUTER = { namespace = "agent-sandbox-system", labels = { app = "sandbox-router" } }
local AGENT_PORT = 8971

--- Whether a label selector ({ matchLabels, matchExpressions }) selects `labels`; an empty
-- one selects everything, as Kubernetes reads it.
local function selects(selector, labels)
  for k, v in pairs(selector.matchLabels or {}) do
    if labels[k] ~= v then return false end
  end
  for _, e in ipairs(selector.matchExpressions or {}) do
    local have, listed = labels[e.key], {}
    for _, v in ipairs(e.values or {}) do listed[v] = true end
    if (e.operator == "In" and not listed[have]) or (e.operator == "NotIn" and listed[have])
        or (e.operator == "Exists" and have == nil) or (e.operator == "DoesNotExist" and have ~= nil) then
      return false
    end
  end
  return true
end

local function ipv4(text)
  local a, b, c, d = text:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  return a and ((tonumber(a) * 256 + tonumber(b)) * 256 + tonumber(c)) * 256 + tonumber(d)
end

local function in_cidr(ip, cidr)
  local base, bits = cidr:match("^(.+)/(%d+)$")
  local n, b = ipv4(ip), base and ipv4(base)
  if not n or not b then return false end
  local size = 2 ^ (32 - tonumber(bits))
  return math.floor(n / size) == math.floor(b / size)
end

--- Whether one NetworkPolicy peer admits `source`: { ip } or { namespace, labels } (a pod;
-- its namespace carries the kubernetes.io/metadata.name label Kubernetes sets on every one),
-- for a policy of namespace `ns`. A pod selector alone means pods of the policy's namespace.
local function peer_admits(peer, source, ns)
  if peer.ipBlock then
    if not source.ip or not in_cidr(source.ip, peer.ipBlock.cidr) then return false end
    for _, except in ipairs(peer.ipBlock.except or {}) do
      if in_cidr(source.ip, except) then return false end
    end
    return true
  end
  if not source.namespace then return false end
  if peer.namespaceSelector then
    if not selects(peer.namespaceSelector, { ["kubernetes.io/metadata.name"] = source.namespace }) then
      return false
    end
  elseif source.namespace ~= ns then
    return false
  end
  return peer.podSelector == nil or selects(peer.podSelector, source.labels or {})
end

--- Whether ingress rules of a policy of namespace `ns` admit `source` to `port` (TCP).
local function admits(rules, source, port, ns)
  for _, rule in ipairs(rules or {}) do
    local port_ok = rule.ports == nil
    for _, p in ipairs(rule.ports or {}) do
      if (p.protocol or "TCP") == "TCP" and p.port == port then port_ok = true end
    end
    local from_ok = rule.from == nil
    for _, peer in ipairs(rule.from or {}) do
      if peer_admits(peer, source, ns) then from_ok = true end
    end
    if port_ok and from_ok then return true end
  end
  return false
end

describe("deploy/kubernetes's NetworkPolicies", function()
  local template = manifests("sandbox-template.yaml")[1]
  local ns = template.metadata.namespace
  local rules = template.spec.networkPolicy.ingress
  local client = manifests("client-deployment.yaml")[1]
  local client_pod = { namespace = client.metadata.namespace, labels = client.spec.template.metadata.labels }

  it("admit agent-sandbox's router where it runs and the client Deployment's pods, on the agent's port", function()
    assert.is_true(admits(rules, ROUTER, AGENT_PORT, ns), "the router")
    assert.is_true(admits(rules, client_pod, AGENT_PORT, ns), "the client Deployment")
    assert.is_false(admits(rules, ROUTER, 22, ns))
    assert.is_false(admits(rules, client_pod, 22, ns))
  end)

  it("admit no one else: a pod labelled as the router elsewhere, another pod of the namespace, the API server",
      function()
    assert.is_false(admits(rules, { namespace = ns, labels = ROUTER.labels }, AGENT_PORT, ns))
    assert.is_false(admits(rules, { namespace = "tenant", labels = ROUTER.labels }, AGENT_PORT, ns))
    assert.is_false(admits(rules, { namespace = ROUTER.namespace, labels = { app = "anything-else" } },
      AGENT_PORT, ns))
    assert.is_false(admits(rules, { namespace = ns, labels = { ["app.kubernetes.io/name"] = "sandkit-sandbox" } },
      AGENT_PORT, ns), "a sandbox reaching its neighbours")
    assert.is_false(admits(rules, { namespace = "elsewhere", labels = client_pod.labels }, AGENT_PORT, ns))
    assert.is_false(admits(rules, { ip = "10.0.0.7" }, AGENT_PORT, ns))
  end)

  it("admit the API server's pods proxy with sandbox-apiserver-ingress.yaml, once its addresses are given", function()
    local text = assert(files.read("deploy/kubernetes/sandbox-apiserver-ingress.yaml"))
    assert.truthy(text:find("cidr: REPLACE-WITH-CONTROL-PLANE-CIDR", 1, true), "unfilled, it cannot apply")
    local policy = lyaml.load((text:gsub("REPLACE%-WITH%-CONTROL%-PLANE%-CIDR", "10.0.0.0/24")))
    assert.equal(ns, policy.metadata.namespace)
    assert.is_true(selects(policy.spec.podSelector, template.spec.podTemplate.metadata.labels),
      "it selects the template's pods")
    assert.is_true(admits(policy.spec.ingress, { ip = "10.0.0.7" }, AGENT_PORT, ns))
    assert.is_false(admits(policy.spec.ingress, { ip = "10.0.1.7" }, AGENT_PORT, ns))
    assert.is_false(admits(policy.spec.ingress, { ip = "10.0.0.7" }, 22, ns))
    assert.is_false(admits(policy.spec.ingress, client_pod, AGENT_PORT, ns))
  end)

  it("name the port the agent listens on and its probe asks", function()
    local container = template.spec.podTemplate.spec.containers[1]
    local listen
    for i, a in ipairs(container.args) do if container.args[i - 1] == "--listen" then listen = a end end
    assert.equal("0.0.0.0:" .. AGENT_PORT, listen)
    assert.equal(AGENT_PORT, container.readinessProbe.httpGet.port)
  end)
end)

describe("deploy/kubernetes's client and keys", function()
  it("run the client Deployment as the ServiceAccount the Role is bound to, its signing key from a Secret",
      function()
    local client = manifests("client-deployment.yaml")[1]
    local pod = client.spec.template.spec
    local bound = {}
    for _, doc in ipairs(manifests("rbac.yaml")) do
      if doc.kind == "RoleBinding" and doc.roleRef.name == "sandkit-client" then
        for _, subject in ipairs(doc.subjects) do bound[subject.name .. "/" .. subject.namespace] = true end
      end
    end
    assert.is_true(bound[pod.serviceAccountName .. "/" .. client.metadata.namespace])
    assert.same(client.spec.selector.matchLabels, client.spec.template.metadata.labels)
    local volume = pod.volumes[1]
    assert.equal("sandkit-signing-key", volume.secret.secretName)
    local mount = pod.containers[1].volumeMounts[1]
    assert.equal(volume.name, mount.name)
    assert.is_true(mount.readOnly)
  end)

  it("give the sandbox pods the key ring from the ConfigMap the template names", function()
    local keys = manifests("agent-keys.yaml")[1]
    local template = manifests("sandbox-template.yaml")[1]
    assert.equal("ConfigMap", keys.kind)
    assert.is_true(keys.immutable, "a rotation is a new ConfigMap, which the warm pool rolls out")
    assert.equal(template.metadata.namespace, keys.metadata.namespace)
    local ring
    for _, e in ipairs(template.spec.podTemplate.spec.containers[1].env) do
      if e.name == "SANDKIT_AGENT_PUBLIC_KEYS" then ring = e.valueFrom.configMapKeyRef end
    end
    assert.equal(keys.metadata.name, ring.name)
    assert.is_string(keys.data[ring.key])
  end)

  it("let a rotation keep both keys live: sessions signed with either key serve while the ring holds both", function()
    local dir = files.temp_dir()
    tls.run(dir, "openssl genpkey -algorithm ed25519 -out k2.pem")
    local cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, extra_keys = { { "k2", dir .. "/k2.pem" } } }
    local ok, err = pcall(function()
      for _, key in ipairs{ { cluster.key_path, cluster.key_id }, { dir .. "/k2.pem", "k2" } } do
        local sb = assert(cluster:sandbox{ signing_key = key[1], key_id = key[2] })
        local session = assert(sb:create{})
        assert.equal("signed\n", assert(session:exec({ "echo", "signed" }, { timeout = 10 })).stdout)
        assert(session:terminate())
      end
    end)
    cluster:stop()
    core.remove_tree(dir)
    assert(ok, err)
  end)
end)

describe("deploy/kubernetes", function()
  it("grants no pods/exec, secrets or wildcards", function()
    for _, doc in ipairs(manifests("rbac.yaml")) do
      for _, rule in ipairs(doc.rules or {}) do
        for _, list in ipairs{ rule.resources, rule.verbs, rule.apiGroups } do
          for _, v in ipairs(list) do
            assert.is_nil(v:find("exec", 1, true), v)
            assert.is_nil(v:find("secret", 1, true), v)
            assert.are_not.equal("*", v)
          end
        end
      end
    end
  end)

  for _, case in ipairs{
    { transport = "direct", roles = { ["sandkit-client"] = true } },
    { transport = "apiserver", roles = { ["sandkit-client"] = true, ["sandkit-client-pods-proxy"] = true } },
    { transport = "direct", roles = { ["sandkit-client"] = true, ["sandkit-client-pause"] = true }, pause = true },
  } do
    it("has a Role that allows all the provider does over transport " .. case.transport
        .. (case.pause and ", pause and resume included" or ""), function()
      local cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, faults = { allow = allowed(case.roles) } }
      local ok, err = pcall(function()
        local sb = assert(cluster:sandbox{ transport = case.transport })
        local session = assert(sb:create{ id = "rbac-" .. case.transport })
        assert(session:write_files{ ["/f"] = "x" })
        assert.equal("x", assert(session:read_file("/f")))
        assert.equal(0, assert(session:exec({ "true" }, { timeout = 10 })).code)
        assert.equal(1, #assert(sb:list()))
        assert.equal("running", assert(sb:get(session.id)).state)
        if case.pause then
          assert(session:pause())
          assert(session:resume())
          assert.equal(0, assert(session:exec({ "true" }, { timeout = 10 })).code)
        end
        assert(sb:terminate(session.id))
      end)
      cluster:stop()
      assert(ok, err)
    end)
  end

  it("needs the pods/proxy Role for transport apiserver: without it the fake's RBAC refuses", function()
    local cluster = kube_cluster.start{ pools = { ["py-pool"] = {} },
      faults = { allow = allowed{ ["sandkit-client"] = true } } }
    local ok, err = pcall(function()
      local sb = assert(cluster:sandbox{ transport = "apiserver", ready_timeout = 2 })
      local _, cerr = sb:create{ id = "no-proxy" }
      assert.matches('with subresource \\"proxy\\"', cerr.message, 1, true)
    end)
    cluster:stop()
    assert(ok, err)
  end)

  it("runs the template's agent command as a pod would: capability mode, the pod's UID, its probe", function()
    local template = manifests("sandbox-template.yaml")[1]
    local pool = manifests("sandbox-warmpool.yaml")[1]
    assert.equal(template.metadata.name, pool.spec.sandboxTemplateRef.name)
    local pod = template.spec.podTemplate.spec
    assert.is_false(pod.automountServiceAccountToken)
    assert.truthy(template.spec.networkPolicy.ingress)
    local container = pod.containers[1]
    local env = {}
    for _, e in ipairs(container.env) do env[e.name] = e end
    assert.equal("metadata.uid", env.SANDKIT_AGENT_SESSION_ID.valueFrom.fieldRef.fieldPath)
    assert.truthy(env.SANDKIT_AGENT_PUBLIC_KEYS)

    -- The same arguments, with a root and an address of this machine.
    local dir = files.temp_dir()
    local argv = { os.getenv("SANDKIT_AGENT") }
    local args = container.args
    for i = 1, #args do
      local a = args[i]
      if args[i - 1] == "--root" then a = dir end
      if args[i - 1] == "--listen" then a = "127.0.0.1:0" end
      argv[#argv + 1] = a
    end
    argv[#argv + 1] = "--ready-fd"
    argv[#argv + 1] = "3"
    local seed = core.random(32)
    local key = assert(core.ed25519_key("-----BEGIN PRIVATE KEY-----\n" .. core.b64encode(
      "\48\46\2\1\0\48\5\6\3\43\101\112\4\34\4\32" .. seed) .. "\n-----END PRIVATE KEY-----\n"))
    local uid = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
    local pid, reader = assert(core.spawn(argv, { ready_fd = 3, stderr = dir .. ".log", env = {
      PATH = os.getenv("PATH"), SANDKIT_AGENT_SESSION_ID = uid,
      SANDKIT_AGENT_PUBLIC_KEYS = "k1:" .. core.b64encode(key:public()) } }))
    local line = fake_http.read_line(reader, 10)
    reader:close()
    local ok, err = pcall(function()
      assert(line, files.read(dir .. ".log"))
      local port = math.floor(cjson.decode(line).port)
      local probe = container.readinessProbe.httpGet
      assert.equal(8971, probe.port)
      local health = assert(raw.request(port, "GET", probe.path))
      assert.equal(200, health.status)
      local minter = capability.minter{ key = key, key_id = "k1" }
      local res = assert(raw.request(port, "POST", "/v1/mkdir", { body = '{"path":"/x"}',
        headers = { Authorization = "Bearer " .. minter:token(uid) } }))
      assert.equal(204, res.status)
      res = assert(raw.request(port, "POST", "/v1/mkdir", { body = '{"path":"/y"}',
        headers = { Authorization = "Bearer " .. minter:token("another-pods-uid") } }))
      assert.equal(403, res.status)
    end)
    processes.stop(pid, 5)
    core.remove_tree(dir)
    os.remove(dir .. ".log")
    assert(ok, err)
  end)

  it("has an example that runs as documented against the fake cluster, with the one command docs/kubernetes.md gives",
      function()
    local dir = files.temp_dir()
    local out = dir .. "/example.out"
    local lua = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
    local ok, err = pcall(function()
      -- core.spawn takes a path, not a name to look up.
      local which = assert(io.popen("command -v " .. files.shell_quote(lua)))
      local lua_path = which:read("*l")
      which:close()
      local pid = assert(core.spawn({ lua_path, "tools/fake_cluster.lua",
        lua, "examples/kubernetes.lua", "@pool@", "@key@", "@key_id@", "@namespace@" },
        { stdout = out, stderr = out, env = files.child_env{ SANDKIT_AGENT = os.getenv("SANDKIT_AGENT"),
          SANDKIT_TEST_LUA = lua } }))
      local status
      if not processes.within(60, function()
        local gone, code = core.reap(pid)
        status = code
        return gone
      end) then
        processes.stop(pid, 5)
        error("the example did not finish")
      end
      local said = files.read(out) or ""
      assert.equal(0, status, said)
      assert.matches("hello from sandkit\n[^\n]+\nexit\t3\n", said)
      assert.matches("state\trunning", said)
    end)
    core.remove_tree(dir)
    assert(ok, err)
  end)
end)
