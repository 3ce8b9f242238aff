-- The suite's own hygiene: rules a spec can break without any test of it failing.

local core = require "sandkit.core"
local files = require "support.files"

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

  it("removes every spec file's temporary names when busted ends, however many files it ran", function()
    local dir = files.temp_dir()
    local record = dir .. "/made"
    -- Two spec files in one busted run, each making a temporary name and saying which.
    for _, name in ipairs{ "first", "second" } do
      files.write(dir .. "/" .. name .. "_spec.lua", string.format([[
        local files = require "support.files"
        it("makes a temporary name", function()
          local path = files.temp_name(".%s")
          files.write(path, "x")
          local f = assert(io.open(%q, "a"))
          f:write(path, "\n")
          f:close()
        end)
      ]], name, record))
    end
    local lua = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
    local cpath = os.getenv("SANDKIT_TEST_CPATH") or "build/lua5.4/?.so"
    assert(files.execute("busted --lua=" .. files.shell_quote(lua) .. " --cpath=" .. files.shell_quote(cpath)
      .. " " .. files.shell_quote(dir .. "/first_spec.lua") .. " " .. files.shell_quote(dir .. "/second_spec.lua")
      .. " > /dev/null 2>&1"))
    local made = {}
    for path in assert(io.open(record)):lines() do made[#made + 1] = path end
    assert.equal(2, #made)
    for _, path in ipairs(made) do assert.is_nil(io.open(path), path .. " outlived its busted run") end
  end)
end)
