-- The `sandkit` command with --provider kubernetes: the provider's options as flags, against
-- the fake cluster of spec/support/kube_cluster.lua; each flag is seen in what reaches it.

local kube_cluster = require "support.kube_cluster"
local local_state = require "support.local_state"
local time = require "sandkit.time"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local q = local_state.shell_quote

describe("the sandkit command with --provider kubernetes", function()
  local cluster, flags
  setup(function()
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {} }, router_token = "router-secret" }
    flags = table.concat({ "--provider kubernetes", "--warm-pool py-pool", "--signing-key", q(cluster.key_path),
      "--key-id", cluster.key_id, "--kubeconfig", q(cluster:kubeconfig()), "--namespace", kube_cluster.NAMESPACE,
      "--ready-timeout 20" }, " ")
  end)
  teardown(function() if cluster then cluster:stop() end end)

  local function sandkit(args, with)
    return local_state.sh(local_state.lua_env() .. " HOME=" .. q(cluster.dir) .. " " .. LUA
      .. " bin/sandkit " .. (with or flags) .. " " .. args)
  end

  it("runs a command in a throwaway claim and exits with its status, leaving no claim", function()
    local out, err, status = sandkit("run -- sh -c 'echo hi; echo oops >&2; exit 3'")
    assert.equal("hi\n", out, err)
    assert.equal("oops\n", err)
    assert.equal(3, status)
    assert.is_nil(next(cluster:state().objects.sandboxclaims[kube_cluster.NAMESPACE] or {}))
  end)

  it("creates, lists, moves files through and removes a named session", function()
    local out, err, status = sandkit("create cli-1 --label team=ml")
    assert.equal(0, status, err)
    assert.equal("cli-1\n", out)
    out = sandkit("ls")
    local stamp = "%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ"
    assert.matches("^NAME%s+STATE%s+GENERATION%s+CREATED%s+EXPIRES%s+LABELS\n"
      .. "cli%-1%s+running%s+1%s+" .. stamp .. "%s+" .. stamp .. "%s+team=ml\n$", out)
    assert.equal(out, sandkit("ls --label team=ml"))
    assert.matches("^NAME[^\n]*\n$", sandkit("ls --label team=web"))
    local local_file = cluster.dir .. "/up.txt"
    local f = assert(io.open(local_file, "w"))
    f:write("up")
    f:close()
    assert.equal(0, select(3, sandkit("put cli-1 " .. q(local_file) .. " /up.txt")))
    assert.equal("up", (sandkit("get cli-1 /up.txt -")))
    assert.equal(0, select(3, sandkit("rm cli-1")))
    assert.matches("^NAME%s+STATE%s+GENERATION%s+CREATED%s+EXPIRES%s+LABELS\n$", (sandkit("ls")), "no session is left")
  end)

  local function claims()
    return cluster:state().objects.sandboxclaims[kube_cluster.NAMESPACE] or {}
  end

  local function shutdown_in(name)
    local claim = assert(claims()[name], name)
    return time.parse_rfc3339(claim.spec.lifecycle.shutdownTime) - os.time()
  end

  it("gives claims the --lifetime before the command, and a command's own --lifetime after it", function()
    local _, err, status = sandkit("--lifetime 120 create life-a")
    assert.equal(0, status, err)
    assert.is_true(math.abs(shutdown_in("life-a") - 120) <= 5, "shutdownTime " .. shutdown_in("life-a") .. "s away")
    _, err, status = sandkit("--lifetime 120 create life-b --lifetime 300")
    assert.equal(0, status, err)
    assert.is_true(math.abs(shutdown_in("life-b") - 300) <= 5, "the command's own wins")
    _, err, status = sandkit("--lifetime 120 ls")
    assert.equal(0, status, "a command that makes no claim takes the flag as well: " .. err)
    _, err, status = sandkit("--lifetime 1.5 ls")
    assert.equal(2, status)
    assert.matches("%-%-lifetime takes a whole positive number of seconds", err)
    -- A lifetime no claim can be given is refused, and no claim is made: by the command line
    -- when it is no decimal number, by the provider when no shutdownTime can be written for it.
    for _, case in ipairs{ { "inf", 2 }, { "1e300", 2 }, { "1" .. string.rep("0", 300), 1 } } do
      _, err, status = sandkit("create life-c --lifetime " .. case[1])
      assert.equal(case[2], status, case[1] .. ": " .. err)
      assert.matches("^sandkit: [^\n]*lifetime[^\n]*\n$", err, nil, "--lifetime " .. case[1])
      assert.is_nil((cluster:state().objects.sandboxclaims[kube_cluster.NAMESPACE] or {})["life-c"], case[1])
    end
    assert.equal(0, select(3, sandkit("rm life-a life-b")))
  end)

  it("reaches the pod's agent through the API server's proxy with --transport apiserver", function()
    local before = #cluster:api_requests("POST", "/proxy/v1/exec$")
    local out, err, status = sandkit("--transport apiserver run -- echo proxied")
    assert.equal(0, status, err)
    assert.equal("proxied\n", out)
    local proxied = cluster:api_requests("POST", "/proxy/v1/exec$")
    assert.equal(before + 1, #proxied, "the command went through pods/proxy")
    local namespace = kube_cluster.NAMESPACE:gsub("%-", "%%-")
    assert.matches("^/api/v1/namespaces/" .. namespace .. "/pods/[^/]+:8971/proxy/v1/exec$", proxied[#proxied].path)
  end)

  it("reaches the agent through the router with --router-url and the token of --router-token-file", function()
    local token_file = cluster.dir .. "/router-token"
    local f = assert(io.open(token_file, "w"))
    f:write("router-secret\n")
    f:close()
    local before = #cluster:api_requests("POST", "^/v1/exec$")
    local out, err, status = sandkit("--transport router --router-url " .. q(cluster.router_url)
      .. " --router-token-file " .. q(token_file) .. " run -- echo routed")
    local _
    assert.equal(0, status, err)
    assert.equal("routed\n", out)
    local routed = cluster:api_requests("POST", "^/v1/exec$")
    assert.equal(before + 1, #routed)
    local h = routed[#routed].headers
    assert.equal("Bearer router-secret", h.authorization, "the file's token, without its newline")
    assert.equal(kube_cluster.NAMESPACE, h["x-sandbox-namespace"])
    assert.equal("8971", h["x-sandbox-port"])
    assert.truthy(h["x-sandbox-id"])
    -- Without the token the router refuses: the flag is what carried it. Readiness waits
    -- through a 401 to its end, which only needs to outlast the claim's binding here.
    _, err, status = sandkit("--transport router --router-url " .. q(cluster.router_url) .. " run -- true",
      (flags:gsub("%-%-ready%-timeout 20", "--ready-timeout 2")))
    assert.is_not.equal(0, status)
    assert.matches("401", err)
    -- A file too big to hold a token is refused before anything is sent.
    f = assert(io.open(token_file, "w"))
    f:write(string.rep("x", 4097))
    f:close()
    _, err, status = sandkit("--transport router --router-url " .. q(cluster.router_url)
      .. " --router-token-file " .. q(token_file) .. " ls")
    assert.equal(2, status)
    assert.matches("%-%-router%-token%-file takes a file of at most 4096 bytes", err)
    assert.is_nil(next(claims()), "no claim is left")
  end)

  it("reads the kubeconfig context --context names instead of the current one", function()
    -- A second context, made current, whose namespace differs: requests show which one was read.
    local path = cluster.dir .. "/kubeconfig-two-contexts"
    local text = assert(io.open(cluster:kubeconfig())):read("a")
    text = text:gsub("current%-context: fake", "- name: other\n  context:\n    cluster: fake\n    user: me\n"
      .. "    namespace: elsewhere\ncurrent-context: other")
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
    local base = "--provider kubernetes --warm-pool py-pool --signing-key " .. q(cluster.key_path)
      .. " --key-id " .. cluster.key_id .. " --kubeconfig " .. q(path)
    local function listed_namespace(with)
      local before = #cluster:api_requests("GET", "/sandboxclaims$")
      local _, err, status = sandkit("ls", base .. with)
      assert.equal(0, status, err)
      local lists = cluster:api_requests("GET", "/sandboxclaims$")
      assert.equal(before + 1, #lists)
      return lists[#lists].path:match("/namespaces/([^/]+)/")
    end
    assert.equal("elsewhere", listed_namespace(""), "without --context, the current one")
    assert.equal(kube_cluster.NAMESPACE, listed_namespace(" --context fake"))
    local _, err, status = sandkit("ls", base .. " --context nosuch")
    assert.is_not.equal(0, status)
    assert.matches("nosuch", err)
  end)

  it("refuses a flag the provider does not take, and a number that is not one, as usage errors", function()
    local _, err, status = sandkit("ls", flags .. " --isolate bwrap")
    assert.equal(2, status)
    assert.matches("%-%-isolate is not an option of the kubernetes provider", err)
    _, err, status = sandkit("ls", flags .. " --agent-port eighty")
    assert.equal(2, status)
    assert.matches("%-%-agent%-port takes a port number, not eighty", err)
    -- A provider option the command line lacks is the command line's mistake, like a bad flag.
    _, err, status = sandkit("ls", "--provider kubernetes --namespace " .. kube_cluster.NAMESPACE)
    assert.equal(2, status)
    assert.matches("warm_pool", err)
  end)
end)

describe("the sandkit command when a throwaway claim cannot be removed", function()
  local cluster, flags
  setup(function()
    -- RBAC that lets claims be made but not deleted: every removal fails, the same way each time.
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {} },
      faults = { forbid = { ["delete sandboxclaims"] = true } } }
    flags = table.concat({ "--provider kubernetes", "--warm-pool py-pool", "--signing-key", q(cluster.key_path),
      "--key-id", cluster.key_id, "--kubeconfig", q(cluster:kubeconfig()), "--namespace", kube_cluster.NAMESPACE,
      "--ready-timeout 20" }, " ")
  end)
  teardown(function() if cluster then cluster:stop() end end)

  local function sandkit(args)
    return local_state.sh(local_state.lua_env() .. " HOME=" .. q(cluster.dir) .. " " .. LUA
      .. " bin/sandkit " .. flags .. " " .. args)
  end

  --- The claims left in the namespace, by name.
  local function claims()
    local names = {}
    for name in pairs(cluster:state().objects.sandboxclaims[kube_cluster.NAMESPACE] or {}) do
      names[#names + 1] = name
    end
    return names
  end

  it("says which session it left behind, and exits 125 though the command succeeded", function()
    local out, err, status = sandkit("run -- echo done")
    assert.equal("done\n", out, err)
    assert.equal(125, status, err)
    local left = claims()
    assert.equal(1, #left, "the claim is still there")
    assert.matches("^sandkit: session " .. left[1]:gsub("%-", "%%-") .. " was not removed: [^\n]+\n$", err)
  end)

  it("keeps the status of a command that failed, and still says what it left behind", function()
    local before = #claims()
    local out, err, status = sandkit("run -- sh -c 'exit 3'")
    assert.equal("", out, err)
    assert.equal(3, status, err)
    assert.equal(before + 1, #claims())
    assert.matches("^sandkit: session [%w%-]+ was not removed: [^\n]+\n$", err)
  end)
end)
