-- sandkit.ngx.stream's plain-text format inside a real nginx worker: the output bytes as they
-- come, stdout and stderr in the order their frames arrived, the exit status (or the failure)
-- as the response's last line, and in the `Sandkit-Exit` trailer when the client asked for
-- trailers (TE: trailers) and the location declares the trailer as docs/openresty.md says.

local cjson = require "cjson"
local local_state = require "support.local_state"
local nginx = require "support.nginx"
local raw_http = require "support.raw_http"

local LOCATIONS = [[
    location = /scripted {
      set $sandkit_exit "";
      add_trailer Sandkit-Exit $sandkit_exit;
      content_by_lua_block { require("support.nginx_app").scripted_stream() }
    }
    location = /scripted_without_trailer {
      content_by_lua_block { require("support.nginx_app").scripted_stream() }
    }
    location = /create { content_by_lua_block { require("support.nginx_app").create() } }
    location = /stream {
      set $sandkit_exit "";
      add_trailer Sandkit-Exit $sandkit_exit;
      content_by_lua_block { require("support.nginx_app").stream() }
    }
]]

local TAKES_TRAILERS = { TE = "trailers" }

describe("sandkit.ngx.stream as text, inside nginx", function()
  local gateway
  before_each(function() gateway = nginx.start{ server = LOCATIONS } end)
  after_each(function() gateway:stop() end)

  local function scripted(script, headers, location)
    return assert(raw_http.request(gateway.port, "POST", (location or "/scripted") .. "?format=text",
      { body = cjson.encode(script), headers = headers, timeout = 30 }))
  end

  local FRAMES = {
    { type = "stdout", seq = 0, data = "out one " },
    { type = "stderr", seq = 1, data = "err one\n" },
    { type = "stdout", seq = 2, data = "out two\n" },
    { type = "exit", code = 3, truncated = false },
  }

  it("writes stdout and stderr in the order their frames came, then the exit status as the last line", function()
    local answer = scripted{ frames = FRAMES }
    assert.equal(200, answer.status)
    assert.equal("text/plain", answer.headers["content-type"])
    assert.equal("out one err one\nout two\nsandkit: exit code 3\n", answer.body)
  end)

  it("sends the exit status in the Sandkit-Exit trailer to a client that takes trailers, and to no other", function()
    local answer = scripted({ frames = FRAMES }, TAKES_TRAILERS)
    assert.same({ ["sandkit-exit"] = "3" }, answer.trailers)
    assert.equal("out one err one\nout two\nsandkit: exit code 3\n", answer.body, "the last line stays")
    answer = scripted{ frames = FRAMES }
    assert.same({}, answer.trailers)
    answer = scripted({ frames = FRAMES }, { TE = "gzip, trailers;q=0.5" })
    assert.same({}, answer.trailers, "trailers with a parameter are not the bare member RFC 9110 defines")
    answer = scripted({ frames = FRAMES }, { TE = "gzip , trailers" })
    assert.same({ ["sandkit-exit"] = "3" }, answer.trailers)
  end)

  it("puts the status on a line of its own after output that did not end one, with signal and truncation", function()
    local answer = scripted({ frames = { { type = "stdout", seq = 0, data = "no newline" },
      { type = "exit", code = 137, signal = 9, truncated = true } } }, TAKES_TRAILERS)
    assert.equal("no newline\nsandkit: exit code 137, signal 9, output truncated\n", answer.body)
    assert.same({ ["sandkit-exit"] = "137; signal=9; truncated" }, answer.trailers)
  end)

  it("ends a failed stream with the error a tenant may see, as its last line and its trailer", function()
    local answer = scripted({ frames = { FRAMES[1] }, error = { code = "SANDBOX_OUTCOME_UNKNOWN", internal = true,
      message = "sandbox.runCommand: cut at arn:aws:iam::123456789012:role/private" } }, TAKES_TRAILERS)
    assert.equal("out one \nsandkit: error SANDBOX_OUTCOME_UNKNOWN: Internal server error\n", answer.body)
    assert.same({ ["sandkit-exit"] = "error; code=SANDBOX_OUTCOME_UNKNOWN" }, answer.trailers)
    answer = scripted({ frames = {} }, TAKES_TRAILERS)
    assert.matches("^sandkit: error SANDBOX_OUTCOME_UNKNOWN: sandbox.runCommand did not report its outcome[^\n]*"
      .. "without a terminal frame\n$", answer.body)
  end)

  it("streams without a trailer where the location declares none", function()
    local answer = scripted({ frames = FRAMES }, TAKES_TRAILERS, "/scripted_without_trailer")
    assert.equal(200, answer.status)
    assert.equal("out one err one\nout two\nsandkit: exit code 3\n", answer.body)
    assert.same({}, answer.trailers)
  end)

  it("passes a real command's bytes through unchanged, both streams, binary included", function()
    local root = local_state.new()
    finally(function() local_state.clean(root) end)
    local created = assert(raw_http.request(gateway.port, "POST", "/create?root=" .. root, { timeout = 60 }))
    assert.equal(200, created.status, created.body .. gateway:error_log())
    local id = cjson.decode(created.body).id
    local answer = assert(raw_http.request(gateway.port, "POST", "/stream?format=text&root=" .. root
      .. "&session=" .. id, { headers = TAKES_TRAILERS, timeout = 60,
      body = cjson.encode{ "sh", "-c", "printf 'a\\000\\377b'; printf 'err' >&2; exit 5" } }))
    assert.equal(200, answer.status, answer.body)
    assert.same({ ["sandkit-exit"] = "5" }, answer.trailers)
    local output, status = answer.body:match("^(.*)\nsandkit: exit code (%d+)\n$")
    assert.equal("5", status, answer.body)
    -- The two pipes are read as they become readable, so their bytes may interleave: stderr's
    -- letters are none of stdout's, which tells each stream's bytes apart.
    assert.equal("a\0\255b", (output:gsub("[er]", "")))
    assert.equal("err", (output:gsub("[^er]", "")))
  end)
end)
