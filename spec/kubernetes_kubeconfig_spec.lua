-- Where the kubernetes provider finds the API server and its credentials
-- (sandkit.providers.kubernetes.kubeconfig and .auth): kubeconfig files read with lyaml, the exec
-- plugins, token files and the in-cluster service account. No server is needed here; the
-- provider specs use the same files against the fake API server.

local cjson = require "cjson"
local core = require "sandkit.core"
local wait = require "sandkit.wait"
local auth = require "sandkit.providers.kubernetes.auth"
local kubeconfig = require "sandkit.providers.kubernetes.kubeconfig"
local files = require "support.files"
local local_state = require "support.local_state"
local processes = require "support.processes"
local tls = require "support.tls"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local PLUGIN = os.getenv("PWD") .. "/spec/support/kube_exec_plugin.sh"
local CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
local KEY = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n"

local temp_dir = files.temp_dir

--- A kubeconfig with one cluster, user and context; extra lines go into the cluster and the
-- user, and `user` replaces the user's body.
local function config_text(o)
  o = o or {}
  local lines = { "apiVersion: v1", "kind: Config", "clusters:", "- name: c1", "  cluster:",
    "    server: " .. (o.server or "https://127.0.0.1:6443"),
    "    certificate-authority-data: " .. core.b64encode(CA) }
  for _, l in ipairs(o.cluster or {}) do lines[#lines + 1] = "    " .. l end
  lines[#lines + 1] = "users:"
  lines[#lines + 1] = "- name: u1"
  lines[#lines + 1] = "  user:"
  for _, l in ipairs(o.user or { "token: tok-1" }) do lines[#lines + 1] = "    " .. l end
  lines[#lines + 1] = "contexts:"
  lines[#lines + 1] = "- name: ctx1"
  lines[#lines + 1] = "  context: {cluster: c1, user: u1, namespace: " .. (o.namespace or "team-a") .. "}"
  lines[#lines + 1] = "- name: ctx2"
  lines[#lines + 1] = "  context: {cluster: c1, user: u1}"
  if o.current ~= false then lines[#lines + 1] = "current-context: " .. (o.current or "ctx1") end
  return table.concat(lines, "\n") .. "\n"
end

describe("a kubeconfig", function()
  local dir
  before_each(function() dir = temp_dir() end)
  after_each(function() core.remove_tree(dir) end)

  local function load(o, opts)
    local path = dir .. "/config"
    files.write(path, config_text(o))
    opts = opts or {}
    opts.kubeconfig = path
    return kubeconfig.load(opts)
  end

  local function refusal(o, pattern, opts)
    local cfg, err = load(o, opts)
    assert.is_nil(cfg)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("kubeconfig", err.field)
    assert.matches(pattern, err.message)
  end

  it("gives the current context's server, CA, namespace and token", function()
    local cfg = assert(load())
    assert.equal("https://127.0.0.1:6443", cfg.server)
    assert.equal(CA, cfg.ca_pem)
    assert.equal("team-a", cfg.namespace)
    assert.same({ Authorization = "Bearer tok-1" }, assert(cfg.auth:fields("op")).headers)
    local other = assert(load(nil, { context = "ctx2" }))
    assert.is_nil(other.namespace, "a context without a namespace leaves the default to the provider")
  end)

  it("reads certificate-authority, client-certificate and client-key relative to its own directory", function()
    assert(core.mkdir(dir .. "/pki", 448))
    files.write(dir .. "/pki/ca.crt", CA)
    files.write(dir .. "/pki/me.crt", CA)
    files.write(dir .. "/pki/me.key", KEY)
    local cfg = assert(load{ cluster = { "certificate-authority: pki/ca.crt", "tls-server-name: api.example" },
      user = { "client-certificate: pki/me.crt", "client-key: pki/me.key" } })
    assert.equal(CA, cfg.ca_pem, "the -data form of the same field comes first")
    assert.equal("api.example", cfg.tls_server_name)
    local fields = assert(cfg.auth:fields("op"))
    assert.equal(CA, fields.client_cert_pem)
    assert.equal(KEY, fields.client_key_pem)
    assert.is_nil(fields.headers.Authorization)
  end)

  it("reads a certificate or key file up to the PEM text a transport takes, refusing a longer one by name", function()
    assert(core.mkdir(dir .. "/pki", 448))
    local limit = core.LIMITS.MAX_PEM
    files.write(dir .. "/pki/me.crt", CA)
    files.write(dir .. "/pki/me.key", KEY .. string.rep("\n", limit - #KEY))
    local user = { "client-certificate: pki/me.crt", "client-key: pki/me.key" }
    assert.equal(limit, #assert(assert(load{ user = user }).auth:fields("op")).client_key_pem)
    files.write(dir .. "/pki/me.key", KEY .. string.rep("\n", limit - #KEY + 1))
    refusal({ user = user }, "client%-key .*me%.key cannot be read: larger than " .. limit .. " bytes")
  end)

  it("reads a tokenFile again after a minute or a 401, and only a changed token makes a 401 worth a retry", function()
    files.write(dir .. "/token", "first\n")
    local cfg = assert(load{ user = { "tokenFile: token" } })
    assert.equal("Bearer first", cfg.auth:fields("op").headers.Authorization)
    files.write(dir .. "/token", "second\n")
    assert.equal("Bearer first", cfg.auth:fields("op").headers.Authorization, "read at most once a minute")
    assert.is_true(cfg.auth:refresh("op"))
    assert.equal("Bearer second", cfg.auth:fields("op").headers.Authorization)
    assert.is_false(cfg.auth:refresh("op"), "the same token again is no reason to retry")
    -- A minute on, it is read without a 401.
    files.write(dir .. "/token", "third\n")
    cfg.auth.file_read_at = cfg.auth.file_read_at - auth.TOKEN_FILE_INTERVAL
    assert.equal("Bearer third", cfg.auth:fields("op").headers.Authorization)
  end)

  for _, api in ipairs{ "v1", "v1beta1" } do
    it("runs a client.authentication.k8s.io/" .. api .. " exec plugin once, keeps its token, runs it again "
        .. "after a 401", function()
      local cfg = assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/" .. api,
        "  command: /bin/sh", "  args: [" .. PLUGIN .. "]", "  env:", "  - {name: FAKE_EXEC_DIR, value: " .. dir .. "}",
        "  provideClusterInfo: true", "  interactiveMode: Never" } })
      assert.equal("Bearer exec-token-1", assert(cfg.auth:fields("op")).headers.Authorization)
      assert.equal("Bearer exec-token-1", assert(cfg.auth:fields("op")).headers.Authorization)
      assert.equal("1", files.read(dir .. "/exec-runs"):match("%d+"))
      local info = cjson.decode(files.read(dir .. "/exec-info"))
      assert.equal("client.authentication.k8s.io/" .. api, info.apiVersion)
      assert.equal("ExecCredential", info.kind)
      assert.is_false(info.spec.interactive)
      assert.equal("https://127.0.0.1:6443", info.spec.cluster.server)
      assert.is_true(cfg.auth:refresh("op"))
      assert.equal("Bearer exec-token-2", assert(cfg.auth:fields("op")).headers.Authorization)
      assert.equal("2", files.read(dir .. "/exec-runs"):match("%d+"))
    end)
  end

  it("passes the cluster's client.authentication.k8s.io/exec extension as spec.cluster.config, "
      .. "with provideClusterInfo only", function()
    local exec = { "exec:", "  apiVersion: client.authentication.k8s.io/v1", "  command: /bin/sh",
      "  args: [" .. PLUGIN .. "]", "  env:", "  - {name: FAKE_EXEC_DIR, value: " .. dir .. "}",
      "  interactiveMode: Never" }
    local cluster = { "extensions:", "- name: client.authentication.k8s.io/exec",
      "  extension: {audience: sandkit, scopes: [a, b], nested: {depth: 2}}", "- name: someone-elses",
      "  extension: {ignored: true}" }
    local user = {}
    for i, line in ipairs(exec) do user[i] = line end
    user[#user + 1] = "  provideClusterInfo: true"
    assert(assert(load{ cluster = cluster, user = user }).auth:fields("op"))
    local info = cjson.decode(files.read(dir .. "/exec-info"))
    assert.same({ audience = "sandkit", scopes = { "a", "b" }, nested = { depth = 2 } }, info.spec.cluster.config)
    assert(assert(load{ cluster = cluster, user = exec }).auth:fields("op"))
    info = cjson.decode(files.read(dir .. "/exec-info"))
    assert.is_nil(info.spec.cluster, "without provideClusterInfo the plugin learns nothing of the cluster")
  end)

  it("runs an exec plugin whose command holds a '/' from the kubeconfig's directory, as client-go does", function()
    assert(core.mkdir(dir .. "/bin", 448))
    files.write(dir .. "/bin/auth-plugin", "#!/bin/sh\nexec /bin/sh " .. PLUGIN .. "\n")
    assert(files.execute("chmod 755 " .. files.shell_quote(dir .. "/bin/auth-plugin")))
    for _, command in ipairs{ "bin/auth-plugin", "./bin/auth-plugin", dir .. "/bin/auth-plugin" } do
      local cfg = assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/v1",
        "  command: " .. command, "  env:", "  - {name: FAKE_EXEC_DIR, value: " .. dir .. "}",
        "  interactiveMode: Never" } })
      local fields, err = cfg.auth:fields("op")
      assert(fields, command .. ": " .. tostring(err))
      assert.matches("^Bearer exec%-token%-%d+$", fields.headers.Authorization)
    end
    -- One without a '/' is a name looked up in PATH, never in the kubeconfig's directory.
    local _, err = assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/v1",
      "  command: auth-plugin", "  interactiveMode: Never" } }).auth:fields("op")
    assert.matches("status 127", err.message)
  end)

  local function json_text(pem) return (pem:gsub("\n", "\\n")) end
  for _, case in ipairs{
      { "a certificate without its key", '{"clientCertificateData":"' .. json_text(CA) .. '"}',
        "it has clientCertificateData without clientKeyData" },
      { "a key without its certificate", '{"token":"t","clientKeyData":"' .. json_text(KEY) .. '"}',
        "it has clientKeyData without clientCertificateData" } } do
    it("refuses an exec plugin's answer with " .. case[1] .. ", naming it", function()
      local cfg = assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/v1",
        "  command: /bin/sh", "  args: [" .. PLUGIN .. "]", "  interactiveMode: Never", "  env:",
        "  - {name: FAKE_EXEC_DIR, value: " .. dir .. "}",
        "  - {name: FAKE_EXEC_STATUS, value: '" .. case[2] .. "'}" } })
      local fields, err = cfg.auth:fields("op")
      assert.is_nil(fields)
      assert.equal("INVALID_INPUT", err.code)
      assert.matches(case[3], err.message, 1, true)
    end)
  end

  it("runs the plugin again once its credential's expirationTimestamp has passed", function()
    local cfg = assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/v1",
      "  command: /bin/sh", "  args: [" .. PLUGIN .. "]", "  interactiveMode: IfAvailable", "  env:",
      "  - {name: FAKE_EXEC_DIR, value: " .. dir .. "}",
      "  - {name: FAKE_EXEC_EXPIRES, value: '2020-01-01T00:00:00+02:00'}" } })
    assert.equal("Bearer exec-token-1", assert(cfg.auth:fields("op")).headers.Authorization)
    assert.equal("Bearer exec-token-2", assert(cfg.auth:fields("op")).headers.Authorization)
  end)

  it("reports a failing exec plugin with what it said, and one that is missing", function()
    local cfg = assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/v1",
      "  command: /bin/sh", "  args: [" .. PLUGIN .. "]", "  interactiveMode: Never", "  env:",
      "  - {name: FAKE_EXEC_DIR, value: " .. dir .. "}", "  - {name: FAKE_EXEC_FAIL, value: please log in}" } })
    local fields, err = cfg.auth:fields("op")
    assert.is_nil(fields)
    assert.matches("exec plugin /bin/sh failed: it exited with status 1; it said: please log in", err.message)
    cfg = assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/v1",
      "  command: /nonexistent/gke-gcloud-auth-plugin", "  interactiveMode: Never" } })
    fields, err = cfg.auth:fields("op")
    assert.is_nil(fields)
    assert.matches("status 127", err.message)
  end)

  it("bounds what an exec plugin may write and how long it may take", function()
    local function plugin(var, value)
      return assert(load{ user = { "exec:", "  apiVersion: client.authentication.k8s.io/v1",
        "  command: /bin/sh", "  args: [" .. PLUGIN .. "]", "  interactiveMode: Never", "  env:",
        "  - {name: FAKE_EXEC_DIR, value: " .. dir .. "}", "  - {name: " .. var .. ", value: '" .. value .. "'}" } })
    end
    local _, err = plugin("FAKE_EXEC_FLOOD", tostring(1024 * 1024 + 1)).auth:fields("op")
    assert.matches("it wrote more than an ExecCredential", err.message)
    -- At the bound exactly, what it wrote is read (and is no ExecCredential).
    _, err = plugin("FAKE_EXEC_FLOOD", tostring(1024 * 1024 - 2)).auth:fields("op")
    assert.matches("not an ExecCredential", err.message)
    local bound = auth.EXEC_TIMEOUT
    auth.EXEC_TIMEOUT = 0.3
    local started = wait.now()
    _, err = plugin("FAKE_EXEC_SLEEP", "10").auth:fields("op")
    auth.EXEC_TIMEOUT = bound
    assert.matches("it did not finish within 0.3s", err.message)
    assert.is_true(wait.now() - started < 5, "the plugin was stopped at the bound")
  end)

  it("refuses a token file that holds no token or more than one could be", function()
    files.write(dir .. "/token", string.rep("t", 64 * 1024 + 1))
    local _, err = assert(load{ user = { "tokenFile: token" } }).auth:fields("op")
    assert.matches("larger than a token", err.message)
    files.write(dir .. "/token", "two words\n")
    _, err = assert(load{ user = { "tokenFile: token" } }).auth:fields("op")
    assert.matches("holds no token", err.message)
  end)

  it("refuses what it would otherwise ignore, naming the field", function()
    refusal({ cluster = { "insecure-skip-tls-verify: true" } }, "clusters%[c1%]%.insecure%-skip%-tls%-verify")
    refusal({ cluster = { "proxy-url: http://proxy:3128" } }, "clusters%[c1%]%.proxy%-url")
    refusal({ user = { "auth-provider: {name: gcp}" } }, "users%[u1%]%.auth%-provider")
    refusal({ user = { "username: admin", "password: secret" } }, "users%[u1%]%.username")
    refusal({ user = { "token: t", "as: someone-else" } }, "users%[u1%]%.as ")
    refusal({ user = { "exec: {apiVersion: client.authentication.k8s.io/v1alpha1, command: x}" } },
      "exec%.apiVersion")
    refusal({ user = { "exec: {apiVersion: client.authentication.k8s.io/v1, command: x, interactiveMode: Always}" } },
      "interactiveMode is Always")
    refusal({ server = "http://api.example:8080" }, "plain http on another machine")
    refusal({ current = false }, "names no current%-context")
    refusal({}, "context nope is not in", { context = "nope" })
    -- None of them leaks the password it refused.
    local _, err = load{ user = { "username: admin", "password: hunter2" } }
    assert.is_nil(err.message:find("hunter2", 1, true))
  end)
end)

--- Runs kubeconfig.load in a fresh process with exactly `env`: what it found.
local function load_with_env(env, sa_dir)
  local dir = temp_dir()
  local script = dir .. "/load.lua"
  files.write(script, [[
    local cjson = require "cjson"
    local kubeconfig = require "sandkit.providers.kubernetes.kubeconfig"
    local cfg, err = kubeconfig.load{ service_account_dir = arg[1] ~= "" and arg[1] or nil }
    local out = { err = err and err.message }
    if cfg then
      out.server, out.namespace, out.source = cfg.server, cfg.namespace, cfg.source
      local fields, refused = cfg.auth:fields("op")
      out.token = fields and fields.headers.Authorization
      out.token_err = refused and refused.message
    end
    local f = io.open(arg[2], "w")
    f:write(cjson.encode(out))
    f:close()
  ]])
  local pid = assert(core.spawn({ LUA, script, sa_dir or "", dir .. "/out.json" },
    { env = files.child_env(env), stderr = dir .. "/err" }))
  local finished = processes.within(10, function() return core.reap(pid) end)
  if not finished then processes.stop(pid, 5) end
  local text, err = files.read(dir .. "/out.json"), files.read(dir .. "/err")
  core.remove_tree(dir)
  assert(finished, "the loader did not finish")
  assert(text, err)
  return cjson.decode(text)
end

describe("the kubeconfig search", function()
  local dir
  before_each(function() dir = temp_dir() end)
  after_each(function() core.remove_tree(dir) end)

  it("merges $KUBECONFIG's files: the first definition of a name and the first current-context win", function()
    files.write(dir .. "/a", config_text{ current = false, user = { "token: from-a" } })
    files.write(dir .. "/b", config_text{ current = "ctx1", namespace = "from-b", user = { "token: from-b" } })
    local out = load_with_env{ KUBECONFIG = dir .. "/missing:" .. dir .. "/a:" .. dir .. "/b", HOME = dir }
    assert.is_nil(out.err)
    assert.equal("Bearer from-a", out.token)
    assert.equal("team-a", out.namespace, "ctx1 as a defines it")
  end)

  it("falls back to ~/.kube/config, then to the pod's service account", function()
    assert(core.mkdir(dir .. "/.kube", 448))
    files.write(dir .. "/.kube/config", config_text{ user = { "token: from-home" } })
    local out = load_with_env{ HOME = dir }
    assert.equal("Bearer from-home", out.token)

    local sa = dir .. "/sa"
    assert(core.mkdir(sa, 448))
    files.write(sa .. "/token", "sa-token\n")
    files.write(sa .. "/ca.crt", CA)
    files.write(sa .. "/namespace", "pods-ns")
    out = load_with_env({ HOME = dir .. "/nowhere", KUBERNETES_SERVICE_HOST = "fd00::1",
      KUBERNETES_SERVICE_PORT = "443" }, sa)
    assert.is_nil(out.err)
    assert.equal("https://[fd00::1]:443", out.server)
    assert.equal("pods-ns", out.namespace)
    assert.equal("Bearer sa-token", out.token)

    out = load_with_env({ HOME = dir .. "/nowhere", KUBERNETES_SERVICE_HOST = "10.0.0.1",
      KUBERNETES_SERVICE_PORT = "443", POD_NAMESPACE = "from-the-downward-api" }, sa)
    assert.equal("from-the-downward-api", out.namespace, "POD_NAMESPACE comes before the namespace file")

    out = load_with_env({ HOME = dir .. "/nowhere" }, sa)
    assert.matches("no kubeconfig", out.err)
  end)

  it("fails a kubernetes sandbox's list at once, naming the type, when its tokenFile is a FIFO", function()
    -- The list runs in a process of its own that a bound kills: a read that blocks on the FIFO
    -- fails here (status 137) instead of hanging the suite.
    assert(files.execute("mkfifo " .. files.shell_quote(dir .. "/token-fifo")))
    files.write(dir .. "/config", config_text{ user = { "tokenFile: token-fifo" } })
    tls.run(dir, "openssl genpkey -algorithm ed25519 -out key.pem")
    local said, err, status = local_state.sh(local_state.lua_env() .. " timeout -s KILL 10 " .. LUA .. " -e "
      .. files.shell_quote(string.format([[
        local sandkit, wait = require "sandkit", require "sandkit.wait"
        local sb = assert(sandkit.sandbox{ provider = "kubernetes", warm_pool = "pool", key_id = "k1",
          signing_key = %q, kubeconfig = %q })
        local started = wait.now()
        local list, e = sb:list()
        io.write(string.format("%%s|%%.1f|%%s: %%s", tostring(list), wait.now() - started, e.code, e.message))]],
        dir .. "/key.pem", dir .. "/config")))
    assert.equal(0, status, err)
    local list, took, message = said:match("^(.-)|(.-)|(.*)$")
    assert.equal("nil", list)
    assert.is_true(tonumber(took) < 5, "the list took " .. took .. "s")
    assert.matches("^INVALID_INPUT: sandbox.list: the token file cannot be read: .*it is a FIFO, not a regular file",
      message)
  end)

  it("refuses a kubeconfig, token, certificate or key file that is no regular file, by its type, at once", function()
    -- A FIFO would block its reader for ever: each load runs in a process of its own that a
    -- bound kills, so a reader that blocks fails here instead of hanging the suite.
    local fifo = dir .. "/fifo"
    assert(files.execute("mkfifo " .. files.shell_quote(fifo)))
    local function config_at(name, o)
      files.write(dir .. "/" .. name, config_text(o))
      return dir .. "/" .. name
    end
    local cases = {
      { { KUBECONFIG = fifo, HOME = dir }, "err", "it is a FIFO, not a regular file" },
      { { KUBECONFIG = dir, HOME = dir }, "err", "it is a directory, not a regular file" },
      { { KUBECONFIG = config_at("token-fifo", { user = { "tokenFile: fifo" } }), HOME = dir },
        "token_err", "it is a FIFO, not a regular file" },
      { { KUBECONFIG = config_at("key-fifo", { user = { "client-certificate-data: " .. core.b64encode(CA),
        "client-key: fifo" } }), HOME = dir }, "err", "client%-key .-it is a FIFO, not a regular file" },
      { { KUBECONFIG = config_at("cert-device", { user = { "client-certificate: /dev/zero",
        "client-key-data: " .. core.b64encode(KEY) } }), HOME = dir }, "err", "it is a character device" },
    }
    for _, case in ipairs(cases) do
      local out = load_with_env(case[1])
      assert.matches(case[3], out[case[2]] or "", 1, false, cjson.encode(out))
    end
    -- ~/.kube/config that is a FIFO is there, refused, not passed over for the service account
    assert(core.mkdir(dir .. "/.kube", 448))
    assert(files.execute("mkfifo " .. files.shell_quote(dir .. "/.kube/config")))
    assert.matches("it is a FIFO", load_with_env{ HOME = dir }.err)
    -- and the service account's token that is one
    local sa = dir .. "/sa"
    assert(core.mkdir(sa, 448))
    assert(files.execute("mkfifo " .. files.shell_quote(sa .. "/token")))
    files.write(sa .. "/ca.crt", CA)
    local out = load_with_env({ HOME = dir .. "/nowhere", KUBERNETES_SERVICE_HOST = "10.0.0.1",
      KUBERNETES_SERVICE_PORT = "443" }, sa)
    assert.matches("it is a FIFO", out.token_err or "", 1, false, cjson.encode(out))
    -- and the provider's signing key
    local said, err, status = local_state.sh(local_state.lua_env() .. " timeout -s KILL 10 " .. LUA .. " -e "
      .. files.shell_quote(string.format([[local capability = require "sandkit.providers.kubernetes.capability"
        local _, e = capability.load_key(%q, "op")
        io.write(e.field, ": ", e.message)]], fifo)))
    assert.equal(0, status, err)
    assert.equal("signing_key: op: signing_key cannot be read: " .. fifo .. ": it is a FIFO, not a regular file", said)
  end)
end)
