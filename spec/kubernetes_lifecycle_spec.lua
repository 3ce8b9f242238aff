-- What agent-sandbox v0.5 does to a session on a real cluster that its simplest reading would
-- miss, against the fake cluster of spec/support/kube_cluster.lua, whose controller does it
-- too: pods that end and are not made again, a Sandbox with two pods, suspending and resuming,
-- a warm pool or template that appears late, an install older than v1beta1, continue tokens
-- that expire, the router's DNS-label check and per-read timeout, warm and cold claims.

local cjson = require "cjson"
local sandkit = require "sandkit"
local wait = require "sandkit.wait"
local kube_cluster = require "support.kube_cluster"
local raw_http = require "support.raw_http"

local NS = kube_cluster.NAMESPACE

local function claim_of(cluster, name)
  return (cluster:state().objects.sandboxclaims[NS] or {})[name]
end

local function states(sb)
  local out = {}
  for _, s in ipairs(assert(sb:list())) do out[s.id] = s.state end
  return out
end

--- The exec bodies a route got for the pod of `session`, decoded.
local function exec_bodies(cluster, path_pattern, session)
  local out = {}
  for _, r in ipairs(cluster:api_requests("POST", path_pattern)) do
    local routed = r.headers["x-sandbox-id"]
    if routed == nil or routed == session.record.pod.sandbox then out[#out + 1] = cjson.decode(r.body) end
  end
  return out
end

describe("a kubernetes session on agent-sandbox v0.5", function()
  local cluster
  setup(function()
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {}, ["cold-pool"] = { replicas = 0 },
      ["failing-pool"] = { replicas = 0, end_phase = "Failed" } } }
  end)
  teardown(function() if cluster then cluster:stop() end end)

  it("adopts a warm Sandbox of its pool, and when the pool has none makes one named after the claim", function()
    local sb = assert(cluster:sandbox{})
    local warm = assert(sb:create{ id = "warm-1" })
    assert.matches("^py%-pool%-%x+$", warm.record.pod.sandbox)
    local claim = claim_of(cluster, "warm-1")
    assert.equal(warm.record.pod.sandbox, claim.metadata.annotations["agents.x-k8s.io/sandbox-name"])
    local cold = assert(assert(cluster:sandbox{ warm_pool = "cold-pool" }):create{ id = "cold-1" })
    assert.equal("cold-1", cold.record.pod.sandbox)
    assert.equal("cold-1", cold.record.pod.name)
    for _, session in ipairs{ warm, cold } do
      assert.equal("up\n", assert(session:exec({ "echo", "up" }, { timeout = 10 })).stdout)
      assert(session:terminate())
    end
  end)

  for _, phase in ipairs{ "Failed", "Succeeded" } do
    it("reads a session whose pod " .. phase:lower() .. " as terminated, and sends it nothing more", function()
      local sb = assert(cluster:sandbox{})
      local id = "ended-" .. phase:lower()
      local session = assert(sb:create{ id = id })
      cluster:control("/_fake/pod_phase", { pod = session.record.pod.name, phase = phase })
      local again = assert(sb:get(id))
      assert.equal("terminated", again.state)
      assert.is_nil(again.record.pod)
      assert.equal("terminated", states(sb)[id])
      local result, err = session:exec({ "true" }, { timeout = 5 })
      assert.is_nil(result)
      assert.equal("SANDBOX_UNREACHABLE", err.code)
      assert.matches("is terminated %(claim Ready=False %(Pod" .. phase, err.message)
      assert(sb:terminate(id))
      assert.is_nil(claim_of(cluster, id))
    end)
  end

  it("fails a create whose pod ends before it serves at once, naming why, and deletes its claim", function()
    local sb = assert(cluster:sandbox{ warm_pool = "failing-pool", ready_timeout = 20 })
    local started = wait.now()
    local session, err = sb:create{ id = "dies-1" }
    assert.is_nil(session)
    assert.is_true(wait.now() - started < 10, "it did not wait for ready_timeout")
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_false(err.retryable)
    assert.equal("PodFailed", err.reason)
    assert.matches("cannot become ready: claim Ready=False %(PodFailed: Pod failed%)", err.message)
    assert.is_nil(claim_of(cluster, "dies-1"))
  end)

  it("reads a Sandbox with two pods as starting, and fails a wait for it at once naming MultiplePods", function()
    local sb = assert(cluster:sandbox{ ready_timeout = 20 })
    assert(sb:create{ id = "two-pods" })
    cluster:control("/_fake/extra_pod", { claim = "two-pods" })
    assert.equal("starting", assert(sb:get("two-pods")).state)
    local started = wait.now()
    local session, err = sb:get_or_create{ id = "two-pods" }
    assert.is_nil(session)
    assert.is_true(wait.now() - started < 10, "it did not wait for ready_timeout")
    assert.equal("MultiplePods", err.reason)
    assert.truthy(claim_of(cluster, "two-pods"), "a session get_or_create did not make is not deleted")
    assert(sb:terminate("two-pods"))
  end)

  it("pauses a session by suspending its Sandbox, and resumes it on a new pod", function()
    local sb = assert(cluster:sandbox{})
    local session = assert(sb:create{ id = "nap-1" })
    local old_pod = session.record.pod
    assert.is_true(assert(session:pause()))
    assert.equal("paused", session.state)
    assert.equal("paused", assert(sb:get("nap-1")).state, "a get right after reads it paused")
    assert.equal("paused", states(sb)["nap-1"])
    local patches = cluster:api_requests("PATCH", "/sandboxes/")
    assert.equal(1, #patches)
    assert.equal("application/merge-patch+json", patches[1].headers["content-type"])
    local patch = cjson.decode(patches[1].body)
    assert.equal("Suspended", patch.spec.operatingMode)
    assert.is_string(patch.metadata.resourceVersion, "only the Sandbox read is changed")
    local result, err = session:exec({ "true" }, { timeout = 5 })
    assert.is_nil(result)
    assert.matches("is paused", err.message)

    assert.is_true(assert(session:resume()))
    assert.equal("running", session.state)
    assert.equal("running", assert(sb:get("nap-1")).state)
    assert.are_not.equal(old_pod.uid, session.record.pod.uid, "a resumed session runs on a new pod")
    assert.equal("back\n", assert(session:exec({ "echo", "back" }, { timeout = 10 })).stdout)
    local from_elsewhere = assert(assert(cluster:sandbox{}):get("nap-1"))
    assert.equal("again\n", assert(from_elsewhere:exec({ "echo", "again" }, { timeout = 10 })).stdout)
    assert(session:terminate())
  end)

  it("refuses to pause a session whose Sandbox is not its claim's, changing nothing", function()
    local sb = assert(cluster:sandbox{})
    local session = assert(sb:create{ id = "nap-2" })
    cluster:control("/_fake/disown", { claim = "nap-2", link = "sandbox" })
    local patches = #cluster:api_requests("PATCH")
    local ok, err = session:pause()
    assert.is_nil(ok)
    assert.matches("does not belong to this sandbox", err.message)
    assert.equal(patches, #cluster:api_requests("PATCH"), "no PATCH was sent")
    assert.truthy(claim_of(cluster, "nap-2"))
  end)
end)

describe("a kubernetes session under a changing cluster", function()
  local cluster
  after_each(function() if cluster then cluster:stop() cluster = nil end end)

  it("pauses through a Sandbox the controller wrote since it was read (409): read again, patched again", function()
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, faults = { patch_conflict = 1 } }
    local session = assert(assert(cluster:sandbox{}):create{ id = "nap-3" })
    assert(session:pause())
    assert.equal(2, #cluster:api_requests("PATCH", "/sandboxes/"))
  end)

  for _, case in ipairs{ { "WarmPoolNotFound", "late-pool", nil, 'SandboxWarmPool "late%-pool" not found' },
      { "TemplateNotFound", "templateless", { template_missing = true },
        'SandboxTemplate "templateless" not found' } } do
    local reason, pool, config, said = case[1], case[2], case[3], case[4]

    it("waits for a claim's " .. reason .. " within pool_grace, then fails naming it and deletes the claim", function()
      cluster = kube_cluster.start{ pools = { [pool] = config } }
      local sb = assert(cluster:sandbox{ warm_pool = pool, pool_grace = 0.6, ready_timeout = 20 })
      local started = wait.now()
      local session, err = sb:create{ id = "grace-1" }
      local took = wait.now() - started
      assert.is_nil(session)
      assert.is_true(took >= 0.6 and took < 10, "failed after " .. took .. "s")
      assert.equal("INVALID_INPUT", err.code)
      assert.equal("warm_pool", err.field)
      assert.equal(reason, err.reason)
      assert.matches(said, err.message)
      assert.matches("for 0.6s %(pool_grace%)", err.message)
      assert.is_nil(claim_of(cluster, "grace-1"))
    end)

    it("waits for a claim's " .. reason .. " and serves it once the pool is made whole", function()
      cluster = kube_cluster.start{ pools = { [pool] = config } }
      local sb = assert(cluster:sandbox{ warm_pool = pool, pool_grace = 20, ready_timeout = 30 })
      local ok, session = sandkit.run(function()
        local creating = sandkit.spawn(function() return sb:create{ id = "grace-2" } end)
        local deadline = wait.now() + 10
        repeat
          wait.sleep(0.05)
          local claim = claim_of(cluster, "grace-2")
          local c = claim and claim.status and claim.status.conditions and claim.status.conditions[1]
        until (c and c.reason == reason) or wait.now() > deadline
        cluster:control("/_fake/pool", { name = pool, pool = {} })
        return creating:join()
      end)
      assert(ok, session)
      assert(session, "the create failed")
      assert.equal("running", session.state)
    end)
  end

  for name, versions in pairs{ ["an agent-sandbox older than v0.5.0"] = { { "v1alpha1" }, "older than v0.5.0" },
      ["no agent-sandbox"] = { {}, "is not installed" } } do
    it("says it needs agent-sandbox v0.5.0 or later on a cluster with " .. name, function()
      cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, api_versions = versions[1] }
      local sb = assert(cluster:sandbox{})
      for _, call in ipairs{ function() return sb:create{ id = "v-1" } end, function() return sb:get("v-1") end,
          function() return sb:list() end } do
        local value, err = call()
        assert.is_nil(value)
        assert(err, "a missing API is not an absent session")
        assert.equal("INVALID_INPUT", err.code)
        assert.matches(versions[2], err.message, 1, true)
        assert.matches("sandkit needs agent-sandbox v0.5.0 or later", err.message, 1, true)
      end
    end)
  end

  it("lists through a continue token that expired with one whole list, as client-go's pager does", function()
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, faults = { page_size = 1, expire_continue = 1 } }
    local sb = assert(cluster:sandbox{})
    for i = 1, 3 do assert(sb:create{ id = "expire-" .. i }) end
    local before = #cluster:api_requests("GET", "/sandboxclaims$")
    local ids = {}
    for id in pairs(states(sb)) do ids[#ids + 1] = id end
    table.sort(ids)
    assert.same({ "expire-1", "expire-2", "expire-3" }, ids, "each session once")
    local lists = cluster:api_requests("GET", "/sandboxclaims$")
    local queries = {}
    for i = before + 1, #lists do queries[#queries + 1] = lists[i].query end
    assert.equal(3, #queries)
    assert.matches("&continue=", queries[2])
    assert.equal("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dsandkit", queries[3], "a whole list, no limit")
  end)
end)

describe("a kubernetes session through agent-sandbox's router", function()
  local cluster
  local SILENT = { "sh", "-c", "sleep 2.2; echo done" }
  setup(function()
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {}, ["dotted.pool"] = {} },
      router_token = "router-secret", router_read_timeout = 1 }
  end)
  teardown(function() if cluster then cluster:stop() end end)

  local function router_sandbox(options)
    local o = { transport = "router", router_url = cluster.router_url, router_token = "router-secret" }
    for k, v in pairs(options or {}) do o[k] = v end
    return assert(cluster:sandbox(o))
  end

  it("refuses a warm pool whose name holds a '.' for the router transport, which could reach none of it", function()
    local sb, err = cluster:sandbox{ transport = "router", router_url = cluster.router_url, warm_pool = "dotted.pool" }
    assert.is_nil(sb)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("warm_pool", err.field)
    -- The router's own refusal of such a Sandbox's name, which the refusal spares.
    local session = assert(assert(cluster:sandbox{ warm_pool = "dotted.pool" }):create{ id = "dotted-1" })
    local answer = assert(raw_http.request(cluster.backend.port, "POST", "/v1/exec", { body = "{}",
      headers = { Authorization = "Bearer router-secret", ["X-Sandbox-ID"] = session.record.pod.sandbox,
        ["X-Sandbox-Namespace"] = NS, ["X-Sandbox-Port"] = "8971", ["X-Sandbox-Pod-IP"] = session.record.pod.ip } }))
    assert.equal(400, answer.status)
    assert.equal('{"detail":"Invalid sandbox ID format."}', answer.body)
    assert(session:terminate())
  end)

  it("asks the agent for keep-alives every 30 s by default through the router and the pods proxy", function()
    local routed = assert(router_sandbox():create{ id = "ka-1" })
    assert(routed:exec({ "true" }, { timeout = 10 }))
    assert(assert(router_sandbox():get("ka-1")):exec({ "true" }, { timeout = 10 }), "a session found by get asks too")
    local bodies = exec_bodies(cluster, "^/v1/exec$", routed)
    assert.equal(2, #bodies)
    for _, body in ipairs(bodies) do assert.equal(30000, body.keepaliveMs) end
    assert(assert(assert(cluster:sandbox{ transport = "apiserver" }):get("ka-1")):exec({ "true" }, { timeout = 10 }))
    local proxied = exec_bodies(cluster, "/proxy/v1/exec$", routed)
    assert.equal(30000, proxied[#proxied].keepaliveMs)
    assert(routed:terminate())
  end)

  it("keeps a command silent past the router's per-read timeout with keep-alives", function()
    local session = assert(router_sandbox{ keepalive = 0.3 }:create{ id = "ka-2" })
    local result = assert(session:exec(SILENT, { timeout = 10 }))
    assert.same({ 0, "done\n" }, { result.code, result.stdout })
    assert(session:terminate())
  end)

  it("loses such a command's stream without them, as an unknown outcome", function()
    local session = assert(router_sandbox{ keepalive = false }:create{ id = "ka-3" })
    local result, err = session:exec(SILENT, { timeout = 10 })
    assert.is_nil(result)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert(session:terminate())
  end)
end)
