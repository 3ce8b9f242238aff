--- A stand-in for a MicroVM's endpoint, for the end-to-end spec: a real nginx terminating TLS
-- with a certificate from a test CA made here with the openssl CLI, admitting only requests
-- that carry the minted token headers and `X-aws-proxy-port: 8971` (403 otherwise, and 403
-- for any Authorization header), and proxying them unbuffered over HTTP/1.1 to a real
-- sandkit-agent --no-auth. While its "restoring" flag file exists it answers 502, as AWS's
-- proxy does during a snapshot restore; spec/support/aws_restore_gate.lua removes the flag
-- after a counted number of 502 health probes, reading nginx's access log as it is written.
--
--   local proxy = aws_endpoint_proxy.start{ restoring = 3, token = { [name] = value, … } }
--   proxy.endpoint     -- "127.0.0.1:<port>", as GetMicrovm would report it
--   proxy.ca_file      -- the test CA to trust
--   proxy.root         -- the agent's sandbox root
--   proxy:access_log() -- { { status = 502, uri = "/v1/health?version=1" }, … } so far
--   proxy:stop()
--
-- Anything missing — nginx, openssl, the agent binary — fails the spec with what to install.

local core = require "sandkit.core"
local fake_http = require "support.fake_http"
local files = require "support.files"
local nginx = require "support.nginx"
local tls = require "support.tls"

local aws_endpoint_proxy = {}

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
--- Seconds the agent gets to start listening before the spec gives up on it.
local START_TIMEOUT = 10

local proxy_mt = {}
proxy_mt.__index = proxy_mt

local read_file, write_file = files.read, files.write

local function executable(path)
  return files.execute("test -x " .. files.shell_quote(path))
end

local function require_tools()
  tls.require_openssl()
  local agent = os.getenv("SANDKIT_AGENT")
  if not agent or agent == "" or not executable(agent) then
    error("the end-to-end spec needs sandkit-agent: build it (make BUILD=build/x "
      .. "build/x/sandkit-agent) and set SANDKIT_AGENT to its path (make test does)", 0)
  end
  return agent
end

local function start_agent(agent, root, log)
  local pid, reader = core.spawn({ agent, "--root", root, "--no-auth", "--listen", "127.0.0.1:0",
    "--ready-fd", "3", "--log", "quiet" }, { ready_fd = 3, setsid = true, stderr = log })
  assert(pid, reader)
  local line, err = fake_http.read_line(reader, START_TIMEOUT)
  reader:close()
  if not line then
    core.kill(pid, core.SIGKILL)
    core.reap(pid, true)
    error("sandkit-agent did not report that it listens: " .. tostring(err) .. "\n"
      .. (read_file(log) or ""), 0)
  end
  return pid, assert(tonumber(line:match('"port"%s*:%s*(%d+)')), line)
end

local function nginx_conf(p, port)
  local checks = {}
  for name, value in pairs(p.token) do
    assert(value:match("^[%w%-]+$"), "test tokens are plain words")
    local variable = "$http_" .. name:lower():gsub("%-", "_")
    checks[#checks + 1] = string.format('      if (%s != "%s") { return 403; }', variable, value)
  end
  table.sort(checks)
  return table.concat({
    nginx.conf_head(p.dir),
    "  log_format gate '$status $request_uri';",
    "  server {",
    "    listen 127.0.0.1:" .. port .. " ssl;",
    "    server_name localhost;",
    "    ssl_certificate " .. p.dir .. "/server.crt;",
    "    ssl_certificate_key " .. p.dir .. "/server.key;",
    "    access_log " .. p.dir .. "/access.fifo gate;",
    "    location / {",
    -- A bearer is what a client that misread the mint would send: AWS's proxy refuses it.
    '      if ($http_authorization != "") { return 403; }',
    table.concat(checks, "\n"),
    '      if ($http_x_aws_proxy_port != "8971") { return 403; }',
    "      if (-f " .. p.dir .. "/restoring) { return 502; }",
    "      proxy_pass http://127.0.0.1:" .. p.agent_port .. ";",
    "      proxy_http_version 1.1;",
    '      proxy_set_header Connection "";',
    "      proxy_buffering off;",
    "      proxy_request_buffering off;",
    "    }",
    "  }",
    "}",
  }, "\n") .. "\n"
end

function aws_endpoint_proxy.start(opts)
  local agent = require_tools()
  -- nginx's workers run as nobody when the spec runs as root, and must see the flag.
  local dir = nginx.temp_dir()
  local p = setmetatable({ dir = dir, token = opts.token, ca_file = dir .. "/ca.crt",
    root = dir .. "/root", pids = {} }, proxy_mt)
  local ok, err = pcall(function()
    -- A CA, and a server certificate it signed for 127.0.0.1 and localhost.
    tls.issue(dir, tls.ca(dir, "ca"), "server", { "IP:127.0.0.1", "DNS:localhost" })
    assert(core.mkdir(p.root, tonumber("700", 8)))
    local agent_pid
    agent_pid, p.agent_port = start_agent(agent, p.root, dir .. "/agent.log")
    p.pids.agent = agent_pid

    assert(files.execute("mkfifo " .. files.shell_quote(dir .. "/access.fifo")))
    if (opts.restoring or 0) > 0 then write_file(dir .. "/restoring", "") end
    p.access_copy = dir .. "/access.log"
    write_file(p.access_copy, "")

    -- Each try of a port gets a fresh gate: the one before saw the fifo close when its nginx
    -- exited.
    p.pids.nginx, p.port = nginx.launch(dir, function(port) return nginx_conf(p, port) end,
      function()
        if p.pids.gate then
          core.kill(p.pids.gate, core.SIGKILL)
          core.reap(p.pids.gate, true)
        end
        p.pids.gate = assert(core.spawn({ LUA, "spec/support/aws_restore_gate.lua",
          dir .. "/access.fifo", dir .. "/restoring", tostring(opts.restoring or 0), p.access_copy },
          { stderr = dir .. "/gate.log", setsid = true }))
      end)
    p.endpoint = "127.0.0.1:" .. p.port
  end)
  if not ok then
    p:stop()
    error(err, 0)
  end
  return p
end

function proxy_mt:access_log()
  local entries = {}
  for line in (read_file(self.access_copy) or ""):gmatch("[^\n]+") do
    local status, uri = line:match("^(%d+) (%S+)")
    entries[#entries + 1] = { status = tonumber(status), uri = uri }
  end
  return entries
end

--- The proxy's error log, for a failure message.
function proxy_mt:error_log()
  return read_file(self.dir .. "/error.log") or ""
end

function proxy_mt:stop()
  -- nginx first: its closing the fifo is what ends the gate.
  for _, name in ipairs{ "nginx", "agent", "gate" } do
    local pid = self.pids[name]
    if pid then
      nginx.kill(pid)
      self.pids[name] = nil
    end
  end
  core.remove_tree(self.dir)
end

return aws_endpoint_proxy
