-- deploy/kubernetes/ as it is shipped: the Role is enough for everything the provider does
-- over each transport (and holds nothing of pods/exec), and the template's agent command is a
-- real sandkit-agent invocation that answers its readiness probe and the tokens for its UID.

local cjson = require "cjson"
local core = require "sandkit.core"
local lyaml = require "lyaml"
local capability = require "sandkit.providers.kubernetes.capability"
local fake_http = require "support.fake_http"
local files = require "support.files"
local kube_cluster = require "support.kube_cluster"
local processes = require "support.processes"
local raw = require "support.raw_http"

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
  } do
    it("has a Role that allows all the provider does over transport " .. case.transport, function()
      local cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, faults = { allow = allowed(case.roles) } }
      local ok, err = pcall(function()
        local sb = assert(cluster:sandbox{ transport = case.transport })
        local session = assert(sb:create{ id = "rbac-" .. case.transport })
        assert(session:write_files{ ["/f"] = "x" })
        assert.equal("x", assert(session:read_file("/f")))
        assert.equal(0, assert(session:exec({ "true" }, { timeout = 10 })).code)
        assert.equal(1, #assert(sb:list()))
        assert.equal("running", assert(sb:get(session.id)).state)
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

  it("has an example that runs as documented, here against the fake cluster", function()
    local cluster = kube_cluster.start{ pools = { ["py-pool"] = {} } }
    local out = cluster.dir .. "/example.out"
    local ok, err = pcall(function()
      local pid = assert(core.spawn({ os.getenv("SANDKIT_TEST_LUA") or "lua5.4", "examples/kubernetes.lua",
        "py-pool", cluster.key_path, cluster.key_id, kube_cluster.NAMESPACE },
        { stdout = out, stderr = out, env = files.child_env{ KUBECONFIG = cluster:kubeconfig(),
          HOME = cluster.dir } }))
      if not processes.within(30, function() return core.reap(pid) end) then
        processes.stop(pid, 5)
        error("the example did not finish")
      end
      local said = files.read(out) or ""
      assert.matches("hello from sandkit\n[^\n]+\nexit\t3\n", said)
      assert.matches("state\trunning", said)
      assert.is_nil(next(cluster:state().objects.sandboxclaims[kube_cluster.NAMESPACE] or {}),
        "the example deleted its claim")
    end)
    cluster:stop()
    assert(ok, err)
  end)
end)
