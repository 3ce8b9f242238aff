-- The kubernetes provider against a fake API server and controller whose pods are real
-- sandkit-agents in capability mode (spec/support/kube_cluster.lua): the public API, the
-- control plane's rules, the three transports, the ways to authenticate, and every fault the
-- provider promises to survive or report.

local sandkit = require "sandkit"
local wait = require "sandkit.wait"
local kubernetes = require "sandkit.providers.kubernetes"
local files = require "support.files"
local kube_cluster = require "support.kube_cluster"
local fs_roundtrip = require "support.fs_roundtrip"
local interactive_roundtrip = require "support.interactive_roundtrip"

local NS = kube_cluster.NAMESPACE
local NS_PATTERN = NS:gsub("%-", "%%-")
local CLAIMS = "^/apis/extensions%.agents%.x%-k8s%.io/v1beta1/namespaces/" .. NS_PATTERN .. "/sandboxclaims"

local function claim_of(cluster, name)
  local claims = cluster:state().objects.sandboxclaims[NS] or {}
  return claims[name]
end

local function count(list, pred)
  local n = 0
  for _, x in ipairs(list) do if not pred or pred(x) then n = n + 1 end end
  return n
end

local function claim_posts(cluster)
  return count(cluster:api_requests("POST", CLAIMS .. "$"))
end

local function run_once_file(session)
  local result = assert(session:exec({ "sh", "-c", "echo run >> runs.txt; cat runs.txt" }, { timeout = 10 }))
  assert.equal(0, result.code)
  return result.stdout
end

--- A claim someone else made: another pool, or without sandkit's label.
local function foreign_claim(name, pool, labelled)
  return { apiVersion = "extensions.agents.x-k8s.io/v1beta1", kind = "SandboxClaim",
    metadata = { name = name, namespace = NS,
      labels = labelled and { ["app.kubernetes.io/managed-by"] = "sandkit" } or { team = "other" },
      annotations = { ["sandkit.dev/nonce"] = "someone-elses" } },
    spec = { warmPoolRef = { name = pool } } }
end

describe("a kubernetes sandbox", function()
  local cluster
  setup(function()
    cluster = kube_cluster.start{
      pools = { ["py-pool"] = {}, ["foreign-pool"] = { foreign_owner = true },
        ["foreign-pod-pool"] = { foreign_pod_owner = true }, ["named-pool"] = { pod_name_annotation = true } },
      -- The fake's controller binds only the claims it is asked to make: "unbound-1" stays
      -- without a status, as one the controller has not reached yet.
      claims = { foreign_claim("theirs-other-pool", "other-pool", true),
        foreign_claim("theirs-unlabelled", "py-pool", false), foreign_claim("unbound-1", "py-pool", true) },
      router_token = "router-secret",
    }
  end)
  teardown(function() if cluster then cluster:stop() end end)

  it("creates a session as a SandboxClaim of its pool, runs commands on the pod's agent, and terminates it", function()
    local sb = assert(cluster:sandbox{ lifetime = 600 })
    local session = assert(sb:create{ id = "life-1" })
    assert.equal("life-1", session.id)
    assert.equal("running", session.state)
    local claim = assert(claim_of(cluster, "life-1"))
    assert.equal("sandkit", claim.metadata.labels["app.kubernetes.io/managed-by"])
    assert.matches("^%x+$", claim.metadata.annotations["sandkit.dev/nonce"])
    assert.same({ name = "py-pool" }, claim.spec.warmPoolRef)
    assert.equal("Delete", claim.spec.lifecycle.shutdownPolicy)
    local shutdown = require("sandkit.time").parse_rfc3339(claim.spec.lifecycle.shutdownTime)
    assert.is_true(math.abs(shutdown - (os.time() + 600)) <= 5, claim.spec.lifecycle.shutdownTime)

    local result = assert(session:exec({ "sh", "-c", "echo hi; echo oops >&2; exit 3" }, { timeout = 10 }))
    assert.same({ 3, "hi\n", "oops\n" }, { result.code, result.stdout, result.stderr })
    local frames = {}
    for frame in session:run({ "printf", "streamed" }, { timeout = 10 }) do frames[#frames + 1] = frame end
    assert.same({ type = "stdout", seq = 0, data = "streamed" }, frames[1])

    assert.is_true(session:terminate())
    assert.is_nil(claim_of(cluster, "life-1"))
    local deleted
    for _, e in ipairs(cluster:log_entries()) do if e.deleted == "life-1" then deleted = e end end
    assert.equal("Background", deleted.propagation)
    assert.equal(claim.metadata.uid, deleted.precondition, "only the claim this sandbox read is deleted")
    assert.is_true(sb:terminate("life-1"), "an absent session terminates")
  end)

  it("finds a session from a fresh sandbox, as another process would, with files and jobs", function()
    local session = assert(assert(cluster:sandbox{}):create{ id = "shared-1" })
    assert(session:write_files{ ["/app/in.txt"] = "from the first" })
    local again = assert(assert(cluster:sandbox{}):get("shared-1"))
    assert.equal("running", again.state)
    assert.equal("from the first", assert(again:read_file("/app/in.txt")))
    local job = assert(again:start_job({ "sh", "-c", "echo job" }, { timeout = 10 }))
    local out = {}
    for frame in job:frames{ interval = 0.05 } do out[#out + 1] = frame end
    assert.equal("job\n", out[1].data)
    assert.equal(0, out[#out].code)
    local ids = {}
    for _, s in ipairs(assert(assert(cluster:sandbox{}):list())) do ids[s.id] = s.state end
    assert.equal("running", ids["shared-1"])
    assert.is_nil(ids["theirs-other-pool"], "another pool's claim is not listed")
    assert.is_nil(ids["theirs-unlabelled"], "a claim without sandkit's label is not listed")
    assert.is_true(again:terminate())
  end)

  it("uses a session's files as a filesystem on the pod's agent, each request under a capability", function()
    local session = assert(assert(cluster:sandbox{}):create{ id = "fs-1" })
    local src = fs_roundtrip.tree()
    finally(function() require("sandkit.core").remove_tree(src) end)
    fs_roundtrip.check(fs_roundtrip.run(session, src, "/tree"), "/tree")
    assert(session:terminate())
  end)

  it("runs interactive jobs on the pod's agent, each request under a capability", function()
    local session = assert(assert(cluster:sandbox{}):create{ id = "interactive-1" })
    interactive_roundtrip.check(interactive_roundtrip.run(session))
    assert(session:terminate())
  end)

  it("reads claims of another pool or without its label as absent, and refuses to terminate them", function()
    local sb = assert(cluster:sandbox{})
    assert.is_nil(sb:get("theirs-other-pool"))
    assert.is_nil(sb:get("theirs-unlabelled"))
    local ok, err = sb:terminate("theirs-other-pool")
    assert.is_nil(ok)
    assert.matches("does not belong to this sandbox", err.message)
    assert.truthy(claim_of(cluster, "theirs-other-pool"), "someone else's claim is left alone")
  end)

  for _, case in ipairs{ { "Sandbox its claim", "foreign-pool", "chain-1" },
      { "pod its Sandbox", "foreign-pod-pool", "chain-2" } } do
    it("treats a new session whose " .. case[1] .. " does not control as not its own", function()
      local sb = assert(cluster:sandbox{ warm_pool = case[2] })
      local session, err = sb:create{ id = case[3] }
      assert.is_nil(session)
      assert.matches("does not belong to this sandbox", err.message)
      assert.is_nil(claim_of(cluster, case[3]), "the claim it made is deleted")
    end)
  end

  for _, link in ipairs{ "sandbox", "pod" } do
    it("reads a session whose " .. link .. " came under another controller as absent: get and list "
        .. "skip it, terminate refuses it and deletes nothing", function()
      local sb = assert(cluster:sandbox{})
      local id = "broken-" .. link
      assert(sb:create{ id = id })
      assert(sb:create{ id = "whole-" .. link })
      cluster:control("/_fake/disown", { claim = id, link = link })
      assert.is_nil(sb:get(id))
      assert.equal("running", assert(sb:get("whole-" .. link)).state)
      local ids = {}
      for _, s in ipairs(assert(sb:list())) do ids[s.id] = s.state end
      assert.is_nil(ids[id])
      assert.equal("running", ids["whole-" .. link])
      local deletes = count(cluster:api_requests("DELETE"))
      local ok, err = sb:terminate(id)
      assert.is_nil(ok)
      assert.matches("does not belong to this sandbox", err.message)
      assert.equal(deletes, count(cluster:api_requests("DELETE")), "no DELETE was sent")
      assert.truthy(claim_of(cluster, id), "the claim is left alone")
      assert(sb:terminate("whole-" .. link))
    end)
  end

  it("checks the chains of the sessions it lists with one list of Sandboxes and one of pods", function()
    local sb = assert(cluster:sandbox{})
    for i = 1, 2 do assert(sb:create{ id = "counted-" .. i }) end
    local before = #cluster:requests()
    local ids = {}
    for _, s in ipairs(assert(sb:list())) do ids[s.id] = s.state end
    assert.same({ "running", "running" }, { ids["counted-1"], ids["counted-2"] })
    local paths, all = {}, cluster:requests()
    for i = before + 1, #all do paths[#paths + 1] = all[i].method .. " " .. all[i].path:match("[^/]+$") end
    assert.same({ "GET sandboxclaims", "GET sandboxes", "GET pods" }, paths)
    for i = 1, 2 do assert(sb:terminate("counted-" .. i)) end
  end)

  it("reads a claim not yet Ready as starting, with or without a pod in view", function()
    local sb = assert(cluster:sandbox{})
    assert.equal("starting", assert(sb:get("unbound-1")).state)
    assert(sb:create{ id = "unready-1" })
    cluster:control("/_fake/condition", { claim = "unready-1", status = "False", reason = "SandboxNotReady",
      message = "Sandbox is not ready" })
    local again = assert(sb:get("unready-1"))
    assert.equal("starting", again.state)
    assert.is_nil(again.record.pod, "a session not running carries no pod to send to")
    local ids = {}
    for _, s in ipairs(assert(sb:list())) do ids[s.id] = s.state end
    assert.same({ "starting", "starting" }, { ids["unbound-1"], ids["unready-1"] })
    assert(sb:terminate("unready-1"))
  end)

  it("makes its claims in namespace default when neither the option nor the context names one", function()
    local sb = assert(cluster:sandbox{ kubeconfig = cluster:kubeconfig{ namespace = false, name = "no-namespace" } })
    assert.is_nil(sb:get("nowhere-1"))
    local reads = cluster:api_requests("GET", "/sandboxclaims/nowhere%-1$")
    assert.equal(1, #reads)
    assert.equal("/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/default/sandboxclaims/nowhere-1",
      reads[1].path)
  end)

  it("reaches the pod a Sandbox names in its pod-name annotation", function()
    local session = assert(assert(cluster:sandbox{ warm_pool = "named-pool" }):create{})
    assert.matches("^sandkit%-%x+$", session.id)
    assert.matches("%-pod$", session.record.pod.name)
    assert.equal("ok\n", assert(session:exec({ "echo", "ok" }, { timeout = 10 })).stdout)
    assert(session:terminate())
  end)

  it("hands back an existing session from get_or_create and creates a missing one", function()
    local sb = assert(cluster:sandbox{})
    local first, created = sb:get_or_create{ id = "goc-1" }
    assert(first, created)
    assert.is_true(created)
    local second, again = sb:get_or_create{ id = "goc-1" }
    assert.is_false(again)
    assert.equal(first.record.pod.uid, second.record.pod.uid)
    assert(sb:terminate("goc-1"))
  end)

  it("refuses session env and ids that are not DNS labels before sending anything", function()
    local sb = assert(cluster:sandbox{})
    local before = #cluster:requests()
    local _, err = sb:create{ id = "env-1", env = { K = "V" } }
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("env", err.field)
    for _, id in ipairs{ "Upper", "under_score", "-lead", "trail-", string.rep("a", 64) } do
      _, err = sb:create{ id = id }
      assert.equal("INVALID_INPUT", err.code, id)
      assert.equal("id", err.field, id)
    end
    assert.equal(before, #cluster:requests(), "nothing was sent")
  end)

  it("refuses a sandbox without what it needs, naming the option", function()
    local base = { provider = "kubernetes", warm_pool = "py-pool", signing_key = cluster.key_path,
      key_id = "k1", kubeconfig = cluster:kubeconfig() }
    local cases = { warm_pool = { warm_pool = "Not_A_Name" }, key_id = { key_id = "has space" },
      signing_key = { signing_key = "/nonexistent.pem" }, transport = { transport = "carrier-pigeon" },
      router_url = { transport = "router" }, capability_lifetime = { capability_lifetime = 60 },
      namespace = { namespace = "Bad_NS" }, kubeconfig = { kubeconfig = "/nonexistent/config" } }
    for field, change in pairs(cases) do
      local o = {}
      for k, v in pairs(base) do o[k] = v end
      for k, v in pairs(change) do o[k] = v end
      local sb, err = sandkit.sandbox(o)
      assert.is_nil(sb, field)
      assert.equal("INVALID_INPUT", err.code, field)
      assert.equal(field == "kubeconfig" and "kubeconfig" or field, err.field, field)
    end
  end)

  it("offers files, jobs, reconnect, list, pause/resume, fs, watch, lifetimes, labels, stdin and pty, "
      .. "and refuses preview and snapshot", function()
    local sb = assert(cluster:sandbox{})
    assert.same({ files = true, jobs = true, reconnect = true, list = true, fs = true, watch = true,
      preview = false, pause_resume = true, snapshot = false, set_lifetime = true, labels = true,
      stdin = true, pty = true },
      sb:capabilities())
    local session = assert(sb:create{ id = "caps-1" })
    local before = #cluster:requests()
    for _, call in ipairs{ function() return session:preview(8080) end,
        function() return session:snapshot() end } do
      local ok, err = call()
      assert.is_nil(ok)
      assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    end
    assert.equal(before, #cluster:requests())
    assert(session:terminate())
  end)

  it("names every sandbox option it accepts in OPTIONS, and each command-line flag maps onto one", function()
    for _, name in ipairs{ "warm_pool", "namespace", "kubeconfig", "context", "signing_key", "key_id",
        "transport", "router_url", "agent_port", "lifetime", "ready_timeout" } do
      assert.is_true(kubernetes.OPTIONS[name], name)
    end
    for _, flag in ipairs(kubernetes.CLI_OPTIONS) do
      assert.is_true(kubernetes.OPTIONS[flag.option], flag.flag)
      -- A secret's flag names the file it is read from: the option's name and "-file".
      local name = flag.secret_file and assert(flag.flag:match("^(.+)%-file$")) or flag.flag
      assert.equal(flag.option, (name:gsub("%-", "_")), "flags are the options' names")
    end
  end)

  it("gives one claim its own lifetime from create{ lifetime = S }, and refuses a fractional one", function()
    local sb = assert(cluster:sandbox{ lifetime = 600 })
    local session = assert(sb:create{ id = "own-life", lifetime = 120 })
    local shutdown = require("sandkit.time").parse_rfc3339(
      claim_of(cluster, "own-life").spec.lifecycle.shutdownTime)
    assert.is_true(math.abs(shutdown - (os.time() + 120)) <= 5)
    assert(session:terminate())
    local _, err = sb:create{ id = "bad-life", lifetime = 1.5 }
    assert.equal("lifetime", err.field)
  end)

  it("shows a claim's shutdownTime as expires_at and moves it with set_lifetime, a merge patch of the claim", function()
    local sb = assert(cluster:sandbox{ lifetime = 600 })
    assert.is_true(sb:capabilities().set_lifetime)
    local session = assert(sb:create{ id = "moved-life" })
    local time = require "sandkit.time"
    assert.equal(time.parse_rfc3339(claim_of(cluster, "moved-life").spec.lifecycle.shutdownTime), session.expires_at)
    assert(session:set_lifetime(7200))
    assert.is_true(math.abs(session.expires_at - (os.time() + 7200)) <= 1)
    local claim = claim_of(cluster, "moved-life")
    assert.equal(session.expires_at, time.parse_rfc3339(claim.spec.lifecycle.shutdownTime))
    assert.equal("Delete", claim.spec.lifecycle.shutdownPolicy, "the patch leaves the rest of the claim")
    assert.same({ name = "py-pool" }, claim.spec.warmPoolRef)
    local patches = cluster:api_requests("PATCH", CLAIMS .. "/moved%-life$")
    assert.equal(1, #patches)
    assert.matches("^application/merge%-patch%+json", patches[1].headers["content-type"])
    local fresh = assert(cluster:sandbox{})
    assert.equal(session.expires_at, assert(fresh:get("moved-life")).expires_at)
    local ok, err = session:set_lifetime(0 / 0)
    assert.is_nil(ok)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal(1, #cluster:api_requests("PATCH", CLAIMS .. "/moved%-life$"), "a refusal sends nothing")
    assert(session:terminate())
    ok, err = session:set_lifetime(60)
    assert.is_nil(ok)
    assert.is_true(err.not_ours, tostring(err))
  end)

  it("keeps a session's labels on its claim under label.sandkit.dev/ and lists by them with a selector", function()
    local sb = assert(cluster:sandbox{})
    local a = assert(sb:create{ id = "lab-a", labels = { team = "ml", run = "42" } })
    assert(sb:create{ id = "lab-b", labels = { team = "ml", run = "43" } })
    assert(sb:create{ id = "lab-c", labels = { team = "web" } })
    assert.same({ team = "ml", run = "42" }, a.labels)
    local claim = claim_of(cluster, "lab-a")
    assert.equal("ml", claim.metadata.labels["label.sandkit.dev/team"])
    assert.equal("sandkit", claim.metadata.labels["app.kubernetes.io/managed-by"])
    assert.same({ team = "web" }, assert(sb:get("lab-c")).labels)
    local function ids(labels)
      local out = {}
      for _, s in ipairs(assert(sb:list{ labels = labels })) do out[#out + 1] = s.id end
      table.sort(out)
      return out
    end
    assert.same({ "lab-a", "lab-b" }, ids{ team = "ml" })
    assert.same({ "lab-b" }, ids{ team = "ml", run = "43" })
    local lists = cluster:api_requests("GET", CLAIMS .. "$")
    assert.matches("labelSelector=app.kubernetes.io%%2Fmanaged%-by%%3Dsandkit%%2Clabel.sandkit.dev%%2Frun%%3D43"
      .. "%%2Clabel.sandkit.dev%%2Fteam%%3Dml", lists[#lists].query)
    local made, err = sb:create{ id = "lab-d", labels = { ["example.com/team"] = "ml" } }
    assert.is_nil(made)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches('"example.com/team"', err.message, 1, true)
    assert.is_nil(claim_of(cluster, "lab-d"), "nothing was sent")
    for _, id in ipairs{ "lab-a", "lab-b", "lab-c" } do assert(sb:terminate(id)) end
  end)

  it("reaches the agent through the API server's pods proxy, which drops Authorization", function()
    local session = assert(assert(cluster:sandbox{ transport = "apiserver" }):create{ id = "via-api" })
    assert.equal("through\n", assert(session:exec({ "echo", "through" }, { timeout = 10 })).stdout)
    local proxied = cluster:api_requests("POST",
      "^/api/v1/namespaces/" .. NS_PATTERN .. "/pods/[^/]+:8971/proxy/v1/exec$")
    assert.equal(1, #proxied)
    assert.equal("Bearer " .. kube_cluster.TOKEN, proxied[1].headers.authorization,
      "the API server's own credential, which it deletes before proxying")
    assert.truthy(proxied[1].headers["x-sandkit-capability"])
    assert(session:terminate())
  end)

  it("reaches the agent through agent-sandbox's router with its X-Sandbox headers and bearer", function()
    local sb = assert(cluster:sandbox{ transport = "router", router_url = cluster.router_url,
      router_token = "router-secret" })
    local session = assert(sb:create{ id = "via-router" })
    assert.equal("routed\n", assert(session:exec({ "echo", "routed" }, { timeout = 10 })).stdout)
    local routed = cluster:api_requests("POST", "^/v1/exec$")
    assert.equal(1, #routed)
    local h = routed[1].headers
    assert.equal(session.record.pod.sandbox, h["x-sandbox-id"])
    assert.equal(NS, h["x-sandbox-namespace"])
    assert.equal("8971", h["x-sandbox-port"])
    assert.equal(session.record.pod.ip, h["x-sandbox-pod-ip"])
    assert.equal("Bearer router-secret", h.authorization)
    assert(session:terminate())
    -- A wrong router token is the router's refusal, told apart from the agent's. Readiness
    -- waits through a 401 to its end, which only needs to outlast the claim's binding here.
    local bad = assert(cluster:sandbox{ transport = "router", router_url = cluster.router_url,
      router_token = "wrong", ready_timeout = 2 })
    local _, err = bad:create{ id = "via-router-2" }
    assert.matches("401", err.message)
  end)

  for _, way in ipairs{ "cert_data", "cert_file" } do
    it("authenticates with a client certificate and key (" .. way .. ", mTLS)", function()
      local sb = assert(cluster:sandbox{ kubeconfig = cluster:kubeconfig{ user = way } })
      local session = assert(sb:create{ id = "mtls-" .. way:gsub("_", "-") })
      local users = {}
      for _, e in ipairs(cluster:log_entries()) do if e.user then users[e.user] = true end end
      assert.is_true(users[kube_cluster.CLIENT_CN])
      assert(session:terminate())
    end)
  end

  it("verifies the API server as the kubeconfig's tls-server-name, sent as SNI", function()
    local sb = assert(cluster:sandbox{ kubeconfig = cluster:kubeconfig{ tls_server_name = true } })
    local session = assert(sb:create{ id = "named-tls" })
    local last
    for _, e in ipairs(cluster:log_entries()) do if e.request then last = e end end
    assert.equal(kube_cluster.SERVER_NAME, last.sni)
    assert(session:terminate())
  end)

  it("turns the API server's 401 into INVALID_INPUT naming the call, kept from tenants", function()
    local sb = assert(cluster:sandbox{ kubeconfig = cluster:kubeconfig{ token = "nobody-knows" } })
    local _, err = sb:get("anything")
    assert.equal("INVALID_INPUT", err.code)
    assert.equal(401, err.status)
    assert.matches("answered 401 Unauthorized to get sandboxclaims anything", err.message)
    assert.equal("Internal server error", err:external().message)
  end)
end)

describe("a kubernetes sandbox under faults", function()
  local cluster
  after_each(function() if cluster then cluster:stop() cluster = nil end end)

  local function start(opts)
    opts.pools = opts.pools or { ["py-pool"] = {} }
    cluster = kube_cluster.start(opts)
    return assert(cluster:sandbox(opts.sandbox))
  end

  it("settles a create whose answer was lost by reading the claim back: its nonce, its session", function()
    local sb = start{ faults = { drop_create = "committed" } }
    local session = assert(sb:create{ id = "lost-1" })
    assert.equal("running", session.state)
    assert.equal(1, claim_posts(cluster), "the create was never sent again")
  end)

  it("reports a lost create that made nothing as retryable, without sending it again", function()
    local sb = start{ faults = { drop_create = "uncommitted" } }
    local session, err = sb:create{ id = "lost-2" }
    assert.is_nil(session)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_true(err.retryable)
    assert.matches("nothing was created", err.message)
    assert.equal(1, claim_posts(cluster))
    assert.is_nil(claim_of(cluster, "lost-2"))
  end)

  it("settles a create answered with a 5xx page after it took effect the same way", function()
    local sb = start{ faults = { create_status = 504 } }
    assert(sb:create{ id = "gateway-1" })
    assert.equal(1, claim_posts(cluster))
  end)

  it("refuses an id whose claim someone else made (409, another nonce) and leaves that claim alone", function()
    local sb = start{ claims = { foreign_claim("taken-1", "py-pool", true) } }
    local session, err = sb:create{ id = "taken-1" }
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("already exists and is not this call's", err.message)
    assert.truthy(claim_of(cluster, "taken-1"))
    assert.equal(0, count(cluster:api_requests("DELETE")))
  end)

  for name, faults in pairs{ ["a dropped watch"] = { watch_drop = 2 },
      ["a 410 status"] = { watch_gone_status = 2 }, ["a 410 ERROR event"] = { watch_gone_event = 2 },
      ["watches the server ends cleanly at their timeout"] = { watch_seconds = 0.3 } } do
    it("waits through " .. name .. " by reading the claim and watching again", function()
      -- Bound only after the faulty watches are over, so their events cannot be missed.
      local sb = start{ faults = faults, pools = { ["py-pool"] = { bind_delay = 1 } } }
      local session = assert(sb:create{ id = "watch-1" })
      assert.equal("running", session.state)
      local watches = count(cluster:api_requests("GET", CLAIMS .. "$"), function(r) return r.query:match("watch=1") end)
      assert.is_true(watches >= 3, watches .. " watches")
      local gets = count(cluster:api_requests("GET", CLAIMS .. "/watch%-1$"))
      assert.is_true(gets >= 2, "a GET after each watch that stopped (" .. gets .. ")")
    end)
  end

  it("terminates a claim whose DELETE was answered 202 Accepted, and reads it as terminated until gone", function()
    local sb = start{ faults = { delete_pending = true } }
    assert(sb:create{ id = "accepted-1" })
    assert.is_true(sb:terminate("accepted-1"))
    local claim = assert(claim_of(cluster, "accepted-1"), "a finalizer holds the claim")
    assert.truthy(claim.metadata.deletionTimestamp)
    local accepted = cluster:api_requests("DELETE", CLAIMS .. "/accepted%-1$")
    assert.equal(1, #accepted)
    local session = assert(sb:get("accepted-1"))
    assert.equal("terminated", session.state)
    assert.is_nil(session.record.pod)
    assert.equal("terminated", assert(sb:list())[1].state)
  end)

  it("gives up on a claim never Ready at ready_timeout, saying what it last saw, and deletes it", function()
    local sb = start{ pools = { ["py-pool"] = { never_ready = true } }, sandbox = { ready_timeout = 1.5 } }
    local session, err = sb:create{ id = "never-1" }
    assert.is_nil(session)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.matches("did not become ready within 1.5s; last seen: claim Ready=False %(DependenciesNotReady: "
      .. "Pod is Running but not Ready%)", err.message)
    assert.is_nil(claim_of(cluster, "never-1"))
  end)

  it("fails at once on an expired claim, and reads an expired session as terminated", function()
    local sb = start{ pools = { ["py-pool"] = { expire_before_ready = true }, ["ok-pool"] = {} } }
    local session, err = sb:create{ id = "expired-1" }
    assert.is_nil(session)
    assert.equal("ClaimExpired", err.reason)
    assert.is_false(err.retryable)
    local other = assert(cluster:sandbox{ warm_pool = "ok-pool" })
    assert(other:create{ id = "expires-2" })
    cluster:control("/_fake/condition", { claim = "expires-2", status = "False", reason = "SandboxExpired",
      message = "Sandbox expired" })
    assert.equal("terminated", assert(other:get("expires-2")).state)
  end)

  it("runs a command exactly once on a pod recreated with a new UID: 403, read again, minted again", function()
    local sb = start{}
    local session = assert(sb:create{ id = "recreated-1" })
    assert.equal("run\n", run_once_file(session))
    local old_uid = session.record.pod.uid
    local made = cluster:control("/_fake/recreate", { pod = session.record.pod.name, same_ip = true })
    assert.are_not.equal(old_uid, made.uid)
    local pod_reads = count(cluster:api_requests("GET", "/pods/"))
    -- The new pod starts empty: one line means one run.
    assert.equal("run\n", run_once_file(session))
    assert.is_true(count(cluster:api_requests("GET", "/pods/")) > pod_reads, "the pod was read again")
    assert.equal("run\nrun\n", run_once_file(session), "the next request goes straight to the new pod")
  end)

  it("follows a pod recreated at a new address, the old one refusing connections", function()
    local sb = start{}
    local session = assert(sb:create{ id = "moved-1" })
    local made = cluster:control("/_fake/recreate", { pod = session.record.pod.name, same_ip = false })
    assert.are_not.equal(session.record.pod.ip, made.ip)
    assert.equal("run\n", run_once_file(session))
  end)

  it("reads a rotated token file again after a 401 and sends the request once more", function()
    start{}
    files.write(cluster.dir .. "/token", "first-token\n")
    cluster:control("/_fake/tokens", { tokens = { ["first-token"] = "rotating" } })
    local sb = assert(cluster:sandbox{ kubeconfig = cluster:kubeconfig{ user = "token_file" } })
    assert(sb:create{ id = "rotate-1" })
    files.write(cluster.dir .. "/token", "second-token\n")
    cluster:control("/_fake/tokens", { tokens = { ["second-token"] = "rotating" } })
    local again = assert(sb:get("rotate-1"))
    assert.equal("running", again.state)
    local statuses = {}
    for _, e in ipairs(cluster:log_entries()) do
      if e.user ~= nil then statuses[#statuses + 1] = e.user or "refused" end
    end
    assert.is_truthy(table.concat(statuses, ","):find("refused,rotating", 1, true))
  end)

  it("runs the exec plugin again after a 401 and sends the request once more", function()
    start{ tokens = { ["exec-token-1"] = "exec-user" } }
    local sb = assert(cluster:sandbox{ kubeconfig = cluster:kubeconfig{ user = "exec" } })
    assert(sb:create{ id = "exec-1" })
    cluster:control("/_fake/tokens", { tokens = { ["exec-token-2"] = "exec-user" } })
    assert.equal("running", assert(sb:get("exec-1")).state)
    assert.equal("2", files.read(cluster.dir .. "/exec-runs"):match("%d+"))
  end)

  it("runs the exec plugin once for sandkit.run tasks that need its credential at the same time", function()
    start{ tokens = { ["exec-token-1"] = "exec-user" } }
    local sb = assert(cluster:sandbox{ kubeconfig = cluster:kubeconfig{ user = "exec" } })
    local ok, states = sandkit.run(function()
      local tasks = {}
      for i = 1, 4 do tasks[i] = sandkit.spawn(function() return sb:get("none-" .. i) end) end
      local out = {}
      for i, task in ipairs(tasks) do
        local session, err = task:join()
        out[i] = session and session.state or (err and err.message) or "absent"
      end
      return out
    end)
    assert(ok, states)
    assert.same({ "absent", "absent", "absent", "absent" }, states)
    assert.equal("start\n", files.read(cluster.dir .. "/exec-starts"), "the plugin ran once")
  end)

  it("lists by following continue across pages that hold fewer claims than the limit", function()
    local sb = start{ faults = { page_size = 1 } }
    for i = 1, 3 do assert(sb:create{ id = "page-" .. i }) end
    local got = {}
    for _, s in ipairs(assert(sb:list())) do got[#got + 1] = s.id end
    table.sort(got)
    assert.same({ "page-1", "page-2", "page-3" }, got)
    local lists = {}
    for _, r in ipairs(cluster:api_requests("GET", CLAIMS .. "$")) do
      if not r.query:match("watch=") then lists[#lists + 1] = r.query end
    end
    assert.equal(3, #lists)
    assert.equal("labelSelector=app.kubernetes.io%2Fmanaged-by%3Dsandkit&limit=100", lists[1])
    assert.matches("&continue=", lists[2])
  end)

  for kind, fail in pairs{ ["a Status 503"] = 503, ["an HTML 502 page"] = "html" } do
    it("reports a list whose second page failed with " .. kind .. " as retryable, never as a short list", function()
      local sb = start{ faults = { page_size = 1, list_fail = { ["2"] = fail } } }
      for i = 1, 2 do assert(sb:create{ id = "fail-" .. i }) end
      local records, err = sb:list()
      assert.is_nil(records)
      assert.equal("SANDBOX_UNREACHABLE", err.code)
      assert.is_true(err.retryable)
      assert.equal(fail == "html" and 502 or 503, err.status)
    end)
  end

  it("reports a throttled call as RATE_LIMIT_EXCEEDED with the server's Retry-After", function()
    local sb = start{ faults = { throttle = { ["get sandboxclaims"] = 1 } } }
    local _, err = sb:get("any")
    assert.equal("RATE_LIMIT_EXCEEDED", err.code)
    assert.equal(2, err.retry_after)
    assert.is_true(err.retryable)
  end)

  it("names RBAC's refusal of a verb and the Role that must allow it, creating nothing", function()
    local sb = start{ faults = { forbid = { ["create sandboxclaims"] = true } } }
    local _, err = sb:create{ id = "rbac-1" }
    assert.equal("INVALID_INPUT", err.code)
    assert.equal(403, err.status)
    assert.matches("cannot create resource \"sandboxclaims\"", err.message)
    assert.matches("deploy/kubernetes/rbac.yaml", err.message)
    assert.is_true(err.internal)
    assert.is_nil(claim_of(cluster, "rbac-1"))
  end)

  it("says SESSION_EXPIRED of a request after agent-sandbox deleted a claim at its shutdownTime", function()
    local sb = start{}
    local session = assert(sb:create{ id = "ended-1" })
    assert(session:set_lifetime(1))
    -- The end itself is what is waited for: agent-sandbox deletes the claim at shutdownTime
    -- (its pod after it), not before.
    local deadline = wait.now() + 10
    while claim_of(cluster, "ended-1") or next(cluster:state().objects.pods[NS] or {}) do
      assert(wait.now() < deadline, "the claim and its pod did not go at their shutdownTime")
      wait.sleep(0.05)
    end
    assert.is_true(os.time() >= session.expires_at, "not before its end")
    local result, err = session:exec({ "true" }, { timeout = 5 })
    assert.is_nil(result)
    assert.equal("SESSION_EXPIRED", err.reason, tostring(err))
    assert.equal(session.expires_at, err.expires_at)
    assert.matches("reached the end of its lifetime", err.message)
    assert.equal("SANDBOX_UNREACHABLE", err.code, "the code the request's failure had stands")
    assert.matches("does not belong to this sandbox", err.message)
  end)

  it("never sends to a session deleted under it: the next request finds its claim gone", function()
    local sb = start{}
    local session = assert(sb:create{ id = "gone-1" })
    assert(assert(cluster:sandbox{}):terminate("gone-1"))
    -- Once the garbage collector took its pod, the request fails to connect, and the claim
    -- read again is gone.
    local deadline = wait.now() + 10
    while next(cluster:state().objects.pods[NS] or {}) do
      assert(wait.now() < deadline, "the pod was not collected")
      wait.sleep(0.02)
    end
    local result, err = session:exec({ "true" }, { timeout = 5 })
    assert.is_nil(result)
    assert.matches("does not belong to this sandbox", err.message)
  end)
end)

describe("a kubernetes sandbox whose claim cannot become ready", function()
  -- Every Ready=False reason agent-sandbox does not recover from, with the code and field it
  -- becomes.
  local REASONS = {
    { "InvalidMetadata", "INVALID_INPUT" },
    { "EnvVarsInjectionRejected", "INVALID_INPUT" },
    { "VolumeClaimTemplatesError", "INVALID_INPUT" },
    { "ClaimExpired", "SANDBOX_UNREACHABLE" },
    { "SandboxExpired", "SANDBOX_UNREACHABLE" },
  }
  local cluster
  setup(function()
    local pools = {}
    for _, case in ipairs(REASONS) do pools[case[1]:lower()] = { fail_reason = case[1] } end
    cluster = kube_cluster.start{ pools = pools }
  end)
  teardown(function() if cluster then cluster:stop() end end)

  for _, case in ipairs(REASONS) do
    local reason, code, field = case[1], case[2], case[3]
    it("fails at once on " .. reason .. ", naming it, and deletes its claim", function()
      local sb = assert(cluster:sandbox{ warm_pool = reason:lower(), ready_timeout = 10 })
      local id = "fails-" .. reason:lower()
      local started = wait.now()
      local session, err = sb:create{ id = id }
      assert.is_nil(session)
      assert.is_true(wait.now() - started < 5, "it did not wait for the timeout")
      assert.equal(code, err.code)
      assert.equal(reason, err.reason)
      assert.equal(field, err.field)
      assert.is_falsy(err.retryable)
      assert.matches("cannot become ready: claim Ready=False %(" .. reason .. ": ", err.message)
      assert.is_nil(claim_of(cluster, id))
      assert.equal(1, count(cluster:api_requests("DELETE", CLAIMS .. "/" .. id:gsub("%-", "%%-") .. "$")))
    end)
  end
end)
