-- A source rock of this checkout installed offline into a fresh Lua 5.1 tree whose interpreter
-- is LuaJIT, as for OpenResty, and the command it installs run from there (the README's steps).
-- The Lua is named, so the interpreter running busted changes nothing here; the 5.4 tree's
-- install is packaging_rock_spec.lua's, a file of its own so `make check` runs the two builds at
-- once.

local core = require "sandkit.core"
local files = require "support.files"
local local_state = require "support.local_state"
local packaging = require "support.packaging"

local q = files.shell_quote
local CLEAN_ENV, PARALLEL, ROCK_CFLAGS = packaging.CLEAN_ENV, packaging.PARALLEL, packaging.ROCK_CFLAGS

describe("a source rock", function()
  local dir
  before_each(function() dir = local_state.new() end)
  after_each(function() packaging.remove_folder(dir) end)

  it("installs for LuaJIT and OpenResty into the 5.1 tree, its command run by LuaJIT", function()
    local rock = packaging.make_rock(dir .. "/build")
    -- The README's steps: LuaRocks told once that its 5.1 interpreter is LuaJIT, then the rock.
    local home, tree = dir .. "/home", dir .. "/tree51"
    assert(core.mkdir(home, 448))
    assert(core.mkdir(home .. "/.luarocks", 448))
    local as_user = "cd " .. q(dir) .. " && " .. CLEAN_ENV .. "HOME=" .. q(home) .. " "
    local log, err, status = local_state.sh(as_user .. "luarocks --lua-version=5.1 config --scope=user "
      .. "lua_interpreter luajit && " .. CLEAN_ENV .. PARALLEL .. "HOME=" .. q(home)
      .. " luarocks --lua-version=5.1 install --tree=" .. q(tree) .. " --deps-mode=none"
      .. " --only-server=" .. q(dir .. "/no-server") .. " " .. q(rock) .. " CFLAGS=" .. q(ROCK_CFLAGS) .. " 2>&1")
    assert.equal(0, status, log .. err)
    assert.truthy(log:find("cc " .. ROCK_CFLAGS .. " ", 1, true), "the CFLAGS LuaRocks is given reach the compiler")
    assert.truthy(files.read(tree .. "/lib/lua/5.1/sandkit/core.so"), "the C core is in the 5.1 tree")
    assert.truthy(files.read(tree .. "/lib/lua/5.1/sandkit/tar.so"), "the tar module is in the 5.1 tree")
    local paths = "eval \"$(luarocks --lua-version=5.1 path --tree=" .. q(tree) .. ")\""
    local out
    out, err, status = local_state.sh(as_user .. "env -u SANDKIT_AGENT -u LUA_PATH -u LUA_CPATH sh -c "
      .. q(paths .. " && sandkit --root " .. q(dir .. "/state") .. " run -- sh -c 'echo from-luajit; exit 3'"))
    assert.equal(3, status, err)
    assert.equal("from-luajit\n", out)
    out, err, status = local_state.sh("cd " .. q(dir) .. " && env -i PATH=/usr/bin:/bin HOME=" .. q(home) .. " "
      .. q(tree .. "/bin/sandkit") .. " --root " .. q(dir .. "/state") .. " run -- echo scrubbed")
    assert.equal(0, status, err)
    assert.equal("scrubbed\n", out)
    assert.truthy(files.read(tree .. "/bin/sandkit"):find("luajit", 1, true), "the wrapper runs LuaJIT")
  end)
end)
