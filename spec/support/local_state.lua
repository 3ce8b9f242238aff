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

--- The environment a child Lua process needs to find this checkout's sandkit, and the
-- sanitizer runtime when `make check-asan` preloads it (a child started under `env -i` would
-- otherwise load the instrumented C module without it).
function local_state.lua_env()
  local words = { "LUA_PATH=" .. shell_quote(package.path), "LUA_CPATH=" .. shell_quote(package.cpath) }
  for _, name in ipairs(files.SANITIZER_ENV) do
    local value = os.getenv(name)
    if value then words[#words + 1] = name .. "=" .. shell_quote(value) end
  end
  return table.concat(words, " ")
end

--- The gigabyte writer of the backpressure specs: writes up to 1 GiB in blocks of `block`
-- bytes, recording after each block how many it wrote in the file `/written` of its session
-- (through a rename, so a reader never sees a half-written count).
function local_state.writer(block)
  return { LUA, "-e", string.format([[
    local block = string.rep("x", %d)
    for i = 1, %d do
      io.stdout:write(block)
      io.stdout:flush()
      local f = io.open("/written.tmp", "w") f:write(i) f:close()
      os.rename("/written.tmp", "/written")
    end]], block, math.floor(1073741824 / block)) }
end

--- Runs a shell command line and returns stdout, stderr and the exit status. The status is
-- written by the shell: a popen's close reports it under Lua 5.4 but not under LuaJIT.
function local_state.sh(cmdline)
  local err_path, status_path = files.temp_name(), files.temp_name()
  local p = assert(io.popen("(" .. cmdline .. ") 2>" .. err_path .. "; echo $? >" .. status_path))
  local out = p:read("*a")
  p:close()
  local err = files.read(err_path)
  local status = tonumber(files.read(status_path))
  os.remove(err_path)
  os.remove(status_path)
  return out, err, status
end

--- Runs a Lua chunk in a separate process and returns its output and exit status.
function local_state.run_lua(source)
  local path = files.temp_name()
  files.write(path, source)
  local out, _, status = local_state.sh(local_state.lua_env() .. " " .. LUA .. " " .. path .. " 2>&1")
  os.remove(path)
  return out, status
end

return local_state
