--- Files: 1 GiB into a local session and back out, sandkit against curl on the same agent.
--   sandkit  session:write_file_from(path, local_file) and session:read_file_to(path, local_file)
--   curl     curl -T (PUT with Content-Length) and curl -o against the same /v1/files/raw route
--   copy     cat src > dst beside the session's files: the disk's own pace, what either
--            direction moves at best
-- Both sides move the same bytes over the agent's rawFiles extension; each runs ROUNDS times,
-- interleaved, and keeps its fastest round. An agent without rawFiles moves files of 32 MiB at
-- most, so the benchmark is skipped there and says why.
--   lua5.4 bench/files.lua
-- Prints RESULT { bytes, put = { sandkit, curl }, get = { sandkit, curl }, copy } or { skipped = why }.

package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local common = require "common"
local core = require "sandkit.core"

local ROUNDS = 3
local BYTES = common.GIB

local function quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local SETTLE = common.out .. "/files-settle.bin"

--- Seconds fn took, started on a settled disk and settled memory, both outside the clock.
-- What an earlier step left dirty is written out first, so no step pays for the writeback of
-- the one before it: without it, sandkit's get ran while curl's put was still going to the
-- disk, and curl's get after a file whose removal dropped its dirty pages. Then a little more
-- than the step's bytes is written to a file and removed again (its pages dropped unwritten):
-- this VM hands memory the kernel frees back to its host after a few seconds (the balloon's
-- free page reporting), and the step that touches it first pays to have it back, 1-2 CPU s a
-- GiB. Without this, whichever step came first after the sync paid it: the first get of a
-- round ran at 450-1200 MB/s, the second at 2300-2600.
local function timed(fn)
  assert(os.execute("sync"))
  assert(os.execute("dd if=/dev/zero of=" .. quote(SETTLE) .. " bs=1M count=" .. (BYTES // 1048576 + 64)
    .. " status=none"))
  os.remove(SETTLE)
  local t0 = common.now()
  fn()
  return common.now() - t0
end

local function best(seconds)
  local fastest = math.huge
  for _, s in ipairs(seconds) do fastest = math.min(fastest, s) end
  local rounds = {}
  for i, s in ipairs(seconds) do rounds[i] = BYTES / s / common.MB end
  return { seconds = fastest, mb_per_s = BYTES / fastest / common.MB, rounds = rounds }
end

local function size_of(path)
  local f = assert(io.open(path, "rb"))
  local n = f:seek("end")
  f:close()
  return n
end

local function curl(args)
  local p = assert(io.popen("curl -s -w '%{http_code}' " .. args))
  local code = p:read("a")
  p:close()
  return code
end

common.result(common.with_sandbox(function(sandbox, sessions)
  local session = sessions.create()
  if not (session.record.features or {}).rawFiles then
    return { skipped = "the agent does not offer the rawFiles extension" }
  end
  local dir = sandbox.provider:dir(session.id)
  local source, back = common.out .. "/files-1g.bin", common.out .. "/files-back.bin"
  assert(os.execute("head -c " .. BYTES .. " /dev/urandom > " .. quote(source)))
  -- curl takes its headers from a private file, so the token never shows in a process list.
  local headers = dir .. "/curl-headers"
  os.remove(headers)
  assert(core.write_private(headers, "Authorization: Bearer " .. session.record.token .. "\n"))
  local reach, base = common.agent_address(session.record)
  local url = base .. "/v1/files/raw?path="
  local runs = { put = { sandkit = {}, curl = {} }, get = { sandkit = {}, curl = {} }, copy = {} }
  local copied = dir .. "/local-copy.bin"
  for _ = 1, ROUNDS do
    table.insert(runs.copy, timed(function()
      assert(os.execute("cat " .. quote(source) .. " > " .. quote(copied)))
    end))
    assert(size_of(copied) == BYTES)
    os.remove(copied)
    -- Each put makes a fresh file, as the copy does: replacing a file a round before left
    -- costs ext4 a flush of the new file's blocks at the rename (auto_da_alloc), which made an
    -- overwriting put half as fast as a fresh one on this disk and timed the disk, not the put.
    assert(session:remove("/sandkit.bin"))
    assert(session:remove("/curl.bin"))
    table.insert(runs.put.sandkit, timed(function()
      assert(assert(session:write_file_from("/sandkit.bin", source)) == BYTES)
    end))
    table.insert(runs.put.curl, timed(function()
      assert(curl(reach .. "-H @" .. quote(headers) .. " -T " .. quote(source) .. " " .. quote(url .. "/curl.bin"))
        == "204")
    end))
    table.insert(runs.get.sandkit, timed(function()
      assert(assert(session:read_file_to("/sandkit.bin", back)) == BYTES)
    end))
    assert(size_of(back) == BYTES)
    os.remove(back)
    table.insert(runs.get.curl, timed(function()
      assert(curl(reach .. "-H @" .. quote(headers) .. " -o " .. quote(back) .. " " .. quote(url .. "/curl.bin"))
        == "200")
    end))
    assert(size_of(back) == BYTES)
    os.remove(back)
  end
  os.remove(source)
  return {
    bytes = BYTES,
    put = { sandkit = best(runs.put.sandkit), curl = best(runs.put.curl) },
    get = { sandkit = best(runs.get.sandkit), curl = best(runs.get.curl) },
    copy = best(runs.copy),
    peak_rss = common.status_bytes("self", "VmHWM"),
  }
end))
