-- A command silent for longer than a proxy's per-read timeout keeps its stream when the
-- sandbox asks the agent for keep-alives (docs/protocol.md §6 keepalive), and loses it when it
-- does not: a real sandkit-agent behind a real nginx whose proxy_read_timeout is a second (60
-- by default), reached over libcurl from this process and over cosockets from inside another
-- nginx worker.

local cjson = require "cjson"
local sandkit = require "sandkit"
local agent_process = require "support.agent_process"
local nginx = require "support.nginx"
local raw_http = require "support.raw_http"

--- The proxy's per-read timeout, and a command silent well past it.
local READ_TIMEOUT = 1
local SILENT = { "sh", "-c", "sleep 2.2; echo done" }

describe("a silent command behind a proxy that cuts silent connections", function()
  local agent, proxy
  setup(function()
    agent = assert(agent_process.start_agent())
    proxy = nginx.start{
      ports = { "agent_proxy" },
      http = table.concat({
        "  server {",
        "    listen 127.0.0.1:${agent_proxy};",
        "    location / {",
        "      proxy_pass http://127.0.0.1:" .. agent.port .. ";",
        "      proxy_http_version 1.1;",
        '      proxy_set_header Connection "";',
        "      proxy_buffering off;",
        "      proxy_read_timeout " .. READ_TIMEOUT .. "s;",
        "    }",
        "  }",
      }, "\n"),
      server = "    location = /exec_once { content_by_lua_block { require('support.nginx_app').exec_once() } }",
    }
  end)
  teardown(function()
    if proxy then proxy:stop() end
    if agent then agent:stop() end
  end)

  local function options(keepalive)
    return { provider = "agent", url = "http://127.0.0.1:" .. proxy.ports.agent_proxy, token = agent.token,
      keepalive = keepalive }
  end

  local function over_cosockets(keepalive)
    local answer = assert(raw_http.request(proxy.port, "POST", "/exec_once",
      { body = cjson.encode{ options = options(keepalive), argv = SILENT, timeout = 10 }, timeout = 30 }))
    assert(answer.status == 200, answer.body .. proxy:error_log())
    local got = cjson.decode(answer.body)
    return got.result, got.err
  end

  local function over_libcurl(keepalive)
    local session = assert(assert(sandkit.sandbox(options(keepalive))):create{})
    return session:exec(SILENT, { timeout = 10 })
  end

  for transport, exec in pairs{ libcurl = over_libcurl, ["nginx cosockets"] = over_cosockets } do
    it("keeps its stream with keep-alives, over " .. transport, function()
      local result, err = exec(0.3)
      assert(result, tostring(err and err.message))
      assert.same({ 0, "done\n" }, { result.code, result.stdout })
    end)

    it("loses its stream without them, over " .. transport .. ", as an unknown outcome", function()
      local result, err = exec(false)
      assert.is_nil(result)
      assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    end)
  end
end)
