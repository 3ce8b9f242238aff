--- A local session's resource limits: `create{ limits = { memory =, pids =, cpu =, disk = } }`,
-- checked here and enforced by the session's agent in control groups of its own
-- (src/agent/limits.h). What this machine can enforce is asked of the agent itself
-- (`sandkit-agent --probe-limits`), once per sandbox and only by what needs the answer.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local wait = require "sandkit.wait"

local limits = {}

local CREATE = "sandbox.create"

--- The bounds, as the agent keeps them (src/agent/limits.h): below the minimums a shell cannot
-- start, so every command would fail saying nothing of the limit; the maximums are far beyond
-- any machine.
limits.MEMORY_MIN = 8 * 1024 * 1024
limits.MEMORY_MAX = 2 ^ 50
limits.PIDS_MIN = 8
limits.PIDS_MAX = 4194304
limits.CPU_MIN = 0.01
limits.CPU_MAX = 1024
--- A disk is an ext4 filesystem of that size: below 16 MiB its own journal and tables leave a
-- session almost nothing.
limits.DISK_MIN = 16 * 1024 * 1024
limits.DISK_MAX = 2 ^ 50
--- Where Debian's e2fsprogs puts the program that makes a session's disk.
limits.MKFS = { "/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4" }

--- The resources a limit may name, in the order capabilities and errors list them.
limits.NAMES = { "memory", "pids", "cpu", "disk" }
local KNOWN = { memory = true, pids = true, cpu = true, disk = true }

--- Seconds mkfs.ext4 may take to make a session's disk: it writes a few tables, in milliseconds.
local MKFS_TIMEOUT = 30

local function bad(field, why)
  return errors.invalid_input(CREATE, "limits", "limits." .. field .. " " .. why)
end

--- Checks a create's `limits` against the rules and against what `enforced` (a set, as
-- limits.probe returns) says this machine can enforce: the limits as the record keeps them
-- ({ memory =, pids =, cpu = }, nil for none), or nil and INVALID_INPUT.
function limits.check(given, enforced)
  if given == nil then return nil end
  if type(given) ~= "table" then
    return nil, errors.invalid_input(CREATE, "limits", "limits is a table { memory =, pids =, cpu =, disk = }")
  end
  for k in pairs(given) do
    if not KNOWN[k] then
      return nil, errors.invalid_input(CREATE, "limits", "limits takes memory, pids, cpu and disk, not "
        .. tostring(k))
    end
  end
  local memory, pids, cpu = given.memory, given.pids, given.cpu
  if memory ~= nil and not (json.integer(memory) and memory >= limits.MEMORY_MIN and memory <= limits.MEMORY_MAX) then
    return nil, bad("memory", "is a whole number of bytes from " .. limits.MEMORY_MIN
      .. " (8 MiB: less and a shell cannot start) to 2^50")
  end
  if pids ~= nil and not (json.integer(pids) and pids >= limits.PIDS_MIN and pids <= limits.PIDS_MAX) then
    return nil, bad("pids", "is a whole number of processes from " .. limits.PIDS_MIN
      .. " (less and a shell cannot run a pipeline) to " .. limits.PIDS_MAX)
  end
  -- The kernel's quota counts in hundredths of a core at best (1 ms in 100).
  if cpu ~= nil and not (type(cpu) == "number" and cpu >= limits.CPU_MIN and cpu <= limits.CPU_MAX
      and math.abs(cpu * 100 - math.floor(cpu * 100 + 0.5)) < 1e-6) then
    return nil, bad("cpu", "is a number of cores from 0.01 to 1024 in hundredths (1.5, 0.25)")
  end
  local disk = given.disk
  if disk ~= nil and not (json.integer(disk) and disk >= limits.DISK_MIN and disk <= limits.DISK_MAX) then
    return nil, bad("disk", "is a whole number of bytes from " .. limits.DISK_MIN
      .. " (16 MiB: less and the filesystem's own bookkeeping leaves no room) to 2^50")
  end
  for _, name in ipairs{ "memory", "pids", "cpu" } do
    if given[name] ~= nil and not enforced[name] then
      return nil, bad(name, "cannot be enforced here: the agent finds no cgroup v2 group delegating the "
        .. name .. " controller, nor a writable cgroup v1 hierarchy for it (as root)")
    end
  end
  if disk ~= nil and not enforced.disk then
    return nil, bad("disk", "cannot be enforced here: a session's disk is a loop device's filesystem, "
      .. "which only sandkit run as root may attach, for a confined session (isolate = \"bwrap\")")
  end
  if memory == nil and pids == nil and cpu == nil and disk == nil then return nil end
  return { memory = memory, pids = pids, cpu = cpu, disk = disk }
end

--- The agent's flags for a record's limits.
function limits.argv(argv, kept)
  if not kept then return end
  if kept.memory then
    argv[#argv + 1] = "--memory"
    argv[#argv + 1] = string.format("%d", kept.memory)
  end
  if kept.pids then
    argv[#argv + 1] = "--pids"
    argv[#argv + 1] = string.format("%d", kept.pids)
  end
  if kept.cpu then
    argv[#argv + 1] = "--cpus"
    argv[#argv + 1] = string.format("%.2f", kept.cpu)
  end
end

--- Makes the session's disk of `bytes` at `path`: a sparse file holding an ext4 filesystem whose
-- root belongs to `owner` (the sandbox user's host uid). true, or nil and INVALID_INPUT.
function limits.make_disk(path, bytes, owner)
  local mkfs
  for _, candidate in ipairs(limits.MKFS) do
    local f = io.open(candidate)
    if f then
      f:close()
      mkfs = mkfs or candidate
    end
  end
  if not mkfs then
    return nil, bad("disk", "needs mkfs.ext4 (Debian package e2fsprogs) to make the session's disk")
  end
  local f, err = io.open(path, "wb")
  if f then
    -- Sparse: the session's disk takes room only as the session writes.
    local ok = f:seek("set", bytes - 1) and f:write("\0")
    f:close()
    if not ok then f, err = nil, "cannot size " .. path end
  end
  if not f then return nil, errors.invalid_input(CREATE, "root", tostring(err)) end
  local log = path .. ".log"
  local pid, serr = core.spawn({ mkfs, "-q", "-F", "-m", "0", "-E", string.format("root_owner=%d:%d", owner, owner),
    path }, { stdout = log, stderr = log })
  local status
  if pid then
    local deadline = core.now() + MKFS_TIMEOUT
    local done
    repeat
      done, status = core.reap(pid)
      if not done then wait.sleep(0.01) end
    until done or core.now() >= deadline
    if not done then
      core.kill(pid, core.SIGKILL)
      core.reap(pid, true)
    end
  end
  local said = io.open(log)
  local text = said and said:read("a") or tostring(serr)
  if said then said:close() end
  os.remove(log)
  if status ~= 0 then
    os.remove(path)
    return nil, bad("disk", "could not be made: mkfs.ext4 said " .. text:gsub("%s+$", ""))
  end
  return true
end

--- What this machine lets the agent at `agent` enforce: { memory = bool, pids = bool, cpu = bool,
-- disk = false }; none when the agent cannot say.
function limits.probe(agent)
  local enforced = { memory = false, pids = false, cpu = false, disk = false }
  if not agent then return enforced end
  -- A fresh private file of this machine's temporary folder (mkstemp) takes the answer.
  local out = os.tmpname()
  -- Waited for without yielding, so that capabilities() works in any phase of nginx too: the
  -- probe makes and removes a directory per controller, a few milliseconds.
  local pid = core.spawn({ agent, "--probe-limits" }, { stdout = out, stderr = "/dev/null" })
  if pid then core.reap(pid, true) end
  local f = io.open(out)
  local words = f and f:read("a") or ""
  if f then f:close() end
  os.remove(out)
  for word in words:gmatch("%a+") do
    if enforced[word] ~= nil then enforced[word] = true end
  end
  return enforced
end

return limits
