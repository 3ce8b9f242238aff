-- luacheck configuration: Lua 5.4 (with guarded fallbacks where LuaJIT differs), busted's
-- globals in specs; methods may leave `self` unused.
std = "lua54"
self = false
max_line_length = 120
include_files = { "lua/**/*.lua", "spec/**/*.lua", "bin/sandkit", "examples/**/*.lua", "bench/**/*.lua",
  "tools/**/*.lua" }
files["spec"] = { std = "+busted" }
-- Scenario files of the fake server run in their own process with cqueues loaded.
files["spec/support/fake_http_server.lua"] = { globals = { "arg" } }
files["bin/sandkit"] = { globals = { "arg" } }
files["examples"] = { globals = { "arg" } }
files["bench"] = { globals = { "arg" } }
files["tools"] = { globals = { "arg" } }
-- nginx's Lua module provides `ngx` as a global to code running inside a worker: the cosocket
-- transport, the nginx mappings of the runner, sandkit.ngx, and what runs in the specs' nginx.
files["lua/sandkit/cosocket.lua"] = { read_globals = { "ngx" } }
files["lua/sandkit/runner.lua"] = { read_globals = { "ngx" } }
files["lua/sandkit/ngx.lua"] = { globals = { "ngx" } }
files["spec/support/nginx_app.lua"] = { globals = { "ngx" } }
files["examples/openresty/gateway.lua"] = { globals = { "ngx" } }
