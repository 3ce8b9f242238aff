-- sandkit.run and sandkit.spawn: many commands at once from one Lua state.

local sandkit = require "sandkit"
local local_state = require "support.local_state"

--- argv for command i of n: it marks itself started, then waits for command i+1 (mod n) to have
-- started. Run one after another, the first would wait for ever; only commands that run at
-- the same time all finish.
local function ring_command(i, n)
  local next_i = i % n + 1
  return { "sh", "-c", string.format(
    "touch started-%d; while [ ! -e started-%d ]; do sleep 0.01; done; echo done %d", i, next_i, i) }
end

describe("the runner", function()
  local root, sandbox, session
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
    session = assert(sandbox:create{ id = "runner" })
  end)
  after_each(function() local_state.clean(root) end)

  it("runs streams from many tasks at the same time and joins their results", function()
    local n = 12
    local results = { sandkit.run(function()
      local handles = {}
      for i = 1, n do
        handles[i] = sandkit.spawn(function()
          local out = {}
          for frame in session:run(ring_command(i, n), { timeout = 20 }) do
            if frame.type == "stdout" then out[#out + 1] = frame.data end
            if frame.type == "exit" then out[#out + 1] = "exit " .. frame.code end
          end
          return table.concat(out, "|")
        end)
      end
      local all = {}
      for i = 1, n do all[i] = assert(handles[i]:join()) end
      return all
    end) }
    assert.is_true(results[1], tostring(results[2]))
    local all = results[2]
    for i = 1, n do assert.equal("done " .. i .. "\n|exit 0", all[i]) end
  end)

  it("yields during job polls and readiness waits, so other tasks go on", function()
    local _, out = sandkit.run(function()
      local job = assert(session:start_job({ "sh", "-c", "while [ ! -e /go ]; do sleep 0.01; done; echo released" },
        { timeout = 20 }))
      local follower = sandkit.spawn(function()
        local seen = {}
        for frame in job:frames{ interval = 0.05 } do seen[#seen + 1] = frame.data or ("exit " .. frame.code) end
        return table.concat(seen)
      end)
      local creator = sandkit.spawn(function()
        -- A second session: its agent's readiness wait must not stall the follower.
        local other = assert(sandbox:create{ id = "second" })
        return other.state
      end)
      assert.equal("running", creator:join())
      assert(session:write_files{ ["/go"] = "" })
      return follower:join()
    end)
    assert.equal("released\nexit 0", out)
  end)

  it("returns a task's failure from join instead of raising it", function()
    local ok, value, err = sandkit.run(function()
      local failing = sandkit.spawn(function() error("task broke", 0) end)
      local ok = sandkit.spawn(function() return "fine", 2 end)
      local a, aerr = failing:join()
      local b, c = ok:join()
      return { a = a, aerr = aerr, b = b, c = c }
    end)
    assert.is_true(ok)
    assert.is_nil(err)
    assert.same({ aerr = "task broke", b = "fine", c = 2 }, value)
  end)

  it("reports a failure nobody joined once every task has ended", function()
    local finished = false
    local value, err = sandkit.run(function()
      sandkit.spawn(function() error("nobody listened", 0) end)
      sandkit.spawn(function() finished = true end)
      return "main is fine"
    end)
    assert.is_nil(value)
    assert.equal("nobody listened", err)
    assert.is_true(finished, "the other tasks still ran to their end")
  end)

  it("returns main's own failure, a sandkit error included", function()
    local value, err = sandkit.run(function()
      local result, e = session:exec({ "true" }, { timeout = 0 })
      if not result then error(e, 0) end
    end)
    assert.is_nil(value)
    assert.is_true(sandkit.errors.is_error(err))
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("timeout", err.field)
  end)

  it("returns true first, so assert(sandkit.run(main)) holds when main returns nothing", function()
    assert.same({ true }, { assert(sandkit.run(function() end)) })
    assert.same({ true, false, nil, "x" }, { sandkit.run(function() return false, nil, "x" end) })
  end)

  it("refuses spawn outside a runner and a runner inside a runner", function()
    assert.has_error(function() sandkit.spawn(function() end) end)
    local _, err = sandkit.run(function() sandkit.run(function() end) end)
    assert.matches("already running", err)
  end)

  it("keeps blocking use outside any runner unchanged", function()
    local result = assert(session:exec({ "echo", "plain" }, { timeout = 10 }))
    assert.equal("plain\n", result.stdout)
  end)
end)
