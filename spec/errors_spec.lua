-- A request without a whole answer becomes an error in one place (sandkit.errors): one rule
-- (could it have run, and may it be sent again), one wording of each way a transport fails, one
-- Retry-After parser, and the agent protocol and the AWS, Azure and Kubernetes clients saying
-- the same failure the same way.

local errors = require "sandkit.errors"
local fake_http = require "support.fake_http"
local protocol = require "sandkit.protocol"
local microvms = require "sandkit.providers.aws.microvms"
local dataplane = require "sandkit.providers.azure.dataplane"
local api = require "sandkit.providers.kubernetes.api"

local function found(text, needle) return text:find(needle, 1, true) ~= nil end

describe("a transport failure", function()
  local SAID = { peer = "the peer", seconds = 2.5, bytes = 4096 }

  it("that never left is SANDBOX_UNREACHABLE and may be sent again, even a request sent once", function()
    for _, failure in ipairs{ { kind = "refused", sent = false, detail = "connection refused" },
        { kind = "timeout", sent = false } } do
      for _, once in ipairs{ true, false } do
        local err = errors.transport_failure("op", failure, once, SAID)
        assert.equal("SANDBOX_UNREACHABLE", err.code, failure.kind)
        assert.is_true(err.retryable)
        assert.is_false(err.sent)
        assert.equal("op", err.operation)
      end
    end
  end)

  it("that may have been delivered has an unknown outcome when sent once, and is retryable otherwise", function()
    for _, failure in ipairs{ { kind = "timeout", sent = true }, { kind = "failed", sent = true, detail = "reset" },
        { kind = "too_long", sent = true, status = 500 }, { kind = "stalled", sent = true, status = 403 },
        { kind = "failed", sent = true, status = 200, detail = "cut" } } do
      local unknown = errors.transport_failure("op", failure, true, SAID)
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", unknown.code, failure.kind)
      assert.is_false(unknown.retryable)
      assert.is_true(found(unknown.message, "may have taken effect"), unknown.message)
      assert.equal(failure.status, unknown.status)
      local repeatable = errors.transport_failure("op", failure, false, SAID)
      assert.equal("SANDBOX_UNREACHABLE", repeatable.code, failure.kind)
      assert.is_true(repeatable.retryable)
    end
  end)

  it("is said one way for each kind, naming the peer and the bound that ran out", function()
    local cases = {
      { { kind = "refused", sent = false, detail = "connection refused" },
        "the request never reached the peer: connection refused" },
      { { kind = "timeout", sent = false }, "the request did not reach the peer within 2.5s" },
      { { kind = "timeout", sent = true }, "the peer did not answer within 2.5s" },
      { { kind = "failed", sent = true, detail = "reset" }, "the connection failed before the peer answered: reset" },
      { { kind = "too_long", sent = true, status = 500 }, "the peer answered 500 and its body exceeded 4096 bytes" },
      { { kind = "stalled", sent = true, status = 403 },
        "the peer answered 403 and its body stalled: not complete within 2.5s" },
      { { kind = "failed", sent = true, status = 200, detail = "cut" },
        "the peer answered 200 and its body could not be read: cut" },
    }
    for _, c in ipairs(cases) do
      assert.equal(c[2], errors.transport_reason(c[1], SAID))
    end
    local err = errors.transport_failure("op", cases[3][1], false,
      { peer = "the peer", seconds = 1, context = "the poll's body could not be read" })
    assert.equal("op went unanswered: the poll's body could not be read: the peer did not answer within 1s",
      err.message)
  end)

  it("takes `once` from the agent protocol's operation when the caller does not say", function()
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", errors.unanswered("sandbox.runCommand", "lost").code)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", errors.unanswered("sandbox.jobStart", "lost").code)
    assert.equal("SANDBOX_UNREACHABLE", errors.unanswered("sandbox.readFile", "lost").code)
    -- The protocol reads a failed connection as unanswered like any other (docs/protocol.md §4).
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", errors.unanswered("sandbox.runCommand", "lost", { sent = false }).code)
    assert.equal("SANDBOX_UNREACHABLE", errors.unanswered("azure.createSandbox", "lost", { sent = false }, true).code)
    assert.equal("SANDBOX_UNREACHABLE", errors.unanswered("azure.createSandbox", "lost", nil, false).code)
  end)
end)

describe("a Retry-After header", function()
  it("is read as whole seconds, up to nine digits, and nothing else is", function()
    assert.equal(3, errors.retry_after("3"))
    assert.equal(3, errors.retry_after(" 3 "))
    assert.equal(0, errors.retry_after("0"))
    assert.equal(999999999, errors.retry_after("999999999"))
    for _, text in ipairs{ "1000000000", "3.5", "-1", "0x10", "1e3", "", "soon",
        "Wed, 21 Oct 2015 07:28:00 GMT" } do
      assert.is_nil(errors.retry_after(text), text)
    end
    assert.is_nil(errors.retry_after(nil))
  end)
end)

describe("every client", function()
  -- A port nothing listens on, and a server that takes every request and never answers.
  local closed_url, silent
  setup(function()
    local closed = fake_http.start([[return { handle = function() end }]])
    closed_url = closed.url
    closed:stop()
    silent = fake_http.start([[return { handle = function(req, conn) conn:sleep(30) end }]])
  end)
  teardown(function() silent:stop() end)

  local BOUND = 0.3

  --- Each client's call that may start something, to `url`, as { peer, error }.
  local function calls(url)
    local agent = protocol.connection({ prepare = function(_, _, path) return { url = url .. path } end },
      { header_timeout = BOUND })
    local _, agent_err = protocol.exec(agent, { "true" }, { timeout = 5 })
    local aws = assert(microvms.new{ region = "us-east-2", endpoint = url, timeout = BOUND,
      access_key_id = "AKIDEXAMPLE", secret_access_key = "secret" })
    local _, aws_err = aws:run{ image_identifier = "image", image_version = "1", client_token = "t" }
    local azure = assert(dataplane.new{ subscription = "sub", resource_group = "rg", endpoint = url,
      token = "token", timeout = BOUND })
    local _, azure_err = azure:create_sandbox("group", { image = "image" })
    local kube = api.new({ server = url, auth = { fields = function() return { headers = {} } end } },
      { timeout = BOUND })
    local _, kube_err = kube:call{ operation = "sandbox.create", verb = "create", resource = "sandboxclaims",
      namespace = "ns", name = "s1", method = "POST", path = "/claims", body = {}, once = true }
    return { { "the agent", agent_err }, { "AWS Lambda", aws_err }, { "the Azure data plane", azure_err },
      { "the Kubernetes API server", kube_err } }
  end

  it("says a request that never connected never reached its peer, and a cloud's call may be sent again", function()
    for _, c in ipairs(calls(closed_url)) do
      local peer, err = c[1], c[2]
      -- The agent's command start keeps the protocol's one code for every unanswered start.
      local command_start = peer == "the agent"
      assert.equal(command_start and "SANDBOX_OUTCOME_UNKNOWN" or "SANDBOX_UNREACHABLE", err.code, peer)
      assert.equal(not command_start, err.retryable, peer)
      assert.is_false(err.sent, peer)
      assert.is_true(found(err.message, "the request never reached " .. peer .. ": "), err.message)
    end
  end)

  it("says a request taken and never answered may have taken effect, naming its bound", function()
    for _, c in ipairs(calls(silent.url)) do
      local peer, err = c[1], c[2]
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code, peer)
      assert.is_false(err.retryable, peer)
      assert.is_true(found(err.message, "may have taken effect"), err.message)
      assert.is_true(found(err.message, peer .. " did not answer within 0.3s"), err.message)
    end
  end)
end)
