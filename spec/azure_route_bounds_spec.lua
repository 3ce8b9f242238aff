-- The azure agent route against agents that misbehave byte by byte: error bodies that are too
-- long, that stall, that never finish. Each is bounded in size and time, nothing is replayed,
-- and a stalled body holds up no other operation on the same session.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local protocol = require "sandkit.protocol"
local azure_dataplane = require "support.azure_dataplane"
local agents = require "support.azure_agents"
local azure_cqueues = require "support.azure_cqueues"
local compat = require "support.compat"

local token = azure_dataplane.token

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

--- One operation of each kind the rules tell apart: two that may start a command, one that
-- is safe to repeat. Returns what the protocol function returns.
local OPERATIONS = {
  ["sandbox.runCommand"] = function(conn) return protocol.exec(conn, { "true" }, { timeout = 5 }) end,
  ["sandbox.jobStart"] = function(conn) return protocol.job_start(conn, { "true" }, { timeout = 5 }) end,
  ["sandbox.readFile"] = function(conn) return protocol.read_file(conn, "/missing") end,
}
local OPERATION_ORDER = { "sandbox.runCommand", "sandbox.jobStart", "sandbox.readFile" }

local function expected_code(operation)
  return operation == "sandbox.readFile" and "SANDBOX_UNREACHABLE" or "SANDBOX_OUTCOME_UNKNOWN"
end

--- Every request the server received, whatever its path.
local function delivered(server)
  return #server:requests()
end

describe("an oversized error body", function()
  for _, status in ipairs{ "401 Unauthorized", "403 Forbidden", "404 Not Found", "500 Internal Server Error" } do
    for _, operation in ipairs(OPERATION_ORDER) do
      it(string.format("is cut at 4096 bytes and replays nothing (%s, %s)", status, operation), function()
        local server = start(string.format([[function(req, conn, respond)
          conn:write("HTTP/1.1 %s\r\nContent-Length: 100000\r\n\r\n" .. string.rep("x", 4097))
          conn:sleep(30)
        end]], status))
        local unauthorized = status:match("^401") ~= nil
        -- A 401 may check the credential, but no failure may replay the operation.
        local dp = azure_dataplane.new()
          :expect("get_sandbox", 0)
          :expect("agent_port_url", unauthorized and 1 or 0)
          :on("agent_port_url", function() return agents.url(server) end)
          :expect("read_file", unauthorized and 1 or 0):on("read_file", function() return token(7) end)
        local sb = agents.sandbox(dp)
        agents.cache_route(sb, "session", agents.url(server), token(7))

        local value, err = OPERATIONS[operation](agents.connection(sb, "session"))
        assert.is_nil(value)
        assert.matches("4096", tostring(err), 1, true)
        assert.equal(expected_code(operation), err.code)
        assert.equal(operation == "sandbox.readFile", err.retryable)
        assert.equal(1, delivered(server), "nothing is replayed")
        if not unauthorized then
          assert.is_nil(agents.cached(sb, "session"), "a body that may hide an answer drops the route")
        end
        dp:verify()
      end)
    end
  end
end)

describe("an unfinished 404 body", function()
  for _, disconnect in ipairs{ false, true } do
    it(string.format("is bounded in time and never replayed (%s)",
        disconnect and "the connection closes" or "the body stalls"), function()
      local server = start(string.format([[function(req, conn, respond)
        conn:write("HTTP/1.1 404 Not Found\r\nContent-Length: 100\r\n\r\nPATH_NOT_FOUND:")
        if %s then conn:close() else conn:sleep(30) end
      end]], tostring(disconnect)))
      local dp = azure_dataplane.new():expect("agent_port_url", 0)
      local sb = agents.sandbox(dp)
      agents.cache_route(sb, "session", agents.url(server), token(7))

      local started = core.now()
      local stream, err = protocol.exec(agents.connection(sb, "session"), { "true" }, { timeout = 5 })
      -- The bound is the behaviour: the error body gets 0.3 s, the server would stall for 30.
      assert.is_true(core.now() - started < 3 * agents.ERROR_BODY_TIMEOUT + 1,
        "an unfinished 404 must not hang the operation")
      assert.is_nil(stream)
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
      assert.is_false(err.retryable)
      assert.is_nil(agents.cached(sb, "session"))
      assert.equal(1, delivered(server))
      dp:verify()
    end)
  end
end)

describe("a stalled error body", function()
  for _, status in ipairs{ "403 Forbidden", "500 Internal Server Error" } do
    for _, operation in ipairs(OPERATION_ORDER) do
      it(string.format("is bounded in time, drops the route and replays nothing (%s, %s)", status, operation),
      function()
        local server = start(string.format([[function(req, conn, respond)
          conn:write("HTTP/1.1 %s\r\nContent-Length: 100\r\n\r\npartial error")
          conn:sleep(30)
        end]], status))
        local dp = azure_dataplane.new():expect("agent_port_url", 0)
        local sb = agents.sandbox(dp)
        agents.cache_route(sb, "session", agents.url(server), token(7))

        local started = core.now()
        local value, err = OPERATIONS[operation](agents.connection(sb, "session"))
        assert.is_true(core.now() - started < 3 * agents.ERROR_BODY_TIMEOUT + 1,
          "a stalled error body must not hang the operation")
        assert.is_nil(value)
        assert.equal(expected_code(operation), err.code)
        assert.equal(operation == "sandbox.readFile", err.retryable)
        assert.matches("body", tostring(err), 1, true)
        assert.is_nil(agents.cached(sb, "session"))
        assert.equal(1, delivered(server))
        dp:verify()
      end)
    end
  end
end)

--- A session whose cached route answers an exec with a 401 whose body never finishes, and
-- a file read at once; the route and its credential are already cached.
local function stalled_401_session(body_bound)
    local server = start([[function(req, conn, respond)
      if req.path == "/v1/exec" then
        conn:write("HTTP/1.1 401 Unauthorized\r\nContent-Length: 100\r\n\r\n")
        return conn:sleep(60)
      end
      if req.path == "/v1/files" then return respond.json(conn, "200 OK", { contentsBase64 = "b2s=" }) end
      respond.status(conn, "404 Not Found", "")
    end]])
    local dp = azure_dataplane.new()
      :expect("agent_port_url", 1):on("agent_port_url", function() return agents.url(server) end)
      :expect("read_file", 1):on("read_file", function() return token(7) end)
      :expect("get_sandbox", 0)
    local sb = agents.sandbox(dp, { header_timeout = 10, error_body_timeout = body_bound })
    agents.cache_route(sb, "session", agents.url(server), token(7))
    local conn = agents.connection(sb, "session")
  return server, dp, conn
end

describe("a 401 whose body stalls", function()
  it("does not hold up another operation on the same session, and is itself neither replayed nor unbounded", function()
    local body_bound = 1
    local server, dp, conn = stalled_401_session(body_bound)

    local first, second = {}, {}
    -- Both end within the first one's body bound plus a margin, or the spec fails.
    azure_cqueues.run(body_bound + 3, function()
      first.co = coroutine.running()
      first.value, first.err = protocol.exec(conn, { "true" }, { timeout = 5 })
      first.finished = core.now()
    end, function()
      -- Parked in its body read: its wait's deadline is the body's bound, not the header's.
      azure_cqueues.wait_for(function()
        local deadline = azure_cqueues.waiting[first.co]
        return deadline ~= nil and deadline - core.now() <= body_bound
      end, 5, "the first operation to read its 401 body")
      local started = core.now()
      second.value, second.err = protocol.read_file(conn, "/a")
      second.took = core.now() - started
      second.first_pending = first.finished == nil
    end)

    assert.equal("ok", second.value, tostring(second.err))
    assert.is_true(second.first_pending, "the second operation finished while the first was parked")
    assert.is_true(second.took < body_bound, "the second operation did not wait for the stalled body")
    assert.is_nil(first.value)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", first.err.code)
    assert.is_false(first.err.retryable)
    assert.equal(1, #server:requests_to("/v1/exec"), "the first operation must not replay")
    dp:verify()
  end)

  it("does not hold up another operation on the same session under sandkit.run either", function()
    local body_bound = 1
    local server, dp, conn = stalled_401_session(body_bound)

    local results = compat.pack(sandkit.run(function()
      local first = sandkit.spawn(protocol.exec, conn, { "true" }, { timeout = 5 })
      local second = sandkit.spawn(function()
        -- The first request was answered with its 401 headers before it was logged as read.
        azure_cqueues.wait_for(function() return #server:requests_to("/v1/exec") == 1 end, 5,
          "the first request to arrive")
        local started = core.now()
        local value, err = protocol.read_file(conn, "/a")
        return value, err, core.now() - started, first:done()
      end)
      local value, err, took, first_done = second:join()
      local first_value, first_err = first:join()
      return value, err, took, first_done, first_value, first_err
    end))
    assert.is_true(results[1], tostring(results[2]))
    local value, err, took, first_done, first_value, first_err = compat.unpack(results, 2, 7)

    assert.equal("ok", value, tostring(err))
    assert.is_false(first_done, "the second operation finished while the first was parked")
    assert.is_true(took < body_bound, "the second operation did not wait for the stalled body")
    assert.is_nil(first_value)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", first_err.code)
    assert.equal(1, #server:requests_to("/v1/exec"), "the first operation must not replay")
    dp:verify()
  end)
end)
