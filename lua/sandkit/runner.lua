--- Many commands at once from one Lua state and one OS thread.
--
--   assert(sandkit.run(function()
--     local a = sandkit.spawn(function() return session_a:exec(argv, opts) end)
--     local b = sandkit.spawn(function() return session_b:exec(argv, opts) end)
--     print(a:join(), b:join())
--   end))
--
-- Tasks are coroutines. Inside a task every sandkit wait (a frame that has not arrived, a job
-- poll interval, a health wait) yields to the runner, which blocks in one poll(2) over every
-- distinct descriptor its tasks wait on — all HTTP transfers share one — and resumes only the
-- tasks with something to do: a transfer whose progress counter moved, a descriptor that became
-- ready, or a deadline that passed.
--
-- Errors never vanish: join() returns a task's failure as nil, err, and a failure nobody joined
-- makes run() return nil and that error once every task has ended.
--
-- A wait outside any task — or inside a coroutine of the caller's own within a task, which the
-- runner cannot yield across — blocks as it always did.
--
-- Inside an nginx worker the same calls map onto nginx's light threads: each task is an
-- ngx.thread, its waits park it on its own socket reads and timers (sandkit.wait), and join
-- waits on a semaphore the task posts when it ends, so any task of the run may join any other.

local core = require "sandkit.core"
local wait = require "sandkit.wait"

local runner = {}

-- LuaJIT (the 5.1 ABI) has neither in `table`; the fallbacks keep the door to it open.
local pack = table.pack or function(...) return { n = select("#", ...), ... } end
local unpack = table.unpack or rawget(_G, "unpack")

local WAIT, JOIN = {}, {}
local active -- the running runner; one at a time

local task_mt = {}
task_mt.__index = task_mt

local function new_task(r, fn, ...)
  local args = pack(...)
  local task = setmetatable({ runner = r, index = #r.tasks + 1, joiners = {} }, task_mt)
  task.co = coroutine.create(function() return fn(unpack(args, 1, args.n)) end)
  r.tasks[#r.tasks + 1] = task
  r.by_co[task.co] = task
  r.ready[#r.ready + 1] = task
  task.resume_with = pack()
  return task
end

local function finish(r, task, ok, ...)
  task.finished = true
  task.ok = ok
  if ok then task.results = pack(...) else task.err = ... end
  r.by_co[task.co] = nil
  r.live = r.live - 1
  for _, joiner in ipairs(task.joiners) do
    joiner.waiting = nil
    joiner.resume_with = pack()
    r.ready[#r.ready + 1] = joiner
  end
  task.joiners = {}
end

local function resume(r, task)
  local args = task.resume_with
  task.resume_with = nil
  local res = pack(coroutine.resume(task.co, unpack(args, 1, args.n)))
  if coroutine.status(task.co) == "dead" then
    return finish(r, task, unpack(res, 1, res.n))
  end
  if not res[1] then return finish(r, task, false, res[2]) end
  local kind = res[2]
  if kind == WAIT then
    local pollable, deadline = res[3], res[4]
    task.waiting = { pollable = pollable, deadline = deadline,
      mark = pollable and pollable.progress and pollable:progress() }
    r.waiters[#r.waiters + 1] = task
  elseif kind == JOIN then
    local target = res[3]
    task.waiting = { join = target }
    target.joiners[#target.joiners + 1] = task
  else
    -- A bare coroutine.yield inside a task has nowhere to go: it is a bug, reported as one.
    finish(r, task, false, "sandkit.run: a task yielded outside sandkit's waits")
  end
end

local function eligible(w, now, ready_fds)
  if w.deadline and now >= w.deadline then return true end
  local p = w.pollable
  if p == nil then return false end
  if w.mark ~= nil then return p:progress() ~= w.mark end
  return ready_fds[p:pollfd()] == true
end

--- Blocks until at least one waiting task can go on, then moves those to the ready queue.
local function wait_for_tasks(r)
  local now = core.now()
  local timeout, any = nil, false
  local list, seen_fd, steppers = {}, {}, {}
  for _, task in ipairs(r.waiters) do
    local w = task.waiting
    if eligible(w, now, {}) then any = true end
    if w.deadline then
      local left = w.deadline - now
      if not timeout or left < timeout then timeout = left end
    end
    local p = w.pollable
    if p then
      local fd = p:pollfd()
      if not seen_fd[fd] then
        seen_fd[fd] = true
        list[#list + 1] = p
        if p.step then steppers[#steppers + 1] = p end
        local t = p:timeout()
        if t and (not timeout or t < timeout) then timeout = t end
      end
    end
  end
  if #r.waiters == 0 then
    error("sandkit.run: every live task waits on another: a join cycle", 0)
  end
  if any then timeout = 0 end
  if timeout and timeout < 0 then timeout = 0 end
  local flags = core.poll(list, timeout)
  local ready_fds = {}
  for i, p in ipairs(list) do
    if flags[i] then ready_fds[p:pollfd()] = true end
  end
  -- One step per shared client moves every transfer behind it (and runs libcurl's timers).
  for _, p in ipairs(steppers) do p:step() end
  now = core.now()
  local still = {}
  for _, task in ipairs(r.waiters) do
    if eligible(task.waiting, now, ready_fds) then
      task.waiting = nil
      task.resume_with = pack(true)
      r.ready[#r.ready + 1] = task
    else
      still[#still + 1] = task
    end
  end
  r.waiters = still
end

local function loop(r)
  while r.live > 0 do
    while #r.ready > 0 do
      local queue = r.ready
      r.ready = {}
      for _, task in ipairs(queue) do resume(r, task) end
    end
    if r.live > 0 then wait_for_tasks(r) end
  end
end

--- What a run returns once every task ended: true followed by main's results, so
-- assert(sandkit.run(main)) holds whatever main returns; nil and the error when main failed, or
-- when a task nobody joined failed.
local function outcome(r, main)
  if not main.ok then return nil, main.err end
  for _, t in ipairs(r.tasks) do
    if not t.ok and not t.joined then return nil, t.err end
  end
  return true, unpack(main.results, 1, main.results.n)
end

-- nginx light threads -------------------------------------------------------------------------

--- The run each light thread belongs to; weak, so a thread nginx killed (the request ended)
-- leaves nothing behind.
local ngx_runs = setmetatable({}, { __mode = "k" })
--- A join's wait on the semaphore is re-armed after this many seconds; the semaphore's post is
-- what ends it.
local JOIN_SLICE = 60

local function ngx_finish(task, ok, ...)
  task.finished = true
  task.ok = ok
  if ok then task.results = pack(...) else task.err = ... end
  task.run.unfinished = task.run.unfinished - 1
  if task.waiters > 0 then task.done_signal:post(task.waiters) end
end

local function ngx_task(r)
  local semaphore = require "ngx.semaphore"
  local task = setmetatable({ runner = r, run = r, waiters = 0, done_signal = semaphore.new() }, task_mt)
  r.tasks[#r.tasks + 1] = task
  r.unfinished = r.unfinished + 1
  return task
end

local function ngx_body(task, fn, args)
  local co = coroutine.running()
  ngx_runs[co] = task
  ngx_finish(task, pcall(fn, unpack(args, 1, args.n)))
  ngx_runs[co] = nil
end

--- Waits on the task's semaphore; `quiet` is run's own wait for its tasks, which joins nothing
-- (and, main having ended, cannot be part of a cycle).
local function ngx_join(self, quiet)
  if not self.finished then
    local r = self.run
    if not quiet then
      local me = ngx_runs[coroutine.running()]
      if not me or me.run ~= r then error("join: only from a task of the same sandkit.run", 3) end
      if me == self then error("join: a task cannot join itself", 3) end
      -- When every unfinished task waits on another, none of them can ever go on.
      if r.joining + 1 >= r.unfinished then
        error("sandkit.run: every live task waits on another: a join cycle", 0)
      end
      r.joining = r.joining + 1
    end
    self.waiters = self.waiters + 1
    while not self.finished do self.done_signal:wait(JOIN_SLICE) end
    if not quiet then r.joining = r.joining - 1 end
  end
  if not quiet then self.joined = true end
  if not self.ok then return nil, self.err end
  return unpack(self.results, 1, self.results.n)
end

local function ngx_run(main, ...)
  local co = coroutine.running()
  if ngx_runs[co] then error("sandkit.run: a runner is already running", 3) end
  local r = { tasks = {}, unfinished = 0, joining = 0 }
  local task = ngx_task(r)
  ngx_runs[co] = task
  ngx_finish(task, pcall(main, ...))
  -- Every task ends before the run does, as outside nginx.
  for _, t in ipairs(r.tasks) do ngx_join(t, true) end
  ngx_runs[co] = nil
  return outcome(r, task)
end

local function ngx_spawn(fn, ...)
  local me = ngx_runs[coroutine.running()]
  if not me then error("sandkit.spawn: only inside sandkit.run", 3) end
  local task = ngx_task(me.run)
  ngx.thread.spawn(ngx_body, task, fn, pack(...))
  return task
end

local function in_nginx()
  return wait.ngx_phase() ~= nil and wait.check_nginx()
end

--- Runs main(...) as a task until it and every task it spawned end. Returns true followed by
-- main's results, so assert(sandkit.run(main)) holds whatever main returns; nil and the error
-- when main failed, or when a task nobody joined failed.
function runner.run(main, ...)
  if type(main) ~= "function" then error("sandkit.run takes a function", 2) end
  if in_nginx() then return ngx_run(main, ...) end
  if active then error("sandkit.run: a runner is already running", 2) end
  local r = { tasks = {}, by_co = {}, ready = {}, waiters = {}, live = 0 }
  active = r
  local task = new_task(r, main, ...)
  r.live = 1
  local ok, failure = pcall(loop, r)
  active = nil
  if not ok then error(failure, 0) end
  return outcome(r, task)
end

--- Starts fn(...) as a task of the running runner; returns its handle.
function runner.spawn(fn, ...)
  if type(fn) ~= "function" then error("sandkit.spawn takes a function", 2) end
  if in_nginx() then return ngx_spawn(fn, ...) end
  if not active then error("sandkit.spawn: only inside sandkit.run", 2) end
  active.live = active.live + 1
  return new_task(active, fn, ...)
end

--- Waits for the task to end and returns its results, or nil and its error.
function task_mt:join()
  if self.done_signal then return ngx_join(self) end
  local r = self.runner
  if not self.finished then
    local me = active and active.by_co[coroutine.running()]
    if not me or me.runner ~= r then error("join: only from a task of the same sandkit.run", 2) end
    if me == self then error("join: a task cannot join itself", 2) end
    coroutine.yield(JOIN, self)
  end
  self.joined = true
  if not self.ok then return nil, self.err end
  return unpack(self.results, 1, self.results.n)
end

--- Whether the task has ended (successfully or not).
function task_mt:done()
  return self.finished == true
end

wait.register{
  name = "sandkit.runner",
  active = function()
    return active ~= nil and active.by_co[coroutine.running()] ~= nil
  end,
  wait = function(pollable, deadline)
    return coroutine.yield(WAIT, pollable, deadline)
  end,
}

return runner
