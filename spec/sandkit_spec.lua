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
end)
