-- A source rock of this checkout installed offline into a fresh Lua 5.4 tree, and the command
-- it installs run from there. The Lua is named, so the interpreter running busted changes
-- nothing here; the 5.1 tree's install is packaging_rock_luajit_spec.lua's, a file of its own so
-- `make check` runs the two builds at once.

local files = require "support.files"
local local_state = require "support.local_state"
local packaging = require "support.packaging"

local q = files.shell_quote
local CLEAN_ENV, PARALLEL, ROCK_CFLAGS = packaging.CLEAN_ENV, packaging.PARALLEL, packaging.ROCK_CFLAGS

describe("a source rock", function()
  local dir
  before_each(function() dir = local_state.new() end)
  after_each(function() packaging.remove_folder(dir) end)

  it("is packed by `make rock` and installs offline into a fresh tree, command and agent included", function()
    local rock = packaging.make_rock(dir .. "/build")
    -- No server at all: --deps-mode=none takes the system's lua-cjson, and the rock carries
    -- everything else.
    local tree = dir .. "/tree"
    local log, err, status = local_state.sh("cd " .. q(dir) .. " && " .. CLEAN_ENV .. PARALLEL
      .. "luarocks --lua-version=5.4 install --tree=" .. q(tree) .. " --deps-mode=none "
      .. "--only-server=" .. q(dir .. "/no-server") .. " " .. q(rock) .. " CFLAGS=" .. q(ROCK_CFLAGS) .. " 2>&1")
    assert.equal(0, status, log .. err)
    assert.truthy(log:find("cc " .. ROCK_CFLAGS .. " ", 1, true), "the CFLAGS LuaRocks is given reach the compiler")
    assert.truthy(log:find("-Wall -Wextra", 1, true), "the build's commands are in its log")
    assert.is_nil(log:find("-Werror ", 1, true), "a user's build keeps warnings as warnings")
    assert.truthy(files.read(tree .. "/bin/sandkit-agent"))
    assert.truthy(files.read(tree .. "/bin/sandkit-init"), "the confined session's init is beside the agent")
    -- Only the tree and the system's default paths: nothing of this checkout. The session is
    -- confined, as by default: the installed agent found the installed init.
    local paths = "eval \"$(luarocks --lua-version=5.4 path --tree=" .. q(tree) .. ")\""
    local out
    out, err, status = local_state.sh("cd " .. q(dir) .. " && env -u SANDKIT_AGENT -u LUA_PATH -u LUA_CPATH "
      .. "sh -c " .. q(paths .. " && sandkit --root " .. q(dir .. "/state")
        .. " run -- sh -c 'echo from-the-rock; id -un'"))
    assert.equal(0, status, err)
    assert.equal("from-the-rock\nuser\n", out)
    -- Without `luarocks path`: the command finds the tree it was installed into by itself.
    out, err, status = local_state.sh("cd " .. q(dir) .. " && env -i PATH=/usr/bin:/bin "
      .. q(tree .. "/bin/sandkit") .. " --root " .. q(dir .. "/state") .. " run -- echo scrubbed")
    assert.equal(0, status, err)
    assert.equal("scrubbed\n", out)
  end)
end)
