-- Which Debian packages each make target installs (tools/bootstrap.sh): `make demo` what a
-- local quickstart needs and nothing the suite alone needs, `make check` the rest.

local local_state = require "support.local_state"

--- The environment of a make started from inside `make test`: the outer make's flags would
-- otherwise leak into the inner one.
local CLEAN_ENV = "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u BUSTED_ARGS "

--- The packages of a set, as the bootstrap lists them: a set of names, and their count.
local function listed(set)
  local out, err, status = local_state.sh("sh tools/bootstrap.sh --list " .. set)
  assert.equal(0, status, err)
  local names, n = {}, 0
  for name in out:gmatch("[^\n]+") do
    assert.matches("^[a-z0-9][a-z0-9.+-]*$", name)
    names[name], n = true, n + 1
  end
  return names, n
end

--- The bootstrap lines `make -n target` would run.
local function bootstrap_runs(target)
  local out, err, status = local_state.sh(CLEAN_ENV .. "make -n " .. target)
  assert.equal(0, status, err)
  local runs = {}
  for line in out:gmatch("[^\n]+") do
    if line:find("tools/bootstrap.sh", 1, true) then runs[#runs + 1] = line end
  end
  return runs
end

describe("the bootstrap", function()
  it("is asked by make demo for the demo's set alone, and by make check and make bench for theirs", function()
    assert.same({ "sh tools/bootstrap.sh demo" }, bootstrap_runs("demo"))
    assert.same({ "sh tools/bootstrap.sh check" }, bootstrap_runs("check"))
    assert.same({ "sh tools/bootstrap.sh bench" }, bootstrap_runs("bench"))
  end)

  it("lists for the demo the build, lua-cjson and what a confined local session runs with", function()
    local demo = listed("demo")
    for _, name in ipairs{ "make", "gcc", "pkg-config", "lua5.4", "liblua5.4-dev", "lua-cjson",
        "libcurl4-openssl-dev", "libssl-dev", "libevent-dev", "bubblewrap", "passt", "slirp4netns",
        "iproute2" } do
      assert.is_true(demo[name], name .. " is in the demo's set")
    end
  end)

  it("leaves out of the demo's set what only the suite, nginx and the Kubernetes referees need", function()
    local demo = listed("demo")
    for _, name in ipairs{ "chromium", "nginx", "libnginx-mod-http-lua", "lua-resty-core", "python3-kubernetes",
        "python3-cryptography", "lua-busted", "lua-check", "luajit2", "lua5.1", "zip" } do
      assert.is_nil(demo[name], name .. " is not the demo's")
    end
  end)

  it("lists for make check everything the demo's set has, and the suite's own packages", function()
    local demo, check = listed("demo"), listed("check")
    for name in pairs(demo) do assert.is_true(check[name], name .. " is in the check set too") end
    for _, name in ipairs{ "chromium", "nginx", "libnginx-mod-http-lua", "python3-kubernetes", "lua-busted",
        "lua-check", "luajit2", "libluajit2-5.1-dev" } do
      assert.is_true(check[name], name .. " is in the check set")
    end
    local bench = listed("bench")
    for name in pairs(check) do assert.is_true(bench[name], name .. " is in the bench set too") end
    assert.is_true(bench.valgrind)
  end)

  it("takes check when no set is named, and refuses a set it does not know", function()
    local plain = local_state.sh("sh tools/bootstrap.sh --list")
    local check = local_state.sh("sh tools/bootstrap.sh --list check")
    assert.equal(check, plain)
    local out, err, status = local_state.sh("sh tools/bootstrap.sh --list everything")
    assert.equal(2, status)
    assert.equal("", out)
    assert.equal("sandkit: bootstrap takes [--list] demo, check or bench, not: everything\n", err)
  end)
end)
