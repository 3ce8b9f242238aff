--- A session on a fake agent, through the public API, with the short timeouts specs use.
local sandkit = require "sandkit"
local fake_http = require "support.fake_http"

local agent_session = {}

--- An error body's bound short enough that a stall is exercised in a fraction of a second. No
-- spec here crosses the header bound (protocol_cases' do), and its fakes answer at once: a
-- bound of 0.3 s would fail a prompt answer whenever a busy machine delays the fake that long.
agent_session.HEADER_TIMEOUT = 5
agent_session.ERROR_BODY_TIMEOUT = 0.3

--- Starts a fake agent whose non-health requests `route_source` (a Lua function expression
-- taking req, conn, respond) answers, and opens a session on it. `features` (a list) replaces
-- the extensions its health advertises.
function agent_session.open(route_source, options, features)
  local health = "nil"
  if features then
    local quoted = {}
    for i, name in ipairs(features) do quoted[i] = string.format("%q", name) end
    health = "{ features = { " .. table.concat(quoted, ", ") .. " } }"
  end
  local server = fake_http.start("local respond = require 'support.respond'\n"
    .. "return respond.agent(" .. route_source .. ", " .. health .. ")\n")
  local sb_options = { provider = "agent", url = server.url, token = "test-token",
    header_timeout = agent_session.HEADER_TIMEOUT,
    error_body_timeout = agent_session.ERROR_BODY_TIMEOUT, grace = 1 }
  for k, v in pairs(options or {}) do sb_options[k] = v end
  local sandbox = assert(sandkit.sandbox(sb_options))
  local session = assert(sandbox:create{ id = "s1" })
  return session, server
end

--- Every item a run loop yields: frames, then the error that ended it, if any.
function agent_session.collect(session, argv, opts)
  local items = {}
  local ok, err = pcall(function()
    for frame in session:run(argv or { "true" }, opts or { timeout = 10 }) do
      items[#items + 1] = frame
    end
  end)
  if not ok then items[#items + 1] = err end
  return items
end

return agent_session
