--- A private state folder for local-provider specs, and a way to run Lua in a second process.
local core = require "sandkit.core"
local files = require "support.files"
local sandkit = require "sandkit"

local local_state = {}

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"

local_state.new = files.temp_dir

--- Terminates every session under root and removes it.
function local_state.clean(root)
  local sb = sandkit.sandbox{ provider = "local", root = root }
  if sb then
    for _, s in ipairs(sb:list() or {}) do sb:terminate(s.id) end
  end
  core.remove_tree(root)
end

local shell_quote = files.shell_quote
local_state.shell_quote = shell_quote

--- The environment a child Lua process needs to find this checkout's sandkit.
function local_state.lua_env()
  return "LUA_PATH=" .. shell_quote(package.path) .. " LUA_CPATH=" .. shell_quote(package.cpath)
end

--- Runs a Lua chunk in a separate process and returns its stdout and exit status.
function local_state.run_lua(source)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(source)
  f:close()
  local p = assert(io.popen(local_state.lua_env() .. " " .. LUA .. " " .. path .. " 2>&1"))
  local out = p:read("a")
  local _, _, status = p:close()
  os.remove(path)
  return out, status
end

--- Runs a shell command line and returns stdout, stderr and the exit status.
function local_state.sh(cmdline)
  local err_path = os.tmpname()
  local p = assert(io.popen(cmdline .. " 2>" .. err_path))
  local out = p:read("a")
  local _, _, status = p:close()
  local e = io.open(err_path)
  local err = e:read("a")
  e:close()
  os.remove(err_path)
  return out, err, status
end

return local_state
