--- Runs spec files as concurrent busted processes: most of the suite waits on processes and
-- sockets, not on a CPU, so several files at once finish far sooner than one after the other.
-- `make check` runs it; by hand:
--
--   lua5.4 tools/run_specs.lua [--jobs N] [--logs DIR] [--times FILE]… [--record FILE]
--     [--alone SPEC…] --pass NAME COMMAND SPEC… [--pass NAME COMMAND SPEC…]…
--
-- A pass is an interpreter's run of the suite: COMMAND is busted with that pass's environment
-- and flags, and each of its SPEC files runs as `COMMAND SPEC` on its own, its output kept in
-- DIR/NAME/<spec>.log. At most N run at once, and one that mostly sleeps beyond them (see
-- SLEEPER_LOAD), the slowest first (so no long file starts last and runs alone at the end),
-- the slowest known from the --times files (the first that names a file wins; a file none
-- names counts as the slowest, so a new spec starts early). --record writes
-- each file's time to FILE for the next run ("SECONDS PASS SPEC CPU-SECONDS" lines, slowest first).
-- A file's CPU time is its busted's and every process busted waited for; a daemon that left its
-- tree (an agent that outlives a case, say) is not counted.
--
-- An --alone spec's bound is a timing behaviour (a latency percentile, a concurrency of
-- sleeps), measured against a machine the suite itself keeps busy otherwise: the --alone specs
-- run one at a time, once every file still running or still to start is light (the --times
-- files say it took at most LIGHT_CPU_SECONDS of CPU), beside one light file at most. Each
-- file's result is printed as it ends; the logs of the files that failed are printed at the end,
-- named, and the exit status is 1 if any failed.
--
-- A process a spec file started (one naming this tree, as its agents do, or spec/support/, as
-- its fake servers do) that still runs LEFTOVER_SECONDS after the last file ended is listed,
-- killed, and fails the run: a spec that forgot to stop what it started.
--
-- While the files run, the runner looks at the machine's idle time every TICK_SECONDS (the
-- aggregate line of /proc/stat): where FILL_IDLE_CORES or more stayed idle for FILL_WINDOW
-- seconds, the next file starts beyond --jobs (FILL_MAX such at once), as every file running
-- was waiting at the same time. The closing lines say how idle the machine was.


--- The CPU seconds below which a file is light: the quickest half of the suite's files, each a
-- fraction of one core for a few seconds, which an --alone spec's bound does not notice.
local LIGHT_CPU_SECONDS = 3
--- How many light files may run beside an --alone spec: one, so a core stays its own.
local BESIDE_ALONE = 1
--- The share of a core below which a light file mostly sleeps (its CPU seconds over its seconds,
-- when last recorded: a lifetime's expiry, a keepalive's idle timeout, a readiness deadline):
-- one such file may run beyond --jobs, as it keeps no core busy. Only a light one: a heavy
-- file's share, recorded on a machine busy with other work, can look as small.
local SLEEPER_LOAD = 0.25
--- How often the runner looks at the machine's idle time: often enough that a core left idle
-- is given work within a few seconds, rarely enough that the looks cost nothing measurable.
local TICK_SECONDS = 1
--- Idle cores, on average over FILL_WINDOW seconds, at which one more file starts beyond --jobs:
-- the files running all waited at once (on processes, sockets, a mirror) for that long, which a
-- fixed width cannot foresee. Less than a core idle is what starting and ending files leave.
local FILL_IDLE_CORES = 0.75
local FILL_WINDOW = 3
--- Files started on idle cores beyond --jobs at once: one, so a burst of the files that were
-- waiting finds at most one more beside them, not a crowd that stretches the bounds some
-- specs keep.
local FILL_MAX = 1
--- The unit of /proc/stat's times (USER_HZ, 100 on every Linux architecture it runs on here).
local STAT_HZ = 100

local function usage(problem)
  io.stderr:write("run_specs: ", problem, "\n")
  os.exit(2)
end

local function shell_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

local function parse(argv)
  local o = { jobs = 2, logs = "build/spec-logs", times = {}, alone = {}, passes = {} }
  local i = 1
  local function value()
    i = i + 1
    if argv[i] == nil or argv[i]:sub(1, 2) == "--" then usage(argv[i - 1] .. " needs a value") end
    return argv[i]
  end
  local pass
  while i <= #argv do
    local a = argv[i]
    if a == "--jobs" then
      o.jobs = tonumber(value())
      if not o.jobs or o.jobs < 1 or o.jobs % 1 ~= 0 then usage("--jobs takes a whole number of at least 1") end
      pass = nil
    elseif a == "--logs" then o.logs, pass = value(), nil
    elseif a == "--times" then o.times[#o.times + 1], pass = value(), nil
    elseif a == "--record" then o.record, pass = value(), nil
    elseif a == "--alone" then pass = "alone"
    elseif a == "--pass" then
      pass = { name = value(), command = value(), specs = {} }
      if not pass.name:match("^[%w._-]+$") then usage("a pass's name is letters, digits, . _ or -: " .. pass.name) end
      o.passes[#o.passes + 1] = pass
    elseif a:sub(1, 2) == "--" then usage("unknown option " .. a)
    elseif pass == "alone" then o.alone[a] = true
    elseif pass then pass.specs[#pass.specs + 1] = a
    else usage("a spec file outside --pass or --alone: " .. a) end
    i = i + 1
  end
  if #o.passes == 0 then usage("no --pass") end
  return o
end

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

--- Lines "SECONDS PASS SPEC [CPU-SECONDS]" of each --times file, earlier files first: the
-- seconds and the CPU seconds (nil where the line has none) of each "PASS SPEC".
local function read_times(paths)
  local known, known_cpu = {}, {}
  for _, path in ipairs(paths) do
    local f = io.open(path)
    if f then
      for line in f:lines() do
        local seconds, pass, spec, cpu = line:match("^([%d.]+) (%S+) (%S+) ?([%d.]*)")
        local key = seconds and pass .. " " .. spec
        if key and not known[key] then known[key], known_cpu[key] = tonumber(seconds), tonumber(cpu) end
      end
      f:close()
    end
  end
  return known, known_cpu
end

local function read_file(path)
  local f = io.open(path)
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
end

--- The machine's CPU time so far and the idle part of it, in STAT_HZ ticks summed over its
-- cores, and how many cores /proc/stat counts; nil where there is no /proc.
local function cpu_sample()
  local text = read_file("/proc/stat")
  if not text then return nil end
  local fields = {}
  for n in text:match("^cpu +([^\n]*)"):gmatch("%d+") do fields[#fields + 1] = tonumber(n) end
  -- user, nice, system, idle, iowait, irq, softirq, steal: guest time is inside user already.
  local total = 0
  for i = 1, 8 do total = total + (fields[i] or 0) end
  local cores = 0
  for _ in text:gmatch("\ncpu%d+ ") do cores = cores + 1 end
  return { total = total, idle = fields[4] + (fields[5] or 0), cores = math.max(cores, 1) }
end

--- The counts on busted's closing line, from a log: the last such line, as a spec's own output
-- may hold one of a busted it ran.
local function counts(log)
  local ok, failed, errors, pending
  for line in (read_file(log) or ""):gmatch("[^\n]+") do
    local o, f, e, p = line:match("^(%d+) success%a* / (%d+) failures? / (%d+) errors? / (%d+) pending")
    if o then ok, failed, errors, pending = o, f, e, p end
  end
  return ok and { ok = tonumber(ok), failed = tonumber(failed), errors = tonumber(errors),
    pending = tonumber(pending) }
end

--- The status, the wall-clock seconds and the CPU seconds (user + system, of the file's whole
-- process tree) from a job's done file, once the job has written it.
local function read_done(path)
  local text = read_file(path)
  local status, start, finish = (text or ""):match("^(%d+) ([%d.]+) ([%d.]+)\n")
  if not status then return nil end
  -- `times`: the shell's own user and system time, then its children's, as "<m>m<s>s".
  local cpu, line = 0, 0
  for l in text:gmatch("[^\n]+") do
    line = line + 1
    if line == 3 then
      for m, sec in l:gmatch("(%d+)m([%d.]+)s") do cpu = cpu + tonumber(m) * 60 + tonumber(sec) end
    end
  end
  return tonumber(status), tonumber(finish) - tonumber(start), cpu
end

local o = parse(arg)
local known, known_cpu = read_times(o.times)
local shards, alone = {}, {}
for _, pass in ipairs(o.passes) do
  os.execute("mkdir -p " .. shell_quote(o.logs .. "/" .. pass.name))
  for _, spec in ipairs(pass.specs) do
    if not exists(spec) then usage("no spec file " .. spec) end
    local key = pass.name .. " " .. spec
    local base = o.logs .. "/" .. pass.name .. "/" .. spec:gsub("[/]", "_")
    -- A file no --times file gives a CPU time for is not light.
    local cpu = known_cpu[key] or math.huge
    local job = { pass = pass, spec = spec, key = key, estimate = known[key] or math.huge,
      light = cpu <= LIGHT_CPU_SECONDS, sleeper = cpu <= LIGHT_CPU_SECONDS and cpu <= SLEEPER_LOAD * known[key],
      log = base .. ".log", done = base .. ".done" }
    os.remove(job.done)
    if o.alone[spec] then alone[#alone + 1] = job else shards[#shards + 1] = job end
  end
end
for spec in pairs(o.alone) do
  if not exists(spec) then usage("--alone names " .. spec .. ", which is gone") end
end
local function slowest_first(a, b)
  if a.estimate ~= b.estimate then return a.estimate > b.estimate end
  return a.key < b.key
end
table.sort(shards, slowest_first)
table.sort(alone, slowest_first)

local total = { ok = 0, failed = 0, errors = 0, pending = 0 }
local failures, finished = {}, {}
local count = #shards + #alone

--- The runner sleeps in a read of this FIFO, and each file's shell writes a line to it once the
-- file's done file is in place: a poll of the done files every few hundredths of a second (a
-- shell and a `sleep` each time) cost about a core-minute over a run of the suite. The runner
-- holds it open for reading and writing, so it never reads an end of file between two writers.
local wakeup_path = o.logs .. "/.ended"
os.remove(wakeup_path)
-- os.execute answers true under Lua 5.4 and 0 under LuaJIT.
local made = os.execute("mkfifo " .. shell_quote(wakeup_path))
if made ~= true and made ~= 0 then usage("cannot make the FIFO " .. wakeup_path) end
local wakeup = assert(io.open(wakeup_path, "r+"))
-- The ticks: a shell writing a line every TICK_SECONDS until a write fails, as the first after
-- the runner closed the FIFO does (no reader is left).
os.execute(("{ exec 3>%s; while sleep %d && echo t >&3; do :; done; } 2>/dev/null &")
  :format(shell_quote(wakeup_path), TICK_SECONDS))

local function start(job)
  -- The shell reports the status and the clock at both ends in one file, written whole, then
  -- wakes the runner whatever became of that.
  os.execute(("{ s=$(date +%%s.%%N); %s %s >%s 2>&1 </dev/null; r=$?; e=$(date +%%s.%%N); "
    .. "{ echo \"$r $s $e\"; times; } >%s.tmp && mv %s.tmp %s; echo >%s; } &"):format(job.pass.command,
      shell_quote(job.spec), shell_quote(job.log), shell_quote(job.done), shell_quote(job.done), shell_quote(job.done),
      shell_quote(wakeup_path)))
end

local cpu_total = 0

local function report(job, status, seconds, cpu)
  local c = counts(job.log)
  local failed = status ~= 0 or not c or c.failed + c.errors > 0
  finished[#finished + 1] = { key = job.key, seconds = seconds, cpu = cpu }
  cpu_total = cpu_total + cpu
  if c then
    for k, v in pairs(c) do total[k] = total[k] + v end
  end
  if failed then failures[#failures + 1] = job end
  io.stdout:write(("[%3d/%d] %-6s %6.1fs %6.1fs cpu  %-7s %s%s\n"):format(#finished, count,
    failed and "FAILED" or "ok", seconds, cpu, job.pass.name, job.spec,
    c and ("  (%d ok%s%s)"):format(c.ok, c.pending > 0 and (", " .. c.pending .. " pending") or "",
      c.failed + c.errors > 0 and (", " .. (c.failed + c.errors) .. " failed") or "") or "  (no busted summary)"))
  io.stdout:flush()
end

--- Runs the shards, at most `width` at once, one sleeper and FILL_MAX more on idle cores beyond
-- them, the slowest first, and the alone jobs one at a time once every shard running or still
-- to start is light, with BESIDE_ALONE shards beside them.
local function run(queue, alone_queue, width)
  local last_heavy = 0
  for i, job in ipairs(queue) do
    if not job.light then last_heavy = i end
  end
  local next_shard, next_alone, running, alone_running, sleeper_running = 1, 1, {}, false, false
  local fills_running = 0
  -- The looks at /proc/stat since the last file started on idle cores, oldest first.
  local looks = { cpu_sample() }
  local function heavy_running()
    for _, job in ipairs(running) do
      if not job.light then return true end
    end
    return false
  end
  local function launch(job)
    start(job)
    job.started = true
    running[#running + 1] = job
  end
  --- The first shard not started from next_shard on (a sleeper may have started out of turn).
  local function skip_started()
    while queue[next_shard] and queue[next_shard].started do next_shard = next_shard + 1 end
  end
  --- Whether FILL_IDLE_CORES stayed idle over the last FILL_WINDOW seconds of looks.
  local function idle_enough()
    local last = looks[#looks]
    if not last then return false end
    local window = FILL_WINDOW * STAT_HZ * last.cores
    while looks[2] and last.total - looks[2].total >= window do table.remove(looks, 1) end
    local first = looks[1]
    local spent = last.total - first.total
    return spent >= window and (last.idle - first.idle) / spent * last.cores >= FILL_IDLE_CORES
  end
  while next_shard <= #queue or next_alone <= #alone_queue or #running > 0 do
    skip_started()
    -- Once an alone job's turn has come, the shards running beside it are BESIDE_ALONE at most:
    -- it waits for the others to end, and no more start.
    local alone_due = not alone_running and next_alone <= #alone_queue and next_shard > last_heavy
      and not heavy_running()
    if alone_due and #running <= BESIDE_ALONE then
      alone_running = alone_queue[next_alone]
      next_alone = next_alone + 1
      launch(alone_running)
    end
    local shards_running = #running - (alone_running and 1 or 0) - (sleeper_running and 1 or 0) - fills_running
    local room = (alone_running or alone_due) and BESIDE_ALONE or width
    while next_shard <= #queue and shards_running < room do
      launch(queue[next_shard])
      skip_started()
      shards_running = shards_running + 1
    end
    if not (alone_running or alone_due or sleeper_running) then
      for i = next_shard, #queue do
        if queue[i].sleeper and not queue[i].started then
          sleeper_running = queue[i]
          launch(sleeper_running)
          break
        end
      end
    end
    if not (alone_running or alone_due) and fills_running < FILL_MAX and next_shard <= #queue
      and idle_enough() then
      queue[next_shard].fill = true
      fills_running = fills_running + 1
      launch(queue[next_shard])
      skip_started()
      looks = { looks[#looks] }
    end
    -- One line a file that ended, or a tick; a line whose file an earlier look already found
    -- finds none.
    assert(wakeup:read("l"), "the FIFO " .. wakeup_path .. " closed")
    looks[#looks + 1] = cpu_sample()
    for i = #running, 1, -1 do
      local status, seconds, cpu = read_done(running[i].done)
      if status then
        report(running[i], status, seconds, cpu)
        if running[i] == alone_running then alone_running = false end
        if running[i] == sleeper_running then sleeper_running = false end
        if running[i].fill then fills_running = fills_running - 1 end
        table.remove(running, i)
      end
    end
  end
end

local function now()
  local p = io.popen("date +%s.%N")
  local t = p:read("n")
  p:close()
  return t
end

--- Seconds the processes the spec files started get to end once the last file has: a stopped
-- agent or server may still be on its way out, but not for longer than a stop waits for it.
local LEFTOVER_SECONDS = 5

--- The processes that belong to this suite: those naming this tree (an agent of its build) or
-- its spec helpers (a fake server), by pid, with their command lines.
local function suite_processes(tree)
  local found = {}
  local ps = assert(io.popen("ps -eo pid=,args="))
  for line in ps:lines() do
    local pid, args = line:match("^%s*(%d+)%s+(.*)$")
    if pid and (args:find(tree, 1, true) or args:find("spec/support/", 1, true)) then found[pid] = args end
  end
  ps:close()
  return found
end

--- The suite's processes that were not running at its start and still run after its last file,
-- given LEFTOVER_SECONDS to go: a spec that forgot to stop what it started.
local function leftovers(tree, before)
  local deadline = now() + LEFTOVER_SECONDS
  while true do
    local left = {}
    for pid, args in pairs(suite_processes(tree)) do
      if not before[pid] then left[#left + 1] = pid .. " " .. args end
    end
    if #left == 0 or now() >= deadline then
      table.sort(left)
      return left
    end
    os.execute("sleep 0.2")
  end
end

local tree_path = assert(io.popen("pwd -P")):read("l")
local processes_before = suite_processes(tree_path)
local clock, first_look = now(), cpu_sample()
io.stdout:write(("%d spec files in %d passes, %d at once, and %d alone beside %d light one at most\n")
  :format(#shards, #o.passes, o.jobs, #alone, BESIDE_ALONE))
run(shards, alone, o.jobs)
local wall, last_look = now() - clock, cpu_sample()
wakeup:close()
os.remove(wakeup_path)

if o.record then
  local f = io.open(o.record, "w")
  if f then
    table.sort(finished, function(a, b) return a.seconds > b.seconds end)
    for _, r in ipairs(finished) do f:write(("%.1f %s %.1f\n"):format(r.seconds, r.key, r.cpu)) end
    f:close()
  end
end

for _, job in ipairs(failures) do
  io.stdout:write(("\n==== FAILED: %s under %s (%s) ====\n%s\n"):format(job.spec, job.pass.name, job.log,
    read_file(job.log) or "(no log)"))
end
io.stdout:write(("\n%d successes / %d failures / %d errors / %d pending in %d files: %.1f s, %.1f s of CPU\n")
  :format(total.ok, total.failed, total.errors, total.pending, count, wall, cpu_total))
if first_look and last_look then
  local filled = 0
  for _, job in ipairs(shards) do
    if job.fill then filled = filled + 1 end
  end
  local idle = (last_look.idle - first_look.idle) / STAT_HZ
  io.stdout:write(("The machine's %d cores were idle %.1f s of %.1f (%.0f%%); %d files started on idle cores\n")
    :format(last_look.cores, idle, wall * last_look.cores, 100 * idle / (wall * last_look.cores), filled))
end
local left = leftovers(tree_path, processes_before)
if #left > 0 then
  io.stdout:write(("\n%d processes the spec files started are still running; stopped now:\n"):format(#left))
  for _, line in ipairs(left) do
    io.stdout:write("  ", line, "\n")
    os.execute("kill -KILL " .. line:match("^%d+") .. " 2>/dev/null")
  end
end
if #failures > 0 then
  io.stdout:write("Failed:\n")
  for _, job in ipairs(failures) do io.stdout:write(("  %s  %s\n"):format(job.pass.name, job.spec)) end
end
if #failures > 0 or #left > 0 then os.exit(1) end
