-- Files of any size: session:write_file_from and session:read_file_to over the agent's rawFiles
-- extension (docs/protocol.md §6), in bounded memory; the 32 MiB rule against an agent without it.
-- The client side runs against fake agents speaking the extension's exact wire shapes; the
-- end-to-end part against the real sandkit-agent runs once that agent advertises rawFiles.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local agent_session = require "support.agent_session"
local files = require "support.files"
local local_state = require "support.local_state"

local RAW = { "jobIdempotency", "rawFiles" }

--- A fresh path under /tmp that nothing has yet.
local function temp_path() return files.temp_name("") end

local function assert_peak(peak, bound, what)
  if files.SANITIZED then return end
  assert.is_true(peak < bound, "peak " .. peak .. " MiB to " .. what)
end

--- Peak resident memory of a child Lua process running `source`, which prints its result line
-- first; returns that line and the peak in MiB.
local function run_measured(source)
  local out, status = local_state.run_lua(source .. [[
    for line in io.lines("/proc/self/status") do
      local kb = line:match("^VmHWM:%s*(%d+)")
      if kb then print(tonumber(kb) / 1024) end
    end
  ]])
  assert(status == 0, out)
  local result, peak = out:match("^(.-)\n([%d%.]+)\n$")
  return result, tonumber(peak)
end

describe("a file sent with rawFiles", function()
  local session, server
  after_each(function() server:stop() end)

  it("goes as one PUT of its raw bytes with its length, never through /v1/files", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "204 No Content") end]], nil, RAW)
    local data = files.pattern(300 * 1024 + 7)
    local src = temp_path()
    files.write(src, data)
    local seen = {}
    local sent = assert(session:write_file_from("/big dir/file.bin", src, {
      progress = function(done, total) seen[#seen + 1] = { done, total } end }))
    os.remove(src)
    assert.equal(#data, sent)
    local puts = server:requests_to("/v1/files/raw")
    assert.equal(1, #puts)
    assert.equal("PUT", puts[1].method)
    assert.equal("path=/big%20dir/file.bin", puts[1].query)
    assert.equal(tostring(#data), puts[1].headers["content-length"])
    assert.equal("application/octet-stream", puts[1].headers["content-type"])
    assert.equal(data, puts[1].body)
    assert.equal(0, #server:requests_to("/v1/files"))
    assert.same({ #data, #data }, seen[#seen], "the last progress call is the whole file")
  end)

  it("from a path is read by the transport itself, a reader's pieces never becoming Lua strings", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "204 No Content") end]], nil, RAW)
    local http = require "sandkit.http"
    local send, handed = http.send, {}
    http.send = function(spec)
      handed[#handed + 1] = io.type(spec.body_file) or "none"
      return send(spec)
    end
    local data = files.pattern(70 * 1024)
    local src = temp_path()
    files.write(src, data)
    local ok, sent, err = pcall(session.write_file_from, session, "/f", src)
    local from_reader = ok and session:write_file_from("/g", function() return nil end)
    http.send = send
    assert(ok, sent)
    assert.equal(#data, sent, err)
    assert.equal(0, from_reader)
    -- The open file went to the transport beside its reader; a reader alone has none.
    assert.same({ "file", "none" }, handed)
    assert.equal(data, server:requests_to("/v1/files/raw")[1].body)
  end)

  it("from a reader of unknown length goes chunked", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "204 No Content") end]], nil, RAW)
    local pieces = { "one ", "two ", string.rep("three", 100000), "" }
    local i = 0
    assert(session:write_file_from("/streamed", function()
      i = i + 1
      return pieces[i] ~= "" and pieces[i] or nil
    end))
    local put = server:requests_to("/v1/files/raw")[1]
    assert.equal("chunked", put.headers["transfer-encoding"])
    assert.is_nil(put.headers["content-length"])
    assert.equal(table.concat(pieces), put.body)
  end)

  it("hears the agent's refusal, its code as err.reason", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "400 Bad Request", "PATH_REFUSED: Path '../x' refused: path traverses upward")
    end]], nil, RAW)
    local sent, err = session:write_file_from("../x", function() return nil end)
    assert.is_nil(sent)
    assert.equal("SANDBOX_COMMAND_FAILED", err.code)
    assert.equal("PATH_REFUSED", err.reason)
  end)

  it("refuses a directory as its source before anything is sent", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "204 No Content") end]], nil, RAW)
    local dir = local_state.new()
    local sent, err = session:write_file_from("/x", dir)
    core.remove_tree(dir)
    assert.is_nil(sent)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("is a directory: a transfer moves one file", err.message, 1, true)
    assert.equal(0, #server:requests_to("/v1/files/raw"))
  end)

  it("of 48 MiB leaves the sender's memory bounded", function()
    session, server = agent_session.open([[function(req, conn)
      respond.status(conn, "204 No Content") end]], nil, RAW)
    local src, size = temp_path(), 48 * 1024 * 1024
    files.write_pattern(src, size)
    local result, peak = run_measured(string.format([[
      local sb = assert(require("sandkit").sandbox{ provider = "agent", url = %q, token = "t" })
      local session = assert(sb:create{})
      print(assert(session:write_file_from("/big", %q)))
    ]], server.url, src))
    os.remove(src)
    assert.equal(tostring(size), result)
    local put = server:requests_to("/v1/files/raw")[1]
    assert.equal(size, put.body_length)
    assert.equal(files.pattern_checksum(size), put.body_sum)
    assert_peak(peak, 24, "send 48 MiB")
  end)
end)

describe("a file read with rawFiles", function()
  local session, server
  after_each(function() server:stop() end)

  --- A fake agent answering GET /v1/files/raw with `size` pattern bytes in 64 KiB writes,
  -- closing after `cut` bytes when given.
  local function serving(size, cut)
    return agent_session.open(string.format([[function(req, conn)
      if req.path ~= "/v1/files/raw" then return respond.status(conn, "404 Not Found", "no") end
      local size = %d
      conn:write("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: "
        .. size .. "\r\n\r\n")
      local stop, sent = %s or size, 0
      for piece in require("support.files").pattern_pieces(stop) do
        conn:write(piece)
        sent = sent + #piece
      end
      assert(sent == stop)
      if stop < size then conn:close() end
    end]], size, cut and tostring(cut) or "nil"), nil, RAW)
  end

  it("streams its bytes into a file, renamed into place once whole", function()
    session, server = serving(200 * 1024 + 3)
    local dst = temp_path()
    local seen
    local got = assert(session:read_file_to("/out.bin", dst, {
      progress = function(done, total) seen = { done, total } end }))
    assert.equal(200 * 1024 + 3, got)
    assert.equal(files.pattern(200 * 1024 + 3), files.read(dst))
    assert.same({ got, got }, seen)
    assert.equal("GET", server:requests_to("/v1/files/raw")[1].method)
    assert.equal("path=/out.bin", server:requests_to("/v1/files/raw")[1].query)
    os.remove(dst)
  end)

  --- Runs fn with localfile.sink's path sinks changed by change(dst); returns what fn returned.
  local function with_sinks(change, fn)
    local localfile = require "sandkit.localfile"
    local sink = localfile.sink
    localfile.sink = function(...)
      local dst, err = sink(...)
      if dst and dst.file then change(dst) end
      return dst, err
    end
    local result = table.pack(pcall(fn))
    localfile.sink = sink
    assert(result[1], result[2])
    return table.unpack(result, 2, result.n)
  end

  it("into a path is written by the transport itself, its bytes never handed to a writer", function()
    session, server = serving(700 * 1024 + 5)
    local dst = temp_path()
    local handed = 0
    local got, err = with_sinks(function(sink)
      local write = sink.write
      sink.write = function(bytes)
        handed = handed + #bytes
        return write(bytes)
      end
    end, function() return session:read_file_to("/out.bin", dst) end)
    assert.equal(700 * 1024 + 5, got, tostring(err))
    assert.equal(files.pattern(700 * 1024 + 5), files.read(dst))
    assert.equal(0, handed)
    os.remove(dst)
  end)

  it("into a file whose write fails is an error with the write's reason, and leaves no file", function()
    session, server = serving(300 * 1024)
    local dst = temp_path()
    local got, err = with_sinks(function(sink)
      -- A write to /dev/full fails as a full disk does.
      sink.file = assert(io.open("/dev/full", "wb"))
    end, function() return session:read_file_to("/out.bin", dst) end)
    assert.is_nil(got)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("could not be written: No space left on device", err.message, 1, true)
    assert.is_nil(io.open(dst), "nothing is renamed into place")
    local leftovers = core.listdir(dst:match("^(.*)/")) or {}
    for _, name in ipairs(leftovers) do
      assert.is_nil(name:find(dst:match("[^/]+$") .. ".sandkit-", 1, true), "no partial file is left")
    end
  end)

  --- A get into a fresh path whose partial file's name (its random part fixed) already holds a
  -- link to `target`; returns what read_file_to returned.
  local function get_past_planted_link(target)
    session, server = serving(300 * 1024)
    local dst = temp_path()
    local planted = dst .. ".sandkit-abababab.part"
    assert(os.execute("ln -s '" .. target .. "' '" .. planted .. "'"))
    local random = core.random
    core.random = function(n) return ("\171"):rep(n) end
    local result = table.pack(pcall(session.read_file_to, session, "/out.bin", dst))
    core.random = random
    os.remove(planted)
    assert(result[1], result[2])
    assert.is_nil(io.open(dst), "nothing is renamed into place")
    return result[2], result[3]
  end

  it("into a path never writes through a link planted at the name its bytes land in first", function()
    local victim = temp_path()
    files.write(victim, "the victim's own bytes")
    local got, err = get_past_planted_link(victim)
    assert.is_nil(got)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("File exists", err.message, 1, true)
    assert.equal("the victim's own bytes", files.read(victim))
  end)

  it("into a path never creates the file a dangling link planted at its partial name points to", function()
    local elsewhere = temp_path()
    local got, err = get_past_planted_link(elsewhere)
    assert.is_nil(got)
    assert.equal("INVALID_INPUT", err.code)
    assert.is_nil(io.open(elsewhere), "the link's target was not made")
  end)

  it("that stops short is an error and never replaces the file it was to become", function()
    session, server = serving(300 * 1024, 100 * 1024)
    local dst = temp_path()
    files.write(dst, "the old contents")
    local got, err = session:read_file_to("/out.bin", dst)
    assert.is_nil(got)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.equal("the old contents", files.read(dst))
    local leftovers = core.listdir(dst:match("^(.*)/")) or {}
    for _, name in ipairs(leftovers) do
      assert.is_nil(name:find(dst:match("[^/]+$") .. ".sandkit-", 1, true), "no partial file is left")
    end
    os.remove(dst)
  end)

  it("into a writer hands it every byte in order", function()
    session, server = serving(150 * 1024)
    local parts = {}
    assert(session:read_file_to("/x", function(bytes) parts[#parts + 1] = bytes end))
    assert.equal(files.pattern(150 * 1024), table.concat(parts))
  end)

  it("of 48 MiB leaves the reader's memory bounded", function()
    session, server = serving(48 * 1024 * 1024)
    local dst = temp_path()
    local result, peak = run_measured(string.format([[
      local sb = assert(require("sandkit").sandbox{ provider = "agent", url = %q, token = "t" })
      local session = assert(sb:create{})
      print(assert(session:read_file_to("/big", %q)))
    ]], server.url, dst))
    assert.equal(tostring(48 * 1024 * 1024), result)
    assert.equal(files.pattern_checksum(48 * 1024 * 1024), files.file_checksum(dst))
    os.remove(dst)
    assert_peak(peak, 24, "read 48 MiB")
  end)
end)

--- A fake agent that offers no rawFiles and keeps files in memory through the files API, as
-- sandkit-agent does it: a file over 32 MiB is refused when read, with the agent's own code.
local PLAIN_FILES = [[function(req, conn)
  local cjson = require "cjson"
  local files = conn.state
  if req.path == "/v1/files" and req.method == "PUT" then
    local body = cjson.decode(req.body)
    files[body.path] = body.contentsBase64
    return respond.status(conn, "204 No Content")
  end
  if req.path == "/v1/files" and req.method == "GET" then
    local path = req.query:match("^path=(.*)$"):gsub("%%(%x%x)", function(h)
      return string.char(tonumber(h, 16)) end)
    if path == "/big" then
      return respond.status(conn, "400 Bad Request",
        "REQUEST_INVALID: Request invalid: '/big' is over the 33554432 byte transfer limit")
    end
    if not files[path] then
      return respond.status(conn, "404 Not Found", "PATH_NOT_FOUND: No such file in the sandbox: " .. path)
    end
    return respond.json(conn, "200 OK", { contentsBase64 = files[path] })
  end
  respond.status(conn, "404 Not Found", "ROUTE_NOT_FOUND: No route " .. req.path)
end]]

describe("files against an agent without rawFiles", function()
  local session, server
  before_each(function()
    session, server = agent_session.open(PLAIN_FILES, nil, { "jobIdempotency" })
  end)
  after_each(function() server:stop() end)

  it("still move whole, through the files API", function()
    local src, dst = temp_path(), temp_path()
    files.write(src, "small\0file")
    assert.equal(10, assert(session:write_file_from("/small", src)))
    assert.equal(10, assert(session:read_file_to("/small", dst)))
    assert.equal("small\0file", files.read(dst))
    assert.equal("PUT", server:requests_to("/v1/files")[1].method)
    assert.equal(0, #server:requests_to("/v1/files/raw"))
    os.remove(src)
    os.remove(dst)
  end)

  it("go into a writer that returns nothing, as they do with rawFiles", function()
    assert(session:write_files{ ["/w"] = "some bytes" })
    local parts = {}
    assert.equal(10, assert(session:read_file_to("/w", function(bytes) parts[#parts + 1] = bytes end)))
    assert.equal("some bytes", table.concat(parts))
    local got, err = session:read_file_to("/w", function() return nil, "disk full" end)
    assert.is_nil(got)
    assert.matches("disk full", err.message, 1, true)
  end)

  it("over 32 MiB are refused, the error saying the agent lacks rawFiles", function()
    local big = string.rep("x", 32 * 1024 * 1024 + 1)
    local sent, err = session:write_file_from("/big", function()
      local chunk = big
      big = nil
      return chunk
    end)
    assert.is_nil(sent)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("does not offer the rawFiles extension", err.message, 1, true)
    assert.matches("32 MiB", err.message, 1, true)
    assert.equal(0, #server:requests_to("/v1/files"), "refused before anything was sent")
    local got, rerr = session:read_file_to("/big", function() end)
    assert.is_nil(got)
    assert.equal("REQUEST_INVALID", rerr.reason)
    assert.matches("does not offer the rawFiles extension", rerr.message, 1, true)
  end)
end)

describe("files of any size through the real sandkit-agent", function()
  local root, session
  before_each(function()
    root = local_state.new()
    session = assert(assert(sandkit.sandbox{ provider = "local", root = root }):create{ id = "raw" })
    assert(session:exec({ "true" }, { timeout = 5 }))
  end)
  after_each(function() local_state.clean(root) end)

  it("go in and out whole past 32 MiB, and a cut upload leaves the old file", function()
    assert.is_true(session.conn.features.rawFiles, "sandkit-agent offers rawFiles")
    local size = 40 * 1024 * 1024
    local src, dst = temp_path(), temp_path()
    files.write_pattern(src, size)
    assert.equal(size, assert(session:write_file_from("/in/big.bin", src)))
    assert.equal(tostring(size) .. "\n", assert(session:exec({ "sh", "-c", "wc -c < /in/big.bin" },
      { timeout = 10 })).stdout)
    assert.equal(size, assert(session:read_file_to("/in/big.bin", dst)))
    assert.equal(files.pattern_checksum(size), files.file_checksum(dst))
    local sent, err = session:write_file_from("/in/big.bin", function() return nil, "the source broke" end)
    assert.is_nil(sent)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal(size, assert(session:read_file_to("/in/big.bin", function() end)))
    os.remove(src)
    os.remove(dst)
  end)
end)
