-- The cloud providers inside a real nginx worker, over cosockets, against the suite's fakes:
-- AWS through the fake Lambda MicroVMs control plane and the nginx TLS proxy standing in for a
-- MicroVM's endpoint (support/aws_*), Azure through a fake REST data plane whose sandbox is a
-- real sandkit-agent awaiting activation. Each session is created, streams a command, moves a
-- file and is terminated by one request to the gateway (support/nginx_app).

local cjson = require "cjson"
local core = require "sandkit.core"
local aws_control_plane = require "support.aws_control_plane"
local aws_endpoint_proxy = require "support.aws_endpoint_proxy"
local fake_http = require "support.fake_http"
local files = require "support.files"
local nginx = require "support.nginx"
local raw_http = require "support.raw_http"

local ROUNDTRIP = [[
    location = /roundtrip { content_by_lua_block { require("support.nginx_app").provider_roundtrip() } }
]]
local ARGV = { "sh", "-c", "printf one; printf two >&2; exit 3" }

local function hex(n)
  return (core.random(n):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function roundtrip(gateway, options)
  local answer = assert(raw_http.request(gateway.port, "POST", "/roundtrip",
    { body = cjson.encode{ options = options, argv = ARGV }, timeout = 60 }))
  assert(answer.status == 200, answer.body .. gateway:error_log())
  local result = cjson.decode(answer.body)
  assert(not result.failed, tostring(result.failed) .. ": " .. tostring(result.err) .. "\n" .. gateway:error_log())
  return result
end

local function check_frames(frames)
  assert.same({ type = "stdout", seq = 0, data = "one" }, frames[1])
  assert.same({ type = "stderr", seq = 1, data = "two" }, frames[2])
  assert.same({ type = "exit", code = 3, truncated = false }, frames[3])
end

describe("inside nginx, the aws provider", function()
  local IMAGE = "arn:aws:lambda:us-east-1:123456789012:microvm-image:sbx"
  local RESTORE_502S = 3
  local proxy, cp, gateway
  after_each(function()
    if gateway then gateway:stop() end
    if cp then cp:stop() end
    if proxy then proxy:stop() end
  end)

  it("creates a session through the restore window's 502s over verified TLS, streams, moves a file, terminates",
      function()
    local token = { ["X-aws-proxy-auth"] = hex(16), ["X-aws-proxy-token-id"] = hex(8) }
    proxy = aws_endpoint_proxy.start{ restoring = RESTORE_502S, token = token }
    cp = aws_control_plane.start{ auth_token = token,
      run = { microvmId = "mvm-e2e", endpoint = proxy.endpoint, publish_after = 2 } }
    -- Over cosockets the trusted CAs are nginx's: the test CA is given to nginx, not to sandkit.
    gateway = nginx.start{ server = ROUNDTRIP, http = "  lua_ssl_trusted_certificate " .. proxy.ca_file .. ";" }
    local result = roundtrip(gateway, { provider = "aws", region = "us-east-1", image = IMAGE,
      image_version = "3", endpoint = cp.url, access_key_id = "AKIDEXAMPLE",
      secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
      header_timeout = 10, ready_timeout = 20, ready_interval = 0.05 })
    assert.equal("mvm-e2e", result.id)
    assert.equal("terminated", result.state)
    check_frames(result.frames)
    local restore_502s = 0
    for _, entry in ipairs(proxy:access_log()) do
      if entry.status == 502 and entry.uri:match("^/v1/health") then restore_502s = restore_502s + 1 end
    end
    assert.is_true(restore_502s >= RESTORE_502S, "the proxy answered " .. restore_502s .. " 502s")
    assert.equal(1, #cp:calls_to("RunMicrovm"))
    assert.equal(1, #cp:calls_to("TerminateMicrovm"))
    -- One token for the readiness wait, then one per agent request: the run, the write, the read.
    assert.equal(1 + 3, #cp:calls_to("CreateMicrovmAuthToken"))
  end)
end)

describe("inside nginx, the azure provider", function()
  local agent_pid, dir, data_plane, gateway
  after_each(function()
    if gateway then gateway:stop() end
    if data_plane then data_plane:stop() end
    if agent_pid then
      core.kill(agent_pid, core.SIGKILL)
      core.reap(agent_pid, true)
    end
    if dir then core.remove_tree(dir) end
  end)

  --- A fake data plane of one sandbox, sbx-1, served by the agent at port with token: created
  -- by a PUT, Running with the labels and egress policy it was created with, its agent port
  -- at the agent's loopback URL, its credential file readable, gone once deleted.
  local function start_data_plane(port, token)
    return fake_http.start(string.format([[
      local respond = require "support.respond"
      local cjson = require "cjson"
      local base = "/subscriptions/sub-1/resourceGroups/rg-1/sandboxGroups/group/sandboxes"
      return { handle = function(req, conn)
        local s = conn.state
        local key = req.method .. " " .. req.path:sub(#base + 1)
        if key == "PUT " then
          local spec = cjson.decode(req.body)
          s.labels, s.egress = spec.labels, spec.egressPolicy
          return respond.json(conn, "201 Created", { id = "sbx-1", state = "Creating" })
        end
        if not s.labels or s.deleted then
          return respond.json(conn, "404 Not Found", { error = { code = "NotFound", message = "no sandbox" } })
        end
        if key == "GET /sbx-1" then
          return respond.json(conn, "200 OK", { id = "sbx-1", state = "Running", labels = s.labels,
            egressPolicy = s.egress, ports = { { port = 8971, url = "http://127.0.0.1:%d/" } } })
        end
        if key == "GET /sbx-1/files" and req.query:find("agent%%-token") then
          return respond.status(conn, "200 OK", %q, "application/octet-stream")
        end
        if key == "DELETE /sbx-1" then
          s.deleted = true
          return respond.status(conn, "204 No Content")
        end
        respond.json(conn, "400 Bad Request", { error = { code = "Unexpected", message = key } })
      end }
    ]], port, token))
  end

  it("creates and activates a session through the REST data plane, streams, moves a file and terminates", function()
    dir = files.temp_dir()
    assert(core.mkdir(dir .. "/root", 448))
    local token = core.b64encode(core.random(32))
    assert(core.write_private(dir .. "/token", token))
    local reader
    agent_pid, reader = core.spawn({ os.getenv("SANDKIT_AGENT"), "--root", dir .. "/root", "--token-file",
      dir .. "/token", "--require-activation", "--listen", "127.0.0.1:0", "--ready-fd", "3", "--log", "quiet" },
      { ready_fd = 3, setsid = true })
    assert(agent_pid, reader)
    local line = assert(fake_http.read_line(reader, 10))
    reader:close()
    data_plane = start_data_plane(cjson.decode(line).port, token)
    gateway = nginx.start{ server = ROUNDTRIP }
    local result = roundtrip(gateway, { provider = "azure", subscription = "sub-1", resource_group = "rg-1",
      endpoint = data_plane.url, token = "entra-token", group = "group", image = "sandkit-agent",
      agent = true, allow_loopback_http = true, ready_interval = 0.05, state_interval = 0.05 })
    assert.equal("sbx-1", result.id)
    assert.equal("terminated", result.state)
    check_frames(result.frames)
    assert.equal("Bearer entra-token", data_plane:requests()[1].headers.authorization)
    local files_path = "/subscriptions/sub-1/resourceGroups/rg-1/sandboxGroups/group/sandboxes/sbx-1/files"
    assert.equal(1, #data_plane:requests_to(files_path), "the credential was read once, for the one route")
  end)
end)
