--- A busted output handler: the usual terminal report, then how long each spec file and each
-- case took, slowest first, so a cut to the suite's time is aimed at what is measured.
-- `make test-times` runs the suite with it; by hand: busted -o tools/test_times.lua [FILES].
--
-- A case's time is its body alone (busted's own clock, as in its junit output); a file's time
-- also holds its setup, teardown and before/after_each hooks, which is where a server started per
-- case shows up, so each file's line says how much of it no case accounts for. Each case also
-- says how much CPU it took: busted's and that of every process it waited for (a daemon it
-- started and left running is not counted), which a machine busy with other work stretches far
-- less than the clock.

-- Cases quicker than this are counted, not listed: no cut is found among them one by one.
local LISTED_SECONDS = 0.1
-- The unit of /proc's CPU times (the kernel's USER_HZ, 100 on every Linux architecture).
local TICKS_PER_SECOND = 100

--- CPU seconds of this process and of its waited-for children so far; 0 where /proc is not.
local function cpu_seconds()
  local f = io.open("/proc/self/stat")
  if not f then return 0 end
  local stat = f:read("a")
  f:close()
  -- After the command's name (in parentheses, and which may hold spaces): the state is field 3,
  -- then utime, stime, cutime and cstime are fields 14 to 17.
  local fields = {}
  for word in stat:match("%) (.*)$"):gmatch("%S+") do fields[#fields + 1] = word end
  local ticks = 0
  for i = 12, 15 do ticks = ticks + (tonumber(fields[i]) or 0) end
  return ticks / TICKS_PER_SECOND
end

return function(options)
  local busted = require("busted")
  local terminal = require("busted.outputHandlers." .. options.defaultOutput)(options)
  local files, cases = {}, {}
  local file_cpu_at, case_cpu_at = 0, 0

  local function on_file_start()
    file_cpu_at = cpu_seconds()
    return nil, true
  end

  local function on_file_end(file)
    files[#files + 1] = { name = file.name, seconds = file.duration or 0, in_cases = 0,
      cpu = cpu_seconds() - file_cpu_at }
    return nil, true
  end

  local function on_test_start()
    case_cpu_at = cpu_seconds()
    return nil, true
  end

  -- A case written in a shared table (spec/support/) is counted against the spec file that ran it.
  local function file_of(element)
    local parent = busted.parent(element)
    while parent and parent.descriptor ~= "file" do parent = busted.parent(parent) end
    return parent and parent.name or "?"
  end

  local function on_test_end(element, _, status)
    cases[#cases + 1] = {
      name = terminal.getFullName(element),
      file = file_of(element),
      written_at = element.trace and (element.trace.short_src:gsub("^%./", "") .. ":" .. element.trace.currentline),
      seconds = element.duration or 0,
      cpu = cpu_seconds() - case_cpu_at,
      status = status,
    }
    return nil, true
  end

  local function slowest_first(a, b) return a.seconds > b.seconds end

  local function on_exit()
    local by_file = {}
    for _, f in ipairs(files) do by_file[f.name] = f end
    local total = 0
    for _, c in ipairs(cases) do
      local f = by_file[c.file]
      if f then f.in_cases = f.in_cases + c.seconds end
      total = total + c.seconds
    end
    table.sort(files, slowest_first)
    table.sort(cases, slowest_first)

    local out = io.stdout
    local interpreter = rawget(_G, "jit") and _G.jit.version or _VERSION
    out:write(("\nSpec files, slowest first (%s)\n"):format(interpreter))
    out:write("   file s  cases s  outside cases s    cpu s  file\n")
    local files_total, cpu_total = 0, 0
    for _, f in ipairs(files) do
      files_total = files_total + f.seconds
      cpu_total = cpu_total + f.cpu
      out:write(("%9.2f %8.2f %16.2f %8.2f  %s\n"):format(f.seconds, f.in_cases, f.seconds - f.in_cases, f.cpu,
        f.name))
    end
    out:write(("%9.2f %8.2f %16.2f %8.2f  all %d files\n"):format(files_total, total, files_total - total,
      cpu_total, #files))

    local listed = 0
    while listed < #cases and cases[listed + 1].seconds >= LISTED_SECONDS do listed = listed + 1 end
    out:write(("\nCases, slowest first (%d of %d; the rest took under %gs each), then their CPU seconds\n")
      :format(listed, #cases, LISTED_SECONDS))
    for i = 1, listed do
      local c = cases[i]
      local where = c.written_at or c.file
      if c.written_at and c.written_at:sub(1, #c.file + 1) ~= c.file .. ":" then
        where = c.file .. " (" .. c.written_at .. ")"
      end
      out:write(("%8.2f %7.2f  %s  %s%s\n"):format(c.seconds, c.cpu, where, c.name,
        c.status == "success" and "" or " [" .. tostring(c.status) .. "]"))
    end
    out:flush()
    return nil, true
  end

  busted.subscribe({ "file", "start" }, on_file_start)
  busted.subscribe({ "file", "end" }, on_file_end)
  busted.subscribe({ "test", "start" }, on_test_start)
  busted.subscribe({ "test", "end" }, on_test_end)
  busted.subscribe({ "exit" }, on_exit)
  return terminal
end
