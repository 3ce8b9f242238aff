-- Images of the local provider (README "Images"): a confined session starts from a named root
-- filesystem, seen copy-on-write; images are imported from a directory or a tar stream (checked
-- as a stranger's archive), committed from a session, built with mmdebstrap, listed and removed;
-- nothing of a failed one is left. The images are busybox trees made here.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local files = require "support.files"
local images = require "support.images"
local local_state = require "support.local_state"
local tar = require "support.tar"

local q = local_state.shell_quote
local unpack = table.unpack or rawget(_G, "unpack")

--- A megabyte of the image the copy-on-write specs start from: large enough that a copy would
-- show in the session's folder, small enough to make in a moment.
local BIG_BYTES = 4 * 1024 * 1024

local function exec(session, script)
  return assert(session:exec({ "/bin/sh", "-c", script }, { timeout = 30 }))
end

--- Bytes the files under dir take on disk (du), as a number.
local function disk_usage(dir)
  local out = local_state.sh("du -sk " .. q(dir) .. " | cut -f1")
  return tonumber(out) * 1024
end

--- What a failed image must not leave under images/: its name, or a folder in the making.
local function assert_no_image_left(root, name)
  for _, entry in ipairs(core.listdir(root .. "/images") or {}) do
    assert.is_nil(entry:find(name, 1, true), "nothing of " .. name .. " is left: " .. entry)
  end
end

describe("a local image", function()
  local root, sandbox, work
  before_each(function()
    root = local_state.new()
    work = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  end)
  after_each(function()
    local_state.clean(root)
    core.remove_tree(work)
  end)

  --- A confined session from an image, or pending with the machine's reason.
  local function create(opts)
    local session, err = sandbox:create(opts)
    if not session and err.code == "INVALID_INPUT" and err.field == "isolate" then
      pending("this machine cannot confine a session: " .. err.message)
      return nil
    end
    return assert(session, err)
  end

  local function import_busybox(name, extra)
    if not images.available() then
      pending("busybox-static is not installed (" .. images.BUSYBOX .. ")")
      return nil
    end
    local tree = images.busybox_tree(work .. "/" .. name, extra)
    return assert(sandbox:image_import(name, tree))
  end

  describe("starts a session", function()
    it("whose / is the image's tree, not this machine's system folders", function()
      if not import_busybox("tiny", { ["etc/motd"] = "from the image\n" }) then return end
      local session = create{ image = "tiny" }
      if not session then return end
      assert.equal("from the image\n", exec(session, "cat /etc/motd").stdout)
      local r = exec(session, "ls /usr")
      assert.are_not.equal(0, r.code, "the host's /usr is not there")
      assert.equal("1000\n", exec(session, "id -u").stdout)
      assert.equal("/home/user\n", exec(session, "pwd").stdout, "the sandbox user's home is made in it")
    end)

    it("copy-on-write: starting copies nothing, writes never reach the image, two sessions never see each other's",
      function()
        if not import_busybox("big", { ["data/big"] = string.rep("b", BIG_BYTES), ["data/keep"] = "kept\n" }) then
          return
        end
        -- The session's user may change what the image lets everyone change.
        assert(files.execute("chmod 0777 " .. q(root .. "/images/big/rootfs/data") .. " && chmod 0666 "
          .. q(root .. "/images/big/rootfs/data/big")))
        local a = create{ image = "big" }
        if not a then return end
        local b = create{ image = "big" }
        assert.is_true(disk_usage(root .. "/sessions/" .. a.id) < BIG_BYTES / 4,
          "a session from an image holds no copy of it")
        assert.equal(0, exec(a, "echo changed >> /data/big && rm /data/keep && echo mine > /data/new").code)
        assert.equal(BIG_BYTES, #files.read(root .. "/images/big/rootfs/data/big"), "the image's file is as it was")
        assert.equal("kept\n", files.read(root .. "/images/big/rootfs/data/keep"))
        assert.is_nil(files.read(root .. "/images/big/rootfs/data/new"))
        assert.equal("kept\n", exec(b, "cat /data/keep").stdout, "the other session sees the image")
        assert.equal(tostring(BIG_BYTES) .. "\n", exec(b, "wc -c < /data/big").stdout)
        assert.are_not.equal(0, exec(b, "cat /data/new").code)
        assert.equal("mine\n", exec(a, "cat /data/new").stdout)
      end)

    it("and is served again from it, with its own changes, after its agent died", function()
      if not import_busybox("again", { ["etc/motd"] = "image\n" }) then return end
      local session = create{ image = "again" }
      if not session then return end
      assert.equal(0, exec(session, "echo changed > /home/user/mine").code)
      local pid = session.record.pid
      core.kill(pid, core.SIGKILL)
      assert.is_true(require("support.processes").within(10, function()
        return not core.alive(pid) or core.reap(pid)
      end))
      local revived = assert(sandbox:get_or_create{ id = session.id })
      assert.equal(2, revived.generation)
      assert.equal("image\nchanged\n", exec(revived, "cat /etc/motd /home/user/mine").stdout)
      local ok, err = sandbox:image_remove("again")
      assert.is_nil(ok, "the revived session still uses its image")
      assert.equal("INVALID_INPUT", err.code)
    end)

    it("through fuse-overlayfs where the kernel's overlayfs is not taken, which ends with the session", function()
      if not files.execute("test -x /usr/bin/fuse-overlayfs && test -c /dev/fuse") then
        return pending("fuse-overlayfs or /dev/fuse is missing")
      end
      if not import_busybox("fused", { ["etc/motd"] = "fused\n" }) then return end
      -- An agent that takes fuse-overlayfs as it would where the kernel refused overlayfs.
      local agent = work .. "/fuse-agent"
      files.write(agent, "#!/bin/sh\nexec " .. q(os.getenv("SANDKIT_AGENT")) .. " \"$@\" --overlay fuse\n")
      assert(files.execute("chmod 0755 " .. q(agent)))
      local fused = assert(sandkit.sandbox{ provider = "local", root = root, agent_path = agent })
      local session, err = fused:create{ image = "fused" }
      if not session and err.field == "isolate" then return pending(err.message) end
      assert(session, err)
      local daemons = {}
      for _, pid in ipairs(require("support.agent_process").processes{ "/usr/bin/fuse-overlayfs", "-f" }) do
        if (files.read("/proc/" .. pid .. "/cmdline") or ""):find(root .. "/sessions/" .. session.id, 1, true) then
          daemons[#daemons + 1] = pid
        end
      end
      assert.equal(1, #daemons, "fuse-overlayfs serves the session")
      assert.equal("fused\n", exec(session, "cat /etc/motd").stdout)
      assert.equal("mine\n", exec(session, "echo mine > /home/user/m && cat /home/user/m").stdout)
      assert.are_not.equal(0, exec(session, "echo no > /bin/new").code, "the image's folders stay its own")
      assert.is_nil(files.read(root .. "/images/fused/rootfs/home/user/m"))
      assert(fused:terminate(session.id))
      assert.is_true(require("support.processes").within(10, function()
        return not core.alive(daemons[1])
      end), "fuse-overlayfs ends with the session")
    end)

    it("as the files API sees it too", function()
      if not import_busybox("seen", { ["etc/motd"] = "hello\n" }) then return end
      local session = create{ image = "seen" }
      if not session then return end
      assert.equal("hello\n", assert(session:read_file("/etc/motd")))
    end)
  end)

  describe("is imported", function()
    it("from a tar archive's path, a reader and a directory, each the same tree", function()
      if not images.available() then return pending("busybox-static is not installed") end
      local tree = images.busybox_tree(work .. "/t", { ["etc/motd"] = "tar\n" })
      assert(files.execute("tar -C " .. q(tree) .. " -cf " .. q(work .. "/t.tar") .. " ."))
      local from_file = assert(sandbox:image_import("from-file", work .. "/t.tar"))
      local f = assert(io.open(work .. "/t.tar", "rb"))
      local from_reader = assert(sandbox:image_import("from-reader", f))
      f:close()
      local from_dir = assert(sandbox:image_import("from-dir", tree))
      for _, meta in ipairs{ from_file, from_reader, from_dir } do
        assert.equal(from_dir.size, meta.size)
        assert.equal("tar\n", files.read(root .. "/images/" .. meta.name .. "/rootfs/etc/motd"))
      end
      local session = create{ image = "from-file" }
      if not session then return end
      assert.equal("tar\n", exec(session, "cat /etc/motd").stdout)
    end)

    it("with every file the importer's, never an owner the archive names", function()
      local archive = tar.archive(tar.entry({ name = "owned", mode = 420 }, "x"))
      -- tar.header writes uid and gid 0; the extraction must not keep even those as given.
      assert(sandbox:image_import("owners", function()
        local piece = archive
        archive = nil
        return piece
      end))
      local out = local_state.sh("stat -c %u " .. q(root .. "/images/owners/rootfs/owned"))
      assert.equal(local_state.sh("id -u"), out)
    end)

    for _, case in ipairs{
      { "an absolute path", tar.entry({ name = "/etc/evil" }, "x") },
      { "a path climbing out with ..", tar.entry({ name = "../evil" }, "x") },
      { "a symlink followed out", tar.entry({ name = "out", type = "2", linkname = "/tmp" })
          .. tar.entry({ name = "out/evil" }, "x") },
      { "a device node", tar.entry({ name = "null", type = "3", devmajor = 1, devminor = 3 }) },
    } do
      it("refusing " .. case[1] .. " with INVALID_INPUT, leaving nothing", function()
        local stream = tar.archive(case[2])
        local image, err = sandbox:image_import("hostile", function()
          local piece = stream
          stream = nil
          return piece
        end)
        assert.is_nil(image)
        assert.equal("INVALID_INPUT", err.code, tostring(err))
        assert_no_image_left(root, "hostile")
        assert.is_nil(files.read("/tmp/evil"))
      end)
    end

    it("refusing what is neither a directory nor a tar archive, leaving nothing", function()
      files.write(work .. "/notes.txt", "just text\n")
      local image, err = sandbox:image_import("text", work .. "/notes.txt")
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.truthy(err.message:find("neither a directory nor a whole tar archive", 1, true), err.message)
      assert_no_image_left(root, "text")
      image, err = sandbox:image_import("absent", work .. "/nothing-here")
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert_no_image_left(root, "absent")
    end)

    it("bounded in entries and bytes, by the call or by the sandbox", function()
      local entries = {}
      for i = 1, 5 do entries[i] = tar.entry({ name = "f" .. i }, string.rep("z", 1000)) end
      local archive = tar.archive(unpack(entries))
      local function reader()
        local piece = archive
        return function() local p = piece piece = nil return p end
      end
      local image, err = sandbox:image_import("many", reader(), { max_entries = 3 })
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.truthy(err.message:find("bound", 1, true), err.message)
      assert_no_image_left(root, "many")
      local small = assert(sandkit.sandbox{ provider = "local", root = root, image_max_bytes = 2000 })
      image, err = small:image_import("heavy", reader())
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert_no_image_left(root, "heavy")
      assert(sandbox:image_import("fits", reader(), { max_entries = 5, max_bytes = 5000 }))
    end)

    it("under a name nobody has taken", function()
      if not import_busybox("taken") then return end
      local image, err = sandbox:image_import("taken", work .. "/taken")
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.truthy(err.message:find("exists", 1, true))
    end)
  end)

  it("is imported, used and committed by sandkit running as a user who is not root", function()
    if local_state.sh("id -u") ~= "0\n" or not files.execute("command -v setpriv >/dev/null")
        or not images.available() then
      return pending("starting sandkit as another user needs root, setpriv and busybox-static")
    end
    local state = local_state.new(493)
    assert(files.execute("chown 65534:65534 " .. q(state)))
    local tree = images.busybox_tree(state .. "/tree", { ["etc/motd"] = "unprivileged\n" })
    assert(files.execute("chown -R 65534:65534 " .. q(tree)))
    local script = state .. "/as-nobody.lua"
    files.write(script, string.format([[
      local sandkit = require "sandkit"
      local sb = assert(sandkit.sandbox{ provider = "local", root = %q })
      assert(sb:image_import("mine", %q))
      local session = assert(sb:create{ image = "mine" })
      local r = assert(session:exec({ "/bin/sh", "-c", "id -u; cat /etc/motd; stat -c %%u /etc/motd; "
        .. "echo changed > /etc/motd" }, { timeout = 20 }))
      io.write(r.stdout, r.stderr)
      assert(sb:image_commit(session.id, "changed"))
      assert(sb:terminate(session.id))
      local again = assert(sb:create{ image = "changed" })
      io.write(assert(again:exec({ "/bin/cat", "/etc/motd" }, { timeout = 20 })).stdout)
      assert(sb:terminate(again.id))
    ]], state .. "/sandkit", tree))
    local out, err, status = local_state.sh("setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="
      .. q(state) .. " " .. local_state.lua_env() .. " " .. (os.getenv("SANDKIT_TEST_LUA") or "lua5.4") .. " "
      .. q(script))
    core.remove_tree(state)
    assert.equal(0, status, err)
    -- The image's files are the calling user's, so the sandbox user's inside: it may change
    -- them, in its own layer.
    assert.equal("1000\nunprivileged\n1000\nchanged\n", out)
  end)

  it("made by a process killed mid-way leaves nothing once the next image is made", function()
    local dead = assert(core.spawn({ "true" }))
    core.reap(dead, true)
    assert(core.mkdir(root .. "/images", 448))
    local left = root .. "/images/.new-half-" .. dead .. "-0123456789ab"
    assert(core.mkdir(left, 448))
    files.write(left .. "/partial", "x")
    assert(sandbox:image_import("next", work))
    assert.is_nil(files.read(left .. "/partial"))
    assert.same({ "next" }, core.listdir(root .. "/images"))
  end)

  it("names are 1 to 64 of [a-z0-9._-]: every other is INVALID_INPUT, and nothing is made", function()
    for _, name in ipairs{ "", "Upper", string.rep("a", 65), "../x", "a/b", ".hidden", "sp ace", 7 } do
      local image, err = sandbox:image_import(name, work)
      assert.is_nil(image, tostring(name))
      assert.equal("INVALID_INPUT", err.code)
      assert.equal("name", err.field)
      local session
      session, err = sandbox:create{ image = name }
      assert.is_nil(session)
      assert.equal("INVALID_INPUT", err.code)
    end
    assert(sandbox:image_import(string.rep("a", 64), work))
    assert(sandbox:image_import("a.b_c-9", work))
    assert.same({}, core.listdir(root .. "/sessions") or {})
  end)

  it("that does not exist is INVALID_INPUT at create, and no session is left", function()
    local session, err = sandbox:create{ image = "nowhere" }
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("image", err.field)
    assert.truthy(err.message:find("no image named nowhere", 1, true))
    assert.same({}, core.listdir(root .. "/sessions") or {})
  end)

  it("is for confined sessions: isolate = none refuses one", function()
    local host = assert(sandkit.sandbox{ provider = "local", root = root, isolate = "none" })
    local session, err = host:create{ image = "any" }
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("image", err.field)
  end)

  it("is listed with its size, creation time and origin", function()
    if not import_busybox("listed") then return end
    local list = assert(sandbox:image_list())
    assert.equal(1, #list)
    assert.equal("listed", list[1].name)
    assert.is_true(list[1].size > 100000, "busybox is in it")
    assert.is_true(math.abs(list[1].created_at - os.time()) < 60)
    assert.truthy(list[1].origin:find("import", 1, true))
  end)

  it("is removed only while no session uses it", function()
    if not import_busybox("used") then return end
    local session = create{ image = "used" }
    if not session then return end
    local ok, err = sandbox:image_remove("used")
    assert.is_nil(ok)
    assert.equal("INVALID_INPUT", err.code)
    assert.truthy(err.message:find(session.id, 1, true), err.message)
    assert.equal("kept", (exec(session, "echo kept").stdout:gsub("\n", "")), "the session still works")
    assert(sandbox:terminate(session.id))
    assert.is_true(sandbox:image_remove("used"))
    assert.same({}, sandbox:image_list())
    ok, err = sandbox:image_remove("used")
    assert.is_nil(ok)
    assert.equal("INVALID_INPUT", err.code)
  end)

  describe("is committed", function()
    it("from a session's current tree, which the next session starts from", function()
      if not import_busybox("base", { ["var/old"] = "old\n" }) then return end
      assert(files.execute("chmod 0777 " .. q(root .. "/images/base/rootfs/var")))
      local session = create{ image = "base" }
      if not session then return end
      assert.equal(0, exec(session, "mkdir -p /opt && echo prepared > /opt/ready && rm /var/old").code)
      local meta = assert(sandbox:image_commit(session.id, "prepared"))
      assert.truthy(meta.origin:find(session.id, 1, true))
      local next_one = create{ image = "prepared" }
      assert.equal("prepared\n", exec(next_one, "cat /opt/ready").stdout)
      assert.are_not.equal(0, exec(next_one, "ls /var/old").code, "what the session removed stays removed")
      assert.equal("prepared\n", files.read(root .. "/images/prepared/rootfs/opt/ready"))
      assert.is_nil(files.read(root .. "/images/base/rootfs/opt/ready"), "the base image is as it was")
    end)

    it("never from a session with a disk limit, whose changes its agent holds mounted", function()
      if not import_busybox("ondisk") then return end
      if not sandbox:capabilities().limits.disk then return pending("this machine cannot enforce a disk limit") end
      local session = create{ image = "ondisk", limits = { disk = 32 * 1024 * 1024 } }
      if not session then return end
      local r = exec(session, "dd if=/dev/zero of=/home/user/fill bs=1M count=64")
      assert.truthy(r.stderr:find("No space left on device", 1, true), r.stderr)
      assert.is_nil(files.read(root .. "/images/ondisk/rootfs/home/user/fill"), "the image is as it was")
      assert.equal("room\n", exec(session, "rm /home/user/fill && echo room > /home/user/x && cat /home/user/x").stdout)
      local image, err = sandbox:image_commit(session.id, "snap")
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.truthy(err.message:find("disk limit", 1, true))
      assert_no_image_left(root, "snap")
    end)

    it("only from a session that has an image, and never over a name taken", function()
      if not import_busybox("other") then return end
      local plain = create{}
      if not plain then return end
      local image, err = sandbox:image_commit(plain.id, "snap")
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.truthy(err.message:find("has no image", 1, true))
      assert_no_image_left(root, "snap")
      local from = create{ image = "other" }
      image, err = sandbox:image_commit(from.id, "other")
      assert.is_nil(image)
      assert.truthy(err.message:find("exists", 1, true))
      image, err = sandbox:image_commit("s-nosuchsession", "snap")
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
    end)
  end)

  it("is imported from standard input, listed, used and removed with the sandkit command", function()
    if not images.available() then return pending("busybox-static is not installed") end
    local cli = local_state.lua_env() .. " " .. (os.getenv("SANDKIT_TEST_LUA") or "lua5.4") .. " bin/sandkit --root "
      .. q(root)
    local tree = images.busybox_tree(work .. "/c", { ["etc/motd"] = "cli\n" })
    local out, err, status = local_state.sh("tar -C " .. q(tree) .. " -c . | " .. cli .. " image import piped -")
    assert.equal(0, status, err)
    assert.equal("piped\n", out)
    out, err, status = local_state.sh(cli .. " image ls")
    assert.equal(0, status, err)
    assert.truthy(out:match("\npiped%s+[%d.]+ MiB%s+%d%d%d%d%-%d%d%-%d%dT[%d:]+Z%s+import %-\n"), out)
    local id
    id, err, status = local_state.sh(cli .. " create --image piped")
    if status ~= 0 and err:find("confine", 1, true) then return pending(err) end
    assert.equal(0, status, err)
    id = id:gsub("%s+$", "")
    out, err = local_state.sh(cli .. " run --session " .. id .. " -- cat /etc/motd")
    assert.equal("cli\n", out, err)
    local _
    _, err, status = local_state.sh(cli .. " image rm piped")
    assert.equal(1, status)
    assert.truthy(err:find("in use by session " .. id, 1, true), err)
    _, err, status = local_state.sh(cli .. " image commit " .. id .. " piped2 && " .. cli .. " rm " .. id
      .. " && " .. cli .. " image rm piped piped2")
    assert.equal(0, status, err)
    _, err, status = local_state.sh(cli .. " image import Bad " .. q(tree))
    assert.equal(1, status)
    assert.truthy(err:find("image name", 1, true), err)
    _, _, status = local_state.sh(cli .. " image frobnicate")
    assert.equal(2, status)
  end)

  describe("is built with mmdebstrap", function()
    it("refused with INVALID_INPUT naming the package where mmdebstrap is missing", function()
      local image, err = sandbox:image_build("deb", { mmdebstrap = "/nonexistent/mmdebstrap" })
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.truthy(err.message:find("Debian package mmdebstrap", 1, true), err.message)
      assert_no_image_left(root, "deb")
    end)

    it("with none of this process's descriptors, as every program sandkit starts", function()
      -- mmdebstrap fails when its descriptor 12 is one it did not open; io.open's are inherited.
      local held = {}
      for i = 1, 16 do held[i] = assert(io.open("/dev/null")) end
      local listing = work .. "/fds"
      local pid = assert(core.spawn({ "ls", "-l", "/proc/self/fd" }, { stdout = listing }))
      core.reap(pid, true)
      local ready_pid, reader = assert(core.spawn({ "ls", "-l", "/proc/self/fd" },
        { stdout = listing, ready_fd = 3 }))
      core.reap(ready_pid, true)
      reader:close()
      for _, f in ipairs(held) do f:close() end
      local text = files.read(listing)
      local past_two = 0
      for fd, target in text:gmatch("\n[^\n]- (%d+) %-> ([^\n]+)") do
        if tonumber(fd) > 2 then
          past_two = past_two + 1
          assert.are_not.equal("/dev/null", target, "descriptor " .. fd .. " was this process's")
        end
      end
      -- ls's own listing of the folder each time, and the ready pipe the second.
      assert.equal(3, past_two, text)
    end)

    it("from a system merged-/usr from the start, by the hook kept beside the mmdebstrap it runs", function()
      -- A stand-in that writes down how it was run into the tree it is asked to make.
      local tool = work .. "/tool"
      local hook = tool .. "/hooks/maybe-merged-usr"
      assert(core.mkdir(tool, 493))
      assert(core.mkdir(tool .. "/hooks", 493))
      assert(core.mkdir(hook, 493))
      files.write(hook .. "/setup00.sh", "#!/bin/sh\n")
      files.write(tool .. "/mmdebstrap", "#!/bin/sh\neval \"target=\\${$#}\"\nmkdir -p \"$target\"\n"
        .. "printf '%s\\n' \"$@\" > \"$target/argv\"\n")
      assert(os.execute("chmod 755 " .. q(tool .. "/mmdebstrap")))
      assert(sandbox:image_build("deb", { mmdebstrap = tool .. "/mmdebstrap" }))
      local argv = {}
      for line in files.read(root .. "/images/deb/rootfs/argv"):gmatch("[^\n]+") do argv[#argv + 1] = line end
      assert.same({ "--variant=essential", "--hook-dir=" .. hook, "bookworm" }, { unpack(argv, 1, 3) })
      assert.equal(4, #argv)
    end)

    --- A stand-in mmdebstrap in its own folder, running `script` (sh).
    local function stand_in(script)
      local tool = work .. "/fake"
      assert(core.mkdir(tool, 493))
      files.write(tool .. "/mmdebstrap", "#!/bin/sh\n" .. script)
      assert(os.execute("chmod 755 " .. q(tool .. "/mmdebstrap")))
      return tool .. "/mmdebstrap"
    end

    it("failing with INVALID_INPUT that quotes mmdebstrap's errors, leaving nothing", function()
      local tool = stand_in("echo 'I: fetching'\necho 'E: cannot reach the mirror' >&2\nexit 1\n")
      local image, err = sandbox:image_build("deb", { mmdebstrap = tool })
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.truthy(err.message:find("status 1): cannot reach the mirror", 1, true), err.message)
      assert_no_image_left(root, "deb")
    end)

    it("stopped at its timeout, mmdebstrap killed and nothing left", function()
      local pid_file = work .. "/pid"
      local tool = stand_in("echo $$ > " .. q(pid_file) .. "\nexec sleep 60\n")
      local image, err = sandbox:image_build("deb", { mmdebstrap = tool, timeout = 0.5 })
      assert.is_nil(image)
      assert.equal("INVALID_INPUT", err.code)
      assert.equal("timeout", err.field)
      local pid = assert(tonumber(files.read(pid_file)))
      assert.is_false(core.alive(pid), "mmdebstrap is gone")
      assert_no_image_left(root, "deb")
    end)

    it("refusing a suite, package or mirror that is no such name", function()
      for _, opts in ipairs{ { suite = "Book worm" }, { packages = { "ok", "bad name" } }, { packages = 5 },
        { mirror = "not a url" }, { variant = "everything" } } do
        local image, err = sandbox:image_build("deb", opts)
        assert.is_nil(image)
        assert.equal("INVALID_INPUT", err.code)
      end
      assert_no_image_left(root, "deb")
    end)
  end)
end)
