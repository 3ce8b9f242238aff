-- A streamed command is not capped unless asked: `outputCap` on /v1/exec (docs/protocol.md §6)
-- goes to an agent that advertises it, 0 (none) by default for run, the caller's output_cap when
-- given, exec's max_output for exec; jobs and agents without the extension keep the agent's cap.

local cjson = require "cjson"
local sandkit = require "sandkit"
local agent_session = require "support.agent_session"
local local_state = require "support.local_state"

local EXIT = [[function(req, conn)
  if req.path == "/v1/jobs/start" then return respond.json(conn, "200 OK", { jobId = "j1" }) end
  respond.frames(conn, { '{"t":"exit","code":0}\n' })
end]]

local function bodies(server, path)
  local list = {}
  for i, r in ipairs(server:requests_to(path)) do list[i] = cjson.decode(r.body) end
  return list
end

describe("outputCap", function()
  local server
  after_each(function() server:stop() end)

  it("is 0 for a run unless the caller asks, and the caller's output_cap when it does", function()
    local session
    session, server = agent_session.open(EXIT, nil, { "jobIdempotency", "outputCap" })
    for _ in session:run({ "true" }, { timeout = 5 }) do end
    for _ in session:run({ "true" }, { timeout = 5, output_cap = 4096 }) do end
    assert(session:exec({ "true" }, { timeout = 5 }))
    assert(session:exec({ "true" }, { timeout = 5, max_output = 100 }))
    assert(session:start_job({ "true" }, { timeout = 5 }))
    local caps = {}
    for i, body in ipairs(bodies(server, "/v1/exec")) do caps[i] = body.outputCap end
    assert.same({ 0, 4096, 1024 * 1024, 100 }, caps)
    assert.is_nil(bodies(server, "/v1/jobs/start")[1].outputCap, "jobs keep the agent's cap")
  end)

  it("is never sent to an agent that does not advertise it", function()
    local session
    session, server = agent_session.open(EXIT)
    for _ in session:run({ "true" }, { timeout = 5, output_cap = 10 }) do end
    assert(session:exec({ "true" }, { timeout = 5 }))
    for _, body in ipairs(bodies(server, "/v1/exec")) do assert.is_nil(body.outputCap) end
  end)

  it("refuses a cap that is not a whole number of bytes, sending nothing", function()
    local session
    session, server = agent_session.open(EXIT, nil, { "outputCap" })
    local _, err = session:exec({ "true" }, { timeout = 5, output_cap = -1 })
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("output_cap", err.field)
    assert.equal(0, #server:requests_to("/v1/exec"))
  end)
end)

describe("a stream through the real sandkit-agent", function()
  local root
  before_each(function() root = local_state.new() end)
  after_each(function() local_state.clean(root) end)

  it("is not cut at the agent's cap once the agent takes outputCap", function()
    local session = assert(assert(sandkit.sandbox{ provider = "local", root = root }):create{ id = "cap" })
    assert(session:exec({ "true" }, { timeout = 5 }))
    assert.is_true(session.conn.features.outputCap, "sandkit-agent offers outputCap")
    local got, truncated = 0, nil
    for frame in session:run({ "head", "-c", "10000000", "/dev/zero" }, { timeout = 60 }) do
      if frame.type == "exit" then truncated = frame.truncated else got = got + #frame.data end
    end
    assert.equal(10000000, got)
    assert.is_false(truncated)
    local capped = 0
    for frame in session:run({ "head", "-c", "10000000", "/dev/zero" }, { timeout = 60, output_cap = 1000 }) do
      if frame.type == "exit" then truncated = frame.truncated else capped = capped + #frame.data end
    end
    assert.equal(1000, capped)
    assert.is_true(truncated)
  end)

  it("makes exec say truncated exactly when max_output cut its output, whoever cut it", function()
    local session = assert(assert(sandkit.sandbox{ provider = "local", root = root }):create{ id = "cut" })
    local function exec(script, opts)
      opts.timeout = 30
      return assert(session:exec({ "sh", "-c", script }, opts))
    end
    -- The agent cuts: exec asks it for max_output as its outputCap.
    local r = exec("head -c 5000 /dev/zero", { max_output = 1000 })
    assert.equal(1000, #r.stdout)
    assert.is_true(r.truncated)
    r = exec("head -c 5000 /dev/zero >&2", { max_output = 1000 })
    assert.equal(1000, #r.stderr)
    assert.is_true(r.truncated, "a cut stderr is a truncated result too")
    -- Exec cuts: the agent was told to send everything.
    r = exec("head -c 5000 /dev/zero", { max_output = 1000, output_cap = 0 })
    assert.equal(1000, #r.stdout)
    assert.is_true(r.truncated)
    -- Output of exactly max_output bytes, on each stream, is whole.
    r = exec("head -c 1000 /dev/zero; head -c 1000 /dev/zero >&2", { max_output = 1000 })
    assert.equal(1000, #r.stdout)
    assert.equal(1000, #r.stderr)
    assert.is_false(r.truncated)
    r = exec("head -c 1000 /dev/zero", { max_output = 1000, output_cap = 0 })
    assert.is_false(r.truncated)
  end)
end)
