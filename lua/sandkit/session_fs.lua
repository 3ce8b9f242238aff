--- A session's files as a filesystem: session:list, stat, remove, rename, write_dir_from,
-- read_dir_to and watch (README, "Files as a filesystem"), over sandkit.protocol_fs. Each
-- checks the session's capability (`fs`, or `watch`), its options, and that the session's agent
-- offers the extension, before anything is sent.

local core = require "sandkit.core"

--- The C module of tar streams, loaded by the first call that moves a tree: it links
-- libarchive, whose libraries no other call needs to pay the loading of.
local function tar() return require "sandkit.tar" end
local errors = require "sandkit.errors"
local localfile = require "sandkit.localfile"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local protocol_fs = require "sandkit.protocol_fs"

local session_fs = {}

local OPS = protocol_fs.OPERATIONS

--- Which capability and extension each method needs (sandbox.lua's NEEDS holds the
-- capabilities; the extension is the agent's, docs/protocol.md §6).
session_fs.NEEDS = {
  list_files = { "fs", OPS.list }, stat = { "fs", OPS.stat }, remove = { "fs", OPS.remove },
  rename = { "fs", OPS.rename }, write_dir_from = { "fs", OPS.write_dir },
  read_dir_to = { "fs", OPS.read_dir }, watch = { "watch", OPS.watch },
}
local EXTENSION = { list_files = "fs", stat = "fs", remove = "fs", rename = "fs",
  write_dir_from = "fsTar", read_dir_to = "fsTar", watch = "fsWatch" }

--- Entries session:list returns unless told otherwise: far past a project's directory, and a
-- bound on what one call holds (a longer listing goes on from `next`).
local DEFAULT_LIST_LIMIT = 100000

local OPTIONS = {
  list_files = options_check.set{ "depth", "limit", "cursor" },
  remove = options_check.set{ "recursive" },
  rename = options_check.set{ "overwrite" },
  write_dir_from = options_check.set{ "progress", "max_entries", "max_bytes" },
  read_dir_to = options_check.set{ "progress", "max_entries", "max_bytes" },
  watch = options_check.set{ "recursive", "timeout" },
}

--- A whole-number option within [min, max], or its default.
local function bounded(operation, opts, name, default, min, max)
  local v, err = options_check.whole_number(operation, opts, name, default)
  if not v then return nil, err end
  if v < min or v > max then
    return nil, errors.invalid_input(operation, name, string.format("%s is from %d to %d", name, min, max))
  end
  return v
end

local function check_flag(opts, name)
  if opts[name] ~= nil and type(opts[name]) ~= "boolean" then
    error("sandkit: " .. name .. " is a boolean", 4)
  end
end

--- Installs the methods on the session metatable; `h` is sandbox.lua's: gate(session, what),
-- connection(session), ended(session, …) (a call's results, its error read for the end of the
-- session's lifetime) and ending_stream(session, stream) (the same for a stream's failures).
function session_fs.install(session_mt, h)
  --- The options (a table), the connection; or nil and the refusal.
  local function start(session, what, opts)
    if opts ~= nil and type(opts) ~= "table" then error("sandkit: options are a table", 3) end
    local operation = session_fs.NEEDS[what][2]
    local refusal = h.gate(session, what) or (OPTIONS[what] and options_check.check(operation, opts, OPTIONS[what]))
    if refusal then return nil, refusal end
    local conn, err = h.connection(session)
    if not conn then return nil, err end
    -- Features the session has read are the agent's word; a session that never read them
    -- (reached by id without a health check) asks, and an agent without the route says so.
    local extension, features = EXTENSION[what], conn.features
    if conn.ops or (features and next(features) ~= nil and not features[extension]) then
      return nil, errors.not_supported(operation, "this session's agent does not offer the "
        .. extension .. " extension (docs/protocol.md §6); a newer sandkit-agent does")
    end
    return opts or {}, conn
  end

  --- { { name =, path =, type =, size =, mode =, mtime =, target = }, … }: path's entries, and
  -- theirs down to `depth` levels (default 1), in name order, each directory's entries after
  -- it. At most `limit` (default 100000); when more remain, the list's `next` is the cursor a
  -- call with { cursor = next } goes on from.
  function session_mt:list(path, opts)
    local o, conn = start(self, "list_files", opts)
    if not o then return nil, conn end
    local depth, err = bounded(OPS.list, o, "depth", 1, 1, protocol_fs.DEPTH_MAX)
    if not depth then return nil, err end
    local limit
    limit, err = bounded(OPS.list, o, "limit", DEFAULT_LIST_LIMIT, 1, options_check.MAX_WHOLE)
    if not limit then return nil, err end
    if o.cursor ~= nil and type(o.cursor) ~= "string" then error("sandkit: cursor is a string", 2) end
    return h.ended(self, protocol_fs.list(conn, path, depth, limit, o.cursor))
  end

  --- The entry at path (as list gives them), nil (and no error) when nothing is there, or nil
  -- and an error.
  function session_mt:stat(path)
    local o, conn = start(self, "stat", nil)
    if not o then return nil, conn end
    return h.ended(self, protocol_fs.stat(conn, path))
  end

  --- Removes a file, a symbolic link (never what it names) or an empty directory; a directory
  -- and all it holds with { recursive = true }. An absent path is removed already.
  function session_mt:remove(path, opts)
    local o, conn = start(self, "remove", opts)
    if not o then return nil, conn end
    check_flag(o, "recursive")
    return h.ended(self, protocol_fs.remove(conn, path, o.recursive))
  end

  --- Renames within the session, making the new name's directories; something at `to` is
  -- replaced only with { overwrite = true }.
  function session_mt:rename(from, to, opts)
    local o, conn = start(self, "rename", opts)
    if not o then return nil, conn end
    check_flag(o, "overwrite")
    return h.ended(self, protocol_fs.rename(conn, from, to, o.overwrite))
  end

  local function transfer_options(operation, o)
    if o.progress ~= nil and type(o.progress) ~= "function" then
      error("sandkit: progress is a function(done, total)", 4)
    end
    local max_entries, err = bounded(operation, o, "max_entries", tar().MAX_ENTRIES, 1, tar().MAX_ENTRIES)
    if not max_entries then return nil, err end
    local max_bytes
    max_bytes, err = bounded(operation, o, "max_bytes", tar().MAX_BYTES, 0, tar().MAX_BYTES)
    if not max_bytes then return nil, err end
    return max_entries, max_bytes
  end

  --- Copies a local directory into the session's directory `remote` (made when absent;
  -- refused when something else is there) as one tar stream, extracted as it arrives. `source`
  -- is the local directory's path, or a tar archive's bytes: an object with :read(n)
  -- (io.stdin) or a function returning the next chunk. opts.progress(done) hears the bytes
  -- sent; max_entries and max_bytes lower the agent's bounds. Returns the bytes sent, or nil
  -- and an error.
  function session_mt:write_dir_from(remote, source, opts)
    if type(remote) ~= "string" then error("sandkit: write_dir_from takes the session's directory", 2) end
    local o, conn = start(self, "write_dir_from", opts)
    if not o then return nil, conn end
    local max_entries, max_bytes = transfer_options(OPS.write_dir, o)
    if not max_entries then return nil, max_bytes end
    local read, close
    if type(source) == "string" then
      local pack, why = tar().pack(source)
      if not pack then
        return nil, errors.invalid_input(OPS.write_dir, "source", "the local directory cannot be read: "
          .. tostring(why))
      end
      read, close = function() return pack:read() end, function() pack:close() end
    else
      local src = localfile.source(source, OPS.write_dir)
      read, close = src.read, src.close
    end
    local sent, err = protocol_fs.write_dir(conn, remote, read, o.progress, max_entries, max_bytes)
    close()
    return h.ended(self, sent, err)
  end

  --- Copies the session's directory `remote` out as one tar stream. `sink` is a local
  -- directory's path (made when absent, and removed again when the copy fails; refused when
  -- something else is there), every entry held beneath it and the extraction bounded by
  -- max_entries and max_bytes; or, for the archive itself, an object with :write(bytes)
  -- (io.stdout) or a function(bytes). Returns the bytes read, or nil and an error.
  function session_mt:read_dir_to(remote, sink, opts)
    if type(remote) ~= "string" then error("sandkit: read_dir_to takes the session's directory", 2) end
    local o, conn = start(self, "read_dir_to", opts)
    if not o then return nil, conn end
    local max_entries, max_bytes = transfer_options(OPS.read_dir, o)
    if not max_entries then return nil, max_bytes end
    if type(sink) ~= "string" then
      local dst = localfile.sink(sink, OPS.read_dir)
      return h.ended(self, protocol_fs.read_dir(conn, remote, dst.write, o.progress))
    end
    local created = false
    if not localfile.is_directory(sink) then
      local ok, merr = core.mkdir(sink, 511)
      if not ok then
        return nil, errors.invalid_input(OPS.read_dir, "destination", "the local directory cannot be made: "
          .. tostring(merr) .. " (something else there is not replaced)")
      end
      created = true
    end
    local unpack, why = tar().unpack(sink, max_entries, max_bytes)
    if not unpack then
      return nil, errors.invalid_input(OPS.read_dir, "destination", "the local directory cannot be written: "
        .. tostring(why))
    end
    local done, err = protocol_fs.read_dir(conn, remote, unpack, o.progress)
    unpack:close()
    if not done and created then core.remove_tree(sink) end
    return h.ended(self, done, err)
  end

  local watch_mt = {}
  watch_mt.__index = watch_mt

  function watch_mt:__call()
    if self.failed then error(self.failed, 0) end
    local event, err = self.stream:next()
    if event then return event end
    if err then error(err, 0) end
    self.reason = self.stream.reason
    return nil
  end

  --- Ends the watch (idempotent): the connection drops.
  function watch_mt:close()
    if self.stream then self.stream:close() end
  end
  watch_mt.__close = watch_mt.close

  --- for event in session:watch(path, { recursive =, timeout = }) do … end
  -- Events are { type = "create"|"modify"|"remove"|"rename", path =, from = (a rename) } and
  -- { type = "overflow" } where the agent dropped events a slow reader left waiting. The loop
  -- ends at the timeout, or when path itself is removed or moved; the iterator's `reason` then
  -- says which ("timeout", "removed", "moved"). A failure raises from the loop. As with run,
  -- the iterator closes on Lua 5.4's to-be-closed exit, and has :close().
  function session_mt:watch(path, opts)
    local iter = setmetatable({}, watch_mt)
    local o, conn = start(self, "watch", opts)
    if not o then
      iter.failed = conn
      return iter, nil, nil, iter
    end
    check_flag(o, "recursive")
    local timeout = o.timeout
    if timeout == nil then timeout = self.sandbox.options.command_timeout end
    local ms, err
    if timeout == nil then
      err = errors.invalid_input(OPS.watch, "timeout",
        "a watch needs a timeout in seconds (or the sandbox's command_timeout)")
    else
      ms, err = protocol.timeout_ms(timeout, OPS.watch)
    end
    if ms then iter.stream, err = protocol_fs.watch(conn, path, o.recursive, timeout, ms) end
    if iter.stream then
      h.ending_stream(self, iter.stream)
    else
      iter.failed = select(2, h.ended(self, nil, err))
    end
    return iter, nil, nil, iter
  end
end

return session_fs
