--- Runs spec files as concurrent busted processes: most of the suite waits on processes and
-- sockets, not on a CPU, so several files at once finish far sooner than one after the other.
-- `make check` runs it; by hand:
--
--   lua5.4 tools/run_specs.lua [--jobs N] [--logs DIR] [--times FILE]… [--record FILE]
--     [--alone SPEC…] --pass NAME COMMAND SPEC… [--pass NAME COMMAND SPEC…]…
--
-- A pass is an interpreter's run of the suite: COMMAND is busted with that pass's environment
-- and flags, and each of its SPEC files runs as `COMMAND SPEC` on its own, its output kept in
-- DIR/NAME/<spec>.log. At most N run at once, the slowest first (so no long file starts last and
-- runs alone at the end), the slowest known from the --times files (the first that names a file
-- wins; a file none names counts as the slowest, so a new spec starts early). --record writes
-- each file's time to FILE for the next run ("SECONDS PASS SPEC CPU-SECONDS" lines, slowest first).
-- A file's CPU time is its busted's and every process busted waited for; a daemon that left its
-- tree (an agent that outlives a case, say) is not counted.
--
-- An --alone spec's bound is a timing behaviour (a latency percentile, a concurrency of
-- sleeps), measured against a machine the suite itself keeps busy otherwise: it runs after all
-- the others, one at a time. Each file's result is printed as it ends; the logs of the files
-- that failed are printed at the end, named, and the exit status is 1 if any failed.

-- How often finished files are looked for: short against the quickest file (about 0.2 s).
local POLL_SECONDS = 0.05

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

--- Lines "SECONDS PASS SPEC" of each --times file, earlier files first.
local function read_times(paths)
  local known = {}
  for _, path in ipairs(paths) do
    local f = io.open(path)
    if f then
      for line in f:lines() do
        local seconds, pass, spec = line:match("^([%d.]+) (%S+) (%S+)")
        local key = seconds and pass .. " " .. spec
        if key and not known[key] then known[key] = tonumber(seconds) end
      end
      f:close()
    end
  end
  return known
end

local function read_file(path)
  local f = io.open(path)
  if not f then return nil end
  local text = f:read("a")
  f:close()
  return text
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
local known = read_times(o.times)
local shards, alone = {}, {}
for _, pass in ipairs(o.passes) do
  os.execute("mkdir -p " .. shell_quote(o.logs .. "/" .. pass.name))
  for _, spec in ipairs(pass.specs) do
    if not exists(spec) then usage("no spec file " .. spec) end
    local key = pass.name .. " " .. spec
    local base = o.logs .. "/" .. pass.name .. "/" .. spec:gsub("[/]", "_")
    local job = { pass = pass, spec = spec, key = key, estimate = known[key] or math.huge,
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

local function start(job)
  -- The shell reports the status and the clock at both ends in one file, written whole.
  os.execute(("{ s=$(date +%%s.%%N); %s %s >%s 2>&1 </dev/null; r=$?; e=$(date +%%s.%%N); "
    .. "{ echo \"$r $s $e\"; times; } >%s.tmp && mv %s.tmp %s; } &"):format(job.pass.command, shell_quote(job.spec),
      shell_quote(job.log), shell_quote(job.done), shell_quote(job.done), shell_quote(job.done)))
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

--- Runs the jobs, at most `width` at once, in their order.
local function run(jobs, width)
  local next_job, running = 1, {}
  while next_job <= #jobs or #running > 0 do
    while next_job <= #jobs and #running < width do
      start(jobs[next_job])
      running[#running + 1] = jobs[next_job]
      next_job = next_job + 1
    end
    os.execute("sleep " .. POLL_SECONDS)
    for i = #running, 1, -1 do
      local status, seconds, cpu = read_done(running[i].done)
      if status then
        report(running[i], status, seconds, cpu)
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

local clock = now()
io.stdout:write(("%d spec files in %d passes, %d at once, then %d alone\n"):format(#shards,
  #o.passes, o.jobs, #alone))
run(shards, o.jobs)
run(alone, 1)
local wall = now() - clock

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
if #failures > 0 then
  io.stdout:write("Failed:\n")
  for _, job in ipairs(failures) do io.stdout:write(("  %s  %s\n"):format(job.pass.name, job.spec)) end
  os.exit(1)
end
