--- Latency: round trips of `true` on a warm local session, against spawning `true` locally.
--   sandkit  session:exec({ "true" }) — a fresh connection, the request, the agent's fork and
--            exec, the exit frame back (a command may only be sent on a fresh connection:
--            a pooled one could be silently resent by libcurl and run it twice)
--   spawn    core.spawn({ "true" }) + core.reap(pid, true): posix_spawn and waitpid
-- WARMUP pairs first (connections, page cache, the agent's allocator), then COUNT timed pairs.
-- The two alternate, one round trip then one spawn: run as two blocks, whichever went second
-- would meet a machine in another state (caches warm for it, or someone else's tests started),
-- and the difference between them would measure that.
--   lua5.4 bench/latency.lua
-- Then COUNT round trips alone, for what each costs this process (the client): its user and
-- system CPU and how often it slept, from /proc/self — the spawns would count there too.
-- Prints RESULT { count, sandkit = { p50, p99, mean }, spawn = { … } } in milliseconds, and
-- client = { user_us, system_us, sleeps } per round trip.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local COUNT = 1000
local WARMUP = 50

local function summary(samples)
  local sum = 0
  for _, v in ipairs(samples) do sum = sum + v end
  local mean = sum / #samples
  return { p50 = common.percentile(samples, 50) * 1000, p99 = common.percentile(samples, 99) * 1000,
    mean = mean * 1000, max = samples[#samples] * 1000 }
end

--- How many times this process has given up its CPU to wait.
local function voluntary_switches()
  return tonumber(common.read_file("/proc/self/status"):match("\nvoluntary_ctxt_switches:%s*(%d+)"))
end

--- Runs a and b alternately n times; returns the seconds each call of each took.
local function alternating(n, a, b)
  local sa, sb = {}, {}
  for i = 1, n do
    local t0 = common.now()
    a()
    local t1 = common.now()
    b()
    sa[i], sb[i] = t1 - t0, common.now() - t1
  end
  return sa, sb
end

common.result(common.with_sandbox(function(_, sessions)
  local session = sessions.create()
  local function round_trip()
    local r = assert(session:exec({ "true" }, { timeout = 10 }))
    assert(r.code == 0, "true exited " .. tostring(r.code))
  end
  local function spawn()
    local pid = assert(core.spawn({ "true" }))
    core.reap(pid, true)
  end
  alternating(WARMUP, round_trip, spawn)
  local sandkit, local_spawn = alternating(COUNT, round_trip, spawn)
  local user0, system0 = common.cpu("self")
  local sleeps0 = voluntary_switches()
  for _ = 1, COUNT do round_trip() end
  local user1, system1 = common.cpu("self")
  local per = 1e6 / COUNT
  return { count = COUNT, sandkit = summary(sandkit), spawn = summary(local_spawn),
    client = { user_us = (user1 - user0) * per, system_us = (system1 - system0) * per,
      sleeps = (voluntary_switches() - sleeps0) / COUNT } }
end))
