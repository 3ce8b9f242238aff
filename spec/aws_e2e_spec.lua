-- The aws provider end to end: sandkit → the fake Lambda MicroVMs control plane → a real nginx
-- standing in for a MicroVM's endpoint proxy (TLS with a test CA, the minted token headers and
-- X-aws-proxy-port checked, 502 while a snapshot "restores") → a real sandkit-agent.
-- It needs nginx, openssl and sandkit-agent, and fails saying which is missing.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local http = require "sandkit.http"
local aws_control_plane = require "support.aws_control_plane"
local aws_endpoint_proxy = require "support.aws_endpoint_proxy"
local fs_roundtrip = require "support.fs_roundtrip"
local interactive_roundtrip = require "support.interactive_roundtrip"

local IMAGE = "arn:aws:lambda:us-east-1:123456789012:microvm-image:sbx"
--- Health probes the proxy answers 502 before the restore ends.
local RESTORE_502S = 3

local function hex(n)
  return (core.random(n):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function sandbox_for(cp, extra)
  local options = { provider = "aws", region = "us-east-1", image = IMAGE, image_version = "3",
    endpoint = cp.url, access_key_id = "AKIDEXAMPLE",
    secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
    header_timeout = 10, ready_timeout = 20, ready_interval = 0.05 }
  for k, v in pairs(extra or {}) do options[k] = v end
  return assert(sandkit.sandbox(options))
end

describe("an aws session end to end", function()
  local proxy, cp, token
  before_each(function()
    token = { ["X-aws-proxy-auth"] = hex(16), ["X-aws-proxy-token-id"] = hex(8) }
    proxy = aws_endpoint_proxy.start{ restoring = RESTORE_502S, token = token }
    cp = aws_control_plane.start{ auth_token = token,
      run = { microvmId = "mvm-e2e", endpoint = proxy.endpoint, publish_after = 2 },
      microvms = { ["mvm-live"] = { imageArn = IMAGE, state = "RUNNING", imageVersion = "3",
        endpoint = proxy.endpoint } } }
  end)
  after_each(function()
    if cp then cp:stop() cp = nil end
    if proxy then proxy:stop() proxy = nil end
  end)

  it("is created through the restore window's 502s and streams a command's frames through the proxy", function()
    local sandbox = sandbox_for(cp, { ca_file = proxy.ca_file })
    local session, err = sandbox:create{}
    assert(session, tostring(err) .. "\n" .. proxy:error_log())
    assert.equal("mvm-e2e", session.id)
    assert.equal("running", session.state)

    -- What nginx answered the readiness probes, from its own access log.
    local restore_502s = 0
    for _, entry in ipairs(proxy:access_log()) do
      if entry.status == 502 and entry.uri:match("^/v1/health") then
        restore_502s = restore_502s + 1
      end
    end
    assert.is_true(restore_502s >= RESTORE_502S,
      "the proxy really answered 502 while restoring (" .. restore_502s .. " seen)")
    assert.same({ "RunMicrovm", "GetMicrovm", "GetMicrovm", "CreateMicrovmAuthToken" },
      cp:operations(), "the endpoint was waited for, then one token served every probe")

    -- The command waits for a file the spec writes only once the first frame arrived: a proxy
    -- that buffered the stream would hold that frame back until the command's timeout.
    local go = proxy.root .. "/go"
    local argv = { "sh", "-c", "printf one; while [ ! -e '" .. go .. "' ]; do sleep 0.01; done; "
      .. "printf two >&2; exit 3" }
    local frames = {}
    for frame in session:run(argv, { timeout = 20 }) do
      frames[#frames + 1] = frame
      if frame.type == "stdout" and frame.data == "one" then
        local f = assert(io.open(go, "w"))
        f:close()
      end
    end
    assert.same({ type = "stdout", seq = 0, data = "one" }, frames[1])
    assert.same({ type = "stderr", seq = 1, data = "two" }, frames[2])
    assert.equal("exit", frames[3].type)
    assert.equal(3, frames[3].code)

    assert(session:write_files{ ["/notes/a.txt"] = "through the proxy\0and back" })
    assert.equal("through the proxy\0and back", assert(session:read_file("/notes/a.txt")))

    -- Each agent request read the record and minted its own token.
    local operations = cp:operations()
    assert.equal(1 + 3, #cp:calls_to("CreateMicrovmAuthToken"), "one mint per agent request")
    assert.equal("CreateMicrovmAuthToken", operations[#operations])

    assert.is_true(session:terminate())
    assert.equal(1, #cp:calls_to("TerminateMicrovm"))
  end)

  it("uses its files as a filesystem through the proxy, each request with its own minted token", function()
    local session = assert(sandbox_for(cp, { ca_file = proxy.ca_file }):create{})
    local src = fs_roundtrip.tree()
    finally(function() core.remove_tree(src) end)
    local before = #cp:calls_to("CreateMicrovmAuthToken")
    fs_roundtrip.check(fs_roundtrip.run(session, src, "/tree"), "/tree")
    assert.is_true(#cp:calls_to("CreateMicrovmAuthToken") > before + 10, "every request minted its token")
  end)

  it("runs interactive jobs through the proxy: input taken once, a terminal resized, a signal, live frames", function()
    local session = assert(sandbox_for(cp, { ca_file = proxy.ca_file }):create{})
    interactive_roundtrip.check(interactive_roundtrip.run(session))
  end)

  it("reaches the agent only with every minted header and the port header, never with a bearer", function()
    local url = "https://" .. proxy.endpoint .. "/v1/health?version=1"
    local function status(headers)
      local answer, failure = http.exchange{ method = "GET", url = url, headers = headers,
        ca_file = proxy.ca_file, deadline = core.now() + 10 }
      assert(answer, failure and failure.detail)
      return answer.status
    end
    local full = { ["X-aws-proxy-port"] = "8971" }
    for k, v in pairs(token) do full[k] = v end
    local without_port = {}
    for k, v in pairs(token) do without_port[k] = v end
    local as_bearer = { Authorization = "Bearer " .. token["X-aws-proxy-auth"], ["X-aws-proxy-port"] = "8971" }
    local bearer_too = { Authorization = "Bearer " .. token["X-aws-proxy-auth"] }
    for k, v in pairs(full) do bearer_too[k] = v end
    local other_port = {}
    for k, v in pairs(full) do other_port[k] = v end
    other_port["X-aws-proxy-port"] = "8080"
    assert.equal(403, status(without_port))
    assert.equal(403, status(as_bearer))
    assert.equal(403, status(bearer_too))
    assert.equal(403, status(other_port))
    assert.equal(502, status(full), "with everything, the proxy lets it through to the restore")
  end)

  it("refuses the proxy's certificate without the test CA, so nothing gets past TLS", function()
    local session = assert(sandbox_for(cp):get("mvm-live"))
    local bytes, err = session:read_file("/anything")
    assert.is_nil(bytes)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_false(err.sent, "the request never left this machine")
    assert.matches("certificate", err.message, 1, true)
    assert.same({}, proxy:access_log(), "no request got past TLS")
  end)
end)
