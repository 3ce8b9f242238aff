--- Fan-out: N commands streaming 8 MiB each, all at once from one Lua state (sandkit.run and
-- sandkit.spawn, one task per stream), against sessions created before the clock starts.
--   lua5.4 bench/fanout.lua N [ISOLATE]      (ISOLATE: bwrap, the default, or none)
--   lua5.4 bench/fanout.lua N compare        (confined sessions against unconfined ones, their
--                                             rounds alternating, so both are of the same minutes)
--   lua5.4 bench/fanout.lua at-once N…       (every round 128 streams of 8 MiB, N of them at
--                                             once, a stream starting as one ends: each N moves
--                                             the same bytes through the same set-ups, and the
--                                             rounds alternate between the Ns, so that what
--                                             differs is only how many run at once, in the same
--                                             minutes)
-- Run once per N in a process of its own, so the peak RSS it reports (VmHWM) is what this
-- many streams cost and nothing else; at-once reports the peak after each N's first round,
-- the Ns taken from fewest to most at once.
--
-- Streams share min(N, SESSIONS) sessions, round-robin. Each local session is an agent
-- process with one event loop; 128 agents would measure how a 2-core machine schedules 128
-- processes, one agent would measure one event loop serving 128 commands. A fixed 16 keeps
-- the server side the same from 16 streams to 128 (1 stream per agent, then 8), so what
-- changes with N is the client: one runner, one libcurl multi handle, one poll over every
-- transfer — the thing this benchmark is about.
-- Prints RESULT { streams, sessions, bytes, mb_per_s (best of ROUNDS), rounds, rss_* }, or with
-- compare RESULT { streams, sessions, bytes, confined = { mb_per_s, rounds }, unconfined = {…} },
-- or with at-once RESULT { streams, sessions, bytes, [N] = { mb_per_s, rounds, rss_peak }, … }.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local sandkit = require "sandkit"

local USAGE = "usage: fanout.lua STREAMS [ISOLATE | compare] | fanout.lua at-once N…"
local AT_ONCE = arg[1] == "at-once"
--- Streams in an at-once round: as many as the most the plain mode runs at once.
local AT_ONCE_STREAMS = 128
local COUNTS = {}
if AT_ONCE then
  for i = 2, #arg do COUNTS[#COUNTS + 1] = assert(tonumber(arg[i]), USAGE) end
  assert(#COUNTS > 0, USAGE)
  table.sort(COUNTS)
  for _, n in ipairs(COUNTS) do assert(n >= 1 and n <= AT_ONCE_STREAMS, "at-once N is 1 to " .. AT_ONCE_STREAMS) end
end
local N = AT_ONCE and AT_ONCE_STREAMS or assert(tonumber(arg[1]), USAGE)
local COMPARE = arg[2] == "compare"
local ISOLATE = not COMPARE and not AT_ONCE and arg[2] or "bwrap"
local SESSIONS = 16
local PER_STREAM = 8 * common.MIB
local ARGV = { "head", "-c", tostring(PER_STREAM), "/dev/zero" }
local ROUNDS = 5

--- One round of N streams, at most at_once of them running (a task per slot, each taking the
-- next stream as its last one ends): the aggregate MB/s.
local function round(sessions, at_once)
  local t0 = common.now()
  local started = 0
  local _, total = assert(sandkit.run(function()
    local tasks = {}
    for slot = 1, at_once or N do
      tasks[slot] = sandkit.spawn(function()
        local got = 0
        while started < N do
          started = started + 1
          local session = sessions[(started - 1) % #sessions + 1]
          for frame in session:run(ARGV, { timeout = 300 }) do
            local data = frame.data
            if data then got = got + #data end
          end
        end
        return got
      end)
    end
    local sum = 0
    for _, task in ipairs(tasks) do sum = sum + assert(task:join()) end
    return sum
  end))
  local seconds = common.now() - t0
  assert(total == N * PER_STREAM, "streams delivered " .. total .. " bytes, not " .. N * PER_STREAM)
  return total / seconds / common.MB
end

--- Every round's rate (MB/s) and the fastest.
local function fastest(rates)
  local best = 0
  for _, rate in ipairs(rates) do best = math.max(best, rate) end
  return { mb_per_s = best, rounds = rates }
end

common.result(common.with_sandbox(function(_, made)
  local sessions, others = {}, {}
  for i = 1, math.min(N, SESSIONS) do
    sessions[i] = made.create()
    if COMPARE then others[i] = made.create(nil, "none") end
  end
  local rss_setup = common.status_bytes("self", "VmHWM")
  if AT_ONCE then
    local result = { streams = N, sessions = #sessions, bytes = N * PER_STREAM, rss_setup = rss_setup }
    for _, n in ipairs(COUNTS) do result[tostring(n)] = { rounds = {} } end
    for r = 1, ROUNDS do
      for _, n in ipairs(COUNTS) do
        local this = result[tostring(n)]
        this.rounds[r] = round(sessions, n)
        if r == 1 then this.rss_peak = common.status_bytes("self", "VmHWM") end
      end
    end
    for _, n in ipairs(COUNTS) do
      local this = result[tostring(n)]
      this.mb_per_s = fastest(this.rounds).mb_per_s
    end
    return result
  end
  local rates, other_rates = {}, {}
  for r = 1, ROUNDS do
    rates[r] = round(sessions)
    if COMPARE then other_rates[r] = round(others) end
  end
  local result = fastest(rates)
  if COMPARE then
    return { streams = N, sessions = #sessions, bytes = N * PER_STREAM, confined = result,
      unconfined = fastest(other_rates) }
  end
  return { streams = N, sessions = #sessions, isolate = ISOLATE, bytes = N * PER_STREAM, mb_per_s = result.mb_per_s,
    rounds = rates, rss_setup = rss_setup, rss_peak = common.status_bytes("self", "VmHWM") }
end, ISOLATE))
