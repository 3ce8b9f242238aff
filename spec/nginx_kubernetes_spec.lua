-- The kubernetes provider inside a real nginx worker, over cosockets, against the fake cluster
-- of support/kube_cluster (its API server behind nginx with TLS and mTLS, its pods real
-- sandkit-agents): sessions claimed from a warm pool, their readiness read from a watch,
-- commands streamed, files moved, sessions listed and terminated — authenticated by a bearer
-- token, a client certificate and an exec plugin — while the worker keeps answering other
-- requests. Timing bounds here are the behaviour itself.

local cjson = require "cjson"
local core = require "sandkit.core"
local files = require "support.files"
local kube_cluster = require "support.kube_cluster"
local nginx = require "support.nginx"
local processes = require "support.processes"
local raw_http = require "support.raw_http"

local LOCATIONS = [[
    location = /ping { content_by_lua_block { ngx.say("pong") } }
    location = /roundtrip { content_by_lua_block { require("support.nginx_app").provider_roundtrip() } }
    location = /shared { content_by_lua_block { require("support.nginx_app").shared_get() } }
    location = /fanout { content_by_lua_block { require("support.nginx_app").fanout_get() } }
    location = /timer { content_by_lua_block { require("support.nginx_app").provider_roundtrip_in_timer() } }
    location = /phase {
      set_by_lua_block $refusal { return require("support.nginx_app").get_refusal() }
      return 200 $refusal;
    }
]]
local ARGV = { "sh", "-c", "printf one; printf two >&2; exit 3" }
local NS = kube_cluster.NAMESPACE
local NS_PATTERN = NS:gsub("%-", "%%-")
local CLAIMS = "^/apis/extensions%.agents%.x%-k8s%.io/v1beta1/namespaces/" .. NS_PATTERN .. "/sandboxclaims"
--- Seconds a ping may take while the worker serves a provider call: nginx answers it within
-- milliseconds when nothing blocks the worker, and not at all when something does.
local PING_TIMEOUT = 2

local within = processes.within

--- A gateway for cluster: over cosockets TLS trusts nginx's CAs, so the cluster's CA is given
-- to nginx as well; lyaml, whose C part sets the global `yaml` as it loads (which nginx warns
-- about inside a request), is loaded before the workers start.
local function start_gateway(cluster, extra)
  return nginx.start{ server = LOCATIONS, http = "  lua_ssl_trusted_certificate " .. cluster.ca_file
    .. ";\n  init_by_lua_block { require \"lyaml\" }\n" .. (extra or "") }
end

--- Sandbox options for cluster, with `extra` on top.
local function sandbox_options(cluster, extra)
  local o = { provider = "kubernetes", warm_pool = "py-pool", signing_key = cluster.key_path,
    key_id = cluster.key_id, header_timeout = 10, ready_timeout = 20, ready_interval = 0.05,
    kubeconfig = cluster:kubeconfig() }
  for k, v in pairs(extra or {}) do o[k] = v end
  return o
end

describe("inside nginx, the kubernetes provider", function()
  local cluster, gateway

  setup(function()
    cluster = kube_cluster.start{
      pools = { ["py-pool"] = {}, ["held-pool"] = { never_ready = true } },
      tokens = { [kube_cluster.TOKEN] = "admin", ["exec-token-1"] = "exec-user" },
    }
    -- A client that goes away ends its request, as a gateway's configuration says.
    gateway = start_gateway(cluster, "  lua_check_client_abort on;")
  end)
  teardown(function()
    if gateway then gateway:stop() end
    if cluster then cluster:stop() end
  end)
  before_each(function()
    os.remove(cluster.dir .. "/exec-runs")
    os.remove(cluster.dir .. "/exec-starts")
  end)
  after_each(function()
    assert.not_matches("writing a global Lua variable", gateway:error_log(), 1, true)
  end)

  local function options(extra) return sandbox_options(cluster, extra) end

  local function request_body(id, extra)
    return cjson.encode{ id = id, options = options(extra), argv = ARGV, list = true }
  end

  local function check(result, id)
    assert(not result.failed, tostring(result.failed) .. ": " .. tostring(result.err) .. "\n"
      .. gateway:error_log())
    assert.equal(id, result.id)
    assert.same({ type = "stdout", seq = 0, data = "one" }, result.frames[1])
    assert.same({ type = "stderr", seq = 1, data = "two" }, result.frames[2])
    assert.same({ type = "exit", code = 3, truncated = false }, result.frames[3])
    assert.equal("running", result.listed, "list named the session while it ran")
    assert.equal("terminated", result.state)
    assert.is_nil((cluster:state().objects.sandboxclaims[NS] or {})[id], "its claim is deleted")
  end

  local function roundtrip(id, extra)
    local answer = assert(raw_http.request(gateway.port, "POST", "/roundtrip",
      { body = request_body(id, extra), timeout = 60 }))
    assert(answer.status == 200, answer.body .. gateway:error_log())
    local result = cjson.decode(answer.body)
    check(result, id)
    return result
  end

  --- Sends a request on a connection of its own; returns the connection and a function that
  -- reads the JSON answer.
  local function start(path, body)
    local conn = assert(raw_http.connect(gateway.port, nil, 60))
    assert(conn:request("POST", path, {}, body))
    return conn, function()
      local status = conn:read_head()
      local text = assert((conn:read_body()))
      conn:close()
      assert(status == 200, text .. gateway:error_log())
      return cjson.decode(text)
    end
  end

  local function start_roundtrip(id, extra)
    local _, result_of = start("/roundtrip", request_body(id, extra))
    return result_of
  end

  local function ping()
    local pong, err = raw_http.request(gateway.port, "GET", "/ping", { timeout = PING_TIMEOUT })
    assert(pong, "the worker did not answer a ping within " .. PING_TIMEOUT .. " s: " .. tostring(err))
    assert.equal("pong\n", pong.body)
  end

  local function users()
    local seen = {}
    for _, e in ipairs(cluster:log_entries()) do if e.user then seen[e.user] = true end end
    return seen
  end

  local function watches_of(id)
    local n = 0
    for _, r in ipairs(cluster:api_requests("GET", CLAIMS .. "$")) do
      if r.query:match("watch=1") and r.query:find("metadata.name%3D" .. id, 1, true) then n = n + 1 end
    end
    return n
  end

  it("creates a session from a warm pool through a watch, streams, moves a file, lists and terminates it, "
      .. "with a bearer token", function()
    roundtrip("ngx-token")
    assert.is_true(watches_of("ngx-token") >= 1, "readiness was read from a watch")
    assert.is_true(users().admin)
  end)

  it("authenticates to the API server with a client certificate from the kubeconfig (mTLS)", function()
    roundtrip("ngx-mtls", { kubeconfig = cluster:kubeconfig{ user = "cert_data" } })
    assert.is_true(users()[kube_cluster.CLIENT_CN])
  end)

  it("verifies the API server as tls-server-name and streams through its pods proxy, over mTLS", function()
    local before = #cluster:requests()
    roundtrip("ngx-named", { transport = "apiserver",
      kubeconfig = cluster:kubeconfig{ user = "cert_data", tls_server_name = true } })
    local proxied = 0
    for _, e in ipairs(cluster:log_entries()) do
      if e.request and e.request > before then
        assert.equal(kube_cluster.SERVER_NAME, e.sni, "request " .. e.request .. " was sent with another SNI")
        assert.equal(kube_cluster.CLIENT_CN, e.user)
      end
    end
    for _, r in ipairs(cluster:api_requests("POST", "/pods/[^/]+:8971/proxy/v1/exec$")) do
      if r.index > before then proxied = proxied + 1 end
    end
    assert.equal(1, proxied, "the command ran through the API server")
  end)

  it("authenticates with the token an exec plugin answers, run once for the session's life", function()
    roundtrip("ngx-exec", { kubeconfig = cluster:kubeconfig{ user = "exec" } })
    assert.is_true(users()["exec-user"])
    assert.equal("1", files.read(cluster.dir .. "/exec-runs"):match("%d+"))
  end)

  it("says, when it finds no kubeconfig in a worker, that nginx passes on only the env it names", function()
    local o = options()
    o.kubeconfig = nil
    local answer = assert(raw_http.request(gateway.port, "POST", "/roundtrip",
      { body = cjson.encode{ options = o, argv = ARGV } }))
    local result = cjson.decode(answer.body)
    assert.equal("sandbox", result.failed)
    assert.matches("no kubeconfig", result.err, 1, true)
    assert.matches("env KUBECONFIG", result.err, 1, true)
  end)

  it("refuses an API server that the kubeconfig's CA did not sign, though nginx trusts its CA", function()
    local kubeconfig = cluster:kubeconfig{ name = "kubeconfig-other-ca", ca = "other-ca" }
    local answer = assert(raw_http.request(gateway.port, "POST", "/roundtrip",
      { body = request_body("ngx-other-ca", { kubeconfig = kubeconfig }), timeout = 60 }))
    local result = cjson.decode(answer.body)
    assert.equal("create", result.failed)
    assert.matches("its certificate does not chain to the CA this request trusts (ca_pem)", result.err, 1, true)
    assert.is_nil((cluster:state().objects.sandboxclaims[NS] or {})["ngx-other-ca"], "nothing was created")
  end)

  it("answers pings while a create waits on its claim's watch, and goes on at the watch's event", function()
    local result_of = start_roundtrip("ngx-held", { warm_pool = "held-pool" })
    -- The controller bound the claim to a pod that never turns Ready, and the create watches.
    assert.is_true(within(20, function()
      local objects = cluster:state().objects
      local claim = (objects.sandboxclaims[NS] or {})["ngx-held"]
      local sandbox = claim and claim.status and claim.status.sandbox
      return sandbox ~= nil and (objects.pods[NS] or {})[sandbox.name] ~= nil
        and watches_of("ngx-held") >= 1
    end), gateway:error_log())
    ping()
    cluster:control("/_fake/condition", { claim = "ngx-held", status = "True", reason = "DependenciesReady",
      message = "Pod is Ready; Service Exists" })
    check(result_of(), "ngx-held")
    -- From the Ready condition to reading the claim's Sandbox, the claim itself was not read:
    -- the condition came over the open watch.
    local released
    for _, r in ipairs(cluster:requests()) do
      if r.path == "/_fake/condition" then
        released = true
      elseif released and r.path:match("/sandboxes/") then
        break
      elseif released then
        assert.not_matches(CLAIMS .. "/ngx%-held$", r.path)
      end
    end
  end)

  it("answers pings while an exec plugin runs, and uses the credential it then answers", function()
    local go = cluster.dir .. "/exec-go"
    local result_of = start_roundtrip("ngx-exec-held", { kubeconfig = cluster:kubeconfig{ user = "exec",
      name = "kubeconfig-exec-held", exec_env = { FAKE_EXEC_HOLD = go } } })
    assert.is_true(within(20, function() return files.read(cluster.dir .. "/exec-runs") ~= nil end),
      gateway:error_log())
    ping()
    files.write(go, "")
    check(result_of(), "ngx-exec-held")
    os.remove(go)
  end)

  it("runs an exec plugin once for light threads that need its credential at the same time", function()
    local go = cluster.dir .. "/exec-go"
    local _, states_of = start("/fanout", cjson.encode{ ids = { "none-1", "none-2", "none-3", "none-4" },
      options = options{ kubeconfig = cluster:kubeconfig{ user = "exec", name = "kubeconfig-exec-shared",
        exec_env = { FAKE_EXEC_HOLD = go } } } })
    assert.is_true(within(20, function() return files.read(cluster.dir .. "/exec-starts") ~= nil end),
      gateway:error_log())
    ping()
    files.write(go, "")
    local states = states_of()
    os.remove(go)
    assert.same({ "absent", "absent", "absent", "absent" }, states)
    assert.equal("start\n", files.read(cluster.dir .. "/exec-starts"), "the plugin ran once")
  end)

  it("runs an exec plugin again for a request whose plugin run belonged to a request that went away", function()
    cluster:control("/_fake/tokens", { tokens = { [kube_cluster.TOKEN] = "admin", ["exec-token-1"] = "exec-user",
      ["exec-token-2"] = "exec-user" } })
    local go = cluster.dir .. "/exec-go"
    local body = cjson.encode{ id = "none-shared", options = options{ kubeconfig = cluster:kubeconfig{
      user = "exec", name = "kubeconfig-exec-abandoned", exec_env = { FAKE_EXEC_HOLD = go } } } }
    local first = start("/shared", body)
    assert.is_true(within(20, function() return files.read(cluster.dir .. "/exec-starts") ~= nil end),
      gateway:error_log())
    -- nginx ends the request (lua_check_client_abort) and never resumes its plugin run.
    first:close(true)
    local started = core.now()
    local _, second_answer = start("/shared", body)
    assert.is_true(within(20, function()
      return (files.read(cluster.dir .. "/exec-starts") or ""):match("^start\nstart\n$") ~= nil
    end), gateway:error_log())
    files.write(go, "")
    local answer = second_answer()
    os.remove(go)
    assert.equal("absent", answer.state)
    -- Its own run began once the first run's task had been silent for 3 s, not at its 65 s bound.
    assert.is_true(core.now() - started < 10, string.format("%.1f s", core.now() - started))
  end)

  it("runs a session's whole life from a timer, its credential from an exec plugin", function()
    local out = cluster.dir .. "/timer-result"
    local answer = assert(raw_http.request(gateway.port, "POST", "/timer?out=" .. out,
      { body = request_body("ngx-timer", { kubeconfig = cluster:kubeconfig{ user = "exec" } }) }))
    assert.equal(204, answer.status)
    assert.is_true(within(30, function() return files.read(out) ~= nil end), gateway:error_log())
    check(cjson.decode(files.read(out)), "ngx-timer")
  end)

  it("refuses to run an exec plugin in a phase without cosockets, naming it, before starting it", function()
    local path = cluster.dir .. "/phase-options.json"
    files.write(path, cjson.encode(options{ kubeconfig = cluster:kubeconfig{ user = "exec" } }))
    local answer = assert(raw_http.request(gateway.port, "GET", "/phase?options=" .. path))
    assert.matches("cannot wait in nginx's set phase", answer.body, 1, true)
    -- A plugin started anyway would have counted its run by the time this roundtrip, which
    -- runs it (and waits for it) once, is over.
    roundtrip("ngx-after-phase", { kubeconfig = cluster:kubeconfig{ user = "exec" } })
    assert.equal("1", files.read(cluster.dir .. "/exec-runs"):match("%d+"))
  end)
end)

describe("inside nginx, the kubernetes provider's readiness watch", function()
  local cluster, gateway
  teardown(function()
    if gateway then gateway:stop() end
    if cluster then cluster:stop() end
  end)

  it("survives a 410 status, a 410 ERROR event and a watch dropped mid-stream over cosockets", function()
    -- Bound only after the faulty watches are over, so their events cannot be missed.
    cluster = kube_cluster.start{ pools = { ["py-pool"] = { bind_delay = 1 } },
      faults = { watch_gone_status = 1, watch_gone_event = 1, watch_drop = 1 } }
    gateway = start_gateway(cluster)
    local answer = assert(raw_http.request(gateway.port, "POST", "/roundtrip", { timeout = 60,
      body = cjson.encode{ id = "ngx-faults", argv = { "echo", "ok" }, options = sandbox_options(cluster) } }))
    local result = cjson.decode(answer.body)
    assert(not result.failed, tostring(result.failed) .. ": " .. tostring(result.err) .. "\n" .. gateway:error_log())
    assert.same({ type = "stdout", seq = 0, data = "ok\n" }, result.frames[1])
    local watches, gets = 0, 0
    for _, r in ipairs(cluster:api_requests("GET", CLAIMS)) do
      if r.query:match("watch=1") then
        watches = watches + 1
      elseif r.path:match("/ngx%-faults$") then
        gets = gets + 1
      end
    end
    assert.is_true(watches >= 4, watches .. " watches")
    -- A GET after each failed watch, and terminate's own.
    assert.is_true(gets >= 4, gets .. " GETs of the claim")
  end)
end)
