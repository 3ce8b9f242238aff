--- One tour of a session's interactive jobs, for the specs of every provider with an agent: input
-- written and resent (taken once), a terminal resized, a job signalled, frames followed live,
-- the list. run(session) -> what it saw; check(seen) asserts it (luassert, which a spec shares;
-- run alone is also what an nginx worker's handler calls, where luassert is not loaded).

local interactive_roundtrip = {}

function interactive_roundtrip.run(session)
  local seen = {}
  local p = assert(session:spawn({ "cat" }, { timeout = 60, stdin = true }))
  local frames = p:frames()
  assert(p:write("live\n"))
  seen.first = frames().data
  assert(p:write("live\nmore\n", 0))
  assert(p:close_stdin())
  local rest = {}
  for frame in frames do rest[#rest + 1] = frame.type == "exit" and ("exit " .. frame.code) or frame.data end
  seen.rest = table.concat(rest)
  local t = assert(session:spawn({ "sh", "-c", "read x; stty size" }, { timeout = 60, pty = { cols = 80, rows = 24 } }))
  assert(t:resize(132, 43))
  assert(t:write("\r"))
  local out = {}
  for frame in t:frames() do if frame.data then out[#out + 1] = frame.data end end
  seen.size = table.concat(out):match("(%d+ %d+)")
  local sleeper = assert(session:spawn({ "sleep", "30" }, { timeout = 60 }))
  assert(sleeper:signal("INT"))
  seen.code, seen.signal = sleeper:wait()
  seen.jobs = {}
  for _, job in ipairs(assert(session:jobs())) do seen.jobs[job.id] = job end
  seen.ids = { p.id, t.id, sleeper.id }
  return seen
end

function interactive_roundtrip.check(seen)
  local assert = require "luassert"
  assert.equal("live\n", seen.first)
  assert.equal("more\nexit 0", seen.rest)
  assert.equal("43 132", seen.size)
  assert.equal(130, seen.code)
  assert.equal(2, seen.signal)
  local cat, terminal = seen.jobs[seen.ids[1]], seen.jobs[seen.ids[2]]
  assert.is_true(cat.stdin)
  assert.equal(#"live\nmore\n", cat.stdin_offset)
  assert.is_true(terminal.pty)
  assert.is_false(seen.jobs[seen.ids[3]].running)
end

return interactive_roundtrip
