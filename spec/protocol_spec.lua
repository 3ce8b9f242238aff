-- The agent protocol client over the libcurl transport: every case of
-- spec/support/protocol_cases.lua (fake agents sending exact bytes over real sockets) in this
-- process. spec/nginx_protocol_spec.lua runs the same table over cosockets inside nginx.

local protocol_cases = require "support.protocol_cases"

for _, group in ipairs(protocol_cases.groups()) do
  describe(group.name, function()
    local server
    after_each(function()
      if server then server:stop() end
      server = nil
    end)
    for _, i in ipairs(group.indexes) do
      local c = protocol_cases.cases[i]
      it(c.name, function()
        server = protocol_cases.fake_agent(c.route)
        local session = protocol_cases.open(server.url, c.options)
        if c.between then c.between(server) end
        c.check(protocol_cases.result(protocol_cases.act(i, session)), server)
      end)
    end
  end)
end
