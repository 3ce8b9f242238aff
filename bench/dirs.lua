--- Directories: a tree of 10,000 files totalling 100 MB into a local session and back out, and
-- a listing of a directory of 10,000 entries.
--   in   session:write_dir_from(path, local_dir), against `tar -cf - | curl -T -` into the same
--        agent route (PUT /v1/fs/tar) and against one session:write_files call per file
--   out  session:read_dir_to(path, local_dir), against `curl -o - | tar -xf -` of GET /v1/fs/tar
--   list session:list(path) of 10,000 entries (all of them, every page)
-- Each side runs ROUNDS times, interleaved, and keeps its fastest round (the file-by-file side
-- once: it is the slow one by design).
--   lua5.4 bench/dirs.lua
-- Prints RESULT { files, bytes, put = { sandkit, curl, write_files }, get = { sandkit, curl },
-- list = { entries, ms, rounds } } or { skipped = why }.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local ROUNDS = 3
local LIST_ROUNDS = 10
local DIRS, PER_DIR, FILE_BYTES = 100, 100, 10000
local FILES = DIRS * PER_DIR
local BYTES = FILES * FILE_BYTES

local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function timed(fn)
  local t0 = common.now()
  fn()
  return common.now() - t0
end

local function best(seconds)
  local fastest = math.huge
  for _, s in ipairs(seconds) do fastest = math.min(fastest, s) end
  local rounds = {}
  for i, s in ipairs(seconds) do rounds[i] = BYTES / s / common.MB end
  return { seconds = fastest, mb_per_s = BYTES / fastest / common.MB, files_per_s = FILES / fastest,
    rounds = rounds }
end

local function sh(command)
  local status = os.execute(command)
  assert(status == true or status == 0, command)
end

--- The tree: DIRS directories of PER_DIR files, each FILE_BYTES of random bytes, one read of
-- /dev/urandom cut into pieces. Returns the tree's path and its files as { [path] = bytes }.
local function make_tree(at)
  sh("rm -rf " .. quote(at) .. " && mkdir -p " .. quote(at))
  local f = assert(io.open("/dev/urandom", "rb"))
  local random = f:read(BYTES)
  f:close()
  local contents, n = {}, 0
  for d = 1, DIRS do
    local dir = string.format("%s/d%03d", at, d)
    sh("mkdir " .. quote(dir))
    for i = 1, PER_DIR do
      local bytes = random:sub(n * FILE_BYTES + 1, (n + 1) * FILE_BYTES)
      n = n + 1
      local name = string.format("d%03d/f%03d.bin", d, i)
      local out = assert(io.open(at .. "/" .. name, "wb"))
      out:write(bytes)
      out:close()
      contents["/" .. name] = bytes
    end
  end
  return contents
end

local function curl(args, before)
  local p = assert(io.popen((before or "") .. "curl -s -w '%{http_code}' " .. args))
  local code = p:read("a")
  p:close()
  return code
end

common.result(common.with_sandbox(function(sandbox, sessions)
  local session = sessions.create()
  local features = session.record.features or {}
  if not features.fsTar or not features.fs then
    return { skipped = "the agent does not offer the fs and fsTar extensions" }
  end
  local dir = sandbox.provider:dir(session.id)
  local source, back = common.out .. "/dirs-tree", common.out .. "/dirs-back"
  local contents = make_tree(source)
  -- curl takes its headers from a private file, so the token never shows in a process list.
  local headers = dir .. "/curl-headers"
  os.remove(headers)
  assert(core.write_private(headers, "Authorization: Bearer " .. session.record.token .. "\n"))
  local reach, base = common.agent_address(session.record)
  local url = base .. "/v1/fs/tar?path="
  local runs = { put = { sandkit = {}, curl = {} }, get = { sandkit = {}, curl = {} } }
  -- Every round writes to paths of its own, and nothing is removed before the writes are timed
  -- (the gets, which remove their local copy each round, come after): on a filesystem without a
  -- journal (ext4 as this machine's is), the kernel passes over every inode freed in the last
  -- minute each time it picks one for a new file, so a tree written right after 10,000 files
  -- were removed took several times as long as one written into a quiet filesystem, whichever
  -- way it was written (bench/RESULTS.md). And every timed round starts with nothing left for the
  -- disk to write (`sync`, untimed): else each round pays the writeback of the tree the round
  -- before it wrote, and the first pays the source tree's, so a row compared one side's disk
  -- with the other's.
  for round = 1, ROUNDS do
    sh("sync")
    table.insert(runs.put.sandkit, timed(function() assert(session:write_dir_from("/sk" .. round, source)) end))
    sh("sync")
    table.insert(runs.put.curl, timed(function()
      assert(curl(reach .. "-T - -H @" .. quote(headers) .. " " .. quote(url .. "/curl" .. round),
        "tar -cf - -C " .. quote(source) .. " . | ") == "204")
    end))
  end
  -- One write_files call per file: the way there was before directories travelled whole.
  sh("sync")
  local each = timed(function()
    for path, bytes in pairs(contents) do assert(session:write_files{ ["/each" .. path] = bytes }) end
  end)
  for _ = 1, ROUNDS do
    sh("rm -rf " .. quote(back) .. " && sync")
    table.insert(runs.get.sandkit, timed(function() assert(session:read_dir_to("/sk1", back)) end))
    assert(io.open(back .. "/d100/f100.bin", "rb"), "the tree came back whole"):close()
    sh("rm -rf " .. quote(back) .. " && mkdir " .. quote(back) .. " && sync")
    table.insert(runs.get.curl, timed(function()
      sh("curl -sf " .. reach .. "-H @" .. quote(headers) .. " " .. quote(url .. "/sk1")
        .. " | tar -xf - -C " .. quote(back))
    end))
  end
  -- The listing: 10,000 empty files in one directory.
  assert(session:mkdir("/flat"))
  assert(session:exec({ "sh", "-c", "seq -w 1 10000 | xargs touch" }, { timeout = 60, cwd = "/flat" }))
  local list_ms, entries = {}, 0
  for i = 1, LIST_ROUNDS do
    list_ms[i] = timed(function() entries = #assert(session:list("/flat")) end) * 1000
  end
  local fastest = math.huge
  for _, v in ipairs(list_ms) do fastest = math.min(fastest, v) end
  sh("rm -rf " .. quote(source) .. " " .. quote(back))
  return {
    files = FILES,
    bytes = BYTES,
    put = { sandkit = best(runs.put.sandkit), curl = best(runs.put.curl), write_files = best({ each }) },
    get = { sandkit = best(runs.get.sandkit), curl = best(runs.get.curl) },
    list = { entries = entries, ms = fastest, rounds = list_ms },
    peak_rss = common.status_bytes("self", "VmHWM"),
  }
end))
