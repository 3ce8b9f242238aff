-- Azure sessions without an agent: commands go through the data plane's executeShellCommand
-- under a deadline wrapper, and their frames are rebuilt from the finished result. The fake
-- data plane runs the command string with /bin/sh on this machine, so the wrapper really runs.

local core = require "sandkit.core"
local azure_dataplane = require "support.azure_dataplane"
local agents = require "support.azure_agents"
local files = require "support.files"
local local_state = require "support.local_state"

local record = azure_dataplane.record
local quote = local_state.shell_quote

--- executeShellCommand as the data plane does it: a shell runs the string, in the working
-- directory when one is given, and the call answers with both streams and the exit code.
local function run_here(_, _, _, command, working_directory)
  local stdout, stderr, code = local_state.sh((working_directory and ("cd " .. quote(working_directory)
    .. " && ") or "") .. "(" .. command .. ")")
  return { stdout = stdout, stderr = stderr, exit_code = code }
end

local function native_session(dp, options)
  dp:on("get_sandbox", dp.handlers.get_sandbox or function(_, _, id) return record(id, { labels = {} }) end)
  return assert(agents.sandbox(dp, options):get("native"))
end

local function items_of(session, argv, opts)
  local items = {}
  local ok, err = pcall(function()
    for frame in session:run(argv, opts) do items[#items + 1] = frame end
  end)
  if not ok then items[#items + 1] = err end
  return items
end

describe("a session without an agent's files as a filesystem", function()
  it("are refused as OPERATION_NOT_SUPPORTED, saying why, with nothing sent", function()
    local dp = azure_dataplane.new():expect("execute_shell_command", 0):expect("read_file", 0)
      :expect("agent_port_url", 0)
    local session = native_session(dp)
    local caps = session:capabilities()
    assert.is_false(caps.fs)
    assert.is_false(caps.watch)
    for _, call in ipairs{
      function() return session:list("/") end, function() return session:stat("/x") end,
      function() return session:remove("/x") end, function() return session:rename("/x", "/y") end,
      function() return session:write_dir_from("/x", "/tmp") end,
      function() return session:read_dir_to("/x", "/tmp/never-made") end,
    } do
      local ok, err = call()
      assert.is_nil(ok)
      assert.equal("OPERATION_NOT_SUPPORTED", err.code)
      assert.matches("data plane", err.message)
    end
    local ok, err = pcall(function() for _ in session:watch("/", { timeout = 1 }) do end end)
    assert.is_false(ok)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    dp:verify()
  end)
end)

describe("a session without an agent's interactive jobs", function()
  it("are refused as OPERATION_NOT_SUPPORTED, saying why, with nothing sent", function()
    local dp = azure_dataplane.new():expect("execute_shell_command", 0):expect("read_file", 0)
      :expect("agent_port_url", 0)
    local session = native_session(dp)
    local caps = session:capabilities()
    assert.is_false(caps.stdin)
    assert.is_false(caps.pty)
    for _, call in ipairs{
      function() return session:spawn({ "cat" }, { timeout = 5, stdin = true }) end,
      function() return session:spawn({ "sh" }, { timeout = 5, pty = { cols = 80, rows = 24 } }) end,
      function() return session:exec({ "cat" }, { timeout = 5, stdin = "input" }) end,
      function() return session:jobs() end,
    } do
      local ok, err = call()
      assert.is_nil(ok)
      assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    end
    local ok, err = session:spawn({ "cat" }, { timeout = 5, stdin = true })
    assert.is_nil(ok)
    assert.matches("takes no input", err.message)
    dp:verify()
  end)
end)

describe("a command on a session without an agent", function()
  it("comes back as the agent would stream it: stdout, stderr without the wrapper's nonce, then the exit", function()
    local dp = azure_dataplane.new():on("execute_shell_command", run_here):expect("agent_port_url", 0)
    local items = items_of(native_session(dp), { "sh", "-c", "printf out; printf err >&2; exit 3" }, { timeout = 5 })
    assert.same({
      { type = "stdout", seq = 0, data = "out" },
      { type = "stderr", seq = 1, data = "err" },
      { type = "exit", code = 3, truncated = false },
    }, items)
    dp:verify()
  end)

  it("reaches the program with its arguments, environment and working directory untouched by the shell", function()
    local dir = files.temp_dir()
    finally(function() core.remove_tree(dir) end)
    local dp = azure_dataplane.new():on("execute_shell_command", run_here)
    local result = assert(native_session(dp):exec(
      { "sh", "-c", 'printf "%s|%s|%s" "$1" "$K" "$(pwd)"', "x", "a'b; $(false) \"q\" *" },
      { timeout = 5, env = { K = "v w'$HOME" }, cwd = dir }))
    assert.equal("a'b; $(false) \"q\" *|v w'$HOME|" .. dir, result.stdout)
    assert.equal("", result.stderr)
    assert.equal(0, result.code)
  end)

  it("is killed with its process group at its timeout and reported as timeoutExceeded after its output", function()
    local dp = azure_dataplane.new():on("execute_shell_command", function(...)
      local args = { ... }
      -- The call is bounded by the command's timeout plus the grace.
      assert.equal(0.3 + 10, args[6].timeout)
      return run_here(...)
    end)
    local started = core.now()
    local items = items_of(native_session(dp), { "sh", "-c", "echo started; sleep 30 & sleep 30" }, { timeout = 0.3 })
    assert.is_true(core.now() - started < 5, "killed at the deadline, not when the command ends")
    assert.same({ type = "stdout", seq = 0, data = "started\n" }, items[1])
    assert.equal("SANDBOX_COMMAND_FAILED", items[2].code)
    assert.equal("timeoutExceeded", items[2].failure)
    assert.equal(2, #items)
  end)

  it("that kills itself with SIGKILL exits 137 and is not mistaken for a timeout", function()
    local dp = azure_dataplane.new():on("execute_shell_command", run_here)
    local result, err = native_session(dp):exec({ "sh", "-c", "kill -9 $$" }, { timeout = 5 })
    assert.is_truthy(result, tostring(err))
    assert.equal(137, result.code)
  end)

  it("is refused as commandNotBounded when the image cannot run the wrapper, and nothing ran", function()
    local dp = azure_dataplane.new():on("execute_shell_command", function()
      return { stdout = "", stderr = "", exit_code = 126 }
    end)
    local items = items_of(native_session(dp), { "true" }, { timeout = 5 })
    assert.equal(1, #items)
    assert.equal("commandNotBounded", items[1].failure)
  end)

  it("exits -1 when the data plane reports no exit code", function()
    local dp = azure_dataplane.new():on("execute_shell_command", function()
      return { stdout = "hi", stderr = string.rep("a", 32) .. "\n" }
    end)
    assert.same({ { type = "stdout", seq = 0, data = "hi" }, { type = "exit", code = -1, truncated = false } },
      items_of(native_session(dp), { "true" }, { timeout = 5 }))
  end)

  it("wakes a stopped session first", function()
    local dp = azure_dataplane.new()
      :on("get_sandbox", function(n, _, id)
        return record(id, { labels = {}, state = n <= 2 and "Stopped" or "Running" })
      end)
      :expect("resume_sandbox", 1):on("resume_sandbox", function() return true end)
      :on("execute_shell_command", run_here)
    local result = assert(native_session(dp):exec({ "echo", "awake" }, { timeout = 5 }))
    assert.equal("awake\n", result.stdout)
    dp:verify()
  end)

  it("is refused without running on a session that is being deleted", function()
    local dp = azure_dataplane.new()
      :on("get_sandbox", function(n, _, id)
        return record(id, { labels = {}, state = n == 1 and "Running" or "Deleting" })
      end)
      :expect("execute_shell_command", 0)
    local result, err = native_session(dp):exec({ "true" }, { timeout = 5 })
    assert.is_nil(result)
    assert.equal("sandboxGone", err.failure)
    dp:verify()
  end)

  it("without a positive timeout is refused before anything is sent", function()
    local dp = azure_dataplane.new():expect("execute_shell_command", 0)
    local result, err = native_session(dp):exec({ "true" }, { timeout = 0 })
    assert.is_nil(result)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("timeout", err.field)
    dp:verify()
  end)

  it("whose answer was lost has an unknown outcome, never retried", function()
    local dp = azure_dataplane.new():expect("execute_shell_command", 1):on("execute_shell_command", function()
      return nil, require("sandkit.errors").new("SANDBOX_OUTCOME_UNKNOWN", { operation = "azure.executeShellCommand",
        message = "azure.executeShellCommand did not report its outcome" })
    end)
    local result, err = native_session(dp):exec({ "true" }, { timeout = 5 })
    assert.is_nil(result)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.equal("sandbox.runCommand", err.operation)
    assert.is_false(err.retryable)
    dp:verify()
  end)
end)

describe("files on a session without an agent", function()
  it("are read, written in path order and made through the data plane", function()
    local written = {}
    local dp = azure_dataplane.new()
      :on("read_file", function(_, group, id, path)
        assert.same({ "group", "native" }, { group, id })
        if path == "/app/a.txt" then return "bytes\0" end
      end)
      :on("write_file", function(_, _, _, path, bytes)
        written[#written + 1] = path .. "=" .. bytes
        return true
      end)
      :expect("mkdir", 1):on("mkdir", function(_, _, _, path)
        assert.equal("/app/build", path)
        return true
      end)
    local session = native_session(dp)
    assert.equal("bytes\0", session:read_file("/app/a.txt"))
    local missing, err = session:read_file("/app/none")
    assert.is_nil(missing)
    assert.equal("pathNotFound", err.failure)
    assert.is_true(session:write_files{ ["/b"] = "2", ["/a"] = "1" })
    assert.same({ "/a=1", "/b=2" }, written)
    assert.is_true(session:mkdir("/app/build"))
    dp:verify()
  end)
end)
