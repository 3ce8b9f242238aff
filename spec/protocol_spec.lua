-- The agent protocol client over the libcurl transport: every case of
-- spec/support/protocol_cases.lua (fake agents sending exact bytes over real sockets) in this
-- process. spec/nginx_protocol_spec.lua runs the same table over cosockets inside nginx.

local fake_http = require "support.fake_http"
local protocol_cases = require "support.protocol_cases"

--- A fake agent whose non-health requests the case's route answers.
local function fake_agent(route)
  return fake_http.start("local respond = require 'support.respond'\n"
    .. "return respond.agent(" .. route .. ")\n")
end

local groups, order = {}, {}
for i, c in ipairs(protocol_cases.cases) do
  if not groups[c.group] then
    groups[c.group] = {}
    order[#order + 1] = c.group
  end
  table.insert(groups[c.group], i)
end

for _, name in ipairs(order) do
  describe(name, function()
    local server
    after_each(function()
      if server then server:stop() end
      server = nil
    end)
    for _, i in ipairs(groups[name]) do
      local c = protocol_cases.cases[i]
      it(c.name, function()
        server = fake_agent(c.route)
        local session = protocol_cases.open(server.url, c.options)
        if c.between then c.between(server) end
        c.check(protocol_cases.result(protocol_cases.act(i, session)), server)
      end)
    end
  end)
end
