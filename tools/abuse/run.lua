-- run.lua — the attacks of docs/agent.md "Limits" against a real sandkit-agent on 127.0.0.1,
-- each bounded in connections and time (make abuse). For every attack it reports the agent's
-- peak resident memory, most descriptors open, CPU time used, and the latency of authorized
-- execs that tools/abuse/probe.lua runs in another process throughout. Targets: RSS under
-- 64 MiB and an exec p50 under 50 ms during every attack; the exit status says whether all
-- were met. Needs a descriptor limit above 2100 for itself (make abuse raises it). An attack
-- that names agent arguments gets an agent of its own started with them; the vanished callers
-- need root (TCP repair, tools/abuse/vanish.py) and are skipped, saying so, without it.
local agent_process = require "support.agent_process"
local raw = require "support.raw_http"
local files = require "support.files"
local socket = require "socket"
local core = require "sandkit.core"
local cjson = require "cjson"

-- How long each attack lasts: past the agent's 10 s header deadline, so slowloris meets it.
local PHASE_SECONDS = tonumber(os.getenv("ABUSE_SECONDS") or "") or 12
local RSS_TARGET_KB, P50_TARGET_MS = 64 * 1024, 50

local AGENT_ARGS = { "--log", "info" }
-- The agent under attack; an attack with args of its own gets another for its duration.
local shared_agent = assert(agent_process.start_agent{ args = AGENT_ARGS })
local A = shared_agent

local function proc_status(key)
  local s = files.read("/proc/" .. A.pid .. "/status") or ""
  return tonumber(s:match(key .. ":%s*(%d+)")) or 0
end

local function cpu_seconds()
  local stat = files.read("/proc/" .. A.pid .. "/stat")
  local fields = {}
  for f in stat:match("^%d+ %b() (.*)$"):gmatch("%S+") do fields[#fields + 1] = f end
  return (tonumber(fields[12]) + tonumber(fields[13])) / 100
end

local function fd_count()
  return #core.listdir("/proc/" .. A.pid .. "/fd")
end

-- A head (and optionally the start of a body) on a fresh non-blocking connection, or nil.
local function open(head)
  local c = raw.connect(A.port, nil, 1)
  if not c then return nil end
  if head then c:send(head) end
  c.sock:settimeout(0)
  return c
end

local function auth_head(method, path, extra)
  return method .. " " .. path .. " HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " .. A.token
    .. "\r\n" .. (extra or "") .. "\r\n"
end

-- Sends what the socket takes now of data; returns false once the agent closed it.
local function feed(c, data)
  local last, err, partial = c.sock:send(data)
  if last or err == "timeout" then return true, last or partial or 0 end
  return false, partial or 0
end

local JUNK = string.rep("j", 65536)
local attacks = {}

-- Connections to the agent's port in each TCP state, as `ss` lists them: the agent's side
-- (sport) or the callers' (dport).
local function tcp_states(side)
  local p = assert(io.popen("ss -tnaH '( " .. side .. " = :" .. A.port .. " )' 2>/dev/null"))
  local counts = {}
  for line in p:lines() do
    local state = line:match("^(%S+)")
    counts[state] = (counts[state] or 0) + 1
  end
  p:close()
  return counts
end

local function am_root()
  local p = io.popen("id -u")
  local uid = p:read("*l")
  p:close()
  return uid == "0"
end

attacks[#attacks + 1] = { name = "slowloris: 500 connections, one header byte each per second",
  setup = function(st)
    st.conns, st.next_byte = {}, socket.gettime()
    for i = 1, 500 do st.conns[i] = open("GET /v1/health HTTP/1.1\r\nX-a: ") end
  end,
  pump = function(st)
    if socket.gettime() < st.next_byte then return end
    st.next_byte = st.next_byte + 1
    for i, c in ipairs(st.conns) do
      if not (c and feed(c, "a")) then
        if c then c:close() end
        st.conns[i] = open("GET /v1/health HTTP/1.1\r\nX-a: ")
      end
    end
  end,
}

attacks[#attacks + 1] = { name = "2000 idle connections",
  setup = function(st)
    st.conns = {}
    for i = 1, 2000 do st.conns[i] = open() end
  end,
  pump = function() end,
}

attacks[#attacks + 1] = { name = "unauthenticated 40 MB bodies from 50 connections",
  setup = function(st)
    st.conns, st.sent = {}, 0
    st.head = "PUT /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 41943040\r\n\r\n"
    for i = 1, 50 do st.conns[i] = open(st.head) end
  end,
  pump = function(st)
    for i, c in ipairs(st.conns) do
      local alive, n = false, 0
      if c then alive, n = feed(c, JUNK) end
      st.sent = st.sent + n
      if not alive then
        if c then c:close() end
        st.conns[i] = open(st.head)
      end
    end
  end,
  note = function(st) return string.format("%.0f MB sent", st.sent / 1e6) end,
}

attacks[#attacks + 1] = { name = "health with bodies: 50 sending 40 MB each, 200 never sending their one byte",
  setup = function(st)
    st.big, st.small, st.sent = {}, {}, 0
    st.big_head = "GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 41943040\r\n\r\n"
    st.small_head = "GET /v1/health HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n"
    for i = 1, 50 do st.big[i] = open(st.big_head) end
    for i = 1, 200 do st.small[i] = open(st.small_head) end
    st.conns = {}
  end,
  pump = function(st)
    for i, c in ipairs(st.big) do
      local alive, n = false, 0
      if c then alive, n = feed(c, JUNK) end
      st.sent = st.sent + n
      if not alive then
        if c then c:close() end
        st.big[i] = open(st.big_head)
      end
    end
  end,
  finish = function(st)
    for _, list in ipairs({ st.big, st.small }) do
      for _, c in pairs(list) do if c then c:close() end end
    end
  end,
  note = function(st) return string.format("%.0f MB sent", st.sent / 1e6) end,
}

attacks[#attacks + 1] = { name = "stalled file readers: 100 take 100 bytes of a 16 MiB file and stop",
  -- A stall bound the phase outlasts, so that what the agent does about it shows.
  args = { "--stall-timeout", "5000" },
  setup = function(st)
    assert(files.execute("head -c 16777216 /dev/urandom > " .. files.shell_quote(A.root .. "/big")))
    st.conns = {}
    for i = 1, 100 do
      local c = raw.connect(A.port, nil, 5)
      if c then
        c:send(auth_head("GET", "/v1/files/raw?path=big"))
        c.sock:receive(100)
        c.sock:settimeout(0)
      end
      st.conns[i] = c
    end
  end,
  pump = function() end,
  note = function(st)
    -- what the agent still has open of the file, one descriptor per reader it kept
    local p = assert(io.popen("ls -l /proc/" .. A.pid .. "/fd 2>/dev/null"))
    local open_now = 0
    for line in p:lines() do
      if line:sub(-#"/big") == "/big" then open_now = open_now + 1 end
    end
    p:close()
    return string.format("%d of %d given up by the agent", #st.conns - open_now, #st.conns)
  end,
}

attacks[#attacks + 1] = { name = "vanished callers: 200 silent exec streams whose callers vanish without FIN or reset",
  seconds = 45, -- past the first keep-alive probe, 30 s into a connection's silence
  root = true,
  setup = function(st)
    local cmd = string.format("/usr/bin/python3 tools/abuse/vanish.py %d %s 200 600", A.port, A.token)
    local p = assert(io.popen(cmd, "r"))
    st.vanished = tonumber((p:read("*a") or ""):match("vanished (%d+)")) or 0
    p:close()
    st.started = socket.gettime()
    st.held = tcp_states("sport")["ESTAB"] or 0
  end,
  pump = function(st)
    if not st.freed_after and (tcp_states("sport")["ESTAB"] or 0) <= 1 then
      st.freed_after = socket.gettime() - st.started
    end
  end,
  note = function(st)
    local left = tcp_states("sport")["ESTAB"] or 0
    return string.format("%d vanished; the agent held %d, then %d after %s", st.vanished, st.held, left,
      st.freed_after and string.format("%.0f s", st.freed_after) or "the phase")
  end,
}

attacks[#attacks + 1] = { name = "junk on streaming connections (at most 200 streams)",
  setup = function(st)
    st.streams, st.started = {}, 0
    st.body = cjson.encode({ command = { "sleep", "60" }, timeoutMs = 60000 })
  end,
  pump = function(st)
    for i = 1, 4 do
      local c = st.streams[i]
      if c and not feed(c, JUNK) then
        c:close()
        c = nil
      end
      if not c and st.started < 200 then
        st.started = st.started + 1
        c = open(auth_head("POST", "/v1/exec", "Content-Length: " .. #st.body .. "\r\n") .. st.body)
      end
      st.streams[i] = c
    end
  end,
  note = function(st) return st.started .. " streams started" end,
}

attacks[#attacks + 1] = { name = "unread replies: 60 reads of a 16 MiB file, 60 polls of 8 MiB of output",
  setup = function(st)
    assert(files.execute("head -c 16777216 /dev/urandom > " .. files.shell_quote(A.root .. "/big")))
    local _, started = A:start_job({ command = { "sh", "-c",
      "head -c 4194304 /dev/urandom; head -c 4194304 /dev/urandom >&2" }, timeoutMs = 60000 })
    A:poll_until_done(started.jobId, 30)
    local poll = cjson.encode({ jobId = started.jobId })
    st.conns = {}
    for _ = 1, 60 do
      st.conns[#st.conns + 1] = open(auth_head("GET", "/v1/files?path=big"))
      st.conns[#st.conns + 1] = open(auth_head("POST", "/v1/jobs/poll",
        "Content-Length: " .. #poll .. "\r\n") .. poll)
    end
  end,
  pump = function() end,
}

local function percentile(sorted, p)
  if #sorted == 0 then return 0 / 0 end
  return sorted[math.max(1, math.ceil(#sorted * p))]
end

-- Runs one attack against the agent, or one of its own; returns its row of the table.
local function run_attack(attack)
  if attack.args then
    local args = {}
    for _, a in ipairs(AGENT_ARGS) do args[#args + 1] = a end
    for _, a in ipairs(attack.args) do args[#args + 1] = a end
    A = assert(agent_process.start_agent{ args = args })
  end
  local seconds = attack.seconds or PHASE_SECONDS
  local probe_cmd = string.format("%s tools/abuse/probe.lua %d %s %d",
    os.getenv("SANDKIT_TEST_LUA") or "lua5.4", A.port, A.token, seconds)
  local probe = assert(io.popen(probe_cmd, "r"))
  local st = {}
  local cpu0 = cpu_seconds()
  attack.setup(st)
  local peak_rss, peak_fds = proc_status("VmRSS"), fd_count()
  local stop = socket.gettime() + seconds
  while socket.gettime() < stop do
    attack.pump(st)
    peak_rss = math.max(peak_rss, proc_status("VmRSS"))
    peak_fds = math.max(peak_fds, fd_count())
    socket.sleep(0.02)
  end
  local cpu = cpu_seconds() - cpu0
  local latencies, failures = {}, 0
  for line in probe:lines() do
    local ms = tonumber(line)
    if ms then latencies[#latencies + 1] = ms else failures = failures + 1 end
  end
  probe:close()
  local note = attack.note and attack.note(st) or ""
  if attack.finish then attack.finish(st) end
  for _, c in pairs(st.conns or st.streams or {}) do if c then c:close() end end
  table.sort(latencies)
  local r = {
    name = attack.name, rss = peak_rss, fds = peak_fds, cpu = cpu, n = #latencies,
    failures = failures, p50 = percentile(latencies, 0.5), p95 = percentile(latencies, 0.95),
    max = latencies[#latencies] or 0 / 0, note = note, args = attack.args,
  }
  r.met = r.rss < RSS_TARGET_KB and r.p50 < P50_TARGET_MS and failures == 0
  -- let the agent close what the attack left before the next one
  agent_process.within(15, function() return fd_count() < 20 end)
  if attack.args then
    r.exit = A:stop()
    A = shared_agent
  end
  return r
end

local results, all_met = {}, true
local can_vanish = am_root()
for _, attack in ipairs(attacks) do
  local r
  if attack.root and not can_vanish then
    r = { name = attack.name, skipped = "needs root for TCP repair" }
  else
    r = run_attack(attack)
    all_met = all_met and r.met
  end
  results[#results + 1] = r
  io.stderr:write(string.format("%-72s %s\n", attack.name, r.skipped and "skipped: " .. r.skipped
    or r.met and "met" or "MISSED"))
end

local log = files.read(A.log) or ""
local lines = 0
for _ in log:gmatch("\n") do lines = lines + 1 end
local code = A:stop()
for _, r in ipairs(results) do
  if r.exit ~= nil and r.exit ~= 0 then code = r.exit end
end

print(string.format("sandkit-agent under attack, %d s per attack, targets: peak RSS < 64 MiB, "
  .. "authorized exec p50 < 50 ms\n", PHASE_SECONDS))
print("| attack | agent peak RSS | most fds | agent CPU | execs (failed) | exec p50 / p95 / max | |")
print("|---|---|---|---|---|---|---|")
for _, r in ipairs(results) do
  if r.skipped then
    print(string.format("| %s | | | | | | skipped: %s |", r.name, r.skipped))
  else
    local name = r.name .. (r.args and " (agent with " .. table.concat(r.args, " ") .. ")" or "")
    print(string.format("| %s | %.1f MiB | %d | %.2f s | %d (%d) | %.1f / %.1f / %.1f ms | %s%s |",
      name, r.rss / 1024, r.fds, r.cpu, r.n, r.failures, r.p50, r.p95, r.max,
      r.met and "met" or "MISSED", r.note ~= "" and "; " .. r.note or ""))
  end
end
print(string.format("\nagent log: %d lines; agent exit status %s", lines, tostring(code)))
os.exit(all_met and code == 0 and 0 or 1)
