-- sandkit.ngx.handle inside a real nginx worker: a handler that raises a sandkit error (the
-- README's assert idiom) is logged with the error's whole text, never nginx's "unknown reason",
-- and answered with a 500 carrying what err:external() shows; other errors show the client
-- nothing of their text; a handler that returns or calls ngx.exit is left alone; one that
-- raises after its response began has its connection cut.

local cjson = require "cjson"
local sandkit = require "sandkit"
local nginx = require "support.nginx"
local raw_http = require "support.raw_http"

local LOCATIONS = [[
    location = /handled { content_by_lua_block { require("support.nginx_app").handled() } }
]]

describe("sandkit.ngx.handle inside nginx", function()
  local gateway
  before_each(function() gateway = nginx.start{ server = LOCATIONS } end)
  after_each(function() gateway:stop() end)

  local function get(case)
    return assert(raw_http.request(gateway.port, "GET", "/handled?case=" .. case, { timeout = 30 }))
  end

  it("logs a raised sandkit error's whole text and answers 500 with what err:external() shows", function()
    local answer = get("sandkit_error")
    local _, err = sandkit.sandbox{ provider = "local", root = "/nonexistent", rooot = true }
    assert.equal(500, answer.status)
    assert.equal("application/json", answer.headers["content-type"])
    assert.same({ code = "INVALID_INPUT", message = err:external().message, retryable = false },
      cjson.decode(answer.body))
    local log = gateway:error_log()
    assert.truthy(log:find("sandkit.ngx.handle: " .. tostring(err), 1, true), log)
    assert.truthy(log:find("stack traceback:", 1, true), "the log says where it was raised")
    assert.is_nil(log:find("unknown reason", 1, true), log)
  end)

  it("shows the client an internal error as \"Internal server error\" and logs its private text", function()
    local answer = get("internal_error")
    assert.equal(500, answer.status)
    assert.same({ code = "SANDBOX_UNREACHABLE", message = "Internal server error", retryable = true },
      cjson.decode(answer.body))
    assert.is_nil(answer.body:find("arn:aws", 1, true))
    assert.truthy(gateway:error_log():find("refused for arn:aws:iam::123456789012:role/private", 1, true))
  end)

  it("shows the client nothing of an error that is not sandkit's, and logs it", function()
    local answer = get("plain_error")
    assert.equal(500, answer.status)
    assert.same({ message = "Internal server error" }, cjson.decode(answer.body))
    assert.truthy(gateway:error_log():find("sandkit.ngx.handle: [^\n]*the handler's own words"))
  end)

  it("passes its arguments on and returns the handler's results when it returns", function()
    local answer = get("returns")
    assert.equal(200, answer.status)
    assert.equal("the handler ran with an argument\nhandle returned its result 2\n", answer.body)
    assert.is_nil(gateway:error_log():find("sandkit.ngx.handle", 1, true))
  end)

  it("leaves a handler's ngx.exit alone", function()
    local answer = get("exits")
    assert.equal(404, answer.status)
    assert.equal("not here\n", answer.body)
    assert.is_nil(gateway:error_log():find("sandkit.ngx.handle", 1, true))
  end)

  it("cuts the connection of a response that had begun, so that it never reads as whole", function()
    local conn = assert(raw_http.connect(gateway.port, nil, 30))
    assert(conn:request("GET", "/handled?case=raises_after_output"))
    assert.equal(200, (conn:read_head()))
    assert.equal("the first line\n", conn:read_chunk())
    local rest, err = conn:read_chunk()
    conn:close()
    assert.is_nil(rest, "no terminating chunk")
    assert.equal("closed", err)
    assert.truthy(gateway:error_log():find("sandkit.ngx.handle: INVALID_INPUT", 1, true), gateway:error_log())
  end)

  it("refuses a handler that is no function, as misuse", function()
    local ok, err = pcall(require("sandkit.ngx").handle, "not a function")
    assert.is_false(ok)
    assert.matches("sandkit.ngx.handle: the handler is a function", err)
  end)
end)
