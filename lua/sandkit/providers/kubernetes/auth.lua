--- Credentials for the Kubernetes API server, as a kubeconfig user or a pod's service account
-- gives them: a token, a token file, a client certificate and key (mTLS), an exec plugin
-- (client.authentication.k8s.io/v1 and v1beta1).
--
--   local a = auth.new{ token =, token_file =, client_cert_pem =, client_key_pem =,
--                       exec = { api_version =, command =, args = {…}, env = { {name, value}… },
--                                cluster = <ExecCredential spec.cluster or nil> } }
--   a:fields(operation)   -- { headers = { Authorization = … }, client_cert_pem =, client_key_pem = }
--                         --   | nil, err
--   a:refresh(operation)  -- after a 401: true when the credential changed, so that one more
--                         --   try is worth it
--
-- A token file is read again at most once a minute and after every 401 (bound service-account
-- tokens rotate under a running process). An exec plugin's answer is kept until its
-- expirationTimestamp, and the plugin is run again after a 401; tasks that need it at the same
-- time wait for one run.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local localfile = require "sandkit.localfile"
local time = require "sandkit.time"
local wait = require "sandkit.wait"

local auth = {}

--- Seconds a token file's content is trusted before it is read again: kubelet rotates a
-- bound token at 80 % of its hour, so a minute is always in time.
auth.TOKEN_FILE_INTERVAL = 60
--- A service-account token is about a kilobyte; a file past this holds no token.
local MAX_TOKEN_FILE = 64 * 1024
--- Seconds an exec plugin may take: cloud CLIs that mint tokens answer within seconds, and a
-- plugin waiting for a person is refused (sandkit never runs one interactively).
auth.EXEC_TIMEOUT = 60
--- An ExecCredential is a token or a certificate and key: a few kilobytes.
local MAX_EXEC_OUTPUT = 1024 * 1024
--- Bytes of a failing plugin's stderr quoted in the error.
local MAX_QUOTED_STDERR = 300
--- Seconds before its expirationTimestamp an exec credential is replaced: a request sent
-- just before the expiry must not arrive just after it.
local EXEC_EXPIRY_MARGIN = 10
--- Seconds a plugin that ignored its stop gets before it is killed: it only has to exit.
local EXEC_REAP_TIMEOUT = 5
--- Seconds between two looks at a plugin run another task of this Lua state started: a run
-- takes tens of milliseconds at least, and a look costs nothing.
local SHARED_RUN_LOOK = 0.01
--- The task running a plugin shows it is still there at least this often (seconds), and one
-- silent for OWNER_GONE is taken to be gone: an nginx request that ended under it (a client
-- that went away) is never resumed, and tasks waiting for its run must not wait for nothing.
local OWNER_BEAT, OWNER_GONE = 1, 3

--- Runs the plugin with the kubeconfig's environment on top of this process's own, its
-- stdout on descriptor 3 (the pipe core.spawn gives), then appends NUL and its exit status.
-- The plugin gets a process group of its own, so that stopping it at the bound stops whatever
-- it started too.
local EXEC_WRAPPER = [[
n=$1
shift
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n - 1)); done
c=
trap '[ -n "$c" ] && kill -- -"$c" 2>/dev/null; exit 1' TERM
setsid "$@" >&3 3>&- </dev/null &
c=$!
wait "$c"
printf '\000%d' "$?" >&3
]]

local auth_mt = {}
auth_mt.__index = auth_mt

function auth.new(spec)
  return setmetatable({ spec = spec }, auth_mt)
end

local function refused(operation, what)
  return errors.new("INVALID_INPUT", { operation = operation, field = "kubeconfig",
    message = operation .. ": " .. what })
end

local function read_token_file(path, operation)
  local token, why, detail = localfile.read_secret(path, MAX_TOKEN_FILE)
  if token then return token end
  if why == "unreadable" then
    return nil, refused(operation, "the token file cannot be read: " .. detail)
  end
  if why == "too_long" then
    return nil, refused(operation, "the token file " .. path .. " is larger than a token")
  end
  return nil, refused(operation, "the token file " .. path .. " holds no token")
end

--- The file's token, read again when the last read is a minute old or `force` is set.
function auth_mt:file_token(operation, force)
  local now = wait.now()
  if force or not self.file_value or now - self.file_read_at >= auth.TOKEN_FILE_INTERVAL then
    local token, err = read_token_file(self.spec.token_file, operation)
    if not token then return nil, err end
    self.file_value, self.file_read_at = token, now
  end
  return self.file_value
end

-- Exec plugins ---------------------------------------------------------------------------------

local function valid_env_name(name)
  return type(name) == "string" and name:match("^[%a_][%w_]*$") ~= nil
end

--- Runs the plugin: its stdout and exit status, or nil and an error. `beat()` is called at
-- least every OWNER_BEAT seconds while it runs.
local function run_plugin(exec, operation, beat)
  -- Refused before the plugin starts: in an nginx phase that cannot wait, it could be neither
  -- waited for nor stopped.
  wait.check_nginx()
  local info = { apiVersion = exec.api_version, kind = "ExecCredential",
    spec = { interactive = false, cluster = exec.cluster } }
  local assignments = { "KUBERNETES_EXEC_INFO=" .. json.encode(info) }
  for _, pair in ipairs(exec.env or {}) do
    assignments[#assignments + 1] = pair[1] .. "=" .. pair[2]
  end
  local argv = { "/bin/sh", "-c", EXEC_WRAPPER, "sandkit-exec", tostring(#assignments) }
  for _, a in ipairs(assignments) do argv[#argv + 1] = a end
  argv[#argv + 1] = exec.command
  for _, a in ipairs(exec.args or {}) do argv[#argv + 1] = a end
  -- The plugin's stderr goes to a file that is unlinked as soon as the plugin holds it open:
  -- a run abandoned midway (nginx ends a light thread whose request went away) leaves nothing.
  local stderr_path = os.tmpname()
  local stderr_file = io.open(stderr_path, "rb")
  local pid, reader = core.spawn(argv, { ready_fd = 3, stderr = stderr_path })
  os.remove(stderr_path)
  if not pid then
    if stderr_file then stderr_file:close() end
    return nil, refused(operation, "the exec plugin could not be started: " .. tostring(reader))
  end
  local deadline = wait.now() + auth.EXEC_TIMEOUT
  local chunks, size, failure = {}, 0, nil
  while true do
    beat()
    local chunk, err = reader:read()
    if chunk then
      size = size + #chunk
      if size > MAX_EXEC_OUTPUT then
        failure = "it wrote more than an ExecCredential"
        break
      end
      chunks[#chunks + 1] = chunk
    elseif chunk == nil then
      if err then failure = tostring(err) end
      break
    elseif wait.now() >= deadline then
      failure = string.format("it did not finish within %gs", auth.EXEC_TIMEOUT)
      break
    else
      wait.ready(reader, math.min(deadline, wait.now() + OWNER_BEAT))
    end
  end
  reader:close()
  if failure then core.kill(pid, core.SIGTERM) end
  -- The wrapper ends right after its last write; a hung one is killed at the bound.
  local reap_deadline = wait.now() + EXEC_REAP_TIMEOUT
  while not core.reap(pid) do
    beat()
    if wait.now() >= reap_deadline then
      core.kill(pid, core.SIGKILL)
      core.reap(pid, true)
      break
    end
    wait.sleep(0.005)
  end
  local stderr = stderr_file and stderr_file:read(MAX_QUOTED_STDERR) or ""
  if stderr_file then stderr_file:close() end
  local out = table.concat(chunks)
  local body, status = out:match("^(.*)%z(%d+)$")
  if not failure and not body then failure = "it ended without finishing" end
  if not failure and status ~= "0" then failure = "it exited with status " .. status end
  if failure then
    stderr = stderr:gsub("%c+", " ")
    return nil, refused(operation, "the exec plugin " .. exec.command .. " failed: " .. failure
      .. (stderr ~= "" and ("; it said: " .. stderr) or ""))
  end
  return body
end

--- Runs the plugin and reads its ExecCredential into { token =, cert =, key =, expires = }.
local function exec_credential(exec, operation, beat)
  local out, err = run_plugin(exec, operation, beat)
  if not out then return nil, err end
  local value = json.decode(out)
  local function bad(why)
    return nil, refused(operation, "the exec plugin " .. exec.command .. " answered no usable "
      .. "ExecCredential: " .. why)
  end
  if type(value) ~= "table" or value.kind ~= "ExecCredential" then return bad("not an ExecCredential") end
  if value.apiVersion ~= exec.api_version then
    return bad("its apiVersion " .. tostring(value.apiVersion) .. " is not " .. exec.api_version)
  end
  local status = value.status
  if type(status) ~= "table" then return bad("it has no status") end
  local cred = {}
  if type(status.token) == "string" and status.token ~= "" then
    if status.token:find("[%c ]") then return bad("its token is not a header value") end
    cred.token = status.token
  end
  local has_cert = type(status.clientCertificateData) == "string" and status.clientCertificateData ~= ""
  local has_key = type(status.clientKeyData) == "string" and status.clientKeyData ~= ""
  if has_cert ~= has_key then
    return bad(has_cert and "it has clientCertificateData without clientKeyData"
      or "it has clientKeyData without clientCertificateData")
  end
  if has_cert then cred.cert, cred.key = status.clientCertificateData, status.clientKeyData end
  if not cred.token and not cred.cert then return bad("it has neither a token nor a certificate") end
  if status.expirationTimestamp ~= nil then
    cred.expires = time.parse_rfc3339(status.expirationTimestamp)
    if not cred.expires then return bad("expirationTimestamp is not an RFC 3339 time") end
  end
  return cred
end

--- The plugin's credential: the one kept while it is valid (unless `force`), else a new run's.
-- Tasks of one Lua state that need it at the same time (the light threads of an nginx worker,
-- coroutines under sandkit.run or cqueues) share one run: the plugin is often a cloud CLI
-- costing a process and a second, and a run is newer than any credential that was refused.
function auth_mt:exec_credential(operation, force)
  local run = self.exec_run
  if run then
    while not run.done and wait.now() - run.alive_at < OWNER_GONE do wait.sleep(SHARED_RUN_LOOK) end
    if run.done and not run.raised then
      if not run.cred then return nil, run.err end
      return run.cred
    end
    -- Its task is gone, or raised: this one runs the plugin itself.
    if self.exec_run == run then self.exec_run = nil end
  end
  local cred = self.exec_value
  if force or not cred or (cred.expires and os.time() >= cred.expires - EXEC_EXPIRY_MARGIN) then
    run = { alive_at = wait.now() }
    self.exec_run = run
    local ok, got, err = pcall(exec_credential, self.spec.exec, operation,
      function() run.alive_at = wait.now() end)
    if self.exec_run == run then self.exec_run = nil end
    run.done, run.raised = true, not ok
    -- A refusal to wait in this nginx phase, or a misuse: raised, as it would have been.
    if not ok then error(got, 0) end
    run.cred, run.err = got, err
    if not got then return nil, err end
    self.exec_value, cred = got, got
  end
  return cred
end

-- The interface ------------------------------------------------------------------------------

function auth_mt:fields(operation)
  local spec = self.spec
  local out = { headers = {}, client_cert_pem = spec.client_cert_pem, client_key_pem = spec.client_key_pem }
  local token = spec.token
  if spec.token_file then
    local err
    token, err = self:file_token(operation)
    if not token then return nil, err end
  end
  if spec.exec then
    local cred, err = self:exec_credential(operation)
    if not cred then return nil, err end
    token = cred.token or token
    if cred.cert then out.client_cert_pem, out.client_key_pem = cred.cert, cred.key end
  end
  if token then out.headers.Authorization = "Bearer " .. token end
  return out
end

--- After a 401: reads the token file again or runs the plugin again. True when what will be
-- sent next differs from what was refused.
function auth_mt:refresh(operation)
  local spec = self.spec
  if spec.exec then
    local before = self.exec_value
    local cred = self:exec_credential(operation, true)
    return cred ~= nil and (before == nil or cred.token ~= before.token or cred.cert ~= before.cert)
  end
  if spec.token_file then
    local before = self.file_value
    local token = self:file_token(operation, true)
    return token ~= nil and token ~= before
  end
  return false
end

auth.valid_env_name = valid_env_name

return auth
