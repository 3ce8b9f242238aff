-- What sandkit-agent answers when the filesystem refuses a caller's request (docs/protocol.md
-- §3.6): every error a caller can cause is a 4xx naming it, because a client reads a 5xx as a
-- sandbox it could not reach and sends the same request again — for ever, if the cause is the
-- request. Only the agent's own failures are a 500. The real agent, on real filesystems: the
-- full and read-only ones are tmpfs mounts, which need root.

local agent_process = require "support.agent_process"
local files = require "support.files"

local start_agent, check_stream = agent_process.start_agent, agent_process.check_stream
local shell_quote = files.shell_quote

local sh = files.execute

local am_root = agent_process.am_root

--- Mounts a tmpfs with `options` at dir (created); false where mounting is not allowed.
local function mount_tmpfs(dir, options)
  return sh("mkdir -p " .. shell_quote(dir) .. " && mount -t tmpfs -o " .. options
    .. " sandkit-spec " .. shell_quote(dir) .. " 2>/dev/null")
end

local function put(agent, path, bytes)
  return agent:req("PUT", "/v1/files", { path = path, contentsBase64 = agent_process.b64(bytes) })
end

describe("sandkit-agent answers for what the filesystem refuses", function()
  local A
  setup(function() A = assert(start_agent()) end)
  teardown(function() assert.are.equal(0, A:stop()) end)

  it("refuses a path component longer than the filesystem allows, in every route, with 400", function()
    local long = "/" .. ("n"):rep(300)
    local res = A:req("GET", "/v1/files?path=" .. long)
    assert.are.equal(400, res.status, res.body)
    assert.matches("^PATH_REFUSED: Path '/nnn.*' refused: a path component is longer than the "
      .. "filesystem allows$", res.body)
    res = put(A, long .. "/f", "x")
    assert.are.equal(400, res.status, res.body)
    assert.matches("^PATH_REFUSED: ", res.body)
    res = A:req("POST", "/v1/mkdir", { path = long })
    assert.are.equal(400, res.status, res.body)
    assert.matches("^PATH_REFUSED: ", res.body)
    -- A working directory is refused before anything runs, as one that leaves the root is.
    res = A:req("POST", "/v1/exec", { command = { "true" }, timeoutMs = 5000, cwd = long })
    assert.are.equal(400, res.status, res.body)
    assert.matches("^PATH_REFUSED: ", res.body)
    res = A:req("POST", "/v1/jobs/start", { command = { "true" }, timeoutMs = 5000, cwd = long })
    assert.are.equal(400, res.status, res.body)
    assert.matches("^PATH_REFUSED: ", res.body)
  end)

  it("answers a write over a program that is running with 409 PATH_BUSY", function()
    local _, frames = A:exec({ command = { "cp", "/bin/sleep", "busy" }, timeoutMs = 10000 })
    assert.are.equal(0, check_stream(frames).code)
    local res, started = A:start_job({ command = { "./busy", "30" }, timeoutMs = 30000 })
    assert.are.equal(200, res.status, res.body)
    finally(function() A:json("POST", "/v1/jobs/cancel", { jobId = started.jobId }) end)
    -- The job runs once its program has been opened for execution: a write is refused then.
    local busy = agent_process.within(10, function()
      res = put(A, "/busy", "overwritten")
      return res.status ~= 204
    end)
    assert.is_true(busy, "the write never met the running program")
    assert.are.equal(409, res.status, res.body)
    assert.are.equal("PATH_BUSY: Path '/busy' is busy: a running program's file or a mount point",
      res.body)
  end)

  it("answers a directory where a file must be with 400, a file on the way with 404 or 400", function()
    assert.are.equal(204, A:req("POST", "/v1/mkdir", { path = "/adir" }).status)
    assert.are.equal(204, put(A, "/afile", "x").status)
    local res = A:req("GET", "/v1/files?path=/afile/below")
    assert.are.equal(404, res.status, res.body)
    assert.are.equal("PATH_NOT_FOUND: No such file in the sandbox: /afile/below", res.body)
    res = put(A, "/afile/below", "x")
    assert.are.equal(400, res.status, res.body)
    assert.matches("^REQUEST_INVALID: ", res.body)
    res = put(A, "/adir", "x")
    assert.are.equal(400, res.status, res.body)
    assert.matches("^REQUEST_INVALID: ", res.body)
  end)
end)

describe("sandkit-agent answers for mounts and permissions", function()
  local A, mounts
  before_each(function() mounts = {} end)
  after_each(function()
    for _, dir in ipairs(mounts) do sh("umount " .. shell_quote(dir)) end
    if A then assert.are.equal(0, A:stop()) end
    A = nil
  end)

  local function mounted(dir, options)
    if not mount_tmpfs(dir, options) then return false end
    mounts[#mounts + 1] = dir
    return true
  end

  it("answers a full filesystem with 413 NO_SPACE", function()
    A = assert(start_agent())
    if not mounted(A.root .. "/small", "size=64k") then
      pending("mounting a tmpfs needs root")
      return
    end
    local res = put(A, "/small/big", ("x"):rep(1024 * 1024))
    assert.are.equal(413, res.status, res.body)
    assert.are.equal("NO_SPACE: No room for '/small/big': the filesystem or the disk quota is full",
      res.body)
  end)

  it("answers a raw upload that fills the filesystem with 413 NO_SPACE, leaving no file behind", function()
    A = assert(start_agent())
    if not mounted(A.root .. "/small", "size=512k") then
      pending("mounting a tmpfs needs root")
      return
    end
    -- The first read (at most 256 KiB) is written by the agent, and the rest, past the 1 MiB
    -- from which the agent splices a body into its file, meets the full filesystem in a
    -- splice; small enough that what is left after the refusal is read and dropped before the
    -- connection closes (CLOSE_LINGER_MAX), so that this sender, which reads only after
    -- sending, hears the answer.
    local res = A:req("PUT", "/v1/files/raw?path=/small/big", ("x"):rep(1536 * 1024))
    assert.are.equal(413, res.status, res.body)
    assert.are.equal("NO_SPACE: No room for '/small/big': the filesystem or the disk quota is full",
      res.body)
    assert.are.equal("", (agent_process.run("ls -A " .. shell_quote(A.root .. "/small"))))
  end)

  it("answers a read-only filesystem and a path the agent's user may not use with 403 PERMISSION_DENIED", function()
    if not am_root() then
      pending("a file the agent may not read, and a read-only mount, need root to make")
      return
    end
    -- An agent running as nobody, and files in its root that belong to root alone.
    A = assert(start_agent{ shared = true,
      prefix = "setpriv --reuid=65534 --regid=65534 --clear-groups" })
    files.write(A.root .. "/secret", "root's")
    assert(sh("chmod 600 " .. shell_quote(A.root .. "/secret") .. " && mkdir -m 755 "
      .. shell_quote(A.root .. "/locked")))
    local res = A:req("GET", "/v1/files?path=/secret")
    assert.are.equal(403, res.status, res.body)
    assert.are.equal("PERMISSION_DENIED: Permission denied for '/secret': the agent's user may not "
      .. "use it, or its filesystem is read-only", res.body)
    res = put(A, "/locked/f", "x")
    assert.are.equal(403, res.status, res.body)
    assert.matches("^PERMISSION_DENIED: ", res.body)
    assert.is_true(mounted(A.root .. "/ro", "ro,mode=0777"))
    res = A:req("POST", "/v1/mkdir", { path = "/ro/d" })
    assert.are.equal(403, res.status, res.body)
    assert.matches("^PERMISSION_DENIED: ", res.body)
  end)
end)
