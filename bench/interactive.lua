--- Interactive jobs on a local session (docs/protocol.md §6.4):
--   echo     a byte written to a terminal job running `cat`, until the terminal's echo of it
--            comes back on the job's live stream: p:write, then stream:next (ECHO_ROUNDS)
--   stdin    256 MiB written to `wc -c`'s standard input with p:write and closed, until its exit
--            frame, against `curl -T` of the same bytes to the agent's raw file upload
--   follow   a process that prints CLOCK_MONOTONIC (python3's time.monotonic, the clock of
--            core.now) every 20 ms: how long after it printed the frame reaches the caller
--            following the job live (FOLLOW_LINES)
--   lua5.4 bench/interactive.lua
-- Prints RESULT { echo = { p50, p99 }, stdin = { sandkit, curl }, follow = { p50, p99 } } in
-- milliseconds and MB/s.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"
local protocol_jobs = require "sandkit.protocol_jobs"

local ECHO_ROUNDS = 500
local ECHO_WARMUP = 20
local STDIN_BYTES = 256 * common.MIB
local FOLLOW_LINES = 200

local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function ms_summary(samples)
  return { p50 = common.percentile(samples, 50) * 1000, p99 = common.percentile(samples, 99) * 1000,
    count = #samples }
end

--- Round trips of one keystroke through a terminal job's echo.
local function echo(session)
  local p = assert(session:spawn({ "cat" }, { timeout = 600, pty = { cols = 80, rows = 24 } }))
  local stream = assert(protocol_jobs.stream(session.conn, p.id, nil, 600))
  local samples = {}
  for i = 1, ECHO_WARMUP + ECHO_ROUNDS do
    local t0 = common.now()
    assert(p:write("x"))
    local got = ""
    while not got:find("x", 1, true) do
      local frame = assert(stream:next())
      got = got .. (frame.data or "")
    end
    if i > ECHO_WARMUP then samples[#samples + 1] = common.now() - t0 end
  end
  stream:close()
  assert(p:cancel())
  return ms_summary(samples)
end

local function stdin_rate(session)
  local block = string.rep("s", 4 * common.MIB)
  local t0 = common.now()
  local p = assert(session:spawn({ "wc", "-c" }, { timeout = 600, stdin = true }))
  for _ = 1, STDIN_BYTES / #block do assert(p:write(block)) end
  assert(p:close_stdin())
  local out = {}
  for frame in p:frames() do if frame.data then out[#out + 1] = frame.data end end
  local seconds = common.now() - t0
  assert(table.concat(out):match("%d+") == tostring(STDIN_BYTES), "wc -c counted every byte")
  return STDIN_BYTES / seconds / common.MB
end

local function curl_rate(session)
  local source = common.out .. "/interactive-stdin.bin"
  assert(os.execute("head -c " .. STDIN_BYTES .. " /dev/zero > " .. quote(source)))
  local headers = common.out .. "/interactive-headers"
  os.remove(headers)
  assert(core.write_private(headers, "Authorization: Bearer " .. session.record.token .. "\n"))
  local reach, base = common.agent_address(session.record)
  local url = base .. "/v1/files/raw?path=/upload.bin"
  local t0 = common.now()
  assert(os.execute("curl -s " .. reach .. "-o /dev/null -T " .. quote(source) .. " -H @" .. quote(headers) .. " "
    .. quote(url)))
  local seconds = common.now() - t0
  os.remove(source)
  os.remove(headers)
  return STDIN_BYTES / seconds / common.MB
end

--- Delay from a line's printing to its frame reaching this process, followed live.
local function follow(session)
  local p = assert(session:spawn({ "python3", "-u", "-c", string.format(
    "import time\nfor _ in range(%d):\n  print(repr(time.monotonic()))\n  time.sleep(0.02)", FOLLOW_LINES) },
    { timeout = 600 }))
  local samples = {}
  for frame in p:frames() do
    local now = common.now()
    if frame.type == "stdout" then
      for stamp in frame.data:gmatch("([%d%.]+)\n") do samples[#samples + 1] = now - tonumber(stamp) end
    end
  end
  return ms_summary(samples)
end

common.result(common.with_sandbox(function(_, sessions)
  local session = sessions.create()
  local best_sandkit, best_curl = 0, 0
  for _ = 1, 2 do
    best_sandkit = math.max(best_sandkit, stdin_rate(session))
    best_curl = math.max(best_curl, curl_rate(session))
  end
  return { echo = echo(session), stdin = { sandkit = best_sandkit, curl = best_curl, bytes = STDIN_BYTES },
    follow = follow(session) }
end))
