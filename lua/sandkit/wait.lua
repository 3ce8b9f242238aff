--- How a waiting call waits. Every wait in sandkit comes here with a pollable (an object with
-- :pollfd(), :events() and :timeout(), or nil for a pure timer) and an absolute deadline on
-- the core.now() clock (or nil for none).
--
-- Outside any scheduler the wait blocks in core.wait (poll(2)). A scheduler — sandkit's own
-- runner, cqueues — registers itself here, and while one of its tasks is running the wait
-- goes through it instead, so the same objects work blocking, in a runner, or under cqueues.

local core = require "sandkit.core"

local wait = {}

local schedulers = {}

--- Adds a scheduler: { name =, active = function() -> bool, wait = function(pollable, deadline) }.
-- The most recently registered active one wins.
function wait.register(scheduler)
  for i = #schedulers, 1, -1 do
    if schedulers[i].name == scheduler.name then table.remove(schedulers, i) end
  end
  table.insert(schedulers, scheduler)
end

wait.now = core.now

--- Waits until pollable may have progress or the deadline passes. Returns true when the
-- pollable reported readiness (a hint, not a promise: callers re-check their own state).
function wait.ready(pollable, deadline)
  for i = #schedulers, 1, -1 do
    local s = schedulers[i]
    if s.active() then return s.wait(pollable, deadline) end
  end
  local timeout
  if deadline then
    timeout = deadline - core.now()
    if timeout < 0 then timeout = 0 end
  end
  return core.wait(pollable, timeout)
end

function wait.sleep(seconds)
  wait.ready(nil, core.now() + seconds)
end

-- Inside a coroutine a cqueues controller manages, waits go through cqueues.poll on the same
-- pollable, so sandkit's objects work under cqueues unchanged. cqueues is never loaded here:
-- it is used only once the caller has loaded it.
wait.register{
  name = "cqueues",
  active = function()
    local cqueues = package.loaded.cqueues
    if not cqueues then return false end
    local _, managed = cqueues.running()
    return managed == true
  end,
  wait = function(pollable, deadline)
    local cqueues = package.loaded.cqueues
    local timeout = deadline and math.max(0, deadline - core.now()) or nil
    if pollable == nil then
      cqueues.sleep(timeout)
      return false
    end
    if timeout then return cqueues.poll(pollable, timeout) == pollable end
    return cqueues.poll(pollable) == pollable
  end,
}

return wait
