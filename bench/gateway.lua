--- Streaming through an nginx gateway: examples/openresty (sandkit inside one nginx worker,
-- started by its run.sh) between a local agent and `curl -sN`.
--   lua5.4 bench/gateway.lua stream     1 GiB (`head -c`) read by curl -sN through the gateway's
--                                       server-sent events, and by curl -sN straight from the
--                                       same agent's /v1/exec; ROUNDS each, interleaved, best kept
--   lua5.4 bench/gateway.lua fanout N…  128 streams of 8 MiB (1 GiB), N of them at once: a stream
--                                       starts as soon as one ends, so every N pays the same 128
--                                       set-ups (a request, an agent's spawn, a response head)
--                                       and moves the same bytes, and only how many run at once
--                                       differs. Read by one curl --parallel --parallel-max N
--                                       (one client process, as a proxy in front would be),
--                                       round-robin over min(N, 16) sessions (as
--                                       bench/fanout.lua); best aggregate of ROUNDS. Each N
--                                       has a gateway of its own (its worker's peak RSS is
--                                       that N's) and the rounds alternate between them, so
--                                       that every N is measured in the same minutes. With
--                                       SANDKIT_GATEWAY_READER=python the reader is
--                                       peers/sse_reader.py instead of curl
-- MB/s counts the command's output bytes, not base64 and framing. Reported with each: the CPU
-- seconds the nginx worker, the agent(s), their commands and the reader spent, and the worker's
-- peak RSS (VmHWM).
-- SANDKIT_BUILD names the build directory (make bench sets it); SANDKIT_AGENT the agent.
-- Prints RESULT { … } for stream, RESULT { [N] = { … }, … } for fanout.

local here = arg[0]:match("^(.*)/[^/]*$") or "."
-- The specs' helpers for processes and ports are the one place for them.
package.path = here .. "/?.lua;" .. here .. "/../spec/?.lua;" .. package.path
local cjson = require "cjson"
local common = require "common"
local core = require "sandkit.core"
local processes = require "support.processes"

local MODE = arg[1]
assert(MODE == "stream" or MODE == "fanout", "usage: gateway.lua stream | fanout N…")
local ROUNDS = 3
--- Streams running at once, in each gateway.
local COUNTS = { 1 }
if MODE == "fanout" then
  COUNTS = {}
  for i = 2, #arg do COUNTS[#COUNTS + 1] = assert(tonumber(arg[i]), "usage: gateway.lua fanout N…") end
  assert(#COUNTS > 0, "usage: gateway.lua fanout N…")
end
--- Streams in a round: a fan-out's are as many at every N, so that its rounds differ only in
-- how many run at once. Each stream costs a set-up that no byte count repays (about 7.5 ms of
-- CPU on the machine of bench/RESULTS.md, most of it the command's own spawn): rounds of
-- 1 GiB as 16 streams of 64 MiB and 128 of 8 MiB differed by 112 of them.
local STREAMS = MODE == "fanout" and 128 or 1
for _, n in ipairs(COUNTS) do assert(n >= 1 and n <= STREAMS, "gateway.lua fanout N: N is 1 to " .. STREAMS) end
--- Bytes per stream: the whole gibibyte for one stream, its share of one for a fan-out.
local BYTES = math.floor(common.GIB / STREAMS)
local SESSIONS = 16
--- What reads the streams: "curl" (curl --parallel), or "python" (bench/peers/sse_reader.py,
-- whose cost per byte does not grow with the number of streams, to tell the reader's share of a
-- fan-out's time from the gateway's).
local READER = os.getenv("SANDKIT_GATEWAY_READER") or "curl"
assert(READER == "curl" or READER == "python", "SANDKIT_GATEWAY_READER is curl or python")
local TIMEOUT = 300
local TOKEN = string.rep("ab", 16)
--- Seconds the gateway gets to listen, and to stop.
local START_TIMEOUT, STOP_TIMEOUT = 20, 10

--- Starts examples/openresty/run.sh with its temp directory inside dir; returns the gateway.
local function start_gateway(dir)
  local g = { port = processes.free_port(), dir = dir }
  g.pid = assert(core.spawn({ "sh", common.dir .. "/../examples/openresty/run.sh" }, { setsid = true,
    stdout = dir .. "/gateway.log", stderr = dir .. "/gateway.log", env = {
      PATH = os.getenv("PATH"), PORT = tostring(g.port), TMPDIR = dir, SANDKIT_NO_BUILD = "1",
      BUILD = assert(os.getenv("SANDKIT_BUILD"), "set SANDKIT_BUILD (make bench does)"),
      SANDKIT_AGENT = os.getenv("SANDKIT_AGENT"), SANDKIT_GATEWAY_TOKEN = TOKEN,
      SANDKIT_OUTPUT_CAP = tostring(common.OUTPUT_CAP) } }))
  if not processes.listening(g.port, g.pid, START_TIMEOUT) then
    processes.stop(g.pid, STOP_TIMEOUT)
    error("the gateway did not start:\n" .. tostring(common.read_file(dir .. "/gateway.log")))
  end
  -- nginx listens before it forks its worker.
  processes.within(START_TIMEOUT, function()
    local master = processes.children(g.pid)[1]
    g.worker = master and processes.children(master)[1]
    return g.worker
  end)
  if not g.worker then
    processes.stop(g.pid, STOP_TIMEOUT)
    error("no nginx worker found")
  end
  return g
end

--- SIGTERM: run.sh stops nginx and every session's agent, and removes its directory.
local function stop_gateway(g)
  processes.stop(g.pid, STOP_TIMEOUT)
end

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  f:write(text)
  f:close()
end

--- The CPU seconds of a reader, as the shell that ran it (below) printed them: `times` prints
-- the shell's own user and system time, then its children's.
local function reader_cpu(path)
  local text = common.read_file(path) or ""
  local um, us, sm, ss = text:match("(%d+)m([%d.]+)s (%d+)m([%d.]+)s%s*$")
  if not um then error("no times from the reader:\n" .. text) end
  return tonumber(um) * 60 + tonumber(us) + tonumber(sm) * 60 + tonumber(ss)
end

--- One curl reading the urls, n at once (--parallel), each body to /dev/null; returns wall
-- seconds and the reader's CPU seconds, having checked that each read a whole body.
local function curl(urls, n, headers_file, body_file, out, socket)
  -- The URLs go in a config file: 128 of them would not fit an argv sandkit's spawn takes.
  local config = {}
  for _, url in ipairs(urls) do
    config[#config + 1] = string.format('url = "%s"\noutput = "/dev/null"', url)
      .. (socket and string.format('\nunix-socket = "%s"', socket) or "")
  end
  write(out .. ".config", table.concat(config, "\n") .. "\n")
  os.remove(out)
  local argv = { "curl", "-sN", "--parallel", "--parallel-immediate", "--parallel-max", tostring(n),
    "-w", "%{http_code} %{size_download}\n", "-H", "@" .. headers_file, "--data-binary", "@" .. body_file,
    "--config", out .. ".config" }
  if READER == "python" then
    assert(not socket, "the python reader reaches the gateway only, not an agent's Unix socket")
    argv = { "python3", here .. "/peers/sse_reader.py", headers_file, body_file, out .. ".config", tostring(n) }
  end
  -- Through a shell that says what its child cost, which its stderr carries alone (curl's
  -- progress meter, which --parallel shows despite -s, goes to a file of its own).
  table.insert(argv, 1, "sh")
  table.insert(argv, 2, "-c")
  table.insert(argv, 3, '"$@" 2>"$0.progress"; s=$?; times >&2; exit $s')
  table.insert(argv, 4, out)
  local t0 = common.now()
  core.reap(assert(core.spawn(argv, { stdout = out, stderr = out .. ".times" })), true)
  local seconds = common.now() - t0
  local ended = 0
  for status, size in (common.read_file(out) or ""):gmatch("(%d+) (%d+)\n") do
    if status ~= "200" or tonumber(size) < math.floor(BYTES * 4 / 3) then
      error("a stream read " .. status .. " with " .. size .. " bytes")
    end
    ended = ended + 1
  end
  if ended ~= #urls then error(ended .. " of " .. #urls .. " streams ended") end
  return seconds, reader_cpu(out .. ".times")
end

--- A process's CPU seconds, and those of the children it reaped.
local function cpu_sum(pid)
  local user, sys, children_user, children_sys = common.cpu(pid)
  return (user or 0) + (sys or 0), (children_user or 0) + (children_sys or 0)
end

--- A gateway started in dir for n streams at once, its sessions made, added to setups (which
-- stops it whatever fails after): { g, dir, round, result }, round() measuring one round (and,
-- for stream, one straight from the agent), result() the best of the rounds.
local function prepare(setups, dir, n)
  os.execute("rm -rf '" .. dir .. "' && mkdir -p '" .. dir .. "'")
  local g = start_gateway(dir)
  local setup = { g = g, dir = dir }
  setups[#setups + 1] = setup
  local auth = dir .. "/auth"
  write(auth, "Authorization: Bearer " .. TOKEN .. "\nContent-Type: application/json\n")
  local sessions = {}
  for i = 1, math.min(n, SESSIONS) do
    local p = assert(io.popen("curl -s -X POST -H @" .. auth .. " http://127.0.0.1:" .. g.port .. "/sessions"))
    local answer = p:read("*a")
    p:close()
    sessions[i] = assert(cjson.decode(answer).id, answer)
  end
  local argv = { "head", "-c", tostring(BYTES), "/dev/zero" }
  write(dir .. "/run.json", cjson.encode{ argv = argv, timeout = TIMEOUT })
  local gateway_urls = {}
  for i = 1, STREAMS do
    gateway_urls[i] = string.format("http://127.0.0.1:%d/sessions/%s/run", g.port,
      sessions[(i - 1) % #sessions + 1])
  end
  -- Straight from the agent: its socket (or port) and token from the session's record (run.sh keeps its
  -- state in a directory of its own under TMPDIR).
  local state = assert(io.popen("ls -d " .. dir .. "/tmp.*")):read("*l")
  local session_dir = state .. "/sandkit/sessions/" .. sessions[1]
  local record = cjson.decode(assert(common.read_file(session_dir .. "/record.json")))
  local direct_headers = dir .. "/direct-headers"
  write(direct_headers, "Authorization: Bearer " .. common.read_file(session_dir .. "/token")
    .. "\nContent-Type: application/json\n")
  write(dir .. "/exec.json", cjson.encode{ command = argv, timeoutMs = TIMEOUT * 1000 })
  local _, agent_base = common.agent_address(record)
  local direct_url = agent_base .. "/v1/exec"

  local agents = {}
  for _, id in ipairs(sessions) do
    local path = state .. "/sandkit/sessions/" .. id .. "/record.json"
    agents[#agents + 1] = math.floor(cjson.decode(common.read_file(path)).pid)
  end
  --- The agents' CPU seconds, and their commands'.
  local function agents_cpu()
    local own, commands = 0, 0
    for _, pid in ipairs(agents) do
      local a, c = cpu_sum(pid)
      own, commands = own + a, commands + c
    end
    return own, commands
  end
  local function measured(urls, headers, body, socket)
    local worker0, agents0, commands0 = cpu_sum(g.worker), agents_cpu()
    local seconds, reader = curl(urls, n, headers, body, dir .. "/curl.out", socket)
    local agents1, commands1 = agents_cpu()
    return { seconds = seconds, mb_per_s = #urls * BYTES / seconds / common.MB,
      worker_cpu = cpu_sum(g.worker) - worker0, agent_cpu = agents1 - agents0,
      command_cpu = commands1 - commands0, reader_cpu = reader }
  end
  local best = {}
  local rounds = { gateway = {}, direct = {} }
  local function keep(key, r)
    table.insert(rounds[key], r.mb_per_s)
    if not best[key] or r.mb_per_s > best[key].mb_per_s then best[key] = r end
  end
  function setup.round()
    keep("gateway", measured(gateway_urls, auth, dir .. "/run.json"))
    if MODE == "stream" then keep("direct", measured({ direct_url }, direct_headers, dir .. "/exec.json",
      record.socket)) end
  end
  function setup.result()
    best.gateway.rounds = rounds.gateway
    if best.direct then best.direct.rounds = rounds.direct end
    return { mode = MODE, reader = READER, streams = STREAMS, at_once = n, sessions = #sessions,
      bytes = STREAMS * BYTES, gateway = best.gateway,
      direct = best.direct, worker_rss_peak = common.status_bytes(g.worker, "VmHWM") }
  end
end

local base = common.out .. "/gateway-" .. MODE
local setups = {}
local ok, result = xpcall(function()
  for _, n in ipairs(COUNTS) do prepare(setups, base .. "-" .. n, n) end
  for _ = 1, ROUNDS do
    for _, setup in ipairs(setups) do setup.round() end
  end
  if MODE == "stream" then return setups[1].result() end
  local by_count = {}
  for i, n in ipairs(COUNTS) do by_count[tostring(n)] = setups[i].result() end
  return by_count
end, debug.traceback)
for _, setup in ipairs(setups) do
  stop_gateway(setup.g)
  os.execute("rm -rf '" .. setup.dir .. "'")
end
if not ok then error(result, 0) end
common.result(result)
