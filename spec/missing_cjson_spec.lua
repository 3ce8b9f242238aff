-- sandkit without lua-cjson, under the interpreter running busted: require and the command
-- each say in one sentence what to install.

local files = require "support.files"
local local_state = require "support.local_state"

local q = files.shell_quote
local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"

describe("without lua-cjson", function()
  -- A cpath with the build's C core and nothing else: lua-cjson cannot be found.
  local cpath = os.getenv("SANDKIT_TEST_CPATH") or "./build/lua5.4/?.so"
  local lua_env = "LUA_PATH='./lua/?.lua;./lua/?/init.lua' LUA_CPATH=" .. q(cpath) .. " "

  it("require \"sandkit\" fails with one sentence saying what to install", function()
    local _, err, status = local_state.sh(lua_env .. LUA .. " -e "
      .. q("local ok, e = pcall(require, 'sandkit') io.stderr:write(tostring(e)) os.exit(ok and 0 or 1)"))
    assert.equal(1, status)
    assert.equal("sandkit needs lua-cjson, which is not installed: apt-get install lua-cjson, "
      .. "or luarocks install lua-cjson", err)
  end)

  it("the command exits 125 with that sentence and no traceback", function()
    local out, err, status = local_state.sh(lua_env .. LUA .. " bin/sandkit ls")
    assert.equal(125, status)
    assert.equal("", out)
    assert.equal("sandkit: sandkit needs lua-cjson, which is not installed: apt-get install lua-cjson, "
      .. "or luarocks install lua-cjson\n", err)
  end)
end)
