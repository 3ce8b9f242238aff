-- core.json_unique: whether any object of a JSON text names a member twice, the check every JSON
-- answer of the agent passes before it is decoded.

local core = require "sandkit.core"

-- The reader's nesting bound, from the header that defines it: the spec crosses the real one.
local MAX_DEPTH = tonumber(assert(io.open("src/common/json.h")):read("*a"):match("#define SK_JSON_MAX_DEPTH (%d+)"))

--- The three results as one table, so a case compares them at once.
local function check(text)
  local unique, name, at = core.json_unique(text)
  return { unique = unique, name = name, at = at }
end

--- A result naming `name` twice, the later at the quote that starts at `needle`'s nth match.
local function repeated(text, name, needle, nth)
  local at = 0
  for _ = 1, nth do at = assert(text:find(needle, at + 1, true)) end
  return { unique = false, name = name, at = at - 1 }
end

describe("core.json_unique", function()
  it("passes a text whose objects each name their members once, in different objects the same", function()
    for _, text in ipairs{ '{}', '[]', '"t"', '0', 'null',
        '{"running":false,"frames":[{"t":"exit","code":0},{"t":"exit","code":1}],"exitCode":0}',
        '{"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}', ' {"t" : "x", "T" : "y", "t2": 1}\n' } do
      assert.same({ unique = true }, check(text), text)
    end
  end)

  it("finds a member named twice and says where the later naming is", function()
    local text = '{"t":"error","t":"exit","code":0}'
    assert.same(repeated(text, "t", '"t"', 2), check(text))
    text = '{"t":"exit","code":1,"code":0}'
    assert.same(repeated(text, "code", '"code"', 2), check(text))
  end)

  it("compares names by their values, however they are escaped", function()
    local text = '{"t":"exit","code":1,"\\u0063ode":0}'
    assert.same(repeated(text, "code", '"\\u0063ode"', 1), check(text))
    text = '{"a\\/b":1,"a/b":2}'
    assert.same(repeated(text, "a/b", '"a/b"', 1), check(text))
    -- A surrogate pair spells the same character as its UTF-8 bytes.
    text = '{"\\ud83d\\ude00":1,"\240\159\152\128":2}'
    assert.same(repeated(text, "\240\159\152\128", '"\240', 1), check(text))
    text = '{"\\u0074\\u0074":1,"tt":2}'
    assert.same(repeated(text, "tt", '"tt"', 1), check(text))
  end)

  it("keeps names that differ apart, a prefix or an escaped NUL included", function()
    for _, text in ipairs{ '{"a":1,"ab":2,"a\\u0000":3,"\\u00e9":4,"\\u00e8":5,"A":6}',
        '{"\\"":1,"\\\\":2,"\\n":3,"n":4,"":5,"\\u0000":6}' } do
      assert.same({ unique = true }, check(text), text)
    end
  end)

  it("finds a member named twice in an object nested in arrays and objects", function()
    local text = '{"running":false,"frames":[{"t":"stdout","seq":0,"data":""},{"t":"exit","code":1,"code":0}]}'
    assert.same(repeated(text, "code", '"code"', 2), check(text))
    text = '[[[{"x":{"y":1,"y":2}}]]]'
    assert.same(repeated(text, "y", '"y"', 2), check(text))
  end)

  it("finds a name repeated after a nested object closed in between", function()
    local text = '{"exitCode":1,"frames":[{"exitCode":5}],"exitCode":0}'
    assert.same(repeated(text, "exitCode", '"exitCode"', 3), check(text))
  end)

  it("checks an object of many members, and finds one repeat among them", function()
    local members = {}
    for i = 1, 100000 do members[i] = string.format('"m%d":%d', i, i) end
    local text = "{" .. table.concat(members, ",") .. "}"
    assert.same({ unique = true }, check(text))
    text = "{" .. table.concat(members, ",") .. ',"m77777":0}'
    assert.same(repeated(text, "m77777", '"m77777"', 2), check(text))
  end)

  it("reads as deep as the reader's nesting bound and refuses a text one level deeper", function()
    assert.equal(32, MAX_DEPTH, "src/common/json.h's bound")
    local text = string.rep("[", MAX_DEPTH - 1) .. '{"a":1,"a":2}' .. string.rep("]", MAX_DEPTH - 1)
    assert.same(repeated(text, "a", '"a"', 2), check(text))
    text = string.rep('{"a":', MAX_DEPTH) .. "1" .. string.rep("}", MAX_DEPTH)
    assert.same({ unique = true }, check(text))
    text = string.rep('{"a":', MAX_DEPTH + 1) .. "1" .. string.rep("}", MAX_DEPTH + 1)
    assert.same({ unique = nil, name = "nested too deeply", at = 5 * MAX_DEPTH }, check(text))
  end)

  it("refuses a million opening brackets at the bound, without reading them all", function()
    local text = string.rep("[", 1000000)
    assert.same({ unique = nil, name = "nested too deeply", at = MAX_DEPTH }, check(text))
  end)

  it("says why a text is not one JSON value, and where", function()
    assert.same({ unique = nil, name = "expected a value", at = 0 }, check(""))
    assert.same({ unique = nil, name = "trailing bytes after the value", at = 8 },
      check('{"a":1} {"a":2}'))
    assert.same({ unique = nil, name = "unterminated object or array", at = 15 },
      check('{"running":true'))
    assert.equal("lone high surrogate", check('{"\\ud83d":1}').name)
    assert.equal("expected a value", check('{"a":NaN}').name)
  end)
end)
