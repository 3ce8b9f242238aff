-- A session's files as a filesystem through the public API (README, "Files as a filesystem"):
-- list, stat, remove, rename, write_dir_from, read_dir_to and watch on local sessions served
-- by the real agent; archives from fake agents that no honest agent sends, each refused with
-- nothing landing outside the destination; and the refusals made before anything is sent.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local tar_module = require "sandkit.tar"
local agent_session = require "support.agent_session"
local cleanups = require "support.cleanups"
local files = require "support.files"
local fs_roundtrip = require "support.fs_roundtrip"
local local_state = require "support.local_state"
local tar = require "support.tar"

local FS = { "jobIdempotency", "rawFiles", "fs", "fsTar", "fsWatch" }

local function exists(path)
  return files.execute("test -e " .. files.shell_quote(path) .. " || test -L " .. files.shell_quote(path))
end

--- Times to the second, what a tar header holds, and everything else find says of a tree.
local function described(dir)
  local p = assert(io.popen("cd " .. files.shell_quote(dir) .. " && find . -printf '%p %y %m %s %Ts %l\\n' | sort"))
  local text = p:read("a")
  p:close()
  return text
end

describe("a local session's files as a filesystem", function()
  local root, session
  setup(function()
    root = local_state.new()
    local sandbox = assert(sandkit.sandbox{ provider = "local", root = root, command_timeout = 10 })
    session = assert(sandbox:create{ id = "fs" })
  end)
  teardown(function() local_state.clean(root) end)

  it("goes through the whole round trip: in, listed, stated, renamed, removed, out", function()
    local src = fs_roundtrip.tree()
    finally(function() core.remove_tree(src) end)
    fs_roundtrip.check(fs_roundtrip.run(session, src, "/round"), "/round")
  end)

  it("carries a tree both ways with modes and times, and tells the bytes as they go", function()
    local src = files.temp_dir()
    local defer = cleanups.of(finally)
    defer(function() core.remove_tree(src) end)
    assert(files.execute("cd " .. files.shell_quote(src) .. " && mkdir -p d/e && printf x > d/e/f"
      .. " && chmod 0700 d/e/f && touch -d @1234567890 d/e/f && head -c 200000 /dev/urandom > r && chmod 0555 d"))
    local heard = {}
    local sent = assert(session:write_dir_from("/copy", src,
      { progress = function(done) heard[#heard + 1] = done end }))
    assert.equal(sent, heard[#heard])
    local back = src .. "-back"
    defer(function() core.remove_tree(back) end)
    local got = assert(session:read_dir_to("/copy", back, { progress = function(done) heard.out = done end }))
    assert.equal(got, heard.out)
    assert.equal(described(src), described(back))
  end)

  it("takes and gives the archive itself from a reader and to a writer", function()
    local archive = tar.archive(tar.entry({ name = "from-reader.txt" }, "raw tar"))
    local i = 0
    assert(session:write_dir_from("/raw", function()
      i = i + 1
      return i == 1 and archive or nil
    end))
    local parts = {}
    assert(session:read_dir_to("/raw", function(bytes) parts[#parts + 1] = bytes end))
    local out = table.concat(parts)
    assert.truthy(out:find("from-reader.txt", 1, true))
    assert.truthy(out:find("raw tar", 1, true))
  end)

  it("lists at most `limit` entries, with a cursor to go on from", function()
    assert(session:write_files{ ["/many/a"] = "", ["/many/b"] = "", ["/many/c"] = "" })
    local first = assert(session:list("/many", { limit = 2 }))
    assert.same({ "a", "b" }, { first[1].name, first[2].name })
    assert.equal("b", first.next)
    local rest = assert(session:list("/many", { cursor = first.next }))
    assert.equal(1, #rest)
    assert.equal("c", rest[1].name)
    assert.is_nil(rest.next)
  end)

  it("refuses a target that is a file, a source that is no directory, and keeps what was there", function()
    assert(session:write_files{ ["/plain"] = "file" })
    local src = fs_roundtrip.tree()
    local defer = cleanups.of(finally)
    defer(function() core.remove_tree(src) end)
    local ok, err = session:write_dir_from("/plain", src)
    assert.is_nil(ok)
    assert.equal("REQUEST_INVALID", err.reason)
    assert.equal("file", assert(session:read_file("/plain")))
    ok, err = session:write_dir_from("/x", src .. "/a.txt")
    assert.is_nil(ok)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("source", err.field)
    local dst = files.temp_name()
    defer(function() os.remove(dst) end)
    ok, err = session:read_dir_to("/round-never", dst)
    assert.is_nil(ok)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("destination", err.field)
  end)

  it("watches a path until its timeout, and ends when the path is removed", function()
    assert(session:mkdir("/watched/sub"))
    local events = session:watch("/watched", { recursive = true, timeout = 1 })
    assert(session:write_files{ ["/watched/sub/new"] = "x" })
    assert(session:rename("/watched/sub/new", "/watched/moved"))
    local seen = {}
    for event in events do
      local said = event.type .. " " .. (event.from and (event.from .. " ") or "") .. event.path
      -- A write may come as more than one modify; the order of kinds is what counts.
      if said ~= seen[#seen] then seen[#seen + 1] = said end
    end
    assert.equal("timeout", events.reason)
    assert.same({ "create /watched/sub/new", "modify /watched/sub/new", "rename /watched/sub/new /watched/moved" },
      seen)
    events = session:watch("/watched", { timeout = 10 })
    assert(session:remove("/watched", { recursive = true }))
    seen = {}
    for event in events do seen[#seen + 1] = event.type .. " " .. event.path end
    assert.equal("removed", events.reason)
    assert.equal("remove /watched", seen[#seen])
  end)

  it("refuses options out of their bounds before sending anything", function()
    local calls = {
      function() return session:list("/", { depth = 33 }) end,
      function() return session:list("/", { depth = 0 }) end,
      function() return session:list("/", { limit = 0 }) end,
      function() return session:list("/", { sort = true }) end,
      function() return session:write_dir_from("/x", "/tmp", { max_entries = tar_module.MAX_ENTRIES + 1 }) end,
      function() return session:read_dir_to("/x", "/tmp/never-made", { max_bytes = tar_module.MAX_BYTES + 1 }) end,
      function() return session:remove("/x", { force = true }) end,
    }
    for i, call in ipairs(calls) do
      local ok, err = call()
      assert.is_nil(ok, i)
      assert.equal("INVALID_INPUT", err.code, i)
    end
    local untimed = assert(assert(sandkit.sandbox{ provider = "local", root = root }):get("fs"))
    local ok, err = pcall(function() for _ in untimed:watch("/", {}) do end end)
    assert.is_false(ok)
    assert.equal("INVALID_INPUT", err.code, "a watch without a timeout, where the sandbox has none")
    assert.has_error(function() session:remove("/x", { recursive = "yes" }) end)
    assert.has_error(function() session:stat(7) end)
  end)
end)

--- A session on a fake agent whose GET /v1/fs/tar answers `archive` (a Lua expression giving
-- the body's chunks as a list, evaluated in the fake's process).
local function archive_agent(chunks_source)
  return agent_session.open([[function(req, conn)
    if req.path ~= "/v1/fs/tar" then return respond.status(conn, "404 Not Found", "ROUTE_NOT_FOUND: no") end
    local tar = require "support.tar"
    respond.chunked_start(conn, "200 OK", "application/x-tar")
    for _, chunk in ipairs(]] .. chunks_source .. [[) do respond.chunk(conn, chunk) end
    respond.chunked_end(conn)
  end]], nil, FS)
end

describe("an archive from a session", function()
  local server
  after_each(function() if server then server:stop() end server = nil end)

  local outside = "sandkit-escaped-" .. core.b64encode(core.random(6)):gsub("[^%w]", "x")
  local HOSTILE = {
    { "'../x'", "ARCHIVE_REFUSED",
      'tar.entry({ name = "ok" }, "1"), tar.entry({ name = "../' .. outside .. '" }, "x")' },
    { "'/tmp/x'", "ARCHIVE_REFUSED", 'tar.entry({ name = "/tmp/' .. outside .. '" }, "x")' },
    { "a symlink, then a file through it", "ARCHIVE_REFUSED",
      'tar.entry({ name = "l", type = "2", linkname = "/tmp" }), tar.entry({ name = "l/' .. outside .. '" }, "x")' },
    { "a hard link to a file outside", "ARCHIVE_REFUSED",
      'tar.entry({ name = "h", type = "1", linkname = "/etc/passwd" })' },
    { "a hard link that climbs", "ARCHIVE_REFUSED",
      'tar.entry({ name = "h", type = "1", linkname = "../../etc/passwd" })' },
    { "a device node", "ARCHIVE_REFUSED",
      'tar.entry({ name = "null", type = "3", devmajor = 1, devminor = 3 })' },
    { "a 1 TB sparse header", "ARCHIVE_TOO_LARGE", 'tar.pax{ ["GNU.sparse.major"] = "1", ["GNU.sparse.minor"] = "0", '
      .. '["GNU.sparse.name"] = "huge", ["GNU.sparse.realsize"] = "1099511627776" }, '
      .. 'tar.entry({ name = "GNUSparseFile.0/huge", size = 513 }, tar.padded("1\\n1099511627775\\n1\\n") .. "z")' },
  }
  for _, case in ipairs(HOSTILE) do
    it("with " .. case[1] .. " is refused as " .. case[2] .. ", nothing landing, the directory it made gone", function()
      local session
      session, server = archive_agent("{ tar.archive(" .. case[3] .. ") }")
      local parent = files.temp_dir()
      finally(function() core.remove_tree(parent) end)
      local ok, err = session:read_dir_to("/d", parent .. "/dest")
      assert.is_nil(ok)
      assert.equal("UNEXPECTED_RESPONSE_FORMAT", err.code)
      assert.equal(case[2], err.reason, tostring(err))
      assert.is_false(exists(parent .. "/dest"), "the directory it made stayed")
      assert.is_false(exists(parent .. "/" .. outside))
      assert.is_false(exists("/tmp/" .. outside))
    end)
  end

  it("of ten million entries is refused at the caller's bound, long before its end", function()
    local session
    session, server = agent_session.open([[function(req, conn)
      local tar = require "support.tar"
      local read = tar.repeated(tar.header({ name = "d/", type = "5", mode = 493 }), 10000000)
      respond.chunked_start(conn, "200 OK", "application/x-tar")
      while true do
        local piece = read()
        if not piece then break end
        respond.chunk(conn, piece)
      end
      respond.chunked_end(conn)
    end]], nil, FS)
    local dest = files.temp_dir()
    finally(function() core.remove_tree(dest) end)
    local ok, err = session:read_dir_to("/d", dest, { max_entries = 5000 })
    assert.is_nil(ok)
    assert.equal("ARCHIVE_TOO_LARGE", err.reason)
    assert.matches("more than 5000 entries", err.message)
    assert.is_true(exists(dest), "a directory that was there stays")
  end)

  it("cut short is refused, never taken as a smaller tree", function()
    local session
    session, server = archive_agent('{ tar.entry({ name = "a" }, "whole"), tar.entry({ name = "b" }, "whole") }')
    local parent = files.temp_dir()
    finally(function() core.remove_tree(parent) end)
    local ok, err = session:read_dir_to("/d", parent .. "/dest")
    assert.is_nil(ok)
    assert.equal("ARCHIVE_INVALID", err.reason)
    assert.is_false(exists(parent .. "/dest"))
  end)

  it("whose body fails mid-way is unanswered and retryable", function()
    local session
    session, server = agent_session.open([[function(req, conn)
      local tar = require "support.tar"
      respond.chunked_start(conn, "200 OK", "application/x-tar")
      respond.chunk(conn, tar.entry({ name = "a" }, "x"))
      conn:close()
    end]], nil, FS)
    local parent = files.temp_dir()
    finally(function() core.remove_tree(parent) end)
    local ok, err = session:read_dir_to("/d", parent .. "/dest")
    assert.is_nil(ok)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.is_true(err.retryable)
    assert.is_false(exists(parent .. "/dest"))
  end)
end)

describe("a session whose agent does not offer the extensions", function()
  it("refuses every filesystem call as OPERATION_NOT_SUPPORTED without sending it", function()
    local session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "500 Internal Server Error", "never asked") end]], nil, { "rawFiles" })
    local defer = cleanups.of(finally)
    defer(function() server:stop() end)
    local src = fs_roundtrip.tree()
    defer(function() core.remove_tree(src) end)
    for _, call in ipairs{
      function() return session:list("/") end, function() return session:stat("/") end,
      function() return session:remove("/x") end, function() return session:rename("/a", "/b") end,
      function() return session:write_dir_from("/x", src) end,
      function() return session:read_dir_to("/x", src .. "/never") end,
    } do
      local ok, err = call()
      assert.is_nil(ok)
      assert.equal("OPERATION_NOT_SUPPORTED", err.code)
      assert.matches("does not offer the fs", err.message)
    end
    local ok, err = pcall(function() for _ in session:watch("/", { timeout = 1 }) do end end)
    assert.is_false(ok)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.equal(0, #server:requests() - #server:requests_to("/v1/health"))
  end)

  it("asks an agent whose features it never read, and takes its 404 for a route it lacks as the same", function()
    local session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "404 Not Found", "ROUTE_NOT_FOUND: No route " .. req.path .. " in this agent") end]],
      nil, {})
    finally(function() server:stop() end)
    local ok, err = session:list("/")
    assert.is_nil(ok)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("no route /v1/fs/list", err.message)
    assert.equal(1, #server:requests_to("/v1/fs/list"))
  end)
end)

describe("a listing's page", function()
  local function page(entries, next_cursor)
    return '{"entries":[' .. table.concat(entries, ",") .. '],"next":' .. (next_cursor or "null") .. "}"
  end
  local FILE = '{"name":"a","path":"/d/a","type":"file","size":3,"mode":420,"mtime":1700000000.25}'

  it("is read into entries with integers, a time in seconds, escapes undone and the cursor", function()
    local entries = assert(core.list_page(page({ FILE,
      '{"path":"/d/l\\u00e9","name":"l\\u00e9","type":"symlink","size":0,"mode":511,"mtime":17e8,'
        .. '"target":"\\/etc","x":[1]}' },
      '"l\\u00e9"')))
    assert.same({ name = "a", path = "/d/a", type = "file", size = 3, mode = 420, mtime = 1700000000.25 }, entries[1])
    assert.same({ name = "l\u{e9}", path = "/d/l\u{e9}", type = "symlink", size = 0, mode = 511, mtime = 1.7e9,
      target = "/etc" }, entries[2])
    assert.equal("l\u{e9}", entries.next)
    assert.equal(math.type and "integer" or "number", math.type and math.type(entries[1].size) or type(entries[1].size))
    assert.is_nil(assert(core.list_page(page({}))).next)
  end)

  it("is refused when a member is given twice, an entry lacks one or has one of another type", function()
    for _, text in ipairs{
      '{"entries":[],"entries":[]}', '{"entries":[],"next":null,"next":"a"}',
      page({ '{"name":"a","name":"b","path":"/a","type":"file","size":1,"mode":1,"mtime":1}' }),
      page({ '{"path":"/a","type":"file","size":1,"mode":1,"mtime":1}' }),
      page({ '{"name":"a","path":"/a","type":"pipe","size":1,"mode":1,"mtime":1}' }),
      page({ '{"name":"a","path":"/a","type":"file","size":-1,"mode":1,"mtime":1}' }),
      page({ '{"name":"a","path":"/a","type":"file","size":1.5,"mode":1,"mtime":1}' }),
      page({ '{"name":"a","path":"/a","type":"file","size":1,"mode":1,"mtime":"1"}' }),
      page({ '{"name":"a","path":"/a","type":"file","size":1,"mode":1,"mtime":1,"target":7}' }),
      page({ FILE }, "7"), '{"next":null}', "[]", page({ FILE }) .. "x", page({ "[]" }),
    } do
      local entries, why, at = core.list_page(text)
      assert.is_nil(entries, text)
      assert.is_string(why, text)
      assert.is_number(at, text)
    end
  end)

  it("is refused for a member named twice however it is spelt, in a member passed over, or before a fault", function()
    for _, text in ipairs{
      page({ '{"name":"a","n\\u0061me":"b","path":"/a","type":"file","size":1,"mode":1,"mtime":1}' }),
      page({ '{"name":"a","path":"/a","type":"file","size":1,"mode":1,"mtime":1,"x":{"k":1,"k":2}}' }),
      '{"entries":[],"x":{"k":1,"k":2},"next":null}',
      page({ '{"name":"a","name":"b","path":"/a","type":"pipe","size":1,"mode":1,"mtime":1}' }),
    } do
      local entries, why = core.list_page(text)
      assert.is_nil(entries, text)
      assert.equal("an object names a member twice", why, text)
    end
  end)
end)
