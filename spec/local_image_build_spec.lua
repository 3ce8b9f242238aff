-- An image built with mmdebstrap from Debian's archive (README "Images"). Slow: mmdebstrap
-- fetches and unpacks Debian's essential packages (40 to 110 s here), so it runs in one pass of
-- `make check` only (ONCE_SPECS). It needs a Debian mirror: mmdebstrap cannot build offline,
-- and the spec says so and is pending where none answers.

local sandkit = require "sandkit"
local local_state = require "support.local_state"

--- Where mmdebstrap fetches from unless told otherwise, and how long the look may take.
local MIRROR_RELEASE = "http://deb.debian.org/debian/dists/bookworm/Release"
local LOOK_SECONDS = 5

describe("a local image built with mmdebstrap", function()
  local root, sandbox
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  end)
  after_each(function()
    local_state.clean(root)
  end)

  it("is a Debian system a session runs, from Debian's archive #slow", function()
    local reach = local_state.sh("curl -s -o /dev/null -m " .. LOOK_SECONDS .. " -w '%{http_code}' "
      .. MIRROR_RELEASE)
    if reach ~= "200" then
      return pending("no Debian mirror is reachable from this machine (deb.debian.org answered "
        .. (reach ~= "" and reach or "nothing") .. "): mmdebstrap needs one, it cannot build offline")
    end
    local meta = assert(sandbox:image_build("deb", { suite = "bookworm" }))
    assert.truthy(meta.origin:find("build bookworm", 1, true))
    local session, err = sandbox:create{ image = "deb" }
    if not session and err.field == "isolate" then return pending(err.message) end
    assert(session, err)
    local r = assert(session:exec({ "/bin/sh", "-c", "cat /etc/debian_version; id -un" }, { timeout = 30 }))
    assert.truthy(r.stdout:match("^12%.%d+\nuser\n$"), r.stdout .. r.stderr)
    -- Merged-/usr from the start, as debootstrap makes it: Debian's usr-is-merged, not the
    -- usrmerge conversion and the perl it needs.
    r = assert(session:exec({ "/bin/sh", "-c", "readlink /bin; for p in usr-is-merged usrmerge perl; do "
      .. "echo \"$p $(dpkg-query -W -f '${db:Status-Status}' $p 2>/dev/null)\"; done" }, { timeout = 30 }))
    local status = {}
    for name, said in r.stdout:gmatch("([%w.-]+) ?([%w-]*)\n") do status[name] = said end
    assert.equal("usr/bin", r.stdout:match("^[^\n]*"), r.stdout)
    assert.equal("installed", status["usr-is-merged"], r.stdout)
    assert.not_equal("installed", status.usrmerge, r.stdout)
    assert.not_equal("installed", status.perl, r.stdout)
  end)
end)
