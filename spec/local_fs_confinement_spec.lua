-- A confined local session's files as a filesystem (README "Files as a filesystem", docs/agent.md
-- "Confinement"): what the files API makes belongs to the sandbox user as much as what its
-- commands make, a link a command planted is never followed out of the session, the session's
-- private /tmp is the one listed, a watch sees what commands do, an archive's owners and set-id
-- bits stay out, and a tree a command locked is still removed. The real agent and bubblewrap.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local cleanups = require "support.cleanups"
local files = require "support.files"
local fs_roundtrip = require "support.fs_roundtrip"
local local_state = require "support.local_state"
local tar = require "support.tar"

local q = local_state.shell_quote
local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local HOME = "/home/user"

--- A file name's tail no other process on the machine uses.
local function unique()
  return string.format("%d-%06d", os.time(), math.random(0, 999999))
end

--- A host directory anyone may read, holding `secret`: what a followed link would reach.
local function host_canary()
  local dir = files.temp_dir(493)
  files.write(dir .. "/secret", "host secret")
  assert(files.execute("chmod 0644 " .. q(dir .. "/secret")))
  return dir
end

describe("a confined local session's files", function()
  local root, session, why_not
  setup(function()
    root = local_state.new()
    local sandbox = assert(sandkit.sandbox{ provider = "local", root = root, command_timeout = 30 })
    local err
    session, err = sandbox:create{ id = "cfs" }
    if not session and err.code == "INVALID_INPUT" and err.field == "isolate" then
      why_not = "this machine cannot confine a session: " .. err.message
    else
      assert(session, err)
    end
  end)
  teardown(function() local_state.clean(root) end)

  --- The session, or pending with the machine's reason when it cannot confine one.
  local function confined()
    if why_not then pending(why_not) end
    return session
  end

  --- Runs a shell script in the session; its stdout, having checked it exited 0.
  local function sh(script)
    local r = assert(confined():exec({ "sh", "-c", script }, { timeout = 30 }))
    assert.equal(0, r.code, r.stderr)
    return r.stdout
  end

  --- What the call answered when it refused: its error's reason.
  local function refusal(ok, err)
    assert.is_nil(ok, "refused")
    return err and err.reason
  end

  it("belong to the sandbox user when the files API made them: a command sees itself as their owner and "
    .. "changes and removes them", function()
    local s = confined()
    if not s then return end
    local src = fs_roundtrip.tree()
    finally(function() core.remove_tree(src) end)
    assert(s:mkdir(HOME .. "/made/dir/deep"))
    assert(s:write_dir_from(HOME .. "/made/tree", src))
    assert(s:write_files{ [HOME .. "/made/file"] = "x" })
    assert(s:rename(HOME .. "/made/file", HOME .. "/made/new/renamed"))
    local owners = sh("cd " .. HOME .. " && touch own && id -u && stat -c %u own && stat -c %u made made/dir "
      .. "made/dir/deep made/tree made/tree/a.txt made/tree/sub made/tree/sub/b.bin made/new made/new/renamed")
    local uids = {}
    for uid in owners:gmatch("%d+") do uids[#uids + 1] = uid end
    assert.equal(11, #uids, owners)
    assert.equal("1000", uids[1])
    for i = 2, #uids do assert.equal(uids[1], uids[i], owners) end
    sh("cd " .. HOME .. "/made && echo more >> new/renamed && chmod 0600 tree/a.txt && mv new/renamed tree/moved "
      .. "&& rmdir new dir/deep && rm -r tree && rmdir dir")
    assert.same({}, assert(s:list(HOME .. "/made")), "the command removed all of it")
  end)

  it("never follow a link a command planted out of the session: list, stat, remove, rename, read_dir_to "
    .. "and watch", function()
    local s = confined()
    if not s then return end
    local canary = host_canary()
    local defer = cleanups.of(finally)
    defer(function() core.remove_tree(canary) end)
    sh("mkdir -p " .. HOME .. "/trap/d && cd " .. HOME .. "/trap && ln -s / root && ln -s /etc/shadow shadow"
      .. " && ln -s " .. q(canary) .. " host && ln -s " .. q(canary .. "/secret") .. " d/secret"
      .. " && ln -s / " .. HOME .. "/rootlink && ln -s " .. q(canary) .. " " .. HOME .. "/hostlink")
    local trap = HOME .. "/trap"

    local seen = {}
    for _, e in ipairs(assert(s:list(trap, { depth = 4 }))) do
      seen[#seen + 1] = e.path .. " " .. e.type .. " " .. (e.target or "")
    end
    assert.same({ trap .. "/d dir ", trap .. "/d/secret symlink " .. canary .. "/secret", trap .. "/host symlink "
      .. canary, trap .. "/root symlink /", trap .. "/shadow symlink /etc/shadow" }, seen)
    local shadow = assert(s:stat(trap .. "/shadow"))
    assert.same({ "symlink", "/etc/shadow" }, { shadow.type, shadow.target })
    for _, through in ipairs{ HOME .. "/rootlink", HOME .. "/rootlink/etc", HOME .. "/hostlink" } do
      assert.equal("PATH_REFUSED", refusal(s:list(through)), through)
    end
    assert.equal("PATH_REFUSED", refusal(s:stat(HOME .. "/rootlink/etc/passwd")))
    assert.equal("PATH_REFUSED", refusal(s:stat(HOME .. "/hostlink/secret")))

    local out = files.temp_dir()
    defer(function() core.remove_tree(out) end)
    assert(s:read_dir_to(trap, out .. "/trap"))
    local links = assert(io.popen("cd " .. q(out .. "/trap") .. " && find . -printf '%p %y %l\\n' | sort"))
    local listed = links:read("a")
    links:close()
    assert.equal(table.concat({ ". d ", "./d d ", "./d/secret l " .. canary .. "/secret", "./host l " .. canary,
      "./root l /", "./shadow l /etc/shadow", "" }, "\n"), listed, "the links came out as links")
    assert.equal("PATH_REFUSED", refusal(s:read_dir_to(HOME .. "/hostlink", out .. "/through")))
    assert.is_nil(io.open(out .. "/through/secret"), "nothing came through the link")

    assert.equal("PATH_REFUSED", refusal(s:rename(HOME .. "/hostlink/secret", HOME .. "/stolen")))
    assert.equal("PATH_REFUSED", refusal(s:rename(HOME .. "/rootlink/etc/passwd", HOME .. "/stolen")))
    assert.equal("PATH_REFUSED", refusal(s:rename(trap .. "/d", HOME .. "/hostlink/d")))
    for _, through in ipairs{ HOME .. "/hostlink", HOME .. "/rootlink", HOME .. "/rootlink/etc" } do
      local ok, err = pcall(function() for _ in s:watch(through, { timeout = 1 }) do end end)
      assert.is_false(ok, through)
      assert.equal("PATH_REFUSED", err.reason, through)
    end

    assert(s:remove(HOME .. "/hostlink", { recursive = true }))
    assert(s:remove(HOME .. "/rootlink", { recursive = true }))
    assert(s:remove(trap, { recursive = true }))
    assert.is_nil(s:stat(trap))
    assert.is_nil(s:stat(HOME .. "/rootlink"))
    assert.equal("host secret", files.read(canary .. "/secret"), "the host's file is untouched")
    assert.equal("ok\n", sh("test -x /usr/bin/env && test -d " .. HOME .. " && echo ok"),
      "the session's root is untouched")
  end)

  it("list and stat the session's private /tmp: a file a command wrote there, and none of the host's", function()
    local s = confined()
    if not s then return end
    local mine, hosts = "sk-session-" .. unique(), "sk-host-" .. unique()
    files.write("/tmp/" .. hosts, "host")
    finally(function() os.remove("/tmp/" .. hosts) end)
    sh("printf hi > /tmp/" .. mine)
    local names = {}
    for _, e in ipairs(assert(s:list("/tmp"))) do names[e.name] = true end
    assert.is_true(names[mine], "the command's file is listed")
    assert.is_nil(names[hosts], "the host's is not")
    assert.equal(2, assert(s:stat("/tmp/" .. mine)).size)
    assert.is_nil(s:stat("/tmp/" .. hosts))
    assert.is_nil(io.open("/tmp/" .. mine), "the command wrote nothing in the host's /tmp")
  end)

  it("are watched as commands change them: a file a command creates is an event", function()
    local s = confined()
    if not s then return end
    assert(s:mkdir(HOME .. "/watched"))
    local events = s:watch(HOME .. "/watched", { timeout = 2 })
    sh("printf x > " .. HOME .. "/watched/new")
    local seen = {}
    for event in events do seen[#seen + 1] = event.type .. " " .. event.path end
    assert.equal("timeout", events.reason)
    assert.equal("create " .. HOME .. "/watched/new", seen[1], table.concat(seen, "\n"))
  end)

  it("take an archive's files as the sandbox user's, without their owners or setuid and setgid bits", function()
    local s = confined()
    if not s then return end
    local script = "#!/bin/sh\necho ran\n"
    local archive = tar.archive(
      tar.entry({ name = "bin", type = "5", mode = tonumber("6755", 8), uid = 0, gid = 0 }),
      tar.entry({ name = "bin/tool", mode = tonumber("6755", 8), uid = 0, gid = 0, size = #script }, script),
      tar.entry({ name = "plain", mode = tonumber("2644", 8), uid = 4242, gid = 4242, size = 2 }, "ok"))
    local sent = false
    assert(s:write_dir_from(HOME .. "/ar", function()
      if sent then return nil end
      sent = true
      return archive
    end))
    assert.equal("1000 1000 755 bin\n1000 1000 755 bin/tool\n1000 1000 644 plain\nran\n",
      sh("cd " .. HOME .. "/ar && stat -c '%u %g %a %n' bin bin/tool plain && ./bin/tool"))
  end)

  it("are removed as a tree a command made, its read-only and closed directories and a depth no path can "
    .. "name included", function()
    local s = confined()
    if not s then return end
    sh("cd " .. HOME .. " && mkdir -p locked/a/b locked/c locked/deep && touch locked/a/b/f locked/a/g locked/c/h"
      .. " && chmod 0400 locked/a/g && chmod 0500 locked/a/b locked/a && chmod 0000 locked/c && cd locked/deep"
      .. " && exec perl -e 'for (1..3000) { mkdir \"n\" or die; chdir \"n\" or die } open(F, \">f\") or die'")
    assert(s:remove(HOME .. "/locked", { recursive = true }))
    assert.is_nil(s:stat(HOME .. "/locked"))
    assert.equal("gone\n", sh("test ! -e " .. HOME .. "/locked && echo gone"))
  end)

  it("are copied both ways by sandkit cp -r, and what a command made comes out", function()
    if not confined() then return end
    local cli_root = local_state.new()
    local src = files.temp_dir()
    finally(function()
      core.remove_tree(src)
      local_state.clean(cli_root)
    end)
    --- Runs the sandkit command on cli_root; its stdout, having checked it exited 0.
    local function cli(args)
      local out, err, status = local_state.sh(local_state.lua_env() .. " " .. LUA .. " bin/sandkit --root "
        .. q(cli_root) .. " " .. args)
      assert.equal(0, status, err)
      return out
    end
    assert(files.execute("mkdir -p " .. q(src .. "/proj/sub") .. " && printf one > " .. q(src .. "/proj/a")
      .. " && printf two > " .. q(src .. "/proj/sub/b")))
    cli("create work")
    cli("cp -r " .. q(src .. "/proj") .. " work:" .. HOME .. "/in")
    assert.equal("two1000\n1000\n1000\n", cli("run --session work -- sh -c " .. q("cd " .. HOME
      .. " && cat in/sub/b && id -u && stat -c %u in in/sub/b && mkdir -p out/deep && printf made > out/deep/m"
      .. " && mv in out/in")))
    cli("cp -r work:" .. HOME .. "/out " .. q(src .. "/back"))
    assert.equal("made", files.read(src .. "/back/deep/m"))
    assert.equal("one", files.read(src .. "/back/in/a"))
  end)
end)
