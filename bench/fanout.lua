--- Fan-out: N commands streaming 8 MiB each, all at once from one Lua state (sandkit.run and
-- sandkit.spawn, one task per stream), against sessions created before the clock starts.
--   lua5.4 bench/fanout.lua N [ISOLATE]      (ISOLATE: bwrap, the default, or none)
--   lua5.4 bench/fanout.lua N compare        (confined sessions against unconfined ones, their
--                                             rounds alternating, so both are of the same minutes)
-- Run once per N in a process of its own, so the peak RSS it reports (VmHWM) is what this
-- many streams cost and nothing else.
--
-- Streams share min(N, SESSIONS) sessions, round-robin. Each local session is an agent
-- process with one event loop; 128 agents would measure how a 2-core machine schedules 128
-- processes, one agent would measure one event loop serving 128 commands. A fixed 16 keeps
-- the server side the same from 16 streams to 128 (1 stream per agent, then 8), so what
-- changes with N is the client: one runner, one libcurl multi handle, one poll over every
-- transfer — the thing this benchmark is about.
-- Prints RESULT { streams, sessions, bytes, mb_per_s (best of ROUNDS), rounds, rss_* }, or with
-- compare RESULT { streams, sessions, bytes, confined = { mb_per_s, rounds }, unconfined = {…} }.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local sandkit = require "sandkit"

local N = assert(tonumber(arg[1]), "usage: fanout.lua STREAMS [ISOLATE | compare]")
local COMPARE = arg[2] == "compare"
local ISOLATE = not COMPARE and arg[2] or "bwrap"
local SESSIONS = 16
local PER_STREAM = 8 * common.MIB
local ARGV = { "head", "-c", tostring(PER_STREAM), "/dev/zero" }
local ROUNDS = 5

local function round(sessions)
  local t0 = common.now()
  local _, total = assert(sandkit.run(function()
    local tasks = {}
    for i = 1, N do
      local session = sessions[(i - 1) % #sessions + 1]
      tasks[i] = sandkit.spawn(function()
        local got = 0
        for frame in session:run(ARGV, { timeout = 300 }) do
          local data = frame.data
          if data then got = got + #data end
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
