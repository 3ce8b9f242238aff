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

describe("loading sandkit", function()
  local files = require "support.files"
  local local_state = require "support.local_state"

  it("leaves the modules a command needs only when it runs unloaded until then", function()
    -- In a process of its own: this one may have loaded any of them for another case.
    local out, status = local_state.run_lua([[
      require "sandkit.cli"
      local sandbox = assert(require("sandkit").sandbox{ provider = "local", root = ]]
        .. string.format("%q", files.temp_dir()) .. [[ })
      for _, name in ipairs{ "sandkit.session_fs", "sandkit.protocol_fs", "sandkit.session_jobs",
        "sandkit.protocol_jobs", "sandkit.lines", "sandkit.cli_files", "sandkit.cli_jobs",
        "sandkit.providers.local.images", "sandkit.providers.local.mmdebstrap",
        "sandkit.providers.local.launch", "sandkit.providers.local.limits", "sandkit.readiness" } do
        if package.loaded[name] then print("loaded: " .. name) end
      end
      assert(sandbox:capabilities().limits, "capabilities() lists the limits")
      print(package.loaded["sandkit.providers.local.limits"] and "limits asked" or "limits not asked")
    ]])
    assert.equal(0, status, out)
    assert.equal("limits asked\n", out)
  end)

  it("finds every method of a session and a job before the module that gives it was loaded", function()
    local out, status = local_state.run_lua([[
      local sb = assert(require("sandkit").sandbox{ provider = "agent", url = "http://127.0.0.1:9", token = "x" })
      -- What each module installs, read by installing it into tables of its own.
      local session_methods, job_methods = {}, {}
      require("sandkit.session_fs").install(session_methods, {})
      require("sandkit.session_jobs").install(session_methods, job_methods, {})
      --- A session of sandbox.lua loaded afresh: none of its methods looked up yet, since the
      -- first that loads a module installs all of that module's.
      local function fresh_session()
        for _, name in ipairs{ "sandkit.sandbox", "sandkit.session_fs", "sandkit.session_jobs" } do
          package.loaded[name] = nil
        end
        return setmetatable({ id = "s", sandbox = sb, record = { id = "s" } },
          require("sandkit.sandbox").session_metatable)
      end
      for name in pairs(session_methods) do
        if type(fresh_session()[name]) ~= "function" then print("session lacks " .. name) end
      end
      for name in pairs(job_methods) do
        local job = assert(fresh_session():job("j"))
        if type(job[name]) ~= "function" then print("job lacks " .. name) end
      end
      print(next(session_methods) and next(job_methods) and "checked" or "nothing installed")
    ]])
    assert.equal(0, status, out)
    assert.equal("checked\n", out)
  end)
end)
