--- A session's files as a filesystem, over the agent protocol's extensions fs, fsTar and
-- fsWatch (docs/protocol.md §6): listing, stat, removal and renaming; a directory as a tar
-- stream both ways; a watch's events. Written once over protocol.send, like the rest of the
-- protocol, so every transport and provider carries them alike.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local protocol = require "sandkit.protocol"

local encode = json.encode
local to_integer = json.integer
local read_json, query_escape = protocol.read_json, protocol.query_escape

local fs = {}

local LIST = "sandbox.listFiles"
local STAT = "sandbox.stat"
local REMOVE = "sandbox.remove"
local RENAME = "sandbox.rename"
local WRITE_DIR = "sandbox.writeDir"
local READ_DIR = "sandbox.readDir"
local WATCH = "sandbox.watch"

fs.OPERATIONS = { list = LIST, stat = STAT, remove = REMOVE, rename = RENAME, write_dir = WRITE_DIR,
  read_dir = READ_DIR, watch = WATCH }

--- The most entries the agent puts in one page of a listing (docs/protocol.md §6 fs).
fs.PAGE_MAX = 10000
--- A page's body: the agent ends a page once it passed 1 MiB, and an entry is at most ~50 KB.
local MAX_PAGE_BODY = 1024 * 1024 + 64 * 1024
--- A stat's answer is one entry.
local MAX_STAT_BODY = 64 * 1024
--- Removal and renaming answer 204.
local MAX_SMALL_BODY = 64 * 1024
--- Levels a listing may descend.
fs.DEPTH_MAX = 32

--- protocol.send, where an agent without the route (an older sandkit-agent, whose features a
-- session may not have read) is OPERATION_NOT_SUPPORTED: it did nothing, and never will.
local function send(conn, operation, method, path, body, max_body)
  local resp, err = protocol.send(conn, operation, method, path, body, max_body)
  if not resp and err.status == 404 and err.reason == "ROUTE_NOT_FOUND" then
    return nil, errors.not_supported(operation, "the session's agent has no route " .. path:match("^[^?]*")
      .. ": it does not offer docs/protocol.md §6's filesystem extensions (a newer sandkit-agent does)")
  end
  return resp, err
end

local function check_path(path, what)
  if type(path) ~= "string" then error("sandkit: " .. (what or "a path") .. " is a string", 3) end
end

local ENTRY_TYPES = { file = true, dir = true, symlink = true, other = true }

--- An entry of a listing or a stat as the API hands it out — the decoded table itself, its
-- numbers made integers, as a listing of ten thousand is not copied — or nil when the agent's
-- is not one.
local function entry_of(raw)
  if type(raw) ~= "table" or type(raw.name) ~= "string" or type(raw.path) ~= "string"
      or not ENTRY_TYPES[raw.type] or type(raw.mtime) ~= "number" then
    return nil
  end
  local size, mode = to_integer(raw.size), to_integer(raw.mode)
  if not size or size < 0 or not mode or mode < 0 then return nil end
  if raw.target ~= nil and type(raw.target) ~= "string" then return nil end
  raw.size, raw.mode = size, mode
  return raw
end

--- Every entry beneath path, `depth` levels down, at most `limit` of them, from after `cursor`:
-- pages of at most fs.PAGE_MAX entries, each read whole. The list's `next` is the cursor to
-- go on from when `limit` stopped it before the end.
function fs.list(conn, path, depth, limit, cursor)
  check_path(path)
  local entries = {}
  while true do
    local want = math.min(fs.PAGE_MAX, limit - #entries)
    local target = "/v1/fs/list?path=" .. query_escape(path) .. "&depth=" .. depth .. "&limit=" .. want
    if cursor then target = target .. "&cursor=" .. query_escape(cursor) end
    local resp, err = send(conn, LIST, "GET", target, nil, MAX_PAGE_BODY)
    if not resp then return nil, err end
    local text
    text, err = protocol.read_text(conn, resp, LIST, "the listing's page could not be read", MAX_PAGE_BODY)
    if not text then return nil, err end
    -- Read in C, by the rules of every JSON answer: a page can hold ten thousand entries.
    local page, why, at = core.list_page(text)
    if not page then
      return nil, errors.unexpected(LIST, "page", string.format("%s (at byte %d)", why, at))
    end
    local after = page.next
    -- The first page is the list itself (a listing of one page, the usual one, is not copied).
    if #entries == 0 then
      entries, page.next = page, nil
    else
      local n = #entries
      for i = 1, #page do entries[n + i] = page[i] end
    end
    -- A cursor that does not move would page for ever.
    if after and after == cursor and #page == 0 then
      return nil, errors.unexpected(LIST, "next", "the cursor did not move")
    end
    if #entries > limit then
      return nil, errors.unexpected(LIST, "entries", "a page held more entries than were asked for")
    end
    cursor = after
    if not cursor then return entries end
    if #entries == limit then
      entries.next = cursor
      return entries
    end
  end
end

--- The entry at path, or nil (and no error) when nothing is there.
function fs.stat(conn, path)
  check_path(path)
  local resp, err = send(conn, STAT, "GET", "/v1/fs/stat?path=" .. query_escape(path), nil, MAX_STAT_BODY)
  if not resp then return nil, err end
  local value
  value, err = read_json(conn, resp, STAT, "the stat's answer could not be read", MAX_STAT_BODY)
  if not value then return nil, err end
  if value.exists == false then return nil end
  local entry = value.exists == true and entry_of(value.entry)
  if not entry then
    return nil, errors.unexpected(STAT, "entry", "neither an entry nor exists = false")
  end
  return entry
end

local function post(conn, operation, path, body)
  local resp, err = send(conn, operation, "POST", path, encode(body), MAX_SMALL_BODY)
  if not resp then return nil, err end
  resp:close()
  return true
end

--- Removes path (a tree when recursive); what is absent is removed already.
function fs.remove(conn, path, recursive)
  check_path(path)
  return post(conn, REMOVE, "/v1/fs/remove", { path = path, recursive = recursive == true })
end

--- Renames from to `to`; what is at `to` is replaced only when overwrite.
function fs.rename(conn, from, to, overwrite)
  check_path(from)
  check_path(to)
  return post(conn, RENAME, "/v1/fs/rename", { from = from, to = to, overwrite = overwrite == true })
end

-- Directories as tar streams (fsTar) ------------------------------------------------------------

local function tar_target(path, max_entries, max_bytes)
  return string.format("/v1/fs/tar?path=%s&maxEntries=%d&maxBytes=%d", query_escape(path),
    max_entries, max_bytes)
end

--- Sends the archive read() gives (chunks, nil at the end, or nil and an error) into the
-- directory path of the session, which the agent extracts as it arrives within the bounds.
-- Returns the bytes sent, or nil and an error.
function fs.write_dir(conn, path, read, progress, max_entries, max_bytes)
  check_path(path)
  local sent = 0
  local resp, err = send(conn, WRITE_DIR, "PUT", tar_target(path, max_entries, max_bytes), {
    reader = read, content_type = "application/x-tar", what = "the directory to send",
    on_body = function(n)
      sent = n
      if progress then progress(n, nil) end
    end,
  }, MAX_SMALL_BODY)
  if not resp then
    err.path = path
    return nil, err
  end
  resp:close()
  return sent
end

--- What each kind of extraction failure is to a caller of read_dir_to: an archive from the
-- session that the rules refuse is an answer this client does not take; what the local
-- filesystem refused is the caller's destination.
local ARCHIVE_REASONS = { refused = "ARCHIVE_REFUSED", invalid = "ARCHIVE_INVALID",
  too_large = "ARCHIVE_TOO_LARGE" }

local function extraction_error(kind, why, entry)
  local reason = ARCHIVE_REASONS[kind]
  if reason then
    return errors.unexpected(READ_DIR, "archive", why, { reason = reason, entry = entry ~= "" and entry or nil })
  end
  return errors.invalid_input(READ_DIR, "destination", "the local directory could not take the archive: "
    .. tostring(why))
end

--- Reads the archive of the session's directory path into `sink` as it arrives: an extraction
-- (sandkit.tar's unpack), or a function(bytes) taking the archive itself (a false or nil-and-error
-- result stops it). Returns the bytes read, or nil and an error.
function fs.read_dir(conn, path, sink, progress)
  check_path(path)
  local resp, err = send(conn, READ_DIR, "GET", "/v1/fs/tar?path=" .. query_escape(path), nil, nil)
  if not resp then return nil, err end
  if type(sink) == "function" then
    return protocol.read_body_into(conn, READ_DIR, resp, sink, progress, "the archive's bytes")
  end
  local failure
  local done
  done, err = protocol.read_body_into(conn, READ_DIR, resp, function(chunk)
    local ok, kind, why, entry = sink:write(chunk)
    if ok then return true end
    failure = { kind, why, entry }
    return false
  end, progress, "the archive's bytes")
  if failure then return nil, extraction_error(failure[1], failure[2], failure[3]) end
  if not done then return nil, err end
  local ok, kind, why, entry = sink:finish()
  if not ok then return nil, extraction_error(kind, why, entry) end
  return done
end

-- Watches (fsWatch) ------------------------------------------------------------------------------

local watch_mt = {}
watch_mt.__index = watch_mt

local frame_reader = protocol.frame_reader
watch_mt.close = frame_reader.close
watch_mt.__close = frame_reader.close
watch_mt.__gc = frame_reader.close

local WATCH_WORDS = {
  late = "no end frame arrived within %gs of the watch's timeout",
  undecodable = { "an event frame could not be read", "frame" },
  unparsable = { "an event frame could not be read", "frame" },
  ended = "the watch's stream ended without its end frame",
  failed = "the watch's stream failed: ",
}

--- The next event ({ type = "create"|"modify"|"remove"|"rename"|"overflow", path =, from = }),
-- nil once the watch ended (self.reason says why: "timeout", "removed", "moved"), or nil and an
-- error; after either, the same for ever.
function watch_mt:next()
  if self.finished then return nil, self.failed end
  local frame, err = frame_reader.pull(self, true, WATCH, WATCH_WORDS)
  if not frame then return nil, err end
  if frame.type == "end" then
    self.reason = frame.reason
    self:close()
    return nil
  elseif frame.type == "error" then
    return frame_reader.fail(self, protocol.command_error(frame.code, frame.message, { operation = WATCH }))
  end
  return { type = frame.event, path = frame.path, from = frame.from }
end

--- Starts watching path for `timeout` seconds (timeout_ms as the wire says it). Returns the
-- stream of events once the agent's headers arrived.
function fs.watch(conn, path, recursive, timeout, timeout_ms)
  check_path(path)
  local started = core.now()
  local body = { path = path, recursive = recursive == true, timeoutMs = timeout_ms }
  -- A quiet watch is a silent connection, which proxies cut as they cut a quiet command's.
  local keepalive = protocol.wants_keepalive(conn)
  if keepalive then body.keepaliveMs = to_integer(math.floor(conn.keepalive * 1000)) end
  local resp, err = send(conn, WATCH, "POST", "/v1/fs/watch", encode(body))
  if not resp then return nil, err end
  local decoder = core.decoder()
  decoder:expect("event", "end", "error")
  if keepalive then decoder:admit("keepalive") end
  return setmetatable({
    transfer = resp.transfer,
    decoder = decoder,
    -- The agent ends the stream at the timeout; past it and a grace, the client gives up.
    deadline = started + timeout + conn.grace,
    grace = conn.grace,
    finished = false,
  }, watch_mt)
end

return fs
