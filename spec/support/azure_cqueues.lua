--- Runs sandkit operations concurrently as cqueues coroutines in a spec. It registers a wait
-- scheduler (sandkit.wait) that yields to cqueues as sandkit's own does, and also records each
-- coroutine's current wait deadline, so a spec can tell where another operation is parked.

local cqueues = require "cqueues"
local core = require "sandkit.core"
local wait = require "sandkit.wait"

local azure_cqueues = {}

--- coroutine -> absolute deadline of the wait it is in (math.huge for none)
azure_cqueues.waiting = setmetatable({}, { __mode = "k" })

wait.register{
  name = "spec-cqueues",
  active = function() return cqueues.running() ~= nil end,
  wait = function(pollable, deadline)
    local co = coroutine.running()
    azure_cqueues.waiting[co] = deadline or math.huge
    local timeout = deadline and math.max(0, deadline - core.now()) or nil
    local ready = false
    if pollable then
      ready = cqueues.poll(pollable, timeout) == pollable
    else
      cqueues.sleep(timeout)
    end
    azure_cqueues.waiting[co] = nil
    return ready
  end,
}

--- Runs each function as a coroutine of one controller, to the end of all of them; raises
-- when they have not all ended within `timeout` seconds, so an operation that blocks another
-- fails the spec instead of hanging it.
function azure_cqueues.run(timeout, ...)
  local cq = cqueues.new()
  for _, fn in ipairs{ ... } do cq:wrap(fn) end
  local deadline = core.now() + timeout
  while not cq:empty() do
    local left = deadline - core.now()
    if left <= 0 then error(string.format("the operations did not all end within %gs", timeout), 2) end
    assert(cq:step(left))
  end
end

--- From inside a coroutine of any scheduler sandkit waits through: yields until predicate()
-- holds, or raises after `timeout` seconds.
function azure_cqueues.wait_for(predicate, timeout, what)
  local deadline = core.now() + timeout
  while not predicate() do
    if core.now() >= deadline then error("timed out waiting for " .. what, 2) end
    wait.sleep(0.005)
  end
end

return azure_cqueues
