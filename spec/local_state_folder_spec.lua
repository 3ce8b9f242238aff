-- The local provider's state folder, from the command line and from an nginx worker: a folder
-- the user may not write or read is refused as permission denied, naming the folder and the
-- user; no state folder at all names the option to give; a folder set up as docs/openresty.md
-- says serves sessions. Under root, the processes here run without the capabilities that
-- override a folder's modes (support/processes.bound_by_modes), so the modes bind as for anyone.

local cjson = require "cjson"
local core = require "sandkit.core"
local oserror = require "sandkit.oserror"
local files = require "support.files"
local local_state = require "support.local_state"
local nginx = require "support.nginx"
local processes = require "support.processes"
local raw_http = require "support.raw_http"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
local q = files.shell_quote

--- This process's user as `id` names it: what every message here must name.
local function who()
  local name = local_state.sh("id -un"):match("^(%S+)")
  local uid = local_state.sh("id -u"):match("^(%d+)")
  return "user " .. name .. " (uid " .. uid .. ")"
end

--- A folder anyone may enter, holding `locked`, which nobody but root may write, and `open`.
local function folders()
  local dir = files.temp_dir(tonumber("755", 8))
  assert(core.mkdir(dir .. "/locked", tonumber("555", 8)))
  assert(files.execute("chmod 555 " .. q(dir .. "/locked")))
  return dir
end

local function unlock_and_remove(dir)
  files.execute("chmod -R u+rwx " .. q(dir))
  local_state.clean(dir)
end

describe("the local provider's state folder, from the command line", function()
  local dir
  before_each(function() dir = folders() end)
  after_each(function() unlock_and_remove(dir) end)

  --- The sandkit command, bound by folders' modes, with this checkout's modules.
  local function sandkit_cmd(args)
    return local_state.sh(local_state.lua_env() .. " " .. table.concat(processes.bound_by_modes(), " ") .. " "
      .. LUA .. " bin/sandkit " .. args)
  end

  it("refuses a root this user may not create as permission denied, naming the folder and the user", function()
    local out, err, status = sandkit_cmd("--root " .. q(dir .. "/locked/state") .. " create s1")
    assert.equal(1, status, err)
    assert.equal("", out)
    assert.truthy(err:find("INVALID_INPUT: sandbox.create: permission denied: " .. who() .. " may not create "
      .. dir .. "/locked/state (EACCES); the state folder (the root option) must be one this user can write", 1, true),
      err)
    assert.is_nil(err:find("No such file", 1, true), "the refusal is not said as an absence")
  end)

  it("names the session's folder when the sessions folder is the one it may not write", function()
    local root = dir .. "/open"
    assert(core.mkdir(root, 448))
    assert(core.mkdir(root .. "/sessions", tonumber("555", 8)))
    assert(files.execute("chmod 555 " .. q(root .. "/sessions")))
    local _, err, status = sandkit_cmd("--root " .. q(root) .. " create s1")
    assert.equal(1, status, err)
    assert.truthy(err:find("permission denied: " .. who() .. " may not create " .. root .. "/sessions/s1 (EACCES)",
      1, true), err)
  end)

  it("refuses to list a sessions folder it may not read instead of listing none", function()
    local root = dir .. "/open"
    assert(core.mkdir(root, 448))
    assert(core.mkdir(root .. "/sessions", 0))
    assert(files.execute("chmod 0 " .. q(root .. "/sessions")))
    local out, err, status = sandkit_cmd("--root " .. q(root) .. " ls")
    assert.equal(1, status, err)
    assert.equal("", out)
    assert.truthy(err:find("INVALID_INPUT: sandbox.list: permission denied: " .. who() .. " may not read "
      .. root .. "/sessions (EACCES)", 1, true), err)
  end)

  it("lists none, with status 0, where no session was ever made", function()
    local out, err, status = sandkit_cmd("--root " .. q(dir .. "/open") .. " ls --json")
    assert.equal(0, status, err)
    assert.same({ sessions = {} }, cjson.decode(out))
  end)

  it("without a root, $XDG_STATE_HOME or $HOME, says to give the sandbox a root", function()
    local out, err, status = local_state.sh("env -i PATH=/usr/bin:/bin " .. local_state.lua_env() .. " "
      .. LUA .. " bin/sandkit ls")
    assert.equal(2, status, err)
    assert.equal("", out)
    assert.equal("sandkit: INVALID_INPUT: sandbox.create: no state folder: give the sandbox a root, or set "
      .. "$XDG_STATE_HOME or $HOME (inside nginx, whose workers see neither unless `env` passes it, give root: "
      .. "docs/openresty.md)\n", err)
  end)
end)

describe("sandkit.oserror", function()
  local dir
  before_each(function() dir = files.temp_dir() end)
  after_each(function() core.remove_tree(dir) end)

  it("names this process's user as id does", function()
    assert.equal(who(), oserror.user())
  end)

  it("reads a user's name from whole passwd lines only, and no further than its bound", function()
    local passwd = dir .. "/passwd"
    files.write(passwd, "odd:x:extra:4242:4242::/:/bin/sh\nreal:x:4243:4243::/:/bin/sh\n")
    assert.equal("real", oserror.user_name(4243, passwd))
    assert.is_nil(oserror.user_name(4242, passwd), "a field in the middle of a line is no uid")
    local filler = string.rep("#\n", oserror.MAX_PASSWD / 2)
    files.write(passwd, filler:sub(1, oserror.MAX_PASSWD - 40) .. "real:x:4243:4243::/:/bin/sh\n")
    assert.equal("real", oserror.user_name(4243, passwd), "a file of the bound is read whole")
    files.write(passwd, filler .. "real:x:4243:4243::/:/bin/sh\n")
    assert.is_nil(oserror.user_name(4243, passwd), "a file past the bound names nobody")
  end)

  it("keeps the system's message for what is no refusal", function()
    assert.equal("x: No space left on device", oserror.describe("x: No space left on device", "other", "x", "create"))
    assert.equal("permission denied: " .. who() .. " may not create /x (EPERM)",
      oserror.describe("/x: Operation not permitted", "EPERM", "/x", "create"))
  end)
end)

describe("the local provider's state folder, inside nginx", function()
  local ROUNDTRIP = [[
    location = /roundtrip { content_by_lua_block { require("support.nginx_app").provider_roundtrip() } }
  ]]
  local dir, gateway
  before_each(function()
    dir = folders()
    gateway = nginx.start{ server = ROUNDTRIP, bound_by_modes = true }
  end)
  after_each(function()
    gateway:stop()
    unlock_and_remove(dir)
  end)

  local function roundtrip(options)
    local answer = assert(raw_http.request(gateway.port, "POST", "/roundtrip",
      { body = cjson.encode{ options = options, argv = { "sh", "-c", "printf from-nginx" } }, timeout = 60 }))
    assert(answer.status == 200, answer.body .. gateway:error_log())
    return cjson.decode(answer.body)
  end

  it("says permission denied for the folder and the worker's user when the worker may not write root", function()
    local result = roundtrip{ provider = "local", root = dir .. "/locked/state" }
    assert.equal("create", result.failed, result.err)
    assert.truthy(result.err:find("permission denied: " .. who() .. " may not create " .. dir .. "/locked/state "
      .. "(EACCES)", 1, true), result.err)
  end)

  it("says to give root when the worker has none, nginx having cleared HOME", function()
    local result = roundtrip{ provider = "local" }
    assert.equal("sandbox", result.failed, result.err)
    assert.truthy(result.err:find("no state folder: give the sandbox a root", 1, true), result.err)
  end)

  it("serves sessions from a root set up as docs/openresty.md says: the worker user's folder, mode 0700", function()
    local root = dir .. "/sandkit"
    local _, err, status = local_state.sh("install -d -m 0700 " .. q(root))
    assert.equal(0, status, err)
    local result = roundtrip{ provider = "local", root = root }
    assert.is_nil(result.failed, tostring(result.err) .. gateway:error_log())
    assert.equal("from-nginx", result.frames[1].data)
  end)
end)
