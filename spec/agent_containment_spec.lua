-- No command outlives sandkit-agent (src/agent/contain.h, docs/agent.md "Containment"): the
-- real agent, killed as an operator or the kernel's OOM killer would kill it, and /proc read
-- for what is left. Each command's processes carry a sleep length no other spec uses, so what
-- is looked for can only be this spec's.

local agent_process = require "support.agent_process"
local cleanups = require "support.cleanups"
local files = require "support.files"

local within, pid_alive, processes = agent_process.within, agent_process.pid_alive,
  agent_process.processes
local start_agent = agent_process.start_agent

--- A sleep length unique to this run, so concurrent specs never see each other's processes.
local function unique_seconds()
  return string.format("%d.%06d", 300 + math.random(0, 99), math.random(0, 999999))
end

--- Starts `sh -c 'sleep A & setsid sleep B & sleep C'` as an exec stream and as a job, and
-- waits until all six sleeps run; returns their lengths.
local function start_commands(agent)
  local lengths = {}
  for i = 1, 6 do lengths[i] = unique_seconds() end
  local function line(a, b, c)
    return string.format("sleep %s & setsid sleep %s & sleep %s", a, b, c)
  end
  local stream = agent:stream({ command = { "sh", "-c", line(lengths[1], lengths[2], lengths[3]) },
    timeoutMs = 600000 })
  local res = agent:start_job({ command = { "sh", "-c", line(lengths[4], lengths[5], lengths[6]) },
    timeoutMs = 600000 })
  assert.are.equal(200, res.status)
  assert.is_true(within(10, function()
    for _, len in ipairs(lengths) do
      if #processes{ "sleep", len } ~= 1 then return false end
    end
    return true
  end), "the commands did not start")
  return lengths, stream
end

local function survivors(lengths)
  local left = {}
  for _, len in ipairs(lengths) do
    for _, pid in ipairs(processes{ "sleep", len }) do left[#left + 1] = pid end
  end
  return left
end

local am_root = agent_process.am_root

--- Ends what a failed containment left, so one failure does not leave sleeps behind.
local function kill_survivors(lengths)
  for _, pid in ipairs(survivors(lengths)) do os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
end

--- Kills the agent outright and asserts that nothing it started is left within the bound.
local function assert_nothing_survives_sigkill(agent)
  local lengths, stream = start_commands(agent)
  finally(function() kill_survivors(lengths) end)
  assert.truthy(agent.pid and pid_alive(agent.pid))
  os.execute("kill -KILL " .. agent.pid)
  assert.is_true(within(5, function() return #survivors(lengths) == 0 end),
    "left running after SIGKILL: " .. table.concat(survivors(lengths), " "))
  stream:close()
end

describe("sandkit-agent containment", function()
  it("leaves no command running, setsid escapees included, when killed with SIGKILL", function()
    local A = assert(start_agent())
    finally(function() A:stop() end)
    assert.truthy(files.read(A.log):find("commands contained in a PID namespace", 1, true))
    assert_nothing_survives_sigkill(A)
  end)

  it("gives the same guarantee to an agent run by an unprivileged user", function()
    if not am_root() then
      -- Then every other test here already runs the agent unprivileged.
      pending("only root can start the agent as another user")
      return
    end
    local U = assert(start_agent{ shared = true,
      prefix = "setpriv --reuid=65534 --regid=65534 --clear-groups" })
    finally(function() U:stop() end)
    assert.truthy(files.read(U.log):find("contained in a PID namespace of a user namespace", 1, true))
    -- Commands keep the agent's identity inside its user namespace.
    local _, frames = U:exec({ command = { "id", "-u" }, timeoutMs = 10000 })
    local last, out = agent_process.check_stream(frames)
    assert.are.equal(0, last.code)
    assert.are.equal("65534\n", out)
    assert_nothing_survives_sigkill(U)
  end)

  it("kills what commands left behind, setsid escapees included, when stopped with SIGTERM", function()
    local A = assert(start_agent())
    local defer = cleanups.of(finally)
    defer(function() A:stop() end)
    local lengths, stream = start_commands(A)
    defer(function() kill_survivors(lengths) end)
    assert.are.equal(0, A:stop())
    assert.is_true(within(5, function() return #survivors(lengths) == 0 end),
      "left running after SIGTERM: " .. table.concat(survivors(lengths), " "))
    stream:close()
  end)

  it("gives commands a /proc that agrees with their own pids", function()
    local A = assert(start_agent())
    finally(function() A:stop() end)
    -- `read` is the shell's own, so /proc/self is the process reading: the shell itself must be
    -- the process $$ names, and a child must be the one $! names. The child says who it is
    -- itself and the shell waits for it, so nothing is read before the child runs.
    local _, frames = A:exec({ command = { "sh", "-c",
      "(read -r kid rest < /proc/self/stat; echo $kid) & wait $!; echo $!; "
        .. "read -r me rest < /proc/self/stat; echo $me $$" },
      timeoutMs = 10000 })
    local last, out = agent_process.check_stream(frames)
    assert.are.equal(0, last.code)
    local kid, bang, me, shell = out:match("^(%d+)\n(%d+)\n(%d+) (%d+)\n$")
    assert.truthy(kid, out)
    assert.are.equal(bang, kid)
    assert.are.equal(shell, me)
  end)

  it("stops, rather than run commands it cannot contain, when its keeper is killed", function()
    local A = assert(start_agent())
    finally(function() A:stop() end)
    local lengths, stream = start_commands(A)
    local keepers = agent_process.children(A.pid, "sandkit-keeper")
    assert.are.equal(1, #keepers, "the agent has one keeper")
    os.execute("kill -KILL " .. keepers[1])
    assert.is_true(within(5, function() return #survivors(lengths) == 0 end))
    assert.is_true(within(5, function() return not pid_alive(A.pid) end), "the agent kept serving")
    assert.truthy(files.read(A.log):find("keeper of the commands' PID namespace was killed", 1, true))
    assert.are.equal(1, A:stop())
    stream:close()
  end)

  it("says at start that it cannot contain commands where the machine forbids it", function()
    -- A user namespace that may create no further ones, and no capabilities in it: neither
    -- arrangement the agent tries can work.
    local prefix = "unshare --user --map-root-user sh -c "
      .. files.shell_quote("echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv "
        .. "--bounding-set=-all --inh-caps=-all --securebits=+noroot,+noroot_locked \"$@\"") .. " wrapper"
    -- The arrangement alone, without the agent: only its failure makes the test pending; an
    -- agent that will not start inside it is the failure this test is for.
    if not files.execute(prefix .. " true 2>/dev/null") then
      pending("this machine cannot make the user namespace the test needs")
      return
    end
    local A, log = start_agent{ prefix = prefix }
    assert.truthy(A, "the agent did not start where it cannot contain commands: " .. tostring(log))
    finally(function() A:stop() end)
    local text = files.read(A.log)
    assert.truthy(text:find("commands NOT contained, what they leave behind may outlive an agent "
      .. "killed with SIGKILL", 1, true), text)
    -- It still serves.
    local _, frames = A:exec({ command = { "echo", "hi" }, timeoutMs = 10000 })
    assert.are.equal("hi\n", select(2, agent_process.check_stream(frames)))
  end)
end)
