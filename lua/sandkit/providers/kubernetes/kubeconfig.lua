--- Where the Kubernetes API server is and how to authenticate to it: a kubeconfig (read with
-- lyaml, Debian's lua-yaml), or the pod's own service account when running in a cluster.
--
--   local cfg = kubeconfig.load{ kubeconfig = nil, context = nil, service_account_dir = nil }
--   cfg.server, cfg.namespace, cfg.ca_pem, cfg.tls_server_name, cfg.auth (sandkit.providers.kubernetes.auth)
--
-- Which file: `kubeconfig`, else $KUBECONFIG (a colon list, merged: the first file that names
-- a cluster, user or context defines it, and the first current-context wins), else
-- ~/.kube/config; when none exists and KUBERNETES_SERVICE_HOST is set, the service account
-- (its token, ca.crt and namespace under service_account_dir; $POD_NAMESPACE before the
-- namespace file, as client-go reads them). Paths in a file are relative to that file, and so
-- is an exec plugin's command that holds a '/' (client-go's rule; one without is looked up in
-- PATH). Refused, naming the field, rather than ignored: insecure-skip-tls-verify,
-- auth-provider, username/password, impersonation, proxy-url.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local localfile = require "sandkit.localfile"
local auth = require "sandkit.providers.kubernetes.auth"
local wait = require "sandkit.wait"

local kubeconfig = {}

kubeconfig.SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
--- A kubeconfig with embedded certificates for a few clusters is tens of kilobytes; past this
-- a file is not one.
local MAX_FILE = 4 * 1024 * 1024
--- A PEM certificate or key file (a CA bundle at most) read for the API server: the most PEM
-- text the transports take in a request, so a larger file is refused here, by name.
local MAX_PEM_FILE = core.LIMITS.MAX_PEM

local OPERATION = "sandkit.sandbox"

local function refused(what)
  return errors.new("INVALID_INPUT", { operation = OPERATION, field = "kubeconfig",
    message = OPERATION .. ": " .. what })
end

local function read_file(path, limit)
  local text, why, detail = localfile.read_config(path, limit)
  if text then return text end
  if why == "too_long" then return nil, "larger than " .. limit .. " bytes" end
  return nil, detail
end

--- Whether something is at path: a FIFO or a directory where a kubeconfig is looked for is
-- there, to be refused by its type when read, not passed over.
local function exists(path)
  local _, why = localfile.read_config(path, 0)
  return why ~= "absent"
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

local function resolve(base_dir, path)
  if path:sub(1, 1) == "/" then return path end
  return base_dir .. "/" .. path
end

--- Base64 as kubeconfigs carry it: standard alphabet, padded; line breaks tolerated.
local function b64(text)
  if type(text) ~= "string" then return nil end
  return core.b64decode((text:gsub("%s+", "")))
end

local function is_pem(text, kind)
  return type(text) == "string" and text:find("-----BEGIN " .. kind, 1, true) ~= nil
end

-- Files ------------------------------------------------------------------------------------

local function parse(path)
  local ok, lyaml = pcall(require, "lyaml")
  if not ok then
    return nil, refused("reading a kubeconfig needs lyaml (Debian's lua-yaml)")
  end
  local text, err = read_file(path, MAX_FILE)
  if not text then return nil, refused("the kubeconfig " .. path .. " cannot be read: " .. tostring(err)) end
  local loaded, doc = pcall(lyaml.load, text)
  if not loaded or type(doc) ~= "table" then
    return nil, refused("the kubeconfig " .. path .. " is not YAML: " .. tostring(doc):match("^[^\n]*"))
  end
  return doc
end

--- Merges the named entries of a list (clusters, users, contexts) into by_name; the first
-- definition of a name wins, and remembers which file's directory its paths are relative to.
local function merge(by_name, list, inner, dir)
  if type(list) ~= "table" then return end
  for _, entry in ipairs(list) do
    if type(entry) == "table" and type(entry.name) == "string" and by_name[entry.name] == nil
        and type(entry[inner]) == "table" then
      by_name[entry.name] = { value = entry[inner], dir = dir }
    end
  end
end

local function load_files(paths)
  local merged = { clusters = {}, users = {}, contexts = {} }
  for _, path in ipairs(paths) do
    local doc, err = parse(path)
    if not doc then return nil, err end
    local dir = dirname(path)
    if merged.current == nil and type(doc["current-context"]) == "string"
        and doc["current-context"] ~= "" then
      merged.current = doc["current-context"]
    end
    merge(merged.clusters, doc.clusters, "cluster", dir)
    merge(merged.users, doc.users, "user", dir)
    merge(merged.contexts, doc.contexts, "context", dir)
  end
  merged.source = table.concat(paths, ":")
  return merged
end

--- Inline data or a file, for a field pair such as certificate-authority(-data).
local function pem_field(entry, field, kind, label, where)
  local value = entry.value
  local data = value[field .. "-data"]
  if data ~= nil then
    local pem = b64(data)
    if not is_pem(pem, kind) then
      return nil, refused(where .. "." .. field .. "-data is not base64 of a PEM " .. label)
    end
    return pem
  end
  local path = value[field]
  if path == nil then return nil end
  if type(path) ~= "string" then return nil, refused(where .. "." .. field .. " is not a path") end
  local full = resolve(entry.dir, path)
  local text, err = read_file(full, MAX_PEM_FILE)
  if not text then return nil, refused(where .. "." .. field .. " " .. full .. " cannot be read: " .. tostring(err)) end
  if not is_pem(text, kind) then return nil, refused(where .. "." .. field .. " " .. full .. " is not PEM") end
  return text
end

--- The server URL: https, or http only on this machine (kubectl proxy), without a query.
local function check_server(server, where)
  if type(server) ~= "string" then return nil, refused(where .. ".server is missing") end
  local scheme, rest = server:match("^(https?)://(.+)$")
  local host = rest and (rest:match("^%[([^%]]+)%]") or rest:match("^([^/:]+)"))
  if not host or server:find("[%s%?#@]") then
    return nil, refused(where .. ".server is not an http(s) URL: " .. server)
  end
  local loopback = host == "localhost" or host == "::1" or host:match("^127%.") ~= nil
  if scheme == "http" and not loopback then
    -- Credentials would cross the network in the clear.
    return nil, refused(where .. ".server is plain http on another machine; use https")
  end
  return (server:gsub("/+$", ""))
end

--- The extension of a cluster that client-go hands exec plugins as spec.cluster.config.
local EXEC_EXTENSION = "client.authentication.k8s.io/exec"

local function exec_spec(exec, where, dir)
  local api = exec.apiVersion
  if api ~= "client.authentication.k8s.io/v1" and api ~= "client.authentication.k8s.io/v1beta1" then
    return nil, refused(where .. ".exec.apiVersion " .. tostring(api) .. " is not "
      .. "client.authentication.k8s.io/v1 or v1beta1")
  end
  if type(exec.command) ~= "string" or exec.command == "" then
    return nil, refused(where .. ".exec.command is missing")
  end
  local command = exec.command
  if command:find("/", 1, true) then command = resolve(dir, command) end
  -- sandkit never has a terminal to give a plugin that insists on one.
  if exec.interactiveMode == "Always" then
    return nil, refused(where .. ".exec.interactiveMode is Always; sandkit runs plugins without a terminal")
  end
  local args, env = {}, {}
  for i, a in ipairs(type(exec.args) == "table" and exec.args or {}) do
    if type(a) ~= "string" then return nil, refused(where .. ".exec.args holds a non-string") end
    args[i] = a
  end
  for _, e in ipairs(type(exec.env) == "table" and exec.env or {}) do
    if type(e) ~= "table" or not auth.valid_env_name(e.name) or type(e.value) ~= "string" then
      return nil, refused(where .. ".exec.env entries are {name, value} strings")
    end
    env[#env + 1] = { e.name, e.value }
  end
  return { api_version = api, command = command, args = args, env = env,
    provide_cluster_info = exec.provideClusterInfo == true }
end

--- The credential spec of a kubeconfig user.
local function user_spec(entry, where)
  local user = entry.value
  -- Each would change who the requests act as, or how, in a way sandkit does not do: refused
  -- by name, never silently dropped.
  for _, field in ipairs{ "auth-provider", "username", "password", "as", "as-uid", "as-groups",
      "as-user-extra" } do
    if user[field] ~= nil then
      return nil, refused(where .. "." .. field .. " is not supported: use a token, tokenFile, a "
        .. "client certificate or an exec plugin")
    end
  end
  local spec = {}
  if user.token ~= nil then
    if type(user.token) ~= "string" or user.token == "" or user.token:find("[%c ]") then
      return nil, refused(where .. ".token is not a token")
    end
    spec.token = user.token
  end
  if user.tokenFile ~= nil then
    if type(user.tokenFile) ~= "string" then return nil, refused(where .. ".tokenFile is not a path") end
    spec.token_file = resolve(entry.dir, user.tokenFile)
  end
  local err
  spec.client_cert_pem, err = pem_field(entry, "client-certificate", "CERTIFICATE", "certificate", where)
  if err then return nil, err end
  spec.client_key_pem, err = pem_field(entry, "client-key", "", "key", where)
  if err then return nil, err end
  if (spec.client_cert_pem == nil) ~= (spec.client_key_pem == nil) then
    return nil, refused(where .. " has a client certificate or key without the other")
  end
  if user.exec ~= nil then
    if type(user.exec) ~= "table" then return nil, refused(where .. ".exec is not a mapping") end
    spec.exec, err = exec_spec(user.exec, where, entry.dir)
    if not spec.exec then return nil, err end
  end
  return spec
end

local function from_files(paths, context_name)
  local merged, err = load_files(paths)
  if not merged then return nil, err end
  local name = context_name or merged.current
  if not name then return nil, refused(merged.source .. " names no current-context; give context") end
  local context = merged.contexts[name]
  if not context then return nil, refused("context " .. name .. " is not in " .. merged.source) end
  local cluster_name, user_name = context.value.cluster, context.value.user
  local cluster = merged.clusters[cluster_name or ""]
  if not cluster then
    return nil, refused("context " .. name .. " names cluster " .. tostring(cluster_name)
      .. ", which " .. merged.source .. " does not define")
  end
  local where = "clusters[" .. cluster_name .. "]"
  local c = cluster.value
  if c["insecure-skip-tls-verify"] == true then
    return nil, refused(where .. ".insecure-skip-tls-verify is set: sandkit always verifies the "
      .. "API server; give its certificate-authority instead")
  end
  if c["proxy-url"] ~= nil then
    return nil, refused(where .. ".proxy-url is not supported")
  end
  local server
  server, err = check_server(c.server, where)
  if not server then return nil, err end
  local cfg = { server = server, source = merged.source, context = name }
  cfg.ca_pem, err = pem_field(cluster, "certificate-authority", "CERTIFICATE", "certificate", where)
  if err then return nil, err end
  if c["tls-server-name"] ~= nil then
    if type(c["tls-server-name"]) ~= "string" or not c["tls-server-name"]:match("^[%w][%w%.%-]*$") then
      return nil, refused(where .. ".tls-server-name is not a DNS name")
    end
    cfg.tls_server_name = c["tls-server-name"]
  end
  local spec = {}
  if user_name ~= nil then
    local user = merged.users[user_name]
    if not user then
      return nil, refused("context " .. name .. " names user " .. tostring(user_name) .. ", which "
        .. merged.source .. " does not define")
    end
    spec, err = user_spec(user, "users[" .. user_name .. "]")
    if not spec then return nil, err end
  end
  if spec.exec and spec.exec.provide_cluster_info then
    spec.exec.cluster = { server = server, ["tls-server-name"] = cfg.tls_server_name,
      ["certificate-authority-data"] = cfg.ca_pem and core.b64encode(cfg.ca_pem) or nil }
    -- The cluster's own words for its plugin, passed on as they are.
    for _, ext in ipairs(type(c.extensions) == "table" and c.extensions or {}) do
      if type(ext) == "table" and ext.name == EXEC_EXTENSION then spec.exec.cluster.config = ext.extension end
    end
  end
  cfg.auth = auth.new(spec)
  if type(context.value.namespace) == "string" and context.value.namespace ~= "" then
    cfg.namespace = context.value.namespace
  end
  return cfg
end

--- The pod's service account (rest.InClusterConfig's rules).
local function in_cluster(dir)
  local host, port = os.getenv("KUBERNETES_SERVICE_HOST"), os.getenv("KUBERNETES_SERVICE_PORT")
  if not host or host == "" or not port or not port:match("^%d+$") then
    return nil, refused("in-cluster configuration needs KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT")
  end
  if host:find(":", 1, true) then host = "[" .. host .. "]" end
  local ca, err = read_file(dir .. "/ca.crt", MAX_PEM_FILE)
  if not ca or not is_pem(ca, "CERTIFICATE") then
    return nil, refused("the service account's ca.crt in " .. dir .. " cannot be read: " .. tostring(err or "not PEM"))
  end
  local cfg = { server = "https://" .. host .. ":" .. port, ca_pem = ca, source = dir,
    auth = auth.new{ token_file = dir .. "/token" } }
  local pod_ns = os.getenv("POD_NAMESPACE")
  if pod_ns and pod_ns ~= "" then
    cfg.namespace = pod_ns
  else
    local ns = read_file(dir .. "/namespace", 1024)
    if ns and ns:match("^%s*[%w%-%.]+%s*$") then cfg.namespace = ns:match("^%s*(.-)%s*$") end
  end
  return cfg
end

--- Finds and reads the configuration: cfg | nil, err (INVALID_INPUT naming what is wrong).
function kubeconfig.load(opts)
  opts = opts or {}
  local sa_dir = opts.service_account_dir or kubeconfig.SERVICE_ACCOUNT_DIR
  if opts.kubeconfig ~= nil then
    if type(opts.kubeconfig) ~= "string" or opts.kubeconfig == "" then
      return nil, refused("kubeconfig is the path of a kubeconfig file")
    end
    return from_files({ opts.kubeconfig }, opts.context)
  end
  local list = os.getenv("KUBECONFIG")
  if list and list ~= "" then
    local paths = {}
    for path in list:gmatch("[^:]+") do
      if exists(path) then paths[#paths + 1] = path end
    end
    if #paths > 0 then return from_files(paths, opts.context) end
  end
  local home = os.getenv("HOME")
  if home and home ~= "" and exists(home .. "/.kube/config") then
    return from_files({ home .. "/.kube/config" }, opts.context)
  end
  if os.getenv("KUBERNETES_SERVICE_HOST") and exists(sa_dir .. "/token") then
    return in_cluster(sa_dir)
  end
  -- In a worker, the likely cause is nginx itself: it passes on only what `env` names.
  local in_nginx = wait.ngx_phase() and " (nginx gives its workers only the environment variables "
    .. "its env directives name: env KUBECONFIG, or env KUBERNETES_SERVICE_HOST and "
    .. "env KUBERNETES_SERVICE_PORT in cluster)" or ""
  return nil, refused("no kubeconfig: give kubeconfig, set KUBECONFIG, create ~/.kube/config, "
    .. "or run in a pod with a service account" .. in_nginx)
end

return kubeconfig
