--- A real nginx for specs: Debian's nginx, started on a port picked here and retried when
-- another process takes it first, in its own temp directory, and always stopped.
--
--   local server = nginx.start{ server = "location /x { content_by_lua_block { … } }",
--                               http = "…", main = "…", workers = 1, ports = { "tls" },
--                               bound_by_modes = false }
--   server.port, server.url, server.dir, server.ports.tls, server:worker_pid(),
--   server:error_log(), server:stop()
-- `ports` names further ports to pick, written as ${name} in `http` (say, a second server
-- block's listen); `${dir}` there is the server's directory, which `prepare(dir)` may fill
-- first (certificates, say).
--
-- With `server` (and `http`) alone it runs the Lua module (Debian's libnginx-mod-http-lua,
-- loaded after the NDK module it needs), with this checkout's lua/ and spec/ on
-- lua_package_path and the LuaJIT build of the C module on lua_package_cpath
-- ($SANDKIT_NGINX_CPATH, which `make test` sets), and passes SANDKIT_AGENT and PATH on to its
-- workers; with `bound_by_modes` nginx runs under processes.bound_by_modes (a root master and
-- its workers then meet folders' modes as any user does). nginx.launch is the bare
-- pick-a-port-and-start loop, for a configuration of the
-- caller's own (spec/support/aws_endpoint_proxy.lua, kube_cluster.lua), whose opening
-- nginx.conf_head writes; certificates come from spec/support/tls.lua.
--
-- Anything missing — nginx, the Lua module, the LuaJIT build — fails the spec saying what.

local core = require "sandkit.core"
local files = require "support.files"
local processes = require "support.processes"

local nginx = {}

local NGINX = "/usr/sbin/nginx"
local MODULES = "/usr/lib/nginx/modules"
--- Seconds nginx gets to start listening, and to leave after SIGTERM.
local START_TIMEOUT = 10
local STOP_TIMEOUT = 5
--- Ports tried before giving up: each is free when picked, and only a race loses one.
local ATTEMPTS = 3

local read_file, write_file = files.read, files.write

local server_mt = {}
server_mt.__index = server_mt

--- Paths found executable, each asked once a process: a spec file starts nginx many times.
local found_executable = {}

local function executable(path)
  if not found_executable[path] then found_executable[path] = files.execute("test -x " .. files.shell_quote(path)) end
  return found_executable[path]
end

--- Ends a process of ours: SIGTERM, then SIGKILL when it has not gone within the bound.
function nginx.kill(pid)
  processes.stop(pid, STOP_TIMEOUT)
end

--- A temp directory nginx's workers can use whoever they run as.
function nginx.temp_dir()
  local dir = files.temp_dir(tonumber("755", 8))
  -- Whatever the umask took away.
  if not files.umask_keeps(tonumber("755", 8)) then
    assert(files.execute("chmod 755 " .. files.shell_quote(dir)))
  end
  assert(core.mkdir(dir .. "/temp", tonumber("755", 8)))
  return dir
end

--- The temp paths of an http block, all inside dir.
function nginx.temp_paths(dir)
  local lines = {}
  for _, kind in ipairs{ "client_body", "proxy", "fastcgi", "uwsgi", "scgi" } do
    lines[#lines + 1] = string.format("  %s_temp_path %s/temp/%s;", kind, dir, kind)
  end
  return table.concat(lines, "\n")
end

--- The opening of a configuration of the caller's own, up to and inside `http {`: one worker,
-- its pid, log and temporary files all in dir, so nothing is written outside it.
function nginx.conf_head(dir, connections)
  return table.concat({ "worker_processes 1;", "pid " .. dir .. "/nginx.pid;",
    "error_log " .. dir .. "/error.log info;",
    "events { worker_connections " .. (connections or 64) .. "; }", "http {",
    nginx.temp_paths(dir) }, "\n")
end

--- Starts nginx on a free port: conf(port) is the configuration's text; before(attempt) runs
-- before each try (say, to start a helper the configuration names); prefix, an argv nginx's
-- own is appended to. Returns pid, port; raises with nginx's own words when it never listened.
function nginx.launch(dir, conf, before, prefix)
  if not executable(NGINX) then
    error("the nginx specs need nginx at " .. NGINX .. " (Debian package nginx; "
      .. "tools/bootstrap.sh installs it)", 0)
  end
  for attempt = 1, ATTEMPTS do
    if before then before(attempt) end
    local port = processes.free_port()
    write_file(dir .. "/nginx.conf", conf(port))
    local argv = {}
    for i, word in ipairs(prefix or {}) do argv[i] = word end
    for _, word in ipairs{ NGINX, "-p", dir, "-c", dir .. "/nginx.conf", "-g", "daemon off;" } do
      argv[#argv + 1] = word
    end
    local pid = assert(core.spawn(argv, { stderr = dir .. "/nginx.stderr", stdout = dir .. "/nginx.stderr",
      setsid = true }))
    if processes.listening(port, pid, START_TIMEOUT) then return pid, port end
    core.kill(pid, core.SIGKILL)
    core.reap(pid, true)
  end
  error("nginx did not start:\n" .. (read_file(dir .. "/nginx.stderr") or "")
    .. (read_file(dir .. "/error.log") or ""), 0)
end

local function lua_conf(opts, dir, cpath, ports)
  return function(port)
    for _, name in ipairs(opts.ports or {}) do ports[name] = processes.free_port() end
    local function fill(text)
      return (text:gsub("%${([%w_]+)}", function(name)
        if name == "dir" then return dir end
        return tostring(assert(ports[name], "no port named " .. name))
      end))
    end
    local checkout = os.getenv("PWD") or "."
    local main = {
      "load_module " .. MODULES .. "/ndk_http_module.so;",
      "load_module " .. MODULES .. "/ngx_http_lua_module.so;",
      "worker_processes " .. (opts.workers or 1) .. ";",
      "pid " .. dir .. "/nginx.pid;",
      "error_log " .. dir .. "/error.log " .. (opts.log_level or "warn") .. ";",
      "env SANDKIT_AGENT;",
      "env PATH;",
      opts.main or "",
      "events { worker_connections " .. (opts.connections or 1024) .. "; }",
      "http {",
      "  access_log off;",
      nginx.temp_paths(dir),
      '  lua_package_path "' .. checkout .. "/lua/?.lua;" .. checkout .. "/lua/?/init.lua;"
        .. checkout .. '/spec/?.lua;;";',
      '  lua_package_cpath "' .. cpath .. ';;";',
      -- As examples/openresty/nginx.conf says: reads of a page each would cost a system call
      -- per 4 KiB of a stream, and output sent before each frame's flush a second output
      -- buffer per stream.
      "  lua_socket_buffer_size 128k;",
      "  postpone_output 128k;",
      fill(opts.http or ""),
      "  server {",
      "    listen 127.0.0.1:" .. port .. ";",
      opts.server or "",
      "  }",
      "}",
    }
    -- A master running as root would hand its workers to `nobody`, who cannot read the
    -- checkout or the specs' private directories.
    if (read_file("/proc/self/status") or ""):match("\nUid:%s+(%d+)") == "0" then
      table.insert(main, 3, "user root root;")
    end
    return table.concat(main, "\n") .. "\n"
  end
end

--- Starts an nginx with the Lua module and the given server and http blocks.
function nginx.start(opts)
  if not executable(MODULES .. "/ngx_http_lua_module.so") then
    -- `test -x` on a shared object: Debian installs modules 0644, so look for the file.
    if not read_file(MODULES .. "/ngx_http_lua_module.so") then
      error("the nginx specs need the Lua module (Debian package libnginx-mod-http-lua)", 0)
    end
  end
  local cpath = os.getenv("SANDKIT_NGINX_CPATH")
  if not cpath or cpath == "" or not package.searchpath("sandkit.core", cpath) then
    error("the nginx specs need the C module built for LuaJIT: `make LUA_PC=luajit` and "
      .. "SANDKIT_NGINX_CPATH=<build>/luajit/?.so (make test sets both)", 0)
  end
  local dir = nginx.temp_dir()
  local s = setmetatable({ dir = dir, ports = {} }, server_mt)
  local ok, err = pcall(function()
    if opts.prepare then opts.prepare(dir) end
    s.pid, s.port = nginx.launch(dir, lua_conf(opts, dir, cpath, s.ports), nil,
      opts.bound_by_modes and processes.bound_by_modes() or nil)
  end)
  if not ok then
    s:stop()
    error(err, 0)
  end
  s.url = "http://127.0.0.1:" .. s.port
  return s
end

--- The pid of the (first) worker process.
function server_mt:worker_pid()
  return processes.children(self.pid)[1]
end

function server_mt:error_log()
  return read_file(self.dir .. "/error.log") or ""
end

function server_mt:stop()
  if self.pid then
    nginx.kill(self.pid)
    self.pid = nil
  end
  if self.dir then
    core.remove_tree(self.dir)
    self.dir = nil
  end
end

return nginx
