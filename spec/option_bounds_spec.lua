-- Every timing option and every id of the public API crosses its bounds the same way: NaN,
-- infinity, zero and negatives (and, for whole numbers, fractions) are refused as INVALID_INPUT
-- naming the option, returned rather than raised, before anything is sent or started.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local agent_session = require "support.agent_session"
local files = require "support.files"
local tls = require "support.tls"

local NAN, INF = 0 / 0, math.huge
--- Seconds: more than none, and finite.
local BAD_SECONDS = { NAN, INF, -INF, 0, -1 }
--- Whole seconds: the same, and whole.
local BAD_WHOLE_SECONDS = { NAN, INF, 0, -1, 1.5 }
--- A count of bytes: none is one, but not less, nor a fraction.
local BAD_COUNT = { NAN, INF, -1, 1.5 }

--- A data plane that no refused call may reach.
local NO_CALLS = setmetatable({}, { __index = function(_, name)
  return function() error("the data plane was asked " .. name .. " for a refused call", 0) end
end })

--- The smallest options each provider is made with, sending nothing while it is made.
local function base_options(dir)
  return {
    ["local"] = { provider = "local", root = dir .. "/state" },
    agent = { provider = "agent", url = "http://127.0.0.1:1" },
    aws = { provider = "aws", region = "us-east-2", image = "arn:aws:lambda:us-east-2:1:microvm-image:x",
      image_version = "1", access_key_id = "AKIDEXAMPLE", secret_access_key = "secret" },
    azure = { provider = "azure", group = "group", image = "image", dataplane = NO_CALLS },
    kubernetes = { provider = "kubernetes", warm_pool = "pool", key_id = "k1", signing_key = dir .. "/key.pem",
      kubeconfig = dir .. "/kubeconfig" },
  }
end

--- The options of a sandbox each provider holds to seconds, to whole seconds, to a count.
local COMMON = { "header_timeout", "grace", "error_body_timeout", "body_timeout", "connect_timeout",
  "command_timeout" }
local OWN = {
  ["local"] = { seconds = { "ready_timeout" }, count = { "output_cap" } },
  agent = { seconds = { "ready_timeout" } },
  aws = { seconds = { "ready_timeout", "ready_interval", "api_timeout" },
    whole_seconds = { "idle_suspend_seconds", "max_lifetime_seconds" } },
  azure = { seconds = { "ready_timeout", "ready_interval", "create_timeout", "state_interval",
    "delete_timeout", "connect_timeout", "native_grace" }, whole_seconds = { "auto_suspend" } },
  kubernetes = { seconds = { "ready_timeout", "ready_interval", "api_timeout", "capability_lifetime" },
    whole_seconds = { "lifetime" } },
}

local function with(options, name, value)
  local copy = {}
  for k, v in pairs(options) do copy[k] = v end
  copy[name] = value
  return copy
end

local function assert_refused(field, value, ok, err)
  assert.is_nil(ok, field .. " = " .. tostring(value))
  assert.equal("INVALID_INPUT", err.code, field .. " = " .. tostring(value))
  assert.equal(field, err.field, tostring(err))
end

local dir, bases
setup(function()
  dir = files.temp_dir()
  tls.require_openssl()
  tls.run(dir, "openssl genpkey -algorithm ed25519 -out key.pem")
  -- An API server nobody runs: nothing here may need it.
  files.write(dir .. "/kubeconfig", [[
apiVersion: v1
kind: Config
current-context: c
contexts:
- name: c
  context: { cluster: k, user: u }
clusters:
- name: k
  cluster: { server: "http://127.0.0.1:1" }
users:
- name: u
  user: { token: "t" }
]])
  bases = base_options(dir)
end)
teardown(function() core.remove_tree(dir) end)

describe("a sandbox's timing options", function()
  it("are made without them by every provider, so each refusal below is the option's own", function()
    for name, options in pairs(bases) do
      assert(sandkit.sandbox(options), name)
    end
  end)

  for _, provider in ipairs{ "local", "agent", "aws", "azure", "kubernetes" } do
    it("are refused by the " .. provider .. " provider past every bound, naming the option", function()
      local kinds = { { COMMON, BAD_SECONDS }, { OWN[provider].seconds, BAD_SECONDS },
        { OWN[provider].whole_seconds or {}, BAD_WHOLE_SECONDS }, { OWN[provider].count or {}, BAD_COUNT } }
      for _, kind in ipairs(kinds) do
        for _, name in ipairs(kind[1]) do
          for _, value in ipairs(kind[2]) do
            assert_refused(name, value, sandkit.sandbox(with(bases[provider], name, value)))
          end
        end
      end
    end)
  end

  it("take keepalive from 0.1 to 3600 seconds, or false, and refuse the rest naming it, for every provider", function()
    for provider, options in pairs(bases) do
      for _, value in ipairs{ 0.1, 3600, 30, false } do
        assert(sandkit.sandbox(with(options, "keepalive", value)), provider .. " keepalive = " .. tostring(value))
      end
      for _, value in ipairs{ NAN, INF, 0, -1, 0.09, 3600.5, true, "30" } do
        assert_refused("keepalive", value, sandkit.sandbox(with(options, "keepalive", value)))
      end
    end
  end)

  it("of the Azure REST data plane are refused past every bound too", function()
    local rest = { provider = "azure", group = "group", image = "image", subscription = "sub",
      resource_group = "rg", region = "eastus2", token = "t" }
    assert(sandkit.sandbox(rest))
    for _, value in ipairs(BAD_SECONDS) do
      assert_refused("timeout", value, sandkit.sandbox(with(rest, "timeout", value)))
    end
  end)
end)

describe("a session's lifetime", function()
  it("is refused by create past every bound, and nothing is made", function()
    local cases = { ["local"] = { NAN, INF, 0, -1, 0.5 }, kubernetes = BAD_WHOLE_SECONDS }
    for provider, values in pairs(cases) do
      local sb = assert(sandkit.sandbox(bases[provider]))
      for _, value in ipairs(values) do
        assert_refused("lifetime", value, sb:create{ id = "life", lifetime = value })
      end
    end
    assert.same({}, core.listdir(dir .. "/state/sessions") or {}, "no local session was made")
  end)
end)

describe("a session id", function()
  --- Ids each provider refuses: none, one past the longest, and characters its ids never hold.
  local BAD_IDS = {
    ["local"] = { "", string.rep("a", 64), "a b", "../up" },
    agent = { "", string.rep("a", 64), "a/b" },
    aws = { "", string.rep("a", 257), "a\nb", "a\0b" },
    azure = { "", string.rep("a", 64), "a.b", "a b" },
    kubernetes = { "", string.rep("a", 64), "Upper", "-lead", "trail-", "under_score" },
  }

  for provider, ids in pairs(BAD_IDS) do
    it("is refused by every call of the " .. provider .. " provider that takes one, sending nothing", function()
      local sb = assert(sandkit.sandbox(bases[provider]))
      for _, id in ipairs(ids) do
        assert_refused("id", id, sb:create{ id = id })
        assert_refused("id", id, sb:get(id))
        assert_refused("id", id, sb:get_or_create{ id = id })
        assert_refused("id", id, sb:terminate(id))
      end
    end)
  end

  it("of the longest length is a local session's, read as absent", function()
    local sb = assert(sandkit.sandbox(bases["local"]))
    local session, err = sb:get(string.rep("a", 63))
    assert.is_nil(session)
    assert.is_nil(err)
  end)
end)

describe("a command's options", function()
  local session, server
  before_each(function()
    session, server = agent_session.open([[function(req, conn)
      if req.path == "/v1/jobs/start" then return respond.json(conn, "200 OK", { jobId = "j1" }) end
      respond.frames(conn, { '{"t":"exit","code":0}\n' }) end]], nil, { "jobIdempotency" })
  end)
  after_each(function() server:stop() end)

  local function raised(fn)
    local ok, err = pcall(fn)
    assert.is_false(ok)
    return nil, err
  end

  it("refuse a timeout past every bound in exec, stream, run and start_job, and send nothing", function()
    for _, value in ipairs(BAD_SECONDS) do
      local opts = { timeout = value }
      assert_refused("timeout", value, session:exec({ "true" }, opts))
      assert_refused("timeout", value, session:stream({ "true" }, opts))
      assert_refused("timeout", value, raised(function() for _ in session:run({ "true" }, opts) do end end))
      assert_refused("timeout", value, session:start_job({ "true" }, opts))
    end
    assert.equal(0, #server:requests_to("/v1/exec"))
    assert.equal(0, #server:requests_to("/v1/jobs/start"))
  end)

  it("refuse exec's max_output past every bound, and send nothing", function()
    for _, value in ipairs(BAD_COUNT) do
      assert_refused("max_output", value, session:exec({ "true" }, { timeout = 5, max_output = value }))
    end
    assert.equal(0, #server:requests_to("/v1/exec"))
  end)

  it("refuse a job id past its bounds, and send nothing", function()
    for _, id in ipairs{ "", string.rep("j", 65), "a b", "a/b" } do
      assert_refused("id", id, session:start_job({ "true" }, { timeout = 5, id = id }))
    end
    assert.equal(0, #server:requests_to("/v1/jobs/start"))
    assert(session:start_job({ "true" }, { timeout = 5, id = string.rep("j", 64) }), "the longest one goes")
  end)

  it("refuse a job poll's interval past every bound from the loop, and poll nothing", function()
    for _, value in ipairs(BAD_SECONDS) do
      assert_refused("interval", value, raised(function()
        for _ in session:job("j1"):frames{ interval = value } do end
      end))
    end
    assert.equal(0, #server:requests_to("/v1/jobs/poll"))
  end)
end)
