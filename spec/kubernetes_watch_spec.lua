-- Reading a Kubernetes watch (sandkit.providers.kubernetes.watch): JSON lines from a streamed response,
-- however the chunks cut them, within a bound on a line, telling each way a stream stops.

local http = require "sandkit.http"
local wait = require "sandkit.wait"
local json = require "sandkit.json"
local watch = require "sandkit.providers.kubernetes.watch"
local fake_http = require "support.fake_http"

--- A server that answers every request with the chunks of `chunks_source` (a Lua expression),
-- then ends the body (or closes the connection mid-body with `cut`, or stalls with `stall`).
local function serve(chunks_source, ending)
  return fake_http.start([[
    local respond = require "support.respond"
    return { handle = function(req, conn)
      respond.chunked_start(conn, "200 OK", "application/json")
      for _, c in ipairs(]] .. chunks_source .. [[) do respond.chunk(conn, c) conn:sleep(0.01) end
      local ending = "]] .. (ending or "end") .. [["
      if ending == "cut" then return conn:close() end
      if ending == "stall" then conn:sleep(30) end
      respond.chunked_end(conn)
    end }
  ]])
end

describe("a watch reader", function()
  local server
  after_each(function() if server then server:stop() server = nil end end)

  local function read_all(max_line, deadline)
    local resp = assert(http.send{ method = "GET", url = server.url .. "/w",
      header_deadline = wait.now() + 5 })
    local reader = watch.reader(resp, max_line)
    local events = {}
    while true do
      local event, kind, detail = reader:next(deadline or (wait.now() + 5))
      if not event then return events, kind, detail end
      events[#events + 1] = event.type .. ":" .. tostring(json.integer(event.object.n))
    end
  end

  it("yields each event whole, however chunks split and join lines, skipping blank ones", function()
    server = serve([[{ '{"type":"ADDED","obj', 'ect":{"n":1}}\n\n{"type":"MODIFIED","object":{"n":2}}\n{"ty',
      'pe":"BOOKMARK","object":{"n":3}}\n' }]])
    local events, kind = read_all()
    assert.same({ "ADDED:1", "MODIFIED:2", "BOOKMARK:3" }, events)
    assert.equal("ended", kind)
  end)

  it("stops at a line longer than its bound, and reads one exactly at it", function()
    local line = '{"type":"ADDED","object":{"n":1,"pad":"' .. string.rep("x", 1000) .. '"}}'
    server = serve("{ '" .. line .. "\\n' }")
    local events, kind = read_all(#line)
    assert.same({ "ADDED:1" }, events)
    assert.equal("ended", kind)
    server:stop()
    server = serve("{ '" .. line .. "\\n' }")
    events, kind = read_all(#line - 1)
    assert.same({}, events)
    assert.equal("too_long", kind)
  end)

  it("tells a line that is not JSON, a body cut inside an event, and a stall past the deadline apart", function()
    server = serve([[{ 'not json\n' }]])
    local _, kind = read_all()
    assert.equal("unparsable", kind)
    server:stop()
    server = serve([[{ '{"type":"ADDED","object":{"n":1}}\n{"type":"MOD' }]], "cut")
    local events
    events, kind = read_all()
    assert.same({ "ADDED:1" }, events)
    assert.equal("failed", kind)
    server:stop()
    server = serve([[{ '{"type":"ADDED","object":{"n":1}}\n' }]], "stall")
    local started = wait.now()
    events, kind = read_all(nil, wait.now() + 0.3)
    assert.same({ "ADDED:1" }, events)
    assert.equal("timeout", kind)
    assert.is_true(wait.now() - started < 5)
  end)
end)
