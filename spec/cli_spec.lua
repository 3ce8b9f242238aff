-- The `sandkit` command, run as a separate process against a private state folder.

local cjson = require "cjson"
local sandkit = require "sandkit"
local core = require "sandkit.core"
local wait = require "sandkit.wait"
local files = require "support.files"
local local_state = require "support.local_state"
local agent_process = require "support.agent_process"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local q = local_state.shell_quote

--- The features the real agent advertises, read through a session of the API.
local function agent_features(root)
  local session = assert(assert(sandkit.sandbox{ provider = "local", root = root }):create{ id = "probe" })
  assert(session:exec({ "true" }, { timeout = 5 }))
  local features = session.conn.features
  assert(session:terminate())
  return features
end

--- A `sleep` argument no other process on the machine has: ten seconds and a random fraction.
local function remote_nap()
  return string.format("10.%08d", math.random(0, 99999999))
end

--- Waits, at most `timeout` seconds, until predicate() holds.
local function wait_until(predicate, timeout, what)
  local deadline = core.now() + timeout
  while not predicate() do
    if core.now() >= deadline then error("timed out waiting for " .. what, 2) end
    wait.sleep(0.02)
  end
end

describe("the sandkit command", function()
  local root
  local function command(args)
    return local_state.lua_env() .. " " .. LUA .. " bin/sandkit --root " .. q(root) .. " " .. args
  end
  local function sandkit_cmd(args)
    return local_state.sh(command(args))
  end
  before_each(function() root = local_state.new() end)
  after_each(function() local_state.clean(root) end)

  --- Starts the command in the background with stdout and stderr in files: pid, and a
  -- function returning what each holds so far.
  local function start(args)
    local out, err = root .. "/cli.out", root .. "/cli.err"
    local argv = { "sh", "-c", local_state.lua_env() .. " exec " .. LUA .. " bin/sandkit --root " .. q(root)
      .. " " .. args }
    local pid = assert(core.spawn(argv, { stdout = out, stderr = err }))
    -- A spec that fails before it reaped the command still leaves nothing running.
    finally(function()
      if not core.reap(pid) then
        core.kill(pid, core.SIGKILL)
        core.reap(pid, true)
      end
    end)
    return pid, function() return files.read(out) or "", files.read(err) or "" end
  end

  --- Starts `sandkit ARGS -- sh -c 'echo started; exec sleep …'` as start() does and waits until
  -- the remote sleep runs: pid, output, and the sleep's unique argument.
  local function start_remote_sleep(args)
    -- The agent runs commands in a PID namespace of their own, so a command's `$$` is not a
    -- host pid: the remote command is found by its argv, made unique here.
    local nap = remote_nap()
    local pid, output = start(args .. " -- sh -c 'echo started; exec sleep " .. nap .. "'")
    wait_until(function() return output():find("started\n") end, 10, "the command to start")
    -- The shell prints before it execs sleep: wait for sleep itself.
    wait_until(function() return #agent_process.processes{ "sleep", nap } == 1 end, 5,
      "the remote command to be found by its argv")
    return pid, output, nap
  end

  it("streams a command's stdout and stderr to its own and exits with its status", function()
    local out, err, status = sandkit_cmd("run -- sh -c 'echo hi; echo oops >&2; exit 3'")
    assert.equal("hi\n", out)
    assert.equal("oops\n", err)
    assert.equal(3, status)
  end)

  it("removes the throwaway session a run without --session used", function()
    sandkit_cmd("run -- true")
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))))
  end)

  it("exits 124 with a one-line reason when the command outlives its timeout", function()
    local out, err, status = sandkit_cmd("run --timeout 0.3 -- sleep 30")
    assert.equal("", out)
    assert.equal(124, status)
    assert.matches("^sandkit: [^\n]*0.3s timeout[^\n]*\n$", err)
  end)

  it("exits 127 when the program cannot be started", function()
    local _, err, status = sandkit_cmd("run -- /no/such/program")
    assert.equal(127, status)
    assert.matches("^sandkit: ", err)
  end)

  it("exits 127 alike for a --cwd that is missing and one outside the session", function()
    for _, cwd in ipairs{ "/nosuch", "../" } do
      local out, err, status = sandkit_cmd("run --cwd " .. cwd .. " -- true")
      assert.equal(127, status, cwd .. ": " .. err)
      assert.equal("", out)
      assert.matches("^sandkit: [^\n]+\n$", err)
    end
  end)

  it("passes --cwd and --env to the command", function()
    sandkit_cmd("create work")
    sandkit_cmd("run --session work -- mkdir /sub")
    local out, _, status = sandkit_cmd("run --session work --cwd /sub --env A=1 --env B=x=y -- "
      .. "sh -c 'pwd | sed s,.*/,,; echo $A $B'")
    assert.equal(0, status)
    assert.equal("sub\n1 x=y\n", out)
  end)

  it("refuses to run in a session that does not exist unless --create", function()
    local out, err, status = sandkit_cmd("run --session ghost -- echo hi")
    assert.equal(125, status)
    assert.equal("", out)
    assert.matches("no session named ghost %(%-%-create makes it%)", err)
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))), "nothing was created")
    out, err, status = sandkit_cmd("run --session ghost --create -- echo hi")
    assert.equal(0, status, err)
    assert.equal("hi\n", out)
    assert.equal("ghost", cjson.decode((sandkit_cmd("ls --json"))).sessions[1].id)
  end)

  it("copies files in and out of a named session, standard input and output included", function()
    local src = files.temp_name()
    files.write(src, "bytes\0and more")
    assert.equal("work\n", (sandkit_cmd("create work")))
    local _, err, status = sandkit_cmd("put work " .. q(src) .. " /data/in.bin")
    assert.equal(0, status, err)
    assert.equal("bytes\0and more", (sandkit_cmd("get work /data/in.bin -")))
    _, err, status = local_state.sh("printf 'from stdin' | " .. command("put work - /data/piped"))
    assert.equal(0, status, err)
    assert.equal("from stdin", (sandkit_cmd("get work /data/piped -")))
    -- a pipe named as a path is a source too: `put <(tar c .) /x.tar`
    _, err, status = local_state.sh("bash -c " .. q(command("put work <(printf 'from a pipe') /data/pipe")))
    assert.equal(0, status, err)
    assert.equal("from a pipe", (sandkit_cmd("get work /data/pipe -")))
    local dir = local_state.new()
    _, err, status = sandkit_cmd("get work /data/piped " .. q(dir))
    assert.equal(0, status, err)
    assert.equal("from stdin", files.read(dir .. "/piped"), "into a directory, under the file's name")
    core.remove_tree(dir)
    os.remove(src)
  end)

  it("puts a file where a command of the session reads it, the command starting in the user's home", function()
    local src = files.temp_name()
    finally(function() os.remove(src) end)
    files.write(src, "put here\n")
    sandkit_cmd("create paths")
    local _, err, status = sandkit_cmd("put paths " .. q(src) .. " /x.txt")
    assert.equal(0, status, err)
    local out
    out, err, status = sandkit_cmd("run --session paths -- sh -c 'cat /x.txt; pwd; echo $HOME'")
    assert.equal(0, status, err)
    assert.equal("put here\n/home/user\n/home/user\n", out)
  end)

  it("confines sessions unless told --isolate none, and gives a session's commands create --env", function()
    local out, err, status = sandkit_cmd("run -- id -u")
    assert.equal(0, status, err)
    assert.equal("1000\n", out, "a session is confined by default")
    out, err, status = sandkit_cmd("--isolate none run -- id -u")
    assert.equal(0, status, err)
    assert.equal(local_state.sh("id -u"), out, "--isolate none runs commands as the caller")
    out, err, status = sandkit_cmd("create envs --env A=session --env B=session")
    assert.equal(0, status, err)
    assert.equal("envs\n", out)
    out, err, status = sandkit_cmd("run --session envs --env B=command -- sh -c 'echo $A $B'")
    assert.equal(0, status, err)
    assert.equal("session command\n", out)
    out, err, status = sandkit_cmd("--isolate jail run -- true")
    assert.equal(2, status, "a value --isolate does not take is a wrong command line")
    assert.equal("", out)
    assert.truthy(err:find("isolate", 1, true), err)
  end)

  it("refuses a directory to put, sending nothing", function()
    sandkit_cmd("create work")
    local dir = local_state.new()
    local _, err, status = sandkit_cmd("put work " .. q(dir) .. " /copy")
    core.remove_tree(dir)
    assert.equal(1, status)
    assert.matches("is a directory: put copies one file", err)
    local _, _, missing = sandkit_cmd("get work /copy -")
    assert.equal(1, missing, "no file was made")
  end)

  it("copies directories with cp -r both ways, into a directory that exists as cp does, and as tar on -", function()
    sandkit_cmd("create work")
    local src = local_state.new()
    local out_dir = local_state.new()
    finally(function() core.remove_tree(src) core.remove_tree(out_dir) end)
    assert(files.execute("mkdir -p " .. q(src .. "/proj/sub") .. " && printf one > " .. q(src .. "/proj/a")
      .. " && printf two > " .. q(src .. "/proj/sub/b")))
    local _, err, status = sandkit_cmd("cp -r " .. q(src .. "/proj") .. " work:/app")
    assert.equal(0, status, err)
    _, err, status = sandkit_cmd("cp --recursive " .. q(src .. "/proj") .. " work:/app")
    assert.equal(0, status, err)
    assert.equal("two", (sandkit_cmd("get work /app/proj/sub/b -")), "into /app, which exists now, under its name")
    _, err, status = sandkit_cmd("cp -r work:/app " .. q(out_dir .. "/copy"))
    assert.equal(0, status, err)
    assert.equal("one", files.read(out_dir .. "/copy/a"))
    assert.equal("two", files.read(out_dir .. "/copy/proj/sub/b"))
    _, err, status = sandkit_cmd("cp work:/app/a " .. q(out_dir))
    assert.equal(0, status, err)
    assert.equal("one", files.read(out_dir .. "/a"), "a file, into a directory under its name")
    _, err, status = local_state.sh("tar -cf - -C " .. q(src .. "/proj") .. " . | " .. command("cp - work:/fromtar"))
    assert.equal(0, status, err)
    assert.equal("one", (sandkit_cmd("get work /fromtar/a -")))
    local listing
    listing, err, status = local_state.sh(command("cp work:/fromtar -") .. " | tar -tf -")
    assert.equal(0, status, err)
    assert.truthy(listing:find("sub/b", 1, true), listing)
  end)

  it("refuses cp between two local paths or two sessions, and a directory without -r", function()
    sandkit_cmd("create work")
    local dir = local_state.new()
    finally(function() core.remove_tree(dir) end)
    for _, args in ipairs{ "cp a b", "cp work:/a work:/b", "cp " .. q(dir) .. " work:" } do
      local _, err, status = sandkit_cmd(args)
      assert.equal(2, status, args)
      assert.matches("^sandkit: cp ", err, nil, args)
    end
    local _, err, status = sandkit_cmd("cp " .. q(dir) .. " work:/d")
    assert.equal(1, status)
    assert.matches("is a directory: cp %-r copies a directory", err)
    sandkit_cmd("fs work mkdir /d")
    _, err, status = sandkit_cmd("get work /d -")
    assert.equal(1, status)
    assert.matches("is a directory: get copies one file %(sandkit cp %-r work:/d %- copies a directory%)", err)
    _, err, status = sandkit_cmd("cp work:/d " .. q(dir .. "/x"))
    assert.equal(1, status)
    assert.matches("cp %-r copies a directory", err)
    _, _, status = sandkit_cmd("cp nosuch:/d " .. q(dir))
    assert.equal(125, status, "no such session")
  end)

  it("uses a session's files with fs ls, stat, rm, mv, mkdir and watch, in JSON where it lists", function()
    sandkit_cmd("create work")
    local _, err, status = sandkit_cmd("fs work mkdir /w/deep /w/other")
    assert.equal(0, status, err)
    local src = root .. "/f.txt"
    files.write(src, "12345")
    sandkit_cmd("put work " .. q(src) .. " /w/f.txt")
    local out = sandkit_cmd("fs work ls /w --depth 2")
    assert.matches("^drwx[-rwx]+ +%d+ %d+%-%d+%-%d+T[%d:]+Z /w/deep\n", out)
    assert.matches("\n%-rw[-rwx]+ +5 [^ ]+ /w/f.txt\n", out)
    local listed = cjson.decode((sandkit_cmd("fs work ls /w --json")))
    assert.same({ "/w/deep", "/w/f.txt", "/w/other" },
      { listed.entries[1].path, listed.entries[2].path, listed.entries[3].path })
    assert.equal(5, listed.entries[2].size)
    local stats
    stats, err, status = sandkit_cmd("fs work stat /w/f.txt /w/none --json")
    assert.equal(1, status, "one path is absent")
    assert.matches("no such path in the session: /w/none", err)
    stats = cjson.decode(stats)
    assert.same({ true, 5 }, { stats.entries[1].exists, stats.entries[1].size })
    assert.same({ path = "/w/none", exists = false }, stats.entries[2])
    _, err, status = sandkit_cmd("fs work mv /w/f.txt /w/other")
    assert.equal(1, status)
    assert.matches("PATH_EXISTS", err)
    _, err, status = sandkit_cmd("fs work mv /w/f.txt /w/deep/g.txt")
    assert.equal(0, status, err)
    _, err, status = sandkit_cmd("fs work rm /w")
    assert.equal(1, status)
    assert.matches("recursive", err)
    local pid, output = start("fs work watch /w -r --timeout 3 --json")
    -- A new directory each time: the watch may not have begun when the first is made.
    local made = 0
    wait_until(function()
      made = made + 1
      sandkit_cmd("fs work mkdir /w/deep/new" .. made)
      return output():find('"type":"create"', 1, true) ~= nil
    end, 5, "the watch's event")
    core.reap(pid, true)
    local first = cjson.decode(output():match("^([^\n]+)\n"))
    assert.equal("create", first.type)
    assert.matches("^/w/deep/new%d+$", first.path)
    assert.equal(cjson.null, first.from)
    _, err, status = sandkit_cmd("fs work rm -r /w /never")
    assert.equal(0, status, err)
    assert.equal(1, select(3, sandkit_cmd("fs work stat /w")))
  end)

  it("describes every fs command under help fs, and says what fs lacks", function()
    local help, _, status = sandkit_cmd("help fs")
    assert.equal(0, status)
    assert.matches("^usage: sandkit fs NAME ls|stat|rm|mv|mkdir|watch ", help)
    for _, sub in ipairs{ "ls", "stat", "rm", "mv", "mkdir", "watch" } do
      assert.matches("\n  fs NAME " .. sub, help, nil, sub .. " is listed")
    end
    assert.equal(help, (sandkit_cmd("fs --help")))
    assert.matches("^usage: sandkit fs NAME rm %[%-r%] PATH", (sandkit_cmd("help fs rm")))
    assert.matches("\n  %-r, %-%-recursive ", (sandkit_cmd("help cp")))
    local _, err
    _, err, status = sandkit_cmd("fs work")
    assert.equal(2, status)
    assert.matches("fs needs a session's NAME, then ls", err)
    _, err, status = sandkit_cmd("fs work explode /x")
    assert.equal(2, status)
    assert.matches("not explode", err)
    _, err, status = sandkit_cmd("fs work ls -x")
    assert.equal(2, status)
    assert.matches("unknown option %-x", err)
  end)

  it("says when a file is over what an agent without rawFiles moves", function()
    local agent_session = require "support.agent_session"
    local _, server = agent_session.open([[function(req, conn)
      respond.status(conn, "500 Internal Server Error", "nothing should have been sent") end]],
      nil, { "jobIdempotency" })
    finally(function() server:stop() end)
    local token = root .. "/token"
    files.write(token, "test-token\n")
    local _, err, status = local_state.sh("head -c 33554433 /dev/zero | " .. local_state.lua_env() .. " "
      .. LUA .. " bin/sandkit --provider agent --url " .. q(server.url) .. " --token-file " .. q(token)
      .. " put work - /big")
    assert.equal(1, status, err)
    assert.matches("does not offer the rawFiles extension", err)
    assert.equal(0, #server:requests_to("/v1/files"), "refused before anything was sent")
  end)

  it("moves a file over 32 MiB both ways once the agent offers rawFiles", function()
    assert.is_true(agent_features(root).rawFiles, "sandkit-agent offers rawFiles")
    sandkit_cmd("create work")
    local src, dst, size = files.temp_name(), files.temp_name(), 40 * 1024 * 1024
    files.write_pattern(src, size)
    local _, err, status = sandkit_cmd("put work " .. q(src) .. " /big")
    assert.equal(0, status, err)
    _, err, status = sandkit_cmd("get work /big " .. q(dst))
    assert.equal(0, status, err)
    assert.equal(files.pattern_checksum(size), files.file_checksum(dst))
    os.remove(src)
    os.remove(dst)
  end)

  it("shows a progress bar for a transfer over a second on a terminal, and none elsewhere", function()
    sandkit_cmd("create work")
    -- `script` gives the command a terminal; the source trickles for more than a second.
    local slow = "(printf abc; sleep 1.5; printf def) | " .. command("put work - /slow")
    local shown = local_state.sh("script -qfec " .. q(slow) .. " /dev/null")
    assert.matches("6 B / 6 B  [%d.]+ B/s", shown)
    assert.matches("\r", shown, 1, true)
    local _, quiet, status = local_state.sh(slow)
    assert.equal(0, status)
    assert.equal("", quiet, "no bar when stderr is not a terminal")
    local fast = local_state.sh("script -qfec " .. q("printf x | " .. command("put work - /fast")) .. " /dev/null")
    assert.is_nil(fast:find("B/s", 1, true), "no bar for a transfer under a second")
  end)

  it("lists sessions with a header, their state, creation time, end and labels, and as JSON", function()
    local before = os.time()
    sandkit_cmd("create a1")
    sandkit_cmd("create b2")
    local out = sandkit_cmd("ls")
    local lines = {}
    for line in out:gmatch("[^\n]+") do lines[#lines + 1] = line end
    assert.matches("^NAME%s+STATE%s+GENERATION%s+CREATED%s+EXPIRES%s+LABELS$", lines[1])
    assert.matches("^a1%s+running%s+1%s+%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ%s+%-%s+%-$", lines[2])
    assert.matches("^b2%s+running%s+1%s+", lines[3])
    local doc = cjson.decode((sandkit_cmd("ls --json")))
    assert.equal(2, #doc.sessions)
    local first = doc.sessions[1]
    assert.same({ "created_at", "expires_at", "generation", "id", "labels", "state" }, (function()
      local keys = {}
      for k in pairs(first) do keys[#keys + 1] = k end
      table.sort(keys)
      return keys
    end)())
    assert.equal("a1", first.id)
    assert.equal(os.date("!%Y-%m-%d", before), first.created_at:sub(1, 10))
    assert.equal(cjson.null, first.expires_at)
    assert.same({}, first.labels)
    local _, _, status = sandkit_cmd("rm a1 b2")
    assert.equal(0, status)
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))))
  end)

  it("prunes the sessions whose agent is gone, and only those", function()
    sandkit_cmd("create alive")
    sandkit_cmd("create dead")
    local sb = assert(sandkit.sandbox{ provider = "local", root = root })
    local pid = assert(sb:get("dead")).record.pid
    core.kill(pid, core.SIGKILL)
    wait_until(function() return not core.alive(pid) end, 5, "the agent to die")
    local out, err, status = sandkit_cmd("prune")
    assert.equal(0, status, err)
    assert.equal("dead\n", out)
    local doc = cjson.decode((sandkit_cmd("ls --json")))
    assert.equal(1, #doc.sessions)
    assert.equal("alive", doc.sessions[1].id)
    assert.same({ removed = {} }, cjson.decode((sandkit_cmd("prune --json"))))
  end)

  it("creates a session with a lifetime, and prints it as JSON", function()
    local out, err, status = sandkit_cmd("create brief --lifetime 60 --json")
    assert.equal(0, status, err)
    local doc = cjson.decode(out)
    assert.equal("brief", doc.id)
    assert.equal("running", doc.state)
    assert.equal(1, doc.generation)
    assert.is_string(doc.boot_id)
    local record = cjson.decode(files.read(root .. "/sessions/brief/record.json"))
    assert.is_true(record.expires_at >= os.time() + 55)
  end)

  it("gives sessions labels with create --label and lists by them with ls --label", function()
    local _
    local out, err, status = sandkit_cmd("create ml-1 --label team=ml --label run=42 --json")
    assert.equal(0, status, err)
    assert.same({ team = "ml", run = "42" }, cjson.decode(out).labels)
    sandkit_cmd("create ml-2 --label team=ml --label run=43")
    sandkit_cmd("create web --label team=web --label empty=")
    local function ids(args)
      local listed = {}
      for _, s in ipairs(cjson.decode((sandkit_cmd("ls --json " .. args))).sessions) do
        listed[#listed + 1] = s.id
      end
      return listed
    end
    assert.same({ "ml-1", "ml-2" }, ids("--label team=ml"))
    assert.same({ "ml-2" }, ids("--label team=ml --label run=43"))
    assert.same({ "web" }, ids("--label empty="))
    local text = sandkit_cmd("ls --label team=web")
    assert.matches("\nweb%s.*%s+empty=,team=web\n$", text)
    _, err, status = sandkit_cmd("create bad --label 'team=a b'")
    assert.equal(1, status)
    assert.matches('INVALID_INPUT: .*label "team"', err)
    assert.is_nil(io.open(root .. "/sessions/bad/record.json"), "nothing was made")
    _, err, status = sandkit_cmd("ls --label team")
    assert.equal(2, status)
    assert.matches("label", err)
  end)

  it("moves a session's end with sandkit lifetime, lists it, and names the lifetime that cut a command", function()
    sandkit_cmd("create timed --lifetime 600")
    local _
    local out, err, status = sandkit_cmd("lifetime timed 3600 --json")
    assert.equal(0, status, err)
    local doc = cjson.decode(out)
    local ends = require("sandkit.time").parse_rfc3339(doc.expires_at)
    assert.is_true(math.abs(ends - (os.time() + 3600)) <= 1, doc.expires_at)
    local listed = cjson.decode((sandkit_cmd("ls --json"))).sessions[1]
    assert.equal(doc.expires_at, listed.expires_at)
    assert.matches("%s" .. doc.expires_at:gsub("%-", "%%-") .. "%s", sandkit_cmd("ls"))
    _, err, status = sandkit_cmd("lifetime timed 0")
    assert.equal(2, status)
    assert.matches("SECONDS", err)
    _, err, status = sandkit_cmd("lifetime nothing 60")
    assert.equal(125, status)
    assert.matches("no session named nothing", err)
    -- Three seconds: time enough for the next command to start and reach the session first.
    assert.equal(0, select(3, sandkit_cmd("lifetime timed 3")))
    _, err, status = sandkit_cmd("run --session timed -- sleep 30")
    assert.equal(125, status)
    assert.matches("session timed reached the end of its lifetime at", err)
  end)

  it("starts a job, polls it, and follows it to its exit status", function()
    sandkit_cmd("create jobs")
    local id = (sandkit_cmd("job start jobs -- sh -c 'echo one; echo two >&2; exit 6'")):match("^(%S+)\n$")
    assert.is_not_nil(id)
    local out, err, status = sandkit_cmd("job poll jobs " .. id .. " --follow")
    assert.equal("one\n", out)
    assert.equal("two\n", err)
    assert.equal(6, status)
  end)

  it("prints a job's start and a poll as JSON, the poll with its next cursor", function()
    sandkit_cmd("create jobs")
    local started = cjson.decode((sandkit_cmd("job start jobs --json -- sh -c 'echo one; exit 4'")))
    assert.is_string(started.id)
    assert(sandkit_cmd("job poll jobs " .. started.id .. " --follow"))
    local doc = cjson.decode((sandkit_cmd("job poll jobs " .. started.id .. " --json")))
    assert.equal(started.id, doc.id)
    assert.is_false(doc.running)
    assert.equal("stdout", doc.frames[1].type)
    assert.equal("one\n", core.b64decode(doc.frames[1].data_base64))
    assert.equal(doc.frames[1].seq, doc.next)
    assert.equal(4, doc.exit.code)
    assert.equal(cjson.null, doc.error)
    local after = cjson.decode((sandkit_cmd("job poll jobs " .. started.id .. " --json --since " .. doc.next)))
    assert.same({}, after.frames)
    assert.equal("[]", (sandkit_cmd("job poll jobs " .. started.id .. " --json --since " .. doc.next))
      :match('"frames":(%[%])'), "an empty list is a JSON array")
  end)

  it("exits 137 for a cancelled job, not as a sandkit failure", function()
    sandkit_cmd("create jobs")
    local id = (sandkit_cmd("job start jobs -- sleep 60")):match("^(%S+)\n$")
    local _, _, status = sandkit_cmd("job cancel jobs " .. id)
    assert.equal(0, status)
    local _, err, follow = sandkit_cmd("job poll jobs " .. id .. " --follow")
    assert.equal(137, follow)
    assert.matches("cancel", err)
    local _, _, once = sandkit_cmd("job poll jobs " .. id)
    assert.equal(137, once)
  end)

  it("says on stderr when the agent dropped output, the command's status kept", function()
    if agent_features(root).outputCap then
      local out, err, status = sandkit_cmd("run --output-cap 1000 -- head -c 5000 /dev/zero")
      assert.equal(0, status)
      assert.equal(1000, #out)
      assert.matches("truncated", err)
      out, err = sandkit_cmd("run -- head -c 10000000 /dev/zero")
      assert.equal(10000000, #out, "a stream is not capped unless asked")
      assert.equal("", err)
    else
      local out, err, status = sandkit_cmd("run -- head -c 5000000 /dev/zero")
      assert.equal(0, status)
      assert.equal(4194304, #out)
      assert.matches("^sandkit: the output was truncated[^\n]*\n$", err)
    end
  end)

  it("says on stderr when the agent dropped a job's output, followed or polled to its end", function()
    sandkit_cmd("create jobs")
    local id = (sandkit_cmd("job start jobs -- head -c 5000000 /dev/zero")):match("^(%S+)\n$")
    local message = "^sandkit: the output was truncated: the agent kept at most its own cap of each stream\n$"
    local out, err, status = sandkit_cmd("job poll jobs " .. id .. " --follow")
    assert.equal(0, status)
    assert.is_true(#out < 5000000, "the agent's cap kept " .. #out .. " bytes")
    assert.matches(message, err)
    local doc = cjson.decode((sandkit_cmd("job poll jobs " .. id .. " --json")))
    assert.is_true(doc.exit.truncated)
    -- A poll past the last frame sees only the end, and says the same.
    out, err, status = sandkit_cmd("job poll jobs " .. id .. " --since " .. (doc.next + 100000000))
    assert.equal(0, status)
    assert.equal("", out)
    assert.matches(message, err)
    -- Output that was all kept is not reported.
    local whole = (sandkit_cmd("job start jobs -- echo whole")):match("^(%S+)\n$")
    out, err = sandkit_cmd("job poll jobs " .. whole .. " --follow")
    assert.equal("whole\n", out)
    assert.equal("", err)
  end)

  it("writes whole lines with --lines, so stdout and stderr never split a line", function()
    local script = "printf out1; printf err1 >&2; sleep 0.2; printf 'out2\\n'; sleep 0.2; "
      .. "printf 'err2\\n' >&2; printf tail"
    local out, _, status = local_state.sh("{ " .. command("run --lines -- sh -c " .. q(script)) .. " 2>&1; }")
    assert.equal(0, status)
    assert.equal("out1out2\nerr1err2\ntail", out)
  end)

  it("on SIGINT stops the command at once, removes its throwaway session and exits 130", function()
    local pid, output, nap = start_remote_sleep("run")
    local signalled = core.now()
    core.kill(pid, core.SIGINT)
    local _, status = core.reap(pid, true)
    local took = core.now() - signalled
    assert.equal(130, status)
    assert.is_true(took < 3, "exited " .. took .. "s after the signal; the command would run 10s")
    local _, err = output()
    assert.equal("sandkit: stopped by SIGINT\n", err)
    assert.is_nil(err:find("traceback", 1, true))
    wait_until(function() return #agent_process.processes{ "sleep", nap } == 0 end, 5,
      "the remote command to stop")
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))), "the throwaway session is gone")
  end)

  it("on SIGTERM stops the command in a named session, keeps the session and exits 143", function()
    sandkit_cmd("create kept")
    local pid, _, nap = start_remote_sleep("run --session kept")
    core.kill(pid, core.SIGTERM)
    local _, status = core.reap(pid, true)
    assert.equal(143, status)
    wait_until(function() return #agent_process.processes{ "sleep", nap } == 0 end, 5,
      "the remote command to stop")
    assert.equal("running", cjson.decode((sandkit_cmd("ls --json"))).sessions[1].state)
  end)

  it("on SIGTERM stops the command, removes its throwaway session and its agent, and exits 143", function()
    local pid, output, nap = start_remote_sleep("run")
    local sessions = cjson.decode((sandkit_cmd("ls --json"))).sessions
    assert.equal(1, #sessions)
    local agent_pid = assert(assert(sandkit.sandbox{ provider = "local", root = root }):get(sessions[1].id)).record.pid
    core.kill(pid, core.SIGTERM)
    local _, status = core.reap(pid, true)
    assert.equal(143, status)
    local _, err = output()
    assert.equal("sandkit: stopped by SIGTERM\n", err)
    wait_until(function() return #agent_process.processes{ "sleep", nap } == 0 end, 5,
      "the remote command to stop")
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))), "the throwaway session is gone")
    wait_until(function() return not core.alive(agent_pid) end, 5, "the session's agent to exit")
  end)

  it("removes a throwaway session when the reader of its output goes away", function()
    local out, _, status = local_state.sh("bash -c " .. q(command("run -- sh -c 'yes | head -c 100000000'")
      .. " | head -c 1 >/dev/null; exit ${PIPESTATUS[0]}"))
    assert.equal("", out)
    assert.equal(141, status)
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))))
  end)

  it("parses its command line strictly: unknown commands, options and extra arguments exit 2", function()
    for _, args in ipairs({ "run sh", "frobnicate", "run --timeout x -- true", "run --env NOVALUE -- true",
        "ls --bogus", "ls extra", "rm", "put a b", "job", "job frob a", "job poll a", "--bogus ls",
        "run --timeout 1 --timeout 2 -- true", "ls --json=yes", "run --create -- true" }) do
      local out, err, status = sandkit_cmd(args)
      assert.equal(2, status, args)
      assert.equal("", out, args)
      assert.matches("^sandkit: [^\n]+\n$", err, nil, args)
    end
    local _, err = sandkit_cmd("ls --bogus")
    assert.matches("unknown option %-%-bogus for ls", err)
    _, err = sandkit_cmd("ls extra")
    assert.matches("ls takes no arguments; extra: extra", err)
    _, err = sandkit_cmd("run --timout 5 -- true")
    assert.matches("did you mean %-%-timeout%?", err)
  end)

  it("refuses a number its flag cannot mean, or not in decimal digits, naming the flag, with status 2", function()
    sandkit_cmd("create jobs")
    for _, case in ipairs{ { "run --timeout 1e999 -- true", "timeout" }, { "run --timeout inf -- true", "timeout" },
        { "run --output-cap 1e300 -- true", "output%-cap" }, { "job poll jobs j1 --since 1e300", "since" },
        { "create s2 --lifetime 1e999", "lifetime" }, { "run --lifetime inf -- true", "lifetime" },
        { "run --output-cap 0x10 -- true", "output%-cap" }, { "run --timeout 1e3 -- true", "timeout" },
        { "run --output-cap ' 16' -- true", "output%-cap" }, { "job poll jobs j1 --since +1", "since" } } do
      local out, err, status = sandkit_cmd(case[1])
      assert.equal(2, status, case[1] .. ": " .. err)
      assert.equal("", out, case[1])
      assert.matches("^sandkit: %-%-" .. case[2] .. " takes [^\n]+\n$", err, nil, case[1])
    end
    local doc = cjson.decode((sandkit_cmd("ls --json")))
    assert.equal(1, #doc.sessions, "no session was made")
    assert.same({ "jobs" }, core.listdir(root .. "/sessions"), "nor any session's folder")
  end)

  it("refuses a secret file holding more than one word, as the token could not be sent", function()
    local secret = root .. "/token"
    for _, text in ipairs{ "two words\n", "line\nbreak\n", "\n \n" } do
      files.write(secret, text)
      local out, err, status = local_state.sh(local_state.lua_env() .. " " .. LUA
        .. " bin/sandkit --provider agent --url http://127.0.0.1:9 --token-file " .. q(secret) .. " run -- true")
      assert.equal(2, status, err)
      assert.equal("", out)
      assert.matches("^sandkit: %-%-token%-file takes a file holding [^\n]+\n$", err)
    end
  end)

  it("refuses a secret file that is a FIFO or a directory, by its type, before it can block", function()
    local fifo = root .. "/token.fifo"
    assert(files.execute("mkfifo " .. q(fifo)))
    for path, kind in pairs{ [fifo] = "a FIFO", [root] = "a directory" } do
      -- killed at a bound if it blocks, so that it fails instead of hanging the suite
      local out, err, status = local_state.sh(local_state.lua_env() .. " timeout -s KILL 10 " .. LUA
        .. " bin/sandkit --provider agent --url http://127.0.0.1:9 --token-file " .. q(path) .. " run -- true")
      assert.equal(2, status, err)
      assert.equal("", out)
      assert.matches("^sandkit: %-%-token%-file takes a readable regular file %(" .. path:gsub("%p", "%%%0")
        .. ": it is " .. kind .. ", not a regular file%)", err)
    end
    os.remove(fifo)
  end)

  it("says a provider sandkit has but cannot load could not be loaded, with status 125", function()
    local shadow = root .. "/shadow"
    assert(core.mkdir(shadow, 448))
    assert(core.mkdir(shadow .. "/sandkit", 448))
    assert(core.mkdir(shadow .. "/sandkit/providers", 448))
    files.write(shadow .. "/sandkit/providers/agent.lua", "error('a dependency is missing')\n")
    local out, err, status = local_state.sh("LUA_PATH=" .. q(shadow .. "/?.lua;" .. package.path)
      .. " LUA_CPATH=" .. q(package.cpath) .. " " .. LUA .. " bin/sandkit --provider agent ls")
    assert.equal(125, status, err)
    assert.equal("", out)
    assert.matches("^sandkit: [^\n]*agent provider could not be loaded: [^\n]*a dependency is missing\n$", err)
  end)

  it("prints its version, its help and each command's help", function()
    local out, _, status = sandkit_cmd("--version")
    assert.equal(0, status)
    assert.equal("sandkit " .. sandkit.VERSION .. "\n", out)
    local help
    help, _, status = sandkit_cmd("--help")
    assert.equal(0, status)
    assert.matches("^usage: sandkit ", help)
    assert.equal(help, (sandkit_cmd("help")))
    local run_help = sandkit_cmd("run --help")
    assert.matches("^usage: sandkit run ", run_help)
    assert.matches("%-%-output%-cap BYTES", run_help)
    assert.matches("%-%-root DIR", run_help, nil, "the provider's options are listed")
    assert.equal(run_help, (sandkit_cmd("help run")))
    assert.matches("^usage: sandkit job poll ", (sandkit_cmd("job poll --help")))
    assert.matches("^usage: sandkit job poll ", (sandkit_cmd("help job poll")))
    local job_help, _, job_status = sandkit_cmd("job --help")
    assert.equal(0, job_status, "job --help asks what help job does")
    assert.equal((sandkit_cmd("help job")), job_help)
  end)

  it("exits 125 for a session that does not exist, whichever command names it", function()
    sandkit_cmd("create real")
    local src = root .. "/up.txt"
    files.write(src, "up")
    for _, args in ipairs{ "run --session nosuch -- true", "put nosuch " .. q(src) .. " /x", "get nosuch /x -",
        "job start nosuch -- true", "job poll nosuch j1", "job poll nosuch j1 --follow",
        "job poll nosuch j1 --json", "job cancel nosuch j1", "rm nosuch", "rm real nosuch" } do
      local out, err, status = sandkit_cmd(args)
      assert.equal(125, status, args .. ": " .. err)
      assert.equal("", out, args)
      assert.matches("^sandkit: no session named nosuch[^\n]*\n$", err, nil, args)
    end
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))), "rm removed the session it knew")
  end)

  it("takes a session that does not exist as removed with rm -f (or --force), as rm -f does", function()
    sandkit_cmd("create real")
    for _, args in ipairs{ "rm -f nosuch", "rm --force nosuch", "rm -f nosuch real nosuch2" } do
      local out, err, status = sandkit_cmd(args)
      assert.equal(0, status, args .. ": " .. err)
      assert.equal("", out, args)
      assert.equal("", err, args)
    end
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))), "rm -f removed the session it knew")
    -- A cleanup trap for a session a script may or may not have made.
    local _, err, status = local_state.sh("sh -c " .. q("trap " .. q(command("rm -f scratch")) .. " EXIT; "
      .. command("create scratch") .. " >/dev/null"))
    assert.equal(0, status, err)
    assert.same({ sessions = {} }, cjson.decode((sandkit_cmd("ls --json"))))
    _, err, status = local_state.sh("sh -c " .. q("trap " .. q(command("rm -f never-made")) .. " EXIT; true"))
    assert.equal(0, status, err)
    _, err, status = sandkit_cmd("rm -x nosuch")
    assert.equal(2, status)
    assert.matches("unknown option %-x", err)
  end)

  it("exits with a job's own status when a poll sees it ended, and 0 while it runs or with --json", function()
    sandkit_cmd("create jobs")
    local id = (sandkit_cmd("job start jobs -- sh -c 'exit 5'")):match("^(%S+)\n$")
    assert.equal(5, select(3, sandkit_cmd("job poll jobs " .. id .. " --follow")))
    assert.equal(5, select(3, sandkit_cmd("job poll jobs " .. id)))
    assert.equal(0, select(3, sandkit_cmd("job poll jobs " .. id .. " --json")))
    local nap = remote_nap()
    local running = (sandkit_cmd("job start jobs -- sleep " .. nap)):match("^(%S+)\n$")
    local _, err, status = sandkit_cmd("job poll jobs " .. running)
    assert.equal(0, status)
    assert.matches("running; next:", err)
    assert.equal(0, select(3, sandkit_cmd("job cancel jobs " .. running)))
  end)

  it("lists each exit status once, and each kind of failure under one status", function()
    local help = sandkit_cmd("--help")
    local table_text = assert(help:match("\nexit status:\n(.*)$"))
    local seen = {}
    for line in table_text:gmatch("[^\n]+") do
      -- A status starts its line at column 3; the lines that go on describing one are indented deeper.
      local statuses = line:match("^  (%d[%d, ]*%d)") or line:match("^  (%d+)")
      for status in (statuses or ""):gmatch("%d+") do
        assert.is_nil(seen[status], "status " .. status .. " is listed twice")
        seen[status] = true
      end
    end
    assert.is_true(seen["1"] and seen["125"] and seen["143"], "the table was read")
    for _, kind in ipairs{ "no such session", "the command line is wrong", "outlived %-%-timeout" } do
      local count = select(2, table_text:gsub(kind, ""))
      assert.equal(1, count, kind)
    end
    assert.matches("job poll", table_text:match("^  N  .-\n  1 "), nil, "N names job poll as well as run")
  end)

  it("describes every job command under help job and job --help, and each one alone", function()
    local help, _, status = sandkit_cmd("help job")
    assert.equal(0, status)
    assert.matches("^usage: sandkit job ", help)
    for _, sub in ipairs{ "start", "poll", "cancel" } do
      assert.matches("\n  job " .. sub .. " NAME", help, nil, sub .. " is listed")
    end
    assert.matches("start a detached job", help)
    assert.matches("stop a job", help)
    local job_help
    job_help, _, status = sandkit_cmd("job --help")
    assert.equal(0, status)
    assert.equal(help, job_help)
    local poll_help = sandkit_cmd("help job poll")
    assert.matches("^usage: sandkit job poll NAME JOB", poll_help)
    assert.matches("\n  %-%-follow ", poll_help)
    assert.matches("\n  %-%-since N ", poll_help)
    assert.is_nil(poll_help:find("--id ID", 1, true), "only poll's own options")
    assert.equal(poll_help, (sandkit_cmd("job poll --help")))
    local _, err = sandkit_cmd("job")
    assert.matches("see `sandkit job %-%-help`", err)
  end)

  it("takes provider options after the command as well as before it", function()
    local other = local_state.new()
    finally(function() local_state.clean(other) end)
    -- The default state folder is the root of this spec: a --root not taken lands there, not in $HOME.
    local out, err, status = local_state.sh("XDG_STATE_HOME=" .. q(root) .. " " .. local_state.lua_env() .. " "
      .. LUA .. " bin/sandkit create x --root " .. q(other))
    assert.equal(0, status, err)
    assert.equal("x\n", out)
    assert.truthy(files.read(other .. "/sessions/x/record.json"))
    assert.is_nil(files.read(root .. "/sandkit/sessions/x/record.json"))
    local_state.clean(root .. "/sandkit")
  end)
end)

describe("the README", function()
  it("shows exactly what `sandkit --help` prints, exit statuses included", function()
    local help = local_state.sh(local_state.lua_env() .. " " .. LUA .. " bin/sandkit --help")
    local readme = assert(files.read("README.md"))
    assert.truthy(readme:find("```text\n" .. help .. "```\n", 1, true),
      "README's command section must hold `sandkit --help` verbatim")
  end)
end)
