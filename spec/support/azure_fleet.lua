--- A fake Azure data plane (support/azure_dataplane, recording every call) whose sandboxes are
-- real sandkit-agent processes on this machine, each started with --require-activation and a
-- per-boot token file: the route it reports is the agent's loopback URL and the credential file
-- at azure.TOKEN_PATH is the agent's token file.
--
--   local fleet = azure_fleet.new()
--   local sb = sandkit.sandbox{ provider = "azure", dataplane = fleet.dataplane, … }
--   fleet:reboot(id)   -- the agent restarts on a new port with a new credential
--   fleet:reboot(id, { same_port = true })   -- … at the same address, as a reboot in place
--   fleet:stop()       -- kills every agent still running

local cjson = require "cjson"
local core = require "sandkit.core"
local json = require "sandkit.json"
local azure = require "sandkit.providers.azure"
local fake_http = require "support.fake_http"
local azure_dataplane = require "support.azure_dataplane"

local azure_fleet = {}

--- Seconds an agent may take to report that it listens.
local START_TIMEOUT = 10

local fleet_mt = {}
fleet_mt.__index = fleet_mt

local function agent_path()
  local path = os.getenv("SANDKIT_AGENT")
  assert(path and path ~= "", "the end-to-end specs need SANDKIT_AGENT=<path to sandkit-agent>")
  return path
end

local temp_dir = require("support.files").temp_dir

--- Starts the agent of sandbox `box` with a fresh credential, on `port` (0: any free one).
local function boot(box, port)
  box.boots = box.boots + 1
  box.token = core.b64encode(core.random(32))
  local token_file = box.dir .. "/token-" .. box.boots
  assert(core.write_private(token_file, box.token))
  local pid, reader = core.spawn({ agent_path(), "--root", box.root, "--token-file", token_file,
    "--require-activation", "--listen", "127.0.0.1:" .. (port or 0), "--ready-fd", "3", "--log", "quiet" },
    { ready_fd = 3, setsid = true, stderr = box.dir .. "/agent.log" })
  assert(pid, reader)
  local line, err = fake_http.read_line(reader, START_TIMEOUT)
  reader:close()
  assert(line, "sandkit-agent did not report that it listens: " .. tostring(err))
  box.pid = pid
  box.port = json.integer(cjson.decode(line).port)
end

local function halt(box)
  if box.pid then
    core.kill(box.pid, core.SIGKILL)
    core.reap(box.pid, true)
    box.pid = nil
  end
end

function azure_fleet.new()
  local fleet = setmetatable({ boxes = {}, made = 0 }, fleet_mt)
  local dp = azure_dataplane.new()
  fleet.dataplane = dp
  dp:on("create_sandbox", function(_, _, spec)
    fleet.made = fleet.made + 1
    local dir = temp_dir()
    local box = { id = "sbx-" .. fleet.made, dir = dir, root = dir .. "/root", boots = 0,
      labels = spec.labels, egress_policy = spec.egress_policy }
    assert(core.mkdir(box.root, 448))
    boot(box)
    fleet.boxes[box.id] = box
    return { id = box.id, state = "Creating" }
  end)
  dp:on("get_sandbox", function(_, _, id)
    local box = fleet.boxes[id]
    if not box then return nil end
    return { id = id, state = "Running", labels = box.labels, egress_policy = box.egress_policy }
  end)
  dp:on("agent_port_url", function(_, _, id, port)
    assert(port == azure.AGENT_PORT)
    local box = fleet.boxes[id]
    return box and ("http://127.0.0.1:" .. box.port .. "/")
  end)
  dp:on("read_file", function(_, _, id, path)
    local box = fleet.boxes[id]
    if box and path == azure.TOKEN_PATH then return box.token end
  end)
  dp:on("delete_sandbox", function(_, _, id)
    local box = fleet.boxes[id]
    if not box then return nil end
    halt(box)
    core.remove_tree(box.dir)
    fleet.boxes[id] = nil
    return true
  end)
  return fleet
end

--- The agent of `id` restarts: a new process, port and credential, awaiting activation.
function fleet_mt:reboot(id, opts)
  local box = assert(self.boxes[id], "no sandbox " .. id)
  local port = opts and opts.same_port and box.port or nil
  halt(box)
  boot(box, port)
end

function fleet_mt:stop()
  for id, box in pairs(self.boxes) do
    halt(box)
    core.remove_tree(box.dir)
    self.boxes[id] = nil
  end
end

return azure_fleet
