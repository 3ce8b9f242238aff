-- The entry module: choosing a provider.

local sandkit = require "sandkit"

describe("sandkit.sandbox", function()
  it("refuses a provider this installation lacks in one sentence, and an unknown one as bad input", function()
    -- An installation without the kubernetes provider's files: the module is nowhere on the path.
    local path, loaded = package.path, package.loaded["sandkit.providers.kubernetes"]
    package.path, package.loaded["sandkit.providers.kubernetes"] = "", nil
    local sb, err = sandkit.sandbox{ provider = "kubernetes" }
    package.path, package.loaded["sandkit.providers.kubernetes"] = path, loaded
    assert.is_nil(sb)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("not part of this sandkit installation", err.message, 1, true)
    assert.is_nil(err.message:find("\n", 1, true))
    sb, err = sandkit.sandbox{ provider = "nope" }
    assert.is_nil(sb)
    assert.equal("INVALID_INPUT", err.code)
  end)

  it("loads each provider from its folder, and the modules the docs name by every name they gave", function()
    for _, name in ipairs(sandkit.PROVIDERS) do
      assert.is_table(require("sandkit.providers." .. name).OPTIONS, name)
    end
    assert.equal(require "sandkit.providers.aws.sigv4", require "sandkit.aws.sigv4")
    assert.equal(require "sandkit.providers.azure.dataplane", require "sandkit.azure.dataplane")
    local azure = require "sandkit.providers.azure"
    assert.equal(8971, azure.AGENT_PORT)
    assert.equal("/run/sandkit/agent-token", azure.TOKEN_PATH)
    assert.equal("alienAgentTransport", azure.TRANSPORT_LABEL)
    assert.equal("native-file-v1", azure.TRANSPORT_VERSION)
    assert.same({ defaultAction = "Deny" }, azure.egress_policy{ mode = "deny" })
  end)
end)
