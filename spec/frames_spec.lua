-- The frame decoder and base64 of the C core, fed bytes directly (sans-I/O).

local core = require "sandkit.core"

--- Feeds chunks and returns everything the decoder produced: frames, then a failure as
-- { failed = kind, message = … } if one came. `admit` lists the kinds beyond the default the
-- stream takes.
local function decode(chunks, max_line, admit)
  local d = core.decoder(max_line)
  for _, kind in ipairs(admit or {}) do d:admit(kind) end
  local out = {}
  for _, chunk in ipairs(chunks) do
    d:feed(chunk)
    while true do
      local frame, kind, message = d:next()
      if frame then
        out[#out + 1] = frame
      elseif frame == false then
        break
      else
        out[#out + 1] = { failed = kind, message = message }
        return out, d
      end
    end
  end
  return out, d
end

describe("the frame decoder", function()
  it("takes many frames from one read", function()
    local out = decode{ '{"t":"stdout","seq":0,"data":"YQ=="}\n'
      .. '{"t":"stdout","seq":1,"data":"Yg=="}\n{"t":"exit","code":0}\n' }
    assert.equal(3, #out)
    assert.equal("a", out[1].data)
    assert.equal("b", out[2].data)
    assert.equal("exit", out[3].type)
  end)

  it("reassembles a frame fed one byte at a time", function()
    local line = '{"t":"stderr","seq":41,"data":"aGVsbG8="}\n'
    local chunks = {}
    for i = 1, #line do chunks[i] = line:sub(i, i) end
    local out = decode(chunks)
    assert.same({ { type = "stderr", seq = 41, data = "hello" } }, out)
  end)

  it("takes the same frames from a body cut anywhere into two or three chunks", function()
    local body = '{"t":"stdout","seq":0,"data":"YWJj"}\n{"t":"stderr","seq":1,"data":"ZA=="}\n'
      .. '{"t":"exit","code":3}\n'
    local whole = decode{ body }
    assert.equal(3, #whole)
    for i = 0, #body do
      assert.same(whole, decode{ body:sub(1, i), body:sub(i + 1) }, "cut at " .. i)
      for j = i, #body, 7 do
        assert.same(whole, decode{ body:sub(1, i), body:sub(i + 1, j), body:sub(j + 1) },
          "cut at " .. i .. " and " .. j)
      end
    end
  end)

  it("hands over long and short payloads alike, in whatever pieces they come, after it gave back their room", function()
    local payloads, lines = {}, {}
    for i, n in ipairs({ 70000, 5, 65536, 1, 9000, 300000, 12, 65536 }) do
      local bytes = {}
      for k = 1, n do bytes[k] = string.char((k * 7 + i) % 256) end
      payloads[i] = table.concat(bytes)
      lines[i] = '{"t":"stdout","seq":' .. i .. ',"data":"' .. core.b64encode(payloads[i]) .. '"}\n'
    end
    local body = table.concat(lines) .. '{"t":"exit","code":0}\n'
    for _, size in ipairs({ 1000, 4096, 65536, 131072 }) do
      for _, keep in ipairs({ false, true }) do
        local d = core.decoder(nil, keep)
        local got = {}
        for at = 1, #body, size do
          d:feed(body:sub(at, at + size - 1))
          for frame in function() return d:next() or nil end do got[#got + 1] = frame end
        end
        assert.equal(#payloads + 1, #got)
        for i, payload in ipairs(payloads) do
          assert.equal(payload, keep and core.b64decode(got[i].base64) or got[i].data, size .. " " .. i)
        end
      end
    end
  end)

  it("counts a line still arriving as pending, and refuses it once the chunk that crosses the limit is fed", function()
    local d = core.decoder(100)
    d:feed('{"t":"exit","code":0}\n{"t":"stdout","seq":0,"data":"' .. string.rep("A", 20))
    assert.equal("exit", d:next().type)
    assert.is_false(d:next())
    assert.equal(50, d:pending())
    d:feed(string.rep("A", 40))
    assert.is_false(d:next())
    assert.equal(90, d:pending())
    d:feed(string.rep("A", 40) .. '"}\n')
    local frame, kind = d:next()
    assert.is_nil(frame)
    assert.equal("too_long", kind)
  end)

  it("hands binary data over unchanged, NUL bytes included", function()
    local bytes = "\0\1\2\255\254\n\r"
    local out = decode{ '{"t":"stdout","seq":0,"data":"' .. core.b64encode(bytes) .. '"}\n' }
    assert.equal(bytes, out[1].data)
  end)

  it("decodes a full 64 KiB frame", function()
    local bytes = string.rep("\171", 65536)
    local out = decode{ '{"t":"stdout","seq":7,"data":"' .. core.b64encode(bytes) .. '"}\n' }
    assert.equal(65536, #out[1].data)
    assert.equal(bytes, out[1].data)
  end)

  it("accepts a writer that escapes '/' in base64 and unicode in messages", function()
    local out = decode{ '{"t":"stdout","seq":0,"data":"\\/w=="}\n',
      '{"t":"error","code":"spawnFailed","message":"caf\\u00e9 \\ud83d\\ude00 \\"q\\""}\n' }
    assert.equal("\255", out[1].data)
    assert.equal("error", out[2].type)
    assert.equal("caf\195\169 \240\159\152\128 \"q\"", out[2].message)
  end)

  it("skips empty and whitespace-only lines", function()
    local out = decode{ '\n\r\n  \n{"t":"exit","code":3,"truncated":true}\n' }
    assert.same({ { type = "exit", code = 3, truncated = true } }, out)
  end)

  it("reads the signal of a killed command", function()
    local out = decode{ '{"t":"exit","code":137,"signal":9}\n' }
    assert.same({ type = "exit", code = 137, truncated = false, signal = 9 }, out[1])
  end)

  it("reads that a memory limit killed the command (the oom extension), and only a boolean as that", function()
    local out = decode{ '{"t":"exit","code":137,"signal":9,"oom":true}\n' }
    assert.same({ type = "exit", code = 137, truncated = false, signal = 9, oom = true }, out[1])
    out = decode{ '{"t":"exit","code":137,"signal":9,"oom":false}\n' }
    assert.same({ type = "exit", code = 137, truncated = false, signal = 9 }, out[1])
    out = decode{ '{"t":"exit","code":137,"oom":"yes"}\n' }
    assert.equal("unparsable", out[1].failed)
    out = decode{ '{"t":"exit","code":137,"oom":true,"oom":false}\n' }
    assert.equal("unparsable", out[1].failed, "given twice")
  end)

  it("reads a member name written with escapes as the name it spells", function()
    local out = decode{ '{"\\u0074":"exit","c\\u006fde":3}\n' }
    assert.same({ type = "exit", code = 3, truncated = false }, out[1])
  end)

  it("takes members in any order", function()
    local out = decode{ '{"data":"YQ==","seq":5,"t":"stdout"}\n' }
    assert.same({ type = "stdout", seq = 5, data = "a" }, out[1])
  end)

  for _, case in ipairs({
    { "not JSON", "{not json}" },
    { "a trailing comma", '{"t":"exit","code":0,}' },
    { "a missing comma", '{"t":"exit" "code":0}' },
    { "trailing bytes", '{"t":"exit","code":0} x' },
    { "an unknown type", '{"t":"stdin","seq":0,"data":""}' },
    { "a missing type", '{"seq":0,"data":""}' },
    { "a missing seq", '{"t":"stdout","data":"YQ=="}' },
    { "a negative seq", '{"t":"stdout","seq":-1,"data":"YQ=="}' },
    { "a fractional seq", '{"t":"stdout","seq":1.5,"data":"YQ=="}' },
    { "a seq past 2^63-1", '{"t":"stdout","seq":9223372036854775808,"data":"YQ=="}' },
    { "an exit code past 32 bits", '{"t":"exit","code":2147483648}' },
    { "an exit without code", '{"t":"exit"}' },
    { "an error without message", '{"t":"error","code":"x"}' },
    { "a string code on exit", '{"t":"exit","code":"0"}' },
    { "a non-boolean truncated", '{"t":"exit","code":0,"truncated":1}' },
    { "a lone surrogate", '{"t":"error","code":"x","message":"\\ud800"}' },
    { "a raw control character", '{"t":"error","code":"x","message":"a\tb"}' },
    { "an array", '[1,2]' },
    -- A member given twice means what the last copy says to one parser and the first to
    -- another: which frame arrived would depend on who reads it.
    { "a type given twice", '{"t":"error","t":"exit","code":0}' },
    { "an exit code given twice", '{"t":"exit","code":1,"code":0}' },
    { "data given twice", '{"t":"stdout","seq":0,"data":"YQ==","data":"Yg=="}' },
    { "a member given twice, once under an escaped name", '{"t":"exit","code":1,"\\u0063ode":0}' },
    { "nesting past the reader's depth",
      '{"t":"exit","code":0,"x":' .. string.rep("[", 40) .. string.rep("]", 40) .. '}' },
  }) do
    it("refuses " .. case[1] .. " as a line that does not parse", function()
      local out = decode{ case[2] .. "\n" }
      assert.equal(1, #out)
      assert.equal("unparsable", out[1].failed)
      assert.matches("did not parse", out[1].message, 1, true)
    end)
  end

  for _, case in ipairs({
    { "a length that is not a multiple of four", "YQ=" },
    { "the URL-safe alphabet", "-_-_" },
    { "padding in the middle", "YQ==YQ==" },
    { "missing padding", "YQ" },
    { "non-zero unused bits", "YR==" },
    { "three padding symbols", "Y===" },
    { "whitespace", "YQ= =" },
  }) do
    it("refuses " .. case[1] .. " as data that does not decode", function()
      local out = decode{ '{"t":"stdout","seq":0,"data":"' .. case[2] .. '"}\n' }
      assert.equal("undecodable", out[1].failed)
      assert.matches("did not decode", out[1].message, 1, true)
    end)
  end

  describe("keep-alives", function()
    local body = '{"t":"keepalive"}\n{"t":"stdout","seq":0,"data":"YQ=="}\n{"t":"keepalive"}\n'
      .. '{"t":"keepalive","extra":[1]}\r\n{"t":"exit","code":0}\n'

    it("consumes those the stream took, in whatever pieces they come, and never hands one over", function()
      local expected = { { type = "stdout", seq = 0, data = "a" }, { type = "exit", code = 0, truncated = false } }
      assert.same(expected, decode({ body }, nil, { "keepalive" }))
      for i = 0, #body do
        assert.same(expected, decode({ body:sub(1, i), body:sub(i + 1) }, nil, { "keepalive" }), "cut at " .. i)
      end
      local d = core.decoder()
      d:admit("keepalive")
      d:feed('{"t":"keepalive"}\n{"t":"keepalive"}\n')
      assert.is_false(d:next(), "nothing but keep-alives is nothing to hand over yet")
      assert.equal(0, d:pending())
    end)

    it("refuses one the stream did not ask for as a line that does not parse, naming it", function()
      local out = decode{ body }
      assert.same({ failed = "unparsable",
        message = "an output frame did not parse: a keepalive frame, which this stream did not ask for" }, out[1])
      assert.equal(1, #out)
    end)

    it("refuses one that carries anything a frame means something by", function()
      for _, member in ipairs{ '"seq":0', '"data":"YQ=="', '"code":0', '"code":"x"', '"message":"m"',
          '"truncated":false', '"signal":9', '"oom":true' } do
        local out = decode({ '{"t":"keepalive",' .. member .. '}\n' }, nil, { "keepalive" })
        assert.same({ failed = "unparsable",
          message = "an output frame did not parse: a keepalive frame carries nothing but `t`" }, out[1], member)
      end
    end)

    it("takes no kind it does not know as one to admit", function()
      assert.has_error(function() core.decoder():admit("stdin") end)
    end)
  end)

  it("delivers nothing after its first failure, not even a later exit", function()
    local d = core.decoder()
    d:feed('{"t":"stdout","seq":0,"data":"!"}\n{"t":"exit","code":0}\n')
    local frame, kind = d:next()
    assert.is_nil(frame)
    assert.equal("undecodable", kind)
    assert.is_nil((d:next()))
    d:feed('{"t":"exit","code":0}\n')
    assert.is_nil((d:next()), "a later feed must not revive it")
    d:feed('{"t":"exit",')
    local again, again_kind = d:next()
    assert.is_nil(again, "nor a later piece of a line make it wait for more")
    assert.equal("undecodable", again_kind)
  end)

  it("refuses a line longer than its limit, even before the newline arrives", function()
    local out = decode({ '{"t":"stdout","seq":0,"data":"' .. string.rep("A", 200) }, 100)
    assert.equal("too_long", out[1].failed)
  end)

  it("hands over payloads as the wire's base64 when asked to, still refusing what is not base64", function()
    local d = core.decoder(nil, true)
    d:feed('{"t":"stdout","seq":4,"data":"aGk="}\n{"t":"stderr","seq":5,"data":"\\/w=="}\n'
      .. '{"t":"exit","code":2}\n{"t":"stdout","seq":6,"data":"aGk"}\n')
    assert.same({ type = "stdout", seq = 4, base64 = "aGk=" }, d:next())
    assert.same({ type = "stderr", seq = 5, base64 = "/w==" }, d:next(), "an escaped '/' is unescaped")
    assert.same({ type = "exit", code = 2, truncated = false }, d:next())
    local frame, kind = d:next()
    assert.is_nil(frame)
    assert.equal("undecodable", kind)
  end)

  --- What a decoder that decodes and one that keeps the base64 each make of one output frame
  -- carrying data: { frame, kind, message } each.
  local function both_ways(data)
    local line = '{"t":"stdout","seq":0,"data":"' .. data .. '"}\n'
    local decoded, kept = core.decoder(), core.decoder(nil, true)
    decoded:feed(line)
    kept:feed(line)
    return { decoded:next() }, { kept:next() }
  end

  it("refuses in the wire's base64 exactly what it refuses to decode, at the same symbol", function()
    for _, data in ipairs({ "aGk", "a=Gk", "aGl=", "aGk=aGk=", "!aGk", "aGkhaGkh*Gkh", "aG=k", "aQ==", "aR==" }) do
      local a, b = both_ways(data)
      assert.equal(a[1] == nil, b[1] == nil, data)
      assert.equal(a[2], b[2], data)
      assert.equal(a[3], b[3], data)
    end
  end)

  it("names the first stray byte of a long payload at whichever symbol it stands, kept or decoded", function()
    -- Long enough that every position is met by the many-bytes-at-once scan, its edges included.
    local good = core.b64encode(string.rep("\0\1\2\253\254\255", 20))
    for _, stray in ipairs({ "!", "=", "-", ",", ".", ":", "@", "[", "`", "{", " ", "\127", "\128", "\255" }) do
      for at = 1, #good - 4 do
        local decoded, kept = both_ways(good:sub(1, at - 1) .. stray .. good:sub(at + 1))
        assert.is_nil(kept[1])
        assert.equal("undecodable", kept[2])
        assert.matches("(at symbol " .. (at - 1) .. ")", kept[3], 1, true)
        assert.same(decoded, kept)
      end
    end
  end)

  it("ends a long string at its quote whatever the position of an escape or a control character", function()
    local text = string.rep("abcdefgh", 12)
    for at = 1, #text + 1 do
      local before, after = text:sub(1, at - 1), text:sub(at)
      local out = decode{ '{"t":"error","code":"x","message":"' .. before .. '\\"' .. after .. '"}\n' }
      assert.equal(before .. '"' .. after, out[1].message)
      out = decode{ '{"t":"error","code":"x","message":"' .. before .. '\31' .. after .. '"}\n' }
      assert.equal("unparsable", out[1].failed)
      -- Neither a space nor bytes of 0x7f and up are control characters.
      for _, byte in ipairs({ " ", "\127", "\128", "\255" }) do
        out = decode{ '{"t":"error","code":"x","message":"' .. before .. byte .. after .. '"}\n' }
        assert.equal(before .. byte .. after, out[1].message)
      end
    end
  end)

  it("reads an output frame in the agent's own member order as it reads the same members in another", function()
    -- The agent's order is read by position; anything odd inside it must end as the general
    -- reading of the line ends, frame or failure.
    for _, case in ipairs({
      { "1", "YQ==" }, { "0", "" }, { "01", "YQ==" }, { "-1", "YQ==" }, { "1.0", "YQ==" },
      { "9223372036854775807", "YQ==" }, { "9223372036854775808", "YQ==" },
      { "18446744073709551616", "YQ==" }, { "1", "\\/w==" }, { "1", "\\u0041A==" },
      { "1", 'YQ==\\"' }, { "1", "YQ\31==" }, { "1", 'YQ==","x":"a' }, { "1", 'YQ==","data":"Yg==' },
      { "1", "YQ" }, { "1", "!" },
    }) do
      local seq, data = case[1], case[2]
      local agent = core.decoder()
      agent:feed('{"t":"stdout","seq":' .. seq .. ',"data":"' .. data .. '"}\n')
      local other = core.decoder()
      other:feed('{"data":"' .. data .. '","t":"stdout","seq":' .. seq .. '}\n')
      local a, a_kind = agent:next()
      local b, b_kind = other:next()
      assert.same(b, a, seq .. " " .. data)
      assert.equal(b_kind, a_kind, seq .. " " .. data)
    end
  end)

  it("holds a line well above a 64 KiB frame by default", function()
    local data = core.b64encode(string.rep("x", 65536))
    -- Escaping every '/' doubles the line; still under the default limit.
    local escaped = ('{"t":"stdout","seq":0,"data":"' .. data .. '"}'):gsub("/", "\\/")
    local out = decode{ escaped .. "\n" }
    assert.equal(65536, #out[1].data)
  end)

  it("takes a chunk fed before next() ran out of the last one only while what is left of it starts a line", function()
    local d = core.decoder()
    d:feed('{"t":"stdout","seq":0,')
    d:feed('"data":"YWJj"}\n{"t":"exit",')
    assert.equal("abc", d:next().data)
    assert.is_false(d:next())
    d:feed('"code":0}\n{"t":"exit","code":1}\n')
    assert.equal(0, d:next().code)
    -- A whole line still to be handed out would come after the new chunk's lines.
    local ok, err = pcall(d.feed, d, '{"t":"exit","code":2}\n')
    assert.is_false(ok)
    assert.truthy(tostring(err):find("feed() before next() has used up the previous chunk", 1, true), err)
    assert.equal(1, d:next().code)
    assert.is_false(d:next())
  end)

  it("counts an unterminated tail as pending bytes", function()
    local _, d = decode{ '{"t":"exit","code":0}\n{"t":"ex' }
    assert.equal(8, d:pending())
  end)
end)

--- n as width bytes, big-endian (string.pack is not LuaJIT's).
local function big_endian(n, width)
  local bytes = {}
  for i = width, 1, -1 do
    bytes[i] = string.char(n % 256)
    n = (n - n % 256) / 256
  end
  return table.concat(bytes)
end

--- A binary frame (docs/protocol.md §6 binaryFrames): its kind, its body's length, its body.
local function binary(kind, body)
  return kind .. big_endian(#body, 4) .. body
end

local function output(kind, seq, data)
  return binary(kind, big_endian(seq, 8) .. data)
end

--- As decode, for a binary body; `keep` keeps payloads as base64.
local function decode_binary(chunks, max_line, admit, keep)
  local d = core.decoder(max_line, keep)
  d:binary()
  for _, kind in ipairs(admit or {}) do d:admit(kind) end
  local out = {}
  for _, chunk in ipairs(chunks) do
    d:feed(chunk)
    while true do
      local frame, kind, message = d:next()
      if frame then
        out[#out + 1] = frame
      elseif frame == false then
        break
      else
        out[#out + 1] = { failed = kind, message = message }
        return out, d
      end
    end
  end
  return out, d
end

describe("binary frames", function()
  local body = output("o", 0, "a\0b\n") .. output("e", 1, "") .. output("o", 7, string.rep("\255", 300))
    .. binary("j", '{"t":"exit","code":3,"signal":9}')

  it("carry output as its bytes, and every other frame as its JSON", function()
    assert.same({ { type = "stdout", seq = 0, data = "a\0b\n" }, { type = "stderr", seq = 1, data = "" },
      { type = "stdout", seq = 7, data = string.rep("\255", 300) },
      { type = "exit", code = 3, truncated = false, signal = 9 } }, decode_binary{ body })
    assert.same({ { type = "error", code = "timeoutExceeded", message = "late" } },
      decode_binary{ binary("j", '{"t":"error","code":"timeoutExceeded","message":"late"}') })
  end)

  it("decode the same from a body cut anywhere into two or three chunks", function()
    local whole = decode_binary{ body }
    for i = 0, #body do
      assert.same(whole, decode_binary{ body:sub(1, i), body:sub(i + 1) }, "cut at " .. i)
      for j = i, #body, 29 do
        assert.same(whole, decode_binary{ body:sub(1, i), body:sub(i + 1, j), body:sub(j + 1) },
          "cut at " .. i .. " and " .. j)
      end
    end
  end)

  it("hand over long and short payloads alike, in whatever pieces they come, kept as base64 or not", function()
    local payloads, frames = {}, {}
    for i, n in ipairs({ 70000, 5, 65536, 1, 9000, 300000, 12, 65536 }) do
      local bytes = {}
      for k = 1, n do bytes[k] = string.char((k * 7 + i) % 256) end
      payloads[i] = table.concat(bytes)
      frames[i] = output("o", i, payloads[i])
    end
    local all = table.concat(frames) .. binary("j", '{"t":"exit","code":0}')
    for _, size in ipairs({ 1000, 4096, 65536, 131072 }) do
      for _, keep in ipairs({ false, true }) do
        local chunks = {}
        for at = 1, #all, size do chunks[#chunks + 1] = all:sub(at, at + size - 1) end
        local got = decode_binary(chunks, nil, nil, keep)
        assert.equal(#payloads + 1, #got)
        for i, payload in ipairs(payloads) do
          assert.equal(payload, keep and core.b64decode(got[i].base64) or got[i].data, size .. " " .. i)
        end
      end
    end
  end)

  it("take a frame whose body is at the limit, and refuse one over it as soon as its header arrives", function()
    local at_limit = output("o", 0, string.rep("x", 92))
    assert.same({ { type = "stdout", seq = 0, data = string.rep("x", 92) } }, decode_binary({ at_limit }, 100))
    local out = decode_binary({ "o" .. big_endian(101, 4) }, 100)
    assert.equal("too_long", out[1].failed)
    assert.matches("a frame exceeded the decoder's limit", out[1].message, 1, true)
    -- Four gigabytes declared: refused on the header, nothing gathered for it.
    out = decode_binary{ "j\255\255", "\255\255" }
    assert.equal("too_long", out[1].failed)
  end)

  it("count a frame still arriving as pending, which a body that ends there leaves unfinished", function()
    local out, d = decode_binary{ output("o", 0, "abc"), output("o", 1, "defgh"):sub(1, 9) }
    assert.same({ { type = "stdout", seq = 0, data = "abc" } }, out)
    assert.equal(9, d:pending())
    out, d = decode_binary{ "o\0\0" }
    assert.same({}, out)
    assert.equal(3, d:pending())
  end)

  for _, case in ipairs({
    { "a kind it does not know", binary("x", "{}"), "unknown binary frame kind" },
    { "output shorter than its seq", binary("o", "1234567"), "shorter than its seq" },
    { "a seq past a signed 64-bit integer", binary("o", "\128" .. string.rep("\0", 7) .. "x"),
      "seq out of range" },
    { "output in a JSON frame", binary("j", '{"t":"stdout","seq":0,"data":"YQ=="}'),
      "output in a JSON frame" },
    { "a JSON frame that is no JSON", binary("j", '{"t":"exit",'), "did not parse" },
    { "an empty JSON frame", binary("j", ""), "did not parse" },
    { "a keep-alive the stream did not ask for", binary("j", '{"t":"keepalive"}'), "did not ask for" },
    { "a watch's event on an exec stream", binary("j", '{"t":"event","event":"create","path":"/a"}'),
      "did not ask for" },
  }) do
    it("refuse " .. case[1] .. " as a frame that does not parse, and nothing after it", function()
      local out = decode_binary{ case[2] .. binary("j", '{"t":"exit","code":0}') }
      assert.equal(1, #out)
      assert.equal("unparsable", out[1].failed)
      assert.matches(case[3], out[1].message, 1, true)
    end)
  end

  it("fail at once on an NDJSON body, whose first bytes read as a frame far over the limit", function()
    local out = decode_binary{ '{"t":"exit","code":0}\n' }
    assert.same({ { failed = "too_long", message = out[1].message } }, out)
  end)

  it("consume the keep-alives a stream asked for, in whatever pieces they come", function()
    local ka = binary("j", '{"t":"keepalive"}')
    local all = ka .. output("o", 0, "x") .. ka .. ka .. binary("j", '{"t":"exit","code":0}')
    for i = 0, #all do
      local out = decode_binary({ all:sub(1, i), all:sub(i + 1) }, nil, { "keepalive" })
      assert.same({ "stdout", "exit" }, { out[1].type, out[2] and out[2].type }, "cut at " .. i)
      assert.equal(2, #out)
    end
  end)

  it("are chosen before the first bytes, never in the middle of a body", function()
    local d = core.decoder()
    d:feed('{"t":"exit"')
    assert.has_error(function() d:binary() end)
  end)
end)

describe("a watch's frames", function()
  --- The frames a watch's stream decodes to (the kinds it takes: event, end, error).
  local function watch_frames(body)
    local d = core.decoder()
    d:expect("event", "end", "error")
    d:feed(body)
    local out = {}
    while true do
      local frame, kind, message = d:next()
      if frame == false then break end
      out[#out + 1] = frame or { failed = kind, message = message }
      if not frame then break end
    end
    return out
  end

  it("reads events with their path, a rename's from, an overflow, and the end's reason", function()
    assert.same({
      { type = "event", event = "create", path = "/a b" },
      { type = "event", event = "rename", from = "/x", path = "/\u{e9}" },
      { type = "event", event = "overflow" },
      { type = "end", reason = "timeout" },
    }, watch_frames('{"t":"event","event":"create","path":"/a b"}\n'
      .. '{"path":"/\\u00e9","from":"\\/x","t":"event","event":"rename"}\n'
      .. '{"t":"event","event":"overflow"}\n{"t":"end","reason":"timeout"}\n'))
  end)

  it("refuses an event it does not know, a path missing or out of place, and a member twice", function()
    for _, line in ipairs({
      '{"t":"event","event":"explode","path":"/a"}', '{"t":"event","path":"/a"}',
      '{"t":"event","event":"create"}', '{"t":"event","event":"overflow","path":"/a"}',
      '{"t":"event","event":"rename","path":"/a"}', '{"t":"event","event":"create","path":"/a","from":"/b"}',
      '{"t":"event","event":"create","path":1}', '{"t":"end"}', '{"t":"end","reason":7}',
      '{"t":"event","event":"create","path":"/a","path":"/b"}',
    }) do
      local out = watch_frames(line .. "\n")
      assert.equal("unparsable", out[#out].failed, line)
    end
  end)

  it("is a failure on an exec stream, and an exec stream's output is one on a watch's", function()
    local out = decode{ '{"t":"event","event":"create","path":"/a"}\n' }
    assert.equal("unparsable", out[1].failed)
    assert.matches("an event frame, which this stream did not ask for", out[1].message, 1, true)
    out = decode{ '{"t":"end","reason":"timeout"}\n' }
    assert.equal("unparsable", out[1].failed)
    out = watch_frames('{"t":"stdout","seq":0,"data":""}\n')
    assert.matches("a stdout frame, which this stream did not ask for", out[1].message, 1, true)
    out = watch_frames('{"t":"exit","code":0}\n')
    assert.equal("unparsable", out[1].failed)
    assert.same({ type = "error", code = "watchLimitReached", message = "m" },
      watch_frames('{"t":"error","code":"watchLimitReached","message":"m"}\n')[1])
  end)

  it("takes only kinds it knows to expect, and at least one", function()
    local d = core.decoder()
    assert.has_error(function() d:expect("keepalives") end)
    assert.has_error(function() d:expect() end)
  end)
end)

describe("base64", function()
  it("round-trips every byte value and every length remainder", function()
    local all = {}
    for i = 0, 255 do all[#all + 1] = string.char(i) end
    local bytes = table.concat(all)
    for n = 0, 6 do
      local s = bytes:sub(1, 250 + n)
      assert.equal(s, core.b64decode(core.b64encode(s)))
    end
  end)

  it("encodes as RFC 4648 spells it, and decodes back, at every length through several wide blocks", function()
    local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    local function symbol(v) return alphabet:sub(v + 1, v + 1) end
    --- Three bytes at a time, by the arithmetic of RFC 4648 §4: the reference.
    local function spelled(s)
      local out = {}
      for i = 1, #s, 3 do
        local a, b, c = s:byte(i, i + 2)
        local n = (a * 256 + (b or 0)) * 256 + (c or 0)
        local q1, q2, q3 = math.floor(n / 262144), math.floor(n / 4096) % 64, math.floor(n / 64) % 64
        out[#out + 1] = symbol(q1) .. symbol(q2) .. (b and symbol(q3) or "=") .. (c and symbol(n % 64) or "=")
      end
      return table.concat(out)
    end
    local bytes = {}
    for i = 1, 400 do bytes[i] = string.char((i * 131 + math.floor(i / 7)) % 256) end
    local source = table.concat(bytes)
    for n = 0, 400 do
      local s = source:sub(1, n)
      local encoded = core.b64encode(s)
      assert.equal(spelled(s), encoded, "length " .. n)
      assert.equal(s, core.b64decode(encoded), "length " .. n)
    end
  end)

  it("refuses every byte outside the alphabet at every position of a wide block, naming it", function()
    local good = core.b64encode(string.rep("\0\16\131\16\81\135\32\146\139\48\211\143", 20))
    for at = 1, 64 do
      for b = 0, 255 do
        local c = string.char(b)
        local bytes, bad = core.b64decode(good:sub(1, at - 1) .. c .. good:sub(at + 1))
        if c:match("[A-Za-z0-9+/]") then
          assert.is_string(bytes)
        else
          assert.is_nil(bytes, "byte " .. b .. " at " .. at)
          assert.equal(at - 1, bad, "byte " .. b .. " at " .. at)
        end
      end
    end
  end)

  it("matches RFC 4648's test vectors", function()
    local vectors = { [""] = "", f = "Zg==", fo = "Zm8=", foo = "Zm9v", foob = "Zm9vYg==",
      fooba = "Zm9vYmE=", foobar = "Zm9vYmFy" }
    for plain, encoded in pairs(vectors) do
      assert.equal(encoded, core.b64encode(plain))
      assert.equal(plain, core.b64decode(encoded))
    end
  end)

  it("names the offset of the first bad symbol", function()
    local bytes, at = core.b64decode("Zm9v*m8=")
    assert.is_nil(bytes)
    assert.equal(4, at)
  end)
end)
