-- Waiting until an agent can serve (lua/sandkit/readiness.lua), against a fake agent whose
-- health answers are scripted one probe at a time. The rules are the original's: ready is
-- protocol version 1, status "ready" and an image command that has not failed; every other
-- answer is waited through until the deadline, which names the last one seen.

local sandkit = require "sandkit"
local fake_http = require "support.fake_http"
local protocol = require "sandkit.protocol"
local readiness = require "sandkit.readiness"

--- A fake agent whose n-th health probe gets answers[n] (the last one for ever after). Each
-- answer is the Lua source of a call to respond.
local function scripted(answers)
  return fake_http.start("local respond = require 'support.respond'\nlocal answers = {\n"
    .. table.concat(answers, ",\n") .. "\n}\n" .. [[
    return { handle = function(req, conn)
      if req.path == "/v1/activate" then return respond.status(conn, "204 No Content", "") end
      conn.state.probes = (conn.state.probes or 0) + 1
      local answer = answers[math.min(conn.state.probes, #answers)]
      answer(conn)
    end }]])
end

local function answer(source)
  return "function(conn) " .. source .. " end"
end

local READY = answer("respond.health(conn)")

local function connection(server)
  return protocol.connection({ prepare = function(_, _, path)
    return { url = server.url .. path, headers = {} }
  end }, { header_timeout = 2 })
end

describe("waiting for an agent to be ready", function()
  local server
  after_each(function() if server then server:stop() end server = nil end)

  it("waits through every answer that is not ready until one is", function()
    server = scripted{
      -- An endpoint proxy whose token is still propagating.
      answer([[respond.status(conn, "403 Forbidden", "Forbidden")]]),
      -- A page that is not the agent's.
      answer([[respond.status(conn, "200 OK", "<html>starting</html>", "text/html")]]),
      answer([[respond.health(conn, { protocolVersion = 2 })]]),
      answer([[respond.json(conn, "200 OK", { protocolVersion = 1, bootId = "b" })]]),
      answer([[respond.health(conn, { status = require("cjson").null })]]),
      answer([[respond.health(conn, { status = "starting" })]]),
      answer([[respond.health(conn, { imageCommand = { status = "failed" } })]]),
      answer([[respond.status(conn, "502 Bad Gateway", "")]]),
      READY,
    }
    local health = assert(readiness.wait(connection(server), { timeout = 10, interval = 0.01 }))
    assert.equal("ready", health.status)
    assert.equal(9, #server:requests_to("/v1/health"), "each answer was waited through, once")
  end)

  it("counts as ready only protocol version 1, status ready and an image command not failed", function()
    server = scripted{ answer([[respond.json(conn, "200 OK", { protocolVersion = 1, bootId = "b" })]]) }
    local health, err = readiness.wait(connection(server), { timeout = 0.3, interval = 0.01 })
    assert.is_nil(health, "a health answer without a status is not ready")
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.matches("did not become ready within 0.3s; last seen: a health answer without a status",
      err.message, 1, true)
    server:stop()
    server = scripted{ answer([[respond.health(conn, { imageCommand = { status = "running" } })]]) }
    assert(readiness.wait(connection(server), { timeout = 5, interval = 0.01 }))
  end)

  it("names at the deadline the last answer it saw", function()
    for _, case in ipairs{
      { answer([[respond.status(conn, "403 Forbidden", "token not yet valid")]]), "returned 403: token not yet valid" },
      { answer([[respond.status(conn, "200 OK", "<html></html>", "text/html")]]), "not a JSON object" },
      { answer([[respond.health(conn, { protocolVersion = 2 })]]), "protocol version 2" },
      { answer([[respond.health(conn, { imageCommand = { status = "failed" } })]]), "image command failed" },
    } do
      server = scripted{ case[1] }
      local health, err = readiness.wait(connection(server), { timeout = 0.3, interval = 0.01,
        operation = "sandbox.create" })
      assert.is_nil(health)
      assert.equal("SANDBOX_UNREACHABLE", err.code)
      assert.matches("sandbox.create: the agent did not become ready within 0.3s; last seen: ", err.message, 1,
        true)
      assert.matches(case[2], err.message, 1, true)
      server:stop()
      server = nil
    end
  end)

  it("stops at once where asking again cannot change the answer: a refused activation", function()
    server = fake_http.start([[local respond = require 'support.respond'
      return { handle = function(req, conn)
        if req.path == "/v1/activate" then return respond.status(conn, "401 Unauthorized", "no") end
        respond.health(conn, { status = "awaiting-network-verification" })
      end }]])
    local health, err = readiness.wait(connection(server), { timeout = 30, interval = 0.01 })
    assert.is_nil(health)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal(1, #server:requests_to("/v1/activate"), "a refused activation is not repeated")
  end)

  it("is what the agent provider's create waits for", function()
    server = scripted{ answer([[respond.status(conn, "403 Forbidden", "Forbidden")]]), READY }
    local sb = assert(sandkit.sandbox{ provider = "agent", url = server.url, token = "t", ready_timeout = 10 })
    assert(sb:create{ id = "s" })
    assert.equal(2, #server:requests_to("/v1/health"))
  end)
end)
