--- A fake Kubernetes API server with agent-sandbox's resources, run as the scenario of
-- spec/support/fake_http_server.lua (one process, cqueues), behind the TLS front
-- spec/support/kube_cluster.lua starts. It speaks what sandkit and python-kubernetes read: real
-- Status bodies, chunked watches with resource versions (410 once compacted), label and field
-- selectors, list pages with continue tokens (which expire, 410, once compacted), delete
-- preconditions, merge patches of Sandboxes and claims with a resourceVersion precondition, API group
-- discovery, and the pods proxy and agent-sandbox's router (spec/support/kube_relay.lua).
-- agent-sandbox's controllers are spec/support/kube_controller.lua, whose pods are real
-- sandkit-agents.
--
-- Authentication: a bearer token from `tokens` (token -> user), or a client certificate that
-- the TLS front verified (it passes X-Fake-Client-Verify/-Subject) with a CN in `client_cns`.
-- config.api_versions: the versions of extensions.agents.x-k8s.io served (default v1beta1 and
--   v1alpha1; { "v1alpha1" } is agent-sandbox before v0.5, {} none installed). Only v1beta1
--   serves objects; a path of a version not served is the API server's bare 404.
-- config.router_read_timeout: the router's per-read timeout, seconds (kube_relay.lua).
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
--                                    (Kubernetes may answer fewer than asked, continue set);
--                                    a list without a limit is whole
--   expire_continue = n              the first n lists given a continue token answer 410
--                                    Expired, as once etcd compacted past the token
--   patch_conflict = n               the first n patches answer 409 Conflict, as when the
--                                    controller wrote the object since it was read
--   forbid = { ["create sandboxclaims"] = true }   403 Forbidden, as RBAC words it
--   allow = { ["get pods"] = true, … }   403 for every verb and resource not listed (a Role)
--   throttle = { ["list sandboxclaims"] = 1 }      429 with Retry-After
-- config.pools: kube_controller.lua's.
-- Control routes (no authentication): POST /_fake/tokens {tokens}, POST /_fake/recreate
-- {pod, same_ip}, POST /_fake/condition {claim, status, reason, message}, POST /_fake/disown
-- {claim, link = "sandbox" | "pod"} (that object's controller becomes another object),
-- POST /_fake/pod_phase {pod, phase = "Failed" | "Succeeded"}, POST /_fake/extra_pod {claim},
-- POST /_fake/pool {name, pool} (a pool made or changed), POST /_fake/compact,
-- GET /_fake/state, POST /_fake/shutdown.

local cjson = require "cjson"
local cqueues = require "cqueues"
local condition = require "cqueues.condition"
local core = require "sandkit.core"
local kube_controller = require "support.kube_controller"
local kube_relay = require "support.kube_relay"

local kube_api = {}

kube_api.AGENT_PORT = kube_controller.AGENT_PORT
kube_api.GROUP = "extensions.agents.x-k8s.io"
kube_api.CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1"
kube_api.SANDBOXES = "/apis/agents.x-k8s.io/v1beta1"

local KINDS = {
  sandboxclaims = { prefix = kube_api.CLAIMS, api_version = "extensions.agents.x-k8s.io/v1beta1",
    kind = "SandboxClaim", group = "extensions.agents.x-k8s.io" },
  sandboxes = { prefix = kube_api.SANDBOXES, api_version = "agents.x-k8s.io/v1beta1",
    kind = "Sandbox", group = "agents.x-k8s.io" },
  pods = { prefix = "/api/v1", api_version = "v1", kind = "Pod", group = "" },
}

--- The words of a continue token older than etcd's compaction (k8s.io/apiserver's
-- storage errors).
local CONTINUE_EXPIRED = "The provided continue parameter is too old to display a consistent list result. "
  .. "You can start a new list without the continue parameter, or use the continue token in this response "
  .. "to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent "
  .. "list - objects that were created, modified, or deleted between the time the first chunk was returned "
  .. "and now may show up in the list."

local PHRASES = { [200] = "OK", [201] = "Created", [202] = "Accepted", [400] = "Bad Request", [401] = "Unauthorized",
  [403] = "Forbidden", [404] = "Not Found", [409] = "Conflict", [410] = "Gone", [415] = "Unsupported Media Type",
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

function kube_api.scenario(config)
  local faults = config.faults or {}
  local S = {
    rv = 100, objects = { sandboxclaims = {}, sandboxes = {}, pods = {} }, log = {},
    compacted = 0, watchers = {}, counts = {}, tokens = config.tokens or {},
  }
  local served = {}
  for _, v in ipairs(config.api_versions or { "v1beta1", "v1alpha1" }) do served[v] = true end
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

  -- The controller ----------------------------------------------------------------------------

  local controller = kube_controller.new(config, {
    get = function(resource, ns, name) return store(resource, ns)[name] end,
    put = put, remove = remove,
    names = function(resource, ns)
      local names = {}
      for name in pairs(store(resource, ns)) do names[#names + 1] = name end
      table.sort(names)
      return names
    end,
    uuid = uuid, now = now_text, copy = copy, encode = cjson.encode,
  }, function(entry) record_log(entry) end)

  --- Replaces a claim's Ready condition (a control route's, the controller aside).
  local function set_ready(claim, cstatus, reason, message)
    claim.status = claim.status or {}
    local kept = {}
    for _, c in ipairs(claim.status.conditions or {}) do
      if c.type ~= "Ready" then kept[#kept + 1] = c end
    end
    kept[#kept + 1] = { type = "Ready", status = cstatus, reason = reason, message = message,
      lastTransitionTime = now_text(), observedGeneration = claim.metadata.generation }
    claim.status.conditions = kept
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
    local after, page, since = "", 1, S.rv
    if q.continue and q.continue ~= "" then
      local decoded = core.b64decode(q.continue)
      local p, rv, last = (decoded or ""):match("^(%d+)\n(%d+)\n(.*)$")
      if not p then return status(conn, 400, "BadRequest", "continue key is not valid") end
      page, since, after = tonumber(p) + 1, tonumber(rv), last
      if tonumber(rv) < S.compacted or count("continued") <= (faults.expire_continue or 0) then
        local st = status_body(410, "Expired", CONTINUE_EXPIRED)
        st.metadata = { continue = q.continue }
        return send(conn, 410, cjson.encode(st))
      end
    end
    local fail = faults.list_fail and (faults.list_fail[page] or faults.list_fail[tostring(page)])
    if fail == "html" then
      return send(conn, 502, "<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
    elseif fail then
      return status(conn, fail, "ServiceUnavailable", "the server is currently unable to handle the request")
    end
    local limit = tonumber(q.limit or "") or 0
    -- A list without a limit is never paged.
    if faults.page_size and limit > faults.page_size then limit = faults.page_size end
    local items = {}
    local more = false
    for _, name in ipairs(names) do
      if name > after then
        if limit > 0 and #items >= limit then more = true break end
        items[#items + 1] = store(resource, ns)[name]
      end
    end
    local continue = more and core.b64encode(page .. "\n" .. since .. "\n" .. items[#items].metadata.name) or nil
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
        if event.rv > from and matches(w, event.resource, event.object) then w.queue[#w.queue + 1] = event end
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
    controller:claim_added(body)
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
    controller:claim_deleted(claim.metadata.uid, ns)
    send(conn, 200, cjson.encode(claim))
  end

  --- Applies a JSON merge patch (RFC 7386): null removes, objects merge, anything else replaces.
  local function merge(target, patch)
    for k, v in pairs(patch) do
      if v == cjson.null then
        target[k] = nil
      elseif type(v) == "table" and next(v) ~= nil and #v == 0 and type(target[k]) == "table" then
        merge(target[k], v)
      else
        target[k] = copy(v)
      end
    end
  end

  --- The patch a PATCH of `resource`'s object `obj` carries, or nil once its refusal was
  -- answered: a JSON merge patch (415 for any other type, as the API server answers a CRD's
  -- strategic merge patch), whose metadata.resourceVersion, when given, must be the object's
  -- (409 otherwise, as the API server's optimistic concurrency answers).
  local function merge_patch(req, conn, resource, obj)
    if not (req.headers["content-type"] or ""):find("application/merge-patch+json", 1, true) then
      return status(conn, 415, "UnsupportedMediaType", "the body of the request was in an unknown format")
    end
    local ok, patch = pcall(cjson.decode, req.body)
    if not ok or type(patch) ~= "table" then return status(conn, 400, "BadRequest", "the body is not JSON") end
    local rv = type(patch.metadata) == "table" and patch.metadata.resourceVersion
    if (rv and rv ~= obj.metadata.resourceVersion) or count("patch") <= (faults.patch_conflict or 0) then
      return status(conn, 409, "Conflict", string.format('Operation cannot be fulfilled on '
        .. '%s "%s": the object has been modified; please apply your changes to '
        .. "the latest version and try again", qualified(resource), obj.metadata.name),
        { name = obj.metadata.name, group = KINDS[resource].group, kind = resource })
    end
    return patch
  end

  --- A merge patch of a claim: its spec.lifecycle.shutdownTime (what sandkit patches) must stay
  -- a date-time, as the CRD's schema holds it.
  local function patch_claim(req, conn, ns, name)
    local claim = store("sandboxclaims", ns)[name]
    if not claim then return not_found(conn, "sandboxclaims", name) end
    local patch = merge_patch(req, conn, "sandboxclaims", claim)
    if not patch then return end
    local updated = copy(claim)
    merge(updated, patch)
    local lifecycle = type(updated.spec) == "table" and updated.spec.lifecycle
    local shutdown = type(lifecycle) == "table" and lifecycle.shutdownTime
    if shutdown ~= nil and not (type(shutdown) == "string"
        and shutdown:match("^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%dZ$")) then
      return status(conn, 422, "Invalid", string.format('SandboxClaim.extensions.agents.x-k8s.io "%s" is '
        .. 'invalid: spec.lifecycle.shutdownTime: Invalid value: "%s": must be a date-time', name,
        tostring(shutdown)))
    end
    updated.metadata.uid, updated.metadata.name = claim.metadata.uid, claim.metadata.name
    for k, v in pairs(updated) do claim[k] = v end
    record_log{ patched = name, shutdown_time = shutdown }
    put("sandboxclaims", claim, "MODIFIED")
    send(conn, 200, cjson.encode(claim))
  end

  --- A merge patch of a Sandbox: spec.operatingMode is Running or Suspended.
  local function patch_sandbox(req, conn, ns, name)
    local sandbox = store("sandboxes", ns)[name]
    if not sandbox then return not_found(conn, "sandboxes", name) end
    local patch = merge_patch(req, conn, "sandboxes", sandbox)
    if not patch then return end
    local before = cjson.encode(sandbox.spec)
    local updated = copy(sandbox)
    merge(updated, patch)
    local mode = updated.spec and updated.spec.operatingMode
    if mode ~= "Running" and mode ~= "Suspended" then
      return status(conn, 422, "Invalid", string.format('Sandbox.agents.x-k8s.io "%s" is invalid: '
        .. 'spec.operatingMode: Unsupported value: "%s": supported values: "Running", "Suspended"', name,
        tostring(mode)))
    end
    updated.metadata.uid, updated.metadata.name = sandbox.metadata.uid, sandbox.metadata.name
    for k, v in pairs(updated) do sandbox[k] = v end
    local changed = cjson.encode(sandbox.spec) ~= before
    if changed then sandbox.metadata.generation = (sandbox.metadata.generation or 1) + 1 end
    record_log{ patched = name, operating_mode = mode }
    put("sandboxes", sandbox, "MODIFIED")
    if changed then controller:sandbox_changed(sandbox) end
    send(conn, 200, cjson.encode(sandbox))
  end

  --- GET /apis/<group>: the versions of agent-sandbox's extensions group this cluster serves.
  local function discovery(conn)
    local versions = {}
    for _, v in ipairs{ "v1beta1", "v1alpha1" } do
      if served[v] then versions[#versions + 1] = { groupVersion = kube_api.GROUP .. "/" .. v, version = v } end
    end
    if #versions == 0 then
      return status(conn, 404, "NotFound", "the server could not find the requested resource")
    end
    send(conn, 200, cjson.encode{ kind = "APIGroup", apiVersion = "v1", name = kube_api.GROUP,
      versions = versions, preferredVersion = versions[1] })
  end

  --- Routes a request under /api or /apis: resource, namespace, name, subresource, or nil.
  -- agent-sandbox's paths exist only while v1beta1 is served.
  local function route(path)
    for resource, k in pairs(KINDS) do
      if resource ~= "pods" and not served.v1beta1 then break end
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
      set_ready(claim, body.status, body.reason, body.message)
      put("sandboxclaims", claim, "MODIFIED")
      return send(conn, 200, "{}")
    elseif req.path == "/_fake/pod_phase" then
      if not controller:end_pod(body.namespace, body.pod, body.phase) then return send(conn, 404, "{}") end
      return send(conn, 200, "{}")
    elseif req.path == "/_fake/extra_pod" then
      if not controller:extra_pod(body.namespace, body.claim) then return send(conn, 404, "{}") end
      return send(conn, 200, "{}")
    elseif req.path == "/_fake/pool" then
      controller:set_pool(body.name, body.pool)
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
      local made = controller:recreate(body.namespace, body.pod, body.same_ip)
      if not made then return send(conn, 404, "{}") end
      return send(conn, 200, cjson.encode(made))
    elseif req.path == "/_fake/shutdown" then
      controller:stop_all()
      return send(conn, 200, "{}")
    end
    send(conn, 404, "{}")
  end

  local function handle(req, conn)
    record_log = function(entry) conn:log(entry) end
    -- The warm pools fill once the loop runs, which is when the first request comes.
    controller:fill_all()
    if req.path:sub(1, 7) == "/_fake/" then return control(req, conn) end
    if req.headers["x-sandbox-id"] then return kube_relay.router(req, conn, config, send, record_log) end
    local user = authenticate(req)
    conn:log{ request = req.index, user = user or false, sni = req.headers["x-fake-sni"],
      host = req.headers["x-fake-host"] }
    if not user then return status(conn, 401, "Unauthorized", "Unauthorized") end
    if req.method == "GET" and req.path == "/apis/" .. kube_api.GROUP then return discovery(conn) end
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
    elseif req.method == "PATCH" and name then
      verb = "patch"
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
      return kube_relay.pods_proxy(req, conn, pod.status.podIP, tonumber(port), target, status)
    elseif verb == "create" then
      if resource ~= "sandboxclaims" then return status(conn, 405, "MethodNotAllowed", "not served") end
      return create_claim(req, conn, ns)
    elseif verb == "delete" then
      if resource ~= "sandboxclaims" then return status(conn, 405, "MethodNotAllowed", "not served") end
      return delete_claim(req, conn, ns, name)
    elseif verb == "patch" then
      if resource == "sandboxclaims" then return patch_claim(req, conn, ns, name) end
      if resource ~= "sandboxes" then return status(conn, 405, "MethodNotAllowed", "not served") end
      return patch_sandbox(req, conn, ns, name)
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
