-- run.lua — the attacks of docs/agent.md "Limits" against a real sandkit-agent on 127.0.0.1,
-- each bounded in connections and time (make abuse). For every attack it reports the agent's
-- peak resident memory, most descriptors open, CPU time used, and the latency of authorized
-- execs that tools/abuse/probe.lua runs in another process throughout. Targets: RSS under
-- 64 MiB and an exec p50 under 50 ms during every attack; the exit status says whether all
-- were met. Needs a descriptor limit above 2100 for itself (make abuse raises it).
local agent_process = require "support.agent_process"
local raw = require "support.raw_http"
local files = require "support.files"
local socket = require "socket"
local core = require "sandkit.core"
local cjson = require "cjson"

-- How long each attack lasts: past the agent's 10 s header deadline, so slowloris meets it.
local PHASE_SECONDS = tonumber(os.getenv("ABUSE_SECONDS") or "") or 12
local RSS_TARGET_KB, P50_TARGET_MS = 64 * 1024, 50

local A = assert(agent_process.start_agent{ args = { "--log", "info" } })

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

local results, all_met = {}, true
for _, attack in ipairs(attacks) do
  local probe_cmd = string.format("%s tools/abuse/probe.lua %d %s %d",
    os.getenv("SANDKIT_TEST_LUA") or "lua5.4", A.port, A.token, PHASE_SECONDS)
  local probe = assert(io.popen(probe_cmd, "r"))
  local st = {}
  local cpu0 = cpu_seconds()
  attack.setup(st)
  local peak_rss, peak_fds = proc_status("VmRSS"), fd_count()
  local stop = socket.gettime() + PHASE_SECONDS
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
  for _, c in pairs(st.conns or st.streams or {}) do if c then c:close() end end
  table.sort(latencies)
  local r = {
    name = attack.name, rss = peak_rss, fds = peak_fds, cpu = cpu, n = #latencies,
    failures = failures, p50 = percentile(latencies, 0.5), p95 = percentile(latencies, 0.95),
    max = latencies[#latencies] or 0 / 0, note = attack.note and attack.note(st) or "",
  }
  r.met = r.rss < RSS_TARGET_KB and r.p50 < P50_TARGET_MS and failures == 0
  all_met = all_met and r.met
  results[#results + 1] = r
  io.stderr:write(string.format("%-72s %s\n", attack.name, r.met and "met" or "MISSED"))
  -- let the agent close what the attack left before the next one
  agent_process.within(15, function() return fd_count() < 20 end)
end

local log = files.read(A.log) or ""
local lines = 0
for _ in log:gmatch("\n") do lines = lines + 1 end
local code = A:stop()

print(string.format("sandkit-agent under attack, %d s per attack, targets: peak RSS < 64 MiB, "
  .. "authorized exec p50 < 50 ms\n", PHASE_SECONDS))
print("| attack | agent peak RSS | most fds | agent CPU | execs (failed) | exec p50 / p95 / max | |")
print("|---|---|---|---|---|---|---|")
for _, r in ipairs(results) do
  print(string.format("| %s | %.1f MiB | %d | %.2f s | %d (%d) | %.1f / %.1f / %.1f ms | %s%s |",
    r.name, r.rss / 1024, r.fds, r.cpu, r.n, r.failures, r.p50, r.p95, r.max,
    r.met and "met" or "MISSED", r.note ~= "" and "; " .. r.note or ""))
end
print(string.format("\nagent log: %d lines; agent exit status %s", lines, tostring(code)))
os.exit(all_met and code == 0 and 0 or 1)
