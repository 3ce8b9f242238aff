--- How a waiting call waits. Every wait in sandkit comes here with a pollable (an object with
-- :pollfd(), :events() and :timeout(), or nil for a pure timer) and an absolute deadline on
-- the core.now() clock (or nil for none).
--
-- Outside any scheduler the wait blocks in core.wait (poll(2)). A scheduler — sandkit's own
-- runner, cqueues, nginx — registers itself here, and while one of its tasks is running the
-- wait goes through it instead, so the same objects work blocking, in a runner, under cqueues
-- or inside an nginx worker.

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
-- Inside nginx a wait must never block the worker: it parks the request's light thread instead.
-- A cosocket transfer waits on its own socket read (its `await`); a pure timer is ngx.sleep;
-- any other pollable (a child's ready pipe, which nginx does not watch) is asked without
-- blocking between short sleeps. In a phase that cannot yield there is no way to wait at all,
-- and the wait refuses rather than block.

--- Phases where a light thread can yield to nginx (cosockets and ngx.sleep are available).
local YIELDING_PHASES = { rewrite = true, access = true, content = true, timer = true,
  ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true, preread = true }
--- Sleep between two looks at a descriptor nginx does not watch: first 1 ms (a child's ready
-- line comes within milliseconds), doubling up to 50 ms, which bounds the added latency.
local FIRST_LOOK, LAST_LOOK = 0.001, 0.05

--- The nginx phase this code runs in, or nil outside nginx.
function wait.ngx_phase()
  local ngx = rawget(_G, "ngx")
  if type(ngx) ~= "table" or type(ngx.get_phase) ~= "function" then return nil end
  return ngx.get_phase()
end

--- Inside nginx, raises unless the running phase can wait without blocking the worker; a
-- caller about to start something it must then wait for (a child process, a request) checks
-- first, so a refusal leaves nothing behind. Returns whether this is nginx.
function wait.check_nginx()
  local phase = wait.ngx_phase()
  if phase == nil then return false end
  if not YIELDING_PHASES[phase] then
    error("sandkit: cannot wait in nginx's " .. phase .. " phase (" .. phase
      .. "_by_lua*): nginx offers no cosockets or ngx.sleep there and sandkit never blocks "
      .. "a worker; call it from a rewrite, access or content handler, or a timer (ngx.timer.at)", 0)
  end
  return true
end

wait.register{
  name = "ngx",
  active = function() return wait.ngx_phase() ~= nil end,
  wait = function(pollable, deadline)
    wait.check_nginx()
    local ngx = rawget(_G, "ngx")
    if pollable == nil then
      ngx.sleep(deadline and math.max(0, deadline - core.now()) or 0)
      return false
    end
    if pollable.await then return pollable:await(deadline) end
    local pause = FIRST_LOOK
    while true do
      if core.wait(pollable, 0) then return true end
      local left = deadline and deadline - core.now()
      if left and left <= 0 then return false end
      ngx.sleep(left and math.min(pause, left) or pause)
      pause = math.min(pause * 2, LAST_LOOK)
    end
  end,
}

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
