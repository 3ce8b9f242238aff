-- agent_process.lua — the real sandkit-agent binary (SANDKIT_AGENT) as specs drive it: started
-- with --ready-fd on a pipe (so the spec learns its port from the line the agent writes after
-- binding; nothing waits by sleeping), requests over real sockets, stopped with SIGTERM and its
-- log checked for sanitizer reports; plus the /proc and stream helpers the agent specs share.
-- Waits for a process to die are bounded polls of /proc: the bound is the property under test.

local assert = require "luassert"
local files = require "support.files"
local procs = require "support.processes"
local raw = require "support.raw_http"
local cjson = require "cjson"
local core = require "sandkit.core"
local json = require "sandkit.json"

local AGENT = os.getenv("SANDKIT_AGENT")

local DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

---------------------------------------------------------------------------------------------
-- helpers

local shell_quote, read_file, write_file = files.shell_quote, files.read, files.write

local function run(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("*a")
  p:close()
  return out
end

local tmpdir = files.temp_dir

local function exists(path)
  return files.execute("test -e " .. shell_quote(path) .. " || test -L " .. shell_quote(path))
end

local is_dir = core.is_directory

local b64 = core.b64encode
local function unb64(s) return core.b64decode(s) or "" end

-- nil stands for a process that was gone before its host pid could be looked up.
local function pid_alive(pid)
  return pid ~= nil and procs.alive(pid)
end

-- Host pids of the live processes whose argv holds every string of `words` in a row (argv
-- entries are NUL-separated in /proc/<pid>/cmdline). Read straight from /proc: procps' ps
-- deadlocks when a sanitizer runtime is preloaded into it.
local function processes(words)
  local needle = table.concat(words, "\0")
  local found = {}
  for _, name in ipairs(core.listdir("/proc")) do
    local cmdline = name:match("^%d+$") and read_file("/proc/" .. name .. "/cmdline")
    if cmdline and cmdline:find(needle, 1, true) and pid_alive(name) then
      found[#found + 1] = tonumber(name)
    end
  end
  return found
end

-- Host pids of the live children of pid whose name (comm) is `comm`.
local function children(pid, comm)
  local found = {}
  for _, child in ipairs(procs.children(pid)) do
    local c = (read_file("/proc/" .. child .. "/comm") or ""):gsub("\n$", "")
    if c == comm and procs.alive(child) then found[#found + 1] = child end
  end
  return found
end

-- Whether this process runs as root: what only root can do (start the agent as another user,
-- mount) is skipped otherwise.
local function am_root()
  return (run("id -u"):gsub("%s+$", "")) == "0"
end

local within = procs.within

local function new_token()
  local f = assert(io.open("/dev/urandom", "rb"))
  local bytes = f:read(32)
  f:close()
  return b64(bytes)
end

local function decode_lines(body)
  local frames = {}
  for line in body:gmatch("([^\n]*)\n") do
    if line ~= "" then frames[#frames + 1] = cjson.decode(line) end
  end
  return frames
end

local function is_terminal(f) return f.t == "exit" or f.t == "error" end

-- Asserts the stream discipline (every line JSON, exactly one terminal frame, last) and
-- returns the frames with stdout/stderr decoded and the terminal frame.
local function check_stream(frames)
  assert.is_true(#frames >= 1, "the stream has no frames")
  for i, f in ipairs(frames) do
    if i < #frames then
      assert.is_false(is_terminal(f), "a terminal frame is not last")
    end
  end
  local last = frames[#frames]
  assert.is_true(is_terminal(last), "the stream does not end with a terminal frame")
  local out, err = {}, {}
  for _, f in ipairs(frames) do
    if f.t == "stdout" then out[#out + 1] = unb64(f.data)
    elseif f.t == "stderr" then err[#err + 1] = unb64(f.data) end
  end
  return last, table.concat(out), table.concat(err)
end

local function sanitizer_report(log)
  return log and (log:find("AddressSanitizer", 1, true) or log:find("runtime error:", 1, true)
    or log:find("LeakSanitizer", 1, true) or log:find("UndefinedBehaviorSanitizer", 1, true))
end

---------------------------------------------------------------------------------------------
-- the agent under test

local Agent = {}
Agent.__index = Agent

-- Starts an agent. opts.args: extra arguments; opts.env: extra environment; opts.no_token: do
-- not pass --token-file; opts.prefix: shell words that exec the agent (e.g. a prlimit, or a
-- wrapper that changes its user or its rights); opts.shared: its root, token and log usable by
-- any user, for an agent run as another one. Returns the agent, or nil and the agent's stderr
-- when it refused.
local function start_agent(opts)
  opts = opts or {}
  assert(AGENT, "set SANDKIT_AGENT to the sandkit-agent binary")
  local dir = tmpdir()
  local root = dir .. "/root"
  -- Here and in stop, sandkit's C core does what a shell and a program would each be started
  -- for: a spec starts agents by the hundred. mkdir(1)'s mode: 0777 less the umask.
  assert(core.mkdir(root, tonumber("777", 8)))
  local token = new_token()
  local token_file = dir .. "/token"
  write_file(token_file, token .. "\n")
  local log = dir .. "/agent.log"
  if opts.shared then
    write_file(log, "")
    assert(files.execute("chmod 755 " .. shell_quote(dir) .. " && chmod 777 " .. shell_quote(root)
      .. " && chmod 644 " .. shell_quote(token_file) .. " && chmod 666 " .. shell_quote(log)))
  end
  local args = { "--root", root, "--ready-fd", "3", "--log", "debug" }
  if not opts.no_token then
    args[#args + 1] = "--token-file"
    args[#args + 1] = token_file
  end
  for _, a in ipairs(opts.args or {}) do args[#args + 1] = a end
  local env = {}
  for k, v in pairs(opts.env or {}) do env[#env + 1] = k .. "=" .. shell_quote(v) end
  local quoted = {}
  for i, a in ipairs(args) do quoted[i] = shell_quote(a) end
  -- fd 3 is the pipe this process reads; the agent's stdout is not, so the pipe ends when
  -- the agent closes fd 3 after writing its one ready line. The shell stays to write the
  -- agent's exit status (128+N for signal N) to a file: a popen's close reports it under
  -- Lua 5.4 but not under LuaJIT.
  local status_file = dir .. "/status"
  local cmd = string.format("env %s %s %s %s 3>&1 1>/dev/null 2>>%s; echo $? >%s", table.concat(env, " "),
    opts.prefix or "", shell_quote(AGENT), table.concat(quoted, " "), shell_quote(log),
    shell_quote(status_file))
  local pipe = assert(io.popen(cmd, "r"))
  local line = pipe:read("*l")
  if not line then
    pipe:close()
    local text, status = read_file(log) or "", tonumber(read_file(status_file))
    core.remove_tree(dir)
    return nil, text, status
  end
  local ready = cjson.decode(line)
  return setmetatable({
    dir = dir, root = root, token = token, token_file = token_file, log = log, pipe = pipe,
    status_file = status_file, port = json.integer(ready.port), pid = json.integer(ready.pid),
    boot_id = ready.bootId,
  }, Agent)
end

-- SIGTERM, then the agent's exit status; asserts its log holds no sanitizer report.
function Agent:stop()
  if not self.pipe then return self.exit_code end
  -- a spec may have killed it already, or it may have ended on its own (a lifetime)
  core.kill(self.pid, core.SIGTERM)
  -- an agent that ignores SIGTERM fails the spec instead of hanging it
  local stopped = within(10, function() return not pid_alive(self.pid) end)
  if not stopped then core.kill(self.pid, core.SIGKILL) end
  self.pipe:close()
  self.pipe = nil
  local log = read_file(self.log)
  assert.is_falsy(sanitizer_report(log), "sanitizer report in the agent's log:\n" .. tostring(log))
  self.exit_code = tonumber(read_file(self.status_file))
  core.remove_tree(self.dir)
  return self.exit_code
end

function Agent:auth()
  return { Authorization = "Bearer " .. self.token }
end

-- One request; body is a table (JSON-encoded) or a string. headers default to the bearer
-- token; pass false for none.
function Agent:req(method, path, body, headers)
  if headers == nil then headers = self:auth() end
  local h = {}
  for k, v in pairs(headers or {}) do h[k] = v end
  if type(body) == "table" then
    body = cjson.encode(body)
    h["Content-Type"] = "application/json"
  end
  local res = assert(raw.request(self.port, method, path, { headers = h, body = body }))
  return res
end

function Agent:json(method, path, body, headers)
  local res = self:req(method, path, body, headers)
  local ok, decoded = pcall(cjson.decode, res.body)
  return res, ok and decoded or nil
end

-- Runs a command to its end over /v1/exec; returns the response and its frames.
function Agent:exec(body, headers)
  local res = self:req("POST", "/v1/exec", body, headers)
  local frames = res.status == 200 and decode_lines(res.body) or {}
  return res, frames
end

-- Opens an exec stream and reads its head; returns the connection, positioned at the body.
function Agent:stream(body)
  local c = assert(raw.connect(self.port))
  local h = self:auth()
  h["Content-Type"] = "application/json"
  assert(c:request("POST", "/v1/exec", h, cjson.encode(body)))
  local status = assert(c:read_head())
  assert.are.equal(200, status)
  return c
end

function Agent:start_job(body)
  return self:json("POST", "/v1/jobs/start", body)
end

function Agent:poll(id, since)
  local body = since and string.format('{"jobId":%s,"sinceSeq":%d}', cjson.encode(id), since)
    or string.format('{"jobId":%s,"sinceSeq":null}', cjson.encode(id))
  return self:json("POST", "/v1/jobs/poll", body)
end

-- Polls with an advancing cursor until reached(page, frames) holds (bounded): true, the last
-- page and every frame seen, in order; false once the bound passed.
function Agent:poll_until(id, seconds, reached)
  local frames, since, page = {}, nil, nil
  local done = within(seconds, function()
    local res
    res, page = self:poll(id, since)
    assert.are.equal(200, res.status, res.body)
    for _, f in ipairs(page.frames) do
      frames[#frames + 1] = f
      since = f.seq
    end
    return reached(page, frames)
  end)
  return done, page, frames
end

-- Polls until the job reports its ending (bounded); returns the last page and every frame.
function Agent:poll_until_done(id, seconds)
  local done, page, frames = self:poll_until(id, seconds or 20, function(p) return p.running == false end)
  assert.is_true(done, "the job did not end in time")
  return page, frames
end

local function vm_rss_kb(pid)
  local status = read_file("/proc/" .. pid .. "/status")
  return tonumber(status:match("VmRSS:%s*(%d+)"))
end

local function wchar(pid)
  local io_ = read_file("/proc/" .. pid .. "/io")
  return io_ and tonumber(io_:match("wchar:%s*(%d+)"))
end

local function frames_data(frames, stream)
  local parts = {}
  for _, f in ipairs(frames) do
    if f.t == stream then parts[#parts + 1] = unb64(f.data) end
  end
  return table.concat(parts)
end

local function ns_link(pid, which)
  local p = assert(io.popen("readlink /proc/" .. pid .. "/ns/" .. which .. " 2>/dev/null"))
  local link = p:read("*l")
  p:close()
  return link
end

--- The host pid of the process whose pid a command printed on the first line of s ($$, $!).
-- Commands see the pids of the agent's namespace for them (src/agent/contain.h), so the number
-- is looked up there; nil once no process of that namespace has it any more.
function Agent:printed_pid(s)
  local pid = tonumber(s:match("^(%d+)\n"))
  assert(pid, "the command printed no pid")
  self.command_ns = self.command_ns or ns_link(self.pid, "pid_for_children")
  for _, name in ipairs(core.listdir("/proc")) do
    local status = name:match("^%d+$") and read_file("/proc/" .. name .. "/status")
    local nspid = status and status:match("\nNSpid:[^\n]-(%d+)%s*\n")
    if tonumber(nspid) == pid and ns_link(name, "pid") == self.command_ns then
      return tonumber(name)
    end
  end
end

return {
  AGENT = AGENT, SANITIZED = files.SANITIZED, DEFAULT_PATH = DEFAULT_PATH, run = run, tmpdir = tmpdir, exists = exists,
  is_dir = is_dir, b64 = b64, unb64 = unb64, pid_alive = pid_alive, within = within,
  new_token = new_token, decode_lines = decode_lines, is_terminal = is_terminal,
  check_stream = check_stream, start_agent = start_agent, vm_rss_kb = vm_rss_kb, wchar = wchar,
  frames_data = frames_data, processes = processes, children = children, am_root = am_root,
}
