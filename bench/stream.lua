--- Streaming: one command writes 1 GiB of output; five readers take it.
--   sandkit     for frame in session:run(argv) do count bytes end   (a confined local session)
--   unconfined  the same in an unconfined session (isolate = "none"): what confinement costs
--   limited     the same in a confined session with a memory limit: what the limit costs
--   curl        curl -sN reading the confined session's POST /v1/exec body into /dev/null
--   floor       the same command piped locally into cat >/dev/null: no agent, no HTTP, no base64
-- Each reader runs ROUNDS times, interleaved, and its fastest round is kept (other work on the
-- machine only ever slows a round down): so each comparison is between rounds of the same
-- minute, not between two runs that a shared machine loads differently. MB/s counts the
-- command's output bytes (1 GiB), not the base64 and JSON on the wire. CPU seconds of the
-- client and of the agent are kept too: they tell which side limited a number.
--   lua5.4 bench/stream.lua [MEMORY]   (MEMORY: the limited session's memory limit in bytes,
--                                      DEFAULT_MEMORY unless given)
-- Prints RESULT { bytes, memory, command, sandkit = {…}, unconfined = {…}, limited = {…},
-- curl = {…} | missing, floor = {…} }.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local ROUNDS = 5
local BYTES = common.GIB
local ARGV = { "head", "-c", tostring(BYTES), "/dev/zero" }
local SHELL = table.concat(ARGV, " ")
local TIMEOUT = 300
local DEFAULT_MEMORY = 512 * common.MIB
local MEMORY = arg[1] and math.floor(assert(tonumber(arg[1]), "usage: stream.lua [MEMORY]")) or DEFAULT_MEMORY

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
  local session = sessions.create()
  local unconfined = sessions.create(nil, "none")
  local limited = sessions.create{ limits = { memory = MEMORY } }
  local pid = session.record.pid
  local have_curl = os.execute("curl --version >/dev/null 2>&1")
  local curl = have_curl and curl_command(session, sandbox.provider:dir(session.id))
  local runs = { sandkit = {}, unconfined = {}, limited = {}, curl = {}, floor = {} }
  local function read_through(name, s)
    local r = measured(s.record.pid, function() return via_sandkit(s) end)
    assert(r.bytes == BYTES, name .. ": sandkit delivered " .. r.bytes .. " bytes, not " .. BYTES)
    table.insert(runs[name], r)
  end
  local readers = {
    function() read_through("sandkit", session) end,
    function() if curl then table.insert(runs.curl, measured(pid, function() return via_curl(curl) end)) end end,
    function() read_through("unconfined", unconfined) end,
    function() table.insert(runs.floor, measured(pid, via_pipe)) end,
    function() read_through("limited", limited) end,
  }
  -- Each round starts one reader further on, so that no reader always follows the same one (a
  -- reader's round pays for what the one before it left: dirty pages, a core's caches).
  for round = 1, ROUNDS do
    for i = 1, #readers do readers[(round + i - 2) % #readers + 1]() end
  end
  return {
    bytes = BYTES,
    memory = MEMORY,
    command = SHELL,
    sandkit = best(runs.sandkit),
    unconfined = best(runs.unconfined),
    limited = best(runs.limited),
    curl = curl and best(runs.curl) or "missing",
    floor = best(runs.floor),
  }
end))
