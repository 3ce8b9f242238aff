-- The azure provider's agent route: when a route is fetched, activated, kept, refreshed or
-- dropped. The data plane is a recording fake object (support/azure_dataplane); agents are real
-- local HTTP servers (support/fake_http) that record every request they receive.

local cjson = require "cjson"
local core = require "sandkit.core"
local protocol = require "sandkit.protocol"
local azure = require "sandkit.providers.azure"
local raw_http = require "support.raw_http"
local azure_dataplane = require "support.azure_dataplane"
local agents = require "support.azure_agents"

local token = azure_dataplane.token
local record = azure_dataplane.record

local servers
local function start(...)
  local server = agents.start(...)
  servers[#servers + 1] = server
  return server
end

before_each(function() servers = {} end)
after_each(function()
  for _, server in ipairs(servers) do server:stop() end
end)

local function count(server, path)
  return #server:requests_to(path)
end

local function frames_of(session, argv, opts)
  local items = {}
  for frame in session:run(argv, opts) do items[#items + 1] = frame end
  return items
end

--- Answers every activation with 204 and every exec with one exit frame.
local PLAIN_AGENT = [[function(req, conn, respond)
  if req.path == "/v1/activate" then return respond.status(conn, "204 No Content") end
  if req.path == "/v1/exec" then return respond.frames(conn, { '{"t":"exit","code":0}\n' }) end
  respond.status(conn, "404 Not Found", "")
end]]

describe("a fresh boot of a session's agent", function()
  local cases = {
    { cached = false, refused = false, resume = false },
    { cached = false, refused = true, resume = false },
    { cached = true, refused = false, resume = false },
    { cached = true, refused = true, resume = false },
    { cached = true, refused = false, resume = true },
    { cached = true, refused = true, resume = true },
  }
  for _, case in ipairs(cases) do
    local name = string.format(
      "is activated once with its own credential%s, and a refused activation is not retried (%s, %s)",
      case.cached and ", even behind an earlier boot's cached route that health still answers" or "",
      case.resume and "resume" or "get_or_create", case.refused and "refused" or "accepted")
    it(name, function()
      local fresh = token(4)
      local server = start(string.format([[function(req, conn, respond)
        local s = conn.state
        if req.path == "/v1/activate" then
          s.activations = (s.activations or 0) + 1
          return respond.status(conn, %q)
        elseif req.path == "/v1/health" then
          -- Health is public: an earlier boot's credential still gets 200.
          return respond.health(conn, { imageCommand = { status = "running" },
            status = (s.activations or 0) == 0 and "awaiting-network-verification" or "ready" })
        end
        respond.status(conn, "404 Not Found", "")
      end]], case.refused and "401 Unauthorized" or "204 No Content"))
      local dp = azure_dataplane.new()
        -- one read opens the session, one judges it again before its activation
        :expect("get_sandbox", 2):on("get_sandbox", function(_, _, id) return record(id) end)
        :expect("execute_shell_command", 0)
        :expect("agent_port_url", 1):on("agent_port_url", function() return agents.url(server) end)
        :expect("read_file", 1):on("read_file", function(_, _, _, path)
          assert.equal(azure.TOKEN_PATH, path)
          return fresh
        end)
      -- A binding whose new sessions are native still follows the session's own label.
      local sb = agents.sandbox(dp, { agent = false })
      if case.cached then agents.cache_route(sb, "session", agents.url(server), token(3)) end

      local started = core.now()
      local ok, err
      if case.resume then
        ok, err = sb.provider:resume({ id = "session" })
      else
        ok, err = sb:get_or_create{ id = "session" }
      end
      assert.is_true(core.now() - started < 5, "a cached route to a fresh boot must be refreshed, not waited out")

      if case.refused then
        assert.is_nil(ok)
        assert.equal("SANDBOX_COMMAND_FAILED", err.code)
        assert.is_false(err.retryable)
      else
        assert.is_truthy(ok, tostring(err))
      end
      local activations = server:requests_to("/v1/activate")
      assert.equal(1, #activations)
      assert.equal("Bearer " .. fresh, activations[1].headers.authorization)
      dp:verify()
    end)
  end
end)

describe("a resume whose activation fails", function()
  for _, wake in ipairs{ false, true } do
    for _, unknown in ipairs{ false, true } do
      local name = string.format("stops the session again only when it woke it, and never deletes it (%s, %s)",
        wake and "it was stopped" or "it was running",
        unknown and "unknown transport label" or "agent refuses activation")
      it(name, function()
        local server = start([[function(req, conn, respond)
          if req.path == "/v1/activate" then
            return respond.status(conn, "403 Forbidden", "SANDBOX_CAPABILITY_REFUSED: not this one")
          end
          respond.status(conn, "404 Not Found", "")
        end]])
        local dp = azure_dataplane.new()
          :on("get_sandbox", function(n, _, id)
            return record(id, {
              labels = unknown and { [azure.TRANSPORT_LABEL] = "unknown" } or nil,
              state = (wake and n <= 2) and "Stopped" or "Running" })
          end)
          :expect("resume_sandbox", wake and 1 or 0):on("resume_sandbox", function() return true end)
          :expect("stop_sandbox", wake and 1 or 0):on("stop_sandbox", function(_, group, id)
            assert.same({ "group", "session" }, { group, id })
            return true
          end)
          :expect("delete_sandbox", 0)
          :expect("agent_port_url", unknown and 0 or 1):on("agent_port_url", function() return agents.url(server) end)
          :expect("read_file", unknown and 0 or 1):on("read_file", function() return token(4) end)
        local sb = agents.sandbox(dp)

        local ok, err = sb.provider:resume({ id = "session" })
        assert.is_nil(ok)
        assert.equal("SANDBOX_COMMAND_FAILED", err.code)
        assert.equal(unknown and "agentTransportInvalid" or "agentRefused", err.failure)
        assert.is_false(err.retryable)
        dp:verify()
      end)
    end
  end
end)

describe("an agent session", function()
  it("runs its commands over the agent's route, never through native exec, whatever the binding's agent option",
  function()
    local secret = token(7)
    local server = start([[function(req, conn, respond)
      if req.path == "/v1/activate" then return respond.status(conn, "204 No Content") end
      if req.path == "/v1/exec" then
        return respond.frames(conn, { '{"t":"stdout","seq":0,"data":"b2s="}\n',
          '{"t":"exit","code":0,"truncated":false}\n' })
      end
      respond.status(conn, "404 Not Found", "")
    end]])
    local dp = azure_dataplane.new()
      :expect("execute_shell_command", 0)
      -- one read to open the session, one to judge it before its agent is activated
      :expect("get_sandbox", 2):on("get_sandbox", function(_, _, id) return record(id) end)
      :expect("agent_port_url", 1):on("agent_port_url", function(_, group, id, port)
        assert.same({ "group", "session", azure.AGENT_PORT }, { group, id, port })
        return agents.url(server)
      end)
      :expect("read_file", 1):on("read_file", function(_, group, id, path)
        assert.same({ "group", "session", azure.TOKEN_PATH }, { group, id, path })
        return secret
      end)
    local sb = agents.sandbox(dp, { agent = false })
    assert.is_false(sb:capabilities().jobs, "new sessions of this binding are native")

    local session = assert(sb:get("session"))
    assert.is_true(session:capabilities().jobs, "the existing agent session supports jobs")
    local frames = frames_of(session, { "echo", "a; $(false)" }, { timeout = 5 })
    assert.same({ { type = "stdout", seq = 0, data = "ok" },
      { type = "exit", code = 0, truncated = false } }, frames)

    local exec = server:requests_to("/v1/exec")
    assert.equal(1, #exec)
    assert.equal("Bearer " .. secret, exec[1].headers.authorization)
    local body = cjson.decode(exec[1].body)
    assert.same({ "echo", "a; $(false)" }, body.command)
    assert.equal(5000, body.timeoutMs)
    dp:verify()
  end)

  it("activates each new boot once, and replays a refused command only when its credential changed", function()
    local tokens = { [0] = token(0), [1] = token(1) }
    local server = start(string.format([[function(req, conn, respond)
      local s = conn.state
      local tokens = { [0] = %q, [1] = %q }
      s.generation = s.generation or 0
      s.refusal = s.refusal or 0
      s.activated = s.activated or -1
      s.activations = s.activations or 0
      s.executions = s.executions or 0
      local current = "Bearer " .. tokens[s.generation]
      if req.path == "/control" then
        local key, value = req.body:match("^(%%w+)=(%%d+)$")
        s[key] = tonumber(value)
        return respond.status(conn, "204 No Content")
      elseif req.path == "/state" then
        return respond.json(conn, "200 OK", { activations = s.activations, executions = s.executions })
      elseif req.path == "/v1/activate" then
        if req.headers.authorization ~= current then return respond.status(conn, "401 Unauthorized", "stale") end
        s.activated = s.generation + 1
        s.activations = s.activations + 1
        return respond.status(conn, "204 No Content")
      elseif req.path == "/v1/exec" then
        if req.headers.authorization ~= current or s.refusal == 1 then
          return respond.status(conn, "401 Unauthorized", "refused")
        end
        if s.activated ~= s.generation + 1 or s.refusal == 2 then
          return respond.status(conn, "503 Service Unavailable", "not activated")
        end
        s.executions = s.executions + 1
        return respond.frames(conn, { '{"t":"exit","code":0}\n' })
      end
      respond.status(conn, "404 Not Found", "")
    end]], tokens[0], tokens[1]))
    local function control(key, value)
      assert(raw_http.request(server.port, "POST", "/control", { body = key .. "=" .. value }))
    end
    local function state()
      return cjson.decode(assert(raw_http.request(server.port, "GET", "/state")).body)
    end
    local generation = 0
    local dp = azure_dataplane.new()
      :expect("execute_shell_command", 0)
      -- one read to open the session, one per activation
      :expect("get_sandbox", 3):on("get_sandbox", function(_, _, id) return record(id) end)
      :expect("agent_port_url", 3):on("agent_port_url", function() return agents.url(server) end)
      :expect("read_file", 3):on("read_file", function(_, _, _, path)
        assert.equal(azure.TOKEN_PATH, path)
        return tokens[generation]
      end)
    local session = assert(agents.sandbox(dp, { agent = false }):get("session"))

    for _, g in ipairs{ 0, 0, 1 } do
      generation = g
      control("generation", g)
      local result, err = session:exec({ "true" }, { timeout = 5 })
      assert.is_truthy(result, tostring(err))
      assert.equal(0, result.code)
    end
    assert.same({ activations = 2, executions = 3 }, state())

    control("refusal", 1)
    local result, refusal = session:exec({ "true" }, { timeout = 5 })
    assert.is_nil(result)
    assert.equal("SANDBOX_COMMAND_FAILED", refusal.code, "an unchanged credential stays refused")
    assert.is_false(refusal.retryable)

    control("refusal", 2)
    local unknown
    result, unknown = session:exec({ "true" }, { timeout = 5 })
    assert.is_nil(result)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", unknown.code, "a 5xx never replays a command")
    assert.same({ activations = 2, executions = 3 }, state())
    dp:verify()
  end)
end)

describe("a native session", function()
  it("does not advertise jobs through a binding whose new sessions use the agent", function()
    local dp = azure_dataplane.new()
      :expect("get_sandbox", 1):on("get_sandbox", function(_, _, id) return record(id, { labels = {} }) end)
      :expect("execute_shell_command", 0)
      :expect("agent_port_url", 0)
    local sb = agents.sandbox(dp, { agent = true })
    assert.is_true(sb:capabilities().jobs, "new sessions use the agent image")

    local session = assert(sb:get("native"))
    local caps = session:capabilities()
    assert.is_false(caps.jobs)
    assert.equal("none", caps.isolation)
    local job, err = session:start_job({ "true" }, { timeout = 5 })
    assert.is_nil(job)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    dp:verify()
  end)
end)

describe("a cached route", function()
  for _, connect_failure in ipairs{ false, true } do
    for _, replacement_missing in ipairs{ false, true } do
      local name = string.format("is refreshed once after %s, and %s",
        connect_failure and "a connect failure" or "an untyped 404",
        replacement_missing and "dropped when the replay fails too" or "the command runs once on the fresh one")
      it(name, function()
        local fresh = start(string.format([[function(req, conn, respond)
          if req.path == "/v1/activate" then return respond.status(conn, "204 No Content") end
          if req.path == "/v1/exec" then
            if %s then return respond.status(conn, "404 Not Found", "gone") end
            return respond.frames(conn, { '{"t":"exit","code":0}\n' })
          end
          respond.status(conn, "404 Not Found", "")
        end]], tostring(replacement_missing)))
        local stale_url
        if connect_failure then
          stale_url = agents.dead_url()
        else
          -- A proxy without a route: 404 with nothing of the agent's in it.
          stale_url = agents.url(start([[function(req, conn, respond) respond.status(conn, "404 Not Found", "") end]]))
        end
        local dp = azure_dataplane.new()
          :expect("execute_shell_command", 0)
          -- one read to open the session, one to judge it before the fresh route's activation
          :expect("get_sandbox", 2):on("get_sandbox", function(_, _, id) return record(id) end)
          :expect("agent_port_url", 1):on("agent_port_url", function() return agents.url(fresh) end)
          :expect("read_file", 1):on("read_file", function() return token(7) end)
        local sb = agents.sandbox(dp)
        local session = assert(sb:get("session"))
        -- An activated route goes stale when the provider moves the port.
        agents.cache_route(sb, "session", stale_url, token(7))

        local result, err = session:exec({ "true" }, { timeout = 5 })
        if replacement_missing then
          assert.is_nil(result, "a replacement 404 stops after one replay")
          assert.equal("SANDBOX_COMMAND_FAILED", err.code)
          assert.is_nil(agents.cached(sb, "session"), "a failed replay must not pin its route")
        else
          assert.is_truthy(result, tostring(err))
          assert.equal(0, result.code)
          assert.equal(fresh.url, agents.cached(sb, "session"))
        end
        assert.equal(1, count(fresh, "/v1/exec"))
        dp:verify()
      end)
    end
  end

  for _, timeout in ipairs{ false, true } do
    local name = string.format(
      "that may have delivered a command (%s) is not replayed, and the next command refreshes it",
      timeout and "no answer in time" or "connection closed after the request")
    it(name, function()
      local fresh = start(PLAIN_AGENT)
      -- The request reaches this server, and no answer reaches the caller.
      local stale = start(string.format([[function(req, conn, respond)
        if %s then conn:sleep(1) end
        conn:close()
      end]], tostring(timeout)))
      local dp = azure_dataplane.new()
        :expect("execute_shell_command", 0)
        -- one read to open the session, one to judge it before the fresh route's activation
        :expect("get_sandbox", 2):on("get_sandbox", function(_, _, id) return record(id) end)
        :expect("agent_port_url", 1):on("agent_port_url", function() return agents.url(fresh) end)
        :expect("read_file", 1):on("read_file", function() return token(7) end)
      local sb = agents.sandbox(dp, { header_timeout = 0.3 })
      local session = assert(sb:get("session"))
      agents.cache_route(sb, "session", agents.url(stale), token(7))

      local result, err = session:exec({ "true" }, { timeout = 5 })
      assert.is_nil(result, "delivery is ambiguous")
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
      assert.is_false(err.retryable)
      assert.equal(1, count(stale, "/v1/exec"))
      assert.equal(0, count(fresh, "/v1/exec"), "must not replay")

      result, err = session:exec({ "true" }, { timeout = 5 })
      assert.is_truthy(result, "the next command must refresh the route: " .. tostring(err))
      assert.equal(0, result.code)
      assert.equal(1, count(stale, "/v1/exec"))
      assert.equal(1, count(fresh, "/v1/exec"))
      dp:verify()
    end)
  end
end)

describe("a typed 404", function()
  for _, code in ipairs{ "PATH_NOT_FOUND", "JOB_NOT_FOUND" } do
    for _, stale_first in ipairs{ false, true } do
      local name = string.format("(%s) is the agent's answer: returned, route kept, nothing replayed%s",
        code, stale_first and ", also when a stale route's untyped 404 led to it" or "")
      it(name, function()
        local fresh = start(string.format([[function(req, conn, respond)
          if req.path == "/v1/activate" then return respond.status(conn, "204 No Content") end
          if req.path == "/v1/files" then return respond.status(conn, "404 Not Found", %q) end
          respond.status(conn, "404 Not Found", "")
        end]], code .. ": missing"))
        local stale = start([[function(req, conn, respond) respond.status(conn, "404 Not Found", "") end]])
        local dp = azure_dataplane.new()
          :expect("execute_shell_command", 0)
          :expect("get_sandbox", stale_first and 1 or 0):on("get_sandbox", function(_, _, id) return record(id) end)
          :expect("agent_port_url", stale_first and 1 or 0)
          :on("agent_port_url", function() return agents.url(fresh) end)
          :expect("read_file", stale_first and 1 or 0):on("read_file", function() return token(7) end)
        local sb = agents.sandbox(dp)
        agents.cache_route(sb, "session", agents.url(stale_first and stale or fresh), token(7))
        local conn = agents.connection(sb, "session")

        for expected_calls = 1, 2 do
          local bytes, err = protocol.read_file(conn, "/missing")
          assert.is_nil(bytes)
          assert.equal("SANDBOX_COMMAND_FAILED", err.code)
          assert.matches(code, tostring(err), 1, true)
          assert.is_false(err.retryable)
          assert.equal(expected_calls, count(fresh, "/v1/files"))
          assert.equal(fresh.url, agents.cached(sb, "session"), "a typed 404 keeps the route")
        end
        dp:verify()
      end)
    end
  end
end)

describe("a fetched route", function()
  local accepted = {
    "https://s1--8971.eastus2.adcproxy.io/",
    "https://s1--8971.eastus2.adcproxy.io",
    "https://agent.blue-sky.eastus.azurecontainerapps.io:443/",
  }
  local refused = {
    "http://s1--8971.eastus2.adcproxy.io/",
    "https://adcproxy.io/",
    "https://example.com/",
    "https://s1.adcproxy.io.example.com/",
    "https://user:pw@s1.adcproxy.io/",
    "https://s1.adcproxy.io/?a=b",
    "https://s1.adcproxy.io/#f",
    "https://s1.adcproxy.io/v1",
    "https://s1.adcproxy.io\\@example.com/",
    "http://127.0.0.1:8971/",
  }
  local function fetch(url, credential, options)
    local dp = azure_dataplane.new()
      :on("get_sandbox", function(_, _, id) return record(id) end)
      :on("agent_port_url", function() return url end)
      :on("read_file", function() return credential end)
    local sb = agents.sandbox(dp, options)
    local bytes, err = protocol.read_file(agents.connection(sb, "session"), "/a")
    return bytes, err, dp
  end

  for _, url in ipairs(accepted) do
    it("is used when it is a provider HTTPS origin: " .. url, function()
      local _, err, dp = fetch(url, "too short")
      assert.equal("agentTransportInvalid", err.failure, "the short credential is refused")
      assert.equal(1, dp:count("read_file"), "the credential was read for an acceptable URL")
    end)
  end

  for _, url in ipairs(refused) do
    it("is refused before its credential is read: " .. url, function()
      local _, err, dp = fetch(url, token(7), { allow_loopback_http = false })
      assert.equal("SANDBOX_COMMAND_FAILED", err.code)
      assert.equal("agentTransportInvalid", err.failure)
      assert.equal(0, dp:count("read_file"))
      assert.equal(0, dp:count("get_sandbox"), "nothing is activated")
    end)
  end

  local bad_credentials = {
    ["43 characters"] = token(7):sub(2),
    ["the 43 characters left without their padding"] = token(7):sub(1, 43),
    ["a trailing newline"] = token(7) .. "\n",
    ["44 characters that are not base64"] = string.rep("!", 44),
    ["44 characters decoding to 33 bytes"] = core.b64encode(string.rep("x", 33)),
    ["44 characters decoding to 31 bytes"] = core.b64encode(string.rep("x", 31)) .. "=",
  }
  for what, credential in pairs(bad_credentials) do
    it("is refused with a credential of " .. what, function()
      local _, err, dp = fetch(agents.dead_url(), credential)
      assert.equal("agentTransportInvalid", err.failure)
      assert.equal(0, dp:count("get_sandbox"), "nothing is activated")
    end)
  end

  it("whose refresh fails reports why instead of the failure that led to it", function()
    local fresh = start([[function(req, conn, respond)
      if req.path == "/v1/activate" then
        return respond.status(conn, "403 Forbidden", "SANDBOX_CAPABILITY_REFUSED: not this one")
      end
      respond.status(conn, "404 Not Found", "")
    end]])
    local dp = azure_dataplane.new()
      :on("get_sandbox", function(_, _, id) return record(id) end)
      :expect("agent_port_url", 1):on("agent_port_url", function() return agents.url(fresh) end)
      :expect("read_file", 1):on("read_file", function() return token(7) end)
    local sb = agents.sandbox(dp)
    agents.cache_route(sb, "session", agents.dead_url(), token(7))

    local bytes, err = protocol.read_file(agents.connection(sb, "session"), "/a")
    assert.is_nil(bytes)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code, tostring(err))
    assert.equal("agentRefused", err.failure)
    assert.equal("sandbox.readFile", err.operation)
    assert.equal("sandbox.activate", err.cause.operation)
    assert.is_nil(agents.cached(sb, "session"))
    dp:verify()
  end)
end)

describe("a session record", function()
  it("keeps a session's labels under label.sandkit.dev/ and reads back only those", function()
    local stored
    local dp = azure_dataplane.new()
      :expect("create_sandbox", 1):on("create_sandbox", function(_, _, spec)
        stored = spec.labels
        return { id = "labelled", state = "Creating" }
      end)
      :on("get_sandbox", function(_, _, id)
        local labels = { team = "someone else's" }
        for k, v in pairs(stored) do labels[k] = v end
        return record(id, { labels = labels })
      end)
      :expect("agent_port_url", 0)
    local sb = agents.sandbox(dp)
    assert.is_true(sb:capabilities().labels)
    local session = assert(sb:create{ labels = { team = "ml", run = "" } })
    assert.same({ ["label.sandkit.dev/team"] = "ml", ["label.sandkit.dev/run"] = "" }, stored)
    assert.same({ team = "ml", run = "" }, session.labels)
    assert.same({ team = "ml", run = "" }, assert(sb:get("labelled")).labels)
    local made, err = sb:create{ labels = { ["example.com/team"] = "ml" } }
    assert.is_nil(made)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches('"example.com/team"', err.message, 1, true)
    assert.is_false(sb:capabilities().set_lifetime)
    local ok
    ok, err = session:set_lifetime(60)
    assert.is_nil(ok)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.is_nil(session.expires_at)
    dp:verify()
  end)

  it("with an unknown transport label is refused, never read as native", function()
    local dp = azure_dataplane.new()
      :on("get_sandbox", function(_, _, id)
        return record(id, { labels = { [azure.TRANSPORT_LABEL] = "native-file-v2" } })
      end)
      :expect("execute_shell_command", 0)
      :expect("agent_port_url", 0)
    local session, err = agents.sandbox(dp):get("session")
    assert.is_nil(session)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("agentTransportInvalid", err.failure)
    dp:verify()
  end)

  it("whose effective egress is not the declared one is refused and left alone", function()
    local dp = azure_dataplane.new()
      :on("get_sandbox", function(_, _, id) return record(id, { egress = { mode = "allow" } }) end)
      :expect("delete_sandbox", 0)
    local session, err = agents.sandbox(dp):get("session")
    assert.is_nil(session)
    assert.equal("SANDBOX_NOT_AS_DECLARED", err.code)
    assert.equal("egress", err.restriction)
    dp:verify()
  end)

  it("matches the declared domain list whatever the order and case of its host rules", function()
    local declared = { mode = "allowDomains", domains = { "pypi.org", "*.github.com" } }
    local dp = azure_dataplane.new()
      :on("get_sandbox", function(_, _, id)
        return record(id, { egress_policy = { defaultAction = "deny", hostRules = {
          { pattern = "*.GitHub.com", action = "allow" }, { pattern = "pypi.org", action = "Allow" } } } })
      end)
    assert.is_truthy(agents.sandbox(dp, { egress = declared }):get("session"))
  end)

  it("made by create and not enforcing the declared egress is deleted and refused", function()
    local dp = azure_dataplane.new()
      :expect("create_sandbox", 1):on("create_sandbox", function(_, group, spec)
        assert.equal("group", group)
        assert.same(azure.egress_policy(), spec.egress_policy)
        assert.same(azure_dataplane.AGENT_LABELS, spec.labels)
        return { id = "made", state = "Creating" }
      end)
      :on("get_sandbox", function(_, _, id) return record(id, { egress = { mode = "allow" } }) end)
      :expect("delete_sandbox", 1):on("delete_sandbox", function(_, _, id)
        assert.equal("made", id)
        return true
      end)
      :expect("agent_port_url", 0)
    local session, err = agents.sandbox(dp, { agent = true }):create{}
    assert.is_nil(session)
    assert.equal("SANDBOX_NOT_AS_DECLARED", err.code)
    dp:verify()
  end)

  it("of a create that never runs is deleted, and the failure says so", function()
    local dp = azure_dataplane.new()
      :on("create_sandbox", function() return { id = "made", state = "Creating" } end)
      :on("get_sandbox", function(_, _, id) return record(id, { state = "Failed" }) end)
      :expect("delete_sandbox", 1):on("delete_sandbox", function() return true end)
    local session, err = agents.sandbox(dp):create{}
    assert.is_nil(session)
    assert.equal("sandboxGone", err.failure)
    dp:verify()
  end)
end)
