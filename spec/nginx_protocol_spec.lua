-- The agent protocol client over nginx cosockets: every case of
-- spec/support/protocol_cases.lua, each one's client side run inside a worker of a real nginx
-- (support/nginx, support/nginx_app) against the same fake agents as spec/protocol_spec.lua,
-- which runs the table over libcurl. One suite, two transports, the same meaning.

local cjson = require "cjson"
local nginx = require "support.nginx"
local protocol_cases = require "support.protocol_cases"
local raw_http = require "support.raw_http"

local LOCATIONS = [[
    location = /case/open { content_by_lua_block { require("support.nginx_app").case_open() } }
    location = /case/act { content_by_lua_block { require("support.nginx_app").case_act() } }
]]

describe("over nginx cosockets", function()
  local gateway
  setup(function() gateway = nginx.start{ server = LOCATIONS } end)
  teardown(function() if gateway then gateway:stop() end end)

  local function post(path, value)
    local answer = assert(raw_http.request(gateway.port, "POST", path,
      { body = cjson.encode(value), timeout = 60 }))
    assert(answer.status == 200, path .. " answered " .. answer.status .. ": " .. answer.body
      .. "\n" .. gateway:error_log())
    return answer.body
  end

  protocol_cases.declare({ describe = describe, it = it, after_each = after_each }, function(i, c, server)
    local handle = cjson.decode(post("/case/open", { url = server.url, index = i })).handle
    if c.between then c.between(server) end
    return post("/case/act", { handle = handle, index = i })
  end)
end)
