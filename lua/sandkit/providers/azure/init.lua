--- The `azure` provider: each session is a sandbox in an Azure Container Apps sandbox group.
-- docs/azure.md has the options, the route rules and why they are as they are.
--
--   sandkit.sandbox{ provider = "azure", group = "…", image = "…",
--                    egress = { mode = "deny" },  -- or "allow", or "allowDomains" + domains
--                    cpu = "1000m", memory = "2048Mi", agent = false,
--                    dataplane = nil,             -- an object (docs/azure.md), else the REST client
--                    subscription =, resource_group =, region = | endpoint =, token =, api_version =,
--                    header_timeout, grace, error_body_timeout, connect_timeout = 10,
--                    command_timeout, ready_timeout = 60, ready_interval = 0.5,
--                    create_timeout = 120, state_interval = 2, delete_timeout = 60,
--                    auto_suspend = nil, allow_loopback_http = nil }
--
-- A session whose record carries the label alienAgentTransport = native-file-v1 is served by
-- the agent its image ships, over the agent's HTTPS route with a per-boot credential; a session
-- without the label runs commands through the data plane's executeShellCommand (no jobs, output
-- only once the command ended); any other value is refused. The label is written at create
-- from `agent` and read back from the session's own record ever after, so changing `agent`
-- never changes how an existing session is reached.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"
local wait = require "sandkit.wait"

local azure = {}

--- The sandbox options this provider takes besides the common ones (sandkit.sandbox); the
-- REST data plane's own (subscription … proxy) included.
azure.OPTIONS = options_check.set{ "group", "image", "egress", "cpu", "memory", "agent",
  "dataplane", "subscription", "resource_group", "region", "endpoint", "token", "timeout",
  "api_version", "ca_file", "proxy", "ready_timeout", "ready_interval", "create_timeout",
  "state_interval", "delete_timeout", "native_grace", "auto_suspend", "allow_loopback_http" }

--- Session ids are the data plane's, held to the rule every provider's ids follow.
azure.ID = options_check.SESSION_ID

--- Where the agent listens in the sandbox, and the file its image writes the per-boot
-- credential to (44 characters of standard base64, no newline).
azure.AGENT_PORT = 8971
azure.TOKEN_PATH = "/run/sandkit/agent-token"
azure.TRANSPORT_LABEL = "alienAgentTransport"
azure.TRANSPORT_VERSION = "native-file-v1"

local RUN = protocol.OPERATIONS.run
local READ_FILE = protocol.OPERATIONS.read_file
local WRITE_FILES = protocol.OPERATIONS.write_files
local MKDIR = protocol.OPERATIONS.mkdir
local ACTIVATE = protocol.OPERATIONS.activate

--- Agent answers to 404 that are the agent's own verdict, not a proxy that has no route.
local TYPED_NOT_FOUND = { "PATH_NOT_FOUND:", "JOB_NOT_FOUND:" }

local DEFAULTS = {
  cpu = "1000m",
  memory = "2048Mi",
  ready_timeout = readiness.DEFAULT_TIMEOUT,
  ready_interval = readiness.DEFAULT_INTERVAL,
  create_timeout = 120,  -- seconds a new sandbox gets to reach Running
  state_interval = 2,    -- seconds between reads of a sandbox changing state
  delete_timeout = 60,   -- seconds a deletion gets to be confirmed
  connect_timeout = 10,  -- a route that does not connect by then is not delivering anything
  native_grace = 10,     -- seconds an executeShellCommand answer may lag its command's deadline
}

--- Native commands: the deadline is enforced inside the sandbox, so it has bounds of its own.
local MAX_NATIVE_MS = 24 * 3600 * 1000

--- Azure's sandbox states as sandkit's session states.
local STATES = {
  Running = "running", Creating = "starting", Resuming = "starting",
  Stopping = "paused", Stopped = "paused", Suspended = "paused", Idle = "paused", Hibernated = "paused",
  Deleting = "terminated", Failed = "terminated",
}
--- States a resume wakes from.
local ASLEEP = { Stopped = true, Suspended = true, Idle = true, Hibernated = true }

local provider_mt = {}
provider_mt.__index = provider_mt

-- Egress -------------------------------------------------------------------------------------

local function check_egress(egress)
  if egress == nil then return { mode = "deny" } end
  if type(egress) ~= "table" then return nil, "egress is a table such as { mode = \"deny\" }" end
  if egress.mode == "deny" or egress.mode == "allow" then return egress end
  if egress.mode ~= "allowDomains" then
    return nil, "egress.mode is \"deny\", \"allow\" or \"allowDomains\""
  end
  if type(egress.domains) ~= "table" or #egress.domains == 0 then
    return nil, "allowDomains needs a non-empty domains list"
  end
  for _, domain in ipairs(egress.domains) do
    if type(domain) ~= "string" or not domain:match("^[%w%*][%w%*%.%-]*$") then
      return nil, "a domain is a host name, optionally starting with *."
    end
  end
  return egress
end

--- The data plane's egressPolicy for a declared egress: { mode = "deny" } (the default),
-- { mode = "allow" } or { mode = "allowDomains", domains = { … } }.
function azure.egress_policy(declared)
  local egress, why = check_egress(declared)
  if not egress then error("sandkit: " .. why, 2) end
  if egress.mode == "allow" then return { defaultAction = "Allow" } end
  if egress.mode == "deny" then return { defaultAction = "Deny" } end
  local rules = {}
  for i, domain in ipairs(egress.domains) do rules[i] = { pattern = domain, action = "Allow" } end
  return { defaultAction = "Deny", hostRules = rules }
end

--- A policy as a comparable string: the default action and the host rules as a set. Any other
-- kind of rule was never declared, so it is kept and can only make the policies differ.
local function policy_key(policy)
  if type(policy) ~= "table" or type(policy.defaultAction) ~= "string" then return nil end
  local rules = {}
  if policy.hostRules ~= nil then
    if type(policy.hostRules) ~= "table" then return nil end
    for _, rule in ipairs(policy.hostRules) do
      if type(rule) ~= "table" or type(rule.pattern) ~= "string" or type(rule.action) ~= "string" then
        return nil
      end
      rules[#rules + 1] = rule.action:lower() .. " " .. rule.pattern:lower()
    end
  end
  table.sort(rules)
  local other = type(policy.rules) == "table" and #policy.rules or 0
  return policy.defaultAction:lower() .. "|" .. table.concat(rules, ",") .. "|" .. other
end

-- Records -----------------------------------------------------------------------------------

local function invalid_route()
  return errors.command_failed("agentTransportInvalid",
    "Azure did not report a valid agent HTTPS route and per-boot credential",
    { operation = "sandbox.agent" })
end

--- How a session is reached, from its own record: "agent", "native", or refused.
local function transport_of(raw)
  local value
  if type(raw.labels) == "table" then value = raw.labels[azure.TRANSPORT_LABEL] end
  if value == nil then return "native" end
  if value == azure.TRANSPORT_VERSION then return "agent" end
  return nil, invalid_route()
end

local function gone(operation, id)
  return errors.command_failed("sandboxGone", operation .. ": session " .. id .. " does not exist",
    { operation = operation })
end

local function capabilities(jobs)
  return { files = true, jobs = jobs, reconnect = true, preview = false, pause_resume = true,
    snapshot = false, list = false, isolation = "none" }
end

-- The provider -------------------------------------------------------------------------------

function azure.new(options)
  if type(options.group) ~= "string" or not options.group:match("^[%w%-_%.]+$") then
    return nil, errors.invalid_input("sandkit.sandbox", "group", "the azure provider needs group, a sandbox group name")
  end
  if type(options.image) ~= "string" or options.image == "" then
    return nil, errors.invalid_input("sandkit.sandbox", "image", "the azure provider needs image, a disk image name")
  end
  local egress, why = check_egress(options.egress)
  if not egress then return nil, errors.invalid_input("sandkit.sandbox", "egress", why) end
  if options.agent ~= nil and type(options.agent) ~= "boolean" then
    return nil, errors.invalid_input("sandkit.sandbox", "agent", "agent is true or false")
  end
  for _, name in ipairs{ "cpu", "memory" } do
    if options[name] ~= nil and type(options[name]) ~= "string" then
      return nil, errors.invalid_input("sandkit.sandbox", name, name .. " is a string such as "
        .. DEFAULTS[name])
    end
  end
  local times, bad = options_check.each(options_check.seconds, "sandkit.sandbox", options,
    { "ready_timeout", "ready_interval", "create_timeout", "state_interval", "delete_timeout",
      "connect_timeout", "native_grace" }, DEFAULTS)
  if not times then return nil, bad end
  -- Whole idle seconds: the data plane's interval.
  local _, bad_idle = options_check.whole_seconds("sandkit.sandbox", options, "auto_suspend")
  if bad_idle then return nil, bad_idle end
  local dp = options.dataplane
  if dp == nil then
    local err
    dp, err = require("sandkit.providers.azure.dataplane").new(options)
    if not dp then return nil, err end
  elseif type(dp) ~= "table" then
    return nil, errors.invalid_input("sandkit.sandbox", "dataplane",
      "dataplane is an object with the methods docs/azure.md lists")
  end
  local conn_options = { connect_timeout = times.connect_timeout }
  for _, name in ipairs{ "header_timeout", "grace", "error_body_timeout", "body_timeout" } do
    conn_options[name] = options[name]
  end
  return setmetatable({
    name = "azure",
    options = options,
    dataplane = dp,
    group = options.group,
    image = options.image,
    cpu = options.cpu or DEFAULTS.cpu,
    memory = options.memory or DEFAULTS.memory,
    egress_policy = azure.egress_policy(egress),
    agent = options.agent == true,
    allow_loopback_http = options.allow_loopback_http == true,
    times = times,
    conn_options = conn_options,
    -- One route per session id: { base = "https://host", token = "…" }, activated before it
    -- was stored. Never marked "in progress": an operation that finds none opens its own.
    routes = {},
  }, provider_mt)
end

function provider_mt:capabilities()
  return capabilities(self.agent)
end

--- What one session can do follows its own record, not this sandbox's `agent` option.
function provider_mt:session_capabilities(record)
  return capabilities((record.transport or transport_of(record)) == "agent")
end

--- Reads a session's raw record: raw | nil (absent) | nil, err.
function provider_mt:read(id, operation)
  local raw, err = self.dataplane:get_sandbox(self.group, id)
  if raw then return raw end
  if err then return nil, errors.wrap(operation, "the session record could not be read", err) end
  return nil
end

--- Nil when the session enforces the declared egress policy, else the refusal.
function provider_mt:egress_refusal(raw, operation)
  local effective = policy_key(raw.egress_policy)
  if effective ~= nil and effective == policy_key(self.egress_policy) then return nil end
  return errors.new("SANDBOX_NOT_AS_DECLARED", { operation = operation, sandbox_id = raw.id,
    restriction = "egress", message = operation .. ": session " .. raw.id
      .. " does not enforce the declared egress policy" })
end

--- A raw record as a session record, if it is what this sandbox declares.
function provider_mt:judge(raw, operation)
  local kind, err = transport_of(raw)
  if not kind then return nil, err end
  local refusal = self:egress_refusal(raw, operation)
  if refusal then return nil, refusal end
  return { id = raw.id, state = STATES[raw.state] or "starting", azure_state = raw.state,
    generation = 1, transport = kind, labels = raw.labels }
end

--- Reads and judges a session that must exist.
function provider_mt:judged(id, operation)
  local raw, err = self:read(id, operation)
  if not raw then return nil, err or gone(operation, id) end
  return self:judge(raw, operation)
end

--- Reads the record until `done(raw)` says yes, every state_interval, up to `timeout`.
function provider_mt:poll(id, operation, timeout, done)
  local deadline = wait.now() + timeout
  while true do
    local raw, err = self:read(id, operation)
    if err then return nil, err end
    local verdict, why = done(raw)
    if verdict ~= nil then return verdict, why end
    if wait.now() + self.times.state_interval > deadline then
      return nil, errors.unreachable(operation, string.format(
        "session %s did not settle within %gs (last state %s)", id, timeout, tostring(raw and raw.state)))
    end
    wait.sleep(self.times.state_interval)
  end
end

--- Waits for Running: raw | nil, err.
function provider_mt:await_running(id, operation, timeout)
  return self:poll(id, operation, timeout, function(raw)
    if not raw then return false, gone(operation, id) end
    if raw.state == "Running" then return raw end
    if STATES[raw.state] == "terminated" then
      return false, errors.command_failed("sandboxGone", operation .. ": session " .. id .. " is "
        .. raw.state, { operation = operation })
    end
  end)
end

--- Makes sure a session runs, waking it when it sleeps: raw, woke | nil, err. `raw` is its
-- record when the caller just read it.
function provider_mt:ensure_running(id, operation, raw)
  local err
  if not raw then
    raw, err = self:read(id, operation)
    if not raw then return nil, err or gone(operation, id) end
  end
  if raw.state == "Running" then return raw, false end
  if STATES[raw.state] == "terminated" then return nil, gone(operation, id) end
  if raw.state == "Stopping" then
    return nil, errors.command_failed("sessionSuspended", operation .. ": session " .. id
      .. " is stopping; resume it once it stopped", { operation = operation })
  end
  local woke = false
  if ASLEEP[raw.state] then
    local ok
    ok, err = self.dataplane:resume_sandbox(self.group, id)
    if not ok then
      return nil, err and errors.wrap(operation, "the session could not be woken", err) or gone(operation, id)
    end
    woke = true
  end
  raw, err = self:await_running(id, operation, self.times.create_timeout)
  if not raw then return nil, err end
  return raw, woke
end

-- The agent route ------------------------------------------------------------------------------

--- The base of an agent route ("https://host[:port]"), or nil when the URL is anything but a
-- provider route: the credential is attached to whatever this returns.
local function route_base(url, allow_loopback_http)
  if type(url) ~= "string" or url:find("[%z\1-\32\127\\]") then return nil end
  local scheme, authority, rest = url:match("^(%a[%w+.-]*)://([^/?#]*)(.*)$")
  if not scheme or (rest ~= "" and rest ~= "/") then return nil end   -- a path, query or fragment
  if authority:find("@", 1, true) then return nil end                 -- user info
  local host, port = authority:match("^([%w%.%-]+)(:?%d*)$")
  if not host or port == ":" or (port ~= "" and tonumber(port:sub(2)) > 65535) then return nil end
  scheme, host = scheme:lower(), host:lower()
  local provider = scheme == "https"
    and (host:match("^[%w%-]+[%w%.%-]*%.adcproxy%.io$") or host:match("^[%w%-]+[%w%.%-]*%.azurecontainerapps%.io$"))
  local loopback = allow_loopback_http and scheme == "http" and host == "127.0.0.1"
  if not (provider or loopback) then return nil end
  return scheme .. "://" .. host .. port
end

--- 32 bytes of standard base64: with the padding core.b64decode insists on, exactly 44
-- characters and nothing around them.
local function valid_token(bytes)
  local raw = type(bytes) == "string" and core.b64decode(bytes)
  return type(raw) == "string" and #raw == 32
end

--- Fetches the session's route and the credential of its current boot. The URL is judged
-- before the credential is even read.
function provider_mt:fetch_route(id)
  local url, err = self.dataplane:agent_port_url(self.group, id, azure.AGENT_PORT)
  if not url then
    if err then return nil, errors.wrap("sandbox.agent", "the agent route could not be fetched", err) end
    return nil, gone("sandbox.agent", id)
  end
  local base = route_base(url, self.allow_loopback_http)
  if not base then return nil, invalid_route() end
  local token
  token, err = self.dataplane:read_file(self.group, id, azure.TOKEN_PATH)
  if not token then
    if err then return nil, errors.wrap("sandbox.agentCredentials", "the agent credential could not be read", err) end
    -- The image writes it when the agent starts: not yet is not never.
    return nil, errors.unreachable("sandbox.agent", "the agent of session " .. id
      .. " has not written its credential yet")
  end
  if not valid_token(token) then return nil, invalid_route() end
  return { base = base, token = token }
end

local function target(route, path)
  return { url = route.base .. path, headers = { Authorization = "Bearer " .. route.token }, route = route }
end

--- Judges the session again before its agent is activated: activation starts image code, so
-- the policy is checked even when the first operation only reads a file.
function provider_mt:judge_for_activation(id)
  local record, err = self:judged(id, ACTIVATE)
  if not record then return nil, err end
  if record.transport ~= "agent" then return nil, invalid_route() end
  return true
end

function provider_mt:activate_route(id, route)
  local ok, err = self:judge_for_activation(id)
  if not ok then return nil, err end
  local conn = protocol.connection({ prepare = function(_, _, path) return target(route, path) end },
    self.conn_options)
  return protocol.activate(conn)
end

--- Fetches, activates and stores a route. Nothing is stored until activation succeeded, so an
-- operation running meanwhile sees no route and opens its own; activating twice is harmless.
function provider_mt:open_route(id)
  local route, err = self:fetch_route(id)
  if not route then return nil, err end
  local ok
  ok, err = self:activate_route(id, route)
  if not ok then return nil, err end
  self.routes[id] = route
  return route
end

--- Drops a route, unless another operation already replaced it.
function provider_mt:forget(id, route)
  if route ~= nil and self.routes[id] == route then self.routes[id] = nil end
end

local transport_mt = {}
transport_mt.__index = transport_mt

--- A transport over the session's cached route (protocol.lua's prepare/settle). One object per
-- connection; the cache it reads and writes is the provider's.
function provider_mt:route_transport(id)
  return setmetatable({ provider = self, id = id }, transport_mt)
end

function transport_mt:prepare(_, path, operation)
  local p, id = self.provider, self.id
  if operation == ACTIVATE then
    -- Only readiness asks for an activation, and only when health says a boot awaits one.
    -- Health is public, so it cannot refuse the credential of an earlier boot: the cached
    -- one is stale, and the activation goes out with the boot's own, judged again first.
    p:forget(id, self.last_route)
    local fresh, err = p:fetch_route(id)
    if not fresh then return nil, err end
    local ok
    ok, err = p:judge_for_activation(id)
    if not ok then return nil, err end
    -- Stored by the next request, which readiness sends only after this one succeeded;
    -- a failure passes through settle, which discards it.
    self.pending = fresh
    self.last_route = fresh
    return target(fresh, path)
  end
  local route = self.pending or p.routes[id]
  if self.pending then
    p.routes[id], self.pending = self.pending, nil
  end
  if not route then
    local err
    route, err = p:open_route(id)
    if not route then return nil, err end
  end
  self.last_route = route
  return target(route, path)
end

local CAPABILITY_REFUSED = "SANDBOX_CAPABILITY_REFUSED:"

local function typed_not_found(err)
  if err.status ~= 404 or err.code ~= "SANDBOX_COMMAND_FAILED" or type(err.body) ~= "string" then
    return false
  end
  for _, prefix in ipairs(TYPED_NOT_FOUND) do
    if err.body:sub(1, #prefix) == prefix then return true end
  end
  return false
end

--- Decides what a failed attempt means for the route (protocol.lua calls it for every failed
-- attempt; `replayed` is true for the one replay). Refresh and replay once only where the
-- request provably was not delivered; everything else keeps or drops the route and returns.
function transport_mt:settle(operation, err, attempted, replayed)
  local p, id, used = self.provider, self.id, attempted.route
  if operation == ACTIVATE then
    self.pending = nil
    return nil
  end
  -- The agent's own answer: the route works.
  if typed_not_found(err) then return nil end
  -- A replay that failed must not leave its route for the next operation.
  if replayed then
    p:forget(id, used)
    return nil
  end
  -- A credential refusal is answered before anything runs and has no side effect: a 401, or
  -- the 403 sandkit-agent gives a wrong token. Only a changed credential makes it worth a replay.
  local unauthorized = err.status == 401 or (err.status == 403 and err.code == "SANDBOX_COMMAND_FAILED"
    and type(err.body) == "string" and err.body:sub(1, #CAPABILITY_REFUSED) == CAPABILITY_REFUSED)
  local not_delivered = err.sent == false                                         -- never connected
    or (err.status == 404 and err.code == "SANDBOX_COMMAND_FAILED")               -- no route at the proxy
    or unauthorized                                                               -- refused before anything ran
  if not not_delivered then
    -- A timeout, a connection lost after connecting, a 5xx, an unreadable body: the request
    -- may have run. Never replayed; the next operation starts from a fresh route.
    p:forget(id, used)
    return nil
  end
  local current = p.routes[id]
  if current ~= nil and current ~= used then return "replay" end   -- refreshed meanwhile
  local fresh, ferr = p:fetch_route(id)
  if not fresh then
    p:forget(id, used)
    return nil, errors.wrap(operation, "the route to the agent could not be refreshed", ferr)
  end
  if unauthorized and fresh.base == used.base and fresh.token == used.token then
    -- The credential the agent refused is still the current one: that is its answer.
    return nil
  end
  local ok, aerr = p:activate_route(id, fresh)
  if not ok then
    p:forget(id, used)
    return nil, errors.wrap(operation, "the refreshed route to the agent could not be activated", aerr)
  end
  p.routes[id] = fresh
  return "replay"
end

--- Waits until the session's agent serves, activating a boot that awaits it.
function provider_mt:wait_agent(id, operation)
  local conn = protocol.connection(self:route_transport(id), self.conn_options)
  return readiness.wait(conn, { timeout = self.times.ready_timeout,
    interval = self.times.ready_interval, operation = operation })
end

-- Native sessions ----------------------------------------------------------------------------

--- Runs argv under a deadline inside the sandbox: draws a 32-hex nonce (stderr's first line),
-- runs the command in its own session, and on the deadline repeats the nonce and kills the
-- whole group. Exit 126 before the nonce means the image cannot bound a command (no setsid,
-- /dev/urandom, od or fractional sleep) and nothing ran.
local DEADLINE_PROGRAM = [[
n=$(od -An -N16 -tx1 /dev/urandom 2>/dev/null | tr -d ' \n')
case $n in ????????????????????????????????) ;; *) exit 126 ;; esac
command -v setsid >/dev/null 2>&1 || exit 126
sleep 0.001 </dev/null >/dev/null 2>&1 || exit 126
printf '%s\n' "$n" >&2
t=$1
shift
setsid "$@" &
p=$!
(
  trap 'kill "$s" 2>/dev/null; exit 0' TERM
  sleep "$t" </dev/null >/dev/null 2>&1 &
  s=$!
  wait "$s"
  printf '%s\n' "$n" >&2
  kill -s KILL -- -"$p" 2>/dev/null
) &
w=$!
wait "$p" 2>/dev/null
c=$?
kill "$w" 2>/dev/null
wait "$w" 2>/dev/null
exit "$c"
]]

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function check_command(argv, opts)
  if type(argv) ~= "table" then error("sandkit: a command is an argv table", 3) end
  for k, v in pairs(argv) do
    if type(k) ~= "number" or k % 1 ~= 0 or k < 1 or k > #argv or type(v) ~= "string" then
      error("sandkit: argv must be a sequence of strings", 3)
    end
  end
  if opts.cwd ~= nil and type(opts.cwd) ~= "string" then error("sandkit: cwd must be a string", 3) end
  if opts.env ~= nil and type(opts.env) ~= "table" then error("sandkit: env must be a table", 3) end
  if #argv == 0 then return errors.invalid_input(RUN, "command", "a command needs at least a program") end
  for _, v in ipairs(argv) do
    if v:find("%z") then return errors.invalid_input(RUN, "command", "an argument holds a NUL byte") end
  end
  for k, v in pairs(opts.env or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then error("sandkit: env must map strings to strings", 3) end
    if not k:match("^[%a_][%w_]*$") or v:find("%z") then
      return errors.invalid_input(RUN, "env", "an environment name is [A-Za-z_][A-Za-z0-9_]* and no value holds NUL")
    end
  end
end

--- The shell command string for argv under a deadline of `ms` milliseconds.
local function deadline_command(argv, env, ms)
  local words = { "sh", "-c", shell_quote(DEADLINE_PROGRAM), "sandkit-deadline",
    string.format("%d.%03d", math.floor(ms / 1000), ms % 1000) }
  local names = {}
  for name in pairs(env or {}) do names[#names + 1] = name end
  if #names > 0 then
    table.sort(names)
    words[#words + 1] = "env"
    for _, name in ipairs(names) do words[#words + 1] = shell_quote(name .. "=" .. env[name]) end
  end
  for _, arg in ipairs(argv) do words[#words + 1] = shell_quote(arg) end
  return table.concat(words, " ")
end

local list_stream_mt = {}
list_stream_mt.__index = list_stream_mt

--- Frames delivered in order, then the failure (if any) for ever.
function list_stream_mt:next()
  local i = self.at
  if i <= #self.frames then
    self.at = i + 1
    return self.frames[i]
  end
  return nil, self.failure
end

--- The command already ended and its output is in memory: nothing is held open.
function list_stream_mt.close() end
list_stream_mt.__close = list_stream_mt.close

--- Frames rebuilt from a finished command's result, as the agent would have streamed them.
local function rebuild(result, ms)
  local stderr = result.stderr or ""
  local nonce = stderr:match("^(%x+)\n")
  if not nonce or #nonce ~= 32 then
    return nil, errors.command_failed("commandNotBounded",
      "sandbox.runCommand: the sandbox image cannot bound a command's time (it needs sh, setsid, od, "
        .. "/dev/urandom and a sleep that takes fractions), so nothing ran", { operation = RUN })
  end
  local rest, repeats = stderr:sub(#nonce + 2):gsub(nonce .. "\n", "")
  local frames, seq = {}, 0
  if (result.stdout or "") ~= "" then
    frames[#frames + 1] = { type = "stdout", seq = seq, data = result.stdout }
    seq = seq + 1
  end
  if rest ~= "" then frames[#frames + 1] = { type = "stderr", seq = seq, data = rest } end
  local stream = setmetatable({ frames = frames, at = 1 }, list_stream_mt)
  if result.exit_code == 137 and repeats > 0 then
    stream.failure = errors.command_failed("timeoutExceeded",
      string.format("sandbox.runCommand: the command exceeded its %dms timeout", ms), { operation = RUN })
  else
    frames[#frames + 1] = { type = "exit", code = result.exit_code or -1, truncated = false }
  end
  return stream
end

--- Protocol operations for a session without an agent, over the data plane.
local native = {}

function native.exec(conn, argv, opts)
  local bad = check_command(argv, opts)
  if bad then return nil, bad end
  local ms, err = protocol.timeout_ms(opts.timeout, RUN)
  if not ms then return nil, err end
  if ms > MAX_NATIVE_MS then
    return nil, errors.invalid_input(RUN, "timeout", "a command on a session without an agent runs at most 24 hours")
  end
  local p, id = conn.provider, conn.session_id
  local raw
  raw, err = p:ensure_running(id, RUN)
  if not raw then return nil, err end
  local result
  result, err = p.dataplane:execute_shell_command(p.group, id, deadline_command(argv, opts.env, ms),
    opts.cwd, { timeout = ms / 1000 + p.times.native_grace })
  if not result then
    if err then return nil, errors.wrap(RUN, "the command could not be run", err) end
    return nil, gone(RUN, id)
  end
  return rebuild(result, ms)
end

function native.read_file(conn, path)
  if type(path) ~= "string" then error("sandkit: a path is a string", 2) end
  local p, id = conn.provider, conn.session_id
  local bytes, err = p.dataplane:read_file(p.group, id, path)
  if bytes then return bytes end
  if err then return nil, errors.wrap(READ_FILE, "the file could not be read", err) end
  return nil, errors.command_failed("pathNotFound", READ_FILE .. ": no such file in the sandbox: " .. path,
    { operation = READ_FILE, status = 404 })
end

local function unsupported_files(operation)
  return errors.not_supported(operation, "this data plane object offers no " .. operation .. " call")
end

function native.write_files(conn, files)
  if type(files) ~= "table" then error("sandkit: write_files takes a { [path] = bytes } table", 2) end
  local p, id = conn.provider, conn.session_id
  if not p.dataplane.write_file then return nil, unsupported_files(WRITE_FILES) end
  local paths = {}
  for path, bytes in pairs(files) do
    if type(path) ~= "string" or type(bytes) ~= "string" then
      error("sandkit: write_files takes a { [path] = bytes } table", 2)
    end
    paths[#paths + 1] = path
  end
  table.sort(paths)
  for _, path in ipairs(paths) do
    local ok, err = p.dataplane:write_file(p.group, id, path, files[path])
    if not ok then
      err = err and errors.wrap(WRITE_FILES, "the file could not be written", err) or gone(WRITE_FILES, id)
      err.path = path
      return nil, err
    end
  end
  return true
end

function native.mkdir(conn, path)
  if type(path) ~= "string" then error("sandkit: a path is a string", 2) end
  local p, id = conn.provider, conn.session_id
  if not p.dataplane.mkdir then return nil, unsupported_files(MKDIR) end
  local ok, err = p.dataplane:mkdir(p.group, id, path)
  if ok then return true end
  return nil, err and errors.wrap(MKDIR, "the directory could not be made", err) or gone(MKDIR, id)
end

local function no_jobs()
  return nil, errors.not_supported("sandbox.jobStart", "a session without an agent runs no jobs")
end
native.job_start, native.job_poll, native.job_cancel = no_jobs, no_jobs, no_jobs

-- Provider interface ---------------------------------------------------------------------------

function provider_mt:connection(record)
  local kind, err = record.transport, nil
  if kind == nil then kind, err = transport_of(record) end
  if not kind then return nil, err end
  local conn = protocol.connection(kind == "agent" and self:route_transport(record.id) or nil,
    self.conn_options)
  conn.features = record.features or {}
  if kind == "native" then
    conn.ops = native
    conn.provider = self
    conn.session_id = record.id
  end
  return conn
end

function provider_mt:get(id)
  local raw, err = self:read(id, "sandbox.get")
  if not raw then return nil, err end
  return self:judge(raw, "sandbox.get")
end

--- A session this call made and could not hand back is deleted; if that fails too, the error
-- names it in `left_behind`.
function provider_mt:discard(id, err)
  self.routes[id] = nil
  local ok, derr = self.dataplane:delete_sandbox(self.group, id)
  if not ok and derr then err.left_behind = id end
  return nil, err
end

--- Brings a record to the point where it serves: an agent session waits for its agent. An
-- absent id cannot be made under that name by get_or_create: the data plane chooses ids, and
-- create says so.
function provider_mt:serve(record, operation)
  if record.transport ~= "agent" or record.state ~= "running" then return record end
  local health, err = self:wait_agent(record.id, operation)
  if not health then return nil, err end
  record.features = health.features
  record.boot_id = health.bootId
  return record
end

function provider_mt:create(opts)
  local op = "sandbox.create"
  if opts.id ~= nil then
    return nil, errors.invalid_input(op, "id", "the Azure data plane chooses session ids: create without one")
  end
  for k, v in pairs(opts.env or {}) do
    if type(k) ~= "string" or type(v) ~= "string" then
      error("sandkit: create env must map strings to strings", 3)
    end
  end
  local raw, err = self.dataplane:create_sandbox(self.group, {
    image = self.image, cpu = self.cpu, memory = self.memory,
    egress_policy = self.egress_policy,
    labels = self.agent and { [azure.TRANSPORT_LABEL] = azure.TRANSPORT_VERSION } or {},
    environment = opts.env, auto_suspend = self.options.auto_suspend,
  })
  if not raw then
    return nil, err and errors.wrap(op, "the sandbox could not be created", err)
      or errors.unexpected(op, "sandbox", "the data plane reported no sandbox")
  end
  local id = raw.id
  raw, err = self:await_running(id, op, self.times.create_timeout)
  if not raw then return self:discard(id, err) end
  local record
  record, err = self:judge(raw, op)
  if not record then return self:discard(id, err) end
  if record.transport ~= (self.agent and "agent" or "native") then
    return self:discard(id, errors.new("SANDBOX_NOT_AS_DECLARED", { operation = op, sandbox_id = id,
      restriction = "transport", message = op .. ": session " .. id .. " did not keep its transport label" }))
  end
  record, err = self:serve(record, op)
  if not record then return self:discard(id, err) end
  return record
end

function provider_mt:list()
  return nil, errors.not_supported("sandbox.list", "the Azure data plane has no listing for a provider to filter")
end

--- Deletes the session and waits until it is gone. An absent id succeeds.
function provider_mt:terminate(id)
  local op = "sandbox.terminate"
  self.routes[id] = nil
  local ok, err = self.dataplane:delete_sandbox(self.group, id)
  if not ok and err then return nil, errors.wrap(op, "the session could not be deleted", err) end
  return self:poll(id, op, self.times.delete_timeout, function(raw)
    if not raw then return true end
  end)
end

--- Stops the session. Its next boot has a new credential, so the route goes too.
function provider_mt:pause(record)
  local op = "sandbox.pause"
  local ok, err = self.dataplane:stop_sandbox(self.group, record.id)
  if not ok then return nil, err and errors.wrap(op, "the session could not be stopped", err) or gone(op, record.id) end
  self.routes[record.id] = nil
  return true
end

--- Wakes the session, then waits for its agent, activating the new boot. When that fails, a
-- session this call woke is stopped again; none is ever deleted.
function provider_mt:resume(record)
  local op = "sandbox.resume"
  local id = record.id
  local raw, err = self:read(id, op)
  if not raw then return nil, err or gone(op, id) end
  local refusal = self:egress_refusal(raw, op)
  if refusal then return nil, refusal end
  local running, woke_or_err = self:ensure_running(id, op, raw)
  if not running then return nil, woke_or_err end
  local woke = woke_or_err
  local judged
  judged, err = self:judge(running, op)
  if judged then judged, err = self:serve(judged, op) end
  if judged then return true end
  if woke then self.dataplane:stop_sandbox(self.group, id) end
  return nil, err
end

return azure
