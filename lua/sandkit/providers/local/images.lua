--- The local provider's images: named root filesystems a confined session starts from, seen
-- copy-on-write (overlayfs: the image below, the session's own tree above). They live in the
-- state folder beside the sessions:
--
--   <root>/images/<name>/rootfs      the tree
--   <root>/images/<name>/image.json  { name, size, entries, created_at, origin }
--   <root>/sessions/<id>/image       the name of the image the session starts from: what keeps
--                                    the image from removal while the session exists
--
-- An image is made whole under a hidden name (`.new-<name>-<pid>-<random>`) and renamed into
-- place at the end, so a build, import or commit that fails half-way leaves nothing under the
-- name; what a process killed mid-way left is removed by the next one that makes an image.
-- Every tree that becomes an image goes through the C core's tar extraction
-- (src/common/tarstream.h), which holds each entry beneath the image (no absolute path, no
-- `..`, no link followed, no device node) and bounds the entries and their bytes. Its files
-- belong to whoever made the image, never to an owner the archive names: inside a session that
-- is the sandbox user when sandkit runs as that user, and nobody (read-only, as the host's /usr
-- is) when it runs as root; a session's own changes are its user's either way.

local core = require "sandkit.core"

--- The C module of tar streams, loaded by the first import, build or export: it links
-- libarchive, whose libraries the other calls need not load.
local function tar() return require "sandkit.tar" end
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local localfile = require "sandkit.localfile"
local options_check = require "sandkit.options"
local oserror = require "sandkit.oserror"
local agent_process = require "sandkit.providers.local.agent_process"
local mmdebstrap = require "sandkit.providers.local.mmdebstrap"
local state = require "sandkit.providers.local.state"

local images = {}

images.OPS = { build = "sandbox.imageBuild", import = "sandbox.imageImport", commit = "sandbox.imageCommit",
  list = "sandbox.imageList", remove = "sandbox.imageRemove" }

--- A name is a directory name of the store: a leading '.' is the store's own (images in the
-- making), which no caller may take.
images.NAME = { max = 64, pattern = "^[a-z0-9._-]+$", valid = function(name) return name:sub(1, 1) ~= "." end,
  what = "an image name is 1 to 64 of [a-z0-9._-], not starting with '.'" }

--- An import's bounds unless the sandbox's image_max_entries / image_max_bytes or the call's
-- max_entries / max_bytes say otherwise: room for a distribution with its toolchains, far
-- below what a hostile archive's headers can claim. Never above the extraction's own bounds
-- (sandkit.tar's MAX_ENTRIES and MAX_BYTES).
images.MAX_ENTRIES = 1000000
images.MAX_BYTES = 16 * 1024 * 1024 * 1024

--- Seconds the read-only view of a session's tree for a commit may take to appear.
local VIEW_TIMEOUT = 10

local function hex(n)
  return (core.random(n):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

local function is_root()
  local status = state.read_file("/proc/self/status") or ""
  return status:match("\nUid:%s+%d+%s+(%d+)") == "0"
end

--- The store of the state folder `root`.
function images.store(root, options)
  return { dir = root .. "/images", sessions = root .. "/sessions", options = options or {} }
end

function images.check_name(operation, name)
  if type(name) ~= "string" then
    return errors.invalid_input(operation, "name", images.NAME.what)
  end
  return options_check.id(operation, name, images.NAME, "name")
end

local function path_of(store, name)
  return store.dir .. "/" .. name
end

--- An image's record, or nil when there is none by that name.
local function load(store, name)
  local text = state.read_file(path_of(store, name) .. "/image.json")
  local meta = text and json.decode(text)
  if type(meta) ~= "table" then return nil end
  meta.size = json.integer(meta.size)
  meta.entries = json.integer(meta.entries)
  meta.created_at = json.integer(meta.created_at)
  return meta
end

--- The bounds of an extraction: the call's, else the sandbox's, else the defaults above.
local function bounds(store, operation, opts)
  local o = store.options
  local entries, bad = options_check.whole_number(operation, opts, "max_entries",
    o.image_max_entries or images.MAX_ENTRIES)
  if bad then return nil, bad end
  local bytes
  bytes, bad = options_check.whole_number(operation, opts, "max_bytes", o.image_max_bytes or images.MAX_BYTES)
  if bad then return nil, bad end
  local limits = tar()
  if entries < 1 or entries > limits.MAX_ENTRIES then
    return nil, errors.invalid_input(operation, "max_entries", "max_entries is from 1 to " .. limits.MAX_ENTRIES)
  end
  if bytes > limits.MAX_BYTES then
    return nil, errors.invalid_input(operation, "max_bytes", "max_bytes is at most " .. limits.MAX_BYTES)
  end
  return entries, bytes
end

--- A hidden folder's name for `name`, made by this process: `.new-` (an image in the making) or
-- `.gone-` (one being removed), the name, this process's pid, and a random tail.
local function hidden(kind, name)
  local pid = (state.read_file("/proc/self/stat") or ""):match("^(%d+)") or "0"
  return string.format(".%s-%s-%s-%s", kind, name, pid, hex(6))
end

--- Removes what processes that were killed mid-way left: hidden folders whose pid is gone.
local function sweep(store)
  for _, entry in ipairs(core.listdir(store.dir) or {}) do
    local pid = entry:match("^%.new%-.-%-(%d+)%-%x+$") or entry:match("^%.gone%-.-%-(%d+)%-%x+$")
    if pid and not core.alive(tonumber(pid)) then core.remove_tree(store.dir .. "/" .. entry) end
  end
end

--- A hidden folder for an image in the making, with its empty rootfs: its path, or nil and why.
local function stage(store, operation, name)
  local bad = images.check_name(operation, name)
  if bad then return nil, bad end
  local made, err = state.mkdirs(store.dir)
  if not made then return nil, errors.invalid_input(operation, "root", err) end
  sweep(store)
  if state.file_exists(path_of(store, name)) then
    return nil, errors.invalid_input(operation, "name", "an image named " .. name .. " exists")
  end
  local tmp = store.dir .. "/" .. hidden("new", name)
  local ok, merr, code = core.mkdir(tmp, 448)
  if ok then ok, merr, code = core.mkdir(tmp .. "/rootfs", 493) end
  if not ok then
    core.remove_tree(tmp)
    return nil, errors.invalid_input(operation, "root", oserror.describe(merr, code, tmp, "create"))
  end
  return tmp
end

--- Gives the image in the making its name: its record, or nil and why (the folder is gone).
local function publish(store, operation, name, tmp, meta)
  local ok, err = core.write_private(tmp .. "/image.json", json.encode(meta))
  -- rename(2) replaces no image: one is never an empty folder.
  if ok then ok, err = os.rename(tmp, path_of(store, name)) end
  if not ok then
    core.remove_tree(tmp)
    if state.file_exists(path_of(store, name)) then
      return nil, errors.invalid_input(operation, "name", "an image named " .. name .. " exists")
    end
    return nil, errors.invalid_input(operation, "root", "the image could not be stored: " .. tostring(err))
  end
  return meta
end

--- What an extraction's failure says, as an error of `operation` about `what`.
local function extraction_error(operation, what, kind, why, entry)
  local at = entry and entry ~= "" and (" (entry " .. entry .. ")") or ""
  if kind == "invalid" then
    return errors.invalid_input(operation, "source", what .. " is neither a directory nor a whole tar archive: "
      .. tostring(why))
  elseif kind == "refused" then
    return errors.invalid_input(operation, "source", what .. " holds an entry an image may not: " .. tostring(why))
  elseif kind == "too_large" then
    return errors.invalid_input(operation, "source", what .. " is over the image bounds (max_entries, "
      .. "max_bytes): " .. tostring(why))
  end
  return errors.invalid_input(operation, "source", what .. " could not be extracted: " .. tostring(why) .. at)
end

--- Extracts the archive `read` returns piece by piece into tmp/rootfs: { size =, entries = }, or
-- nil and why.
local function extract(store, operation, tmp, read, what, opts)
  local max_entries, max_bytes = bounds(store, operation, opts)
  if not max_entries then return nil, max_bytes end
  local unpack, why = tar().unpack(tmp .. "/rootfs", max_entries, max_bytes)
  if not unpack then return nil, errors.invalid_input(operation, "root", tostring(why)) end
  local failed
  while true do
    local piece, rerr = read()
    if piece == nil then
      if rerr then
        unpack:close()
        if errors.is_error(rerr) then return nil, rerr end
        return nil, errors.invalid_input(operation, "source", what .. " could not be read: " .. tostring(rerr))
      end
      break
    end
    if #piece > 0 then
      local ok, kind, wwhy, entry = unpack:write(piece)
      if not ok then failed = { kind, wwhy, entry } break end
    end
  end
  if not failed then
    local ok, kind, fwhy, entry = unpack:finish()
    if not ok then failed = { kind, fwhy, entry } end
  end
  local got = { size = unpack:bytes(), entries = unpack:entries() }
  unpack:close()
  if failed then return nil, extraction_error(operation, what, failed[1], failed[2], failed[3]) end
  return got
end

--- A directory's tree as a tar stream (sandkit.tar's pack): the reader and its closer, or nil and why.
local function pack_dir(operation, dir)
  local pack, why = tar().pack(dir)
  if not pack then
    return nil, errors.invalid_input(operation, "source", "the directory " .. dir .. " cannot be read: "
      .. tostring(why))
  end
  return function() return pack:read() end, function() pack:close() end
end

--- Makes an image from `read` under name: its record, or nil and why; nothing stays on failure.
local function make(store, operation, name, tmp, read, what, origin, opts)
  local got, err = extract(store, operation, tmp, read, what, opts)
  if not got then
    core.remove_tree(tmp)
    return nil, err
  end
  return publish(store, operation, name, tmp, { name = name, size = got.size, entries = got.entries,
    created_at = os.time(), origin = origin })
end

--- import(name, source, opts): source is a directory's path, a tar archive's path, "-" (standard
-- input), or an object with :read(n) / a function returning the next piece of a tar archive.
-- opts.max_entries, opts.max_bytes bound it.
function images.import(store, name, source, opts)
  local op = images.OPS.import
  if source == nil then return nil, errors.invalid_input(op, "source", "import needs a directory or a tar archive") end
  local tmp, err = stage(store, op, name)
  if not tmp then return nil, err end
  local read, close, what, origin
  if type(source) == "string" and source ~= "-" and core.is_directory(source) then
    read, close = pack_dir(op, source)
    if not read then
      core.remove_tree(tmp)
      return nil, close
    end
    what, origin = "the directory " .. source, "import " .. source
  else
    local src
    src, err = localfile.source(source == "-" and io.stdin or source, op)
    if not src then
      core.remove_tree(tmp)
      return nil, err
    end
    read, close = src.read, src.close
    what = source == "-" and "standard input" or type(source) == "string" and source or "the archive"
    origin = "import " .. (type(source) == "string" and source or "stream")
  end
  local meta
  meta, err = make(store, op, name, tmp, read, what, origin, opts)
  close()
  return meta, err
end

--- build(name, { suite =, packages =, variant =, mirror =, mmdebstrap =, timeout = }): a Debian
-- system made by mmdebstrap (mmdebstrap.lua) from Debian's archive (or `mirror`), then imported
-- as any directory.
function images.build(store, name, opts)
  local op = images.OPS.build
  opts = opts or {}
  local bad = images.check_name(op, name)
  if bad then return nil, bad end
  local plan, perr = mmdebstrap.plan(op, opts)
  if not plan then return nil, perr end
  local tmp, err = stage(store, op, name)
  if not tmp then return nil, err end
  local built, berr = mmdebstrap.run(op, plan, tmp)
  if not built then return nil, berr end
  local read, close = pack_dir(op, tmp .. "/build")
  if not read then
    core.remove_tree(tmp)
    return nil, close
  end
  local got
  got, err = extract(store, op, tmp, read, "mmdebstrap's tree", opts)
  close()
  if not got then
    core.remove_tree(tmp)
    return nil, err
  end
  mmdebstrap.clean(tmp)
  return publish(store, op, name, tmp, { name = name, size = got.size, entries = got.entries,
    created_at = os.time(), origin = plan.origin })
end

--- commit(record, session_dir, name): the tree a session from an image sees (its image below its
-- own changes, as overlayfs shows them) becomes a new image. Read through a read-only overlay
-- mounted in a mount namespace of a process of its own, so nothing is mounted on this machine.
function images.commit(store, record, session_dir, name)
  local op = images.OPS.commit
  local bad = images.check_name(op, name)
  if bad then return nil, bad end
  if not record.image then
    return nil, errors.invalid_input(op, "session", "session " .. record.id .. " has no image: its / is this "
      .. "machine's system folders, which are no image's to keep (create it with image = NAME)")
  end
  if record.limits and record.limits.disk then
    return nil, errors.invalid_input(op, "session", "session " .. record.id .. " has a disk limit: its "
      .. "changes live on a filesystem its agent holds mounted, which a commit cannot read beside it")
  end
  local lower = path_of(store, record.image) .. "/rootfs"
  local tmp, err = stage(store, op, name)
  if not tmp then return nil, err end
  local view = tmp .. "/view"
  core.mkdir(view, 448)
  -- The session's changes are the upper layer of the overlay; mounted again as a lower one, its
  -- whiteouts and opaque folders hide what the session removed.
  local argv = { "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
    'mount -t overlay overlay -o "ro,lowerdir=$1:$2" "$3" && echo ready >&3 && exec sleep ' .. VIEW_TIMEOUT * 60,
    "sh", session_dir .. "/files", lower, view }
  if not is_root() then table.insert(argv, 2, "--map-root-user") table.insert(argv, 2, "--user") end
  local pid, reader = core.spawn(argv, { ready_fd = 3, stderr = tmp .. "/view.log" })
  if not pid then
    core.remove_tree(tmp)
    return nil, errors.invalid_input(op, "session", "cannot look at the session's tree: " .. tostring(reader))
  end
  local line = agent_process.ready_line(reader, core.now() + VIEW_TIMEOUT)
  local meta
  if line ~= "ready" then
    err = errors.invalid_input(op, "session", "cannot look at the session's tree: "
      .. ((state.read_file(tmp .. "/view.log") or ""):gsub("%s+$", "")))
  else
    local read, close = pack_dir(op, "/proc/" .. pid .. "/root" .. view)
    if read then
      local got
      got, err = extract(store, op, tmp, read, "the session's tree", {})
      close()
      if got then meta = { name = name, size = got.size, entries = got.entries, created_at = os.time(),
        origin = "commit " .. record.id .. " (from " .. record.image .. ")" } end
    else
      err = close
    end
  end
  core.kill(pid, core.SIGKILL)
  core.reap(pid, true)
  if not meta then
    core.remove_tree(tmp)
    return nil, err
  end
  core.remove_tree(view)
  os.remove(tmp .. "/view.log")
  return publish(store, op, name, tmp, meta)
end

--- Every image: { { name =, size =, entries =, created_at =, origin = }, … } by name.
function images.list(store)
  local names, err, code = core.listdir(store.dir)
  local out = {}
  if not names then
    if code == "ENOENT" then return out end
    return nil, errors.invalid_input(images.OPS.list, "root", oserror.describe(err, code, store.dir, "read"))
  end
  table.sort(names)
  for _, name in ipairs(names) do
    if not images.check_name(images.OPS.list, name) then
      local meta = load(store, name)
      if meta then out[#out + 1] = meta end
    end
  end
  return out
end

--- The session that names `name` as its image, or nil.
local function user_of(store, name)
  for _, id in ipairs(core.listdir(store.sessions) or {}) do
    local marker = state.read_file(store.sessions .. "/" .. id .. "/image")
    if marker == name then return id end
  end
end

--- Removes an image no session uses: true, or nil and why. An absent name is an error.
function images.remove(store, name)
  local op = images.OPS.remove
  local bad = images.check_name(op, name)
  if bad then return nil, bad end
  local path = path_of(store, name)
  if not load(store, name) then
    return nil, errors.invalid_input(op, "name", "no image named " .. name)
  end
  -- Out of reach first, then the check: a session claims its image before it looks for it
  -- (images.claim), so either the claim is seen here or the image is not found there.
  local gone = store.dir .. "/" .. hidden("gone", name)
  local moved, merr = os.rename(path, gone)
  if not moved then
    return nil, errors.invalid_input(op, "root", "the image could not be removed: " .. tostring(merr))
  end
  local user = user_of(store, name)
  if user then
    os.rename(gone, path)
    return nil, errors.invalid_input(op, "name", "image " .. name .. " is in use by session " .. user
      .. " (terminate it first)")
  end
  local ok, err = core.remove_tree(gone)
  if not ok then return nil, errors.invalid_input(op, "root", "the image could not be removed: " .. tostring(err)) end
  return true
end

--- Claims image `name` for the session folder `dir` (its marker, then the look): the image's
-- rootfs path, or nil and INVALID_INPUT when there is no such image.
function images.claim(store, dir, name)
  local op = "sandbox.create"
  local bad = images.check_name(op, name)
  if bad then return nil, errors.invalid_input(op, "image", bad.message) end
  local ok, err = core.write_private(dir .. "/image", name)
  if not ok then return nil, errors.invalid_input(op, "root", tostring(err)) end
  if not load(store, name) then
    os.remove(dir .. "/image")
    return nil, errors.invalid_input(op, "image", "no image named " .. name .. " (sandkit image ls lists them)")
  end
  return path_of(store, name) .. "/rootfs"
end

return images
