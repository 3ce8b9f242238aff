--- Whole lines out of an output stream: frames are chunks, cut wherever the command's writes
-- and the agent's reads fell, and this is what `session:run(argv, { lines = true })` puts
-- beneath its iterator.
--
--   local stream = lines.wrap(stream)   -- stream:next() -> frame | nil[, err]; stream:close()
--
-- Each stdout/stderr frame it returns carries exactly one line, its `data` ending in "\n", in
-- the order the lines were completed, with the seq of the frame that completed it. A stream's
-- unterminated last line comes just before the exit frame (when both streams have one, the one
-- begun first comes first), and before the error when the stream fails, so output that arrived
-- is never lost. A line
-- longer than MAX_LINE is handed on in MAX_LINE pieces: memory stays bounded whatever a
-- command writes.

local lines = {}

--- Bytes a partial line may hold per stream before it is handed on unfinished: long enough for
-- any line a person or a log reader means (minified JSON included), and a bound on memory.
lines.MAX_LINE = 1024 * 1024

local wrapper_mt = {}
wrapper_mt.__index = wrapper_mt

function lines.wrap(stream)
  return setmetatable({ stream = stream, partial = { stdout = {}, stderr = {} },
    partial_size = { stdout = 0, stderr = 0 }, queue = {}, head = 1, count = 0, done = false }, wrapper_mt)
end

--- The queue keeps its own count: taken slots are cleared, and `#` of a table with holes at
-- its start is any border under LuaJIT.
local function push(self, frame)
  self.count = self.count + 1
  self.queue[self.count] = frame
end

local function emit_partial(self, kind, seq)
  local parts = self.partial[kind]
  if #parts == 0 then return end
  push(self, { type = kind, seq = seq or parts.seq, data = table.concat(parts) })
  self.partial[kind] = {}
  self.partial_size[kind] = 0
end

--- Pushes text as frames of at most MAX_LINE bytes each.
local function emit(self, kind, seq, text)
  local max = lines.MAX_LINE
  for i = 1, #text, max do push(self, { type = kind, seq = seq, data = text:sub(i, i + max - 1) }) end
end

local function split(self, frame)
  local kind, data, max = frame.type, frame.data, lines.MAX_LINE
  local parts = self.partial[kind]
  local start = 1
  while true do
    local nl = data:find("\n", start, true)
    if not nl then break end
    parts[#parts + 1] = data:sub(start, nl)
    emit(self, kind, frame.seq, table.concat(parts))
    parts = {}
    self.partial_size[kind] = 0
    start = nl + 1
  end
  if start <= #data then
    if #parts == 0 then parts.seq = frame.seq end
    parts[#parts + 1] = data:sub(start)
    self.partial_size[kind] = self.partial_size[kind] + #data - start + 1
    if self.partial_size[kind] >= max then
      local text = table.concat(parts)
      local whole = #text - #text % max
      emit(self, kind, frame.seq, text:sub(1, whole))
      local rest = text:sub(whole + 1)
      parts = rest ~= "" and { rest, seq = frame.seq } or {}
      self.partial_size[kind] = #rest
    end
  end
  self.partial[kind] = parts
end

--- The unfinished lines, the one begun earlier first.
local function flush(self)
  local out, err = self.partial.stdout, self.partial.stderr
  if #err > 0 and (#out == 0 or err.seq < out.seq) then
    emit_partial(self, "stderr")
    emit_partial(self, "stdout")
  else
    emit_partial(self, "stdout")
    emit_partial(self, "stderr")
  end
end

--- The next line frame, the exit frame, nil once the stream ended, or nil and the stream's
-- error once every line before it was delivered.
function wrapper_mt:next()
  while true do
    if self.head <= self.count then
      local frame = self.queue[self.head]
      self.queue[self.head] = nil
      self.head = self.head + 1
      return frame
    end
    if self.done then return nil, self.failed end
    self.queue, self.head, self.count = {}, 1, 0
    local frame, err = self.stream:next()
    if not frame then
      flush(self)
      self.done, self.failed = true, err
    elseif frame.type == "exit" then
      flush(self)
      push(self, frame)
      self.done = true
    else
      split(self, frame)
    end
  end
end

function wrapper_mt:close()
  self.stream:close()
end
wrapper_mt.__close = wrapper_mt.close

return lines
