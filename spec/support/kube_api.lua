--- A fake Kubernetes API server with agent-sandbox's resources and a fake controller, run as
-- the scenario of spec/support/fake_http_server.lua (one process, cqueues), behind the TLS
-- front spec/support/kube_cluster.lua starts. It speaks what sandkit and python-kubernetes
-- read: real Status bodies, chunked watches with resource versions (410 once compacted),
-- label and field selectors, list pages with continue tokens, delete preconditions, the
-- pods/{name}:{port}/proxy route (which drops Authorization, as the API server does), and
-- agent-sandbox's router (X-Sandbox-* headers, Authorization dropped).
--
-- The controller binds each claim of a configured warm pool to a Sandbox and a Pod, and
-- starts a real sandkit-agent per pod in capability mode, the pod's UID as its session id, on
-- its own loopback address 127.a.b.c port 8971 (the pod IP).
--
-- Authentication: a bearer token from `tokens` (token -> user), or a client certificate that
-- the TLS front verified (it passes X-Fake-Client-Verify/-Subject) with a CN in `client_cns`.
-- config.faults (each a count of requests it applies to, unless said otherwise):
--   drop_create = "committed" | "uncommitted"  close the create's connection without an
--                                              answer, after or before storing the claim
--   create_status = 504              store the claim, then answer this status with a 5xx page
--   watch_gone_status, watch_gone_event, watch_drop   the first N watches answer 410, send
--                                              an ERROR 410 event, or drop mid-stream
--   watch_seconds = s                every watch ends cleanly (its last chunk sent) after at
--                                    most s seconds, as an API server ends one at its
--                                    timeout, whatever timeoutSeconds asked
--   delete_pending = true            a DELETE leaves the claim in place with its
--                                    deletionTimestamp (as a finalizer holds it) and answers
--                                    202 Accepted
--   list_fail = { [page] = 503 | "html" }      a list page answers a Status 503 or a 502 page
--   page_size = n                    list pages hold at most n items whatever the limit
--                                    (Kubernetes may answer fewer than asked, continue set)
--   forbid = { ["create sandboxclaims"] = true }   403 Forbidden, as RBAC words it
--   allow = { ["get pods"] = true, … }   403 for every verb and resource not listed (a Role)
--   throttle = { ["list sandboxclaims"] = 1 }      429 with Retry-After
-- pools: { [name] = { bind_delay, ready_delay, never_ready, expire_before_ready,
--                     fail_reason = "TemplateNotFound" (Ready=False with it, never bound),
--                     foreign_owner (the Sandbox's controller is another claim),
--                     foreign_pod_owner (the pod's controller is another Sandbox),
--                     pod_name_annotation } }
-- Control routes (no authentication): POST /_fake/tokens {tokens}, POST /_fake/recreate
-- {pod, same_ip}, POST /_fake/condition {claim, status, reason, message}, POST /_fake/disown
-- {claim, link = "sandbox" | "pod"} (that object's controller becomes another object),
-- GET /_fake/state, POST /_fake/shutdown.

local cjson = require "cjson"
local cqueues = require "cqueues"
local condition = require "cqueues.condition"
local socket = require "cqueues.socket"
local core = require "sandkit.core"
local files = require "support.files"

local kube_api = {}

kube_api.AGENT_PORT = 8971
kube_api.CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1"
kube_api.SANDBOXES = "/apis/agents.x-k8s.io/v1beta1"

local KINDS = {
  sandboxclaims = { prefix = kube_api.CLAIMS, api_version = "extensions.agents.x-k8s.io/v1beta1",
    kind = "SandboxClaim", group = "extensions.agents.x-k8s.io" },
  sandboxes = { prefix = kube_api.SANDBOXES, api_version = "agents.x-k8s.io/v1beta1",
    kind = "Sandbox", group = "agents.x-k8s.io" },
  pods = { prefix = "/api/v1", api_version = "v1", kind = "Pod", group = "" },
}

local PHRASES = { [200] = "OK", [201] = "Created", [202] = "Accepted", [400] = "Bad Request", [401] = "Unauthorized",
  [403] = "Forbidden", [404] = "Not Found", [409] = "Conflict", [410] = "Gone",
  [422] = "Unprocessable Entity", [429] = "Too Many Requests", [500] = "Internal Server Error",
  [502] = "Bad Gateway", [503] = "Service Unavailable", [504] = "Gateway Timeout" }

local function copy(v)
  if type(v) ~= "table" then return v end
  local out = {}
  for k, x in pairs(v) do out[k] = copy(x) end
  return out
end

local function uuid()
  local b = { core.random(16):byte(1, 16) }
  b[7] = b[7] % 16 + 64
  b[9] = b[9] % 64 + 128
  local h = {}
  for i = 1, 16 do h[i] = string.format("%02x", b[i]) end
  return table.concat(h, "", 1, 4) .. "-" .. table.concat(h, "", 5, 6) .. "-"
    .. table.concat(h, "", 7, 8) .. "-" .. table.concat(h, "", 9, 10) .. "-" .. table.concat(h, "", 11, 16)
end

local function now_text()
  return os.date("!%Y-%m-%dT%H:%M:%SZ")
end

local function unescape(s)
  return (s:gsub("+", " "):gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function parse_query(q)
  local out = {}
  for pair in (q or ""):gmatch("[^&]+") do
    local k, v = pair:match("^([^=]*)=?(.*)$")
    out[unescape(k)] = unescape(v)
  end
  return out
end

--- A boolean query parameter as Go's strconv.ParseBool reads it, as the API server does.
local TRUE = { ["1"] = true, t = true, T = true, TRUE = true, ["true"] = true, True = true }

local function own_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("*n")
  f:close()
  return pid
end

function kube_api.scenario(config)
  local faults = config.faults or {}
  local S = {
    rv = 100, objects = { sandboxclaims = {}, sandboxes = {}, pods = {} }, log = {},
    compacted = 0, watchers = {}, counts = {}, tokens = config.tokens or {},
    agents = {}, next_host = 2,
  }
  local pid = own_pid()
  -- Pod addresses: 127.a.b.c, with a and b from this process's id, so that concurrent runs
  -- of the suite use different addresses; a taken one is skipped.
  local net_a, net_b = 10 + pid % 240, math.floor(pid / 240) % 256
  local record_log

  local function count(key)
    S.counts[key] = (S.counts[key] or 0) + 1
    return S.counts[key]
  end

  local function bump(obj)
    S.rv = S.rv + 1
    obj.metadata.resourceVersion = tostring(S.rv)
  end

  -- Answers --------------------------------------------------------------------------------

  local function send(conn, code, body, content_type, headers)
    local lines = { string.format("HTTP/1.1 %d %s", code, PHRASES[code] or "Status"),
      "Content-Type: " .. (content_type or "application/json"), "Content-Length: " .. #body }
    for k, v in pairs(headers or {}) do lines[#lines + 1] = k .. ": " .. v end
    conn:write(table.concat(lines, "\r\n") .. "\r\n\r\n" .. body)
  end

  local function status_body(code, reason, message, details)
    local st = { kind = "Status", apiVersion = "v1", metadata = {}, status = "Failure",
      message = message, reason = reason, code = code }
    if details then st.details = details end
    return st
  end

  local function status(conn, code, reason, message, details, headers)
    send(conn, code, cjson.encode(status_body(code, reason, message, details)), nil, headers)
  end

  local function qualified(resource)
    local g = KINDS[resource].group
    return g ~= "" and (resource .. "." .. g) or resource
  end

  local function not_found(conn, resource, name)
    status(conn, 404, "NotFound", string.format('%s "%s" not found', qualified(resource), name),
      { name = name, group = KINDS[resource].group, kind = resource })
  end

  -- Storage and events -----------------------------------------------------------------------

  local function store(resource, ns)
    local s = S.objects[resource]
    s[ns] = s[ns] or {}
    return s[ns]
  end

  local function label_match(labels, selector)
    labels = labels or {}
    for term in (selector or ""):gmatch("[^,]+") do
      local k, op, v = term:match("^%s*([^!=%s]+)%s*([!=]=?)%s*(.-)%s*$")
      if k then
        if op == "!=" then
          if labels[k] == v then return false end
        elseif labels[k] ~= v then
          return false
        end
      else
        local neg, key = term:match("^%s*(!?)([^%s]+)%s*$")
        if (neg == "!") == (labels[key] ~= nil) then return false end
      end
    end
    return true
  end

  --- A field selector as { [field] = value }, or nil and the unsupported field.
  local function field_selector(text)
    local out = {}
    for term in (text or ""):gmatch("[^,]+") do
      local k, v = term:match("^%s*([^=]+)==?(.*)$")
      if k ~= "metadata.name" and k ~= "metadata.namespace" then return nil, tostring(k) end
      out[k] = v
    end
    return out
  end

  local function matches(w, resource, obj)
    if w.resource ~= resource or obj.metadata.namespace ~= w.ns then return false end
    if w.fields["metadata.name"] and obj.metadata.name ~= w.fields["metadata.name"] then return false end
    return label_match(obj.metadata.labels, w.labels)
  end

  local function emit(resource, kind, obj)
    local event = { rv = tonumber(obj.metadata.resourceVersion), resource = resource,
      type = kind, object = copy(obj) }
    S.log[#S.log + 1] = event
    for w in pairs(S.watchers) do
      if matches(w, resource, obj) then
        w.queue[#w.queue + 1] = event
        w.cond:signal()
      end
    end
  end

  local function put(resource, obj, kind)
    bump(obj)
    store(resource, obj.metadata.namespace)[obj.metadata.name] = obj
    emit(resource, kind, obj)
  end

  local function remove(resource, obj)
    store(resource, obj.metadata.namespace)[obj.metadata.name] = nil
    obj.metadata.deletionTimestamp = now_text()
    bump(obj)
    emit(resource, "DELETED", obj)
  end

  -- Agents (the pods' sandkit-agents) ---------------------------------------------------------

  local function read_line(reader, timeout)
    local deadline = cqueues.monotime() + timeout
    local got = ""
    while true do
      local chunk = reader:read()
      if chunk then
        got = got .. chunk
        local line = got:match("^([^\n]*)\n")
        if line then return line end
      elseif chunk == nil then
        return nil
      else
        local left = deadline - cqueues.monotime()
        if left <= 0 then return nil end
        cqueues.poll(reader, left)
      end
    end
  end

  --- Starts a pod's agent: { pid, ip, dir }. `ip` asks for that address (a pod recreated in
  -- place); otherwise the next free one.
  local function start_agent(pod_uid, ip)
    for _ = 1, 40 do
      local addr = ip
      if not addr then
        addr = string.format("127.%d.%d.%d", net_a, net_b, S.next_host)
        S.next_host = S.next_host % 253 + 2
      end
      local dir = files.temp_dir()
      assert(core.mkdir(dir .. "/root", 448))
      local apid, reader = core.spawn({ config.agent, "--root", dir .. "/root", "--auth", "capability",
        "--session-id", pod_uid, "--public-keys", config.public_keys,
        "--listen", addr .. ":" .. kube_api.AGENT_PORT, "--ready-fd", "3", "--log", "quiet" },
        { ready_fd = 3, setsid = true, stderr = dir .. "/agent.log" })
      assert(apid, reader)
      local line = read_line(reader, 10)
      -- cqueues still watches the descriptor it polled: it must forget it before it closes.
      cqueues.cancel(reader:pollfd())
      reader:close()
      if line then
        local agent = { pid = apid, ip = addr, dir = dir }
        S.agents[pod_uid] = agent
        record_log{ agent_pid = apid, agent_dir = dir, pod_uid = pod_uid, ip = addr }
        return agent
      end
      -- Most likely the address is taken (another run, or the agent before this one still
      -- closing): the next one, or the same after a moment.
      core.kill(apid, core.SIGKILL)
      core.reap(apid, true)
      core.remove_tree(dir)
      if ip then cqueues.sleep(0.05) end
    end
    error("no sandkit-agent could be started for pod " .. pod_uid)
  end

  local function stop_agent(pod_uid)
    local agent = S.agents[pod_uid]
    if not agent then return end
    S.agents[pod_uid] = nil
    core.kill(agent.pid, core.SIGTERM)
    local deadline = cqueues.monotime() + 5
    while not core.reap(agent.pid) do
      if cqueues.monotime() > deadline then
        core.kill(agent.pid, core.SIGKILL)
        core.reap(agent.pid, true)
        break
      end
      cqueues.sleep(0.01)
    end
    core.remove_tree(agent.dir)
  end

  -- The controller -------------------------------------------------------------------------------

  local function set_condition(claim, cstatus, reason, message)
    claim.status = claim.status or {}
    claim.status.conditions = { { type = "Ready", status = cstatus, reason = reason,
      message = message, lastTransitionTime = now_text(),
      observedGeneration = claim.metadata.generation } }
  end

  local function current(resource, ns, name, uid)
    local obj = store(resource, ns)[name]
    if obj and obj.metadata.uid == uid then return obj end
  end

  local function bind(claim_ref)
    local ns, name, uid = claim_ref.ns, claim_ref.name, claim_ref.uid
    local pool_name = claim_ref.pool
    local pool = config.pools and config.pools[pool_name]
    cqueues.sleep(pool and pool.bind_delay or 0.02)
    local claim = current("sandboxclaims", ns, name, uid)
    if not claim then return end
    if not pool then
      set_condition(claim, "False", "WarmPoolNotFound", string.format('SandboxWarmPool "%s" not found', pool_name))
      return put("sandboxclaims", claim, "MODIFIED")
    end
    if pool.expire_before_ready then
      set_condition(claim, "False", "ClaimExpired", "Claim expired. Sandbox cleanup initiated.")
      return put("sandboxclaims", claim, "MODIFIED")
    end
    if pool.fail_reason then
      set_condition(claim, "False", pool.fail_reason, pool.fail_reason .. " for warm pool " .. pool_name)
      return put("sandboxclaims", claim, "MODIFIED")
    end
    local sb_name = pool_name .. "-" .. uuid():sub(1, 5)
    local pod_name = pool.pod_name_annotation and (sb_name .. "-pod") or sb_name
    local sandbox = { apiVersion = KINDS.sandboxes.api_version, kind = "Sandbox",
      metadata = { name = sb_name, namespace = ns, uid = uuid(), creationTimestamp = now_text(),
        generation = 1, ownerReferences = { { apiVersion = KINDS.sandboxclaims.api_version,
          kind = "SandboxClaim", name = name, uid = pool.foreign_owner and uuid() or uid,
          controller = true, blockOwnerDeletion = true } },
        annotations = pool.pod_name_annotation and { ["agents.x-k8s.io/pod-name"] = pod_name } or nil },
      spec = { podTemplate = { spec = { containers = { { name = "agent", image = "sandkit-agent" } } } } } }
    put("sandboxes", sandbox, "ADDED")
    claim.status = claim.status or {}
    claim.status.sandbox = { name = sb_name }
    set_condition(claim, "False", "SandboxNotReady", "Sandbox is not ready")
    put("sandboxclaims", claim, "MODIFIED")

    local pod_uid = uuid()
    local agent = start_agent(pod_uid)
    local pod = { apiVersion = "v1", kind = "Pod",
      metadata = { name = pod_name, namespace = ns, uid = pod_uid, creationTimestamp = now_text(),
        labels = { ["agents.x-k8s.io/claim-uid"] = uid },
        ownerReferences = { { apiVersion = KINDS.sandboxes.api_version, kind = "Sandbox",
          name = sb_name, uid = pool.foreign_pod_owner and uuid() or sandbox.metadata.uid,
          controller = true, blockOwnerDeletion = true } } },
      spec = { containers = { { name = "agent", image = "sandkit-agent" } } },
      status = { phase = "Running", podIP = agent.ip, podIPs = { { ip = agent.ip } },
        conditions = { { type = "Ready", status = "True" } } } }
    put("pods", pod, "ADDED")
    if pool.never_ready then return end
    cqueues.sleep(pool.ready_delay or 0.02)
    claim = current("sandboxclaims", ns, name, uid)
    if not claim then return end
    claim.status.sandbox.podIPs = { agent.ip }
    set_condition(claim, "True", "DependenciesReady", "Pod is Ready; Service Exists")
    put("sandboxclaims", claim, "MODIFIED")
  end

  --- What Background propagation does once the claim is gone: its Sandbox, then the pod.
  local function collect(claim_uid)
    cqueues.sleep(0.01)
    for _, sb in pairs(copy(S.objects.sandboxes)) do
      for sname, sandbox in pairs(sb) do
        local ref = sandbox.metadata.ownerReferences[1]
        if ref.uid == claim_uid then
          remove("sandboxes", store("sandboxes", sandbox.metadata.namespace)[sname])
          for pname, pod in pairs(copy(store("pods", sandbox.metadata.namespace))) do
            if pod.metadata.ownerReferences[1].uid == sandbox.metadata.uid then
              stop_agent(pod.metadata.uid)
              remove("pods", store("pods", sandbox.metadata.namespace)[pname])
            end
          end
        end
      end
    end
  end

  -- Authentication and authorization ---------------------------------------------------------

  local function authenticate(req)
    local authz = req.headers.authorization
    if authz then
      local token = authz:match("^Bearer (.+)$")
      return token and S.tokens[token]
    end
    if req.headers["x-fake-client-verify"] == "SUCCESS" then
      local cn = (req.headers["x-fake-client-subject"] or ""):match("CN=([^,/]+)")
      if cn and config.client_cns and config.client_cns[cn] then return cn end
    end
    return nil
  end

  local function forbidden(conn, user, verb, resource, ns)
    local g = KINDS[resource:match("^[^/]+")].group
    local base, sub = resource:match("^([^/]+)/?(.*)$")
    status(conn, 403, "Forbidden", string.format('%s is forbidden: User "%s" cannot %s resource "%s"%s '
      .. 'in API group "%s" in the namespace "%s"', qualified(base), user, verb, base,
      sub ~= "" and (' with subresource "' .. sub .. '"') or "", g, ns), { kind = base, group = g })
  end

  -- Lists and watches ------------------------------------------------------------------------------

  local function encode_list(resource, items, continue)
    local parts = {}
    for i, obj in ipairs(items) do parts[i] = cjson.encode(obj) end
    local md = { resourceVersion = tostring(S.rv) }
    if continue then md.continue = continue end
    return '{"kind":"' .. KINDS[resource].kind .. 'List","apiVersion":"' .. KINDS[resource].api_version
      .. '","metadata":' .. cjson.encode(md) .. ',"items":[' .. table.concat(parts, ",") .. "]}"
  end

  local function list(conn, resource, ns, q)
    local fields, bad = field_selector(q.fieldSelector)
    if not fields then
      return status(conn, 400, "BadRequest", '"' .. bad .. '" is not a known field selector: only '
        .. '"metadata.name", "metadata.namespace"')
    end
    local names = {}
    for name, obj in pairs(store(resource, ns)) do
      if label_match(obj.metadata.labels, q.labelSelector)
          and (not fields["metadata.name"] or fields["metadata.name"] == name) then
        names[#names + 1] = name
      end
    end
    table.sort(names)
    local after, page = "", 1
    if q.continue and q.continue ~= "" then
      local decoded = core.b64decode(q.continue)
      local p, last = (decoded or ""):match("^(%d+)\n(.*)$")
      if not p then return status(conn, 400, "BadRequest", "continue key is not valid") end
      page, after = tonumber(p) + 1, last
    end
    local fail = faults.list_fail and (faults.list_fail[page] or faults.list_fail[tostring(page)])
    if fail == "html" then
      return send(conn, 502, "<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
    elseif fail then
      return status(conn, fail, "ServiceUnavailable", "the server is currently unable to handle the request")
    end
    local limit = tonumber(q.limit or "") or 0
    if faults.page_size and (limit == 0 or limit > faults.page_size) then limit = faults.page_size end
    local items = {}
    local more = false
    for _, name in ipairs(names) do
      if name > after then
        if limit > 0 and #items >= limit then more = true break end
        items[#items + 1] = store(resource, ns)[name]
      end
    end
    local continue = more and core.b64encode(page .. "\n" .. items[#items].metadata.name) or nil
    send(conn, 200, encode_list(resource, items, continue))
  end

  local function watch_events(conn, resource, ns, q)
    local n = count("watch")
    if n <= (faults.watch_gone_status or 0) then
      return status(conn, 410, "Expired", "too old resource version: " .. tostring(q.resourceVersion)
        .. " (" .. S.rv .. ")")
    end
    local fields, bad = field_selector(q.fieldSelector)
    if not fields then return status(conn, 400, "BadRequest", '"' .. bad .. '" is not a known field selector') end
    local w = { resource = resource, ns = ns, fields = fields, labels = q.labelSelector, queue = {},
      cond = condition.new() }
    local from = tonumber(q.resourceVersion or "0") or 0
    conn:write("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    local function chunk(value)
      local line = cjson.encode(value) .. "\n"
      conn:write(string.format("%x\r\n%s\r\n", #line, line))
    end
    if n <= (faults.watch_gone_status or 0) + (faults.watch_gone_event or 0) or (from > 0 and from < S.compacted) then
      chunk{ type = "ERROR", object = status_body(410, "Expired", "too old resource version: " .. from
        .. " (" .. S.rv .. ")") }
      return conn:write("0\r\n\r\n")
    end
    if from == 0 then
      local names = {}
      for name in pairs(store(resource, ns)) do names[#names + 1] = name end
      table.sort(names)
      for _, name in ipairs(names) do
        local obj = store(resource, ns)[name]
        if matches(w, resource, obj) then w.queue[#w.queue + 1] = { type = "ADDED", object = copy(obj) } end
      end
    else
      for _, event in ipairs(S.log) do
        if event.rv > from and matches(w, resource, event.object) then w.queue[#w.queue + 1] = event end
      end
    end
    S.watchers[w] = true
    -- A bookmark promises every event up to its version was sent: so only after the replay.
    while #w.queue > 0 do
      local event = table.remove(w.queue, 1)
      chunk{ type = event.type, object = event.object }
    end
    if TRUE[q.allowWatchBookmarks or ""] then
      chunk{ type = "BOOKMARK", object = { kind = KINDS[resource].kind, apiVersion = KINDS[resource].api_version,
        metadata = { resourceVersion = tostring(S.rv) } } }
    end
    -- A dropped watch ends mid-stream, without its last chunk: the connection just closes.
    if n <= (faults.watch_gone_status or 0) + (faults.watch_gone_event or 0) + (faults.watch_drop or 0) then
      S.watchers[w] = nil
      return conn:close()
    end
    local seconds = tonumber(q.timeoutSeconds or "") or 1800
    if faults.watch_seconds then seconds = math.min(seconds, faults.watch_seconds) end
    local deadline = cqueues.monotime() + seconds
    while not conn.closed do
      if #w.queue == 0 then
        local left = deadline - cqueues.monotime()
        if left <= 0 then break end
        w.cond:wait(left)
      else
        local event = table.remove(w.queue, 1)
        chunk{ type = event.type, object = event.object }
      end
    end
    S.watchers[w] = nil
    conn:write("0\r\n\r\n")
  end

  -- Relays (the pods proxy and the router) ----------------------------------------------------

  local HOP = { authorization = true, host = true, connection = true, ["content-length"] = true,
    ["transfer-encoding"] = true, ["x-fake-client-verify"] = true, ["x-fake-client-subject"] = true,
    ["x-fake-sni"] = true, ["x-fake-host"] = true, ["x-sandbox-id"] = true, ["x-sandbox-namespace"] = true,
    ["x-sandbox-port"] = true, ["x-sandbox-pod-ip"] = true }

  local function relay(req, conn, ip, port, target)
    local s = socket.connect{ host = ip, port = port }
    s:setmode("b", "b")
    if not s:connect(3) then
      return status(conn, 503, "ServiceUnavailable", "error trying to reach service: dial tcp "
        .. ip .. ":" .. port .. ": connect: connection refused")
    end
    local lines = { req.method .. " " .. target .. " HTTP/1.1", "Host: " .. ip .. ":" .. port,
      "Connection: close", "Content-Length: " .. #req.body }
    for k, v in pairs(req.headers) do
      if not HOP[k] then lines[#lines + 1] = k .. ": " .. v end
    end
    s:write(table.concat(lines, "\r\n") .. "\r\n\r\n" .. req.body)
    s:flush()
    while true do
      local data = s:read("-65536")
      if not data then break end
      conn:write(data)
    end
    s:close()
    conn:close()
  end

  local function router(req, conn)
    if config.router_token and req.headers.authorization ~= "Bearer " .. config.router_token then
      return send(conn, 401, '{"detail":"Missing or invalid Authorization header."}')
    end
    local ip = req.headers["x-sandbox-pod-ip"]
    local port = tonumber(req.headers["x-sandbox-port"] or "")
    if not ip or not port then return send(conn, 400, '{"detail":"Invalid routing headers."}') end
    record_log{ routed = req.headers["x-sandbox-id"], namespace = req.headers["x-sandbox-namespace"] }
    relay(req, conn, ip, port, req.target)
  end

  -- Objects ------------------------------------------------------------------------------------

  local function create_claim(req, conn, ns)
    local ok, body = pcall(cjson.decode, req.body)
    if not ok or type(body) ~= "table" then return status(conn, 400, "BadRequest", "the body is not JSON") end
    if body.kind ~= "SandboxClaim" or body.apiVersion ~= KINDS.sandboxclaims.api_version then
      return status(conn, 400, "BadRequest", "the object is not a " .. KINDS.sandboxclaims.api_version
        .. " SandboxClaim")
    end
    local md = type(body.metadata) == "table" and body.metadata or {}
    local name = md.name
    if type(name) ~= "string" or #name > 253 or not name:match("^[a-z0-9][a-z0-9%-%.]*$") or name:match("[%-%.]$") then
      return status(conn, 422, "Invalid", string.format('SandboxClaim.extensions.agents.x-k8s.io "%s" '
        .. "is invalid: metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of "
        .. "lower case alphanumeric characters, '-' or '.'", tostring(name)),
        { name = tostring(name), group = KINDS.sandboxclaims.group, kind = "SandboxClaim" })
    end
    local spec = type(body.spec) == "table" and body.spec or {}
    if type(spec.warmPoolRef) ~= "table" or type(spec.warmPoolRef.name) ~= "string" then
      return status(conn, 422, "Invalid", string.format('SandboxClaim.extensions.agents.x-k8s.io "%s" '
        .. "is invalid: spec.warmPoolRef.name: Required value", name))
    end
    if store("sandboxclaims", ns)[name] then
      return status(conn, 409, "AlreadyExists",
        string.format('sandboxclaims.extensions.agents.x-k8s.io "%s" already exists', name),
        { name = name, group = KINDS.sandboxclaims.group, kind = "sandboxclaims" })
    end
    local n = count("create")
    if faults.drop_create == "uncommitted" and n == 1 then return conn:close() end
    md.namespace, md.uid, md.creationTimestamp, md.generation = ns, uuid(), now_text(), 1
    body.metadata = md
    put("sandboxclaims", body, "ADDED")
    cqueues.running():wrap(function()
      bind{ ns = ns, name = name, uid = md.uid, pool = spec.warmPoolRef.name }
    end)
    if faults.drop_create == "committed" and n == 1 then return conn:close() end
    if faults.create_status and n == 1 then
      return send(conn, faults.create_status, "<html><body>upstream timed out</body></html>", "text/html")
    end
    send(conn, 201, cjson.encode(body))
  end

  local function delete_claim(req, conn, ns, name)
    local claim = store("sandboxclaims", ns)[name]
    if not claim then return not_found(conn, "sandboxclaims", name) end
    local ok, opts = pcall(cjson.decode, req.body ~= "" and req.body or "{}")
    opts = ok and type(opts) == "table" and opts or {}
    local pre = type(opts.preconditions) == "table" and opts.preconditions.uid
    if pre and pre ~= claim.metadata.uid then
      return status(conn, 409, "Conflict", string.format('Operation cannot be fulfilled on '
        .. 'sandboxclaims.extensions.agents.x-k8s.io "%s": Precondition failed: UID in precondition: '
        .. '%s, UID in object meta: %s', name, pre, claim.metadata.uid),
        { name = name, group = KINDS.sandboxclaims.group, kind = "sandboxclaims" })
    end
    record_log{ deleted = name, propagation = opts.propagationPolicy, precondition = pre or nil }
    if faults.delete_pending then
      -- A finalizer holds it: marked, still there, its deletion accepted but not done.
      claim.metadata.deletionTimestamp = claim.metadata.deletionTimestamp or now_text()
      put("sandboxclaims", claim, "MODIFIED")
      return send(conn, 202, cjson.encode(claim))
    end
    remove("sandboxclaims", claim)
    local uid = claim.metadata.uid
    cqueues.running():wrap(function() collect(uid) end)
    send(conn, 200, cjson.encode(claim))
  end

  --- Routes a request under /api or /apis: resource, namespace, name, subresource, or nil.
  local function route(path)
    for resource, k in pairs(KINDS) do
      local prefix = k.prefix .. "/namespaces/"
      if path:sub(1, #prefix) == prefix then
        local ns, rest = path:sub(#prefix + 1):match("^([^/]+)/(.*)$")
        if ns then
          local res, name, sub = rest:match("^([^/]+)/?([^/]*)/?(.*)$")
          if res == resource then return resource, ns, name ~= "" and name or nil, sub end
        end
      end
    end
  end

  local function control(req, conn)
    local body = req.body ~= "" and cjson.decode(req.body) or {}
    if req.path == "/_fake/tokens" then
      S.tokens = body.tokens
      return send(conn, 200, "{}")
    elseif req.path == "/_fake/state" then
      local counts = next(S.counts) and S.counts or nil
      return send(conn, 200, cjson.encode{ objects = S.objects, counts = counts, rv = S.rv })
    elseif req.path == "/_fake/condition" then
      local claim = store("sandboxclaims", body.namespace)[body.claim]
      if not claim then return send(conn, 404, "{}") end
      set_condition(claim, body.status, body.reason, body.message)
      put("sandboxclaims", claim, "MODIFIED")
      return send(conn, 200, "{}")
    elseif req.path == "/_fake/disown" then
      local claim = store("sandboxclaims", body.namespace)[body.claim]
      local sb_name = claim and claim.status and claim.status.sandbox and claim.status.sandbox.name
      local sandbox = sb_name and store("sandboxes", body.namespace)[sb_name]
      if not sandbox then return send(conn, 404, "{}") end
      local obj = sandbox
      if body.link == "pod" then
        local annotations = sandbox.metadata.annotations or {}
        obj = store("pods", body.namespace)[annotations["agents.x-k8s.io/pod-name"] or sb_name]
        if not obj then return send(conn, 404, "{}") end
      end
      local ref = obj.metadata.ownerReferences[1]
      ref.name, ref.uid = "someone-else", uuid()
      put(body.link == "pod" and "pods" or "sandboxes", obj, "MODIFIED")
      return send(conn, 200, "{}")
    elseif req.path == "/_fake/compact" then
      S.compacted = S.rv + 1
      return send(conn, 200, "{}")
    elseif req.path == "/_fake/recreate" then
      local pod = store("pods", body.namespace)[body.pod]
      if not pod then return send(conn, 404, "{}") end
      local old = pod.metadata.uid
      local ip = body.same_ip and pod.status.podIP or nil
      stop_agent(old)
      pod.metadata.uid = uuid()
      local agent = start_agent(pod.metadata.uid, ip)
      pod.status.podIP, pod.status.podIPs = agent.ip, { { ip = agent.ip } }
      put("pods", pod, "MODIFIED")
      return send(conn, 200, cjson.encode{ uid = pod.metadata.uid, ip = agent.ip, old_uid = old })
    elseif req.path == "/_fake/shutdown" then
      for uid in pairs(copy(S.agents)) do stop_agent(uid) end
      return send(conn, 200, "{}")
    end
    send(conn, 404, "{}")
  end

  local function handle(req, conn)
    record_log = function(entry) conn:log(entry) end
    if req.path:sub(1, 7) == "/_fake/" then return control(req, conn) end
    if req.headers["x-sandbox-id"] then return router(req, conn) end
    local user = authenticate(req)
    conn:log{ request = req.index, user = user or false, sni = req.headers["x-fake-sni"],
      host = req.headers["x-fake-host"] }
    if not user then return status(conn, 401, "Unauthorized", "Unauthorized") end
    local resource, ns, name, sub = route(req.path)
    if not resource then
      return status(conn, 404, "NotFound", "the server could not find the requested resource")
    end
    local q = parse_query(req.query)
    local verb
    if sub ~= "" then
      -- RBAC's verbs for the pods proxy are the HTTP method's.
      verb = ({ GET = "get", POST = "create", PUT = "update", DELETE = "delete" })[req.method]
    elseif req.method == "POST" then
      verb = "create"
    elseif req.method == "DELETE" then
      verb = "delete"
    elseif req.method == "GET" then
      verb = name and "get" or (TRUE[q.watch or ""] and "watch" or "list")
    else
      return status(conn, 405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    end
    local rbac_resource = sub ~= "" and (resource .. "/" .. sub:match("^[^/]*")) or resource
    local key = verb .. " " .. rbac_resource
    if (faults.forbid and faults.forbid[key]) or (faults.allow and not faults.allow[key]) then
      return forbidden(conn, user, verb, rbac_resource, ns)
    end
    if faults.throttle and faults.throttle[key] and count("throttle " .. key) <= faults.throttle[key] then
      return status(conn, 429, "TooManyRequests", "Too many requests, please try again later.",
        { retryAfterSeconds = 2 }, { ["Retry-After"] = "2" })
    end
    if sub ~= "" then
      local pod_name, port = name:match("^([^:]+):(%d+)$")
      if not pod_name then pod_name, port = name:match("^http:([^:]+):(%d+)$") end
      local pod = pod_name and store("pods", ns)[pod_name]
      if resource ~= "pods" or not pod then return not_found(conn, "pods", tostring(pod_name or name)) end
      local target = "/" .. sub:gsub("^proxy/?", "")
      if req.query ~= "" then target = target .. "?" .. req.query end
      return relay(req, conn, pod.status.podIP, tonumber(port), target)
    elseif verb == "create" then
      if resource ~= "sandboxclaims" then return status(conn, 405, "MethodNotAllowed", "not served") end
      return create_claim(req, conn, ns)
    elseif verb == "delete" then
      if resource ~= "sandboxclaims" then return status(conn, 405, "MethodNotAllowed", "not served") end
      return delete_claim(req, conn, ns, name)
    elseif verb == "get" then
      local obj = store(resource, ns)[name]
      if not obj then return not_found(conn, resource, name) end
      return send(conn, 200, cjson.encode(obj))
    elseif verb == "watch" then
      return watch_events(conn, resource, ns, q)
    end
    return list(conn, resource, ns, q)
  end

  -- Objects a spec puts there before anything runs (someone else's claim, say).
  for _, claim in ipairs(config.claims or {}) do
    claim.metadata.uid = claim.metadata.uid or uuid()
    claim.metadata.creationTimestamp = now_text()
    bump(claim)
    store("sandboxclaims", claim.metadata.namespace)[claim.metadata.name] = claim
  end

  return { handle = handle }
end

return kube_api
