-- The `sandkit` command, run as a separate process against a private state folder.

local local_state = require "support.local_state"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local q = local_state.shell_quote

describe("the sandkit command", function()
  local root
  local function sandkit(args)
    return local_state.sh(local_state.lua_env() .. " " .. LUA .. " bin/sandkit --root " .. q(root) .. " " .. args)
  end
  before_each(function() root = local_state.new() end)
  after_each(function() local_state.clean(root) end)

  it("streams a command's stdout and stderr to its own and exits with its status", function()
    local out, err, status = sandkit("run -- sh -c 'echo hi; echo oops >&2; exit 3'")
    assert.equal("hi\n", out)
    assert.equal("oops\n", err)
    assert.equal(3, status)
  end)

  it("removes the throwaway session a run without --session used", function()
    sandkit("run -- true")
    local out = sandkit("ls")
    assert.equal("", out)
  end)

  it("exits 124 with a one-line reason when the command outlives its timeout", function()
    local out, err, status = sandkit("run --timeout 0.3 -- sleep 30")
    assert.equal("", out)
    assert.equal(124, status)
    assert.matches("^sandkit: [^\n]*timeout[^\n]*\n$", err)
  end)

  it("exits 127 when the program cannot be started", function()
    local _, err, status = sandkit("run -- /no/such/program")
    assert.equal(127, status)
    assert.matches("^sandkit: ", err)
  end)

  it("passes --cwd and --env to the command", function()
    sandkit("create work")
    sandkit("run --session work -- mkdir sub")
    local out, _, status = sandkit("run --session work --cwd /sub --env A=1 --env B=x=y -- "
      .. "sh -c 'pwd | sed s,.*/,,; echo $A $B'")
    assert.equal(0, status)
    assert.equal("sub\n1 x=y\n", out)
  end)

  it("copies files in and out of a named session", function()
    local src = os.tmpname()
    local f = io.open(src, "wb")
    f:write("bytes\0and more")
    f:close()
    assert.equal("work\n", (sandkit("create work")))
    local _, err, status = sandkit("put work " .. q(src) .. " /data/in.bin")
    assert.equal(0, status, err)
    local out = sandkit("get work /data/in.bin -")
    assert.equal("bytes\0and more", out)
    os.remove(src)
  end)

  it("lists sessions and removes them", function()
    sandkit("create a1")
    sandkit("create b2")
    assert.equal("a1\trunning\t1\nb2\trunning\t1\n", (sandkit("ls")))
    local _, _, status = sandkit("rm a1 b2")
    assert.equal(0, status)
    assert.equal("", (sandkit("ls")))
  end)

  it("starts a job, polls it, and follows it to its exit status", function()
    sandkit("create jobs")
    local id = (sandkit("job start jobs -- sh -c 'echo one; echo two >&2; exit 6'")):match("^(%S+)\n$")
    assert.is_not_nil(id)
    local out, err, status = sandkit("job poll jobs " .. id .. " --follow")
    assert.equal("one\n", out)
    assert.equal("two\n", err)
    assert.equal(6, status)
  end)

  it("cancels a job", function()
    sandkit("create jobs")
    local id = (sandkit("job start jobs -- sleep 60")):match("^(%S+)\n$")
    local _, _, status = sandkit("job cancel jobs " .. id)
    assert.equal(0, status)
    local _, err, follow = sandkit("job poll jobs " .. id .. " --follow")
    assert.equal(125, follow)
    assert.matches("cancel", err)
  end)

  it("refuses a malformed command line with status 2", function()
    for _, args in ipairs({ "run sh", "frobnicate", "run --timeout x -- true", "run --env NOVALUE -- true" }) do
      local _, _, status = sandkit(args)
      assert.equal(2, status, args)
    end
  end)
end)
