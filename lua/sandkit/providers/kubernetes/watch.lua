--- Reading a Kubernetes watch: a response body of JSON lines, one event per line
-- ({"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {…}}), read from the response's
-- transfer as it arrives. Only sandkit.http's interface is used (transfer:read(), :state() and
-- wait.ready), so the same reader works over every transport http.lua has.

local json = require "sandkit.json"
local wait = require "sandkit.wait"

local watch = {}

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

return watch
