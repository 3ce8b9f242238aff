--- A recording fake of the Azure data-plane object (docs/azure.md) for azure provider specs.
-- Every call of every method is recorded and counted; a method answers only through a handler
-- the spec installed, and an expectation ("exactly n times", 0 meaning never) fails the spec
-- at the first call too many and again in verify() for calls too few.
--
--   local dp = azure_dataplane.new()
--   dp:on("get_sandbox", function(n, group, id) return azure_dataplane.record(id) end)
--   dp:expect("agent_port_url", 1)      -- exactly once
--   dp:expect("execute_shell_command", 0)  -- never
--   …
--   dp:verify()

local core = require "sandkit.core"
local compat = require "support.compat"
local azure = require "sandkit.providers.azure"

local azure_dataplane = {}

azure_dataplane.METHODS = { "get_sandbox", "create_sandbox", "delete_sandbox", "stop_sandbox",
  "resume_sandbox", "agent_port_url", "read_file", "write_file", "mkdir", "execute_shell_command" }

azure_dataplane.AGENT_LABELS = { [azure.TRANSPORT_LABEL] = azure.TRANSPORT_VERSION }

--- A per-boot credential: 32 bytes of value n, as the agent's token file holds it.
function azure_dataplane.token(n)
  return core.b64encode(string.rep(string.char(n), 32))
end

--- A sandbox record as the data plane reports it: Running, agent-labelled and enforcing the
-- default (deny) egress unless fields say otherwise.
function azure_dataplane.record(id, fields)
  fields = fields or {}
  local labels = fields.labels
  if labels == nil then labels = azure_dataplane.AGENT_LABELS end
  return { id = id, state = fields.state or "Running", labels = labels,
    egress_policy = fields.egress_policy or azure.egress_policy(fields.egress) }
end

local fake_mt = {}
fake_mt.__index = fake_mt

function azure_dataplane.new()
  local fake = setmetatable({ handlers = {}, expected = {}, log = {}, overdue = {} }, fake_mt)
  for _, method in ipairs(azure_dataplane.METHODS) do
    fake.log[method] = {}
    fake[method] = function(self, ...)
      local calls = self.log[method]
      calls[#calls + 1] = compat.pack(...)
      local n = #calls
      local limit = self.expected[method]
      if limit and n > limit then
        local text = string.format("%s called %d times, expected %d", method, n, limit)
        self.overdue[#self.overdue + 1] = text
        error(text, 2)
      end
      local handler = self.handlers[method]
      if not handler then error("the fake data plane has no answer for " .. method, 2) end
      return handler(n, ...)
    end
  end
  return fake
end

--- handler(n, …arguments) answers the n-th call.
function fake_mt:on(method, handler)
  assert(self.log[method], "not a data-plane method: " .. method)
  self.handlers[method] = handler
  return self
end

function fake_mt:expect(method, times)
  assert(self.log[method], "not a data-plane method: " .. method)
  self.expected[method] = times
  return self
end

function fake_mt:count(method)
  return #self.log[method]
end

--- The arguments of the n-th call (a packed table).
function fake_mt:call(method, n)
  return self.log[method][n]
end

--- Raises unless every expectation held.
function fake_mt:verify()
  local problems = {}
  for _, text in ipairs(self.overdue) do problems[#problems + 1] = text end
  for method, times in pairs(self.expected) do
    local n = #self.log[method]
    if n < times then
      problems[#problems + 1] = string.format("%s called %d times, expected %d", method, n, times)
    end
  end
  if #problems > 0 then
    table.sort(problems)
    error("data-plane expectations failed: " .. table.concat(problems, "; "), 2)
  end
  return true
end

return azure_dataplane
