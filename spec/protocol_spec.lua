-- The agent protocol client over the libcurl transport: every case of
-- spec/support/protocol_cases.lua (fake agents sending exact bytes over real sockets) in this
-- process. spec/nginx_protocol_spec.lua runs the same table over cosockets inside nginx.

local protocol_cases = require "support.protocol_cases"

protocol_cases.declare({ describe = describe, it = it, after_each = after_each }, function(i, c, server)
  local session = protocol_cases.open(server.url, c.options)
  if c.between then c.between(server) end
  return protocol_cases.act(i, session)
end)
