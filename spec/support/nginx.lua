--- A real nginx for specs that need TLS in front of a fake: test certificates made with the
-- openssl CLI, nginx started on a free port (picked and retried: another process may take the
-- port between the pick and nginx's bind), processes stopped for good.
--
--   nginx.require_tools()                    -- fails the spec naming what to install
--   nginx.run(dir, "openssl …")              -- a shell command in dir, or the spec fails
--   nginx.make_certificates(dir, { servers = { server = "IP:127.0.0.1,DNS:localhost" },
--                                  clients = { client = "/CN=someone" }, ca = "ca" })
--       -- <ca>.crt/.key, and <name>.crt/.key per server (SANs) and client (subject)
--   local pid, port = nginx.start(dir, function(port) return conf end, { before_try = fn })
--   nginx.stop(pid)                          -- SIGTERM, then SIGKILL past a bound

local core = require "sandkit.core"
local socket = require "socket"
local wait = require "sandkit.wait"
local files = require "support.files"

local nginx = {}

nginx.BINARY = "/usr/sbin/nginx"
--- Seconds nginx gets to start listening, and to stop, before the spec gives up on it.
local START_TIMEOUT = 10
local STOP_TIMEOUT = 5

local function executable(path)
  return files.sh("test -x '" .. path .. "'")
end
nginx.executable = executable

function nginx.require_tools()
  if not executable(nginx.BINARY) then
    error("this spec needs nginx at " .. nginx.BINARY .. " (Debian package nginx or "
      .. "nginx-light; tools/bootstrap.sh installs it)", 0)
  end
  if not files.sh("command -v openssl >/dev/null 2>&1") then
    error("this spec needs the openssl command line tool (Debian package openssl)", 0)
  end
end

--- Runs a shell command in dir, failing the spec with its output when it fails.
function nginx.run(dir, command)
  local log = dir .. "/command.log"
  if not files.sh("cd '" .. dir .. "' && " .. command .. " >'" .. log .. "' 2>&1") then
    error("`" .. command .. "` failed:\n" .. (files.read(log) or ""), 0)
  end
end

local EC = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

--- A CA, and certificates it signed: servers by subjectAltName, clients by subject.
function nginx.make_certificates(dir, opts)
  opts = opts or {}
  local ca = opts.ca or "ca"
  nginx.run(dir, "openssl req -x509 " .. EC .. " -keyout " .. ca .. ".key -out " .. ca .. ".crt"
    .. " -days 1 -subj '/CN=sandkit test CA " .. ca .. "'"
    .. " -addext 'basicConstraints=critical,CA:TRUE' -addext 'keyUsage=critical,keyCertSign,cRLSign'")
  local serial = 1
  local function issue(name, subject, ext)
    files.write(dir .. "/" .. name .. ".ext", ext)
    nginx.run(dir, "openssl req " .. EC .. " -keyout " .. name .. ".key -out " .. name .. ".csr"
      .. " -subj '" .. subject .. "'")
    nginx.run(dir, "openssl x509 -req -in " .. name .. ".csr -CA " .. ca .. ".crt -CAkey " .. ca
      .. ".key -set_serial " .. serial .. " -days 1 -extfile " .. name .. ".ext -out " .. name .. ".crt")
    serial = serial + 1
  end
  for name, sans in pairs(opts.servers or { server = "IP:127.0.0.1,DNS:localhost" }) do
    issue(name, "/CN=" .. name, "subjectAltName=" .. sans .. "\nbasicConstraints=CA:FALSE\n"
      .. "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
  end
  for name, subject in pairs(opts.clients or {}) do
    issue(name, subject, "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
      .. "extendedKeyUsage=clientAuth\n")
  end
end

local function free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

--- Waits until something accepts on port, or the process pid ended, or the bound passed.
local function wait_listening(port, pid)
  local deadline = core.now() + START_TIMEOUT
  while core.now() < deadline do
    local c = socket.tcp()
    c:settimeout(1)
    local ok = c:connect("127.0.0.1", port)
    c:close()
    if ok then return true end
    if core.reap(pid) then return false end
    wait.sleep(0.02)
  end
  return false
end

function nginx.stop(pid)
  if not pid then return end
  core.kill(pid, core.SIGTERM)
  local deadline = core.now() + STOP_TIMEOUT
  while not core.reap(pid) and core.now() < deadline do wait.sleep(0.02) end
  if not core.reap(pid) then
    core.kill(pid, core.SIGKILL)
    core.reap(pid, true)
  end
end

--- Starts nginx with conf_for(port) written to dir/nginx.conf: pid, port. opts.before_try()
-- runs before each attempt and opts.after_failed_try() after each one that failed.
function nginx.start(dir, conf_for, opts)
  opts = opts or {}
  for _ = 1, 3 do
    if opts.before_try then opts.before_try() end
    local port = free_port()
    files.write(dir .. "/nginx.conf", conf_for(port))
    local pid = assert(core.spawn({ nginx.BINARY, "-p", dir, "-c", dir .. "/nginx.conf",
      "-g", "daemon off;" }, { stderr = dir .. "/nginx.stderr", stdout = dir .. "/nginx.stderr",
      setsid = true }))
    if wait_listening(port, pid) then return pid, port end
    core.kill(pid, core.SIGKILL)
    core.reap(pid, true)
    if opts.after_failed_try then opts.after_failed_try() end
  end
  error("nginx did not start:\n" .. (files.read(dir .. "/nginx.stderr") or "")
    .. (files.read(dir .. "/error.log") or ""), 0)
end

--- The opening of every nginx.conf of a spec, up to and inside `http {`: one worker, its pid,
-- log and temporary files all in dir, so nothing is written outside it.
function nginx.conf_head(dir, connections)
  local lines = { "worker_processes 1;", "pid " .. dir .. "/nginx.pid;",
    "error_log " .. dir .. "/error.log info;",
    "events { worker_connections " .. (connections or 64) .. "; }", "http {" }
  for _, kind in ipairs{ "client_body", "proxy", "fastcgi", "uwsgi", "scgi" } do
    local directive = kind == "client_body" and "client_body_temp_path" or (kind .. "_temp_path")
    lines[#lines + 1] = "  " .. directive .. " " .. dir .. "/temp/" .. kind .. ";"
  end
  return table.concat(lines, "\n")
end

return nginx
