--- Confinement: what a confined local session (the provider's default) costs.
--   create  sandbox:create{} until its first session:exec({ "true" }) returned, confined and
--           unconfined (isolate = "none"), CREATES of each, alternating; each session is
--           terminated after, off the clock
--   exec    session:exec({ "true" }) on a warm confined session, against spawning bubblewrap
--           around `true` with namespaces and mounts of its own — what every command would pay
--           if it got a sandbox of its own instead of joining the session's: WARMUP pairs, then
--           COUNT pairs, alternating (see latency.lua for why)
--   lua5.4 bench/confine.lua
-- Prints RESULT { create = { confined = {…}, unconfined = {…} }, exec = { sandkit = {…},
-- bwrap = {…} } }, each { p50, p99, mean, max } in milliseconds.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local CREATES = 20
local COUNT = 300
local WARMUP = 20
--- A sandbox of bubblewrap's own for one `true`, built as the session's is (src/agent/confine.c):
-- a user namespace with uid 1000, its own PID, IPC, network and UTS namespaces, /usr read-only
-- and the merged-/usr links, /proc, /dev and a /tmp.
local BWRAP = { "/usr/bin/bwrap", "--unshare-user", "--uid", "1000", "--gid", "1000", "--unshare-pid",
  "--unshare-ipc", "--unshare-net", "--unshare-uts", "--die-with-parent", "--ro-bind", "/usr", "/usr",
  "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
  "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--", "/usr/bin/true" }

local function summary(samples)
  local sum = 0
  for _, v in ipairs(samples) do sum = sum + v end
  local mean = sum / #samples
  return { p50 = common.percentile(samples, 50) * 1000, p99 = common.percentile(samples, 99) * 1000,
    mean = mean * 1000, max = samples[#samples] * 1000 }
end

--- Seconds from create to the first exec's answer, in sandbox sb.
local function create_to_exec(sb)
  local t0 = common.now()
  local session = assert(sb:create{})
  local r = assert(session:exec({ "true" }, { timeout = 10 }))
  local seconds = common.now() - t0
  assert(r.code == 0, "true exited " .. tostring(r.code))
  assert(sb:terminate(session.id))
  return seconds
end

local function spawn_bwrap()
  local pid = assert(core.spawn(BWRAP))
  local _, status = core.reap(pid, true)
  assert(status == 0, "bubblewrap could not run true here: status " .. tostring(status))
end

local confined, unconfined = common.sandbox(), common.sandbox("none")
local create = { confined = {}, unconfined = {} }
for i = 1, CREATES do
  create.confined[i] = create_to_exec(confined)
  create.unconfined[i] = create_to_exec(unconfined)
end

common.result(common.with_sandbox(function(_, sessions)
  local session = sessions.create()
  local function round_trip()
    local r = assert(session:exec({ "true" }, { timeout = 10 }))
    assert(r.code == 0, "true exited " .. tostring(r.code))
  end
  local sandkit, bwrap = {}, {}
  for i = 1, WARMUP + COUNT do
    local t0 = common.now()
    round_trip()
    local t1 = common.now()
    spawn_bwrap()
    if i > WARMUP then sandkit[i - WARMUP], bwrap[i - WARMUP] = t1 - t0, common.now() - t1 end
  end
  return { create = { confined = summary(create.confined), unconfined = summary(create.unconfined) },
    exec = { count = COUNT, sandkit = summary(sandkit), bwrap = summary(bwrap) } }
end))
