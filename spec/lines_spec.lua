-- session:run(argv, { lines = true }): one frame per whole line, over frames cut anywhere.

local core = require "sandkit.core"
local lines = require "sandkit.lines"
local agent_session = require "support.agent_session"

--- The NDJSON line of an output frame.
local function frame(t, seq, data)
  return string.format('{"t":"%s","seq":%d,"data":"%s"}\n', t, seq, core.b64encode(data))
end

--- A fake agent whose exec answers with these body chunks, then (unless cut) an exit frame.
local function agent_sending(chunks, cut)
  local quoted = {}
  for i, c in ipairs(chunks) do quoted[i] = string.format("%q", c) end
  return agent_session.open(string.format([[function(req, conn)
    respond.chunked_start(conn, "200 OK")
    for _, c in ipairs({ %s }) do respond.chunk(conn, c) end
    if %s then return conn:close() end
    respond.chunk(conn, '{"t":"exit","code":3}\n')
    respond.chunked_end(conn)
  end]], table.concat(quoted, ", "), tostring(cut == true)))
end

local function shape(items)
  local out = {}
  for i, item in ipairs(items) do
    if item.type == "exit" then out[i] = "exit " .. item.code
    elseif item.type then out[i] = string.format("%s %d %q", item.type, item.seq, item.data)
    else out[i] = "error " .. item.code end
  end
  return out
end

describe("lines = true", function()
  local server
  after_each(function() if server then server:stop() end end)

  it("yields one frame per whole line, in the order lines end, the unterminated last line before exit", function()
    local session
    session, server = agent_sending({ frame("stdout", 0, "hel"), frame("stderr", 1, "warn"),
      frame("stdout", 2, "lo\nwor") .. frame("stdout", 3, "ld\nlast"), frame("stderr", 4, "ing\n") })
    local items = agent_session.collect(session, { "x" }, { timeout = 5, lines = true })
    assert.same({
      'stdout 2 "hello\\\n"',
      'stdout 3 "world\\\n"',
      'stderr 4 "warning\\\n"',
      'stdout 3 "last"',
      "exit 3",
    }, shape(items))
  end)

  it("leaves frames as chunks without it", function()
    local session
    session, server = agent_sending({ frame("stdout", 0, "a\nb"), frame("stdout", 1, "c\n") })
    local items = agent_session.collect(session, { "x" }, { timeout = 5 })
    assert.same({ 'stdout 0 "a\\\nb"', 'stdout 1 "c\\\n"', "exit 3" }, shape(items))
  end)

  it("hands on a line longer than its bound in pieces, so memory stays bounded", function()
    local saved = lines.MAX_LINE
    lines.MAX_LINE = 8
    local session
    session, server = agent_sending({ frame("stdout", 0, "abcdefghij"), frame("stdout", 1, "klmnopqrstu\nv\n") })
    local ok, items = pcall(agent_session.collect, session, { "x" }, { timeout = 5, lines = true })
    lines.MAX_LINE = saved
    assert(ok, items)
    assert.same({ 'stdout 0 "abcdefgh"', 'stdout 1 "ijklmnop"', 'stdout 1 "qrstu\\\n"', 'stdout 1 "v\\\n"',
      "exit 3" }, shape(items))
  end)

  it("delivers the partial line that arrived before a stream failed, then raises", function()
    local session
    session, server = agent_sending({ frame("stdout", 0, "one\ntw") }, true)
    local items = agent_session.collect(session, { "x" }, { timeout = 5, lines = true })
    assert.same({ 'stdout 0 "one\\\n"', 'stdout 0 "tw"', "error SANDBOX_OUTCOME_UNKNOWN" }, shape(items))
  end)
end)
