--- The chain that makes a Kubernetes session sandkit's: a SandboxClaim this sandbox made (its
-- label and warm pool), the Sandbox whose controller is that claim, and the pod whose
-- controller is that Sandbox; the reads and lists behind it, and the state a claim stands for.
-- Methods of the kubernetes provider (claims.methods), and the readings of objects its other
-- parts share.

local errors = require "sandkit.errors"
local session_labels = require "sandkit.labels"
local time = require "sandkit.time"
local api = require "sandkit.providers.kubernetes.api"

local claims = { methods = {} }
local methods = claims.methods

claims.MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
claims.MANAGED_BY = "sandkit"
--- The claim labels of a session's labels (sandkit.labels), with sandkit's own managed-by.
function claims.claim_labels(labels)
  return session_labels.stored(labels, { [claims.MANAGED_BY_LABEL] = claims.MANAGED_BY })
end

--- The label selector of the claims sandkit made carrying every one of `labels`. Keys and
-- values were checked (options.labels): neither holds a selector's , = or !.
function claims.selector(labels)
  local terms = { claims.MANAGED_BY_LABEL .. "=" .. claims.MANAGED_BY }
  local keys = {}
  for k in pairs(labels or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do terms[#terms + 1] = session_labels.PREFIX .. k .. "=" .. labels[k] end
  return table.concat(terms, ",")
end

--- nil, or INVALID_INPUT naming the first key with a prefix of its own.
function claims.label_refusal(labels, operation)
  return session_labels.refuse_prefixed(labels, operation, "Kubernetes")
end

--- agent-sandbox names a Sandbox's pod here when it is not the Sandbox's own name.
claims.POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"

--- Claims read per list page: small answers, few round trips.
local LIST_LIMIT = 100
--- Pages a list follows at most (100,000 claims): a server that hands out continue tokens for
-- ever cannot keep a list going for ever.
local MAX_LIST_PAGES = 1000
--- Bytes of the one whole list read when a continue token expired (client-go's pager does the
-- same): a hundred thousand claims of a few hundred bytes each.
local MAX_FULL_LIST = 64 * 1024 * 1024

--- Ready=False reasons of a claim or its Sandbox (forwarded, agent-sandbox v0.5) that a wait
-- for it to serve cannot outlast. The value says what the reason means for the caller:
-- "config", the installation refuses the claim; "missing", its pool or template does not
-- exist yet (agent-sandbox tries again every minute and when the pool appears, so it is
-- waited for within pool_grace); "ended", the session is over (expired, or its pod ended and
-- is not made again); "broken", the Sandbox cannot choose its pod; "paused", suspended by its
-- operatingMode.
claims.TERMINAL = {
  WarmPoolNotFound = "missing", TemplateNotFound = "missing", InvalidMetadata = "config",
  EnvVarsInjectionRejected = "config", VolumeClaimTemplatesError = "config",
  ClaimExpired = "ended", SandboxExpired = "ended", PodFailed = "ended", PodSucceeded = "ended",
  MultiplePods = "broken", SandboxSuspended = "paused",
}
local TERMINAL = claims.TERMINAL

--- A DNS-1123 label: what Kubernetes accepts as a namespace and what sandkit uses as a claim
-- name, so that the same id is also a valid pod and Service name.
local function dns_label(s)
  return type(s) == "string" and #s <= 63 and s:match("^[a-z0-9][a-z0-9%-]*$") ~= nil
    and s:sub(-1) ~= "-"
end

--- A DNS-1123 subdomain: an object name such as a warm pool's.
local function dns_subdomain(s)
  return type(s) == "string" and #s <= 253 and s:match("^[a-z0-9][a-z0-9%-%.]*$") ~= nil
    and s:match("[a-z0-9]$") ~= nil
end

--- Where each resource the provider reads is served.
local GROUPS = { sandboxclaims = api.CLAIMS, sandboxes = api.SANDBOXES, pods = api.CORE }

--- The path of a collection in this namespace, or of one object in it.
function methods:path(resource, name)
  return GROUPS[resource] .. "/namespaces/" .. self.namespace .. "/" .. resource
    .. (name and ("/" .. name) or "")
end

function methods:claims_path(name)
  return self:path("sandboxclaims", name)
end

--- A GET of one object: the object | nil (absent) | nil, err.
function methods:read(operation, resource, name)
  return self.api:call{ operation = operation, verb = "get", resource = resource,
    namespace = self.namespace, name = name, method = "GET", path = self:path(resource, name),
    absent_on_404 = true }
end

function methods:read_claim(id, operation)
  return self:read(operation, "sandboxclaims", id)
end

--- Calls `each(object)` for every object of a collection that `query` selects, following
-- continue until it is empty (a page may hold fewer items than `limit` and still not be the
-- last): true | nil, err. A continue token the server no longer honours (410, once etcd
-- compacted past it) ends the paging: `reset()` forgets what the pages so far gave, and one
-- whole list gives everything again, as client-go's pager does.
function methods:each_listed(operation, resource, query, each, reset)
  local continue
  for _ = 1, MAX_LIST_PAGES do
    local q = {}
    for i, pair in ipairs(query) do q[i] = pair end
    q[#q + 1] = { "limit", tostring(LIST_LIMIT) }
    if continue then q[#q + 1] = { "continue", continue } end
    local page, err = self.api:call{ operation = operation, verb = "list", resource = resource,
      namespace = self.namespace, method = "GET", path = self:path(resource), query = q }
    if not page and err.status == 410 and continue then
      reset()
      page, err = self.api:call{ operation = operation, verb = "list", resource = resource,
        namespace = self.namespace, method = "GET", path = self:path(resource), query = query,
        max_body = MAX_FULL_LIST }
    end
    if not page then return nil, err end
    if type(page.items) ~= "table" then
      return nil, errors.unexpected(operation, "items", "the " .. resource .. " list has no items")
    end
    for _, obj in ipairs(page.items) do
      if type(obj) == "table" then each(obj) end
    end
    continue = type(page.metadata) == "table" and page.metadata.continue or nil
    if type(continue) ~= "string" or continue == "" then return true end
  end
  return nil, errors.unreachable(operation, "the " .. resource .. " list did not end within "
    .. MAX_LIST_PAGES .. " pages")
end

local function meta(obj)
  return type(obj) == "table" and type(obj.metadata) == "table" and obj.metadata or {}
end

function methods:owns(claim)
  local m = meta(claim)
  local spec = type(claim.spec) == "table" and claim.spec or {}
  local pool = type(spec.warmPoolRef) == "table" and spec.warmPoolRef.name
  return type(m.labels) == "table" and m.labels[claims.MANAGED_BY_LABEL] == claims.MANAGED_BY
    and pool == self.warm_pool
end

local function find_condition(claim, ctype)
  local status = type(claim.status) == "table" and claim.status or {}
  if type(status.conditions) ~= "table" then return nil end
  for _, c in ipairs(status.conditions) do
    if type(c) == "table" and c.type == ctype then return c end
  end
end

local function ready_condition(claim)
  return find_condition(claim, "Ready")
end

--- Why a claim cannot serve now, and what kind of reason that is (TERMINAL's), or nil: its
-- Finished condition (its pod ended, mirrored from the Sandbox), else a Ready=False reason of
-- TERMINAL's.
local function stopped(claim)
  local finished = find_condition(claim, "Finished")
  if finished and finished.status == "True" then return tostring(finished.reason or "Finished"), "ended" end
  local c = ready_condition(claim)
  if c and c.status == "False" and TERMINAL[c.reason] then return c.reason, TERMINAL[c.reason] end
end

--- What a claim says about itself, for "last seen".
local function describe(claim)
  if meta(claim).deletionTimestamp then return "claim is being deleted" end
  local c = ready_condition(claim)
  if not c then return "claim has no Ready condition yet" end
  local text = "claim Ready=" .. tostring(c.status)
  if type(c.reason) == "string" and c.reason ~= "" then
    text = text .. " (" .. c.reason
    if type(c.message) == "string" and c.message ~= "" then text = text .. ": " .. c.message end
    text = text .. ")"
  end
  local finished = find_condition(claim, "Finished")
  if finished and finished.status == "True" and finished.reason ~= c.reason then
    text = text .. ", Finished (" .. tostring(finished.reason) .. ")"
  end
  return text
end

--- The session state a claim stands for: terminated once it is being deleted, expired or its
-- pod ended; paused while suspended; running when Ready; starting otherwise (a Sandbox that
-- cannot choose its pod too: an operator may yet remove one).
local function claim_state(claim)
  if meta(claim).deletionTimestamp then return "terminated" end
  local _, kind = stopped(claim)
  if kind == "ended" then return "terminated" end
  if kind == "paused" then return "paused" end
  local c = ready_condition(claim)
  if c and c.status == "True" then return "running" end
  return "starting"
end

local function controlled_by(obj, kind, uid)
  local refs = meta(obj).ownerReferences
  if type(refs) ~= "table" then return false end
  for _, ref in ipairs(refs) do
    if type(ref) == "table" and ref.controller == true and ref.kind == kind and ref.uid == uid then
      return true
    end
  end
  return false
end

--- The pod's address: IPv4 preferred (docs/kubernetes.md).
local function pod_ip(pod)
  local status = type(pod.status) == "table" and pod.status or {}
  local ips = {}
  if type(status.podIPs) == "table" then
    for _, entry in ipairs(status.podIPs) do
      if type(entry) == "table" and type(entry.ip) == "string" then ips[#ips + 1] = entry.ip end
    end
  end
  if type(status.podIP) == "string" then table.insert(ips, 1, status.podIP) end
  for _, ip in ipairs(ips) do
    if ip:match("^%d+%.%d+%.%d+%.%d+$") then return ip end
  end
  for _, ip in ipairs(ips) do
    if ip:match("^[%x:]+$") and ip:find(":", 1, true) then return ip end
  end
end

--- The Sandbox a claim names, when it names one that can be.
local function sandbox_name(claim)
  local status = type(claim.status) == "table" and claim.status or {}
  local name = type(status.sandbox) == "table" and status.sandbox.name
  if type(name) == "string" and dns_subdomain(name) then return name end
end

--- The pod a Sandbox runs: its pod-name annotation, else the Sandbox's own name.
local function pod_name_of(sandbox, sb_name)
  local annotations = type(meta(sandbox).annotations) == "table" and meta(sandbox).annotations or {}
  return annotations[claims.POD_NAME_ANNOTATION] or sb_name
end

--- The pod behind a claim, through the ownership chain: { name, uid, ip, sandbox } | false and
-- why not yet (something is missing or still starting) | nil and an error (the chain does
-- not hold, or a read failed). `lookup(resource, name)` finds a Sandbox or a pod (object |
-- nil when absent | nil, err); by default each is read with a GET.
function methods:chain(claim, operation, lookup)
  lookup = lookup or function(resource, name) return self:read(operation, resource, name) end
  local id, claim_uid = meta(claim).name, meta(claim).uid
  local sb_name = sandbox_name(claim)
  if not sb_name then return false, "claim names no sandbox yet" end
  local sandbox, err = lookup("sandboxes", sb_name)
  if err then return nil, err end
  if not sandbox then return false, "sandbox " .. sb_name .. " does not exist" end
  if not controlled_by(sandbox, "SandboxClaim", claim_uid) then return nil, errors.not_ours(operation, id) end
  local pod_name = pod_name_of(sandbox, sb_name)
  if type(pod_name) ~= "string" or not dns_subdomain(pod_name) then
    return nil, errors.unexpected(operation, "sandbox", "sandbox " .. sb_name .. " names a pod "
      .. "that is not an object name")
  end
  local pod
  pod, err = lookup("pods", pod_name)
  if err then return nil, err end
  if not pod then return false, "pod " .. pod_name .. " does not exist" end
  if not controlled_by(pod, "Sandbox", meta(sandbox).uid) then return nil, errors.not_ours(operation, id) end
  if meta(pod).deletionTimestamp then return false, "pod " .. pod_name .. " is terminating" end
  local ip = pod_ip(pod)
  if not ip then return false, "pod " .. pod_name .. " has no IP yet" end
  if type(meta(pod).uid) ~= "string" or meta(pod).uid == "" then
    return nil, errors.unexpected(operation, "pod", "pod " .. pod_name .. " has no uid")
  end
  return { name = pod_name, uid = meta(pod).uid, ip = ip, sandbox = sb_name }
end

--- What a claim says of its session, its chain aside: id, state, when it was made and ends
-- (its shutdownTime), and its labels.
function claims.session_record(claim)
  local spec = type(claim.spec) == "table" and claim.spec or {}
  local lifecycle = type(spec.lifecycle) == "table" and spec.lifecycle or {}
  return { id = meta(claim).name, state = claim_state(claim), generation = 1,
    claim_uid = meta(claim).uid, created_at = time.parse_rfc3339(meta(claim).creationTimestamp),
    expires_at = time.parse_rfc3339(lifecycle.shutdownTime), labels = session_labels.of(meta(claim).labels) }
end

--- The session a claim of this sandbox stands for, once its chain is checked: the record |
-- nil (the chain does not hold: not ours, read as absent) | nil, err. A claim Ready whose
-- pod is not in view yet is still starting; only a running session carries its pod, so
-- nothing is ever sent to one in another state without reading it again.
function methods:record(claim, operation, lookup)
  local pod, why = self:chain(claim, operation, lookup)
  if pod == nil then
    if why.not_ours then return nil end
    return nil, why
  end
  local record = claims.session_record(claim)
  if record.state == "running" then
    if pod then record.pod = pod else record.state = "starting" end
  end
  return record
end

--- The pod of a running session, read from scratch: pod | nil, err.
function methods:resolve(id, operation)
  local claim, err = self:read_claim(id, operation)
  if err then return nil, err end
  if not claim or not self:owns(claim) then return nil, errors.not_ours(operation, id) end
  local state = claim_state(claim)
  if state ~= "running" then
    return nil, errors.unreachable(operation, "session '" .. id .. "' is " .. state .. " (" .. describe(claim) .. ")")
  end
  local pod, why = self:chain(claim, operation)
  if pod == nil then return nil, why end
  if pod == false then
    return nil, errors.unreachable(operation, "session '" .. id .. "' cannot be reached: " .. why)
  end
  return pod
end

--- Finds the Sandboxes `wanted` names and their pods with one list of each collection (however
-- many pages), rather than two reads per session: a lookup for `chain`, or nil and an error.
-- Only the objects wanted are kept, so memory grows with this sandbox's sessions, not with
-- the namespace.
function methods:bulk_lookup(operation, wanted)
  local found = { sandboxes = {}, pods = {} }
  local pods_wanted = {}
  local ok, err = self:each_listed(operation, "sandboxes", {}, function(sandbox)
    local name = meta(sandbox).name
    if wanted[name] then
      found.sandboxes[name] = sandbox
      local pod_name = pod_name_of(sandbox, name)
      if type(pod_name) == "string" then pods_wanted[pod_name] = true end
    end
  end, function() found.sandboxes, pods_wanted = {}, {} end)
  if not ok then return nil, err end
  if next(pods_wanted) then
    ok, err = self:each_listed(operation, "pods", {}, function(pod)
      if pods_wanted[meta(pod).name] then found.pods[meta(pod).name] = pod end
    end, function() found.pods = {} end)
    if not ok then return nil, err end
  end
  return function(resource, name) return found[resource][name] end
end

claims.dns_label, claims.dns_subdomain = dns_label, dns_subdomain
claims.meta, claims.ready_condition, claims.describe = meta, ready_condition, describe
claims.stopped, claims.controlled_by = stopped, controlled_by
claims.claim_state, claims.sandbox_name, claims.pod_name_of = claim_state, sandbox_name, pod_name_of

return claims
