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
    # Each flush of the response (a call with no bytes that does not end it) is marked where it
    # came, so a spec sees which frames went out together.
    location = /scripted_flushes {
      content_by_lua_block { require("support.nginx_app").scripted_stream() }
      body_filter_by_lua_block {
        if ngx.arg[1] == "" and not ngx.arg[2] then ngx.arg[1] = "|flush|" end
      }
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
  -- Scripts with frames longer than a flush keep their request body in memory.
  before_each(function() gateway = nginx.start{ server = LOCATIONS, http = "  client_body_buffer_size 1m;" } end)
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

  --- A stdout frame of data, already here when the stream is polled unless `later`.
  local function out(data, seq, later)
    return { type = "stdout", seq = seq, data = data, here = not later }
  end
  local EXIT_HERE = { type = "exit", code = 0, truncated = false, here = true }

  local function flushes(frames, format)
    local answer = assert(raw_http.request(gateway.port, "POST", "/scripted_flushes?format=" .. format,
      { body = cjson.encode{ frames = frames, polled = true }, timeout = 30 }))
    assert.equal(200, answer.status, answer.body)
    return answer.body
  end

  it("flushes frames that are already here together, and a frame with none after it at once", function()
    local body = flushes({ out("a", 0), out("b", 1), out("c", 2), out("d", 3, true), EXIT_HERE }, "text")
    assert.equal("abc|flush|d\nsandkit: exit code 0\n|flush|", body)
    body = flushes({ out("a", 0), out("b", 1, true), out("c", 2, true), { type = "exit", code = 0,
      truncated = false } }, "text")
    assert.equal("a|flush|b|flush|c|flush|\nsandkit: exit code 0\n|flush|", body)
    -- NDJSON, each flush as the kinds and seqs of its lines.
    body = flushes({ out("a", 0), out("b", 1), out("c", 2, true), EXIT_HERE }, "ndjson")
    local groups = {}
    for group in body:gmatch("(.-)|flush|") do
      local lines = {}
      for line in group:gmatch("([^\n]+)\n") do
        local frame = cjson.decode(line)
        lines[#lines + 1] = frame.t .. (frame.seq and " " .. math.floor(frame.seq) or "")
      end
      groups[#groups + 1] = table.concat(lines, ", ")
    end
    assert.same({ "stdout 0, stdout 1", "stdout 2, exit" }, groups)
  end)

  it("flushes at most sandkit.ngx's FLUSH_BYTES at once, and a longer frame alone", function()
    local bound = 64 * 1024
    local half, over = string.rep("h", bound / 2), string.rep("o", bound + 1)
    local body = flushes({ out(half, 0), out(half, 1), out("x", 2), out(over, 3), out("y", 4), EXIT_HERE }, "text")
    assert.equal(half .. half .. "|flush|x|flush|" .. over .. "|flush|y\nsandkit: exit code 0\n|flush|", body)
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
