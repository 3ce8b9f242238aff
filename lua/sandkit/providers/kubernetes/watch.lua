--- Kubernetes watches: reading one (a response body of JSON lines, one event per line,
-- {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {…}}, read from the response's
-- transfer as it arrives), and following one object through them, read then watched, as
-- Kubernetes clients do. Only sandkit.http's interface is used (transfer:read(), :state() and
-- wait.ready), so the same reader works over every transport http.lua has.

local json = require "sandkit.json"
local wait = require "sandkit.wait"

local watch = {}

--- A watch asks the server to end it by then, so a stream that went quiet is replaced before a
-- proxy in between drops it; the caller's deadline bounds it too.
watch.MAX_SECONDS = 290
--- Backoff after a watch that failed at once: from 0.1 s doubling to 2 s.
local FIRST_BACKOFF = 0.1
local MAX_BACKOFF = 2

--- The longest event line read: one object of the resources sandkit watches is a few
-- kilobytes, and Kubernetes stores no object over 1.5 MiB; a megabyte is far past any claim.
watch.MAX_LINE = 1024 * 1024

local reader_mt = {}
reader_mt.__index = reader_mt

--- A reader over resp (from http.send); it owns the response and closes it when the stream
-- ends, fails, or the reader is closed.
function watch.reader(resp, max_line)
  return setmetatable({ transfer = resp.transfer, resp = resp, buf = "", scanned = 0,
    max_line = max_line or watch.MAX_LINE }, reader_mt)
end

function reader_mt:close()
  if not self.closed then
    self.closed = true
    self.resp:close()
  end
end

local function finish(self, kind, detail)
  self:close()
  return nil, kind, detail
end

--- The next event as a table, or nil and why the stream stopped: "ended" (the body ended
-- cleanly), "failed" (the connection failed or the body was cut), "too_long" (a line past the
-- bound), "unparsable" (a line that is not a JSON object) or "timeout" (nothing whole by
-- the deadline, an absolute wait.now() time); and a detail.
function reader_mt:next(deadline)
  if self.closed then return nil, "ended" end
  local t = self.transfer
  while true do
    local nl = self.buf:find("\n", self.scanned + 1, true)
    if (nl or #self.buf + 1) - 1 > self.max_line then
      return finish(self, "too_long", string.format("a watch event is longer than %d bytes",
        self.max_line))
    elseif nl then
      local line = self.buf:sub(1, nl - 1)
      self.buf = self.buf:sub(nl + 1)
      self.scanned = 0
      if line:find("%S") then
        local event = json.decode(line)
        if type(event) ~= "table" then
          return finish(self, "unparsable", "a watch line is not a JSON object")
        end
        return event
      end
    else
      self.scanned = #self.buf
      local chunk = t:read()
      if chunk then
        self.buf = self.buf .. chunk
      elseif chunk == nil then
        local st = t:state()
        if st.ok and not self.buf:find("%S") then return finish(self, "ended") end
        return finish(self, "failed", st.ok and "the stream ended inside an event"
          or tostring(st.error))
      elseif deadline and wait.now() >= deadline then
        return finish(self, "timeout")
      else
        wait.ready(t, deadline)
      end
    end
  end
end

local function meta(obj)
  return type(obj) == "table" and type(obj.metadata) == "table" and obj.metadata or {}
end

local unpack = table.unpack or rawget(_G, "unpack")

--- A call's results as a list that keeps trailing nils.
local function pack(...)
  return { n = select("#", ...), ... }
end

--- The query of a watch on the object `name` from resource version `rv`, ending by `deadline`.
local function watch_query(name, rv, deadline)
  local seconds = math.max(1, math.min(watch.MAX_SECONDS, math.ceil(deadline - wait.now())))
  return { { "watch", "1" }, { "fieldSelector", "metadata.name=" .. name }, { "resourceVersion", rv or "0" },
    { "allowWatchBookmarks", "true" }, { "timeoutSeconds", tostring(seconds) } }
end

--- Follows one object until `judge` ends the wait, and returns what it ended with. The object
-- is judged as it was read, then at every change a watch reports; a watch that ends, fails, or
-- finds its resource version gone (410, as a status or an ERROR event) is replaced by a fresh
-- read and a watch from there — after a backoff when it failed rather than ended.
--   spec.object             the object as last read
--   spec.read()             -> object | nil (gone) | nil, err: a fresh GET
--   spec.open(query)        -> response | nil, err: a watch request with `query` (a list of
--                              { name, value } pairs selecting the object from its version)
--   spec.judge(object)      -> nil, seen [, recheck] (wait on; by `recheck`, a wait.now() time,
--                              judge the same object again even if nothing changed) |
--                              "again", seen (read again shortly: what changes next may not
--                              be the object) | "stop", ... (follow returns the rest); `seen`
--                              says what the object says of itself
--   spec.ended(why, seen)   -> the error for "timeout" (the deadline passed) or "deleted"
--   spec.seen               what the object said of itself when it was read
--   spec.deadline           absolute, wait.now()'s clock
-- A read or watch that fails for good (not retryable, not a 410) ends it with its error.
function watch.follow(spec)
  local object, deadline = spec.object, spec.deadline
  local name, rv = meta(object).name, meta(object).resourceVersion
  local seen, stream, quick, changed, recheck = spec.seen, nil, 0, true, nil
  local function close()
    if stream then stream:close() end
    stream = nil
  end
  --- Reads the object again after a watch stopped (after a backoff when `failed`): true, or
  -- nil and the error that ends the wait.
  local function reread(failed)
    close()
    if failed then
      quick = quick + 1
      wait.sleep(math.max(0, math.min(MAX_BACKOFF, FIRST_BACKOFF * 2 ^ (quick - 1), deadline - wait.now())))
    end
    local fresh, err = spec.read()
    if err then
      if not err.retryable then return nil, err end
      seen = err.message
      return true
    end
    if not fresh then return nil, spec.ended("deleted", seen) end
    object, rv, changed = fresh, meta(fresh).resourceVersion, true
    return true
  end
  while true do
    local ok, err = true, nil
    if wait.now() >= deadline then
      close()
      return nil, spec.ended("timeout", seen)
    end
    if changed then
      changed = false
      local verdict = pack(spec.judge(object))
      if verdict[1] == "stop" then
        close()
        return unpack(verdict, 2, verdict.n)
      end
      seen, recheck = verdict[2], verdict[3]
      if verdict[1] == "again" then ok, err = reread(true) end
    elseif recheck and wait.now() >= recheck then
      recheck, changed = nil, true
    elseif not stream then
      local resp
      resp, err = spec.open(watch_query(name, rv, deadline))
      if resp then
        stream = watch.reader(resp)
      elseif err.status ~= 410 and not err.retryable then
        ok = nil
      else
        ok, err = reread(err.status ~= 410)
      end
    else
      local event, kind, detail = stream:next(recheck and math.min(recheck, deadline) or deadline)
      local obj = event and type(event.object) == "table" and event.object or {}
      if not event then
        if kind == "timeout" then
          -- The reader is closed: a recheck watches again after judging.
          stream = nil
        else
          if kind ~= "ended" then seen = tostring(seen) .. " (the watch " .. kind .. ": " .. tostring(detail) .. ")" end
          ok, err = reread(kind ~= "ended")
        end
      elseif (event.type == "ADDED" or event.type == "MODIFIED") and meta(obj).name == name then
        object, rv, changed, quick = obj, meta(obj).resourceVersion, true, 0
      elseif event.type == "BOOKMARK" then
        rv = meta(obj).resourceVersion or rv
      elseif event.type == "DELETED" then
        ok, err = nil, spec.ended("deleted", seen)
      elseif event.type == "ERROR" then
        -- A 410 here means the resource version is gone: read afresh, no backoff.
        local gone = json.integer(obj.code) == 410
        if not gone then seen = "the watch failed: " .. tostring(obj.message) end
        ok, err = reread(not gone)
      end
    end
    if not ok then
      close()
      return nil, err
    end
  end
end

return watch
