-- sandkit.ngx.collector_floor inside a real nginx worker (LuaJIT's collector): after a cycle
-- that left a small live heap, the next waits for the floor's bytes; with a live heap over the
-- floor it keeps the pause it had; churning short strings it runs fewer cycles, the heap at
-- most the floor's bytes higher than without it; nil takes it away; anything but a whole number
-- of bytes is refused, and so is a Lua without newproxy.

local cjson = require "cjson"
local nginx = require "support.nginx"
local raw_http = require "support.raw_http"

local LOCATIONS = [[
    location = /floor { content_by_lua_block { require("support.nginx_app").collector_floor() } }
    location = /refused {
      content_by_lua_block {
        local sk_ngx = require "sandkit.ngx"
        local said = {}
        for _, bad in ipairs({ -1, 1.5, "4m", true }) do
          local ok, err = pcall(sk_ngx.collector_floor, bad)
          said[#said + 1] = ok and "accepted" or tostring(err)
        end
        ngx.say(table.concat(said, "\n"))
      }
    }
]]

local FLOOR = 4 * 1024 * 1024

describe("sandkit.ngx.collector_floor inside nginx", function()
  local gateway, seen
  setup(function()
    gateway = nginx.start{ server = LOCATIONS }
    local answer = assert(raw_http.request(gateway.port, "GET", "/floor?bytes=" .. FLOOR, { timeout = 60 }))
    assert.equal(200, answer.status, answer.body)
    seen = cjson.decode(answer.body)
  end)
  teardown(function() if gateway then gateway:stop() end end)

  it("makes the cycle after a small live heap wait until the floor's bytes were allocated", function()
    assert.is_true(seen.live < FLOOR / 2, "the worker's heap is small: " .. seen.live)
    local wanted = 100 * (seen.live + FLOOR) / seen.live
    -- The live heap was read a moment after the finalizer read it: within a percent.
    assert.is_true(math.abs(seen.pause - wanted) <= wanted / 100, seen.pause .. " against " .. wanted)
  end)

  it("keeps the pause it found once the live heap is larger than the floor", function()
    assert.is_true(seen.live_large > FLOOR, "the kept strings are over the floor: " .. seen.live_large)
    assert.equal(seen.base_pause, seen.pause_large)
  end)

  it("runs fewer cycles over churning strings, the heap at most the floor higher", function()
    local with, without = seen.with_floor, seen.without_floor
    assert.is_true(with.cycles < without.cycles, with.cycles .. " cycles against " .. without.cycles)
    assert.is_true(with.peak - seen.base <= without.peak - seen.base + FLOOR,
      string.format("peak %d over %d without the floor", with.peak - seen.base, without.peak - seen.base))
  end)

  it("is taken away by nil: the pause it found comes back", function()
    assert.equal(seen.base_pause, seen.pause_after_nil)
    assert.equal(seen.base_pause, seen.pause_after_cycle)
  end)

  it("refuses a Lua without newproxy, whose finalizers could not set the collector", function()
    -- busted's own Lua: 5.4 in make test (the worker above is always LuaJIT).
    if rawget(_G, "newproxy") then return pending("this Lua has newproxy") end
    local sk_ngx = require "sandkit.ngx"
    assert.error_matches(function() sk_ngx.collector_floor(FLOOR) end,
      "collector_floor: needs LuaJIT", nil, true)
  end)

  it("refuses anything but a whole number of bytes, as misuse", function()
    local answer = assert(raw_http.request(gateway.port, "GET", "/refused", { timeout = 30 }))
    assert.equal(200, answer.status)
    local lines = {}
    for line in answer.body:gmatch("[^\n]+") do lines[#lines + 1] = line end
    assert.equal(4, #lines)
    for _, line in ipairs(lines) do
      assert.truthy(line:find("collector_floor: bytes is a whole number of bytes, or nil", 1, true), line)
    end
  end)
end)
