-- The suite's own hygiene: rules a spec can break without any test of it failing.

local core = require "sandkit.core"

--- Each spec file's text, by path.
local function spec_files()
  local texts = {}
  for _, dir in ipairs{ "spec", "spec/support" } do
    for _, name in ipairs(assert(core.listdir(dir))) do
      if name:match("%.lua$") then
        local f = assert(io.open(dir .. "/" .. name))
        texts[dir .. "/" .. name] = f:read("a")
        f:close()
      end
    end
  end
  return texts
end

describe("the spec suite", function()
  it("gives busted's finally at most once a test, as busted runs only the last one given", function()
    local twice = {}
    for path, text in pairs(spec_files()) do
      local line = 0
      local test_line, calls
      for row in (text .. "\n"):gmatch("([^\n]*)\n") do
        line = line + 1
        -- A test, a describe or a function starts a new count.
        if row:match("^%s*it%(") or row:match("^%s*describe%(") or row:match("^%s*local function")
          or row:match("^%s*function") then
          test_line = row:match("^%s*it%(") and line or nil
          calls = 0
        end
        for _ in row:gmatch("%f[%w_]finally%(function") do
          calls = calls + 1
          if test_line and calls == 2 then twice[#twice + 1] = path .. ":" .. test_line end
        end
      end
    end
    table.sort(twice)
    assert.same({}, twice, "use support.cleanups for more than one cleanup")
  end)
end)
