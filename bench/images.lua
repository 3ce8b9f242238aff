--- Images: what starting a session from a 300 MB image costs, against starting one on this
-- machine's system folders.
--   create  sandbox:create{ image = "bench-300mb" } until its first session:exec({ "true" })
--           returned, and sandbox:create{} the same way, CREATES of each, alternating; each
--           session is terminated after, off the clock. The image (a busybox system and 300 MB
--           of files) is imported once, off the clock, and removed at the end.
--   lua5.4 bench/images.lua
-- Prints RESULT { image_bytes, create = { image = {…}, plain = {…} } }, each { p50, p99, mean,
-- max } in milliseconds.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local CREATES = 20
local IMAGE = "bench-300mb"
--- The image's bulk: 300 files of 1 MB, as a system's libraries are many files, not one.
local FILES, FILE_BYTES = 300, 1000 * 1000
local BUSYBOX = "/bin/busybox"

local function summary(samples)
  table.sort(samples)
  local sum = 0
  for _, v in ipairs(samples) do sum = sum + v end
  return { p50 = common.percentile(samples, 50) * 1000, p99 = common.percentile(samples, 99) * 1000,
    mean = sum / #samples * 1000, max = samples[#samples] * 1000 }
end

local function sh(command)
  local ok = os.execute(command)
  assert(ok == true or ok == 0, command .. " failed")
end

--- The tree of the image, made under bench/out: busybox as /bin, FILES files of bulk.
local function make_tree(dir)
  core.remove_tree(dir)
  sh("mkdir -p " .. dir .. "/bin " .. dir .. "/data && cp " .. BUSYBOX .. " " .. dir .. "/bin/busybox")
  sh("ln -s busybox " .. dir .. "/bin/sh && ln -s busybox " .. dir .. "/bin/true")
  local block = string.rep("i", FILE_BYTES)
  for i = 1, FILES do
    local f = assert(io.open(string.format("%s/data/%03d", dir, i), "wb"))
    f:write(block)
    f:close()
  end
end

local function create_to_exec(sb, opts)
  local t0 = common.now()
  local session = assert(sb:create(opts))
  local r = assert(session:exec({ "true" }, { timeout = 10 }))
  local seconds = common.now() - t0
  assert(r.code == 0, "true exited " .. tostring(r.code))
  assert(sb:terminate(session.id))
  return seconds
end

local sandbox = common.sandbox()
local tree = common.out .. "/image-tree"
make_tree(tree)
sandbox:image_remove(IMAGE)
local meta = assert(sandbox:image_import(IMAGE, tree))
core.remove_tree(tree)
local ok, result = xpcall(function()
  local image, plain = {}, {}
  for i = 1, CREATES do
    image[i] = create_to_exec(sandbox, { image = IMAGE })
    plain[i] = create_to_exec(sandbox, {})
  end
  return { image_bytes = meta.size, create = { image = summary(image), plain = summary(plain) } }
end, debug.traceback)
sandbox:image_remove(IMAGE)
if not ok then error(result, 0) end
common.result(result)
