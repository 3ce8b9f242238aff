--- What the benchmark scripts share: where their files go, how they report, how they read
-- memory and CPU time from /proc, and a local sandbox whose sessions never outlive the script.
--
-- Every benchmark runs as its own process (bench/run.lua starts it), so the peak RSS it reads
-- from /proc/self/status is its own and no other benchmark's. It ends by printing one line,
-- `RESULT <json>`, which bench/run.lua decodes.

local cjson = require "cjson"
local core = require "sandkit.core"

local common = {}

--- The directory of the script being run: bench/, whatever the caller's working directory;
-- absolute, so the agents' command lines name their session directories unambiguously.
common.dir = (arg and arg[0] and arg[0]:match("^(.*)/[^/]*$")) or "."
if common.dir:sub(1, 1) ~= "/" and os.getenv("PWD") then common.dir = os.getenv("PWD") .. "/" .. common.dir end
--- Generated files (the corpus, the sessions' state) live here; the repository ignores it.
common.out = common.dir .. "/out"

--- Decimal megabytes, as every MB/s in the suite counts them.
common.MB = 1000 * 1000
common.MIB = 1024 * 1024
common.GIB = 1024 * 1024 * 1024

--- The agent refuses a larger cap; the streaming benchmarks need every byte of 1 GiB delivered
-- (past the default 4 MiB the agent would drop output instead of sending it).
common.OUTPUT_CAP = common.GIB

function common.result(t)
  io.write("RESULT ", cjson.encode(t), "\n")
  io.flush()
end

function common.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

--- A field of /proc/<pid>/status in bytes (VmRSS, VmHWM, …); nil when the process is gone.
function common.status_bytes(pid, field)
  local text = common.read_file("/proc/" .. tostring(pid) .. "/status")
  local kb = text and text:match(field .. ":%s*(%d+) kB")
  return kb and tonumber(kb) * 1024 or nil
end

local TICKS = 100 -- USER_HZ; Linux reports it as 100 on every architecture it exports /proc for

--- User and system CPU seconds a process has used so far, then those of the children it
-- reaped (an agent's: the commands it ran).
function common.cpu(pid)
  local text = common.read_file("/proc/" .. tostring(pid) .. "/stat")
  if not text then return nil end
  local fields = {}
  -- The command name may hold spaces; the fields that matter come after its closing paren.
  for w in text:match("%) (.*)$"):gmatch("%S+") do fields[#fields + 1] = w end
  return tonumber(fields[12]) / TICKS, tonumber(fields[13]) / TICKS, tonumber(fields[14]) / TICKS,
    tonumber(fields[15]) / TICKS
end

--- Nearest-rank percentile of an array of numbers (sorted in place).
--- How curl reaches the agent of a local session's `record`: the words that name its Unix
-- socket ("" where it listens on a port instead) and the base of its routes' URLs.
function common.agent_address(record)
  if record.socket then
    return "--unix-socket '" .. record.socket:gsub("'", "'\\''") .. "' ", "http://127.0.0.1"
  end
  return "", "http://127.0.0.1:" .. math.floor(record.port)
end

function common.percentile(values, p)
  table.sort(values)
  local rank = math.max(1, math.ceil(p / 100 * #values))
  return values[rank]
end

--- The local sandbox every benchmark's sessions live in, under bench/out/state: confined, as
-- the provider's sessions are by default, unless `isolate` is "none".
function common.sandbox(isolate)
  local sandkit = require "sandkit"
  return assert(sandkit.sandbox{ provider = "local", root = common.out .. "/state",
    output_cap = common.OUTPUT_CAP, isolate = isolate })
end

--- Runs fn(sandbox, sessions) in a sandbox of common.sandbox(isolate) and returns its result
-- once every session made through sessions.create(opts, other_isolate) (create's options, default
-- none; other_isolate makes the session in a sandbox of that confinement instead, for a benchmark
-- that interleaves the two) is terminated, even when fn fails: an agent left behind would run on
-- after the benchmark, detached from it. The caller reports the result only then, so a reader
-- that went away (a closed stdout) cannot end the process before its sessions are gone.
function common.with_sandbox(fn, isolate)
  local sandbox = common.sandbox(isolate)
  local others = {}
  local made = {}
  local sessions = {
    create = function(opts, other_isolate)
      local from = sandbox
      if other_isolate then
        others[other_isolate] = others[other_isolate] or common.sandbox(other_isolate)
        from = others[other_isolate]
      end
      local session = assert(from:create(opts or {}))
      made[#made + 1] = { from = from, session = session }
      return session
    end,
  }
  local ok, result = xpcall(fn, debug.traceback, sandbox, sessions)
  for _, m in ipairs(made) do m.from:terminate(m.session.id) end
  if not ok then error(result, 0) end
  return result
end

--- Seconds since an arbitrary point, on the clock every wait in sandkit uses.
common.now = core.now

return common
