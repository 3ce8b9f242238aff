-- The `sandkit` command with --provider kubernetes: the provider's options as flags before
-- any subcommand, against the fake cluster of spec/support/kube_cluster.lua.

local kube_cluster = require "support.kube_cluster"
local local_state = require "support.local_state"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local q = local_state.shell_quote

describe("the sandkit command with --provider kubernetes", function()
  local cluster, flags
  setup(function()
    cluster = kube_cluster.start{ pools = { ["py-pool"] = {} } }
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
    local out, err, status = sandkit("create cli-1")
    assert.equal(0, status, err)
    assert.equal("cli-1\n", out)
    out = sandkit("ls")
    assert.matches("^NAME%s+STATE%s+GENERATION%s+CREATED\n"
      .. "cli%-1%s+running%s+1%s+%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ\n$", out)
    local local_file = cluster.dir .. "/up.txt"
    local f = assert(io.open(local_file, "w"))
    f:write("up")
    f:close()
    assert.equal(0, select(3, sandkit("put cli-1 " .. q(local_file) .. " /up.txt")))
    assert.equal("up", (sandkit("get cli-1 /up.txt -")))
    assert.equal(0, select(3, sandkit("rm cli-1")))
    assert.matches("^NAME%s+STATE%s+GENERATION%s+CREATED\n$", (sandkit("ls")), "no session is left")
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
