-- Kubernetes watches (sandkit.providers.kubernetes.watch): reading one, JSON lines from a
-- streamed response, however the chunks cut them, within a bound on a line, telling each way a
-- stream stops; and following one object through them, read again wherever a watch cannot say.

local http = require "sandkit.http"
local wait = require "sandkit.wait"
local json = require "sandkit.json"
local watch = require "sandkit.providers.kubernetes.watch"
local compat = require "support.compat"
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

describe("following an object through watches", function()
  --- A response whose body is `events` (tables, one JSON line each), all there and then ended.
  local function response(events)
    local lines = {}
    for i, event in ipairs(events) do lines[i] = json.encode(event) .. "\n" end
    local body, taken = table.concat(lines), false
    return { close = function() end, transfer = {
      read = function()
        if taken then return nil end
        taken = true
        return body
      end,
      state = function() return { ok = true } end,
    } }
  end

  local function claim(rv, ready, name)
    return { metadata = { name = name or "c1", resourceVersion = tostring(rv) }, ready = ready }
  end

  --- Follows claim c1 as read at version 1: `watches` are what each watch request answers, in
  -- turn (a list of events, or { nil, err }), `reads` what each fresh read answers. Returns
  -- follow's results and what was asked.
  local function follow(watches, reads, deadline)
    local asked = { queries = {}, reads = 0 }
    local results = { watch.follow{
      object = claim(1, false), seen = "first read", deadline = deadline or (wait.now() + 10),
      read = function()
        asked.reads = asked.reads + 1
        return compat.unpack(reads[asked.reads] or { nil, { retryable = false, message = "no more reads" } }, 1, 2)
      end,
      open = function(query)
        local q = {}
        for _, pair in ipairs(query) do q[pair[1]] = pair[2] end
        asked.queries[#asked.queries + 1] = q
        local answer = watches[#asked.queries]
        if not answer then return nil, { status = 403, retryable = false, message = "no more watches" } end
        if answer.events then return response(answer.events) end
        return nil, answer.err
      end,
      judge = function(object)
        if object.ready then return "stop", object.metadata.resourceVersion end
        return nil, "version " .. object.metadata.resourceVersion .. " not ready"
      end,
      ended = function(why, seen) return { why = why, seen = seen } end,
    } }
    return results, asked
  end

  it("judges each change a watch of the object from its version reports, until the judge stops", function()
    local results, asked = follow({ { events = {
      { type = "MODIFIED", object = claim(2, false) },
      { type = "MODIFIED", object = claim(9, true, "another") },
      { type = "BOOKMARK", object = claim(3) },
      { type = "MODIFIED", object = claim(4, true) } } } }, {})
    assert.same({ "4" }, results)
    assert.equal(1, #asked.queries)
    assert.same({ watch = "1", fieldSelector = "metadata.name=c1", resourceVersion = "1",
      allowWatchBookmarks = "true", timeoutSeconds = "10" }, asked.queries[1])
    assert.equal(0, asked.reads)
  end)

  it("reads the object again after a 410, as an event or a status, and watches from the version read", function()
    local results, asked = follow({
      { events = { { type = "ERROR", object = { code = 410, message = "too old" } } } },
      { err = { status = 410, message = "gone" } },
      { events = { { type = "MODIFIED", object = claim(8, true) } } } },
      { { claim(5, false) }, { claim(7, false) } })
    assert.same({ "8" }, results)
    assert.equal(2, asked.reads)
    assert.same({ "1", "5", "7" }, { asked.queries[1].resourceVersion, asked.queries[2].resourceVersion,
      asked.queries[3].resourceVersion })
  end)

  it("replaces a watch that ended with a fresh read and a watch from there", function()
    local results, asked = follow({ { events = { { type = "BOOKMARK", object = claim(2) } } },
      { events = { { type = "MODIFIED", object = claim(6, true) } } } }, { { claim(5, false) } })
    assert.same({ "6" }, results)
    assert.equal(1, asked.reads)
    assert.equal("5", asked.queries[2].resourceVersion)
  end)

  it("ends with the caller's error for a deleted object, a refused watch or read, and a passed deadline", function()
    local results = follow({ { events = { { type = "DELETED", object = claim(2) } } } }, {})
    assert.same({ why = "deleted", seen = "version 1 not ready" }, results[2])
    results = follow({ { err = { status = 403, retryable = false, message = "forbidden" } } }, {})
    assert.equal("forbidden", results[2].message)
    results = follow({ { events = {} } }, { { nil } })
    assert.same({ why = "deleted", seen = "version 1 not ready" }, results[2], "read back as gone")
    results = follow({}, {}, wait.now() - 1)
    assert.same({ why = "timeout", seen = "first read" }, results[2])
  end)
end)
