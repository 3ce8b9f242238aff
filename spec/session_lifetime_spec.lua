-- Session lifetimes on the local provider, against real sandkit-agents: the end a session shows,
-- moving it either way on the record and on the agent's own clock, the bounds on it, and a
-- command cut by it saying so.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local options = require "sandkit.options"
local wait = require "sandkit.wait"
local local_state = require "support.local_state"

--- Waits, within `seconds`, until the agent `pid` has left; whether it did.
local function left_within(pid, seconds)
  local deadline = core.now() + seconds
  while core.alive(pid) and not core.reap(pid) and core.now() < deadline do wait.sleep(0.05) end
  return not core.alive(pid)
end

describe("a local session's lifetime", function()
  local root, sandbox
  before_each(function()
    root = local_state.new()
    -- Confined, as sessions are by default: the agent then moves into namespaces of its own.
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  end)
  after_each(function() local_state.clean(root) end)

  it("shows its end as expires_at, nil for none, the same from another sandbox", function()
    local before = os.time()
    local session = assert(sandbox:create{ id = "timed", lifetime = 600 })
    assert.is_true(session.expires_at >= before + 600 and session.expires_at <= os.time() + 600)
    assert.is_nil(assert(sandbox:create{ id = "endless" }).expires_at)
    local again = assert(sandkit.sandbox{ provider = "local", root = root })
    assert.equal(session.expires_at, assert(again:get("timed")).expires_at)
    assert.is_nil(assert(again:get("endless")).expires_at)
    assert.is_true(sandbox:capabilities().set_lifetime)
  end)

  it("lengthens a lifetime on the agent's own clock: the session outlives its first end", function()
    local session = assert(sandbox:create{ id = "longer", lifetime = 5 })
    local first_end = session.expires_at
    assert(session:set_lifetime(60))
    assert.is_true(math.abs(session.expires_at - (os.time() + 60)) <= 1)
    assert.equal(session.expires_at, assert(sandbox:get("longer")).expires_at)
    -- Past the first end by two seconds: the agent's clock would have ended it by then.
    local nap = math.max(1, first_end - os.time() + 2)
    local result = assert(session:exec({ "sh", "-c", "sleep " .. nap .. "; echo still" }, { timeout = 30 }))
    assert.equal("still\n", result.stdout)
    assert.is_true(core.alive(session.record.pid))
  end)

  it("gives a session without an end one, from another process's sandbox too", function()
    local session = assert(sandbox:create{ id = "later" })
    local other = assert(sandkit.sandbox{ provider = "local", root = root })
    assert(assert(other:get("later")):set_lifetime(1))
    assert.is_true(left_within(session.record.pid, 10), "the agent left at its new end")
    assert.is_nil((sandbox:get("later")))
  end)

  it("reports a command cut by the end as SESSION_EXPIRED, its outcome still unknown", function()
    local session = assert(sandbox:create{ id = "cut", lifetime = 600 })
    assert(session:set_lifetime(1))
    local result, err = session:exec({ "sleep", "30" }, { timeout = 60 })
    assert.is_nil(result)
    assert.equal("SESSION_EXPIRED", err.reason, tostring(err))
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
    assert.equal(session.expires_at, err.expires_at)
    assert.matches("lifetime", err.message)
    -- The stream form raises the same error from the loop.
    local ok, raised = pcall(function()
      for _ in session:run({ "true" }, { timeout = 5 }) do end
    end)
    assert.is_false(ok)
    assert.equal("SESSION_EXPIRED", raised.reason, tostring(raised))
    -- Files, jobs and the filesystem calls say it too, each keeping its own code.
    for what, call in pairs{
      read_file = function() return session:read_file("/x") end,
      write_files = function() return session:write_files{ ["/x"] = "x" } end,
      start_job = function() return session:start_job({ "true" }, { timeout = 5 }) end,
      stat = function() return session:stat("/") end,
      list = function() return session:list("/") end,
    } do
      local value, failure = call()
      assert.is_nil(value, what)
      assert.equal("SESSION_EXPIRED", failure.reason, what .. ": " .. tostring(failure))
      assert.equal(what == "start_job" and "SANDBOX_OUTCOME_UNKNOWN" or "SANDBOX_UNREACHABLE", failure.code, what)
    end
  end)

  it("reports a cut command on a session still alive without SESSION_EXPIRED", function()
    local session = assert(sandbox:create{ id = "alive", lifetime = 600 })
    core.kill(session.record.pid, core.SIGKILL)
    core.reap(session.record.pid, true)
    local _, err = session:exec({ "true" }, { timeout = 5 })
    assert.is_not_nil(err)
    assert.is_nil(err.reason)
  end)

  it("refuses to move the end of an agent started without a lifetime file, leaving it running", function()
    local session = assert(sandbox:create{ id = "older", lifetime = 600 })
    local dir = root .. "/sessions/older"
    -- An agent an older sandkit started: the session's files on its command line, no lifetime
    -- file, and SIGHUP would end it.
    core.kill(session.record.pid, core.SIGKILL)
    core.reap(session.record.pid, true)
    local older = assert(core.spawn({ "sh", "-c", "sleep 30", "sandkit-agent", dir .. "/files" }, {}))
    finally(function()
      core.kill(older, core.SIGKILL)
      core.reap(older, true)
    end)
    local agent_process = require "sandkit.providers.local.agent_process"
    local deadline = core.now() + 10
    while not agent_process.is_agent_of(older, dir) do
      assert(core.now() < deadline, "the stand-in did not start")
      wait.sleep(0.01)
    end
    local record = require("support.files").read(dir .. "/record.json"):gsub('"pid":%d+', '"pid":' .. older)
    local f = assert(io.open(dir .. "/record.json", "wb"))
    f:write(record)
    f:close()
    local ok, err = session:set_lifetime(60)
    assert.is_nil(ok)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("without a lifetime file", err.message)
    assert.is_true(core.alive(older), "no SIGHUP was sent")
    assert.equal(session.expires_at, assert(sandbox.provider:expires_at(session.record)))
  end)

  it("refuses a lifetime that is no number of seconds, or ends past 9999, sending nothing", function()
    local session = assert(sandbox:create{ id = "bounded", lifetime = 600 })
    local ends = session.expires_at
    for _, bad in ipairs{ 0, -5, 0.5, 0 / 0, math.huge, -math.huge, "60",
        options.LAST_TIME - os.time() + 10 } do
      local ok, err = session:set_lifetime(bad)
      assert.is_nil(ok)
      assert.equal("INVALID_INPUT", err.code, tostring(bad))
      assert.equal("seconds", err.field)
    end
    assert.equal(ends, assert(sandbox:get("bounded")).expires_at)
    assert(session:set_lifetime(options.LAST_TIME - os.time() - 10))
    local _, err = sandbox:create{ id = "too-long", lifetime = options.LAST_TIME }
    assert.equal("lifetime", err.field)
  end)
end)

describe("set_lifetime where the provider cannot change one", function()
  it("is OPERATION_NOT_SUPPORTED before anything is sent", function()
    local agent = assert(sandkit.sandbox{ provider = "agent", url = "http://127.0.0.1:9", token = "x" })
    assert.is_false(agent:capabilities().set_lifetime)
    -- A session object as get would hand back, without asking the agent (none listens).
    local session = setmetatable({ id = "agent", sandbox = agent, record = { id = "agent" } },
      require("sandkit.sandbox").session_metatable)
    local ok, err = session:set_lifetime(60)
    assert.is_nil(ok)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
  end)
end)
