--- Streaming: one command writes 1 GiB of output; three readers take it.
--   sandkit  for frame in session:run(argv) do count bytes end   (a local session)
--   curl     curl -sN reading the same agent's POST /v1/exec body into /dev/null
--   floor    the same command piped locally into cat >/dev/null: no agent, no HTTP, no base64
-- Each reader runs ROUNDS times, interleaved, and its fastest round is kept (other work on the
-- machine only ever slows a round down). MB/s counts the command's output bytes (1 GiB), not
-- the base64 and JSON on the wire. CPU seconds of the client and of the agent are kept too:
-- they tell which side limited a number.
--   lua5.4 bench/stream.lua [ISOLATE [MEMORY]]   (ISOLATE: bwrap, the default, or none; MEMORY:
--                                                the session's memory limit in bytes)
-- Prints RESULT { bytes, isolate, memory, sandkit = {…}, curl = {…} | missing, floor = {…} }.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local ROUNDS = 2
local BYTES = common.GIB
local ARGV = { "head", "-c", tostring(BYTES), "/dev/zero" }
local SHELL = table.concat(ARGV, " ")
local TIMEOUT = 300
local ISOLATE = arg[1] or "bwrap"
local MEMORY = arg[2] and math.floor(tonumber(arg[2]))

local function cpu_sum(pid)
  local user, sys = common.cpu(pid)
  return user + sys
end

--- Runs fn() and returns its wall seconds with the CPU seconds the client and the agent spent.
local function measured(agent_pid, fn)
  local client0, agent0 = cpu_sum("self"), cpu_sum(agent_pid)
  local t0 = common.now()
  local got = fn()
  local wall = common.now() - t0
  return { seconds = wall, bytes = got, client_cpu = cpu_sum("self") - client0,
    agent_cpu = cpu_sum(agent_pid) - agent0 }
end

local function via_sandkit(session)
  local n = 0
  for frame in session:run(ARGV, { timeout = TIMEOUT }) do
    local data = frame.data
    if data then n = n + #data end
  end
  return n
end

--- curl takes its headers from a private file, so the token never shows in a process list.
local function curl_command(session, dir)
  local headers = dir .. "/curl-headers"
  os.remove(headers)
  assert(core.write_private(headers, "Authorization: Bearer " .. session.record.token
    .. "\nContent-Type: application/json\n"))
  local body = dir .. "/curl-body.json"
  local f = assert(io.open(body, "wb"))
  f:write(string.format('{"command":["%s"],"timeoutMs":%d}', table.concat(ARGV, '","'), TIMEOUT * 1000))
  f:close()
  local reach, base = common.agent_address(session.record)
  return string.format("curl -sN %s-o /dev/null -w '%%{http_code} %%{size_download}' -H @%s --data-binary @%s "
    .. "%s/v1/exec", reach, headers, body, base)
end

local function via_curl(command)
  local p = assert(io.popen(command))
  local out = p:read("a")
  local ok = p:close()
  local status, size = out:match("^(%d+) (%d+)")
  if not ok or status ~= "200" then error("curl failed: " .. tostring(out)) end
  -- The body is base64 in NDJSON: 1 GiB of output is at least 4/3 GiB on the wire.
  if tonumber(size) < math.floor(BYTES * 4 / 3) then error("curl read a short body: " .. size .. " bytes") end
  return BYTES
end

local function via_pipe()
  local ok = os.execute(SHELL .. " | cat >/dev/null")
  if not ok then error("the local pipe failed") end
  return BYTES
end

local function best(runs)
  local fastest
  for _, r in ipairs(runs) do
    if not fastest or r.seconds < fastest.seconds then fastest = r end
  end
  fastest.mb_per_s = BYTES / fastest.seconds / common.MB
  fastest.rounds = {}
  for i, r in ipairs(runs) do fastest.rounds[i] = BYTES / r.seconds / common.MB end
  return fastest
end

common.result(common.with_sandbox(function(sandbox, sessions)
  local session = sessions.create(MEMORY and { limits = { memory = MEMORY } } or nil)
  local pid = session.record.pid
  local have_curl = os.execute("curl --version >/dev/null 2>&1")
  local curl = have_curl and curl_command(session, sandbox.provider:dir(session.id))
  local runs = { sandkit = {}, curl = {}, floor = {} }
  for _ = 1, ROUNDS do
    local r = measured(pid, function() return via_sandkit(session) end)
    assert(r.bytes == BYTES, "sandkit delivered " .. r.bytes .. " bytes, not " .. BYTES)
    table.insert(runs.sandkit, r)
    if curl then table.insert(runs.curl, measured(pid, function() return via_curl(curl) end)) end
    table.insert(runs.floor, measured(pid, via_pipe))
  end
  return {
    bytes = BYTES,
    isolate = ISOLATE,
    memory = MEMORY,
    command = SHELL,
    sandkit = best(runs.sandkit),
    curl = curl and best(runs.curl) or "missing",
    floor = best(runs.floor),
  }
end, ISOLATE))
