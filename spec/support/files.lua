--- Small file and shell helpers the specs share.
local files = {}

--- The whole file, or nil when it cannot be opened.
function files.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function files.write(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

--- Runs a shell command; true when it exited 0. os.execute answers true under Lua 5.4 and 0
-- under LuaJIT (5.1's exit status), which this hides.
function files.execute(command)
  local r = os.execute(command)
  return r == true or r == 0
end

--- A word the shell passes on unchanged, whatever it holds.
function files.shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

return files
