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
--
-- Its parts: egress.lua (the declared egress and its policy), sessions.lua (records, states and
-- the waits on them), route.lua (the agent's route, credential and transport), native.lua
-- (commands and files of a session without an agent), dataplane.lua (the REST client).

local errors = require "sandkit.errors"
local session_labels = require "sandkit.labels"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"
local egress = require "sandkit.providers.azure.egress"
local native = require "sandkit.providers.azure.native"
local agent_route = require "sandkit.providers.azure.route"
local sessions = require "sandkit.providers.azure.sessions"

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
-- credential to; the label that says how a session is reached, and its one value.
azure.AGENT_PORT = agent_route.AGENT_PORT
azure.TOKEN_PATH = agent_route.TOKEN_PATH
azure.TRANSPORT_LABEL = sessions.TRANSPORT_LABEL
azure.TRANSPORT_VERSION = sessions.TRANSPORT_VERSION
--- The data plane's egressPolicy for a declared egress (docs/azure.md).
azure.egress_policy = egress.policy

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

local provider_mt = {}
provider_mt.__index = provider_mt
for _, part in ipairs{ sessions, agent_route } do
  for name, method in pairs(part.methods) do provider_mt[name] = method end
end

--- What a session can do: with an agent (the route), everything its agent offers; without one,
-- what the data plane's single-file calls and shell commands give.
local function capabilities(agent)
  return { files = true, jobs = agent, reconnect = true, preview = false, pause_resume = true,
    snapshot = false, list = false, fs = agent, watch = agent, stdin = agent, pty = agent,
    isolation = "none", set_lifetime = false, labels = true }
end

--- Why a session without an agent lacks what it lacks (sandbox.lua's refusals).
local REFUSALS = {
  fs = "an Azure session without an agent moves single files through the data plane, which cannot "
    .. "list, stat, remove, rename or carry directories; create the sandbox with agent = true",
  watch = "an Azure session without an agent has no way to watch its files; create the sandbox "
    .. "with agent = true",
  -- The data plane's sandboxes have an idle auto-suspend and no end: expires_at is nil here.
  set_lifetime = "an Azure sandbox has no lifetime to set; it runs until terminated "
    .. "(auto_suspend pauses an idle one)",
  stdin = "an Azure session without an agent runs commands through the data plane, which takes no "
    .. "input; create the sandbox with agent = true",
  pty = "an Azure session without an agent runs commands through the data plane, which has no "
    .. "terminal; create the sandbox with agent = true",
}

-- The provider -------------------------------------------------------------------------------

function azure.new(options)
  if type(options.group) ~= "string" or not options.group:match("^[%w%-_%.]+$") then
    return nil, errors.invalid_input("sandkit.sandbox", "group", "the azure provider needs group, a sandbox group name")
  end
  if type(options.image) ~= "string" or options.image == "" then
    return nil, errors.invalid_input("sandkit.sandbox", "image", "the azure provider needs image, a disk image name")
  end
  local declared, why = egress.check(options.egress)
  if not declared then return nil, errors.invalid_input("sandkit.sandbox", "egress", why) end
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
    refusals = REFUSALS,
    dataplane = dp,
    group = options.group,
    image = options.image,
    cpu = options.cpu or DEFAULTS.cpu,
    memory = options.memory or DEFAULTS.memory,
    egress_policy = egress.policy(declared),
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
  return capabilities((record.transport or sessions.transport_of(record)) == "agent")
end

-- Provider interface ---------------------------------------------------------------------------

function provider_mt:connection(record)
  local kind, err = record.transport, nil
  if kind == nil then kind, err = sessions.transport_of(record) end
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
  local refusal = session_labels.refuse_prefixed(opts.labels, op, "Azure")
  if refusal then return nil, refusal end
  local raw, err = self.dataplane:create_sandbox(self.group, {
    image = self.image, cpu = self.cpu, memory = self.memory,
    egress_policy = self.egress_policy,
    labels = session_labels.stored(opts.labels,
      self.agent and { [sessions.TRANSPORT_LABEL] = sessions.TRANSPORT_VERSION } or {}),
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
  if not ok then
    return nil, err and errors.wrap(op, "the session could not be stopped", err) or sessions.gone(op, record.id)
  end
  self.routes[record.id] = nil
  return true
end

--- Wakes the session, then waits for its agent, activating the new boot. When that fails, a
-- session this call woke is stopped again; none is ever deleted.
function provider_mt:resume(record)
  local op = "sandbox.resume"
  local id = record.id
  local raw, err = self:read(id, op)
  if not raw then return nil, err or sessions.gone(op, id) end
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

