-- The agent extensions of docs/protocol.md §6 that sandkit-agent adds, against the real binary:
-- outputCap and keepaliveMs on /v1/exec bodies, and rawFiles (GET/PUT /v1/files/raw: the bytes themselves,
-- streamed, no size limit, bounded memory, atomic replacement on PUT).

local cjson = require "cjson"
local core = require "sandkit.core"
local files = require "support.files"
local raw = require "support.raw_http"
local agent_process = require "support.agent_process"

local read_file, write_file, shell_quote = files.read, files.write, files.shell_quote
local start_agent, within, exists = agent_process.start_agent, agent_process.within, agent_process.exists
local check_stream, frames_data = agent_process.check_stream, agent_process.frames_data

-- Peak resident memory of a process in kB (VmHWM): what a transfer cost at its worst.
local function peak_rss_kb(pid)
  return tonumber(read_file("/proc/" .. pid .. "/status"):match("VmHWM:%s*(%d+)"))
end

-- Resident memory of a process in kB (VmRSS): what it holds now.
local function rss_kb(pid)
  return tonumber(read_file("/proc/" .. pid .. "/status"):match("VmRSS:%s*(%d+)"))
end

-- How many of process pid's descriptors have path open.
local function descriptors_on(pid, path)
  local p = assert(io.popen("find /proc/" .. pid .. "/fd -lname " .. shell_quote(path) .. " 2>/dev/null"))
  local n = 0
  for _ in p:lines() do n = n + 1 end
  p:close()
  return n
end

local function query(p)
  return (p:gsub("[^%w%-_./]", function(ch) return string.format("%%%02X", ch:byte()) end))
end

describe("sandkit-agent extensions", function()
  local A

  setup(function()
    A = assert(start_agent{ args = { "--output-cap", "100000" } })
  end)

  teardown(function()
    assert.are.equal(0, A:stop())
  end)

  it("advertises binaryFrames, keepalive, outputCap, rawFiles, the fs and the interactive job extensions",
    function()
    local _, health = A:json("GET", "/v1/health", nil, false)
    assert.are.same({ "binaryFrames", "jobIdempotency", "keepalive", "outputCap", "rawFiles", "fs", "fsTar", "fsWatch",
        "jobStdin", "jobPty", "jobSignal", "jobStream", "jobList" },
      health.features)
  end)

  describe("binaryFrames", function()
    -- Output with NULs, newlines and every byte value, on both streams, then a non-zero exit.
    local noisy = { "sh", "-c", "printf 'a\\000b\\n'; head -c 200000 /dev/urandom > /tmp/r.$$; "
      .. "cat /tmp/r.$$; printf 'err\\377' >&2; cat /tmp/r.$$ >&2; rm /tmp/r.$$; exit 3" }

    --- Every frame of a binary body, through the client's decoder, and how it ended.
    local function decode_binary(body, admit)
      local d = core.decoder()
      d:binary()
      if admit then d:admit(admit) end
      d:feed(body)
      local frames = {}
      while true do
        local frame, kind, message = d:next()
        if not frame then
          assert.is_nil(kind, message)
          break
        end
        frames[#frames + 1] = frame
      end
      assert.equal(0, d:pending())
      return frames
    end

    it("writes a stream that asks for them as binary frames, the bytes, seqs and ending NDJSON carries", function()
      local res = A:req("POST", "/v1/exec", { command = noisy, timeoutMs = 20000, outputCap = 0, framing = "binary" })
      assert.are.equal(200, res.status)
      assert.are.equal("application/vnd.sandkit.frames", res.headers["content-type"])
      local frames = decode_binary(res.body)
      local out, err, seq = {}, {}, -1
      for i, f in ipairs(frames) do
        if i < #frames then
          assert.is_true(f.seq > seq, "seq rises")
          seq = f.seq
          local into = f.type == "stdout" and out or err
          into[#into + 1] = f.data
        end
      end
      assert.same({ type = "exit", code = 3, truncated = false }, frames[#frames])
      out, err = table.concat(out), table.concat(err)
      assert.are.equal(200004, #out)
      assert.are.equal("a\0b\n", out:sub(1, 4))
      assert.are.equal("err\255" .. out:sub(5), err)
      local ndjson, lines = A:exec({ command = { "sh", "-c", "printf 'a\\000b\\n'; exit 3" }, timeoutMs = 20000,
        framing = "ndjson" })
      assert.are.equal("application/x-ndjson", ndjson.headers["content-type"])
      assert.are.equal(3, lines[#lines].code)
    end)

    it("refuses a framing it does not know with requestInvalid, written as NDJSON", function()
      for _, framing in ipairs({ '"json"', '"BINARY"', "1", "true", "null" }) do
        local res, frames = A:exec('{"command":["touch","framed"],"timeoutMs":1000,"framing":' .. framing .. "}")
        assert.are.equal("application/x-ndjson", res.headers["content-type"], framing)
        assert.are.equal(1, #frames, framing)
        assert.are.equal("requestInvalid", frames[1].code, framing)
        assert.matches('framing must be "ndjson" or "binary"', frames[1].message, 1, true)
      end
      assert.is_false(exists(A.root .. "/framed"))
    end)

    it("writes keep-alives and the terminal error in the stream's framing", function()
      local res = A:req("POST", "/v1/exec", { command = { "sh", "-c", "sleep 0.5" }, timeoutMs = 200,
        keepaliveMs = 100, framing = "binary" })
      assert.truthy(res.body:find('j\0\0\0\17{"t":"keepalive"}', 1, true), "a keep-alive frame")
      local frames = decode_binary(res.body, "keepalive")
      assert.are.equal(1, #frames)
      assert.are.equal("error", frames[1].type)
      assert.are.equal("timeoutExceeded", frames[1].code)
    end)
  end)

  describe("outputCap", function()
    local loud = { "sh", "-c", "head -c 300000 /dev/zero; echo done >&2" }

    it("caps each stream of one exec at the bytes it asks for", function()
      local _, frames = A:exec({ command = loud, timeoutMs = 20000, outputCap = 10 })
      local last, out, err = check_stream(frames)
      assert.are.equal(0, last.code)
      assert.is_true(last.truncated)
      assert.are.equal(10, #out)
      assert.are.equal("done\n", err)
    end)

    it("keeps everything with 0 and the agent's cap when absent", function()
      local _, frames = A:exec({ command = loud, timeoutMs = 20000, outputCap = 0 })
      local last, out = check_stream(frames)
      assert.is_false(last.truncated)
      assert.are.equal(300000, #out)
      _, frames = A:exec({ command = loud, timeoutMs = 20000 })
      last, out = check_stream(frames)
      assert.is_true(last.truncated)
      assert.are.equal(100000, #out)
    end)

    it("refuses a cap that is not a non-negative integer with requestInvalid", function()
      for _, cap in ipairs({ "-1", "1.5", '"10"', "true", "1e3" }) do
        local body = '{"command":["touch","capped"],"timeoutMs":1000,"outputCap":' .. cap .. "}"
        local res, frames = A:exec(body)
        assert.are.equal(200, res.status, cap)
        assert.are.equal(1, #frames, cap)
        assert.are.equal("requestInvalid", frames[1].code, cap)
      end
      assert.is_false(exists(A.root .. "/capped"))
    end)

    it("leaves jobs at the agent's cap", function()
      local _, started = A:start_job({ command = loud, timeoutMs = 20000, outputCap = 10 })
      local page, frames = A:poll_until_done(started.jobId)
      assert.is_true(page.truncated)
      local kept = #frames_data(frames, "stdout")
      assert.is_true(kept > 10 and kept <= 100000, "kept " .. kept)
    end)
  end)

  describe("keepalive", function()
    --- Every line of an exec stream with the seconds it arrived after the request was sent.
    local function timed_lines(body)
      local started = core.now()
      local c = A:stream(body)
      local lines = {}
      while true do
        local line = c:next_line()
        if not line then break end
        lines[#lines + 1] = { at = core.now() - started, frame = cjson.decode(line) }
      end
      c:close()
      return lines
    end

    local function kinds(lines)
      local out = {}
      for _, l in ipairs(lines) do out[#out + 1] = l.frame.t end
      return out
    end

    it("sends a keep-alive after each keepaliveMs of a stream's silence, and none unasked", function()
      local lines = timed_lines{ command = { "sh", "-c", "sleep 1; echo done" }, timeoutMs = 10000,
        keepaliveMs = 200 }
      local alive = 0
      for i, l in ipairs(lines) do
        if l.frame.t == "keepalive" then
          alive = alive + 1
          assert.same({ t = "keepalive" }, l.frame)
          -- Never much earlier than the silence asked for: what is measured here is when
          -- lines arrived, and the line before may have reached this process late.
          local since = i > 1 and lines[i - 1].at or 0
          assert.is_true(l.at - since >= 0.15, "a keep-alive after " .. (l.at - since) .. "s of silence")
        end
      end
      assert.is_true(alive >= 3, alive .. " keep-alives in a second of silence")
      assert.same({ "stdout", "exit" }, { lines[#lines - 1].frame.t, lines[#lines].frame.t })
      lines = timed_lines{ command = { "sh", "-c", "sleep 0.6; echo done" }, timeoutMs = 10000 }
      assert.same({ "stdout", "exit" }, kinds(lines))
    end)

    it("counts the silence from the last frame sent: a chatty command gets none", function()
      local lines = timed_lines{ command = { "sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo $i; sleep 0.1; done" },
        timeoutMs = 10000, keepaliveMs = 1500 }
      for _, t in ipairs(kinds(lines)) do assert.are_not.equal("keepalive", t) end
    end)

    it("takes keepaliveMs from 100 to 3600000 and refuses anything else with requestInvalid", function()
      for _, ms in ipairs{ "100", "3600000" } do
        local _, frames = A:exec('{"command":["true"],"timeoutMs":1000,"keepaliveMs":' .. ms .. "}")
        assert.are.equal("exit", frames[#frames].t, ms)
      end
      for _, ms in ipairs{ "99", "3600001", "0", "-1", "1.5", '"200"', "true", "null" } do
        local body = '{"command":["touch","kept"],"timeoutMs":1000,"keepaliveMs":' .. ms .. "}"
        local res, frames = A:exec(body)
        assert.are.equal(200, res.status, ms)
        assert.are.equal(1, #frames, ms)
        assert.are.equal("requestInvalid", frames[1].code, ms)
        assert.matches("keepaliveMs must be an integer from 100 to 3600000", frames[1].message, 1, true)
      end
      assert.is_false(exists(A.root .. "/kept"))
    end)
  end)

  describe("rawFiles", function()
    it("round-trips bytes and answers with their length and type", function()
      local contents = "raw\0\255bytes\n" .. string.rep("z", 100000)
      local res = A:req("PUT", "/v1/files/raw?path=" .. query("/r/a b.bin"), contents)
      assert.are.equal(204, res.status, res.body)
      assert.are.equal(contents, read_file(A.root .. "/r/a b.bin"))
      res = A:req("GET", "/v1/files/raw?path=" .. query("r/a b.bin"))
      assert.are.equal(200, res.status)
      assert.are.equal("application/octet-stream", res.headers["content-type"])
      assert.are.equal(tostring(#contents), res.headers["content-length"])
      assert.are.equal(contents, res.body)
      -- an empty file is an empty body
      assert.are.equal(204, A:req("PUT", "/v1/files/raw?path=empty", "").status)
      assert.are.equal("", A:req("GET", "/v1/files/raw?path=empty").body)
    end)

    it("takes a chunked body and replaces a file keeping its mode", function()
      write_file(A.root .. "/script.sh", "old")
      assert(files.execute("chmod 0750 " .. shell_quote(A.root .. "/script.sh")))
      local c = assert(raw.connect(A.port))
      assert(c:send("PUT /v1/files/raw?path=script.sh HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        .. A.token .. "\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nnew\r\n4;ext=1\r\n, ok\r\n0\r\n\r\n"))
      assert.are.equal(204, (c:read_head()))
      c:close()
      assert.are.equal("new, ok", read_file(A.root .. "/script.sh"))
      local mode = agent_process.run("stat -c %a " .. shell_quote(A.root .. "/script.sh"))
      assert.are.equal("750\n", mode)
    end)

    it("never replaces a file with a cut upload, and leaves no temporary file", function()
      write_file(A.root .. "/keep.txt", "original")
      local c = assert(raw.connect(A.port))
      assert(c:send("PUT /v1/files/raw?path=keep.txt HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        .. A.token .. "\r\nContent-Length: 1000\r\n\r\n" .. string.rep("n", 500)))
      -- the agent has taken the head once a request on another connection is answered
      assert.are.equal(200, A:req("GET", "/v1/health", nil, false).status)
      c:close(true)
      assert.is_true(within(5, function()
        return not agent_process.run("ls -A " .. shell_quote(A.root)):find(".sandkit-upload", 1, true)
      end), "a temporary file stayed")
      assert.are.equal("original", read_file(A.root .. "/keep.txt"))
    end)

    it("answers errors exactly as /v1/files does", function()
      local res = A:req("GET", "/v1/files/raw?path=/missing")
      assert.are.equal(404, res.status)
      assert.matches("^PATH_NOT_FOUND: ", res.body)
      assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/adir" }).status)
      res = A:req("GET", "/v1/files/raw?path=adir")
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: .*not a regular file", res.body)
      res = A:req("PUT", "/v1/files/raw?path=adir", "x")
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: .*not a regular file", res.body)
      for _, p in ipairs({ "../out", "", "a/../b", "file/" }) do
        res = A:req("PUT", "/v1/files/raw?path=" .. query(p), "x")
        assert.are.equal(400, res.status, p)
        assert.matches("^PATH_REFUSED: ", res.body)
        res = A:req("GET", "/v1/files/raw?path=" .. query(p))
        assert.are.equal(400, res.status, p)
        assert.matches("^PATH_REFUSED: ", res.body)
      end
      res = A:req("GET", "/v1/files/raw")
      assert.are.equal(400, res.status)
      assert.matches("^REQUEST_INVALID: ", res.body)
      assert.are.equal(401, A:req("PUT", "/v1/files/raw?path=unauth", "x", false).status)
      assert.is_false(exists(A.root .. "/unauth"))
    end)

    it("takes a body on either side of the length from which it splices, byte for byte", function()
      -- HTTP_SPLICE_MIN (src/agent/http.h): a body this long or longer goes by splice(2).
      local splice_min = 1024 * 1024
      for _, size in ipairs({ splice_min - 1, splice_min, splice_min + 1, 3 * splice_min + 12345 }) do
        local contents = {}
        for i = 1, math.ceil(size / 8) do contents[i] = string.format("%07x\n", i) end
        contents = table.concat(contents):sub(1, size)
        local res = A:req("PUT", "/v1/files/raw?path=spliced", contents)
        assert.are.equal(204, res.status, res.body)
        assert.is_true(read_file(A.root .. "/spliced") == contents, "the file differs at size " .. size)
      end
      os.remove(A.root .. "/spliced")
    end)

    -- A file larger than the loopback socket's buffers on both ends, in which every 16 bytes
    -- name their own place, so that a byte out of order or missing shows. Sent to a reader
    -- that has not read yet, it fills the socket: the agent then holds the file a second time,
    -- for the bytes it still owes (http_reply_file), and none of them in its memory.
    local function get_until_owed(name)
      local path, size = A.root .. "/" .. name, 24 * 1024 * 1024
      assert(files.execute("seq -f '%015.0f' 0 " .. (size / 16 - 1) .. " > " .. shell_quote(path)))
      local before = rss_kb(A.pid)
      local c = assert(raw.connect(A.port, nil, 30))
      assert(c:request("GET", "/v1/files/raw?path=" .. name, A:auth()))
      assert.are.equal(200, (c:read_head()))
      assert.are.equal(tostring(size), c.headers["content-length"])
      assert.is_true(within(10, function() return descriptors_on(A.pid, path) == 2 end),
        "the agent never waited for the socket's room with the file's bytes")
      local grown = rss_kb(A.pid) - before
      if not agent_process.SANITIZED then
        assert.is_true(grown < 2 * 1024, "the agent's RSS grew by " .. grown .. " kB")
      end
      return c, path, size
    end

    it("sends a file its reader takes slowly whole and in order, what waits left in the file", function()
      local c, path, size = get_until_owed("slow.bin")
      local want, got = read_file(path), {}
      local n = 0
      while n < size do
        local piece = assert(c.sock:receive(math.min(1024 * 1024, size - n)))
        got[#got + 1] = piece
        n = n + #piece
      end
      c:close()
      assert.is_true(table.concat(got) == want, "the bytes read back differ")
      assert.is_true(within(5, function() return descriptors_on(A.pid, path) == 0 end),
        "the agent still holds the file it sent")
      os.remove(path)
    end)

    it("ends a file that shrinks while it is sent short of its length, and closes", function()
      local c, path, size = get_until_owed("shrinks.bin")
      assert(files.execute("truncate -s 1048576 " .. shell_quote(path)))
      local whole, err, partial = c.sock:receive(size)
      c:close()
      assert.is_nil(whole)
      assert.are.equal("closed", err)
      assert.is_true(#partial < size, "a cut file was read as whole")
      assert.is_true(within(5, function() return descriptors_on(A.pid, path) == 0 end),
        "the agent still holds the file it could not send")
      os.remove(path)
    end)

    it("moves 1 GiB each way with the agent's memory flat", function()
      local size, piece = 1024 * 1024 * 1024, string.rep("0123456789abcdef", 65536)
      local before = peak_rss_kb(A.pid)
      local c = assert(raw.connect(A.port, nil, 60))
      assert(c:send("PUT /v1/files/raw?path=huge HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        .. A.token .. "\r\nContent-Length: " .. size .. "\r\n\r\n"))
      for _ = 1, size / #piece do assert(c:send(piece)) end
      assert.are.equal(204, (c:read_head()))
      c:close()
      assert.are.equal(size, tonumber((agent_process.run("stat -c %s " .. shell_quote(A.root .. "/huge")))))
      c = assert(raw.connect(A.port, nil, 60))
      assert(c:request("GET", "/v1/files/raw?path=huge", A:auth()))
      assert.are.equal(200, (c:read_head()))
      assert.are.equal(tostring(size), c.headers["content-length"])
      local got, same = 0, true
      while got < size do
        local chunk = assert(c.sock:receive(#piece))
        same = same and chunk == piece
        got = got + #chunk
      end
      c:close()
      assert.is_true(same, "the bytes read back differ")
      local grown = peak_rss_kb(A.pid) - before
      if not agent_process.SANITIZED then
        assert.is_true(grown < 16 * 1024, "the agent's peak RSS grew by " .. grown .. " kB")
      end
      os.remove(A.root .. "/huge")
    end)
  end)
end)
