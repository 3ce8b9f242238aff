--- A Kubernetes cluster for specs, without a cluster: the fake API server and controller of
-- spec/support/kube_api.lua (a fake_http_server process whose pods are real sandkit-agents)
-- behind a real nginx that terminates TLS with a test CA, verifies client certificates when
-- one is offered (mTLS) and passes the verdict on.
--
--   local cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, faults = {…},
--                                       tokens = nil, namespace = "sandkit-test",
--                                       api_versions, router_read_timeout, terminating_seconds }
--                                       (spec/support/kube_api.lua and kube_controller.lua)
--   cluster.server            -- "https://127.0.0.1:<port>" (TLS, certificate for 127.0.0.1)
--   cluster.router_url        -- the fake router: agent-sandbox's X-Sandbox-* headers
--   cluster:kubeconfig{ user = "token" | "token_file" | "cert_data" | "cert_file" | "exec",
--                       exec_api = "v1", exec_env = { NAME = value }, tls_server_name = false,
--                       namespace = nil }  -- a path (namespace = false: the context names none)
--   cluster:sandbox{ … }      -- sandkit.sandbox{ provider = "kubernetes", … } on this cluster
--   cluster:control(path, body), cluster:state(), cluster:requests(), cluster:log_entries()
--   cluster:stop()            -- stops every agent, the fake and nginx
--
-- The front also serves the name api.sandkit.test (SNI) with a certificate for that name
-- only, so a client reaches it at 127.0.0.1 only when its TLS server name really changed.

local cjson = require "cjson"
local core = require "sandkit.core"
local sandkit = require "sandkit"
local fake_http = require "support.fake_http"
local files = require "support.files"
local nginx = require "support.nginx"
local tls = require "support.tls"
local raw_http = require "support.raw_http"

local kube_cluster = {}

kube_cluster.NAMESPACE = "sandkit-test"
kube_cluster.TOKEN = "admin-token"
kube_cluster.KEY_ID = "k1"
kube_cluster.SERVER_NAME = "api.sandkit.test"
kube_cluster.CLIENT_CN = "sandkit-admin"

local cluster_mt = {}
cluster_mt.__index = cluster_mt

local function front_conf(c, port)
  return table.concat({
    nginx.conf_head(c.dir, 256),
    "  access_log off;",
    -- One server, its certificate picked by SNI: a second server block would answer 421 to a
    -- client whose Host names the address and whose SNI the name, as client-go's do.
    "  map $ssl_server_name $fake_cert {",
    "    " .. kube_cluster.SERVER_NAME .. " named;",
    "    default server;",
    "  }",
    "  server {",
    "    listen 127.0.0.1:" .. port .. " ssl;",
    "    ssl_certificate " .. c.dir .. "/$fake_cert.crt;",
    "    ssl_certificate_key " .. c.dir .. "/$fake_cert.key;",
    "    ssl_client_certificate " .. c.dir .. "/ca.crt;",
    "    ssl_verify_client optional;",
    "    location / {",
    "      proxy_pass http://127.0.0.1:" .. c.backend.port .. ";",
    "      proxy_http_version 1.1;",
    '      proxy_set_header Connection "";',
    "      proxy_set_header X-Fake-Client-Verify $ssl_client_verify;",
    "      proxy_set_header X-Fake-Client-Subject $ssl_client_s_dn;",
    "      proxy_set_header X-Fake-Sni $ssl_server_name;",
    "      proxy_set_header X-Fake-Host $http_host;",
    "      proxy_buffering off;",
    "      proxy_request_buffering off;",
    "      proxy_read_timeout 600s;",
    "      client_max_body_size 64m;",
    "    }",
    "  }",
    "}",
  }, "\n") .. "\n"
end

--- The raw public key in the agents' --public-keys form, from a PEM private key file.
local function ring_entry(kid, path)
  local key = assert(core.ed25519_key(assert(files.read(path))))
  return kid .. ":" .. core.b64encode(key:public())
end

-- The files of a cluster's certificates and signing key, made with the openssl command for the
-- first cluster of a spec file and written afresh into each later one's folder: a spec that
-- starts a cluster per case would otherwise spend most of each start in openssl.
local MATERIAL = { "ca.crt", "ca.key", "server.crt", "server.key", "named.crt", "named.key", "client.crt",
  "client.key", "stranger.crt", "stranger.key", "other-ca.crt", "other-ca.key", "signing.pem" }
local material

local function write_material(dir)
  -- nginx loads an SNI-picked certificate in its worker, which runs as nobody under root: the
  -- keys openssl made private, and files.write's that the umask may have made so, become 0644.
  local readable = { "server.key", "named.key" }
  if material then
    for name, text in pairs(material) do files.write(dir .. "/" .. name, text) end
    if not files.umask_keeps(tonumber("644", 8)) then tls.run(dir, "chmod 644 " .. table.concat(readable, " ")) end
  else
    local ca = tls.ca(dir, "ca")
    tls.issue(dir, ca, "server", { "IP:127.0.0.1", "DNS:localhost" })
    tls.issue(dir, ca, "named", { "DNS:" .. kube_cluster.SERVER_NAME })
    tls.issue(dir, ca, "client", nil, "client", "/O=system:masters/CN=" .. kube_cluster.CLIENT_CN)
    tls.issue(dir, ca, "stranger", nil, "client")
    tls.ca(dir, "other-ca")
    tls.run(dir, "openssl genpkey -algorithm ed25519 -out signing.pem")
    local made = {}
    for _, name in ipairs(MATERIAL) do made[name] = assert(files.read(dir .. "/" .. name), name) end
    material = made
    tls.run(dir, "chmod 644 " .. table.concat(readable, " "))
  end
end

function kube_cluster.start(opts)
  opts = opts or {}
  tls.require_openssl()
  local agent = os.getenv("SANDKIT_AGENT")
  assert(agent and agent ~= "", "the kubernetes specs need SANDKIT_AGENT=<path to sandkit-agent>")
  -- nginx's workers run as nobody when the spec runs as root, and read the certificates.
  local c = setmetatable({ dir = nginx.temp_dir(), namespace = opts.namespace or kube_cluster.NAMESPACE },
    cluster_mt)
  local ok, err = pcall(function()
    write_material(c.dir)
    c.ca_file = c.dir .. "/ca.crt"
    c.ca_pem = files.read(c.ca_file)
    c.key_path = c.dir .. "/signing.pem"
    c.key_id = kube_cluster.KEY_ID
    local keys = { ring_entry(c.key_id, c.key_path) }
    for _, extra in ipairs(opts.extra_keys or {}) do keys[#keys + 1] = ring_entry(extra[1], extra[2]) end
    -- The pods' agents keep their folders in the cluster's, which goes with the spec's process
    -- whatever the fake managed to stop.
    assert(core.mkdir(c.dir .. "/pods", 448))
    local config = { agent = agent, pods_dir = c.dir .. "/pods", public_keys = table.concat(keys, ","),
      pools = opts.pools or {},
      faults = opts.faults or {}, tokens = opts.tokens or { [kube_cluster.TOKEN] = "admin" },
      client_cns = { [kube_cluster.CLIENT_CN] = true }, router_token = opts.router_token,
      claims = opts.claims, namespace = c.namespace, api_versions = opts.api_versions,
      router_read_timeout = opts.router_read_timeout, terminating_seconds = opts.terminating_seconds }
    local encoded = cjson.encode(config)
    assert(not encoded:find("]==]", 1, true), "the config cannot be embedded")
    c.backend = fake_http.start("local cjson = require 'cjson'\n"
      .. "local config = cjson.decode([==[" .. encoded .. "]==])\n"
      .. "return require('support.kube_api').scenario(config)\n")
    c.router_url = c.backend.url
    c.front_pid, c.port = nginx.launch(c.dir, function(port) return front_conf(c, port) end)
    c.server = "https://127.0.0.1:" .. c.port
  end)
  if not ok then
    c:stop()
    error(err, 0)
  end
  return c
end

local function b64file(path)
  return core.b64encode(assert(files.read(path)))
end

--- Writes a kubeconfig for this cluster and returns its path. opts.user picks how the client
-- authenticates; the exec plugin is spec/support/kube_exec_plugin.sh, counting its runs in
-- <dir>/exec-runs, with opts.exec_env in its environment (its FAKE_EXEC_* switches).
function cluster_mt:kubeconfig(opts)
  opts = opts or {}
  local user = opts.user or "token"
  local name = opts.name or ("kubeconfig-" .. user .. (opts.tls_server_name and "-named" or ""))
  local path = self.dir .. "/" .. name
  local lines = { "apiVersion: v1", "kind: Config", "clusters:", "- name: fake", "  cluster:",
    "    server: " .. self.server }
  if opts.ca_path then
    lines[#lines + 1] = "    certificate-authority: " .. opts.ca_path
  else
    lines[#lines + 1] = "    certificate-authority-data: " .. b64file(self.dir .. "/" .. (opts.ca or "ca") .. ".crt")
  end
  if opts.tls_server_name then lines[#lines + 1] = "    tls-server-name: " .. kube_cluster.SERVER_NAME end
  for _, extra in ipairs(opts.cluster_extra or {}) do lines[#lines + 1] = "    " .. extra end
  lines[#lines + 1] = "users:"
  lines[#lines + 1] = "- name: me"
  lines[#lines + 1] = "  user:"
  if user == "token" then
    lines[#lines + 1] = "    token: " .. (opts.token or kube_cluster.TOKEN)
  elseif user == "token_file" then
    lines[#lines + 1] = "    tokenFile: " .. (opts.token_file or "token")
  elseif user == "cert_data" then
    lines[#lines + 1] = "    client-certificate-data: " .. b64file(self.dir .. "/" .. (opts.cert or "client") .. ".crt")
    lines[#lines + 1] = "    client-key-data: " .. b64file(self.dir .. "/" .. (opts.cert or "client") .. ".key")
  elseif user == "cert_file" then
    -- Relative paths: the client resolves them against the kubeconfig's own directory.
    lines[#lines + 1] = "    client-certificate: client.crt"
    lines[#lines + 1] = "    client-key: client.key"
  elseif user == "exec" then
    lines[#lines + 1] = "    exec:"
    lines[#lines + 1] = "      apiVersion: client.authentication.k8s.io/" .. (opts.exec_api or "v1")
    lines[#lines + 1] = "      command: /bin/sh"
    lines[#lines + 1] = "      args:"
    lines[#lines + 1] = "      - " .. os.getenv("PWD") .. "/spec/support/kube_exec_plugin.sh"
    lines[#lines + 1] = "      env:"
    lines[#lines + 1] = "      - name: FAKE_EXEC_DIR"
    lines[#lines + 1] = "        value: " .. self.dir
    for variable, value in pairs(opts.exec_env or {}) do
      lines[#lines + 1] = "      - name: " .. variable
      lines[#lines + 1] = "        value: " .. value
    end
    lines[#lines + 1] = "      interactiveMode: Never"
  end
  for _, extra in ipairs(opts.user_extra or {}) do lines[#lines + 1] = "    " .. extra end
  lines[#lines + 1] = "contexts:"
  lines[#lines + 1] = "- name: fake"
  lines[#lines + 1] = "  context:"
  lines[#lines + 1] = "    cluster: fake"
  lines[#lines + 1] = "    user: me"
  if opts.namespace ~= false then
    lines[#lines + 1] = "    namespace: " .. (opts.namespace or self.namespace)
  end
  lines[#lines + 1] = "current-context: fake"
  files.write(path, table.concat(lines, "\n") .. "\n")
  return path
end

--- A kubernetes sandbox on this cluster; options override the defaults.
function cluster_mt:sandbox(options)
  local o = { provider = "kubernetes", warm_pool = "py-pool", signing_key = self.key_path,
    key_id = self.key_id, header_timeout = 10, ready_timeout = 20, ready_interval = 0.05 }
  if not (options and options.kubeconfig) then o.kubeconfig = self:kubeconfig() end
  for k, v in pairs(options or {}) do o[k] = v end
  return sandkit.sandbox(o)
end

--- A control request to the fake (no TLS, no authentication): the decoded answer.
function cluster_mt:control(path, body)
  body = body or {}
  body.namespace = body.namespace or self.namespace
  local resp = assert(raw_http.request(self.backend.port, "POST", path,
    { body = cjson.encode(body), headers = { ["Content-Type"] = "application/json" } }))
  assert(resp.status == 200, "the fake answered " .. resp.status .. " to " .. path)
  return cjson.decode(resp.body)
end

--- The fake's objects: { objects = { sandboxclaims = { [ns] = { [name] = obj } }, … }, counts = … }.
function cluster_mt:state()
  return self:control("/_fake/state")
end

--- Every request the fake received, in order (as fake_http records them).
function cluster_mt:requests()
  return self.backend:requests()
end

--- The fake's own log lines (agents started, authentication verdicts, deletions).
function cluster_mt:log_entries()
  local out = {}
  for line in (files.read(self.backend.log_path) or ""):gmatch("[^\n]+") do
    local entry = cjson.decode(line)
    if not entry.method then out[#out + 1] = entry end
  end
  return out
end

--- API requests (not control or router ones) with their method, path and query.
function cluster_mt:api_requests(method, path_pattern)
  local out = {}
  for _, r in ipairs(self:requests()) do
    if (not method or r.method == method) and r.path:match(path_pattern or "^/api") then
      out[#out + 1] = r
    end
  end
  return out
end

function cluster_mt:stop()
  if self.backend then
    -- The fake stops its agents itself; any it could not (it died) are killed from its log,
    -- read once the fake is halted: an agent it was starting meanwhile is logged by then (its
    -- pid is logged as it is spawned, before it is ready), and none is started after.
    pcall(raw_http.request, self.backend.port, "POST", "/_fake/shutdown", { body = "{}", timeout = 10 })
    self.backend:halt()
    local entries = self:log_entries()
    self.backend:stop()
    for _, entry in ipairs(entries) do
      if entry.agent_pid and core.alive(entry.agent_pid) then core.kill(entry.agent_pid, core.SIGKILL) end
      if entry.agent_dir then core.remove_tree(entry.agent_dir) end
    end
    self.backend = nil
  end
  if self.front_pid then
    nginx.kill(self.front_pid)
    self.front_pid = nil
  end
  if self.dir then
    core.remove_tree(self.dir)
    self.dir = nil
  end
end

return kube_cluster
