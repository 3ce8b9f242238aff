--- How the local provider's image_build makes a Debian system: its options checked, and
-- mmdebstrap run into an image's staging folder (images.lua makes an image of the tree).
--
--   <staging>/build      the tree mmdebstrap makes
--   <staging>/build.log  what mmdebstrap says; its "E:" lines name a failure

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local options_check = require "sandkit.options"
local wait = require "sandkit.wait"
local state = require "sandkit.providers.local.state"

local mmdebstrap = {}

--- A build's suite and packages as Debian names them; the packages' count bounds the command line.
local SUITE_PATTERN = "^[a-z][a-z0-9.-]*$"
local PACKAGE_PATTERN = "^[a-z0-9][a-z0-9+.-]*$"
local MAX_PACKAGES = 256
local DEFAULT_SUITE = "bookworm"
--- mmdebstrap's smallest system: Debian's Essential packages, a shell and coreutils among them.
local DEFAULT_VARIANT = "essential"
local VARIANTS = { essential = true, minbase = true, apt = true, required = true, important = true,
  standard = true }
--- Seconds a build may take before it is stopped: a mirror on a slow line takes minutes.
local BUILD_TIMEOUT = 1800
--- How often a build's end is looked for: nothing waits on it but the caller.
local POLL_SECONDS = 0.1
--- Seconds between asking a build that ran out of time to stop and killing it.
local STOP_GRACE = 0.5

--- The path of mmdebstrap: the option, or $PATH's; nil when it is nowhere.
local function find_tool(given)
  if given then return state.file_exists(given) and given or nil end
  for dir in (os.getenv("PATH") or "/usr/bin"):gmatch("[^:]+") do
    if state.file_exists(dir .. "/mmdebstrap") then return dir .. "/mmdebstrap" end
  end
end

--- mmdebstrap's hook that makes the system merged-/usr itself where the suite has Debian's
-- usr-is-merged package (bookworm on), as debootstrap does: otherwise the Essential set's
-- init-system-helpers pulls in usrmerge, and with it perl, which then converts the tree —
-- 51 MB more in the image and 4-8 s more a build here. Debian's package keeps its hooks in
-- /usr/share; a checkout of mmdebstrap beside the script. Without the hook, the build is
-- Debian's plain one.
local MERGED_USR_HOOK = "hooks/maybe-merged-usr"
local MMDEBSTRAP_SHARE = "/usr/share/mmdebstrap"

local function merged_usr_hook(tool)
  for _, dir in ipairs({ tool:match("^(.*)/[^/]*$") or ".", MMDEBSTRAP_SHARE }) do
    local hook = dir .. "/" .. MERGED_USR_HOOK
    if state.file_exists(hook .. "/setup00.sh") then return hook end
  end
end

--- Packages as a list, from a list or a comma-separated text: the list, or nil and why.
local function package_list(op, packages)
  if packages == nil then return {} end
  local list = {}
  if type(packages) == "string" then
    for p in packages:gmatch("[^,]+") do list[#list + 1] = p end
  elseif type(packages) == "table" then
    for i, p in ipairs(packages) do list[i] = p end
  else
    return nil, errors.invalid_input(op, "packages", "packages is a list of Debian package names")
  end
  if #list > MAX_PACKAGES then
    return nil, errors.invalid_input(op, "packages", "at most " .. MAX_PACKAGES .. " packages")
  end
  for _, p in ipairs(list) do
    if type(p) ~= "string" or #p > 128 or not p:match(PACKAGE_PATTERN) then
      return nil, errors.invalid_input(op, "packages", "a package is named by [a-z0-9+.-], not " .. tostring(p))
    end
  end
  return list
end

--- A build from image_build's options ({ suite =, packages =, variant =, mirror =, mmdebstrap =,
-- timeout = }), checked before anything is made: { argv, timeout, origin }, or nil and why.
-- argv lacks the target, which run adds.
function mmdebstrap.plan(op, opts)
  local tool = find_tool(opts.mmdebstrap)
  if not tool then
    return nil, errors.invalid_input(op, "mmdebstrap", "mmdebstrap is not installed (Debian package mmdebstrap)"
      .. (opts.mmdebstrap and (": " .. opts.mmdebstrap .. " does not exist") or ""))
  end
  local suite = opts.suite or DEFAULT_SUITE
  if type(suite) ~= "string" or #suite > 64 or not suite:match(SUITE_PATTERN) then
    return nil, errors.invalid_input(op, "suite", "a suite is a Debian suite's name (bookworm, trixie), not "
      .. tostring(suite))
  end
  local variant = opts.variant or DEFAULT_VARIANT
  if not VARIANTS[variant] then
    return nil, errors.invalid_input(op, "variant", "variant is one of mmdebstrap's: essential, minbase, apt, "
      .. "required, important, standard")
  end
  local packages, perr = package_list(op, opts.packages)
  if not packages then return nil, perr end
  -- One word of mmdebstrap's command line, which a space or a quote would split or change.
  local mirror = opts.mirror
  if mirror ~= nil and (type(mirror) ~= "string" or not mirror:match("^%a[%w+.-]*://[%w%-._~:/%%@]+$")) then
    return nil, errors.invalid_input(op, "mirror", "mirror is a URL (http://deb.debian.org/debian)")
  end
  local timeout, terr = options_check.seconds(op, opts, "timeout", BUILD_TIMEOUT)
  if not timeout then return nil, terr end
  local argv = { tool, "--variant=" .. variant }
  local hook = merged_usr_hook(tool)
  if hook then argv[#argv + 1] = "--hook-dir=" .. hook end
  if #packages > 0 then argv[#argv + 1] = "--include=" .. table.concat(packages, ",") end
  argv[#argv + 1] = suite
  return { argv = argv, mirror = mirror, timeout = timeout,
    origin = "build " .. suite .. (#packages > 0 and (" +" .. table.concat(packages, ",")) or "") }
end

--- Runs `plan` into the staging folder `tmp`: true once <tmp>/build holds the system, else nil
-- and why, with `tmp` removed (also when the caller is interrupted, whose error then goes on).
function mmdebstrap.run(op, plan, tmp)
  local argv = {}
  for i, word in ipairs(plan.argv) do argv[i] = word end
  argv[#argv + 1] = tmp .. "/build"
  if plan.mirror then argv[#argv + 1] = plan.mirror end
  local log = tmp .. "/build.log"
  local pid, serr = core.spawn(argv, { stdout = log, stderr = log })
  if not pid then
    core.remove_tree(tmp)
    return nil, errors.invalid_input(op, "mmdebstrap", "cannot run mmdebstrap: " .. tostring(serr))
  end
  local deadline = core.now() + plan.timeout
  local done, status = core.reap(pid)
  local ok, interrupted = pcall(function()
    while not done and core.now() < deadline do
      wait.sleep(POLL_SECONDS)
      done, status = core.reap(pid)
    end
  end)
  if not done then
    -- Out of time, or the caller was interrupted: mmdebstrap and what it runs go.
    core.kill(pid, core.SIGTERM)
    wait.sleep(STOP_GRACE)
    core.kill(pid, core.SIGKILL)
    core.reap(pid, true)
    core.remove_tree(tmp)
    if not ok then error(interrupted, 0) end
    return nil, errors.invalid_input(op, "timeout", "mmdebstrap did not finish within " .. plan.timeout .. " s")
  end
  if status ~= 0 then
    -- mmdebstrap's errors are its lines starting "E:"; the last of them says what failed first.
    local said = {}
    for line in (state.read_file(log) or ""):gmatch("[^\n]+") do
      if line:match("^E: ") and #said < 3 then said[#said + 1] = line:sub(4, 300) end
    end
    core.remove_tree(tmp)
    return nil, errors.invalid_input(op, "suite", "mmdebstrap failed (status " .. tostring(status) .. "): "
      .. table.concat(said, "; "))
  end
  return true
end

--- What a finished build leaves in the staging folder once its tree is taken: nothing.
function mmdebstrap.clean(tmp)
  core.remove_tree(tmp .. "/build")
  os.remove(tmp .. "/build.log")
end

return mmdebstrap
