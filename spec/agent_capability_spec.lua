-- sandkit-agent's capability mode (docs/protocol.md §2.1), over real sockets: Ed25519 tokens
-- for one session, a ring of trusted keys, the token in Authorization or X-Sandkit-Capability,
-- 401 without a credential, 403 SANDBOX_CAPABILITY_REFUSED for anything else, and a refused
-- request doing nothing.

local cjson = require "cjson"
local core = require "sandkit.core"
local capability = require "sandkit.providers.kubernetes.capability"
local fake_http = require "support.fake_http"
local files = require "support.files"
local raw = require "support.raw_http"

local AGENT = os.getenv("SANDKIT_AGENT")
local SESSION = "2f6c1d4e-8a3b-4c5d-9e7f-0a1b2c3d4e5f"

local function new_key()
  local seed = core.random(32)
  local pem = "-----BEGIN PRIVATE KEY-----\n" .. core.b64encode(
    "\48\46\2\1\0\48\5\6\3\43\101\112\4\34\4\32" .. seed) .. "\n-----END PRIVATE KEY-----\n"
  return assert(core.ed25519_key(pem))
end

local function ring(keys)
  local entries = {}
  for _, k in ipairs(keys) do entries[#entries + 1] = k[1] .. ":" .. core.b64encode(k[2]:public()) end
  return table.concat(entries, ",")
end

--- Starts the agent with args (and env, replacing the environment when given): the agent, or
-- nil and what it said on stderr.
local function start(args, env)
  assert(AGENT, "set SANDKIT_AGENT to the sandkit-agent binary")
  local dir = files.temp_dir()
  assert(core.mkdir(dir .. "/root", 448))
  local argv = { AGENT, "--root", dir .. "/root", "--listen", "127.0.0.1:0", "--ready-fd", "3",
    "--log", "quiet" }
  for _, a in ipairs(args) do argv[#argv + 1] = a end
  local pid, reader = assert(core.spawn(argv, { ready_fd = 3, stderr = dir .. "/agent.log", env = env }))
  local line = fake_http.read_line(reader, 10)
  reader:close()
  if not line then
    core.reap(pid, true)
    local said = files.read(dir .. "/agent.log") or ""
    core.remove_tree(dir)
    return nil, said
  end
  return { pid = pid, dir = dir, root = dir .. "/root", port = math.floor(cjson.decode(line).port) }
end

local function stop(agent)
  if agent then
    core.kill(agent.pid, core.SIGTERM)
    core.reap(agent.pid, true)
    core.remove_tree(agent.dir)
  end
end

local function claims(fields)
  local c = { sessionId = SESSION, operation = "execute", generation = 1,
    expiresAt = os.time() + 300, keyId = "k1" }
  for k, v in pairs(fields or {}) do c[k] = v end
  return c
end

--- A token over exactly this payload text, signed by key.
local function signed(key, text)
  local payload = capability.b64url(text)
  return payload .. "." .. capability.b64url(key:sign(payload))
end

describe("sandkit-agent in capability mode", function()
  local k1, k2, outsider, agent
  before_each(function()
    k1, k2, outsider = new_key(), new_key(), new_key()
    agent = assert(start{ "--auth", "capability", "--session-id", SESSION,
      "--public-keys", ring{ { "k1", k1 }, { "k2", k2 } } })
  end)
  after_each(function() stop(agent) end)

  local function mkdir(headers, name)
    return assert(raw.request(agent.port, "POST", "/v1/mkdir", { headers = headers,
      body = cjson.encode{ path = "/" .. name } }))
  end

  local function exists(name)
    return files.execute("test -e '" .. agent.root .. "/" .. name .. "'")
  end

  it("serves a request whose bearer token names its session and is signed by a key of its ring", function()
    local res = mkdir({ Authorization = "Bearer " .. capability.encode(k1, claims()) }, "a")
    assert.equal(204, res.status, res.body)
    assert.is_true(exists("a"))
    -- The ring's second key, as during a rotation.
    res = mkdir({ Authorization = "Bearer " .. capability.encode(k2, claims{ keyId = "k2" }) }, "b")
    assert.equal(204, res.status, res.body)
  end)

  it("takes the token from X-Sandkit-Capability, whatever Authorization a proxy left beside it", function()
    local res = mkdir({ ["X-Sandkit-Capability"] = capability.encode(k1, claims()),
      Authorization = "Bearer something-of-the-proxy" }, "c")
    assert.equal(204, res.status, res.body)
    assert.is_true(exists("c"))
  end)

  it("answers 401 to a request without any credential, and health without one", function()
    local res = mkdir({}, "d")
    assert.equal(401, res.status)
    assert.equal("a capability is required", res.body)
    assert.is_false(exists("d"))
    local health = assert(raw.request(agent.port, "GET", "/v1/health?version=1"))
    assert.equal(200, health.status)
    assert.same({ "binaryFrames", "jobIdempotency", "keepalive", "outputCap", "rawFiles", "fs", "fsTar", "fsWatch",
      "jobStdin", "jobPty", "jobSignal", "jobStream", "jobList", "capability" },
      cjson.decode(health.body).features)
  end)

  it("refuses every other credential with 403 SANDBOX_CAPABILITY_REFUSED and does nothing", function()
    local now = os.time()
    --- A good token whose signature is written in standard base64 instead: one whose signature
    -- has a '-' or '_' to change (most have; a claim that varies finds one that does).
    local function standard_alphabet()
      for nonce = 1, 64 do
        local p, s = capability.encode(k1, claims{ nonce = nonce }):match("^([^.]+)%.(.+)$")
        if s:find("[-_]") then return p .. "." .. (s:gsub("[-_]", { ["-"] = "+", ["_"] = "/" })) end
      end
      error("no signature of 64 had a character that differs between the alphabets")
    end
    local good = capability.encode(k1, claims())
    local payload, sig = good:match("^([^.]+)%.(.+)$")
    local cases = {
      ["another session"] = capability.encode(k1, claims{ sessionId = "another-pod-uid" }),
      ["expired a second ago"] = capability.encode(k1, claims{ expiresAt = now - 1 }),
      ["another generation"] = capability.encode(k1, claims{ generation = 2 }),
      ["another operation"] = capability.encode(k1, claims{ operation = "manage" }),
      ["a key outside the ring"] = capability.encode(outsider, claims()),
      ["keyId naming another key"] = capability.encode(k1, claims{ keyId = "k2" }),
      ["longer than an hour"] = capability.encode(k1, claims{ expiresAt = now + 4000 }),
      ["claims changed after signing"] = capability.b64url(cjson.encode(claims{ sessionId = "x" })) .. "." .. sig,
      ["a signature cut short"] = payload .. "." .. sig:sub(1, 80),
      ["three parts"] = good .. ".x",
      ["no dot"] = payload .. sig,
      ["padded base64"] = good .. "==",
      ["the standard alphabet"] = standard_alphabet(),
      ["claims that are not JSON"] = signed(k1, "not json"),
      ["claims without keyId"] = signed(k1, '{"sessionId":"' .. SESSION .. '","operation":"execute",'
        .. '"generation":1,"expiresAt":' .. (now + 300) .. '}'),
      ["a member given twice"] = signed(k1, '{"sessionId":"other","sessionId":"' .. SESSION
        .. '","operation":"execute","generation":1,"expiresAt":' .. (now + 300) .. ',"keyId":"k1"}'),
      ["expiresAt as a string"] = signed(k1, '{"sessionId":"' .. SESSION .. '","operation":"execute",'
        .. '"generation":1,"expiresAt":"' .. (now + 300) .. '","keyId":"k1"}'),
      ["a token past 2048 characters"] = capability.encode(k1, claims{ pad = string.rep("p", 1600) }),
    }
    local n = 0
    for name, token in pairs(cases) do
      n = n + 1
      for _, headers in ipairs{ { Authorization = "Bearer " .. token }, { ["X-Sandkit-Capability"] = token } } do
        local res = mkdir(headers, "refused-" .. n)
        assert.equal(403, res.status, name)
        assert.matches("^SANDBOX_CAPABILITY_REFUSED: Sandbox capability refused: ", res.body, 1, false, name)
        assert.is_false(exists("refused-" .. n), name .. " had an effect")
      end
    end
    -- A token just under the length bound is read (and refused only for what it says).
    local near = capability.encode(k1, claims{ pad = string.rep("p", 1300) })
    assert.is_true(#near < 2048)
    assert.equal(204, mkdir({ Authorization = "Bearer " .. near }, "near").status)
    local basic = mkdir({ Authorization = "Basic " .. good }, "basic")
    assert.equal(403, basic.status)
    assert.is_false(exists("basic"))
  end)

  it("refuses two credential headers of one kind, which one counts being a guess", function()
    local token = capability.encode(k1, claims())
    for _, name in ipairs{ "X-Sandkit-Capability", "Authorization" } do
      local value = name == "Authorization" and ("Bearer " .. token) or token
      local c = assert(raw.connect(agent.port))
      local body = cjson.encode{ path = "/twice" }
      assert(c:send("POST /v1/mkdir HTTP/1.1\r\nHost: x\r\n" .. name .. ": " .. value .. "\r\n"
        .. name .. ": " .. value .. "\r\nContent-Length: " .. #body .. "\r\n\r\n" .. body))
      local status = assert(c:read_head())
      local text = c:read_body()
      c:close()
      assert.equal(403, status)
      assert.matches("more than one credential", text)
    end
    assert.is_false(exists("twice"))
  end)
end)

describe("sandkit-agent's capability configuration", function()
  local key = new_key()
  local good_ring = ring{ { "k1", key } }

  it("is read from SANDKIT_AGENT_AUTH, SANDKIT_AGENT_SESSION_ID and SANDKIT_AGENT_PUBLIC_KEYS", function()
    local agent = assert(start({}, { PATH = os.getenv("PATH"), SANDKIT_AGENT_AUTH = "capability",
      SANDKIT_AGENT_SESSION_ID = SESSION, SANDKIT_AGENT_PUBLIC_KEYS = good_ring }))
    finally(function() stop(agent) end)
    local res = assert(raw.request(agent.port, "POST", "/v1/mkdir", { body = '{"path":"/e"}',
      headers = { Authorization = "Bearer " .. capability.encode(key, claims()) } }))
    assert.equal(204, res.status)
  end)

  it("refuses to start on a key ring or session id it cannot use, naming what is wrong", function()
    local raw_key = core.b64encode(key:public())
    local many = {}
    for i = 1, 17 do many[i] = "k" .. i .. ":" .. raw_key end
    local cases = {
      { { "--auth", "capability", "--public-keys", good_ring }, "--session%-id must be" },
      { { "--auth", "capability", "--session-id", SESSION }, "--public%-keys is required" },
      { { "--auth", "capability", "--session-id", "has space", "--public-keys", good_ring }, "--session%-id" },
      { { "--auth", "capability", "--session-id", string.rep("u", 129), "--public-keys", good_ring },
        "1 to 128" },
      { { "--auth", "capability", "--session-id", SESSION, "--public-keys",
        string.rep("k", 65) .. ":" .. raw_key }, "the kid 1 to 64" },
      { { "--auth", "capability", "--session-id", SESSION, "--public-keys", "k1" }, "kid:BASE64" },
      { { "--auth", "capability", "--session-id", SESSION, "--public-keys", "k1:" .. raw_key:sub(2) },
        "not 32 bytes" },
      { { "--auth", "capability", "--session-id", SESSION, "--public-keys", good_ring .. "," .. good_ring },
        "names 'k1' twice" },
      { { "--auth", "capability", "--session-id", SESSION, "--public-keys", table.concat(many, ",") },
        "more than 16 keys" },
      { { "--session-id", SESSION, "--no-auth" }, "belong to %-%-auth capability" },
      { { "--auth", "capability", "--session-id", SESSION, "--public-keys", good_ring, "--no-auth" },
        "exclude each other" },
      { { "--auth", "magic" }, "must be bearer, none or capability" },
    }
    for _, case in ipairs(cases) do
      local agent, said = start(case[1])
      stop(agent)
      assert.is_nil(agent, table.concat(case[1], " "))
      assert.matches(case[2], said)
    end
  end)
end)
