-- sandkit-agent's --lifetime-file against the real binary: the end it keeps on its own clock,
-- moved either way by SIGHUP, the file's bounds at start and at a reread, and SIGHUP ignored
-- without one.

local A = require "support.agent_process"
local files = require "support.files"

--- The end the agent reads, as the local provider writes it: padded in place, never truncated.
local function write_end(path, text)
  local f = io.open(path, "r+b") or assert(io.open(path, "wb"))
  assert(f:write(text))
  f:close()
end

local function lifetime_file(text)
  local path = A.tmpdir() .. "/lifetime"
  write_end(path, text)
  return path
end

--- Whether the agent still answers health.
local function serves(agent)
  return agent:req("GET", "/v1/health").status == 200
end

describe("sandkit-agent --lifetime-file", function()
  it("stops at the end the file names, exiting 0 as on SIGTERM", function()
    -- Three seconds away: an agent started on a loaded machine must still be seen serving first.
    local path = lifetime_file(string.format("%d\n", os.time() + 3))
    local agent = assert(A.start_agent{ args = { "--lifetime-file", path } })
    assert.is_true(serves(agent))
    assert.is_true(A.within(15, function() return not A.pid_alive(agent.pid) end), "it left at its end")
    local log = files.read(agent.log)
    assert.equal(0, agent:stop())
    assert.matches("the session's lifetime ended", log)
  end)

  it("has no end with an empty file, and takes one, later moved sooner, on SIGHUP", function()
    local path = lifetime_file("")
    local agent = assert(A.start_agent{ args = { "--lifetime-file", path } })
    write_end(path, string.format("%-19d\n", os.time() + 3600))
    os.execute("kill -HUP " .. agent.pid)
    assert.is_true(A.within(5, function()
      return (files.read(agent.log) or ""):find("the session ends at", 1, true) ~= nil
    end))
    assert.is_true(serves(agent), "an hour away, it still serves")
    write_end(path, string.format("%-19d\n", os.time() + 1))
    os.execute("kill -HUP " .. agent.pid)
    assert.is_true(A.within(10, function() return not A.pid_alive(agent.pid) end), "it left at its new end")
    assert.equal(0, agent:stop())
  end)

  it("keeps its end when the file read again on SIGHUP is not one", function()
    local path = lifetime_file(string.format("%-19d\n", os.time() + 3600))
    local agent = assert(A.start_agent{ args = { "--lifetime-file", path } })
    for _, bad in ipairs{ "soon\n", "253402300800\n", ("9"):rep(40) .. "\n", "12 34\n" } do
      write_end(path, bad .. (" "):rep(20))
      os.execute("kill -HUP " .. agent.pid)
    end
    assert.is_true(A.within(5, function()
      local _, n = (files.read(agent.log) or ""):gsub("the session keeps its end", "")
      return n == 4
    end), "each unreadable end was logged and refused")
    assert.is_true(serves(agent))
    agent:stop()
  end)

  it("refuses to start with a file that names no end within bounds", function()
    for _, bad in ipairs{ "soon\n", "253402300800\n", ("1"):rep(33), "1\n2\n", "1\0\n" } do
      local agent, log, status = A.start_agent{ args = { "--lifetime-file", lifetime_file(bad) } }
      assert.is_nil(agent, bad)
      assert.equal(2, status)
      assert.matches("lifetime%-file", log)
    end
    local agent, log, status = A.start_agent{ args = { "--lifetime-file", "/nonexistent/lifetime" } }
    assert.is_nil(agent)
    assert.equal(2, status)
    assert.matches("cannot open", log)
  end)

  it("ignores SIGHUP without a lifetime file", function()
    local agent = assert(A.start_agent{})
    os.execute("kill -HUP " .. agent.pid)
    assert.is_true(serves(agent), "SIGHUP did not end it")
    assert.equal(0, agent:stop())
  end)
end)
