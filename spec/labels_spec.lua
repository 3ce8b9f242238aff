-- Session labels: the one check of keys and values (Kubernetes' label rules, for every
-- provider), and labels kept and listed by on the local provider, against real sandkit-agents.

local sandkit = require "sandkit"
local options = require "sandkit.options"
local local_state = require "support.local_state"

local function refusal(labels)
  local value, err = options.labels("sandbox.create", { labels = labels }, "labels")
  assert.is_nil(value)
  assert.equal("INVALID_INPUT", err.code)
  assert.equal("labels", err.field)
  return err.message
end

describe("the label check", function()
  it("takes keys with and without a DNS-subdomain prefix, and values empty or of the same charset", function()
    local labels = { team = "ml", run = "42", ["example.com/owner"] = "a.b_c-d", empty = "",
      [("n"):rep(63)] = ("v"):rep(63), ["a.b-c.d/x"] = "Y", ["A_b.9"] = "0" }
    assert.same(labels, options.labels("sandbox.create", { labels = labels }, "labels"))
    assert.is_nil((options.labels("sandbox.create", {}, "labels")))
  end)

  it("refuses each bad key by name", function()
    for _, key in ipairs{ "", "-team", "team-", "te am", "tëam", ("n"):rep(64), "/name", "pre/",
        "Example.com/x", "a..b/x", "-a.com/x", "a/b/c", ("p"):rep(254) .. "/x", "x\0y" } do
      local message = refusal{ [key] = "v" }
      -- Quoted as given, a long one cut after 64 bytes.
      assert.matches(string.format("%q", key:sub(1, 64)):sub(1, -2), message, 1, true)
    end
    assert.matches("a label key is a string", refusal{ [1] = "v" })
  end)

  it("refuses a bad value, naming its key", function()
    for _, value in ipairs{ "-v", "v-", "a b", ("v"):rep(64), "x/y" } do
      assert.matches('"team"', refusal{ team = value }, 1, true)
    end
    assert.matches("team", refusal{ team = 42 })
    assert.matches("maps label keys", refusal("team=ml"))
  end)

  it("takes " .. options.MAX_LABELS .. " labels and refuses one more", function()
    local labels = {}
    for i = 1, options.MAX_LABELS do labels["k" .. i] = "v" end
    assert.is_not_nil(options.labels("sandbox.create", { labels = labels }, "labels"))
    labels.one_more = "v"
    assert.matches("at most " .. options.MAX_LABELS .. " labels", refusal(labels))
  end)
end)

describe("labels on the local provider", function()
  local root, sandbox
  before_each(function()
    root = local_state.new()
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root, isolate = "none" })
  end)
  after_each(function() local_state.clean(root) end)

  it("keeps a session's labels and lists only the sessions carrying every label asked for", function()
    assert.same({ team = "ml", run = "42" },
      assert(sandbox:create{ id = "ml-42", labels = { team = "ml", run = "42" } }).labels)
    assert(sandbox:create{ id = "ml-43", labels = { team = "ml", run = "43" } })
    assert(sandbox:create{ id = "web", labels = { team = "web" } })
    assert.same({}, assert(sandbox:create{ id = "bare" }).labels)
    local function ids(opts)
      local out = {}
      for _, s in ipairs(assert(sandbox:list(opts))) do out[#out + 1] = s.id end
      return out
    end
    assert.same({ "ml-42", "ml-43" }, ids{ labels = { team = "ml" } })
    assert.same({ "ml-43" }, ids{ labels = { team = "ml", run = "43" } })
    assert.same({}, ids{ labels = { team = "ml", run = "44" } })
    assert.same({ "bare", "ml-42", "ml-43", "web" }, ids())
    assert.same({ "bare", "ml-42", "ml-43", "web" }, ids{ labels = {} })
    local other = assert(sandkit.sandbox{ provider = "local", root = root, isolate = "none" })
    assert.same({ team = "web" }, assert(other:get("web")).labels)
  end)

  it("refuses bad labels on create and list before anything exists, naming the key", function()
    local session, err = sandbox:create{ id = "bad", labels = { ["bad key"] = "v" } }
    assert.is_nil(session)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches('"bad key"', err.message, 1, true)
    assert.is_nil(io.open(root .. "/sessions/bad/record.json"))
    local listed
    listed, err = sandbox:list{ labels = { team = "-x" } }
    assert.is_nil(listed)
    assert.equal("labels", err.field)
    listed, err = sandbox:list{ label = { team = "ml" } }
    assert.is_nil(listed)
    assert.matches("did you mean labels", err.message)
  end)
end)

describe("labels where the provider cannot keep them", function()
  it("are OPERATION_NOT_SUPPORTED on create, sending nothing", function()
    local agent = assert(sandkit.sandbox{ provider = "agent", url = "http://127.0.0.1:9", token = "x" })
    local session, err = agent:create{ labels = { team = "ml" } }
    assert.is_nil(session)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
  end)
end)
