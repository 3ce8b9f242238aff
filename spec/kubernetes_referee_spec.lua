-- The referee: Debian's python3-kubernetes (CustomObjectsApi, watch.Watch, load_kube_config)
-- against the same fake API server and kubeconfig files as sandkit. Where both read the fake
-- alike, the fake speaks Kubernetes as a real client reads it; each check also runs sandkit on
-- the same objects.

local cjson = require "cjson"
local core = require "sandkit.core"
local json = require "sandkit.json"
local files = require "support.files"
local kube_cluster = require "support.kube_cluster"
local processes = require "support.processes"

local PYTHON = "/usr/bin/python3"
--- Seconds a request may take: the longest is a watch of 20 s.
local ANSWER_TIMEOUT = 60

--- The referee process (spec/support/kube_referee.py) that serves this file, started at the
-- first request: python3-kubernetes takes most of a second to import, paid once, not per check.
local served

local function referee(kubeconfig, ...)
  if not served then
    local dir = files.temp_dir()
    served = { dir = dir, answers = dir .. "/answers", said = dir .. "/stderr", asked = 0 }
    served.requests = assert(io.popen(PYTHON .. " spec/support/kube_referee.py " .. files.shell_quote(served.answers)
      .. " 2>" .. files.shell_quote(served.said), "w"))
  end
  local function failed(why) return "the referee failed: " .. why .. (files.read(served.said) or "") end
  assert(served.requests:write(cjson.encode({ kubeconfig, ... }), "\n"), failed("it left; "))
  assert(served.requests:flush(), failed("it left; "))
  served.asked = served.asked + 1
  local line
  local answered = processes.within(ANSWER_TIMEOUT, function()
    local n = 0
    for l in (files.read(served.answers) or ""):gmatch("([^\n]*)\n") do
      n = n + 1
      if n == served.asked then line = l return true end
    end
    return false
  end)
  assert(answered, failed("no answer within " .. ANSWER_TIMEOUT .. " s; "))
  local out = cjson.decode(line)
  assert(out.referee_failed == nil, failed(tostring(out.referee_failed)))
  return out
end

teardown(function()
  if served then
    served.requests:close()
    core.remove_tree(served.dir)
  end
end)

describe("python3-kubernetes and sandkit against the fake API server", function()
  local cluster
  setup(function()
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, faults = { page_size = 1 } }
  end)
  teardown(function() if cluster then cluster:stop() end end)

  it("both authenticate with each kubeconfig sandkit reads, and both read a 404 as absent", function()
    for _, user in ipairs{ "token", "cert_data", "cert_file", "exec" } do
      for _, api in ipairs(user == "exec" and { "v1", "v1beta1" } or { "v1" }) do
        local kubeconfig = cluster:kubeconfig{ user = user, exec_api = api,
          name = "referee-" .. user .. "-" .. api }
        cluster:control("/_fake/tokens", { tokens = { [kube_cluster.TOKEN] = "admin",
          ["exec-token-1"] = "exec", ["exec-token-2"] = "exec", ["exec-token-3"] = "exec",
          ["exec-token-4"] = "exec" } })
        local seen = referee(kubeconfig, "get", "no-such-claim")
        assert.equal(404, seen.status, user)
        assert.equal("Status", seen.body.kind)
        assert.equal("NotFound", seen.body.reason)
        local sb = assert(cluster:sandbox{ kubeconfig = kubeconfig })
        local record, err = sb:get("no-such-claim")
        assert.is_nil(record, user)
        assert.is_nil(err, user .. ": " .. tostring(err))
      end
    end
    local wrong = cluster:kubeconfig{ token = "wrong", name = "referee-wrong" }
    assert.equal(401, referee(wrong, "get", "x").status)
    local _, err = assert(cluster:sandbox{ kubeconfig = wrong }):get("x")
    assert.equal(401, err.status)
  end)

  it("a claim python creates in sandkit's shape is a session sandkit reaches, seen Ready by python's watch", function()
    local kubeconfig = cluster:kubeconfig()
    local created = referee(kubeconfig, "create", "from-python", "py-pool", "python-nonce")
    local rv = created.metadata.resourceVersion
    local watched = referee(kubeconfig, "watch", "from-python", rv, "20").events
    local last = watched[#watched]
    assert.equal("MODIFIED", last.type)
    assert.equal("True", last.ready)
    for i = 2, #watched do
      assert.is_true(tonumber(watched[i].rv) >= tonumber(watched[i - 1].rv),
        "resource versions never go back, bookmarks included: " .. cjson.encode(watched))
    end
    local sb = assert(cluster:sandbox{})
    local session = assert(sb:get("from-python"))
    assert.equal("running", session.state)
    assert.equal(created.metadata.uid, session.record.claim_uid)
    assert.equal("py\n", assert(session:exec({ "echo", "py" }, { timeout = 10 })).stdout)
  end)

  it("a claim sandkit creates reads the same to python, and both list the same claims page by page", function()
    local sb = assert(cluster:sandbox{})
    local session = assert(sb:create{ id = "from-sandkit" })
    local kubeconfig = cluster:kubeconfig()
    local seen = referee(kubeconfig, "get", "from-sandkit")
    assert.equal(session.record.claim_uid, seen.metadata.uid)
    assert.equal("sandkit", seen.metadata.labels["app.kubernetes.io/managed-by"])
    assert.matches("^%x+$", seen.metadata.annotations["sandkit.dev/nonce"])
    assert.same({ name = "py-pool" }, seen.spec.warmPoolRef)
    assert.equal("Delete", seen.spec.lifecycle.shutdownPolicy)
    assert.equal("True", seen.status.conditions[1].status)

    local listed = referee(kubeconfig, "list", "100")
    local ours = {}
    for _, s in ipairs(assert(sb:list())) do ours[#ours + 1] = s.id end
    table.sort(ours)
    assert.same(listed.names, ours)
    assert.equal(#ours, json.integer(listed.pages), "one claim a page: the fake's page size")
  end)

  it("a delete with a stale uid precondition is a 409 to both, and with the right one it deletes", function()
    local sb = assert(cluster:sandbox{})
    local session = assert(sb:create{ id = "to-delete" })
    local kubeconfig = cluster:kubeconfig()
    local stale = referee(kubeconfig, "delete", "to-delete", "00000000-0000-4000-8000-000000000000")
    assert.equal(409, stale.status)
    assert.equal("Conflict", stale.body.reason)
    assert.equal("running", assert(sb:get("to-delete")).state, "a refused delete deletes nothing")
    local done = referee(kubeconfig, "delete", "to-delete", session.record.claim_uid)
    assert.equal("to-delete", done.metadata.name)
    assert.is_nil(sb:get("to-delete"))
    -- sandkit's terminate of what is already gone succeeds, as DELETE's 404 means.
    assert.is_true(sb:terminate("to-delete"))
  end)
end)

describe("python3-kubernetes and sandkit facing an expired watch", function()
  it("python reports the 410 ERROR event as ApiException 410; sandkit reads the claim and watches again", function()
    local cluster = kube_cluster.start{ pools = { ["py-pool"] = { bind_delay = 1 } },
      faults = { watch_gone_event = 1 } }
    local ok, err = pcall(function()
      local kubeconfig = cluster:kubeconfig()
      local created = referee(kubeconfig, "create", "expired-watch", "py-pool", "n")
      local seen = referee(kubeconfig, "watch", "expired-watch", created.metadata.resourceVersion, "5")
      assert.equal(410, seen.status)
      assert.matches("^Expired: too old resource version", seen.reason)
      local session = assert(assert(cluster:sandbox{}):create{ id = "after-410" })
      assert.equal("running", session.state)
    end)
    cluster:stop()
    assert(ok, err)
  end)
end)
