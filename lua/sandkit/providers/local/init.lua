--- The `local` provider, the default: each session is a directory on this machine served by
-- its own sandkit-agent process, on a Unix socket in that directory (on 127.0.0.1 for a
-- session made inside nginx, or where the socket's path would be too long), with a fresh
-- per-boot token.
--
--   sandkit.sandbox{ provider = "local", root = nil, isolate = "bwrap", network = "none",
--                    bwrap = nil, agent_path = nil, output_cap = nil, ready_timeout = 10,
--                    header_timeout = 60, grace = 60, command_timeout = nil }
--   sandbox:create{ id = nil, env = nil, lifetime = nil, labels = nil, image = nil,
--                   limits = { memory = nil, pids = nil, cpu = nil } }
--   session:set_lifetime(seconds)
--
-- root      the state folder; default $XDG_STATE_HOME/sandkit, else ~/.local/state/sandkit
-- isolate   "bwrap" (the default): each session is confined — its own namespaces built once by
--           bubblewrap, its files as its /, an unprivileged user (docs/agent.md, Confinement);
--           "none": commands run on this machine as the calling user, in the session's files
-- network   for a confined session: "none" (its own loopback only) or "outbound" (connections
--           out through pasta or slirp4netns)
-- bwrap     where bubblewrap is (default /usr/bin/bwrap)
-- env       variables every command of the session starts with, under the command's own
-- lifetime  seconds after which the session's agent exits (its commands with it) and the
--           session reads as absent; the next get, list or prune removes its files.
--           set_lifetime moves the end, in the record and on the agent's own clock
-- labels    kept in the record; list{ labels } reads every record and keeps those matching
-- image     a confined session's / is this image (images.lua), copy-on-write; without one the
--           host's system folders serve, read-only
-- limits    what the session's commands may use together: memory (bytes), pids, cpu (cores),
--           enforced by the agent in control groups, and what it may write (disk, bytes: its
--           own filesystem; limits.lua); one this machine cannot enforce is refused
--
-- Layout of a session, all under <root>/sessions/<id> (mode 0700):
--   record.json  { id, pid, socket or port, boot_id, generation, isolate, network, host_uid,
--                  env, created_at, expires_at, labels, image, limits }
--   agent.sock   the agent's Unix socket, mode 0600 (state.socket_path)
--   image        the name of its image, written before the image is looked for (images.lua)
--   work/        overlayfs's work folder, for a session from an image
--   disk.img     with limits.disk: the filesystem the session's files live on instead of files/
--   token        the agent's bearer token, mode 0600
--   lifetime     the session's end as the agent reads it (--lifetime-file): Unix seconds, or
--                none, padded with spaces to a fixed width
--   files/       the sandbox root the agent serves: a confined session's /, else where its
--                commands run
--   agent.log    the agent's stderr
-- The record is what lets get, list and terminate work from another process, and what a
-- revived session is built again from (its isolation, network and host uid). Its parts:
-- state.lua (the state folder and the records in it), agent_process.lua (the agents),
-- launch.lua (an agent started for a session and waited for), images.lua and mmdebstrap.lua
-- (images), limits.lua.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local options_check = require "sandkit.options"
local oserror = require "sandkit.oserror"
local protocol = require "sandkit.protocol"
local wait = require "sandkit.wait"
local agent_process = require "sandkit.providers.local.agent_process"
local state = require "sandkit.providers.local.state"

-- Loaded by the first call that needs them: images, limits and an agent's start serve only
-- creating sessions and keeping images, and a command that lists sessions or runs in one
-- (most of what `sandkit` is started for) would compile a third of this provider's source for
-- nothing.
local function images() return require "sandkit.providers.local.images" end
local function limits() return require "sandkit.providers.local.limits" end
local function launch() return require "sandkit.providers.local.launch" end

local provider_local = {}

--- The sandbox options this provider takes besides the common ones (sandkit.sandbox), and the
-- create options besides id and env.
provider_local.OPTIONS = options_check.set{ "root", "isolate", "network", "bwrap", "agent_path",
  "output_cap", "ready_timeout", "image_max_entries", "image_max_bytes" }
provider_local.CREATE_OPTIONS = options_check.set{ "lifetime", "image", "limits" }
--- A session id is a directory name and part of a URL nowhere; the rule is the other
-- providers' so that ids move between them.
provider_local.ID = options_check.SESSION_ID
--- The flags the `sandkit` command takes for this provider, before or after its command: each
-- sets the sandbox option it names (sandkit/cli.lua reads this table; `convert`, when given,
-- turns the text into the option's value or returns nil and why not).
provider_local.CLI_OPTIONS = {
  { flag = "root", arg = "DIR", option = "root",
    help = "the state folder (default $XDG_STATE_HOME/sandkit, else ~/.local/state/sandkit)" },
  { flag = "isolate", arg = "bwrap|none", option = "isolate",
    help = "confine new sessions (bwrap, the default) or run their commands on this machine (none)" },
  { flag = "network", arg = "none|outbound", option = "network",
    help = "a confined session's network: its own loopback only (none, the default), or outbound" },
}

local provider_mt = {}
provider_mt.__index = provider_mt

local read_file = state.read_file

--- What to do about a state folder this process may not use.
local ROOT_ADVICE = "; the state folder (the root option) must be one this user can write "
  .. "(docs/openresty.md says how to set one up inside nginx)"

--- Where Debian's bubblewrap package puts it; the agent runs what this names as the jail.
local DEFAULT_BWRAP = "/usr/bin/bwrap"
local ISOLATIONS = { bwrap = true, none = true }
local NETWORKS = { none = true, outbound = true }

function provider_local.new(options)
  local ready_timeout, bad = options_check.seconds("sandkit.sandbox", options, "ready_timeout",
    agent_process.START_TIMEOUT)
  if bad then return nil, bad end
  local _, bad_cap = options_check.whole_number("sandkit.sandbox", options, "output_cap")
  if bad_cap then return nil, bad_cap end
  local root = state.root(options)
  if not root then
    -- nginx clears its workers' environment: there it is root or `env HOME;`.
    return nil, errors.invalid_input("sandbox.create", "root",
      "no state folder: give the sandbox a root, or set $XDG_STATE_HOME or $HOME (inside nginx, "
        .. "whose workers see neither unless `env` passes it, give root: docs/openresty.md)")
  end
  local isolate, network = options.isolate or "bwrap", options.network or "none"
  if not ISOLATIONS[isolate] then
    return nil, errors.invalid_input("sandbox.create", "isolate",
      "isolate is \"bwrap\" (the default) or \"none\", not " .. tostring(isolate))
  end
  if not NETWORKS[network] then
    return nil, errors.invalid_input("sandbox.create", "network",
      "network is \"none\" (the default) or \"outbound\", not " .. tostring(network))
  end
  -- Unconfined commands use this machine's network as it is: there is no other to choose.
  if isolate == "none" and options.network ~= nil then
    return nil, errors.invalid_input("sandbox.create", "network",
      "network is for confined sessions; with isolate = \"none\" commands use this machine's")
  end
  if options.bwrap ~= nil and (type(options.bwrap) ~= "string" or options.bwrap == "") then
    return nil, errors.invalid_input("sandbox.create", "bwrap", "bwrap is the path of bubblewrap")
  end
  for _, name in ipairs{ "image_max_entries", "image_max_bytes" } do
    local _, bad_bound = options_check.whole_number("sandkit.sandbox", options, name)
    if bad_bound then return nil, bad_bound end
  end
  return setmetatable({ name = "local", options = options, root = root, isolate = isolate,
    network = network, bwrap = options.bwrap or DEFAULT_BWRAP, sessions = root .. "/sessions",
    ready_timeout = ready_timeout }, provider_mt)
end

--- The image store of this state folder (images.lua), made by the first call that needs it.
function provider_mt:image_store()
  if not self.images then self.images = images().store(self.root, self.options) end
  return self.images
end

--- What this machine lets a session's agent enforce, asked of the agent once per sandbox, and
-- only by what needs the answer (capabilities().limits, a create with limits): the asking
-- starts an agent, which costs more CPU than the rest of a `sandkit ls` together. A disk is a
-- confined session's own filesystem: an unconfined one writes this machine's.
function provider_mt:enforced_limits()
  if not self.enforced then
    self.enforced = limits().probe((agent_process.find(self.options)))
    self.enforced.disk = self.enforced.disk and self.isolate == "bwrap"
  end
  return self.enforced
end

function provider_mt:capabilities()
  return {
    files = true, jobs = true, reconnect = true, list = true, fs = true, watch = true,
    stdin = true, pty = true,
    -- Unconfined, a session shares this machine's loopback; confined, its agent forwards.
    preview = true,
    pause_resume = false, snapshot = false,
    isolation = self.isolate,
    bwrap = state.file_exists(self.bwrap),
    set_lifetime = true, labels = true,
    images = self.isolate == "bwrap",
  }
end

--- Refuses a session environment that is not names to strings the kernel can carry.
local function check_env(env)
  if env == nil then return nil end
  local function bad(why)
    return errors.invalid_input("sandbox.create", "env", "env maps variable names to strings: " .. why)
  end
  if type(env) ~= "table" then return bad("it is a " .. type(env)) end
  for k, v in pairs(env) do
    if type(k) ~= "string" then return bad("a name is a " .. type(k)) end
    -- The kernel's environment is K=V with no NUL: such a name or value would change which
    -- variable a command sees.
    if k == "" or k:find("=", 1, true) or k:find("\0", 1, true) then
      return bad("a name is non-empty, without '=' or NUL")
    end
    if type(v) ~= "string" then return bad(k:sub(1, 64) .. " is a " .. type(v)) end
    if v:find("\0", 1, true) then return bad(k:sub(1, 64) .. " holds a NUL") end
  end
end

local function new_id()
  return "s-" .. (core.random(8):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

function provider_mt:dir(id)
  return self.sessions .. "/" .. id
end

--- Starts the session's agent and waits until it serves: its record, or nil and an error.
function provider_mt:start_agent(id, dir, fields)
  return launch().start_agent(self, id, dir, fields)
end

function provider_mt:await_agent(...)
  return launch().await_agent(self, ...)
end

function provider_mt:create(opts)
  -- Refused before anything exists: in an nginx phase that cannot wait, the agent's start
  -- could not be waited for.
  wait.check_nginx()
  local id = opts.id or new_id()
  -- A second at least: the wall clock the record keeps counts in seconds. An endless one is no
  -- lifetime: the record (JSON) cannot hold it, and no lifetime is what nil says.
  local expires_at, bad
  if opts.lifetime ~= nil then
    expires_at, bad = options_check.lifetime_end("sandbox.create", opts.lifetime, "lifetime")
    if bad then return nil, bad end
  end
  local bad_env = check_env(opts.env)
  if bad_env then return nil, bad_env end
  local kept_limits, bad_limits
  if opts.limits ~= nil then kept_limits, bad_limits = limits().check(opts.limits, self:enforced_limits()) end
  if bad_limits then return nil, bad_limits end
  local confined = self.isolate == "bwrap"
  if opts.image ~= nil and not confined then
    return nil, errors.invalid_input("sandbox.create", "image",
      "an image is a confined session's /; with isolate = \"none\" commands see this machine's")
  end
  if opts.image ~= nil then
    local bad_name = images().check_name("sandbox.create", opts.image)
    if bad_name then return nil, errors.invalid_input("sandbox.create", "image", bad_name.message) end
  end
  local made, err = state.mkdirs(self.sessions)
  if not made then return nil, errors.invalid_input("sandbox.create", "root", err .. ROOT_ADVICE) end
  local dir = self:dir(id)
  -- Making the directory is the claim: of two creators of one id, exactly one gets it.
  local ok, merr, code = core.mkdir(dir, 448)
  if not ok then
    if code == "EEXIST" then
      return nil, errors.invalid_input("sandbox.create", "id", "a session named " .. id .. " exists")
    end
    return nil, errors.invalid_input("sandbox.create", "root",
      oserror.describe(merr, code, dir, "create") .. ROOT_ADVICE)
  end
  -- 0755: a confined session's /, which programs of other uids inside may need to cross; the
  -- session's directory around it keeps it private on this machine.
  core.mkdir(dir .. "/files", 493)
  local host_uid = confined and agent_process.host_uid() or nil
  if kept_limits and kept_limits.disk then
    local made_disk, derr = limits().make_disk(dir .. "/disk.img", kept_limits.disk, host_uid or 0)
    if not made_disk then
      core.remove_tree(dir)
      return nil, derr
    end
  end
  if opts.image ~= nil then
    local claimed, cerr = images().claim(self:image_store(), dir, opts.image)
    if not claimed then
      core.remove_tree(dir)
      return nil, cerr
    end
    core.mkdir(dir .. "/work", 448)
  end
  local record
  record, err = self:start_agent(id, dir, { generation = 1, env = opts.env, labels = opts.labels,
    expires_at = expires_at, isolate = self.isolate,
    network = confined and self.network or nil,
    host_uid = host_uid, image = opts.image, limits = kept_limits })
  if not record then
    core.remove_tree(dir)
    return nil, err
  end
  return record
end

--- How long a health probe of a recorded agent may take before it reads as gone.
local PROBE_TIMEOUT = 2

function provider_mt:get(id)
  local dir = self:dir(id)
  local record = state.load_record(dir)
  if not record then
    -- A directory without a record is a create still under way, or one that failed.
    return nil
  end
  if record.expires_at and os.time() >= record.expires_at then
    -- Past its lifetime a session is gone, whether or not its agent has left yet.
    local removed, err = self:terminate(id)
    if not removed then return nil, err end
    return nil
  end
  record.token = read_file(dir .. "/token")
  core.reap(record.pid)
  record.state = "terminated"
  if record.token and core.alive(record.pid) and agent_process.is_agent_of(record.pid, dir) then
    local conn = protocol.connection(agent_process.transport(record, record.token),
      { header_timeout = PROBE_TIMEOUT })
    local health = protocol.health(conn)
    -- The boot id tells this agent from another that took the port after it died.
    if health and health.bootId == record.boot_id then
      record.state = "running"
      record.features = health.features
    end
  end
  return record
end

--- A session whose agent died (a reboot, a kill) is served again by a fresh agent over the
-- same files: same id, next generation, created = false.
function provider_mt:get_or_create(opts)
  local record, err = self:get(opts.id)
  if err then return nil, err end
  if record and record.state == "running" then return record, false end
  if record then
    local revived
    revived, err = self:start_agent(opts.id, self:dir(opts.id), { generation = record.generation + 1,
      env = record.env, expires_at = record.expires_at, labels = record.labels, isolate = record.isolate,
      network = record.isolate == "bwrap" and (record.network or "none") or nil,
      host_uid = record.host_uid, image = record.image, limits = record.limits })
    if not revived then return nil, err end
    return revived, false
  end
  record, err = self:create(opts)
  if not record then
    -- Another process may have created it between our look and our claim.
    if err.code == "INVALID_INPUT" and err.field == "id" then
      record = self:get(opts.id)
      if record then return record, false end
    end
    return nil, err
  end
  return record, true
end

--- Every session; the labels asked for are matched by sandbox.lua, from each record's.
function provider_mt:list()
  local names, err, code = core.listdir(self.sessions)
  local records = {}
  -- No sessions folder yet is no sessions; one this user may not read is not an empty one.
  if not names and code ~= "ENOENT" then
    return nil, errors.invalid_input("sandbox.list", "root", oserror.describe(err, code, self.sessions, "read")
      .. ROOT_ADVICE)
  end
  if not names then return records end
  table.sort(names)
  for _, id in ipairs(names) do
    if not options_check.id("sandbox.list", id, provider_local.ID) then
      local record = self:get(id)
      if record then records[#records + 1] = record end
    end
  end
  return records
end

--- Why a removal can fail and succeed when asked again: something was still writing into the
-- tree, or the machine was short of memory or descriptors for a moment. Anything else (a mount
-- point, permissions, a read-only or failing disk) fails the same way every time.
local REMOVAL_MAY_SUCCEED = { ENOTEMPTY = true, ENOMEM = true, EMFILE = true, ENFILE = true,
  EINTR = true }

--- Kills the session's agent and removes its directory. An absent id succeeds.
function provider_mt:terminate(id)
  wait.check_nginx()
  local dir = self:dir(id)
  local pid = state.recorded_pid(dir)
  if pid then agent_process.stop(pid, dir) end
  local ok, err, errno = core.remove_tree(dir)
  if not ok then
    return nil, errors.unreachable("sandbox.terminate", "the session's files could not be removed: "
      .. tostring(err), { retryable = REMOVAL_MAY_SUCCEED[errno] == true })
  end
  return true
end

--- Moves the session's end to `ends` (Unix seconds): in its record, which get, list and the
-- next agent read, and on its running agent's clock (the lifetime file, read again on SIGHUP).
function provider_mt:set_lifetime(record, ends)
  local op = "sandbox.setLifetime"
  local dir = self:dir(record.id)
  local current = state.load_record(dir)
  if not current or (current.expires_at and os.time() >= current.expires_at) then
    return nil, errors.unreachable(op, "session " .. record.id .. " no longer exists",
      { retryable = false })
  end
  if not agent_process.takes_end(current.pid, dir) then
    return nil, errors.not_supported(op, "the agent of session " .. record.id .. " was started "
      .. "without a lifetime file (by an older sandkit), so its end cannot move; a session "
      .. "created now can")
  end
  current.expires_at = ends
  local ok, err = agent_process.write_end(dir, ends)
  if ok then ok, err = state.write_record(dir, current) end
  if not ok then return nil, errors.invalid_input(op, "root", tostring(err) .. ROOT_ADVICE) end
  agent_process.reread_end(current.pid, dir)
  return true
end

--- The session's end as its record now says (another process may have moved it), else as
-- `record` had it.
function provider_mt:expires_at(record)
  local current = state.load_record(self:dir(record.id))
  if current then return current.expires_at end
  return record.expires_at
end

function provider_mt:connection(record)
  if record.state ~= "running" then
    return nil, errors.new("SANDBOX_UNREACHABLE", { operation = "sandbox.connect",
      message = "session " .. record.id .. " is " .. tostring(record.state) })
  end
  local conn = protocol.connection(agent_process.transport(record, record.token), self.options)
  conn.features = record.features or {}
  conn.default_env = record.env
  return conn
end

--- An unconfined session shares this machine's loopback: a port it listens on is reachable as
-- it is. A confined one has a loopback of its own, which its agent forwards from one of this
-- machine's. Either way the endpoint needs no token, lasts as long as the session's agent
-- (expires_in = math.huge), and anything on this machine can reach it.
function provider_mt:preview(record, port)
  local endpoint = "http://127.0.0.1:" .. port
  if record.isolate == "bwrap" then
    local conn, err = self:connection(record)
    if not conn then return nil, err end
    endpoint, err = protocol.preview(conn, port)
    if not endpoint then return nil, err end
  end
  return { endpoint = endpoint, headers = {}, allowed_ports = { port }, expires_in = math.huge }
end

-- Images --------------------------------------------------------------------------------------

function provider_mt:image_import(name, source, opts)
  return images().import(self:image_store(), name, source, opts)
end

function provider_mt:image_build(name, opts)
  return images().build(self:image_store(), name, opts)
end

--- A session's current tree as a new image; the session must be one from an image.
function provider_mt:image_commit(id, name)
  local record = state.load_record(self:dir(id))
  if not record then
    return nil, errors.invalid_input(images().OPS.commit, "session", "no session named " .. tostring(id))
  end
  return images().commit(self:image_store(), record, self:dir(id), name)
end

function provider_mt:image_list()
  return images().list(self:image_store())
end

function provider_mt:image_remove(name)
  return images().remove(self:image_store(), name)
end

return provider_local
