-- The REST client of the Azure Container Apps sandbox data plane against a fake data plane
-- (support/fake_http) that speaks its JSON and records every request.

local cjson = require "cjson"
local raw_http = require "support.raw_http"
local dataplane = require "sandkit.providers.azure.dataplane"
local agents = require "support.azure_agents"

local GROUP = "/subscriptions/sub-1/resourceGroups/rg-1/sandboxGroups/group"
local SANDBOXES = GROUP .. "/sandboxes"

--- The fake data plane: sandboxes sb-1 (agent port exposed) and sb-2 (not yet); every other
-- id is absent. conn.state counts connections, so fresh connections can be told from reuse.
local DATA_PLANE = [[function(req, conn, respond)
  local s = conn.state
  local base = "]] .. SANDBOXES .. [["
  if req.path == "/state" then return respond.json(conn, "200 OK", { connections = s.connections }) end
  if req.path:sub(1, #base) ~= base then return respond.status(conn, "400 Bad Request", "not a group path") end
  local key = req.method .. " " .. req.path:sub(#base + 1)
  local function sandbox(id, ports)
    return { id = id, state = "Running", labels = { alienAgentTransport = "native-file-v1", team = "x" },
      egressPolicy = { defaultAction = "Deny" }, ports = ports, vmmType = "cloudhypervisor" }
  end
  local port = { port = 8971, url = "https://sb-1--8971.eastus2.adcproxy.io", auth = { anonymous = true } }
  if key == "GET /sb-1" then return respond.json(conn, "200 OK", sandbox("sb-1", { port })) end
  if key == "GET /sb-2" then return respond.json(conn, "200 OK", sandbox("sb-2", {})) end
  if key == "POST /sb-2/ports/add" then
    return respond.json(conn, "200 OK", { ports = { { port = 8971, url = "https://sb-2--8971.eastus2.adcproxy.io" } } })
  end
  if key == "PUT " then return respond.json(conn, "201 Created", { id = "new-1", state = "Creating" }) end
  if key == "DELETE /sb-1" then return respond.status(conn, "204 No Content") end
  if key == "POST /sb-1/stop" or key == "POST /sb-1/resume" then return respond.status(conn, "202 Accepted") end
  if key == "GET /sb-1/files" then return respond.status(conn, "200 OK", "file\0bytes", "application/octet-stream") end
  if key == "PUT /sb-1/files" or key == "POST /sb-1/files/mkdir" then return respond.status(conn, "204 No Content") end
  if key == "POST /sb-1/executeShellCommand" then
    return respond.json(conn, "200 OK", { stdout = "out", stderr = "err", exitCode = 3 })
  end
  if key == "GET /throttled" then
    return conn:write("HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 0\r\n\r\n")
  end
  if key == "GET /broken" or key == "POST /broken/stop" then
    return respond.json(conn, "503 Service Unavailable", { error = { code = "Busy", message = "try later" } })
  end
  if key == "GET /forbidden" then
    return respond.json(conn, "403 Forbidden", { error = { code = "AuthorizationFailed", message =
      "The client 'principal-9' with object id 'oid-1' lacks the role" .. string.rep(" and more", 60) } })
  end
  respond.json(conn, "404 Not Found", { error = { code = "NotFound", message = "no such sandbox" } })
end]]

local COUNT_CONNECTIONS = [[function(conn) conn.state.connections = (conn.state.connections or 0) + 1 end]]

local server
before_each(function() server = agents.start(DATA_PLANE, COUNT_CONNECTIONS) end)
after_each(function() server:stop() end)

local function client(options)
  local o = { subscription = "sub-1", resource_group = "rg-1", endpoint = server.url, token = "tok-1" }
  for k, v in pairs(options or {}) do o[k] = v end
  return assert(dataplane.new(o))
end

local function last_request()
  local all = server:requests()
  return all[#all]
end

local function connections()
  return cjson.decode(assert(raw_http.request(server.port, "GET", "/state")).body).connections
end

describe("the Azure data-plane client", function()
  it("reads a sandbox at its group path with the api-version and the bearer token", function()
    local record = assert(client():get_sandbox("group", "sb-1"))
    assert.equal("sb-1", record.id)
    assert.equal("Running", record.state)
    assert.same({ alienAgentTransport = "native-file-v1", team = "x" }, record.labels)
    assert.same({ defaultAction = "Deny" }, record.egress_policy)
    local req = last_request()
    assert.equal("GET", req.method)
    assert.equal(SANDBOXES .. "/sb-1", req.path)
    assert.equal("api-version=2026-02-01-preview", req.query)
    assert.equal("Bearer tok-1", req.headers.authorization)
  end)

  it("sends the api-version it is configured with", function()
    assert(client{ api_version = "2027-01-01" }:get_sandbox("group", "sb-1"))
    assert.equal("api-version=2027-01-01", last_request().query)
  end)

  it("asks a token function for the dynamicsessions scope on every call", function()
    local scopes = {}
    local dp = client{ token = function(scope)
      scopes[#scopes + 1] = scope
      return "fresh-" .. #scopes
    end }
    assert(dp:get_sandbox("group", "sb-1"))
    assert(dp:get_sandbox("group", "sb-1"))
    assert.same({ "https://dynamicsessions.io/.default", "https://dynamicsessions.io/.default" }, scopes)
    assert.equal("Bearer fresh-2", last_request().headers.authorization)
  end)

  it("keeps a failing token source's words out of tenant-facing text and sends nothing", function()
    local record, err = client{ token = function() return nil, "vault said: secret-ish detail" end }
      :get_sandbox("group", "sb-1")
    assert.is_nil(record)
    assert.is_true(err.internal)
    assert.equal("Internal server error", err:external().message)
    assert.equal(0, #server:requests())
  end)

  it("reads a 404 as absent", function()
    local record, err = client():get_sandbox("group", "gone")
    assert.is_nil(record)
    assert.is_nil(err)
    local deleted
    deleted, err = client():delete_sandbox("group", "gone")
    assert.is_nil(deleted)
    assert.is_nil(err)
  end)

  it("creates a sandbox with the documented body and reads back its id", function()
    local record = assert(client():create_sandbox("group", {
      image = "sandkit-agent-image", cpu = "1000m", memory = "2048Mi",
      egress_policy = { defaultAction = "Deny", hostRules = { { pattern = "pypi.org", action = "Allow" } } },
      labels = { alienAgentTransport = "native-file-v1" }, environment = { K = "V" }, auto_suspend = 300 }))
    assert.equal("new-1", record.id)
    assert.equal("Creating", record.state)
    local req = last_request()
    assert.equal("PUT", req.method)
    assert.equal(SANDBOXES, req.path)
    assert.equal("application/json", req.headers["content-type"])
    assert.same({
      sourcesRef = { diskImage = { name = "sandkit-agent-image", isPublic = true } },
      resources = { cpu = "1000m", memory = "2048Mi" },
      egressPolicy = { defaultAction = "Deny", hostRules = { { pattern = "pypi.org", action = "Allow" } } },
      labels = { alienAgentTransport = "native-file-v1" },
      environment = { K = "V" },
      lifecycle = { autoSuspendPolicy = { enabled = true, interval = 300, mode = "Memory" } },
    }, cjson.decode(req.body))
  end)

  it("sends every create on a fresh connection, and lets reads share one", function()
    local dp = client()
    assert(dp:get_sandbox("group", "sb-1"))
    assert(dp:get_sandbox("group", "sb-1"))
    -- Each look at the count opens a connection of its own, counted with the rest.
    local after_reads = connections()
    assert.equal(2, after_reads, "the two reads shared one connection")
    assert(dp:create_sandbox("group", { image = "i", cpu = "1", memory = "1" }))
    assert(dp:create_sandbox("group", { image = "i", cpu = "1", memory = "1" }))
    assert.equal(after_reads + 2 + 1, connections(), "each create took a connection of its own")
  end)

  it("reports a create whose answer was lost as an unknown outcome, sent once", function()
    local lost = agents.start([[function(req, conn, respond) conn:close() end]])
    local record, err = client{ endpoint = lost.url }:create_sandbox("group", { image = "i", cpu = "1", memory = "1" })
    local sent = #lost:requests()
    lost:stop()
    assert.is_nil(record)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
    assert.equal(1, sent)
  end)

  it("reports a read that never connected as unreachable and safe to retry", function()
    local record, err = client{ endpoint = agents.dead_url():gsub("/$", "") }:get_sandbox("group", "sb-1")
    assert.is_nil(record)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_true(err.retryable)
  end)

  it("classifies refusals: throttling, a 5xx on a read and on a state change, an authorization failure", function()
    local dp = client()
    local _, throttled = dp:get_sandbox("group", "throttled")
    assert.equal("RATE_LIMIT_EXCEEDED", throttled.code)
    assert.equal(7, throttled.retry_after)
    assert.is_true(throttled.retryable)

    local _, busy = dp:get_sandbox("group", "broken")
    assert.equal("SANDBOX_UNREACHABLE", busy.code)
    assert.equal(503, busy.status)
    assert.matches("try later", busy.message, 1, true)

    local _, stopping = dp:stop_sandbox("group", "broken")
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", stopping.code, "a stop is sent once: a 5xx leaves it unknown")

    local _, denied = dp:get_sandbox("group", "forbidden")
    assert.equal("SANDBOX_COMMAND_FAILED", denied.code)
    assert.equal(403, denied.status)
    assert.is_false(denied.retryable)
    assert.is_true(denied.internal, "it names a principal")
    assert.matches("principal-9", denied.message, 1, true)
    assert.is_true(#denied.message < 500, "the service's text is clipped")
  end)

  it("finds the agent port's URL, adding the port without proxy authentication when it is not exposed", function()
    local dp = client()
    assert.equal("https://sb-1--8971.eastus2.adcproxy.io", dp:agent_port_url("group", "sb-1", 8971))
    assert.equal(0, #server:requests_to(SANDBOXES .. "/sb-1/ports/add"))
    assert.equal("https://sb-2--8971.eastus2.adcproxy.io", dp:agent_port_url("group", "sb-2", 8971))
    local add = server:requests_to(SANDBOXES .. "/sb-2/ports/add")
    assert.equal(1, #add)
    assert.same({ port = 8971, auth = { anonymous = true } }, cjson.decode(add[1].body))
    local url, err = dp:agent_port_url("group", "gone", 8971)
    assert.is_nil(url)
    assert.is_nil(err)
  end)

  it("reads, writes and makes files with the path in the query", function()
    local dp = client()
    assert.equal("file\0bytes", dp:read_file("group", "sb-1", "/run/sandkit/agent token"))
    assert.equal("api-version=2026-02-01-preview&path=/run/sandkit/agent%20token", last_request().query)

    assert.is_true(dp:write_file("group", "sb-1", "/app/a&b.txt", "raw\0"))
    local put = last_request()
    assert.equal("PUT", put.method)
    assert.equal(SANDBOXES .. "/sb-1/files", put.path)
    assert.equal("api-version=2026-02-01-preview&path=/app/a%26b.txt&createDirs=true", put.query)
    assert.equal("application/octet-stream", put.headers["content-type"])
    assert.equal("raw\0", put.body)

    assert.is_true(dp:mkdir("group", "sb-1", "/app/build"))
    assert.same({ path = "/app/build" }, cjson.decode(last_request().body))
    assert.equal(SANDBOXES .. "/sb-1/files/mkdir", last_request().path)
  end)

  it("refuses a file over 32 MiB before sending it", function()
    local ok, err = client():write_file("group", "sb-1", "/big", string.rep("x", 32 * 1024 * 1024 + 1))
    assert.is_nil(ok)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal(0, #server:requests())
  end)

  it("runs a shell command and reads its output and integer exit code", function()
    local result = assert(client():execute_shell_command("group", "sb-1", "echo hi", "/app", { timeout = 5 }))
    assert.same({ stdout = "out", stderr = "err", exit_code = 3 }, result)
    -- Where numbers have subtypes (Lua 5.4), an integer, not 3.0.
    if math.type then assert.equal("integer", math.type(result.exit_code)) end
    assert.same({ command = "echo hi", workingDirectory = "/app" }, cjson.decode(last_request().body))
  end)

  it("stops, resumes and deletes at the documented paths", function()
    local dp = client()
    assert.is_true(dp:stop_sandbox("group", "sb-1"))
    assert.equal("POST", last_request().method)
    assert.equal(SANDBOXES .. "/sb-1/stop", last_request().path)
    assert.is_true(dp:resume_sandbox("group", "sb-1"))
    assert.equal(SANDBOXES .. "/sb-1/resume", last_request().path)
    assert.is_true(dp:delete_sandbox("group", "sb-1"))
    assert.equal("DELETE", last_request().method)
  end)

  it("refuses an id that would leave its path segment, sending nothing", function()
    for _, id in ipairs{ "../x", "a/b", "a?b", "..", "" } do
      local record, err = client():get_sandbox("group", id)
      assert.is_nil(record)
      assert.equal("INVALID_INPUT", err.code)
    end
    assert.equal(0, #server:requests())
  end)

  it("is built from a region, and refuses options it cannot use", function()
    local dp = assert(dataplane.new{ subscription = "s", resource_group = "r", region = "eastus2", token = "t" })
    assert.equal("https://management.eastus2.azuredevcompute.io", dp.endpoint)
    local _, err = dataplane.new{ subscription = "s", resource_group = "r", region = "eastus2" }
    assert.equal("token", err.field)
    _, err = dataplane.new{ subscription = "s/../x", resource_group = "r", region = "eastus2", token = "t" }
    assert.equal("subscription", err.field)
    _, err = dataplane.new{ subscription = "s", resource_group = "r", token = "t" }
    assert.equal("endpoint", err.field)
  end)
end)
