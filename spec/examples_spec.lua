-- The examples run as a user would run them, and use only the public API.

local files = require "support.files"
local local_state = require "support.local_state"

describe("the examples", function()
  it("never reach into sandkit.core", function()
    for _, name in ipairs{ "agent_provider.lua", "fanout.lua", "quickstart.lua", "kubernetes.lua",
        "openresty/gateway.lua" } do
      local source = assert(files.read("examples/" .. name))
      assert.is_nil(source:find("sandkit.core", 1, true), name)
    end
  end)

  it("start an agent with the sandkit-agent command and reach it with the agent provider", function()
    local out, status = local_state.run_lua(assert(files.read("examples/agent_provider.lua")))
    assert.equal(0, status, out)
    assert.matches("^agent boot [%x%-]+\nhello from the agent\nexit 7\nnil\tOPERATION_NOT_SUPPORTED\n$", out)
  end)
end)
