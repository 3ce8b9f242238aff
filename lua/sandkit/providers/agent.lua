--- The `agent` provider: one sandkit agent someone already runs, reached at `url` with a
-- bearer `token`. The agent is the session; its lifetime is not this provider's to manage,
-- so terminate, list, preview, pause/resume and snapshot are not offered.
--
--   sandkit.sandbox{ provider = "agent", url = "http://127.0.0.1:8971", token = "…",
--                    header_timeout = 60, grace = 60, command_timeout = nil,
--                    ready_timeout = 60, ca_file = nil }

local errors = require "sandkit.errors"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"

local agent = {}

--- The sandbox options this provider takes besides the common ones (sandkit.sandbox).
agent.OPTIONS = options_check.set{ "url", "token", "ready_timeout", "ca_file" }
--- The agent is one session, and its id only a name: the rule every provider's ids follow.
agent.ID = options_check.SESSION_ID

--- Flags of the `sandkit` command for this provider (see cli.lua).
agent.CLI_OPTIONS = {
  { flag = "url", arg = "URL", option = "url", help = "the agent's address, http(s)://host:port" },
  -- The token comes from a file (`secret_file`, read by cli.lua): `ps` shows argv to everyone.
  { flag = "token-file", arg = "FILE", option = "token", secret_file = true,
    help = "a file holding the agent's bearer token" },
}

local provider_mt = {}
provider_mt.__index = provider_mt

local CAPABILITIES = { files = true, jobs = true, reconnect = true, preview = false,
  pause_resume = false, snapshot = false, list = false, fs = true, watch = true, stdin = true,
  pty = true, set_lifetime = false, labels = false }

local transport_mt = {}
transport_mt.__index = transport_mt

function transport_mt:prepare(_, path)
  local headers = {}
  if self.token then headers.Authorization = "Bearer " .. self.token end
  return { url = self.base .. path, headers = headers, ca_file = self.ca_file }
end

function agent.new(options)
  local url = options.url
  if type(url) ~= "string" or not url:match("^https?://[^/]+") then
    return nil, errors.invalid_input("sandbox.create", "url",
      "the agent provider needs url = \"http(s)://host:port\"")
  end
  if options.token ~= nil and type(options.token) ~= "string" then
    return nil, errors.invalid_input("sandbox.create", "token", "token must be a string")
  end
  local ready_timeout, bad = options_check.seconds("sandkit.sandbox", options, "ready_timeout",
    readiness.DEFAULT_TIMEOUT)
  if bad then return nil, bad end
  local transport = setmetatable({ base = url:gsub("/+$", ""), token = options.token,
    ca_file = options.ca_file }, transport_mt)
  return setmetatable({
    name = "agent",
    options = options,
    transport = transport,
    conn = protocol.connection(transport, options),
    ready_timeout = ready_timeout,
  }, provider_mt)
end

function provider_mt:capabilities()
  return CAPABILITIES
end

--- Health-checks the agent (activating it when it asks) and describes it as a session.
function provider_mt:create(opts)
  local health, err = readiness.wait(self.conn, { timeout = self.ready_timeout })
  if not health then return nil, err end
  self.conn.features = health.features
  return { id = opts.id or "agent", state = "running", generation = 1, boot_id = health.bootId }
end

function provider_mt:get(id)
  return self:create{ id = id }
end

function provider_mt:list()
  return nil, errors.not_supported("sandbox.list", "the agent provider serves one agent")
end

function provider_mt:terminate()
  return nil, errors.not_supported("sandbox.terminate",
    "the agent provider does not own the agent's lifetime")
end

function provider_mt:connection()
  return self.conn
end

return agent
