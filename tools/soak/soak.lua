--- A soak of the local provider and sandkit-agent (make soak; not part of make check).
--
--   lua5.4 tools/soak/soak.lua [--commands 1000] [--sessions 32] [--workers 4] [--seed N]
--                              [--results FILE]
--
-- Starts `sessions` local sessions (real agents), then runs `commands` commands through them
-- from `workers` client processes at once, each driving its share of the sessions concurrently
-- (one sandkit.run task per session). Commands are a mix: quick exits, failing exits, slow
-- streams, bulk output, timeouts, programs that do not exist, commands that leave a background
-- child and a setsid escapee behind, and streams the client abandons after their first frame.
-- At random moments the driver kills a client process with SIGKILL, mid-stream; a fresh client
-- takes over its sessions. Every command's outcome is classified and counted: what the stream
-- ended with (exit code, failure, unknown outcome, …), or "client killed" for those in flight
-- in a killed client.
--
-- At the end, with every client gone, each agent must be back to the descriptors it had after
-- its warm-up command, with no process left under it but its keeper and the setsid escapees one
-- kind of command leaves on purpose (counted from /proc, within a bound); then every session is
-- terminated, and neither an agent nor an escapee may remain. The report goes
-- to stdout and, with --results, to FILE as Markdown. Exit status 0 only when nothing leaked
-- and no outcome was one the command cannot have (wrong output, an error of an unexpected code).

local sandkit = require "sandkit"
local core = require "sandkit.core"
local wait = require "sandkit.wait"
local files = require "support.files"

local read_file = files.read

local LUA = arg[-1] or "lua5.4"
local SCRIPT = arg[0]

-- Worker --------------------------------------------------------------------------------------

--- The commands a worker picks from at random: argv, timeout, and what a finished one must show.
local KINDS = {
  { name = "echo", argv = { "echo", "hello" }, timeout = 10, stdout = "hello\n" },
  { name = "fail", argv = { "sh", "-c", "echo oops >&2; exit 3" }, timeout = 10 },
  { name = "stream", argv = { "sh", "-c", "i=0; while [ $i -lt 20 ]; do echo line $i; i=$((i+1)); "
    .. "sleep 0.05; done" }, timeout = 10, lines = 20 },
  { name = "bulk", argv = { "sh", "-c", "head -c 300000 /dev/zero | base64" }, timeout = 20,
    bytes = 405264 },
  { name = "timeout", argv = { "sleep", "5" }, timeout = 0.3 },
  { name = "missing", argv = { "no-such-program-soak" }, timeout = 10 },
  -- The group kill at the leader's exit takes the background sleep; the setsid one escapes the
  -- group and ends by itself, reaped by the keeper.
  { name = "orphans", argv = { "sh", "-c", "sleep 30 & setsid sleep 1 & echo started" }, timeout = 10,
    stdout = "started\n" },
  { name = "abandon", argv = { "sh", "-c", "echo first; sleep 30" }, timeout = 60, abandon = true },
  -- An escapee that outlives its command on purpose: only the agent's end may take it.
  { name = "escapee", argv = { "sh", "-c", "setsid sleep 119.97 >/dev/null 2>&1 & echo started" },
    timeout = 10, stdout = "started\n" },
}

--- The argv of the escapees, as /proc/<pid>/cmdline holds it.
local ESCAPEE = "sleep\0" .. "119.97"

--- What a command's stream ended with, as one word of the report.
local function classify(kind, frames, err)
  if err then
    if not sandkit.errors.is_error(err) then return "lua error: " .. tostring(err) end
    if err.code == "SANDBOX_COMMAND_FAILED" then return "failed:" .. tostring(err.failure) end
    if err.code == "SANDBOX_OUTCOME_UNKNOWN" then return "outcome unknown" end
    return "error:" .. err.code
  end
  local last = frames[#frames]
  if kind.abandon then return "abandoned by the client" end
  local out = {}
  for _, f in ipairs(frames) do
    if f.type == "stdout" then out[#out + 1] = f.data end
  end
  out = table.concat(out)
  local right = (not kind.stdout or out == kind.stdout)
    and (not kind.bytes or #out == kind.bytes)
    and (not kind.lines or select(2, out:gsub("\n", "")) == kind.lines)
  if not right then return "wrong output" end
  return "exit:" .. tostring(last.code)
end

local function run_one(session, kind)
  local stream, err = session:stream(kind.argv, { timeout = kind.timeout })
  if not stream then return classify(kind, nil, err) end
  local frames = {}
  while true do
    local frame
    frame, err = stream:next()
    if not frame then break end
    frames[#frames + 1] = frame
    if kind.abandon then
      -- The client goes away mid-stream: closing the connection is the agent's cancellation.
      stream:close()
      break
    end
    if frame.type == "exit" then break end
  end
  return classify(kind, frames, err)
end

local function worker(root, budget, ids)
  io.stdout:setvbuf("line")
  local sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  local left = budget
  local serial = 0
  assert(sandkit.run(function()
    local tasks = {}
    for _, id in ipairs(ids) do
      tasks[#tasks + 1] = sandkit.spawn(function()
        local session = assert(sandbox:get(id))
        while left > 0 do
          left = left - 1
          serial = serial + 1
          local n = serial
          local kind = KINDS[math.random(#KINDS)]
          print(string.format("start %d %s %s", n, id, kind.name))
          print(string.format("end %d %s %s", n, kind.name, run_one(session, kind)))
        end
      end)
    end
    for _, task in ipairs(tasks) do assert(task:join()) end
  end))
end

-- Driver --------------------------------------------------------------------------------------

local function proc_status(pid)
  local s = read_file("/proc/" .. pid .. "/status")
  if not s then return nil end
  return { ppid = tonumber(s:match("\nPPid:%s*(%d+)")), state = s:match("\nState:%s*(%a)") }
end

--- Live processes below pid (children, grandchildren, …): the keeper and whatever commands left,
-- the escapees left on purpose excepted.
local function descendants(pid)
  local parent = {}
  for _, name in ipairs(core.listdir("/proc")) do
    local n = tonumber(name:match("^%d+$"))
    local st = n and proc_status(n)
    local cmdline = st and read_file("/proc/" .. n .. "/cmdline") or ""
    if st and st.state ~= "Z" and not cmdline:find(ESCAPEE, 1, true) then parent[n] = st.ppid end
  end
  local count = 0
  for n in pairs(parent) do
    local p, hops = parent[n], 0
    while p and p ~= pid and hops < 64 do p, hops = parent[p], hops + 1 end
    if p == pid then count = count + 1 end
  end
  return count
end

local function fd_count(pid)
  local fds = core.listdir("/proc/" .. pid .. "/fd")
  return fds and #fds or -1
end

--- Live processes whose argv holds `needle`.
local function processes(needle)
  local found = 0
  for _, name in ipairs(core.listdir("/proc")) do
    local cmdline = name:match("^%d+$") and read_file("/proc/" .. name .. "/cmdline")
    local st = cmdline and proc_status(name)
    if cmdline and cmdline:find(needle, 1, true) and st and st.state ~= "Z" then found = found + 1 end
  end
  return found
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

local function options(argv)
  local o = { commands = 1000, sessions = 32, workers = 4, seed = os.time() }
  local i = 1
  while i <= #argv do
    local key = argv[i]:match("^%-%-(.+)$")
    if not key or argv[i + 1] == nil then error("usage: soak.lua [--commands N] [--sessions N] "
      .. "[--workers N] [--seed N] [--results FILE]") end
    o[key] = key == "results" and argv[i + 1] or tonumber(argv[i + 1])
    i = i + 2
  end
  return o
end

local function driver(o)
  math.randomseed(o.seed)
  local started_at = core.now()
  local p = assert(io.popen("mktemp -d /tmp/sandkit-soak.XXXXXX"))
  local root = p:read("l")
  p:close()
  local sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  local ids, agents = {}, {}
  for i = 1, o.sessions do
    local id = string.format("soak-%02d", i)
    local session = assert(sandbox:create{ id = id })
    -- One command first: whatever an agent allocates once (libevent's lazy descriptors) is part
    -- of the baseline, not of the count of what leaked.
    assert(session:exec({ "true" }, { timeout = 10 }))
    ids[i] = id
    agents[id] = { pid = session.record.pid }
  end
  for _, a in pairs(agents) do
    a.fds = fd_count(a.pid)
    a.procs = descendants(a.pid)
  end

  local slots, counts, kinds = {}, {}, {}
  local started, ended, killed_in_flight, kills, generation = 0, 0, 0, 0, 0
  local SLICE = 25 -- commands one client process is given before it exits by itself

  local function launch(k)
    local budget = math.min(SLICE, o.commands - started)
    if budget <= 0 then slots[k] = nil return end
    generation = generation + 1
    local mine = {}
    for i = k, #ids, o.workers do mine[#mine + 1] = ids[i] end
    local log = string.format("%s/worker-%d-%d.log", root, k, generation)
    local argv = { LUA, SCRIPT, "worker", root, tostring(budget), tostring(o.seed + generation) }
    for _, id in ipairs(mine) do argv[#argv + 1] = id end
    local pid = assert(core.spawn(argv, { stdout = log, stderr = log }))
    started = started + budget
    slots[k] = { pid = pid, log = log, offset = 0, open = {}, budget = budget, seen = 0 }
  end

  local function tally(class, kind)
    counts[class] = (counts[class] or 0) + 1
    kinds[kind] = kinds[kind] or {}
    kinds[kind][class] = (kinds[kind][class] or 0) + 1
  end

  local function drain(slot)
    local text = read_file(slot.log) or ""
    local fresh = text:sub(slot.offset + 1)
    local upto = fresh:match("^.*\n") or ""
    slot.offset = slot.offset + #upto
    for line in upto:gmatch("([^\n]*)\n") do
      local n, _, kind = line:match("^start (%d+) (%S+) (%S+)$")
      if n then
        slot.open[n] = kind
        slot.seen = slot.seen + 1
      else
        local m, kind2, class = line:match("^end (%d+) (%S+) (.+)$")
        if m then
          slot.open[m] = nil
          ended = ended + 1
          tally(class, kind2)
        end
      end
    end
  end

  for k = 1, o.workers do launch(k) end
  while next(slots) do
    wait.sleep(0.05)
    for k, slot in pairs(slots) do
      drain(slot)
      if core.reap(slot.pid) then
        drain(slot)
        -- A worker that ended by itself finished what it started; one that was killed (or
        -- failed) leaves its in-flight commands, and the commands it never got to, behind.
        for _, kind in pairs(slot.open) do
          killed_in_flight = killed_in_flight + 1
          tally("client killed mid-stream", kind)
        end
        started = started - (slot.budget - slot.seen)
        launch(k)
      elseif next(slot.open) and math.random() < 0.02 then
        core.kill(slot.pid, core.SIGKILL)
        kills = kills + 1
      end
    end
  end
  local elapsed = core.now() - started_at

  -- Every client is gone: each agent must come back to its baseline, within a bound.
  local leaked_fds, leaked_procs
  local deadline = core.now() + 30
  repeat
    leaked_fds, leaked_procs = 0, 0
    for _, a in pairs(agents) do
      leaked_fds = leaked_fds + math.max(0, fd_count(a.pid) - a.fds)
      leaked_procs = leaked_procs + math.max(0, descendants(a.pid) - a.procs)
    end
    if leaked_fds == 0 and leaked_procs == 0 then break end
    wait.sleep(0.2)
  until core.now() >= deadline
  local settle = 30 - (deadline - core.now())
  local baseline_fds, baseline_procs = 0, 0
  for _, a in pairs(agents) do
    baseline_fds = baseline_fds + a.fds
    baseline_procs = baseline_procs + a.procs
  end
  local escapees = processes(ESCAPEE)
  for _, id in ipairs(ids) do assert(sandbox:terminate(id)) end
  local left = processes(root)
  -- The kernel takes a namespace's processes down once its init is gone; a moment, not more.
  local gone_by = core.now() + 5
  while processes(ESCAPEE) > 0 and core.now() < gone_by do wait.sleep(0.05) end
  local escapees_left = processes(ESCAPEE)
  core.remove_tree(root)

  local lines = {}
  local function say(fmt, ...) lines[#lines + 1] = string.format(fmt, ...) end
  say("# Soak: the local provider and sandkit-agent")
  say("")
  say("`make soak` (`%s tools/soak/soak.lua --commands %d --sessions %d --workers %d --seed %d`), "
    .. "%s, on %s.", LUA, o.commands, o.sessions, o.workers, o.seed, os.date("!%Y-%m-%d %H:%M UTC"),
    ((read_file("/proc/sys/kernel/osrelease") or "?"):gsub("%s+$", "")))
  say("")
  say("%d commands over %d sessions from %d client processes at a time, %d client processes "
    .. "killed with SIGKILL mid-stream, in %.1f s.", ended + killed_in_flight, o.sessions, o.workers,
    kills, elapsed)
  say("")
  say("| outcome | count |")
  say("|---|---|")
  for _, class in ipairs(sorted_keys(counts)) do say("| %s | %d |", class, counts[class]) end
  say("")
  say("| command | outcomes |")
  say("|---|---|")
  for _, kind in ipairs(sorted_keys(kinds)) do
    local parts = {}
    for _, class in ipairs(sorted_keys(kinds[kind])) do parts[#parts + 1] = class .. " " .. kinds[kind][class] end
    say("| %s | %s |", kind, table.concat(parts, ", "))
  end
  say("")
  say("After the last client: agents' descriptors %d above their baseline of %d, processes under "
    .. "the agents %d above their baseline of %d (their keepers), %.1f s after the last client "
    .. "ended. %d setsid escapees were still running then, as documented; after terminating every "
    .. "session, %d agent processes and %d escapees were left.", leaked_fds, baseline_fds,
    leaked_procs, baseline_procs, settle, escapees, left, escapees_left)
  local report = table.concat(lines, "\n") .. "\n"
  io.write(report)
  if o.results then
    local f = assert(io.open(o.results, "w"))
    f:write(report)
    f:close()
  end

  local bad = leaked_fds > 0 or leaked_procs > 0 or left > 0 or escapees_left > 0
    or counts["wrong output"] ~= nil
  for class in pairs(counts) do
    if class:match("^error:") or class:match("^lua error") then bad = true end
  end
  return not bad
end

if arg[1] == "worker" then
  math.randomseed(tonumber(arg[4]))
  local ids = {}
  for i = 5, #arg do ids[#ids + 1] = arg[i] end
  worker(arg[2], tonumber(arg[3]), ids)
else
  os.exit(driver(options(arg)) and 0 or 1)
end
