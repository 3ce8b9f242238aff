--- The local provider's state folder: where it is, and what it keeps per session under
-- <root>/sessions/<id> (mode 0700) — record.json, written whole through a rename so that another
-- process never reads half of one.

local core = require "sandkit.core"
local json = require "sandkit.json"
local oserror = require "sandkit.oserror"

local state = {}

--- The state folder: the `root` option, $XDG_STATE_HOME/sandkit, else ~/.local/state/sandkit;
-- nil when none can be named.
function state.root(options)
  if options.root then return options.root end
  local xdg = os.getenv("XDG_STATE_HOME")
  if xdg and xdg ~= "" then return xdg .. "/sandkit" end
  local home = os.getenv("HOME")
  if not home or home == "" then return nil end
  return home .. "/.local/state/sandkit"
end

function state.file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

function state.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

--- Makes `path` and its missing parents, each private to this user: true, or nil and why,
-- said of the folder that could not be made (a parent refused is not news of the child's
-- absence).
function state.mkdirs(path)
  local parent = path:match("^(.+)/[^/]+$")
  if parent and parent ~= "" then
    local ok, err, code = core.mkdir(parent, 448)
    if not ok and code == "ENOENT" then
      local made, why = state.mkdirs(parent)
      if not made then return nil, why end
    elseif not ok and code ~= "EEXIST" then
      return nil, oserror.describe(err, code, parent, "create")
    end
  end
  local ok, err, code = core.mkdir(path, 448) -- 0700: sessions are private to their user
  if ok or code == "EEXIST" then return true end
  return nil, oserror.describe(err, code, path, "create")
end

--- Writes a session's record: true, or nil and why.
function state.write_record(dir, record)
  local tmp = dir .. "/record.json.tmp"
  os.remove(tmp)
  local text = json.encode(record)
  local ok, err = core.write_private(tmp, text)
  if not ok then return nil, err end
  local renamed, rerr = os.rename(tmp, dir .. "/record.json")
  if not renamed then return nil, rerr end
  return true
end

--- Where the agent of the session folder `dir` listens: its Unix socket there, or nil when
-- that path is too long to bind (a deep root), and the agent listens on 127.0.0.1 instead.
-- Over a Unix socket a file read out moves at twice the rate for half the CPU here (loopback
-- TCP makes the reader transmit the agent's data as it acknowledges it), and only this
-- machine's user can connect at all.
function state.socket_path(dir)
  local path = dir .. "/agent.sock"
  if #path > core.LIMITS.MAX_UNIX_SOCKET then return nil end
  return path
end

--- The JSON object of dir's record file as it stands, or nil when there is none or it is no
-- object.
local function record_object(dir)
  local text = state.read_file(dir .. "/record.json")
  local record = text and json.decode(text)
  if type(record) ~= "table" then return nil end
  return record
end

--- The agent's pid a session's record names, whether or not the record is one to serve (a
-- record edited to name another socket is refused by load_record, yet its agent still runs and
-- terminate must stop it). Only a pid: agent_process.stop checks that it is this folder's agent
-- before it signals anything.
function state.recorded_pid(dir)
  local record = record_object(dir)
  return record and json.integer(record.pid)
end

--- A session's record as its provider wrote it, or nil when there is none, or not a whole one.
function state.load_record(dir)
  local record = record_object(dir)
  if not record then return nil end
  record.pid = json.integer(record.pid)
  record.port = json.integer(record.port)
  record.generation = json.integer(record.generation or 1)
  record.created_at = json.integer(record.created_at)
  record.expires_at = json.integer(record.expires_at)
  record.host_uid = json.integer(record.host_uid)
  -- What the session was made as is what it is served as again; a record from before
  -- confinement was the default says nothing, and such a session was unconfined.
  if record.isolate ~= "bwrap" then record.isolate = "none" end
  if record.network == json.null then record.network = nil end
  -- A record this provider did not write whole is not a session it can serve.
  -- Its socket is its own folder's or none: a record naming another would send the session's
  -- token to whatever listens there.
  if record.socket ~= state.socket_path(dir) then record.socket = nil end
  if not (record.pid and (record.port or record.socket) and record.generation) then return nil end
  if record.env == json.null then record.env = nil end
  -- Labels are what this provider wrote: strings to strings; anything else is none.
  local labels = {}
  if type(record.labels) == "table" then
    for k, v in pairs(record.labels) do
      if type(k) == "string" and type(v) == "string" then labels[k] = v end
    end
  end
  record.labels = labels
  if type(record.image) ~= "string" then record.image = nil end
  if type(record.limits) == "table" then
    for _, name in ipairs{ "memory", "pids", "disk" } do record.limits[name] = json.integer(record.limits[name]) end
  else
    record.limits = nil
  end
  return record
end

return state
