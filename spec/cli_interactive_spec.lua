-- The `sandkit` command's interactive side, run as a separate process against a private state
-- folder: run -i and -t, shell, job ls and job attach, and the word run says about input it
-- leaves unread. A terminal is played by spec/support/pty_driver.py.

local cjson = require "cjson"
local sandkit = require "sandkit"
local files = require "support.files"
local local_state = require "support.local_state"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local q = local_state.shell_quote
local DRIVER = "spec/support/pty_driver.py"

describe("the sandkit command, interactively", function()
  local root
  local function command(args)
    return local_state.lua_env() .. " " .. LUA .. " bin/sandkit --root " .. q(root) .. " " .. args
  end
  --- Runs `sandkit args`, with `input` (when given) piped to its standard input.
  local function sandkit_cmd(args, input)
    if input then return local_state.sh("printf %s " .. q(input) .. " | " .. command(args)) end
    return local_state.sh(command(args))
  end
  --- Plays `steps` on a terminal whose program is `sandkit args`: the driver's report.
  local function on_terminal(args, steps)
    local script = root .. "/script.json"
    files.write(script, cjson.encode(steps))
    local out = local_state.sh("python3 " .. DRIVER .. " " .. q(script) .. " -- sh -c "
      .. q("exec env " .. command(args)))
    return cjson.decode(out)
  end

  before_each(function() root = local_state.new() end)
  after_each(function() local_state.clean(root) end)

  it("run -i forwards standard input, to its end", function()
    local out, err, status = sandkit_cmd("run -i -- sh -c 'cat; echo done' < /etc/passwd")
    assert.equal(0, status, err)
    assert.equal(files.read("/etc/passwd") .. "done\n", out)
    out, err, status = sandkit_cmd("run -i -- wc -c < /dev/null")
    assert.equal(0, status, err)
    assert.equal("0", out:match("%d+"))
  end)

  it("run without -i says once that it leaves piped input unread, and nothing for /dev/null", function()
    local out, err, status = sandkit_cmd("run -- cat", "hello\n")
    assert.equal(0, status)
    assert.equal("", out)
    local _, count = err:gsub("standard input is not forwarded", "")
    assert.equal(1, count, err)
    assert.truthy(err:find("run -i", 1, true), err)
    _, err = sandkit_cmd("run -- true < /dev/null")
    assert.equal("", err)
  end)

  it("run -t runs on a terminal: it echoes, follows a resize, takes Ctrl-C, and exits with the status",
    function()
      local report = on_terminal("run -t -- sh", {
        { expect = "$ ", within = 30 },
        { settings = "raw" },
        { send = "echo $((6*7))\r" }, { expect = "\r\n42\r\n" },
        { size = { 120, 40 } }, { send = "stty size\r" }, { expect = "40 120" },
        -- ^C only once the command runs: typed earlier, it would reach the shell instead. The
        -- process that says "started" becomes sleep (exec): had it forked sleep after saying it,
        -- a ^C in between could land in the fork's child before its exec (dash's vfork child
        -- takes it in its own handler), and sleep would run its 30 s.
        { send = "sh -c 'echo started; exec sleep 30'\r" }, { expect = "started\r\n" }, { send = "\3" },
        { send = "echo after $?\r" }, { expect = "after 130" },
        { send = "exit 5\r" },
      })
      assert.is_true(report.ok, "step " .. tostring(report.failed) .. ": " .. report.output)
      assert.equal(5, report.status, report.output)
      assert.are_not.same(report.settings.initial, report.settings.raw, "raw while it ran")
      assert.same(report.settings.initial, report.settings.final, "the terminal is given back as it was")
    end)

  it("run -t gives the terminal back when it is stopped by a signal", function()
    local report = on_terminal("run -t -- sh", {
      { expect = "$ ", within = 30 }, { settings = "raw" }, { signal = "TERM" },
    })
    assert.equal(143, report.status, report.output)
    assert.are_not.same(report.settings.initial, report.settings.raw)
    assert.same(report.settings.initial, report.settings.final)
  end)

  it("shell NAME opens a shell in the session, as the sandbox user", function()
    local _, err, status = sandkit_cmd("create box")
    assert.equal(0, status, err)
    local report = on_terminal("shell box", {
      { expect = "$ ", within = 30 },
      { send = "id -u; echo marker-$((1+1))\r" }, { expect = "marker-2" },
      { send = "exit\r" },
    })
    assert.is_true(report.ok, "step " .. tostring(report.failed) .. ": " .. report.output)
    assert.equal(0, report.status)
    local confined = sandkit.sandbox{ provider = "local", root = root }:capabilities().isolation == "bwrap"
    if confined then assert.truthy(report.output:find("1000", 1, true), report.output) end
  end)

  it("job ls lists a session's jobs, and job attach follows one and sends it input", function()
    assert.equal(0, select(3, sandkit_cmd("create box")))
    local session = assert(assert(sandkit.sandbox{ provider = "local", root = root }):get("box"))
    local p = assert(session:spawn({ "sh", "-c", "read line; echo \"got $line\"; exit 4" },
      { timeout = 60, stdin = true, id = "reader" }))
    local out, err, status = sandkit_cmd("job ls box")
    assert.equal(0, status, err)
    assert.truthy(out:find("reader%s+running%s+%S+%s+stdin%s+sh %-c"), out)
    out, err, status = sandkit_cmd("job attach box reader", "hello\n")
    assert.equal(4, status, err)
    assert.equal("got hello\n", out)
    out = sandkit_cmd("job ls box --json")
    local listed = cjson.decode(out).jobs
    assert.equal(1, #listed)
    assert.equal("reader", listed[1].id)
    assert.is_false(listed[1].running)
    assert.equal(4, listed[1].code)
    assert.is_true(listed[1].stdin)
    assert.same({ "sh", "-c", "read line; echo \"got $line\"; exit 4" }, listed[1].argv)
    assert.equal(4, p:wait())
  end)

  it("--help names -i, -t, shell, job ls and job attach", function()
    local out = sandkit_cmd("--help")
    for _, says in ipairs{ "run [-i | -t]", "shell NAME", "job ls NAME", "job attach NAME JOB" } do
      assert.truthy(out:find(says, 1, true), says)
    end
  end)
end)
