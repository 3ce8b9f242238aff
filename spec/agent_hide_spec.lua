-- sandkit-agent --hide (src/agent/isolate.h): under --isolate bwrap a hidden directory is empty
-- to commands, the root excepted, so a state folder beside the root (the agent's own token, other
-- sessions) is out of their reach. The real agent and the real bubblewrap.

local agent_process = require "support.agent_process"
local files = require "support.files"

local start_agent, check_stream = agent_process.start_agent, agent_process.check_stream

local function bwrap_works()
  return files.execute("/usr/bin/bwrap --ro-bind / / --unshare-pid --unshare-net /bin/true 2>/dev/null")
end

describe("sandkit-agent --hide", function()
  it("shows a command the hidden directory empty but for the root, which stays writable", function()
    if not bwrap_works() then
      pending("bubblewrap cannot create namespaces on this machine")
      return
    end
    -- busted keeps one finally per test: this one stops every agent the test started.
    local started = {}
    local name = "sandkit-hide-spec-" .. tostring(math.random(1e9))
    finally(function()
      for _, agent in ipairs(started) do agent:stop() end
      os.remove("/var/tmp/" .. name)
    end)
    local A = assert(start_agent{ args = { "--isolate", "bwrap", "--hide", "/var/tmp" } })
    started[#started + 1] = A
    files.write("/var/tmp/" .. name, "host")
    local _, frames = A:exec({ command = { "sh", "-c", "ls -A /var/tmp; cat /var/tmp/" .. name
      .. "; echo made > made.txt && cat made.txt" }, timeoutMs = 10000 })
    local last, out, err = check_stream(frames)
    assert.are.equal(0, last.code, err)
    assert.are.equal("made\n", out)
    assert.are.equal("made\n", files.read(A.root .. "/made.txt"))
    -- Another agent's directory, with its token file beside its root.
    local B = assert(start_agent{ args = { "--isolate", "bwrap" } })
    started[#started + 1] = B
    local hidden = assert(start_agent{ args = { "--isolate", "bwrap", "--hide", B.dir } })
    started[#started + 1] = hidden
    _, frames = hidden:exec({ command = { "sh", "-c", "cat " .. B.token_file .. " || echo hidden; ls -A "
      .. B.dir }, timeoutMs = 10000 })
    last, out = check_stream(frames)
    assert.are.equal(0, last.code)
    assert.are.equal("hidden\n", out)
  end)

  it("refuses what it cannot honour: no bubblewrap, /, part of the root, not a directory", function()
    for _, case in ipairs{
      { args = { "--hide", "/var/tmp" }, says = "--hide needs --isolate bwrap" },
      { args = { "--isolate", "bwrap", "--hide", "/" }, says = "other than / and outside the root" },
      { args = { "--isolate", "bwrap", "--hide", "/etc/hostname" }, says = "is not a directory" },
    } do
      local A, log = start_agent{ args = case.args }
      if A then A:stop() end
      assert.is_nil(A, case.says)
      assert.truthy(log:find(case.says, 1, true), log)
    end
    local A = assert(start_agent())
    local root = A.root
    assert.are.equal(0, A:stop())
    os.execute("mkdir -p " .. files.shell_quote(root))
    local B, log = start_agent{ args = { "--isolate", "bwrap", "--root", root .. "/..", "--hide", root } }
    if B then B:stop() end
    assert.is_nil(B)
    assert.truthy(log:find("outside the root", 1, true), log)
    os.execute("rm -rf " .. files.shell_quote(root:match("^(.*)/root$")))
  end)
end)
