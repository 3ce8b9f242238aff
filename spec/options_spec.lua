-- Unknown option keys are refused, naming the key and the nearest known one, before anything
-- is sent: a misspelt key would otherwise be ignored and its default silently used.

local sandkit = require "sandkit"
local agent_session = require "support.agent_session"
local local_state = require "support.local_state"
local options = require "sandkit.options"

describe("option tables", function()
  it("name the nearest known key, and none when nothing is close", function()
    local known = options.set{ "command_timeout", "header_timeout", "root" }
    assert.equal("command_timeout", options.nearest("comand_timeout", known))
    assert.equal("root", options.nearest("rot", known))
    assert.is_nil(options.nearest("banana", known))
  end)

  it("for sandkit.sandbox are refused when no provider takes the key", function()
    local root = local_state.new()
    local sb, err = sandkit.sandbox{ provider = "local", root = root, comand_timeout = 10 }
    assert.is_nil(sb)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("comand_timeout", err.field)
    assert.matches("unknown option comand_timeout (did you mean command_timeout?)", err.message, 1, true)
    -- A key of another provider is not this one's.
    sb, err = sandkit.sandbox{ provider = "local", root = root, url = "http://127.0.0.1:1" }
    assert.is_nil(sb)
    assert.equal("url", err.field)
    assert(sandkit.sandbox{ provider = "local", root = root, command_timeout = 10, grace = 5,
      header_timeout = 5, error_body_timeout = 5, body_timeout = 5, connect_timeout = 5,
      isolate = nil, agent_path = nil, output_cap = 1024, ready_timeout = 5 })
    local_state.clean(root)
  end)

  it("are declared by every provider this installation has", function()
    for _, name in ipairs{ "local", "agent", "aws", "azure" } do
      local module = require("sandkit.providers." .. name)
      assert.is_table(module.OPTIONS, name)
    end
  end)
end)

describe("create options", function()
  local root, sandbox
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root })
  end)
  after_each(function() local_state.clean(root) end)

  it("are refused before a session is made", function()
    local session, err = sandbox:create{ id = "typo", evn = { A = "1" } }
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("unknown option evn (did you mean env?)", err.message, 1, true)
    assert.is_nil(sandbox:get("typo"), "nothing was created")
    local _, gerr = sandbox:get_or_create{ id = "typo", lifetme = 5 }
    assert.matches("did you mean lifetime?", gerr.message, 1, true)
  end)
end)

describe("command options", function()
  local session, server
  before_each(function()
    session, server = agent_session.open([[function(req, conn)
      respond.frames(conn, { '{"t":"exit","code":0}\n' }) end]])
  end)
  after_each(function() server:stop() end)

  it("are refused by exec, run, start_job and job frames, and nothing is sent", function()
    local result, err = session:exec({ "true" }, { timeout = 5, cwdd = "/app" })
    assert.is_nil(result)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("cwdd", err.field)
    assert.matches("did you mean cwd?", err.message, 1, true)

    local ok, rerr = pcall(function()
      for _ in session:run({ "true" }, { timeout = 5, max_output = 10 }) do end
    end)
    assert.is_false(ok)
    assert.equal("INVALID_INPUT", rerr.code)
    assert.equal("max_output", rerr.field, "max_output is exec's, not run's")

    local job, jerr = session:start_job({ "true" }, { timeout = 5, lines = true })
    assert.is_nil(job)
    assert.equal("lines", jerr.field)

    local fok, ferr = pcall(function()
      for _ in session:job("j1"):frames{ intervall = 0.1 } do end
    end)
    assert.is_false(fok)
    assert.matches("did you mean interval?", ferr.message, 1, true)

    assert.equal(0, #server:requests_to("/v1/exec"))
    assert.equal(0, #server:requests_to("/v1/jobs/start"))
    assert.equal(0, #server:requests_to("/v1/jobs/poll"))
  end)

  it("let every documented key through", function()
    assert(session:exec({ "true" }, { timeout = 5, cwd = "/", env = { A = "1" }, max_output = 10,
      output_cap = 10 }))
    for _ in session:run({ "true" }, { timeout = 5, cwd = "/", env = {}, output_cap = 0, lines = true }) do end
  end)
end)

describe("command-line values", function()
  it("are finite numbers: inf, NaN and a number past a double's range are refused, saying what fits", function()
    for _, convert in ipairs{ options.flag.seconds, options.flag.whole_number, options.flag.whole_seconds,
        options.flag.lifetime, options.flag.port } do
      for _, text in ipairs{ "inf", "-inf", "nan", "1e999", "-1e999", "ten", "" } do
        local value, why = convert(text)
        assert.is_nil(value, text)
        assert.is_string(why, text)
      end
    end
    assert.equal(0.5, options.flag.seconds("0.5"))
    assert.equal(1e300, options.flag.seconds("1" .. string.rep("0", 300)), "a finite deadline, however far, is one")
    assert.is_nil(options.flag.seconds("1" .. string.rep("0", 400)), "past a double's range")
    assert.equal(1.5, options.flag.lifetime("1.5"))
    assert.is_nil(options.flag.lifetime("0.5"))
  end)

  it("are decimal digits and nothing else, not whatever tonumber reads", function()
    for _, convert in ipairs{ options.flag.seconds, options.flag.whole_number, options.flag.whole_seconds,
        options.flag.lifetime, options.flag.port } do
      for _, text in ipairs{ "0x10", "0X10", "1e3", "1E3", "+16", " 16", "16 ", "\t16", "16\n", "-16", ".", "0x1p4" } do
        local value, why = convert(text)
        assert.is_nil(value, text)
        assert.is_string(why, text)
      end
      assert.equal(16, convert("16"))
      assert.equal(16, convert("0016"))
    end
    assert.equal(1.25, options.flag.seconds("1.25"))
    assert.equal(0.5, options.flag.seconds(".5"))
  end)

  it("are whole numbers only up to what lua-cjson writes exactly", function()
    assert.equal(options.MAX_WHOLE, options.flag.whole_number(tostring(options.MAX_WHOLE)))
    assert.equal(0, options.flag.whole_number("0"))
    for _, text in ipairs{ tostring(options.MAX_WHOLE + 1), "1e300", "2.5", "-1" } do
      assert.is_nil(options.flag.whole_number(text), text)
    end
    -- The largest one crosses the wire as the digits it is.
    assert.equal('{"n":' .. options.MAX_WHOLE .. '}', require("sandkit.json").encode{ n = options.MAX_WHOLE })
    assert.is_nil(options.flag.whole_seconds("0"))
    assert.equal(65535, options.flag.port("65535"))
    assert.is_nil(options.flag.port("65536"))
  end)
end)
