-- sandkit's objects inside a cqueues controller (Debian's lua-cqueues, for real).

local cqueues = require "cqueues"
local sandkit = require "sandkit"
local local_state = require "support.local_state"

describe("under cqueues", function()
  local root, sandbox, session
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
    session = assert(sandbox:create{ id = "cq" })
  end)
  after_each(function() local_state.clean(root) end)

  it("streams in controller coroutines at the same time, waiting through cqueues.poll", function()
    local n, results = 6, {}
    local cq = cqueues.new()
    for i = 1, n do
      cq:wrap(function()
        local next_i = i % n + 1
        local out = {}
        for frame in session:run({ "sh", "-c", string.format(
            "touch s-%d; while [ ! -e s-%d ]; do sleep 0.01; done; echo ok %d", i, next_i, i) },
            { timeout = 20 }) do
          out[#out + 1] = frame.data or ("exit " .. frame.code)
        end
        results[i] = table.concat(out)
      end)
    end
    assert(cq:loop())
    for i = 1, n do assert.equal("ok " .. i .. "\nexit 0", results[i]) end
  end)

  it("lets the controller's other coroutines run while a sandkit wait is pending", function()
    local cq = cqueues.new()
    local ticks, done = 0, false
    cq:wrap(function()
      -- The command waits for a file only the ticker below writes.
      local result = assert(session:exec({ "sh", "-c", "while [ ! -e /ticked ]; do sleep 0.01; done; echo seen" },
        { timeout = 20 }))
      done = result.stdout
    end)
    cq:wrap(function()
      while not done do
        ticks = ticks + 1
        if ticks == 3 then assert(session:write_files{ ["/ticked"] = "" }) end
        cqueues.sleep(0.02)
      end
    end)
    assert(cq:loop())
    assert.equal("seen\n", done)
    assert.is_true(ticks >= 3)
  end)
end)
