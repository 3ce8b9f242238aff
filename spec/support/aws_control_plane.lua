--- A fake Lambda MicroVMs control plane for specs: the REST shapes of RunMicrovm, GetMicrovm,
-- TerminateMicrovm, Suspend/ResumeMicrovm and CreateMicrovmAuthToken (paths under /2025-09-09),
-- served by fake_http over a real socket, every request recorded.
--
-- Each spec describes the behaviour it needs as plain data; the scenario source is generated
-- from it, so nothing about a test's fake is decided by what the client under test sends.
--
--   local cp = aws_control_plane.start{
--     microvms = { ["mvm-1"] = { imageArn = "sbx-image", state = "RUNNING", endpoint = "…",
--                                imageVersion = "1", omit_id = false,
--                                pending_endpoint = nil, publish_after = nil } },
--       -- with pending_endpoint, the MicroVM reads back with it and state RUNNING from its
--       -- publish_after-th GetMicrovm on
--     run = { microvmId = "mvm-9", state = "PENDING", imageArn = nil (the image asked for),
--             endpoint = nil, publish_after = 1, omit_id = false },
--       -- the run MicroVM reads back with `endpoint` and state RUNNING from its
--       -- publish_after-th GetMicrovm on; without `endpoint` it never publishes one
--     auth_token = { ["X-aws-proxy-auth"] = "jwe-value" },   -- default: a fresh value per mint
--     fail = { GetMicrovm = { status = 429, type = "ThrottlingException", message = "…",
--                             where = "header" | "json" | "code", message_key = "message",
--                             retry_after = "3", body = nil (raw body instead of JSON) } },
--     drop = { RunMicrovm = true },   -- read the request, then close without answering
--   }
--   cp.url, cp:calls(), cp:calls_to("GetMicrovm"), cp:connection_of(call), cp:stop()
-- A call is { operation =, id =, method =, path =, query =, headers =, body =, json =, index = }.

local cjson = require "cjson"

local aws_control_plane = {}

aws_control_plane.PREFIX = "/2025-09-09"

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

--- Which API operation a request is, and the MicroVM id it names.
function aws_control_plane.operation_of(method, path)
  local rest = path:sub(#aws_control_plane.PREFIX + 1)
  if path:sub(1, #aws_control_plane.PREFIX) ~= aws_control_plane.PREFIX then return nil end
  if rest == "/microvms" then
    return method == "POST" and "RunMicrovm" or method == "GET" and "ListMicrovms" or nil
  end
  if rest:match("^/microvm%-images") then return "MicrovmImages" end
  local id, tail = rest:match("^/microvms/([^/]+)(.*)$")
  if not id then return nil end
  id = unescape(id)
  if tail == "" then
    if method == "GET" then return "GetMicrovm", id end
    if method == "DELETE" then return "TerminateMicrovm", id end
  elseif method == "POST" and tail == "/suspend" then return "SuspendMicrovm", id
  elseif method == "POST" and tail == "/resume" then return "ResumeMicrovm", id
  elseif method == "POST" and tail == "/auth-token" then return "CreateMicrovmAuthToken", id
  end
  return nil, id
end

-- Server side: runs inside the fake_http_server process. ------------------------------------

local function copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = type(v) == "table" and copy(v) or v end
  return out
end

--- The scenario table for fake_http_server, from a decoded config.
function aws_control_plane.scenario(config)
  local respond = require "support.respond"

  local function answer(conn, status, value, extra_headers)
    local body = value == nil and "" or cjson.encode(value)
    local lines = { string.format("HTTP/1.1 %s", status), "Content-Type: application/json",
      "Content-Length: " .. #body, "x-amzn-RequestId: fake-request" }
    for name, v in pairs(extra_headers or {}) do lines[#lines + 1] = name .. ": " .. v end
    conn:write(table.concat(lines, "\r\n") .. "\r\n\r\n" .. body)
  end

  local function failure(conn, spec)
    local status = string.format("%d Error", spec.status or 400)
    local headers = {}
    if spec.retry_after then headers["Retry-After"] = spec.retry_after end
    if spec.body then
      local lines = { "HTTP/1.1 " .. status, "Content-Type: application/json",
        "Content-Length: " .. #spec.body }
      for name, v in pairs(headers) do lines[#lines + 1] = name .. ": " .. v end
      return conn:write(table.concat(lines, "\r\n") .. "\r\n\r\n" .. spec.body)
    end
    local value = {}
    local where = spec.where or "json"
    if where == "header" then
      headers["x-amzn-ErrorType"] = spec.type .. ":http://internal.amazon.com/coral/com.amazonaws.lambda/"
    elseif where == "code" then
      value.code = spec.type
    elseif spec.type then
      value.__type = "com.amazonaws.lambda#" .. spec.type
    end
    value[spec.message_key or "message"] = spec.message
    answer(conn, status, value, headers)
  end

  local function not_found(conn, id)
    answer(conn, "404 Not Found", { __type = "ResourceNotFoundException",
      message = "MicroVM " .. tostring(id) .. " not found" },
      { ["x-amzn-ErrorType"] = "ResourceNotFoundException" })
  end

  local function shape(id, vm)
    local out = { state = vm.state, endpoint = vm.endpoint, imageArn = vm.imageArn,
      imageVersion = vm.imageVersion }
    if not vm.omit_id then out.microvmId = id end
    return out
  end

  local function init(state)
    if state.vms then return end
    state.vms = copy(config.microvms or {})
    state.reads, state.runs, state.mints = {}, 0, 0
  end

  return {
    accept = function(conn)
      conn.state.connections = (conn.state.connections or 0) + 1
      conn.id = conn.state.connections
      return true
    end,
    handle = function(req, conn)
      local state = conn.state
      init(state)
      conn:log{ request = req.index, connection = conn.id }
      local operation, id = aws_control_plane.operation_of(req.method, req.path)
      if operation and config.drop and config.drop[operation] then return conn:close() end
      local fail = operation and config.fail and config.fail[operation]
      if fail then return failure(conn, fail) end

      if operation == "RunMicrovm" then
        local body = cjson.decode(req.body)
        local run = config.run or {}
        state.runs = state.runs + 1
        local new_id = run.microvmId or ("mvm-" .. state.runs)
        local vm = { state = run.state or "PENDING", imageArn = run.imageArn or body.imageIdentifier,
          imageVersion = body.imageVersion, omit_id = run.omit_id, pending_endpoint = run.endpoint,
          publish_after = run.publish_after or 1 }
        state.vms[new_id] = vm
        state.reads[new_id] = 0
        return answer(conn, "200 OK", shape(new_id, vm))
      elseif operation == "GetMicrovm" then
        local vm = state.vms[id]
        if not vm then return not_found(conn, id) end
        state.reads[id] = (state.reads[id] or 0) + 1
        if vm.pending_endpoint and state.reads[id] >= (vm.publish_after or 1) then
          vm.endpoint, vm.pending_endpoint, vm.state = vm.pending_endpoint, nil, "RUNNING"
        end
        return answer(conn, "200 OK", shape(id, vm))
      elseif operation == "TerminateMicrovm" then
        local vm = state.vms[id]
        if not vm then return not_found(conn, id) end
        vm.state, vm.endpoint, vm.pending_endpoint = "TERMINATED", nil, nil
        return answer(conn, "200 OK", shape(id, vm))
      elseif operation == "SuspendMicrovm" or operation == "ResumeMicrovm" then
        local vm = state.vms[id]
        if not vm then return not_found(conn, id) end
        vm.state = operation == "SuspendMicrovm" and "SUSPENDED" or "RUNNING"
        return answer(conn, "202 Accepted", {})
      elseif operation == "CreateMicrovmAuthToken" then
        if not state.vms[id] then return not_found(conn, id) end
        state.mints = state.mints + 1
        local token = config.auth_token or { ["X-aws-proxy-auth"] = "token-" .. state.mints }
        return answer(conn, "200 OK", { authToken = token })
      elseif operation == "ListMicrovms" then
        return answer(conn, "200 OK", { items = {} })
      end
      respond.json(conn, "400 Bad Request", { __type = "UnknownOperationException",
        message = "no such route " .. req.method .. " " .. req.path })
    end,
  }
end

-- Spec side. ---------------------------------------------------------------------------------

local control_plane_mt = {}
control_plane_mt.__index = control_plane_mt

function aws_control_plane.start(config)
  local fake_http = require "support.fake_http"
  local encoded = cjson.encode(config or {})
  assert(not encoded:find("]==]", 1, true), "the config cannot be embedded")
  local source = "local cjson = require 'cjson'\n"
    .. "local config = cjson.decode([==[" .. encoded .. "]==])\n"
    .. "return require('support.aws_control_plane').scenario(config)\n"
  local server = fake_http.start(source)
  return setmetatable({ server = server, url = server.url }, control_plane_mt)
end

--- Every request received, in order, as API calls.
function control_plane_mt:calls()
  local calls = {}
  for _, r in ipairs(self.server:requests()) do
    local operation, id = aws_control_plane.operation_of(r.method, r.path)
    calls[#calls + 1] = { operation = operation or "unknown", id = id, method = r.method,
      path = r.path, query = r.query, headers = r.headers, body = r.body, index = r.index,
      json = r.body ~= "" and cjson.decode(r.body) or nil }
  end
  return calls
end

function control_plane_mt:calls_to(operation)
  local list = {}
  for _, call in ipairs(self:calls()) do
    if call.operation == operation then list[#list + 1] = call end
  end
  return list
end

--- The operations received, in order: { "RunMicrovm", "GetMicrovm", … }.
function control_plane_mt:operations()
  local list = {}
  for i, call in ipairs(self:calls()) do list[i] = call.operation end
  return list
end

--- The number of the connection a call arrived on (1 for the first accepted).
function control_plane_mt:connection_of(call)
  local f = assert(io.open(self.server.log_path))
  for line in f:lines() do
    local entry = cjson.decode(line)
    if entry.request == call.index then
      f:close()
      return entry.connection
    end
  end
  f:close()
  return nil
end

function control_plane_mt:stop()
  self.server:stop()
end

return aws_control_plane
