-- Resource limits of a local session (README "Limits"): memory, processes and CPU bound what a
-- session's commands use together, in control groups of the session's own; a command the memory
-- limit killed says so (`oom`, and the CLI's "killed: memory limit"); a fork bomb in one session
-- leaves the others and the agent serving; a limit that is no bound, or that this machine cannot
-- enforce, is refused at create.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local files = require "support.files"
local local_state = require "support.local_state"
local procs = require "support.processes"

local q = local_state.shell_quote
local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local MiB = 1024 * 1024

--- An allocation the memory limit below cannot hold: dd's one 64 MiB block.
local OVER = { "dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1" }
local LIMIT = 32 * MiB

describe("a local session's limits", function()
  local root, sandbox
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  end)
  after_each(function()
    local_state.clean(root)
  end)

  --- A session with limits, or pending with why this machine cannot enforce them.
  local function create(limits, opts)
    local enforced = sandbox:capabilities().limits
    for name in pairs(limits) do
      if not enforced[name] then
        pending("this machine cannot enforce limits." .. name .. " (capabilities().limits)")
        return nil
      end
    end
    opts = opts or {}
    opts.limits = limits
    local session, err = sandbox:create(opts)
    if not session and err.field == "isolate" then
      pending("this machine cannot confine a session: " .. err.message)
      return nil
    end
    return assert(session, err)
  end

  it("are listed by capabilities(): what this machine enforces", function()
    local limits = sandbox:capabilities().limits
    assert.is_table(limits)
    for _, name in ipairs{ "memory", "pids", "cpu", "disk" } do assert.is_boolean(limits[name]) end
  end)

  describe("disk", function()
    local DISK = 32 * MiB

    it("fails a write past it with ENOSPC inside and NO_SPACE in the files API, and the session lives on",
      function()
        local session = create{ disk = DISK }
        if not session then return end
        local r = assert(session:exec({ "sh", "-c", "dd if=/dev/zero of=$HOME/fill bs=1M count=64" }, { timeout = 30 }))
        assert.are_not.equal(0, r.code)
        assert.truthy(r.stderr:find("No space left on device", 1, true), r.stderr)
        local ok, err = session:write_files{ ["/home/user/more"] = string.rep("x", MiB) }
        assert.is_nil(ok)
        assert.truthy(err.message:find("NO_SPACE", 1, true), tostring(err))
        r = assert(session:exec({ "sh", "-c", "rm $HOME/fill && echo room > $HOME/after && cat $HOME/after" },
          { timeout = 30 }))
        assert.equal("room\n", r.stdout, r.stderr)
        -- What the session wrote is on its disk, not in its folder.
        local out = local_state.sh("du -sk " .. q(root .. "/sessions/" .. session.id .. "/files") .. " | cut -f1")
        assert.is_true(tonumber(out) < 1024)
      end)

    it("keeps what the session wrote when it is served again", function()
      local session = create{ disk = DISK }
      if not session then return end
      assert.equal(0, assert(session:exec({ "sh", "-c", "echo kept > $HOME/k" }, { timeout = 30 })).code)
      local pid = session.record.pid
      core.kill(pid, core.SIGKILL)
      assert.is_true(procs.within(10, function() return not core.alive(pid) or core.reap(pid) end))
      local revived = assert(sandbox:get_or_create{ id = session.id })
      assert.equal("kept\n", assert(revived:exec({ "cat", "/home/user/k" }, { timeout = 30 })).stdout)
    end)
  end)

  describe("memory", function()
    it("kills a command past it, and its result says oom", function()
      local session = create{ memory = LIMIT }
      if not session then return end
      local r = assert(session:exec(OVER, { timeout = 30 }))
      assert.equal(137, r.code)
      assert.equal(9, r.signal)
      assert.is_true(r.oom)
      local fine = assert(session:exec({ "dd", "if=/dev/zero", "of=/dev/null", "bs=1M", "count=4" }, { timeout = 30 }))
      assert.equal(0, fine.code)
      assert.is_nil(fine.oom, "a command within the limit is no oom")
    end)

    it("tells a job's poll too, and a SIGKILL from elsewhere is no oom", function()
      local session = create{ memory = LIMIT }
      if not session then return end
      local job = assert(session:start_job(OVER, { timeout = 30 }))
      local page
      assert.is_true(procs.within(20, function()
        page = assert(job:poll())
        return not page.running
      end))
      assert.is_true(page.exit.oom)
      local killed = assert(session:exec({ "sh", "-c", "kill -9 $$" }, { timeout = 30 }))
      assert.equal(9, killed.signal)
      assert.is_nil(killed.oom)
    end)

    it("is what the CLI names on stderr when it killed the command", function()
      local cli = local_state.lua_env() .. " " .. LUA .. " bin/sandkit --root " .. q(root)
      local id, err, status = local_state.sh(cli .. " create --memory 32M")
      if status ~= 0 and err:find("cannot be enforced", 1, true) then
        return pending("this machine cannot enforce a memory limit: " .. err)
      end
      assert.equal(0, status, err)
      id = id:gsub("%s+$", "")
      local _, said, code = local_state.sh(cli .. " run --session " .. q(id) .. " -- " .. table.concat(OVER, " "))
      assert.equal(137, code)
      assert.truthy(said:find("killed: memory limit (32 MiB)", 1, true), said)
    end)
  end)

  it("pids: a fork bomb in one session leaves the others and its own agent serving", function()
    local bombed = create{ pids = 64 }
    if not bombed then return end
    local other = assert(sandbox:create{})
    local bomb = assert(bombed:start_job({ "sh", "-c", "b() { b | b & }; b; sleep 30" }, { timeout = 60 }))
    -- The bomb is at its bound once forks fail in it.
    local stderr = {}
    assert.is_true(procs.within(30, function()
      local page = assert(bomb:poll())
      for _, f in ipairs(page.frames) do if f.type == "stderr" then stderr[#stderr + 1] = f.data end end
      return table.concat(stderr):find("fork", 1, true) ~= nil or not page.running
    end), "forks fail in the bombed session")
    local r = assert(other:exec({ "sh", "-c", "echo ok; true | true" }, { timeout = 30 }))
    assert.equal("ok\n", r.stdout, "another session starts commands")
    r = assert(bombed:exec({ "echo", "served" }, { timeout = 30 }))
    assert.equal("served\n", r.stdout, "the bombed session's agent still serves")
    assert(bomb:cancel())
  end)

  it("cpu: a busy command gets about the share it was given", function()
    local session = create{ cpu = 0.25 }
    if not session then return end
    -- 1.5 s of wall time spinning; os.clock is the CPU time the command had.
    local r = assert(session:exec({ LUA, "-e", [[
      local socket = require "socket"
      local t0 = socket.gettime()
      while socket.gettime() - t0 < 1.5 do end
      print(os.clock())]] }, { timeout = 30 }))
    assert.equal(0, r.code, r.stderr)
    local cpu = tonumber(r.stdout)
    -- A quarter of a core for 1.5 s is about 0.4 s; unbounded it is 1.5 s.
    assert.is_true(cpu < 0.9, "CPU seconds in 1.5 s of a quarter core: " .. tostring(cpu))
  end)

  it("are kept by a session served again after its agent died", function()
    local session = create{ memory = LIMIT }
    if not session then return end
    core.kill(session.record.pid, core.SIGKILL)
    local pid = session.record.pid
    assert.is_true(procs.within(10, function() return not core.alive(pid) or core.reap(pid) end))
    local revived = assert(sandbox:get_or_create{ id = session.id })
    local r = assert(revived:exec(OVER, { timeout = 30 }))
    assert.is_true(r.oom)
  end)

  describe("that are no bound are INVALID_INPUT, and nothing is made", function()
    for _, case in ipairs{
      { "limits that are no table", "512M" },
      { "an unknown limit", { swap = 1 } },
      { "memory of 0", { memory = 0 } },
      { "negative memory", { memory = -1 } },
      { "memory that is no whole number", { memory = 1.5 * MiB } },
      { "memory as text", { memory = "512M" } },
      { "memory a shell cannot start in", { memory = 1 * MiB }, "shell" },
      { "pids of 0", { pids = 0 } },
      { "pids a pipeline cannot run in", { pids = 2 }, "pipeline" },
      { "cpu of 0", { cpu = 0 } },
      { "negative cpu", { cpu = -1 } },
      { "cpu finer than a hundredth", { cpu = 0.001 } },
      { "cpu beyond any machine", { cpu = 2048 } },
      { "a disk its filesystem's bookkeeping would fill", { disk = 4 * MiB }, "bookkeeping" },
      { "a disk that is no whole number", { disk = 20 * MiB + 0.5 } },
    } do
      it(case[1], function()
        local session, err = sandbox:create{ limits = case[2] }
        assert.is_nil(session)
        assert.equal("INVALID_INPUT", err.code, tostring(err))
        assert.equal("limits", err.field)
        if case[3] then assert.truthy(err.message:find(case[3], 1, true), err.message) end
        assert.same({}, core.listdir(root .. "/sessions") or {})
      end)
    end
  end)

  it("written wrong on the command line are refused with status 2, and nothing is made", function()
    local cli = local_state.lua_env() .. " " .. LUA .. " bin/sandkit --root " .. q(root)
    for _, flags in ipairs{ "--memory 512Q", "--memory -1", "--memory 0x10", "--pids 1e3", "--cpus 1.555",
      "--cpus .5", "--cpus 1.", "--disk 2X", "--memory 99999999999T" } do
      local _, err, status = local_state.sh(cli .. " create " .. flags)
      assert.equal(2, status, flags .. ": " .. err)
    end
    -- Written right but no bound: refused by create, with status 1.
    local _, err, status = local_state.sh(cli .. " create --pids 2")
    assert.equal(1, status)
    assert.truthy(err:find("limits.pids", 1, true), err)
    assert.same({}, core.listdir(root .. "/sessions") or {})
  end)

  it("are bounds the agent itself holds: each past its range is a start that fails with status 2", function()
    local agent = os.getenv("SANDKIT_AGENT")
    local dir = local_state.new()
    local base = q(agent) .. " --root " .. q(dir) .. " --no-auth --isolate none "
    for _, case in ipairs{
      { "--memory 8388607", "at least 8388608" }, { "--memory 1125899906842625", "at most" },
      { "--pids 7", "at least 8" }, { "--pids 4194305", "at most" },
      { "--cpus 0", "0.01 to 1024" }, { "--cpus 1024.01", "0.01 to 1024" }, { "--cpus 1.234", "two decimals" },
      { "--image /x --image-work /y", "--image needs --isolate bwrap" },
      { "--disk /x", "--disk needs --isolate bwrap" },
      { "--image /x", "go together" },
    } do
      local _, err, status = local_state.sh(base .. case[1])
      assert.equal(2, status, case[1] .. ": " .. err)
      assert.truthy(err:find(case[2], 1, true), case[1] .. ": " .. err)
    end
    local _, err, status = local_state.sh(q(agent) .. " --root " .. q(dir) .. " --no-auth --isolate bwrap "
      .. "--image /a,b --image-work /w")
    core.remove_tree(dir)
    assert.equal(2, status)
    assert.truthy(err:find("without ','", 1, true), err)
  end)

  it("disk is for confined sessions: an unconfined sandbox says it cannot enforce one, and refuses it", function()
    local host = assert(sandkit.sandbox{ provider = "local", root = root, isolate = "none" })
    assert.is_false(host:capabilities().limits.disk)
    local session, err = host:create{ limits = { disk = 64 * MiB } }
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.truthy(err.message:find("confined", 1, true), err.message)
    assert.same({}, core.listdir(root .. "/sessions") or {})
  end)

  it("that this machine cannot enforce are refused at create, never accepted and ignored", function()
    -- An agent that says it can bound nothing here.
    local dir = local_state.new()
    local agent = dir .. "/sandkit-agent"
    files.write(agent, "#!/bin/sh\n[ \"$1\" = --probe-limits ] && { echo; exit 0; }\nexec "
      .. q(os.getenv("SANDKIT_AGENT")) .. " \"$@\"\n")
    assert(files.execute("chmod 0755 " .. q(agent)))
    local sb = assert(sandkit.sandbox{ provider = "local", root = root, agent_path = agent })
    assert.is_false(sb:capabilities().limits.memory)
    local session, err = sb:create{ limits = { memory = LIMIT } }
    core.remove_tree(dir)
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("limits", err.field)
    assert.truthy(err.message:find("cannot be enforced", 1, true), err.message)
    assert.same({}, core.listdir(root .. "/sessions") or {})
  end)
end)
