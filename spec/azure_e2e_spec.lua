-- End to end: the azure provider over a fake data plane whose sandboxes are real sandkit-agent
-- processes that require activation before they serve anything (support/azure_fleet).

local sandkit = require "sandkit"
local core = require "sandkit.core"
local azure_fleet = require "support.azure_fleet"
local fs_roundtrip = require "support.fs_roundtrip"
local interactive_roundtrip = require "support.interactive_roundtrip"

local fleet, sandbox
before_each(function()
  fleet = azure_fleet.new()
  sandbox = assert(sandkit.sandbox{ provider = "azure", group = "group", image = "sandkit-agent",
    agent = true, dataplane = fleet.dataplane, allow_loopback_http = true,
    ready_interval = 0.05, state_interval = 0.05, command_timeout = 10 })
end)
after_each(function() fleet:stop() end)

describe("an azure agent session on a real agent", function()
  it("is created, activated, streams a command's output as it is made, and round-trips a file", function()
    local session = assert(sandbox:create{})
    assert.equal("running", session.state)
    assert.is_true(session:capabilities().jobs)

    local arrivals = {}
    local started = core.now()
    for frame in session:run({ "sh", "-c", "echo one; sleep 0.5; echo two >&2; exit 4" }) do
      arrivals[#arrivals + 1] = { frame = frame, at = core.now() - started }
    end
    assert.same({ type = "stdout", seq = 0, data = "one\n" }, arrivals[1].frame)
    assert.same({ type = "stderr", seq = 1, data = "two\n" }, arrivals[2].frame)
    assert.equal("exit", arrivals[3].frame.type)
    assert.equal(4, arrivals[3].frame.code)
    assert.is_true(arrivals[3].at - arrivals[1].at >= 0.4, "the first line arrived while the command still ran")

    local bytes = "binary\0\1\2 and text"
    assert.is_true(session:write_files{ ["/app/data.bin"] = bytes })
    assert.equal(bytes, session:read_file("/app/data.bin"))
    assert.is_true(session:mkdir("/app/build"))

    -- One route was fetched and activated for the whole session.
    assert.equal(1, fleet.dataplane:count("agent_port_url"))
    assert.equal(1, fleet.dataplane:count("read_file"))

    assert.is_true(session:terminate())
    assert.is_nil(sandbox:get(session.id))
  end)

  it("uses its files as a filesystem through the route: a tree in and out, listed, renamed, removed", function()
    local session = assert(sandbox:create{})
    local src = fs_roundtrip.tree()
    finally(function() core.remove_tree(src) end)
    fs_roundtrip.check(fs_roundtrip.run(session, src, "/tree"), "/tree")
    assert.is_true(session:terminate())
  end)

  it("runs interactive jobs through the route: input taken once, a terminal resized, a signal, live frames", function()
    local session = assert(sandbox:create{})
    interactive_roundtrip.check(interactive_roundtrip.run(session))
    assert.is_true(session:terminate())
  end)

  it("is reached again, through a fresh activated route, after its agent rebooted with a new credential", function()
    local session = assert(sandbox:create{})
    assert.equal("before", session:exec{ "printf", "before" }.stdout)
    fleet:reboot(session.id)

    local result, err = session:exec{ "printf", "after" }
    assert.is_truthy(result, tostring(err))
    assert.equal("after", result.stdout)
    assert.equal(2, fleet.dataplane:count("agent_port_url"))

    local job = assert(session:start_job({ "sh", "-c", "echo from-a-job" }, { timeout = 10 }))
    local frames = {}
    for frame in job:frames{ interval = 0.05 } do frames[#frames + 1] = frame end
    assert.same({ type = "stdout", seq = 0, data = "from-a-job\n" }, frames[1])
    assert.equal(0, frames[#frames].code)
  end)

  it("answers the first command after a reboot in place, replaying once when its credential was refused", function()
    local session = assert(sandbox:create{})
    assert.equal("before", session:exec{ "printf", "before" }.stdout)
    -- Same URL, new credential: the cached one is refused (sandkit-agent's 403), which is
    -- answered before anything runs, so the route is refreshed and the command sent again.
    fleet:reboot(session.id, { same_port = true })
    local result, err = session:exec{ "sh", "-c", "printf after; echo ran >> runs" }
    assert.is_truthy(result, tostring(err))
    assert.equal("after", result.stdout)
    assert.equal("ran\n", session:read_file("/runs"), "the command ran exactly once")
    assert.equal(2, fleet.dataplane:count("agent_port_url"))
  end)
end)
