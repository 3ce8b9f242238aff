-- How sandkit is built and installed: the build folder per Lua, the rockspec and `luarocks test`,
-- `make install`. A source rock installed offline is packaging_rock_spec.lua's (Lua 5.4) and
-- packaging_rock_luajit_spec.lua's (the 5.1 tree), each file on its own so `make check` runs the
-- three long builds at once. Each case names the Lua it builds or runs for, so the interpreter
-- running busted changes nothing here.

local core = require "sandkit.core"
local files = require "support.files"
local local_state = require "support.local_state"
local packaging = require "support.packaging"

local q = files.shell_quote
local CLEAN_ENV, PARALLEL = packaging.CLEAN_ENV, packaging.PARALLEL

local temp_dir = local_state.new

describe("the build", function()
  it("puts the C core in a folder named after the Lua whose headers it is built against", function()
    local dir = temp_dir()
    local out = local_state.sh(CLEAN_ENV .. "make -n all BUILD=" .. q(dir)
      .. " LUA_INCDIR=/usr/include/luajit-2.1")
    local lua54 = local_state.sh(CLEAN_ENV .. "make -n all BUILD=" .. q(dir)
      .. " LUA_INCDIR=/usr/include/lua5.4")
    core.remove_tree(dir)
    assert.truthy(out:find(dir .. "/luajit/sandkit/core.so", 1, true), out)
    assert.falsy(out:find(dir .. "/lua5.4/", 1, true), "a LuaJIT build must not land in the 5.4 folder")
    assert.truthy(lua54:find(dir .. "/lua5.4/sandkit/core.so", 1, true), lua54)
  end)

  it("refuses a Lua whose C API the core cannot use, in one line", function()
    -- Headers of Lua 5.3 (no user values on full userdata), made up: no such package is needed.
    local dir = temp_dir()
    files.write(dir .. "/lua.h", "#define LUA_VERSION_NUM 503\n")
    files.write(dir .. "/lauxlib.h", "")
    local _, err, status = local_state.sh(CLEAN_ENV .. "make " .. q(dir .. "/build/lua5.3/obj/sandkit_core.o")
      .. " BUILD=" .. q(dir .. "/build") .. " LUA_INCDIR=" .. q(dir))
    core.remove_tree(dir)
    assert.are_not.equal(0, status)
    assert.matches("sandkit builds for Lua 5.4 or LuaJIT 2.1 (the Lua 5.1 ABI) only", err, 1, true)
  end)

  it("builds for the Lua 5.1 ABI from PUC Lua 5.1's headers, and LuaJIT loads that build", function()
    -- What `luarocks --lua-version=5.1` finds on Debian: an OpenResty install is built this way.
    local dir = temp_dir()
    -- src/common/'s objects hold no Lua (they are compiled without Lua's headers) and this
    -- suite's build has them: copied with their times, they leave make the Lua 5.1 bindings to
    -- build, which are what this case is about. Where sources changed since, make compiles the
    -- copies again.
    local agent = os.getenv("SANDKIT_AGENT")
    local built = agent and agent:match("^(.*)/[^/]+$") .. "/common-obj"
    if built and core.listdir(built) then
      assert(files.execute("cp -pr " .. q(built) .. " " .. q(dir .. "/common-obj")))
    end
    local out, err, status = local_state.sh(CLEAN_ENV .. PARALLEL .. "make " .. q(dir .. "/lua5.1/sandkit/core.so")
      .. " BUILD=" .. q(dir) .. " LUA_INCDIR=/usr/include/lua5.1 2>&1")
    assert.equal(0, status, out .. err)
    local loaded
    loaded, err, status = local_state.sh("luajit -e " .. q("package.cpath = " .. string.format("%q", dir
      .. "/lua5.1/?.so") .. "; local core = require 'sandkit.core'; io.write(core._ABI, ' ', core.b64encode('hi'))"))
    core.remove_tree(dir)
    assert.equal(0, status, err)
    assert.equal("1 aGk=", loaded)
  end)

  it("refuses PUC Lua 5.1 at require, in one sentence", function()
    local _, err, status = local_state.sh("lua5.1 -e "
      .. q("package.path = 'lua/?.lua;lua/?/init.lua;' .. package.path; require 'sandkit'"))
    assert.are_not.equal(0, status)
    assert.matches("sandkit needs Lua 5.4 or LuaJIT 2.1, not PUC Lua 5.1", err, 1, true)
  end)

  it("treats warnings as errors in make and CI, but not in a LuaRocks build", function()
    local make = local_state.sh(CLEAN_ENV .. "make -n all BUILD=/nonexistent")
    assert.matches(" %-Werror ", make)
    local rockspec = assert(files.read("sandkit-scm-1.rockspec"))
    assert.matches('WERROR = ""', rockspec, 1, true)
  end)
end)

describe("the rockspec", function()
  local function load_rockspec()
    local env = {}
    assert(loadfile("sandkit-scm-1.rockspec", "t", env))()
    return env
  end

  it("declares lua-cjson, and Lua from the 5.1 ABI (LuaJIT's) to 5.4", function()
    local spec = load_rockspec()
    local deps = table.concat(spec.dependencies, "; ")
    assert.equal("lua >= 5.1, < 5.5; lua-cjson", deps)
  end)

  it("runs the suite from `luarocks test`", function()
    local out, err, status = local_state.sh(CLEAN_ENV .. "luarocks --lua-version=5.4 test "
      .. "-- BUSTED_ARGS=spec/sandkit_spec.lua 2>&1")
    assert.equal(0, status, out .. err)
    assert.matches("%d+ success", out)
    assert.matches("busted --lua=lua5.4 ", out, 1, true)
  end)

  it("runs the suite under LuaJIT from `luarocks test` in a 5.1 tree whose interpreter is LuaJIT", function()
    local home = temp_dir()
    assert(core.mkdir(home .. "/.luarocks", 448))
    local as_user = CLEAN_ENV .. "HOME=" .. q(home) .. " "
    local out, err, status = local_state.sh(as_user .. "luarocks --lua-version=5.1 config --scope=user "
      .. "lua_interpreter luajit && " .. as_user .. "luarocks --lua-version=5.1 test "
      .. "-- BUSTED_ARGS=spec/sandkit_spec.lua 2>&1")
    core.remove_tree(home)
    assert.equal(0, status, out .. err)
    assert.matches("busted --lua=luajit ", out, 1, true)
    assert.matches("%d+ success", out)
  end)
end)

describe("a `make install PREFIX=…`", function()
  -- Only what a login shell without any Lua configuration has: no LUA_PATH, no LUA_CPATH, no
  -- SANDKIT_AGENT, and no PATH entry for the prefix.
  local SCRUBBED = "env -i PATH=/usr/bin:/bin "
  local prefix

  --- Installs this checkout's build for the Lua of pkg-config name lua_pc into a fresh prefix.
  local function install(lua_pc)
    prefix = temp_dir()
    local out, err, status = local_state.sh(CLEAN_ENV .. "make install LUA_PC=" .. lua_pc .. " PREFIX="
      .. q(prefix) .. " 2>&1")
    assert.equal(0, status, out .. err)
  end

  after_each(function()
    local_state.clean(prefix .. "/state")
    core.remove_tree(prefix)
  end)

  for _, case in ipairs{ { lua_pc = "lua5.4", abi = "5.4" }, { lua_pc = "luajit", abi = "5.1" } } do
    it("gives a " .. case.lua_pc .. " `sandkit` that runs from a scrubbed environment, its modules and agent "
        .. "found where they were installed", function()
      install(case.lua_pc)
      local out, err, status = local_state.sh(SCRUBBED .. q(prefix .. "/bin/sandkit") .. " --root "
        .. q(prefix .. "/state") .. " run -- sh -c 'echo from-the-prefix; exit 3'")
      assert.equal(3, status, err)
      assert.equal("from-the-prefix\n", out)
      assert.truthy(files.read(prefix .. "/lib/lua/" .. case.abi .. "/sandkit/core.so"))
      assert.truthy(files.read(prefix .. "/lib/lua/" .. case.abi .. "/sandkit/tar.so"))
    end)
  end

  it("takes its own modules before those LUA_PATH and LUA_CPATH name", function()
    install("lua5.4")
    -- A different sandkit first on both paths: a command module that would say so, and a C
    -- module that is no shared object (the defaults stay after them: lua-cjson is there).
    local other = prefix .. "/other"
    assert(core.mkdir(other, 448))
    assert(core.mkdir(other .. "/sandkit", 448))
    files.write(other .. "/sandkit/cli.lua", "io.write('the other sandkit') os.exit(9)")
    files.write(other .. "/sandkit/core.so", "not a shared object")
    local paths = "LUA_PATH=" .. q(other .. "/?.lua;;") .. " LUA_CPATH=" .. q(other .. "/?.so;;") .. " "
    local out, err, status = local_state.sh(SCRUBBED .. paths .. q(prefix .. "/bin/sandkit") .. " --root "
      .. q(prefix .. "/state") .. " run -- echo installed")
    assert.equal(0, status, out .. err)
    assert.equal("installed\n", out)
  end)

  it("names a missing Lua file with require's search list and the variable that adds a folder", function()
    install("lua5.4")
    assert(os.remove(prefix .. "/share/lua/5.4/sandkit/cli.lua"))
    local out, err, status = local_state.sh(SCRUBBED .. q(prefix .. "/bin/sandkit") .. " ls")
    assert.equal(125, status)
    assert.equal("", out)
    assert.matches("^sandkit: module 'sandkit.cli' not found:\n", err)
    assert.truthy(err:find("\n\tno file '" .. prefix .. "/share/lua/5.4/sandkit/cli.lua'\n", 1, true), err)
    assert.truthy(err:find("\nsandkit: sandkit's Lua files (sandkit/*.lua) are not in any of those places: "
      .. "set LUA_PATH to name their folder, as in '/usr/local/share/lua/5.4/?.lua;;'\n", 1, true), err)
  end)

  it("names a missing C module with require's search list and the variable Lua 5.4 reads", function()
    install("lua5.4")
    assert(os.remove(prefix .. "/lib/lua/5.4/sandkit/core.so"))
    local _, err, status = local_state.sh(SCRUBBED .. "LUA_CPATH_5_4=';;' " .. q(prefix .. "/bin/sandkit") .. " ls")
    assert.equal(125, status)
    assert.truthy(err:find("module 'sandkit.core' not found:\n", 1, true), err)
    assert.truthy(err:find("\n\tno file '" .. prefix .. "/lib/lua/5.4/sandkit/core.so'\n", 1, true), err)
    assert.truthy(err:find("\nsandkit: sandkit's C module (sandkit/core.so) is not in any of those places: "
      .. "set LUA_CPATH_5_4 to name its folder", 1, true), err)
  end)
end)

