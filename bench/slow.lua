--- Slow consumer: a command writes 1 GiB while the loop sleeps 1 ms after every frame. The
-- transfer's buffer fills, libcurl pauses the transfer, the agent stops reading the pipe, and
-- the command blocks on its writes: memory on both sides must stay flat however much the
-- command writes, and the command must be slowed to the reader's pace.
--   lua5.4 bench/slow.lua
-- Samples the client's and the agent's RSS every SAMPLE frames; reports peaks (VmHWM) and how
-- much RSS grew between the first tenth of the stream and the end.
-- Prints RESULT { bytes, seconds, frames, client = {…}, agent = {…} }.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local BYTES = common.GIB
local ARGV = { "head", "-c", tostring(BYTES), "/dev/zero" }
local PAUSE = 0.001
local SAMPLE = 256

common.result(common.with_sandbox(function(_, sessions)
  local session = sessions.create()
  local agent = session.record.pid
  local got, frames = 0, 0
  local early, late = {}, {}
  local function sample()
    local at = { client = common.status_bytes("self", "VmRSS"), agent = common.status_bytes(agent, "VmRSS") }
    -- RSS once a tenth has gone by is the reference: start-up allocations are behind it.
    if got < BYTES / 10 or not early.client then early = at end
    late.client = math.max(late.client or 0, at.client)
    late.agent = math.max(late.agent or 0, at.agent)
  end
  local t0 = common.now()
  for frame in session:run(ARGV, { timeout = 600 }) do
    local data = frame.data
    if data then
      got = got + #data
      frames = frames + 1
      if frames % SAMPLE == 0 then sample() end
      core.wait(nil, PAUSE)
    end
  end
  local seconds = common.now() - t0
  assert(got == BYTES, "the stream delivered " .. got .. " bytes, not " .. BYTES)
  return {
    bytes = got, frames = frames, seconds = seconds,
    command_mb_per_s = got / seconds / common.MB,
    client = { peak = common.status_bytes("self", "VmHWM"), rss_early = early.client,
      rss_late_max = late.client },
    agent = { peak = common.status_bytes(agent, "VmHWM"), rss_early = early.agent,
      rss_late_max = late.agent },
  }
end))
