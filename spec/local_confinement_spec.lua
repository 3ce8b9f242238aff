-- The local sandbox is a sandbox (docs/agent.md "Confinement"): a session of the local provider
-- is confined by default, has its own filesystem, runs an unprivileged user, keeps one set of
-- namespaces for its whole life, starts commands with a documented environment, and has the
-- network it was given. The real agent, bubblewrap, pasta and slirp4netns, and the ways out a
-- command might try, each of which must fail.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local http = require "sandkit.http"
local agent_process = require "support.agent_process"
local fake_http = require "support.fake_http"
local files = require "support.files"
local local_state = require "support.local_state"
local procs = require "support.processes"

local q = local_state.shell_quote
local within, processes = procs.within, agent_process.processes
local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"

--- What a test must undo, newest first, however it ended: busted keeps only the last
-- `finally` a test gives, and these tests set up several things each.
local undo = {}
local function defer(fn) undo[#undo + 1] = fn end
local function undo_all()
  while #undo > 0 do pcall(table.remove(undo)) end
end

local function exec(session, script, opts)
  opts = opts or {}
  opts.timeout = opts.timeout or 30
  return assert(session:exec({ "sh", "-c", script }, opts))
end

--- A word no other process on the machine has: a sleep length, or a file name's tail.
local function unique()
  return string.format("%d.%06d", 400 + math.random(0, 99), math.random(0, 999999))
end

--- The host processes whose command line holds `sleep <length>`, for each length.
local function sleepers(lengths)
  local found = {}
  for _, len in ipairs(lengths) do
    for _, pid in ipairs(processes{ "sleep", len }) do found[#found + 1] = pid end
  end
  return found
end

--- What a failed create must not leave: a session folder, a process that names the state
-- folder (an agent, bubblewrap, the session's init), a mount that does.
local function assert_nothing_left(root)
  assert.same({}, core.listdir(root .. "/sessions") or {}, "no session folder is left")
  local left = processes{ root }
  assert.same({}, left, "no process of the session is left")
  assert.is_nil((files.read("/proc/self/mountinfo") or ""):find(root, 1, true), "no mount is left")
end

--- A Lua server inside a session answering every connection to 127.0.0.1:port with `body`,
-- started as a job; returns once it listens.
local function serve_inside(session, port, body)
  local marker = "/tmp/listening-" .. port
  assert(session:start_job({ LUA, "-e", string.format([[
    local socket = require "socket"
    local s = assert(socket.bind("127.0.0.1", %d))
    io.open(%q, "w"):close()
    while true do
      local c = s:accept()
      c:settimeout(5)
      c:receive("*l")
      c:send("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" .. %q)
      c:close()
    end]], port, marker, #body, body) }, { timeout = 120 }))
  exec(session, "while [ ! -e " .. marker .. " ]; do sleep 0.02; done", { timeout = 20 })
end

local function fetch(url)
  return http.exchange{ method = "GET", url = url .. "/", deadline = core.now() + 10 }
end

describe("a local session", function()
  local root, sandbox
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  end)
  after_each(function()
    undo_all()
    local_state.clean(root)
  end)

  --- A confined session, or pending with the machine's reason when it cannot have one.
  local function create(opts, sb)
    local session, err = (sb or sandbox):create(opts or {})
    if not session and err.code == "INVALID_INPUT" and err.field == "isolate" then
      pending("this machine cannot confine a session: " .. err.message)
      return nil
    end
    return assert(session, err)
  end

  describe("is confined by default", function()
    it("and says so: its commands run as the sandbox user, not as the caller", function()
      assert.equal("bwrap", sandbox:capabilities().isolation)
      local session = create()
      if not session then return end
      assert.equal("1000\n", exec(session, "id -u").stdout)
      local unconfined = assert(sandkit.sandbox{ provider = "local", root = root, isolate = "none" })
      assert.equal("none", unconfined:capabilities().isolation)
      local host = assert(unconfined:create{})
      local me = local_state.sh("id -u")
      assert.equal(me, exec(host, "id -u").stdout, "isolate = none runs commands as the caller")
    end)

    it("fails to create, naming bubblewrap, its package and the opt-out, where bubblewrap is missing",
      function()
        local missing = assert(sandkit.sandbox{ provider = "local", root = root,
          bwrap = "/nonexistent/bwrap" })
        assert.is_false(missing:capabilities().bwrap)
        local session, err = missing:create{ id = "nojail" }
        assert.is_nil(session)
        assert.equal("INVALID_INPUT", err.code, tostring(err))
        assert.equal("isolate", err.field)
        for _, says in ipairs{ "bubblewrap", "/nonexistent/bwrap", "Debian package bubblewrap",
          'isolate = "none"' } do
          assert.truthy(err.message:find(says, 1, true), err.message)
        end
        assert_nothing_left(root)
      end)

    it("fails to create, naming what is refused and the opt-out, where the machine refuses user namespaces",
      function()
        -- A user namespace that may create no further ones: root inside it, but no sandbox.
        local prefix = "unshare --user --map-root-user sh -c "
          .. q("echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"") .. " wrapper"
        if not files.execute(prefix .. " true 2>/dev/null") then
          pending("this machine cannot make the user namespace the test needs")
          return
        end
        local script = files.temp_name()
        defer(function() os.remove(script) end)
        files.write(script, string.format([[
          local sandkit = require "sandkit"
          local sb = assert(sandkit.sandbox{ provider = "local", root = %q })
          local session, err = sb:create{ id = "refused" }
          io.write(session and "created" or (err.code .. " " .. tostring(err.field) .. " " .. err.message))
        ]], root))
        local out = local_state.sh(local_state.lua_env() .. " " .. prefix .. " " .. LUA .. " " .. q(script)
          .. " 2>&1")
        assert.truthy(out:find("^INVALID_INPUT isolate "), out)
        assert.truthy(out:find("refuses user namespaces", 1, true), out)
        assert.truthy(out:find('isolate = "none"', 1, true), out)
        assert_nothing_left(root)
      end)

    it("refuses isolate and network values it does not know and an env that is not strings, leaving nothing",
      function()
        for _, case in ipairs{
          { options = { isolate = "docker" }, field = "isolate" },
          { options = { isolate = true }, field = "isolate" },
          { options = { network = "everywhere" }, field = "network" },
          { options = { isolate = "none", network = "outbound" }, field = "network" },
          { options = { bwrap = 7 }, field = "bwrap" },
        } do
          case.options.provider, case.options.root = "local", root
          local sb, err = sandkit.sandbox(case.options)
          assert.is_nil(sb)
          assert.equal("INVALID_INPUT", err.code)
          assert.equal(case.field, err.field, tostring(err))
        end
        for _, env in ipairs{ { A = 1 }, { "positional" }, { ["A=B"] = "x" }, { [""] = "x" },
          { A = "nul\0inside" }, "A=1" } do
          local session, err = sandbox:create{ env = env }
          assert.is_nil(session)
          assert.equal("INVALID_INPUT", err.code)
          assert.equal("env", err.field, tostring(err))
        end
        assert_nothing_left(root)
      end)
  end)

  describe("has its own filesystem", function()
    it("where the path the files API writes is the path a command reads, and back", function()
      local session = create()
      if not session then return end
      assert(session:write_files{ ["/app/a"] = "from the API" })
      local src = files.temp_name()
      defer(function() os.remove(src) end)
      files.write(src, "put\n")
      assert(session:write_file_from("/x.txt", src))
      assert.equal("from the API\nput\n", exec(session, "cat /app/a; echo; cat /x.txt").stdout)
      exec(session, "mkdir -p /out && echo from a command > /out/b && echo private > /tmp/t")
      assert.equal("from a command\n", assert(session:read_file("/out/b")))
      assert.equal("private\n", assert(session:read_file("/tmp/t")), "the files API sees the session's /tmp")
      assert.equal("from the API", files.read(root .. "/sessions/" .. session.id .. "/files/app/a"))
    end)

    it("shows nothing of the host but /usr and what programs need of /etc", function()
      local session = create()
      if not session then return end
      local top = {}
      for name in exec(session, "ls -A /").stdout:gmatch("[^\n]+") do top[name] = true end
      for _, name in ipairs{ "home", "tmp", "proc", "dev", "etc", "usr" } do
        assert.is_true(top[name], name .. " is there")
        top[name] = nil
      end
      -- What else there is: the merged-/usr links this host has, and nothing else.
      for name in pairs(top) do
        local link = exec(session, "readlink /" .. name).stdout
        assert.equal("usr/" .. name .. "\n", link, "/" .. name .. " is only a link into /usr")
      end
      local etc = exec(session, "ls -A /etc").stdout
      local allowed = { passwd = true, group = true, hosts = true, ["ld.so.cache"] = true,
        ["nsswitch.conf"] = true, ["resolv.conf"] = true, ssl = true, alternatives = true,
        localtime = true }
      for name in etc:gmatch("[^\n]+") do assert.is_true(allowed[name], "/etc/" .. name .. " is shown") end
      assert.equal("user\n", exec(session, "ls -A /home").stdout)
      assert.equal("user:x:1000:1000:user:/home/user:",
        exec(session, "grep ^user: /etc/passwd").stdout:match("^(user:x:1000:1000:user:/home/user:)"))
      local dev = exec(session, "ls -A /dev").stdout
      assert.is_nil(dev:find("sda", 1, true) or dev:find("vda", 1, true) or dev:find("kmsg", 1, true),
        "no device of the host's but the harmless few: " .. dev)
      local usr = exec(session, "touch /usr/sandkit-escape 2>&1; echo $?").stdout
      assert.truthy(usr:find("Read%-only file system\n1\n$"), usr)
    end)

    it("cannot read a file planted in the host's home folder, by any path", function()
      local session = create()
      if not session then return end
      local home = os.getenv("HOME") or "/root"
      local name = "sandkit-planted-" .. unique()
      local planted = home .. "/" .. name
      files.write(planted, "the host's secret")
      defer(function() os.remove(planted) end)
      local r = exec(session, "cat " .. q(planted) .. "; ls " .. q(home) .. "; ln -s " .. q(planted)
        .. " /home/user/link; cat /home/user/link; find / -xdev -name " .. q(name) .. " 2>/dev/null; "
        .. "cat /proc/1/root" .. q(planted) .. "; true")
      assert.is_nil(r.stdout:find("secret", 1, true), r.stdout)
      assert.equal("", r.stdout)
      local bytes, err = session:read_file("/../../../.." .. planted)
      assert.is_nil(bytes)
      assert.equal("PATH_REFUSED", err.reason)
      bytes, err = session:read_file("/home/user/link")
      assert.is_nil(bytes)
      assert.equal("PATH_REFUSED", err.reason, "the files API follows no link a command planted")
    end)

    it("writes nowhere outside the session", function()
      local session = create()
      if not session then return end
      local name = "sandkit-escape-" .. unique()
      exec(session, "for d in /usr /tmp /etc /dev /proc /var /run /home; do echo out > $d/" .. name
        .. " 2>/dev/null; mkdir -p $d/sub 2>/dev/null; done; true")
      for _, dir in ipairs{ "/usr", "/tmp", "/etc", "/dev", "/var", "/run", "/home" } do
        assert.is_nil(io.open(dir .. "/" .. name), dir .. " of the host got a file from the session")
      end
      local ok, err = session:write_files{ ["/usr/" .. name] = "out" }
      assert.is_nil(ok)
      assert.equal("PERMISSION_DENIED", err.reason, tostring(err))
      assert.is_nil(io.open("/usr/" .. name))
    end)

    it("sees neither the state folder and its tokens nor another session's files or processes", function()
      local mine = create({ id = "mine" })
      if not mine then return end
      local other = create({ id = "other" })
      assert(other:write_files{ ["/secret.txt"] = "other's secret" })
      local nap = unique()
      assert(other:start_job({ "sleep", nap }, { timeout = 120 }))
      assert.is_true(within(10, function() return #sleepers{ nap } == 1 end), "the other session's job runs")
      local theirs = root .. "/sessions/other"
      local r = exec(mine, "cat /secret.txt " .. q(theirs .. "/token") .. " " .. q(theirs .. "/files/secret.txt")
        .. " " .. q(root .. "/sessions/mine/token") .. " 2>/dev/null; ls -A " .. q(root) .. " 2>/dev/null; "
        .. "grep -rlsF " .. q(other.record.token) .. " / --exclude-dir=proc --exclude-dir=usr; true")
      assert.equal("", r.stdout)
      local ps = assert(mine:exec({ "ps", "-eo", "comm" }, { timeout = 10 })).stdout
      assert.equal("COMMAND\nsandkit-init\nps\n", ps, "a process of another session is visible")
    end)

    it("has a private /tmp, its own /proc, and starts commands in the user's home", function()
      local a = create()
      if not a then return end
      local b = create()
      local name = "/tmp/sandkit-private-" .. unique()
      exec(a, "echo a > " .. name)
      assert.equal("absent\n", exec(b, "test -e " .. name .. " || echo absent").stdout)
      assert.is_nil(io.open(name), "the host's /tmp is not the session's")
      assert.equal("sandkit-init\n", exec(a, "cat /proc/1/comm").stdout, "process 1 of the session is its init")
      assert.equal("/home/user\n", exec(a, "pwd").stdout)
    end)
  end)

  describe("runs an unprivileged user", function()
    it("as uid 1000, with no capability and no_new_privs, mapped to a host uid that is not root", function()
      local session = create()
      if not session then return end
      assert.equal("uid=1000(user) gid=1000(user) groups=1000(user)\n", exec(session, "id").stdout)
      local status = exec(session, "cat /proc/self/status").stdout
      for _, set in ipairs{ "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb" } do
        assert.equal("0000000000000000", status:match(set .. ":%s*(%x+)"), set)
      end
      assert.equal("1", status:match("NoNewPrivs:%s*(%d)"))
      exec(session, "echo mine > /home/user/owned")
      local owner = tonumber((local_state.sh("stat -c %u " .. q(root .. "/sessions/" .. session.id
        .. "/files/home/user/owned"))))
      assert.is_true(owner ~= nil and owner ~= 0, "the sandbox user is host uid " .. tostring(owner))
      assert.is_nil(exec(session, "su -c id root 2>&1 </dev/null; sudo -n id 2>&1; true").stdout:find("uid=0"),
        "nothing raises the sandbox user to root")
    end)

    it("as the calling user when that is not root, through a user namespace of the agent's own", function()
      if local_state.sh("id -u") ~= "0\n" or not files.execute("command -v setpriv >/dev/null") then
        pending("starting sandkit as another user needs root and setpriv")
        return
      end
      local state = local_state.new(493)
      defer(function() core.remove_tree(state) end)
      assert(files.execute("chown 65534:65534 " .. q(state)))
      local script = state .. "/as-nobody.lua"
      files.write(script, string.format([[
        local sandkit = require "sandkit"
        local sb = assert(sandkit.sandbox{ provider = "local", root = %q })
        local session = assert(sb:create{})
        assert(session:write_files{ ["/a.txt"] = "from the API" })
        local r = assert(session:exec({ "sh", "-c", "id -u; cat /a.txt; echo; stat -c %%u /a.txt" },
          { timeout = 20 }))
        io.write(r.stdout, r.stderr)
        assert(sb:terminate(session.id))
      ]], state .. "/sandkit"))
      local out, err, status = local_state.sh("setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="
        .. q(state) .. " " .. local_state.lua_env() .. " " .. LUA .. " " .. q(script))
      assert.equal(0, status, err)
      assert.equal("1000\nfrom the API\n1000\n", out)
    end)

    it("cannot see, trace or signal the agent, nor any process outside its session", function()
      local session = create()
      if not session then return end
      local agent = session.record.pid
      local outsider = assert(core.spawn({ "sleep", unique() }))
      defer(function()
        core.kill(outsider, core.SIGKILL)
        core.reap(outsider, true)
      end)
      local r = exec(session, string.format("for p in %d %d; do test -e /proc/$p && echo seen $p; "
        .. "kill -9 $p 2>/dev/null && echo killed $p; done; cat /proc/1/environ 2>/dev/null && echo traced; true",
        agent, outsider))
      assert.equal("", r.stdout)
      assert.is_true(procs.alive(agent) and procs.alive(outsider))
      assert.equal("still\n", exec(session, "echo still").stdout, "the agent still serves")
    end)
  end)

  describe("keeps one set of namespaces for its whole life", function()
    it("so a job's server, /tmp and processes are the next command's too", function()
      local session = create()
      if not session then return end
      serve_inside(session, 8080, "from the job")
      exec(session, "echo shared > /tmp/shared")
      local r = exec(session, "curl -s --noproxy '*' http://127.0.0.1:8080/; echo; cat /tmp/shared; "
        .. "ps -eo args | grep -c '^" .. LUA .. " -e'")
      assert.equal("from the job\nshared\n1\n", r.stdout, r.stderr)
    end)

    it("and ends every process in it at terminate, whatever it did to leave", function()
      local session = create()
      if not session then return end
      local lengths = { unique(), unique(), unique() }
      defer(function()
        for _, pid in ipairs(sleepers(lengths)) do core.kill(pid, core.SIGKILL) end
      end)
      -- Two left behind by a command that double-forked them into a session of their own, one
      -- still running as a job.
      -- The command waits until they left its group: what is still in it when it ends dies then.
      exec(session, string.format("(setsid sh -c 'sleep %s & sleep %s & touch /tmp/escaped' &); "
        .. "while [ ! -e /tmp/escaped ]; do sleep 0.01; done", lengths[1], lengths[2]))
      assert(session:start_job({ "sleep", lengths[3] }, { timeout = 600 }))
      assert.is_true(within(10, function() return #sleepers(lengths) == 3 end), "the sleepers run")
      assert(sandbox:terminate(session.id))
      assert.is_true(within(5, function() return #sleepers(lengths) == 0 end),
        "left running after terminate: " .. table.concat(sleepers(lengths), " "))
    end)

    it("and ends every process in it when its agent is killed", function()
      local session = create()
      if not session then return end
      local lengths = { unique(), unique() }
      defer(function()
        for _, pid in ipairs(sleepers(lengths)) do core.kill(pid, core.SIGKILL) end
      end)
      assert(session:start_job({ "sh", "-c", string.format("(setsid sh -c 'sleep %s &' &); exec sleep %s",
        lengths[1], lengths[2]) }, { timeout = 600 }))
      assert.is_true(within(10, function() return #sleepers(lengths) == 2 end), "the sleepers run")
      core.kill(session.record.pid, core.SIGKILL)
      assert.is_true(within(5, function() return #sleepers(lengths) == 0 end),
        "left running after the agent was killed: " .. table.concat(sleepers(lengths), " "))
      assert.is_true(within(5, function() return #processes{ root } == 0 end),
        "bubblewrap and the init went with the agent")
    end)
  end)

  it("gives commands HOME, USER, LOGNAME, PATH, LANG and PWD, under the session's defaults and their own",
    function()
      local session = create({ env = { A = "session", B = "session", LANG = "C" } })
      if not session then return end
      local r = exec(session, "env | sort", { env = { B = "command", C = "command" }, cwd = "/tmp" })
      assert.equal(table.concat({ "A=session", "B=command", "C=command", "HOME=/home/user", "LANG=C",
        "LOGNAME=user", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PWD=/tmp",
        "USER=user", "" }, "\n"), r.stdout)
      local unconfined = assert(sandkit.sandbox{ provider = "local", root = root, isolate = "none" })
      local host = assert(unconfined:create{})
      local files_dir = root .. "/sessions/" .. host.id .. "/files"
      r = exec(host, "echo $HOME; echo $LANG; echo $PWD; test -n \"$USER\" && echo user")
      assert.equal(files_dir .. "\nC.UTF-8\n" .. files_dir .. "\nuser\n", r.stdout)
    end)

  describe("has the network it was given", function()
    it("none: its own loopback only, the host's out of reach", function()
      local session = create()
      if not session then return end
      local server = fake_http.start([[return { handle = function(req, conn)
        require("support.respond").status(conn, "200 OK", "reached") end }]])
      defer(function() server:stop() end)
      local r = exec(session, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; curl -s -m 5 "
        .. "--noproxy '*' " .. server.url .. "/ ; echo $?")
      assert.equal("lo\n7\n", r.stdout, "an interface besides lo, or the host's loopback reached")
      assert.equal(0, #server:requests())
    end)

    --- A server outside the machine's loopback, reached through the host's own network stack:
    -- in a network namespace of its own joined to the host by a veth pair. Needs root.
    local function outside_server(body)
      if local_state.sh("id -u") ~= "0\n" or not files.execute("command -v ip >/dev/null") then
        pending("making a network namespace to reach needs root and iproute2")
        return nil
      end
      local tag = string.format("%06x", math.random(0, 0xffffff))
      local net, subnet = "sk" .. tag, string.format("10.%d.%d", math.random(64, 127), math.random(1, 254))
      local ns_side, host_side = "skn" .. tag, "skh" .. tag
      local port = 18080
      local ok = files.execute(table.concat({
        "ip netns add " .. net, "ip link add " .. host_side .. " type veth peer name " .. ns_side,
        "ip link set " .. ns_side .. " netns " .. net, "ip addr add " .. subnet .. ".1/24 dev " .. host_side,
        "ip link set " .. host_side .. " up", "ip -n " .. net .. " addr add " .. subnet .. ".2/24 dev " .. ns_side,
        "ip -n " .. net .. " link set " .. ns_side .. " up", "ip -n " .. net .. " link set lo up" }, " && "))
      -- nsenter becomes the server (ip netns exec would fork it and stay between).
      local pid = ok and assert(core.spawn({ "nsenter", "--net=/run/netns/" .. net, LUA, "-e", string.format([[
        local socket = require "socket"
        local s = assert(socket.bind(%q, %d))
        while true do
          local c = s:accept()
          c:settimeout(5)
          c:receive("*l")
          c:send("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" .. %q)
          c:close()
        end]], subnet .. ".2", port, #body, body) }))
      defer(function()
        if pid then
          core.kill(pid, core.SIGKILL)
          core.reap(pid, true)
        end
        os.execute("ip link del " .. host_side .. " 2>/dev/null; ip netns del " .. net .. " 2>/dev/null")
      end)
      assert.is_true(ok, "the network namespace could not be made")
      local url = "http://" .. subnet .. ".2:" .. port
      assert.is_true(within(10, function()
        local c = require("socket").tcp()
        c:settimeout(1)
        local up = c:connect(subnet .. ".2", port)
        c:close()
        return up
      end), "the outside server does not listen")
      return url
    end

    --- Asserts a session reaches `url` but not the host's loopback.
    local function assert_outbound_only(session, url)
      local server = fake_http.start([[return { handle = function(req, conn)
        require("support.respond").status(conn, "200 OK", "reached") end }]])
      defer(function() server:stop() end)
      local r = exec(session, "curl -s -m 10 --noproxy '*' " .. url .. "/; echo; curl -s -m 5 --noproxy '*' "
        .. server.url .. "/; echo $?")
      assert.equal("outside\n7\n", r.stdout, r.stderr)
      assert.equal(0, #server:requests(), "the host's loopback was reached")
    end

    it("outbound: connections out through pasta, the host's loopback still out of reach", function()
      local url = outside_server("outside")
      if not url then return end
      local out = assert(sandkit.sandbox{ provider = "local", root = root, network = "outbound" })
      local session = create({}, out)
      if not session then return end
      assert_outbound_only(session, url)
    end)

    --- Runs a create in a child Lua whose agent finds pasta and slirp4netns where `env` says;
    -- returns what the child printed.
    local function create_elsewhere(env, then_run)
      local script = files.temp_name()
      defer(function() os.remove(script) end)
      files.write(script, string.format([[
        local sandkit = require "sandkit"
        local sb = assert(sandkit.sandbox{ provider = "local", root = %q, network = "outbound" })
        local session, err = sb:create{ id = "outbound" }
        if not session then io.write(err.code, " ", tostring(err.field), " ", err.message) return end
        local r = assert(session:exec({ "sh", "-c", %q }, { timeout = 30 }))
        io.write("ran ", r.stdout)
      ]], root, then_run or "true"))
      local vars = {}
      for k, v in pairs(env) do vars[#vars + 1] = k .. "=" .. q(v) end
      return local_state.sh(local_state.lua_env() .. " " .. table.concat(vars, " ") .. " " .. LUA .. " "
        .. q(script) .. " 2>&1")
    end

    it("outbound: through slirp4netns where pasta is missing", function()
      local url = outside_server("outside")
      if not url then return end
      if not files.execute("test -x /usr/bin/slirp4netns") then
        pending("slirp4netns is not installed")
        return
      end
      local out = create_elsewhere({ SANDKIT_AGENT_PASTA = "/nonexistent/pasta" },
        "curl -s -m 10 --noproxy '*' " .. url .. "/")
      assert.equal("ran outside", out)
    end)

    it("outbound fails to create, naming both stacks, their packages and the opt-out, where neither is installed",
      function()
        local out = create_elsewhere({ SANDKIT_AGENT_PASTA = "/nonexistent/pasta",
          SANDKIT_AGENT_SLIRP4NETNS = "/nonexistent/slirp4netns" })
        assert.truthy(out:find("^INVALID_INPUT network "), out)
        for _, says in ipairs{ "pasta", "Debian package passt", "slirp4netns", "Debian package slirp4netns",
          'network = "none"' } do
          assert.truthy(out:find(says, 1, true), out)
        end
        assert_nothing_left(root)
      end)

    it("previews a port in either mode, forwarded by its agent", function()
      for _, network in ipairs{ "none", "outbound" } do
        local sb = assert(sandkit.sandbox{ provider = "local", root = root, network = network })
        local session = create({}, sb)
        if not session then return end
        serve_inside(session, 8080, "preview over " .. network)
        local cap = assert(session:preview(8080))
        assert.matches("^http://127%.0%.0%.1:%d+$", cap.endpoint)
        assert.are_not.equal("http://127.0.0.1:8080", cap.endpoint, "the session's loopback is not the host's")
        assert.same({ 8080 }, cap.allowed_ports)
        assert.equal(math.huge, cap.expires_in)
        assert.equal("preview over " .. network, assert(fetch(cap.endpoint)).body)
        assert.equal(cap.endpoint, assert(session:preview(8080)).endpoint, "asking again gives the same one")
        local again = assert(sb:get(session.id))
        assert.equal(cap.endpoint, assert(again:preview(8080)).endpoint, "and from another handle too")
      end
    end)
  end)
end)
