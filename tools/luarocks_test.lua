--- What `luarocks test` runs: the build and the busted suite, as `make check` runs them after its
-- bootstrap, for the Lua that LuaRocks started this script with (its configured interpreter:
-- lua5.4 for `--lua-version=5.4`, LuaJIT for a 5.1 tree whose lua_interpreter is luajit, as
-- an OpenResty install has). A make command in the rockspec could not tell the two apart.
-- Arguments reach make: `luarocks test -- BUSTED_ARGS=spec/cli_spec.lua`.

-- Named on make's command line, not left to its defaults: a LUA_PC or LUA in the environment
-- (a make that runs this one exports its own) would otherwise choose the other interpreter.
local argv = { "make", "all", "test" }
if rawget(_G, "jit") then
  argv[#argv + 1] = "LUA_PC=luajit"
  argv[#argv + 1] = "LUA=luajit"
elseif _VERSION == "Lua 5.4" then
  argv[#argv + 1] = "LUA_PC=lua5.4"
  argv[#argv + 1] = "LUA=lua5.4"
else
  io.stderr:write("sandkit is built and tested for Lua 5.4 and LuaJIT 2.1, not " .. _VERSION .. "\n")
  os.exit(1)
end
for _, a in ipairs(arg) do argv[#argv + 1] = a end

local quoted = {}
for i, a in ipairs(argv) do quoted[i] = "'" .. a:gsub("'", "'\\''") .. "'" end
local ok = os.execute(table.concat(quoted, " "))
-- Lua 5.4 returns true or nil; LuaJIT (without 5.2 compatibility) the status, 0 for success.
os.exit((ok == true or ok == 0) and 0 or 1)
