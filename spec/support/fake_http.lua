--- Starts spec/support/fake_http_server.lua as a separate process for one spec and talks to
-- it: where it listens, what it received, and stopping it.
--
--   local server = fake_http.start([[ return { handle = function(req, conn) … end } ]])
--   server.url          -- "http://127.0.0.1:<port>"
--   server:requests()   -- every request it received, in order
--   server:stop()

local core = require "sandkit.core"
local cjson = require "cjson"
local files = require "support.files"

local fake_http = {}

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"
-- How long a fake may take to start listening before the spec gives up on it.
local START_TIMEOUT = 10

local server_mt = {}
server_mt.__index = server_mt

local temp_path = files.temp_name

--- Waits for one line on a reader from core.spawn (the child's ready descriptor).
local function read_line(reader, timeout)
  local deadline = core.now() + timeout
  local got = ""
  while true do
    local chunk, err = reader:read()
    if chunk then
      got = got .. chunk
      local line = got:match("^([^\n]*)\n")
      if line then return line end
    elseif chunk == nil then
      return nil, err or ("closed before a line: " .. got)
    else
      local left = deadline - core.now()
      if left <= 0 then return nil, "timed out" end
      core.wait(reader, left)
    end
  end
end
fake_http.read_line = read_line

function fake_http.start(scenario_source)
  local scenario_path = temp_path(".lua")
  local f = assert(io.open(scenario_path, "w"))
  f:write(scenario_source)
  f:close()
  local log_path = temp_path(".log")
  local err_path = temp_path(".err")
  local pid, reader = core.spawn({ LUA, "spec/support/fake_http_server.lua", scenario_path, log_path },
    { ready_fd = 3, stderr = err_path, env = require("support.files").child_env() })
  assert(pid, reader)
  local line, err = read_line(reader, START_TIMEOUT)
  reader:close()
  if not line then
    local e = io.open(err_path)
    local text = e and e:read("a") or ""
    if e then e:close() end
    core.kill(pid, core.SIGKILL)
    error("the fake server did not start: " .. tostring(err) .. "\n" .. text)
  end
  local port = assert(tonumber(line), "bad ready line " .. line)
  return setmetatable({ pid = pid, port = port, url = "http://127.0.0.1:" .. port,
    log_path = log_path, scenario_path = scenario_path, err_path = err_path }, server_mt)
end

function server_mt:requests()
  local list = {}
  local f = io.open(self.log_path)
  if not f then return list end
  for line in f:lines() do
    local entry = cjson.decode(line)
    if entry.method then list[#list + 1] = entry end
  end
  f:close()
  return list
end

--- Requests whose path is `path`.
function server_mt:requests_to(path)
  local list = {}
  for _, r in ipairs(self:requests()) do
    if r.path == path then list[#list + 1] = r end
  end
  return list
end

--- Ends the server's process and keeps its log, which is then whole: nothing more is written.
function server_mt:halt()
  if self.pid then
    core.kill(self.pid, core.SIGKILL)
    core.reap(self.pid, true)
    self.pid = nil
  end
end

function server_mt:stop()
  self:halt()
  os.remove(self.log_path)
  os.remove(self.scenario_path)
  os.remove(self.err_path)
end

--- A fake server naming, in each answer, which of its connections carried the request: how a
-- spec sees which requests shared a connection. `extra` is Lua run first in each request's
-- handler (with req, conn and respond in scope), to answer some paths otherwise.
function fake_http.numbered(extra)
  return fake_http.start([[
    local respond = require "support.respond"
    return {
      accept = function(conn)
        conn.state.n = (conn.state.n or 0) + 1
        conn.number = conn.state.n
      end,
      handle = function(req, conn)
        ]] .. (extra or "") .. [[
        respond.status(conn, "200 OK", tostring(conn.number))
      end,
    }
  ]])
end

return fake_http
