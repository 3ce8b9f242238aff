-- A session's files as a filesystem, against the real sandkit-agent (docs/protocol.md §6 fs,
-- fsTar, fsWatch): listing with its pages, cursors and depth; stat; removal and renaming; a
-- directory as a tar stream both ways, hostile archives included; and watches.

local cjson = require "cjson"
local core = require "sandkit.core"
local socket = require "socket"
local fake_http = require "support.fake_http"
local files = require "support.files"
local raw = require "support.raw_http"
local tar = require "support.tar"
local agent_process = require "support.agent_process"

local read_file, write_file, shell_quote = files.read, files.write, files.shell_quote
local start_agent, within, exists, run = agent_process.start_agent, agent_process.within,
  agent_process.exists, agent_process.run

local function query(p)
  return (p:gsub("[^%w%-_./]", function(ch) return string.format("%%%02X", ch:byte()) end))
end

local function sh(cmd)
  assert(files.execute(cmd), cmd)
end

--- Sends a chunked PUT whose body read() gives, and stops sending as soon as the agent has
-- answered (a refusal comes before the body's end). Returns status, body, bytes sent.
local function put_stream(A, target, read)
  local c = assert(raw.connect(A.port, nil, 60))
  local h = A:auth()
  h["Transfer-Encoding"] = "chunked"
  assert(c:request("PUT", target, h))
  local sent, answered = 0, false
  while true do
    local readable = socket.select({ c.sock }, nil, 0)
    if #readable > 0 then
      answered = true
      break
    end
    local piece = read()
    if not piece then break end
    if not c:send(string.format("%x\r\n", #piece) .. piece .. "\r\n") then
      answered = true
      break
    end
    sent = sent + #piece
  end
  if not answered then c:send("0\r\n\r\n") end
  local status = assert(c:read_head())
  local body = c:read_body()
  c:close()
  return status, body, sent
end

local function put_archive(A, path, archive, extra)
  local done = false
  return put_stream(A, "/v1/fs/tar?path=" .. query(path) .. (extra or ""), function()
    if done then return nil end
    done = true
    return archive
  end)
end

local function list(A, path, extra)
  local res, value = A:json("GET", "/v1/fs/list?path=" .. query(path) .. (extra or ""))
  return res, value
end

local function names(entries)
  local out = {}
  for i, e in ipairs(entries) do out[i] = e.path end
  return out
end

--- Temporary files an extraction or upload leaves in dir: none, ever.
local function leftovers(dir)
  return run("find " .. shell_quote(dir) .. " -name '.sandkit-*' 2>/dev/null")
end

describe("sandkit-agent's files as a filesystem", function()
  local A

  setup(function()
    A = assert(start_agent())
  end)

  teardown(function()
    assert.are.equal(0, A:stop())
  end)

  describe("list", function()
    it("lists a directory's entries in name order with type, size, mode, time and a link's target", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/l1/sub") .. " && cd " .. shell_quote(A.root .. "/l1")
        .. " && printf abc > b.txt && chmod 640 b.txt && ln -s /etc/passwd link && mkfifo fifo"
        .. " && touch -d @1700000000 b.txt")
      local res, value = list(A, "/l1")
      assert.are.equal(200, res.status, res.body)
      assert.are.same({ "/l1/b.txt", "/l1/fifo", "/l1/link", "/l1/sub" }, names(value.entries))
      local b = value.entries[1]
      assert.are.same({ "b.txt", "file", 3, tonumber("640", 8), 1700000000 },
        { b.name, b.type, b.size, b.mode, b.mtime })
      assert.are.equal("other", value.entries[2].type)
      assert.are.same({ "symlink", "/etc/passwd" }, { value.entries[3].type, value.entries[3].target })
      assert.are.equal("dir", value.entries[4].type)
      assert.are.equal(cjson.null, value.next)
    end)

    it("descends depth levels, each directory's entries right after it, never through a link", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/l2/a/b/c") .. " && touch " .. shell_quote(A.root .. "/l2/a/b/c/deep")
        .. " && touch " .. shell_quote(A.root .. "/l2/z") .. " && ln -s /etc " .. shell_quote(A.root .. "/l2/etc"))
      local _, value = list(A, "/l2", "&depth=3")
      assert.are.same({ "/l2/a", "/l2/a/b", "/l2/a/b/c", "/l2/etc", "/l2/z" }, names(value.entries))
      _, value = list(A, "l2/", "&depth=32")
      assert.are.same({ "/l2/a", "/l2/a/b", "/l2/a/b/c", "/l2/a/b/c/deep", "/l2/etc", "/l2/z" }, names(value.entries))
      _, value = list(A, "/", "&depth=1")
      assert.is_true(#value.entries > 0)
      assert.are.equal("/l1", value.entries[1].path)
    end)

    it("pages with a cursor, each entry once, until next is null", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/l3/d") .. " && cd " .. shell_quote(A.root .. "/l3")
        .. " && for i in 01 02 03 04 05 06 07 08 09 10 11 12; do touch f$i d/g$i; done")
      local _, whole = list(A, "/l3", "&depth=2")
      assert.are.equal(25, #whole.entries)
      local seen, cursor, pages = {}, nil, 0
      repeat
        local res, page = list(A, "/l3", "&depth=2&limit=7" .. (cursor and ("&cursor=" .. query(cursor)) or ""))
        assert.are.equal(200, res.status, res.body)
        assert.is_true(#page.entries <= 7)
        for _, e in ipairs(page.entries) do seen[#seen + 1] = e.path end
        cursor = page.next ~= cjson.null and page.next or nil
        pages = pages + 1
      until not cursor
      assert.are.same(names(whole.entries), seen)
      assert.is_true(pages >= 4)
    end)

    it("ends a page once its JSON passed 1 MiB, and goes on from its cursor", function()
      -- 255-byte names of control bytes: every byte is six in JSON, twice (name and path).
      local dir = A.root .. "/l4"
      sh("mkdir " .. shell_quote(dir))
      for i = 1, 800 do
        local f = assert(io.open(dir .. "/" .. string.format("%05d", i) .. string.rep("\1", 250), "w"))
        f:close()
      end
      local res, page = list(A, "/l4", "&limit=10000")
      assert.are.equal(200, res.status)
      assert.is_true(#res.body > 1024 * 1024 and #res.body < 1024 * 1024 + 65536, #res.body)
      assert.is_true(#page.entries < 800)
      assert.are.equal(page.entries[#page.entries].name, page.next)
      local total = #page.entries
      repeat
        res, page = list(A, "/l4", "&limit=10000&cursor=" .. query(page.next))
        assert.is_true(#res.body < 1024 * 1024 + 65536, #res.body)
        total = total + #page.entries
      until page.next == cjson.null
      assert.are.equal(800, total)
    end)

    it("refuses a listing 503 while pages their callers do not read pass 16 MiB, and frees them as they go", function()
      -- Callers whose receive window is a few KiB, so that what they do not read stays on the
      -- agent's side, where the kernel's send queue takes one piece of a page at most (its
      -- loopback send buffer would take them whole): LuaSocket cannot make one, Python can.
      local stall = [[
import os, socket, sys, time
port, token, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
held = []
for _ in range(n):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(("GET /v1/fs/list?path=/l4&limit=10000 HTTP/1.1\r\nHost: x\r\n"
               "Authorization: Bearer %s\r\n\r\n" % token).encode())
    held.append(s)
os.write(3, b"ready\n")
os.close(3)
time.sleep(120)
]]
      local pid, reader = assert(core.spawn({ "python3", "-c", stall, tostring(A.port), A.token, "24" },
        { ready_fd = 3 }))
      finally(function()
        core.kill(pid, core.SIGKILL)
        core.reap(pid, true)
      end)
      assert.are.equal("ready", assert(fake_http.read_line(reader, 20)))
      reader:close()
      local function answer() return list(A, "/l4", "&limit=10000") end
      -- The agent builds the 24 pages first, 24 MiB of JSON: a loaded machine takes its time.
      assert.is_true(within(30, function()
        local res = answer()
        return res.status == 503 and res.body:match("^AGENT_BUSY: list pages") ~= nil
      end), "24 unread pages of 1 MiB were not refused")
      core.kill(pid, core.SIGKILL)
      core.reap(pid, true)
      assert.is_true(within(10, function() return answer().status == 200 end), "the pages were not let go")
      sh("rm -rf " .. shell_quote(A.root .. "/l4"))
    end)
  end)

  describe("stat", function()
    it("answers exists false for an absent path, and a present one's entry, a link as a link", function()
      local _, value = A:json("GET", "/v1/fs/stat?path=/nothing/here")
      assert.are.same({ exists = false }, value)
      _, value = A:json("GET", "/v1/fs/stat?path=/l1/b.txt/under")
      assert.are.same({ exists = false }, value)
      _, value = A:json("GET", "/v1/fs/stat?path=/l1/link")
      assert.is_true(value.exists)
      assert.are.same({ "link", "/l1/link", "symlink", "/etc/passwd" },
        { value.entry.name, value.entry.path, value.entry.type, value.entry.target })
      _, value = A:json("GET", "/v1/fs/stat?path=/")
      assert.are.same({ "/", "dir" }, { value.entry.path, value.entry.type })
    end)

    it("refuses a NUL, a component over the filesystem's limit and a path over 4096 bytes", function()
      for _, p in ipairs({ "/a%00b", "/" .. string.rep("n", 300), "/" .. string.rep("d/", 2100) }) do
        local res = A:req("GET", "/v1/fs/stat?path=" .. p)
        assert.are.equal(400, res.status, p:sub(1, 20))
        assert.matches("^PATH_REFUSED: ", res.body)
      end
    end)
  end)

  describe("remove", function()
    it("removes a file, a link (not what it names), an empty directory, and an absent path alike", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/r1/empty") .. " && touch " .. shell_quote(A.root .. "/r1/f")
        .. " && ln -s " .. shell_quote(A.root .. "/l1/b.txt") .. " " .. shell_quote(A.root .. "/r1/link"))
      for _, p in ipairs({ "/r1/f", "/r1/link", "/r1/empty", "/r1/never", "/r1/f/under" }) do
        local res = A:req("POST", "/v1/fs/remove", { path = p })
        assert.are.equal(204, res.status, p .. ": " .. res.body)
      end
      assert.are.equal("", run("ls -A " .. shell_quote(A.root .. "/r1")))
      assert.is_true(exists(A.root .. "/l1/b.txt"))
    end)

    it("refuses a directory with entries unless recursive, and never follows a link out", function()
      local outside = files.temp_dir()
      write_file(outside .. "/precious", "keep")
      sh("mkdir -p " .. shell_quote(A.root .. "/r2/a/b") .. " && touch " .. shell_quote(A.root .. "/r2/a/b/x")
        .. " && ln -s " .. shell_quote(outside) .. " " .. shell_quote(A.root .. "/r2/a/out"))
      local res = A:req("POST", "/v1/fs/remove", { path = "/r2" })
      assert.are.equal(409, res.status)
      assert.matches("^PATH_EXISTS: .*recursive", res.body)
      res = A:req("POST", "/v1/fs/remove", { path = "/r2", recursive = true })
      assert.are.equal(204, res.status, res.body)
      assert.is_false(exists(A.root .. "/r2"))
      assert.are.equal("keep", read_file(outside .. "/precious"))
      sh("rm -rf " .. shell_quote(outside))
    end)

    it("refuses the root, a path that climbs, and a body that is not its shape", function()
      for _, p in ipairs({ "/", "", ".", "//" }) do
        local res = A:req("POST", "/v1/fs/remove", { path = p, recursive = true })
        assert.are.equal(400, res.status, p)
        assert.matches("^PATH_REFUSED: ", res.body)
      end
      assert.is_true(exists(A.root .. "/l1"))
      assert.are.equal(400, A:req("POST", "/v1/fs/remove", { path = "/../x" }).status)
      for _, body in ipairs({ '{}', '{"path":1}', '{"path":"/x","recursive":"yes"}', '[]',
          '{"path":"/x","path":"/y"}' }) do
        local res = A:req("POST", "/v1/fs/remove", body)
        assert.are.equal(400, res.status, body)
        assert.matches("^REQUEST_INVALID: ", res.body)
      end
    end)
  end)

  describe("rename", function()
    it("renames, making the new name's directories, and replaces only with overwrite", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/m1") .. " && printf one > " .. shell_quote(A.root .. "/m1/a")
        .. " && printf two > " .. shell_quote(A.root .. "/m1/b"))
      local res = A:req("POST", "/v1/fs/rename", { from = "/m1/a", to = "/m1/new/dir/a2" })
      assert.are.equal(204, res.status, res.body)
      assert.are.equal("one", read_file(A.root .. "/m1/new/dir/a2"))
      res = A:req("POST", "/v1/fs/rename", { from = "/m1/new/dir/a2", to = "/m1/b" })
      assert.are.equal(409, res.status)
      assert.matches("^PATH_EXISTS: .*overwrite", res.body)
      assert.are.equal("two", read_file(A.root .. "/m1/b"))
      res = A:req("POST", "/v1/fs/rename", { from = "/m1/new/dir/a2", to = "/m1/b", overwrite = true })
      assert.are.equal(204, res.status, res.body)
      assert.are.equal("one", read_file(A.root .. "/m1/b"))
      assert.are.equal(404, A:req("POST", "/v1/fs/rename", { from = "/m1/gone", to = "/m1/c" }).status)
    end)

    it("refuses a directory into itself, the root either way, and a non-empty directory to replace", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/m2/d/e") .. " " .. shell_quote(A.root .. "/m2/full/x"))
      local res = A:req("POST", "/v1/fs/rename", { from = "/m2/d", to = "/m2/d/e/f" })
      assert.are.equal(400, res.status)
      assert.matches("cannot move into itself", res.body)
      for _, body in ipairs({ { from = "/", to = "/m2/root" }, { from = "/m2/d", to = "/", overwrite = true } }) do
        res = A:req("POST", "/v1/fs/rename", body)
        assert.are.equal(400, res.status)
        assert.matches("^PATH_REFUSED: ", res.body)
      end
      res = A:req("POST", "/v1/fs/rename", { from = "/m2/d", to = "/m2/full", overwrite = true })
      assert.are.equal(409, res.status)
      assert.matches("not empty", res.body)
      assert.is_true(exists(A.root .. "/m2/d/e"))
    end)
  end)

  describe("a directory as a tar stream", function()
    it("goes out and comes back in with modes and times, and links as links", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/t1/src/sub") .. " && cd " .. shell_quote(A.root .. "/t1/src")
        .. " && printf hello > sub/f && chmod 0751 sub/f && touch -d @1600000000 sub/f && ln -s sub/f l"
        .. " && head -c 300000 /dev/urandom > big && chmod 0555 sub && touch -d @1500000000 sub")
      local res = A:req("GET", "/v1/fs/tar?path=/t1/src")
      assert.are.equal(200, res.status)
      assert.are.equal("application/x-tar", res.headers["content-type"])
      local status, body = put_archive(A, "/t1/copy", res.body)
      assert.are.equal(204, status, body)
      local function described(dir)
        -- Times to the second: what a tar header holds.
        return run("cd " .. shell_quote(dir) .. " && find . -printf '%p %y %m %s %Ts %l\\n' | sort")
      end
      assert.are.equal(described(A.root .. "/t1/src"), described(A.root .. "/t1/copy"))
      assert.are.equal(read_file(A.root .. "/t1/src/big"), read_file(A.root .. "/t1/copy/big"))
      assert.are.equal("", leftovers(A.root .. "/t1"))
    end)

    it("merges into a directory that exists, refuses a file in the way, and keeps no set-ID bits", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/t2/into") .. " && touch " .. shell_quote(A.root .. "/t2/into/kept")
        .. " && touch " .. shell_quote(A.root .. "/t2/file"))
      local archive = tar.archive(tar.entry({ name = "new", mode = tonumber("6755", 8) }, "x"))
      local status, body = put_archive(A, "/t2/into", archive)
      assert.are.equal(204, status, body)
      assert.is_true(exists(A.root .. "/t2/into/kept"))
      assert.are.equal("755\n", run("stat -c %a " .. shell_quote(A.root .. "/t2/into/new")))
      status, body = put_archive(A, "/t2/file", archive)
      assert.are.equal(400, status)
      assert.matches("exists and is not a directory", body)
      assert.are.equal(404, A:req("GET", "/v1/fs/tar?path=/t2/none").status)
      assert.are.equal(400, A:req("GET", "/v1/fs/tar?path=/t2/file").status)
    end)

    -- Each escape an archive can try; none lands, none leaves a file, and a target the upload
    -- made goes again.
    local outside_name = "escaped-" .. tostring(os.time())
    local HOSTILE = {
      { "a '../x' entry", "climbs out", function() return tar.archive(tar.entry({ name = "ok" }, "1"),
        tar.entry({ name = "../" .. outside_name }, "x")) end },
      { "an '/etc/x' entry", "absolute", function()
        return tar.archive(tar.entry({ name = "/etc/" .. outside_name }, "x")) end },
      { "a symlink, then a file through it", "symbolic link", function(agent)
        return tar.archive(tar.entry({ name = "link", type = "2", linkname = agent.dir }),
          tar.entry({ name = "link/" .. outside_name }, "x")) end },
      { "a hard link to a file outside", "hard link", function(agent)
        return tar.archive(tar.entry({ name = "h", type = "1", linkname = agent.token_file })) end },
      { "a hard link that climbs out", "hard link", function()
        return tar.archive(tar.entry({ name = "h", type = "1", linkname = "../../token" })) end },
      { "a device node", "device node", function()
        return tar.archive(tar.entry({ name = "null", type = "3", devmajor = 1, devminor = 3 })) end },
      { "a FIFO", "FIFO", function() return tar.archive(tar.entry({ name = "p", type = "6" })) end },
    }
    for i, case in ipairs(HOSTILE) do
      it("refuses " .. case[1] .. ", landing nothing", function()
        local target = "/hostile" .. i
        local status, body = put_archive(A, target, case[3](A))
        assert.are.equal(400, status, body)
        assert.matches("^ARCHIVE_REFUSED: .*" .. case[2], body)
        assert.is_false(exists(A.root .. target), "the target it made stayed")
        assert.is_false(exists(A.dir .. "/" .. outside_name))
        assert.is_false(exists("/etc/" .. outside_name))
        assert.are.equal("", leftovers(A.root))
      end)
    end

    it("keeps a hard link to an entry inside the target", function()
      local status, body = put_archive(A, "/t3", tar.archive(tar.entry({ name = "a" }, "same"),
        tar.entry({ name = "b", type = "1", linkname = "./a" })))
      assert.are.equal(204, status, body)
      assert.are.equal("2\n", run("stat -c %h " .. shell_quote(A.root .. "/t3/b")))
    end)

    it("removes what a refused archive made before it answers, however much that is", function()
      -- 3,000 files land before the entry that is refused: their removal takes long enough that
      -- an answer sent ahead of it would be read while they were still there.
      local entries = {}
      for i = 1, 3000 do entries[i] = tar.entry({ name = "d" .. (i % 30) .. "/f" .. i }, "x") end
      entries[#entries + 1] = tar.entry({ name = "../" .. outside_name }, "x")
      local status, body = put_archive(A, "/undone", tar.archive(table.unpack(entries)))
      assert.are.equal(400, status, body)
      assert.matches("^ARCHIVE_REFUSED: ", body)
      assert.is_false(exists(A.root .. "/undone"), "the target it made was there when the answer came")
    end)

    it("refuses a ten-million-entry archive at its million-entry bound, long before its end", function()
      local read, taken = tar.repeated(tar.header({ name = "d/", type = "5", mode = 493 }), 10000000)
      local status, body = put_stream(A, "/v1/fs/tar?path=/many", read)
      assert.are.equal(413, status, body)
      assert.matches("^ARCHIVE_TOO_LARGE: .*more than 1000000 entries", body)
      assert.is_true(taken() < 2000000 * 512, "read " .. taken() .. " bytes")
      assert.is_false(exists(A.root .. "/many"))
    end)

    it("refuses a 1 TB sparse header before writing a byte", function()
      local map = "1\n1099511627775\n1\n"
      local archive = tar.archive(tar.pax{ ["GNU.sparse.major"] = "1", ["GNU.sparse.minor"] = "0",
        ["GNU.sparse.name"] = "huge", ["GNU.sparse.realsize"] = "1099511627776" },
        tar.entry({ name = "GNUSparseFile.0/huge", size = 513 }, tar.padded(map) .. "z"))
      local status, body = put_archive(A, "/sparse", archive)
      assert.are.equal(413, status, body)
      assert.matches("^ARCHIVE_TOO_LARGE: .*1099511627776 bytes", body)
      assert.is_false(exists(A.root .. "/sparse"))
    end)

    it("lowers its bounds to the caller's maxEntries and maxBytes, never raises them", function()
      local archive = tar.archive(tar.entry({ name = "a" }, "12345"), tar.entry({ name = "b" }, "67890"))
      local status, body = put_archive(A, "/b1", archive, "&maxEntries=1")
      assert.are.equal(413, status)
      assert.matches("more than 1 entries", body)
      status, body = put_archive(A, "/b2", archive, "&maxBytes=9")
      assert.are.equal(413, status)
      assert.matches("past its 9%-byte bound", body)
      status = put_archive(A, "/b3", archive, "&maxEntries=99999999999&maxBytes=10")
      assert.are.equal(204, status)
      status, body = put_archive(A, "/b4", archive, "&maxEntries=-1")
      assert.are.equal(400, status)
      assert.matches("^REQUEST_INVALID: ", body)
    end)

    it("refuses a stream cut inside an entry or between two, leaving no partial file", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/cut"))
      local whole = tar.entry({ name = "first" }, string.rep("a", 2000)) .. tar.entry({ name = "second" }, "b")
      for _, case in ipairs({ { whole:sub(1, 1500), "could not be read whole" },
          { whole, "without its end%-of%-archive blocks" }, { "", "not a tar archive" } }) do
        local status, body = put_archive(A, "/cut", case[1])
        assert.are.equal(400, status, body)
        assert.matches("^ARCHIVE_INVALID: .*" .. case[2], body)
        assert.are.equal("", leftovers(A.root .. "/cut"))
      end
      assert.is_false(exists(A.root .. "/cut/first") and read_file(A.root .. "/cut/first") ~= string.rep("a", 2000))
    end)

    it("lets a caller who goes away mid-upload leave no file being written and no target it made", function()
      local c = assert(raw.connect(A.port))
      local h = A:auth()
      h["Content-Length"] = "100000"
      assert(c:request("PUT", "/v1/fs/tar?path=/gone", h))
      assert(c:send(tar.header({ name = "half", size = 50000 }) .. string.rep("h", 20000)))
      assert.is_true(within(5, function() return exists(A.root .. "/gone") end))
      c:close(true)
      assert.is_true(within(5, function() return not exists(A.root .. "/gone") end), "the target stayed")
    end)

    it("holds a stalled reader of a large archive to its bounded queue", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/t4") .. " && truncate -s 200M " .. shell_quote(A.root .. "/t4/zeros"))
      local before = tonumber(read_file("/proc/" .. A.pid .. "/status"):match("VmRSS:%s*(%d+)"))
      local c = assert(raw.connect(A.port, nil, 60))
      assert(c:request("GET", "/v1/fs/tar?path=/t4", A:auth()))
      assert.are.equal(200, (c:read_head()))
      socket.sleep(0.3)
      local held = tonumber(read_file("/proc/" .. A.pid .. "/status"):match("VmRSS:%s*(%d+)")) - before
      local got = 0
      while true do
        local chunk = c:read_chunk()
        if chunk == nil or chunk == "" then break end
        got = got + #chunk
      end
      c:close()
      assert.is_true(got > 200 * 1024 * 1024, "read " .. got)
      if not agent_process.SANITIZED then
        assert.is_true(held < 8 * 1024, "a stalled reader held " .. held .. " kB of the agent")
      end
      os.remove(A.root .. "/t4/zeros")
    end)

    --- Whether the agent `pid` has libarchive mapped.
    local function maps_libarchive(pid)
      return assert(read_file("/proc/" .. pid .. "/maps")):find("libarchive.so", 1, true) ~= nil
    end

    it("loads libarchive at its first directory transfer, so an agent that moves none never maps it",
      function()
      local B = assert(start_agent())
      finally(function() B:stop() end)
      sh("mkdir -p " .. shell_quote(B.root .. "/d") .. " && printf x > " .. shell_quote(B.root .. "/d/f"))
      assert.are.equal(200, (list(B, "/d")).status)
      assert.is_false(maps_libarchive(B.pid), "mapped before any archive")
      local res = B:req("GET", "/v1/fs/tar?path=/d")
      assert.are.equal(200, res.status, res.body)
      assert.truthy(res.body:find("x", 513, true), "the archive holds the file")
      assert.is_true(maps_libarchive(B.pid), "not mapped after an archive")
    end)

    it("answers a directory transfer without a loadable libarchive with a 500 naming why, and goes on",
      function()
      -- A file by libarchive's name that is no library, first on the loader's path.
      local libs = files.temp_dir()
      write_file(libs .. "/libarchive.so.13", "not a library\n")
      local B = assert(start_agent{ env = { LD_LIBRARY_PATH = libs } })
      finally(function()
        B:stop()
        core.remove_tree(libs)
      end)
      sh("mkdir -p " .. shell_quote(B.root .. "/d"))
      for _ = 1, 2 do
        local res = B:req("GET", "/v1/fs/tar?path=/d")
        assert.are.equal(500, res.status)
        assert.matches("AGENT_OPERATION_FAILED: Agent operation 'archive a directory' failed: cannot load "
          .. "libarchive.so.13: .*libarchive.so.13", res.body)
      end
      local status, body = put_archive(B, "/new", tar.archive(tar.entry({ name = "f" }, "x")))
      assert.are.equal(500, status)
      assert.matches("Agent operation 'extract an archive' failed: cannot load libarchive.so.13", body)
      assert.is_false(exists(B.root .. "/new"), "the target was made")
      assert.are.equal(200, (list(B, "/d")).status)
    end)
  end)

  describe("watch", function()
    --- Opens a watch and returns a reader of its frames (decoded), with the connection.
    local function watch(body)
      local c = assert(raw.connect(A.port, nil, 20))
      local h = A:auth()
      h["Content-Type"] = "application/json"
      assert(c:request("POST", "/v1/fs/watch", h, cjson.encode(body)))
      local status = assert(c:read_head())
      if status ~= 200 then
        local text = c:read_body()
        c:close()
        return nil, status, text
      end
      return function()
        local line = c:next_line()
        return line and cjson.decode(line)
      end, c
    end

    local function until_end(next_frame)
      local frames = {}
      repeat
        local f = next_frame()
        frames[#frames + 1] = f
      until f == nil or (f.t ~= "event" and f.t ~= "keepalive")
      return frames
    end

    it("streams create, modify, remove and rename events, ending at the caller's timeout", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/w1"))
      local next_frame, c = watch({ path = "/w1", timeoutMs = 1500 })
      local d = A.root .. "/w1"
      sh("printf x > " .. shell_quote(d .. "/a") .. " && mv " .. shell_quote(d .. "/a") .. " "
        .. shell_quote(d .. "/b") .. " && rm " .. shell_quote(d .. "/b"))
      local frames = until_end(next_frame)
      c:close()
      local said = {}
      for _, f in ipairs(frames) do
        said[#said + 1] = f.t == "event" and (f.event .. " " .. (f.from and (f.from .. " ") or "") .. f.path)
          or (f.t .. " " .. f.reason)
      end
      assert.are.same({ "create /w1/a", "modify /w1/a", "rename /w1/a /w1/b", "remove /w1/b", "end timeout" }, said)
    end)

    it("follows directories made meanwhile when recursive", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/w2/old"))
      local next_frame, c = watch({ path = "/w2", recursive = true, timeoutMs = 1500 })
      sh("touch " .. shell_quote(A.root .. "/w2/old/x") .. " && mkdir " .. shell_quote(A.root .. "/w2/new")
        .. " && sleep 0.2 && touch " .. shell_quote(A.root .. "/w2/new/y"))
      local frames = until_end(next_frame)
      c:close()
      local paths = {}
      for _, f in ipairs(frames) do if f.event == "create" then paths[f.path] = true end end
      assert.is_true(paths["/w2/old/x"] and paths["/w2/new"] and paths["/w2/new/y"], cjson.encode(frames))
    end)

    it("ends with reason removed when the watched path is deleted, and moved when it is moved", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/w3") .. " " .. shell_quote(A.root .. "/w4") .. " && touch "
        .. shell_quote(A.root .. "/w5"))
      local next_frame, c = watch({ path = "/w3", timeoutMs = 10000 })
      sh("rmdir " .. shell_quote(A.root .. "/w3"))
      local frames = until_end(next_frame)
      c:close()
      assert.are.same({ t = "event", event = "remove", path = "/w3" }, frames[#frames - 1])
      assert.are.same({ t = "end", reason = "removed" }, frames[#frames])
      next_frame, c = watch({ path = "/w4", timeoutMs = 10000 })
      sh("mv " .. shell_quote(A.root .. "/w4") .. " " .. shell_quote(A.root .. "/w4x"))
      frames = until_end(next_frame)
      c:close()
      assert.are.same({ t = "end", reason = "moved" }, frames[#frames])
      next_frame, c = watch({ path = "/w5", timeoutMs = 10000 })
      sh("printf more >> " .. shell_quote(A.root .. "/w5") .. " && rm " .. shell_quote(A.root .. "/w5"))
      frames = until_end(next_frame)
      c:close()
      assert.are.same({ t = "event", event = "modify", path = "/w5" }, frames[1])
      assert.are.same({ t = "end", reason = "removed" }, frames[#frames])
    end)

    it("says overflow when a reader that does not read lets events pile past the queue", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/w6"))
      local next_frame, c = watch({ path = "/w6", timeoutMs = 60000 })
      -- Names of control bytes make each event's frame ~1.5 KB: 8000 of them are more than the
      -- kernel's socket buffers (4 MiB at most), the agent's queue to the connection and its
      -- 1024 waiting events hold.
      local count = 8000
      for i = 1, count do
        local f = assert(io.open(A.root .. "/w6/" .. i .. string.rep("\1", 240), "w"))
        f:close()
      end
      local creates = 0
      while true do
        local f = assert(next_frame())
        if f.event == "overflow" then break end
        creates = creates + 1
      end
      assert.is_true(creates < count, creates .. " creates before the overflow")
      -- Past the overflow the watch goes on.
      sh("touch " .. shell_quote(A.root .. "/w6/last"))
      local f
      repeat f = assert(next_frame()) until f.path == "/w6/last"
      c:close()
      sh("rm -rf " .. shell_quote(A.root .. "/w6"))
    end)

    it("sends keep-alives on a quiet watch that asks for them, and refuses an interval out of bounds", function()
      sh("mkdir -p " .. shell_quote(A.root .. "/wk"))
      local next_frame, c = watch({ path = "/wk", timeoutMs = 1000, keepaliveMs = 200 })
      local frames = until_end(next_frame)
      c:close()
      local keepalives = 0
      for _, f in ipairs(frames) do if f.t == "keepalive" then keepalives = keepalives + 1 end end
      assert.is_true(keepalives >= 2, cjson.encode(frames))
      assert.are.same({ t = "end", reason = "timeout" }, frames[#frames])
      for _, ms in ipairs({ 99, 3600001 }) do
        assert.are.equal(400, select(2, watch({ path = "/wk", timeoutMs = 1000, keepaliveMs = ms })))
      end
    end)

    it("refuses a missing path, no timeout, and a watch past the agent's sixteen", function()
      local ok, status, text = watch({ path = "/nowhere", timeoutMs = 1000 })
      assert.is_nil(ok)
      assert.are.equal(404, status, text)
      for _, body in ipairs({ { path = "/w1", timeoutMs = 0 }, { path = "/w1" }, { path = "/w1", timeoutMs = -1 } }) do
        status = select(2, watch(body))
        assert.are.equal(400, status)
      end
      local open = {}
      for i = 1, 16 do
        local next_frame, c = watch({ path = "/w1", timeoutMs = 30000 })
        assert(next_frame, "watch " .. i)
        open[i] = c
      end
      status, text = select(2, watch({ path = "/w1", timeoutMs = 1000 }))
      assert.are.equal(429, status)
      assert.matches("^WATCH_LIMIT_REACHED: ", text)
      for _, c in ipairs(open) do c:close() end
      -- a closed watch frees its place
      assert.is_true(within(5, function()
        local next_frame, c = watch({ path = "/w1", timeoutMs = 100 })
        if c then c:close() end
        return next_frame ~= nil
      end))
    end)
  end)
end)
