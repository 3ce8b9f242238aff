--- The local end of a file transfer (session:write_file_from, session:read_file_to): a path,
-- a reader or a writer, as the functions the protocol's transfers take.
--
--   local src, err = localfile.source(path_or_reader, operation)
--     src.read() -> chunk | nil (the end) | nil, err;  src.length (bytes, or nil);  src.close()
--     src.file: for a path that can seek (a regular file), the open file read() reads, which a
--     transport may read itself instead (sandkit.http's body_file); nil otherwise
--   local dst, err = localfile.sink(path_or_writer, operation)
--     dst.write(bytes) -> true | nil, err;  dst.commit() -> true | nil, err;  dst.abort()
--     dst.file: for a path, the open file write() writes, which a transport may write itself
--     instead; nil otherwise
--
-- A source is a path (a regular file, or a pipe: `sandkit put <(tar c .) /x.tar` reads one on
-- purpose, bounded by the transfer's own deadlines), an object with :read(n) (io.stdin, any file
-- handle), or a function returning the next chunk. A sink is a path, an object with :write(bytes)
-- (io.stdout), or a function(bytes). A path sink is written beside its target, into a file made
-- new there (a link already at its name is refused, never followed), and renamed into place only
-- once every byte arrived, so a cut transfer never replaces a file.

local core = require "sandkit.core"
local errors = require "sandkit.errors"

local localfile = {}

--- Linux's errno for reading a directory as a file.
local EISDIR = 21

--- Bytes read from a local file per call: a quarter of the transfer's send buffer, so a feed
-- rarely leaves a remainder to copy.
localfile.CHUNK = 64 * 1024

--- Whether path names a directory. Looked at, not opened: opening and reading a probe would
-- take the first bytes of a pipe named as a path (`sandkit put <(tar c .) /x.tar`) from the
-- transfer that reads it next.
localfile.is_directory = core.is_directory

--- The bytes of a configuration or secret file a user or a config names — a kubeconfig, a
-- token file, a CA bundle, a client certificate or key, a signing key — at most `max` (the
-- caller's bound on what a file of its kind can be, read no further), or nil and why not:
-- "absent" or "unreadable", each with the sentence saying so, or "too_long". A FIFO, a socket, a
-- device or a directory is unreadable, named by its type, and refused before opening it could
-- block (core.read_regular): a FIFO named as a kubeconfig's token file would otherwise hang
-- every call past every deadline. Every such file sandkit reads is read here.
function localfile.read_config(path, max)
  local text, why, absent = core.read_regular(path, max)
  if not text then return nil, absent and "absent" or "unreadable", why end
  if #text > max then return nil, "too_long" end
  return text
end

--- The PEM text of a request's CA file (`ca_file`), at most the PEM text the transports take
-- in a request (core.LIMITS.MAX_PEM), or nil and why not, worded once for both transports.
function localfile.read_ca_file(path)
  local max = core.LIMITS.MAX_PEM
  local text, why, detail = localfile.read_config(path, max)
  if text then return text end
  if why == "too_long" then return nil, string.format("the request's CA file %s is over %d bytes", path, max) end
  return nil, "the request's CA file cannot be read: " .. detail
end

--- The secret (a token) a small file holds, without the whitespace around it, or nil and why
-- not: "unreadable" (and the sentence saying why: absent included), "too_long" (over `max`
-- bytes), "empty", or "inside" (spaces or control characters within it: a secret goes into a
-- header, where those would end it).
function localfile.read_secret(path, max)
  local text, why, detail = localfile.read_config(path, max)
  if not text then return nil, why == "absent" and "unreadable" or why, detail end
  text = text:match("^%s*(.-)%s*$")
  if text == "" then return nil, "empty" end
  if text:find("[%c ]") then return nil, "inside" end
  return text
end

local function refuse(operation, field, why)
  return nil, errors.invalid_input(operation, field, why)
end

function localfile.source(source, operation)
  local kind = type(source)
  if kind == "function" then
    return { read = source, close = function() end }
  end
  if kind ~= "string" then
    if (kind == "table" or kind == "userdata") and source.read then
      return { read = function() return source:read(localfile.CHUNK) end, close = function() end }
    end
    error("sandkit: a source is a path, an object with :read(n), or a function", 3)
  end
  local f, err = io.open(source, "rb")
  if not f then return refuse(operation, "source", tostring(err)) end
  -- A directory opens like a file on Linux and fails only when read: refused here, before
  -- anything is sent, rather than sent as nothing.
  local probe, perr, code = f:read(0)
  if probe == nil and perr ~= nil then
    f:close()
    if code == EISDIR then
      return refuse(operation, "source", source .. " is a directory: a transfer moves one file")
    end
    return refuse(operation, "source", source .. " cannot be read as a file: " .. tostring(perr))
  end
  local length = f:seek("end")
  f:seek("set")
  return {
    length = length,
    file = length and f,
    read = function()
      local chunk, rerr = f:read(localfile.CHUNK)
      if chunk then return chunk end
      return nil, rerr
    end,
    close = function() f:close() end,
  }
end

local function hex(bytes)
  return (bytes:gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

--- write(bytes) -> true | nil, err over an object with :write (a file handle returns itself).
local function writer_of(object)
  return function(bytes)
    local ok, err = object:write(bytes)
    if not ok then return nil, err end
    return true
  end
end

function localfile.sink(sink, operation)
  local kind = type(sink)
  if kind == "function" then
    return { write = sink, commit = function() return true end, abort = function() end }
  end
  if kind ~= "string" then
    if (kind == "table" or kind == "userdata") and sink.write then
      return { write = writer_of(sink), commit = function() return true end, abort = function() end }
    end
    error("sandkit: a destination is a path, an object with :write(bytes), or a function", 3)
  end
  -- Made new, never opened through a name that was already there: in a directory others may
  -- write to, a link planted at this name would otherwise take the bytes to its target.
  local partial = sink .. ".sandkit-" .. hex(core.random(4)) .. ".part"
  local f, err = core.create_new(partial)
  if not f then return refuse(operation, "destination", tostring(err)) end
  return {
    file = f,
    write = writer_of(f),
    commit = function()
      local closed, cerr = f:close()
      if not closed then
        os.remove(partial)
        return nil, cerr
      end
      local renamed, rerr = os.rename(partial, sink)
      if not renamed then
        os.remove(partial)
        return nil, rerr
      end
      return true
    end,
    abort = function()
      f:close()
      os.remove(partial)
    end,
  }
end

return localfile
