--- agent-sandbox's controllers as the fake API server of spec/support/kube_api.lua runs them
-- (v0.5: extensions/controllers/sandboxclaim_controller.go, controllers/sandbox_controller.go),
-- inside its process, on its cqueues loop, where it matters to a client:
--
-- * Warm pools: `replicas` Sandboxes named <pool>-xxxxx, owned by their SandboxWarmPool, each
--   with a Running, Ready pod of the same name whose sandkit-agent started before any claim.
--   A claim adopts the oldest: its metadata gains the sandbox-name annotation (a MODIFIED event
--   with no status change), the Sandbox's controller moves from the pool to the claim and it
--   gets the pod-name annotation, the pod the claim-uid label, and then the claim's status
--   names the Sandbox and carries its Ready condition. The pool makes a new warm Sandbox.
-- * The cold path, when the pool has none: a Sandbox named after the claim, its pod Pending
--   (no address), then Running and not Ready, then Ready, each step a status of its own.
-- * A claim's Ready condition is the Sandbox's, forwarded verbatim (SandboxNotReady before
--   the Sandbox has one), and its Finished condition is mirrored; a Sandbox's Ready is False
--   with MultiplePods, SandboxSuspended, PodSucceeded or PodFailed where those hold.
-- * WarmPoolNotFound and TemplateNotFound are retried when the pool changes (set_pool).
-- * spec.operatingMode Suspended deletes the pod (it lingers Terminating first) and keeps the
--   Sandbox; Running makes a new pod named after the Sandbox, with a new UID and address.
-- * No finalizers: a deleted claim's Sandbox goes at once, its pods after lingering
--   Terminating for `terminating_seconds`.
-- * A claim whose spec.lifecycle.shutdownTime has passed, with shutdownPolicy Delete, is
--   deleted so, the time read again at each look (a patch moves it).
--
-- The pod of a Sandbox is a real sandkit-agent in capability mode, the pod's UID its session
-- id, listening on 127.a.b.c:8971 (the pod IP), a and b from the fake's process id so that
-- runs of the suite side by side use different addresses.
--
-- pools: { [name] = { replicas = 1 (warm Sandboxes kept), bind_delay, ready_delay,
--   never_ready (pods Running, never Ready), end_phase = "Failed" | "Succeeded" (pods end so
--   once Running, as a container that exits), expire_before_ready, fail_reason (a Ready=False
--   reason the claim gets instead of a Sandbox), template_missing (TemplateNotFound),
--   foreign_owner (the Sandbox's controller is another claim), foreign_pod_owner (the pod's is
--   another Sandbox), pod_name_annotation (the pod named <sandbox>-pod, as the annotation says) } }

local cqueues = require "cqueues"
local core = require "sandkit.core"
local time = require "sandkit.time"

local kube_controller = {}

kube_controller.AGENT_PORT = 8971
kube_controller.POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
kube_controller.SANDBOX_NAME_ANNOTATION = "agents.x-k8s.io/sandbox-name"
kube_controller.CLAIM_UID_LABEL = "agents.x-k8s.io/claim-uid"
--- Seconds a deleted pod stays Terminating, as kubelet takes to stop its containers.
kube_controller.TERMINATING_SECONDS = 0.3
--- Seconds between the steps of a pod's start (scheduled, running, ready).
local STEP = 0.02

local API_SANDBOXES = "agents.x-k8s.io/v1beta1"
local API_CLAIMS = "extensions.agents.x-k8s.io/v1beta1"

local ctl_mt = {}
ctl_mt.__index = ctl_mt

local function own_pid()
  local f = assert(io.open("/proc/self/stat"))
  local pid = f:read("*n")
  f:close()
  return pid
end

--- objects: kube_api's storage { get(resource, ns, name), put(resource, obj, kind),
-- remove(resource, obj), names(resource, ns) -> sorted list, uuid(), now(), copy(v),
-- encode(v) }; log(entry) appends to the fake's log.
function kube_controller.new(config, objects, log)
  local pid = own_pid()
  return setmetatable({ config = config, pools = config.pools or {}, objects = objects, log = log,
    agents = {}, next_host = 2, net_a = 10 + pid % 240, net_b = math.floor(pid / 240) % 256,
    warm = {}, namespace = config.namespace, terminating = config.terminating_seconds
      or kube_controller.TERMINATING_SECONDS }, ctl_mt)
end

--- Runs fn on its own on the fake's loop, logging what it raised.
local function spawn(self, fn)
  cqueues.running():wrap(function()
    local ok, err = pcall(fn)
    if not ok then self.log{ controller_error = tostring(err) } end
  end)
end

-- Agents (the pods' sandkit-agents) -------------------------------------------------------------

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
function ctl_mt:start_agent(pod_uid, ip)
  for _ = 1, 40 do
    local addr = ip
    if not addr then
      addr = string.format("127.%d.%d.%d", self.net_a, self.net_b, self.next_host)
      self.next_host = self.next_host % 253 + 2
    end
    self.dirs_made = (self.dirs_made or 0) + 1
    local dir = assert(self.config.pods_dir, "the cluster names its pods' folder") .. "/" .. self.dirs_made
    assert(core.mkdir(dir, 448))
    assert(core.mkdir(dir .. "/root", 448))
    local apid, reader = core.spawn({ self.config.agent, "--root", dir .. "/root", "--auth", "capability",
      "--session-id", pod_uid, "--public-keys", self.config.public_keys,
      "--listen", addr .. ":" .. kube_controller.AGENT_PORT, "--ready-fd", "3", "--log", "quiet" },
      { ready_fd = 3, setsid = true, stderr = dir .. "/agent.log" })
    assert(apid, reader)
    -- Logged before it is ready: the cluster kills what the log names when the fake ends, an
    -- agent still starting then included (it runs in a session of its own and would outlive it).
    self.log{ agent_pid = apid, agent_dir = dir }
    local line = read_line(reader, 10)
    -- cqueues still watches the descriptor it polled: it must forget it before it closes.
    cqueues.cancel(reader:pollfd())
    reader:close()
    if line then
      local agent = { pid = apid, ip = addr, dir = dir }
      self.agents[pod_uid] = agent
      self.log{ agent_pid = apid, agent_dir = dir, pod_uid = pod_uid, ip = addr }
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

function ctl_mt:stop_agent(pod_uid)
  local agent = self.agents[pod_uid]
  if not agent then return end
  self.agents[pod_uid] = nil
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

function ctl_mt:stop_all()
  local uids = {}
  for uid in pairs(self.agents) do uids[#uids + 1] = uid end
  for _, uid in ipairs(uids) do self:stop_agent(uid) end
end

-- Readings ----------------------------------------------------------------------------------------

local function controller_of(obj)
  for _, ref in ipairs(obj.metadata.ownerReferences or {}) do
    if ref.controller then return ref end
  end
end

local function condition(obj, ctype)
  for _, c in ipairs(obj.status and obj.status.conditions or {}) do
    if c.type == ctype then return c end
  end
end

--- Sets (or with cstatus nil removes) a condition, keeping the others.
local function set_condition(obj, ctype, cstatus, reason, message, generation, now)
  obj.status = obj.status or {}
  local kept = {}
  for _, c in ipairs(obj.status.conditions or {}) do
    if c.type ~= ctype then kept[#kept + 1] = c end
  end
  if cstatus then
    local old = condition(obj, ctype)
    local since = old and old.status == cstatus and old.lastTransitionTime or now
    kept[#kept + 1] = { type = ctype, status = cstatus, reason = reason, message = message,
      lastTransitionTime = since, observedGeneration = generation }
  end
  obj.status.conditions = kept
end

--- Every object of a collection, live, in name order.
function ctl_mt:each(resource, ns)
  local out = {}
  for _, name in ipairs(self.objects.names(resource, ns)) do
    out[#out + 1] = self.objects.get(resource, ns, name)
  end
  return out
end

function ctl_mt:pods_of(sandbox)
  local out = {}
  for _, pod in ipairs(self:each("pods", sandbox.metadata.namespace)) do
    local ref = controller_of(pod)
    if ref and ref.uid == sandbox.metadata.uid then out[#out + 1] = pod end
  end
  return out
end

--- The pod a Sandbox runs: its pod-name annotation, else its own name, when it controls it.
function ctl_mt:pod_of(sandbox)
  local annotations = sandbox.metadata.annotations or {}
  local pod = self.objects.get("pods", sandbox.metadata.namespace,
    annotations[kube_controller.POD_NAME_ANNOTATION] or sandbox.metadata.name)
  local ref = pod and controller_of(pod)
  if ref and ref.uid == sandbox.metadata.uid then return pod end
end

local function pod_ready(pod)
  local c = condition(pod, "Ready")
  return pod.status.phase == "Running" and c and c.status == "True" and pod.status.podIP ~= nil
end

--- A Sandbox's Ready and Finished conditions from its pods and operatingMode, as agent-sandbox's
-- computeReadyCondition and computeFinishedCondition word them.
function ctl_mt:sandbox_status(sandbox)
  local gen, now = sandbox.metadata.generation, self.objects.now()
  local pod = self:pod_of(sandbox)
  local function ready(cstatus, reason, message)
    set_condition(sandbox, "Ready", cstatus, reason, message, gen, now)
  end
  local finished = pod and (pod.status.phase == "Succeeded" or pod.status.phase == "Failed")
  set_condition(sandbox, "Finished", finished and "True" or nil,
    finished and ("Pod" .. pod.status.phase) or nil,
    finished and (pod.status.phase == "Failed" and "Pod failed" or "Pod completed successfully") or nil, gen, now)
  local suspended = sandbox.spec.operatingMode == "Suspended"
  if suspended then
    set_condition(sandbox, "Suspended", pod and "False" or "True", pod and "PodTerminating" or "PodTerminated",
      pod and "Pod is terminating. Sandbox is suspending" or "Pod has been terminated. Sandbox is suspended", gen, now)
  elseif condition(sandbox, "Suspended") then
    set_condition(sandbox, "Suspended", "False", "NotSuspended", "Sandbox is not suspended", gen, now)
  end
  local owned = #self:pods_of(sandbox)
  if owned > 1 then
    return ready("False", "MultiplePods", string.format("multiple Pods (%d) are controlled by this Sandbox; "
      .. "refusing to choose or create a Pod", owned))
  elseif suspended then
    return ready("False", "SandboxSuspended", pod and "Sandbox is suspending" or "Sandbox is suspended")
  elseif finished then
    return ready("False", "Pod" .. pod.status.phase, pod.status.phase == "Failed" and "Pod failed"
      or "Pod completed successfully")
  elseif not pod then
    return ready("False", "DependenciesNotReady", "Pod does not exist")
  elseif pod_ready(pod) then
    return ready("True", "DependenciesReady", "Pod is Ready")
  elseif pod.status.phase == "Running" then
    return ready("False", "DependenciesNotReady", "Pod is Running but not Ready")
  end
  ready("False", "DependenciesNotReady", "Pod exists with phase: " .. pod.status.phase)
end

--- The Sandbox's status as it now is, then its claim's (Ready forwarded verbatim, Finished
-- mirrored, the Sandbox's name and addresses), each stored with an event when it changed.
function ctl_mt:sync(sandbox)
  local before = self.objects.encode(sandbox.status or {})
  self:sandbox_status(sandbox)
  local pod = self:pod_of(sandbox)
  sandbox.status.podIPs = pod and pod.status.podIP and { pod.status.podIP } or nil
  if self.objects.encode(sandbox.status) ~= before then self.objects.put("sandboxes", sandbox, "MODIFIED") end
  local ref = controller_of(sandbox)
  if not ref or ref.kind ~= "SandboxClaim" then return end
  local claim = self.objects.get("sandboxclaims", sandbox.metadata.namespace, ref.name)
  if not claim or claim.metadata.uid ~= ref.uid or claim.metadata.deletionTimestamp then return end
  self:sync_claim(claim, sandbox)
end

function ctl_mt:sync_claim(claim, sandbox)
  local before = self.objects.encode(claim.status or {})
  local ready = condition(sandbox, "Ready")
  claim.status = claim.status or {}
  if ready then
    local kept = {}
    for _, c in ipairs(claim.status.conditions or {}) do
      if c.type ~= "Ready" then kept[#kept + 1] = c end
    end
    kept[#kept + 1] = self.objects.copy(ready)
    claim.status.conditions = kept
  else
    set_condition(claim, "Ready", "False", "SandboxNotReady", "Sandbox is not ready", claim.metadata.generation,
      self.objects.now())
  end
  local finished = condition(sandbox, "Finished")
  set_condition(claim, "Finished", finished and "True" or nil, finished and finished.reason,
    finished and finished.message, finished and finished.observedGeneration, self.objects.now())
  claim.status.sandbox = { name = sandbox.metadata.name, podIPs = sandbox.status.podIPs }
  if self.objects.encode(claim.status) ~= before then self.objects.put("sandboxclaims", claim, "MODIFIED") end
end

-- Pods ----------------------------------------------------------------------------------------------

--- Makes the pod `name` of a Sandbox: Pending, then Running with its agent's address, then
-- Ready unless the pool never readies (each step synced); returns the pod.
function ctl_mt:start_pod(sandbox, name, pool)
  local ns = sandbox.metadata.namespace
  local pod = { apiVersion = "v1", kind = "Pod",
    metadata = { name = name, namespace = ns, uid = self.objects.uuid(), creationTimestamp = self.objects.now(),
      labels = { ["agents.x-k8s.io/sandbox-name-hash"] = sandbox.metadata.name },
      ownerReferences = { { apiVersion = API_SANDBOXES, kind = "Sandbox", name = sandbox.metadata.name,
        uid = sandbox.metadata.uid, controller = true, blockOwnerDeletion = true } } },
    spec = { containers = { { name = "agent", image = "sandkit-agent" } } },
    status = { phase = "Pending", conditions = { { type = "PodScheduled", status = "True" } } } }
  self.objects.put("pods", pod, "ADDED")
  self:sync(sandbox)
  cqueues.sleep(STEP)
  local agent = self:start_agent(pod.metadata.uid)
  if self.objects.get("pods", ns, name) ~= pod then
    -- Deleted while it started.
    self:stop_agent(pod.metadata.uid)
    return nil
  end
  pod.status.phase = "Running"
  pod.status.podIP, pod.status.podIPs = agent.ip, { { ip = agent.ip } }
  pod.status.conditions[#pod.status.conditions + 1] = { type = "Ready", status = "False" }
  self.objects.put("pods", pod, "MODIFIED")
  self:sync(sandbox)
  if pool and pool.end_phase then
    cqueues.sleep(STEP)
    self:end_pod(ns, name, pool.end_phase)
    return pod
  end
  if pool and pool.never_ready then return pod end
  cqueues.sleep(pool and pool.ready_delay or STEP)
  if self.objects.get("pods", ns, name) ~= pod then return nil end
  set_condition(pod, "Ready", "True", nil, nil, nil, self.objects.now())
  self.objects.put("pods", pod, "MODIFIED")
  self:sync(sandbox)
  return pod
end

--- Deletes a pod as kubelet does: Terminating (its agent still up) for a while, then gone.
function ctl_mt:delete_pod(pod, sandbox)
  if pod.metadata.deletionTimestamp then return end
  pod.metadata.deletionTimestamp = self.objects.now()
  self.objects.put("pods", pod, "MODIFIED")
  if sandbox then self:sync(sandbox) end
  cqueues.sleep(self.terminating)
  self:stop_agent(pod.metadata.uid)
  if self.objects.get("pods", pod.metadata.namespace, pod.metadata.name) == pod then
    self.objects.remove("pods", pod)
  end
  if sandbox and self.objects.get("sandboxes", sandbox.metadata.namespace, sandbox.metadata.name) == sandbox then
    self:sync(sandbox)
  end
end

-- Warm pools --------------------------------------------------------------------------------------

local function serves(pool)
  return pool and not pool.fail_reason and not pool.expire_before_ready and not pool.template_missing
end

function ctl_mt:pool_uid(name)
  self.warm[name] = self.warm[name] or { uid = self.objects.uuid(), sandboxes = {} }
  return self.warm[name].uid
end

--- Makes one warm Sandbox of the pool, with its pod started.
function ctl_mt:make_warm(name)
  local pool = self.pools[name]
  local ns = self.namespace
  local sb_name = name .. "-" .. self.objects.uuid():sub(1, 5)
  local pod_name = pool.pod_name_annotation and (sb_name .. "-pod") or sb_name
  local sandbox = { apiVersion = API_SANDBOXES, kind = "Sandbox",
    metadata = { name = sb_name, namespace = ns, uid = self.objects.uuid(), creationTimestamp = self.objects.now(),
      generation = 1, labels = { ["agents.x-k8s.io/warm-pool-sandbox"] = name },
      annotations = { [kube_controller.POD_NAME_ANNOTATION] = pod_name },
      ownerReferences = { { apiVersion = API_CLAIMS, kind = "SandboxWarmPool", name = name, uid = self:pool_uid(name),
        controller = true, blockOwnerDeletion = true } } },
    spec = { operatingMode = "Running",
      podTemplate = { spec = { containers = { { name = "agent", image = "sandkit-agent" } } } } } }
  self.objects.put("sandboxes", sandbox, "ADDED")
  local list = self.warm[name].sandboxes
  list[#list + 1] = sandbox
  self:start_pod(sandbox, pod_name, pool)
end

--- Keeps every serving pool at its replicas (warm Sandboxes not yet adopted, or being made).
function ctl_mt:fill(name)
  local pool = self.pools[name]
  if not serves(pool) then return end
  self:pool_uid(name)
  local entry = self.warm[name]
  entry.making = entry.making or 0
  while #entry.sandboxes + entry.making < (pool.replicas or 1) do
    entry.making = entry.making + 1
    spawn(self, function()
      local ok, err = pcall(self.make_warm, self, name)
      entry.making = entry.making - 1
      assert(ok, err)
    end)
  end
end

function ctl_mt:fill_all()
  if self.filled then return end
  self.filled = true
  for name in pairs(self.pools) do self:fill(name) end
end

-- Claims -------------------------------------------------------------------------------------------

local function claim_condition(self, claim, reason, message)
  set_condition(claim, "Ready", "False", reason, message, claim.metadata.generation, self.objects.now())
  self.objects.put("sandboxclaims", claim, "MODIFIED")
end

--- The warm path: the oldest warm Sandbox whose pod is up, moved from the pool to the claim.
function ctl_mt:adopt(claim, sandbox, pool)
  local ns = claim.metadata.namespace
  claim.metadata.annotations = claim.metadata.annotations or {}
  claim.metadata.annotations[kube_controller.SANDBOX_NAME_ANNOTATION] = sandbox.metadata.name
  self.objects.put("sandboxclaims", claim, "MODIFIED")
  sandbox.metadata.ownerReferences = { { apiVersion = API_CLAIMS, kind = "SandboxClaim", name = claim.metadata.name,
    uid = pool.foreign_owner and self.objects.uuid() or claim.metadata.uid, controller = true,
    blockOwnerDeletion = true } }
  sandbox.metadata.labels = { [kube_controller.CLAIM_UID_LABEL] = claim.metadata.uid }
  self.objects.put("sandboxes", sandbox, "MODIFIED")
  local pod = self:pod_of(sandbox)
  if pod then
    pod.metadata.labels[kube_controller.CLAIM_UID_LABEL] = claim.metadata.uid
    if pool.foreign_pod_owner then controller_of(pod).uid = self.objects.uuid() end
    self.objects.put("pods", pod, "MODIFIED")
  end
  local fresh = self.objects.get("sandboxclaims", ns, claim.metadata.name)
  if fresh == claim then self:sync_claim(claim, sandbox) end
end

--- The cold path: a Sandbox named after the claim, and its pod started from nothing.
function ctl_mt:cold_start(claim, pool)
  local ns, name = claim.metadata.namespace, claim.metadata.name
  local sandbox = { apiVersion = API_SANDBOXES, kind = "Sandbox",
    metadata = { name = name, namespace = ns, uid = self.objects.uuid(), creationTimestamp = self.objects.now(),
      generation = 1, labels = { [kube_controller.CLAIM_UID_LABEL] = claim.metadata.uid },
      ownerReferences = { { apiVersion = API_CLAIMS, kind = "SandboxClaim", name = name,
        uid = pool.foreign_owner and self.objects.uuid() or claim.metadata.uid, controller = true,
        blockOwnerDeletion = true } } },
    spec = { operatingMode = "Running",
      podTemplate = { spec = { containers = { { name = "agent", image = "sandkit-agent" } } } } } }
  self.objects.put("sandboxes", sandbox, "ADDED")
  claim.status = claim.status or {}
  claim.status.sandbox = { name = name }
  claim_condition(self, claim, "SandboxNotReady", "Sandbox is not ready")
  local pod_name = name
  if pool.pod_name_annotation then
    pod_name = name .. "-pod"
    sandbox.metadata.annotations = { [kube_controller.POD_NAME_ANNOTATION] = pod_name }
    self.objects.put("sandboxes", sandbox, "MODIFIED")
  end
  local pod = self:start_pod(sandbox, pod_name, pool)
  if pod and pool.foreign_pod_owner then
    controller_of(pod).uid = self.objects.uuid()
    self.objects.put("pods", pod, "MODIFIED")
  end
end

--- Binds a new claim: its pool's warm Sandbox, else a cold one; or the condition that stops it.
function ctl_mt:bind(ref)
  local pool = self.pools[ref.pool]
  cqueues.sleep(pool and pool.bind_delay or STEP)
  local claim = self.objects.get("sandboxclaims", ref.ns, ref.name)
  if not claim or claim.metadata.uid ~= ref.uid or claim.metadata.deletionTimestamp then return end
  if not pool then
    return claim_condition(self, claim, "WarmPoolNotFound", string.format('SandboxWarmPool "%s" not found', ref.pool))
  elseif pool.template_missing then
    return claim_condition(self, claim, "TemplateNotFound", string.format('SandboxTemplate "%s" not found', ref.pool))
  elseif pool.expire_before_ready then
    return claim_condition(self, claim, "ClaimExpired", "Claim expired. Sandbox cleanup initiated.")
  elseif pool.fail_reason then
    return claim_condition(self, claim, pool.fail_reason, pool.fail_reason .. " for warm pool " .. ref.pool)
  end
  local entry = self.warm[ref.pool]
  local sandbox
  for i, candidate in ipairs(entry and entry.sandboxes or {}) do
    if self:pod_of(candidate) then
      sandbox = table.remove(entry.sandboxes, i)
      break
    end
  end
  if sandbox then
    self:adopt(claim, sandbox, pool)
    self:fill(ref.pool)
  else
    self:cold_start(claim, pool)
  end
end

--- Seconds between looks at a claim's shutdownTime: the end is whole seconds.
local SHUTDOWN_EVERY = 0.1

--- Deletes the claim once its shutdownTime has passed (policy Delete), for as long as it is
-- the same claim.
function ctl_mt:watch_shutdown(ref)
  spawn(self, function()
    while true do
      local claim = self.objects.get("sandboxclaims", ref.ns, ref.name)
      if not claim or claim.metadata.uid ~= ref.uid then return end
      local lifecycle = type(claim.spec) == "table" and claim.spec.lifecycle or {}
      local ends = time.parse_rfc3339(lifecycle.shutdownTime)
      if ends and lifecycle.shutdownPolicy == "Delete" and os.time() >= ends then
        self.log{ shutdown = ref.name }
        self.objects.remove("sandboxclaims", claim)
        self:claim_deleted(ref.uid, ref.ns)
        return
      end
      cqueues.sleep(SHUTDOWN_EVERY)
    end
  end)
end

function ctl_mt:claim_added(claim)
  local ref = { ns = claim.metadata.namespace, name = claim.metadata.name, uid = claim.metadata.uid,
    pool = claim.spec.warmPoolRef.name }
  spawn(self, function() self:bind(ref) end)
  self:watch_shutdown(ref)
end

--- What Background propagation does once a claim is gone: its Sandboxes at once, their pods
-- after lingering Terminating.
function ctl_mt:claim_deleted(claim_uid, ns)
  spawn(self, function()
    cqueues.sleep(0.01)
    for _, sandbox in ipairs(self:each("sandboxes", ns)) do
      local ref = controller_of(sandbox)
      if ref and ref.uid == claim_uid then
        self.objects.remove("sandboxes", sandbox)
        for _, pod in ipairs(self:pods_of(sandbox)) do
          spawn(self, function() self:delete_pod(pod) end)
        end
      end
    end
  end)
end

--- A pool made or changed: serving pools are filled, and claims that waited for it bound.
function ctl_mt:set_pool(name, pool)
  self.pools[name] = pool
  self:fill(name)
  for _, claim in ipairs(self:each("sandboxclaims", self.namespace)) do
    local c = condition(claim, "Ready")
    if claim.spec.warmPoolRef.name == name and c
        and (c.reason == "WarmPoolNotFound" or c.reason == "TemplateNotFound") then
      self:claim_added(claim)
    end
  end
end

-- Sandboxes -------------------------------------------------------------------------------------

--- After a change to a Sandbox's spec: Suspended takes its pod away, Running brings one back.
function ctl_mt:sandbox_changed(sandbox)
  local ns, name = sandbox.metadata.namespace, sandbox.metadata.name
  local function live() return self.objects.get("sandboxes", ns, name) == sandbox end
  spawn(self, function()
    if sandbox.spec.operatingMode == "Suspended" then
      local pod = self:pod_of(sandbox)
      if sandbox.metadata.annotations and sandbox.metadata.annotations[kube_controller.POD_NAME_ANNOTATION] then
        sandbox.metadata.annotations[kube_controller.POD_NAME_ANNOTATION] = nil
        self.objects.put("sandboxes", sandbox, "MODIFIED")
      end
      self:sync(sandbox)
      if pod then self:delete_pod(pod, sandbox) end
      return
    end
    -- Running: a pod still terminating is waited for, then a new one is made, named after the
    -- Sandbox, unless one serves already.
    while live() do
      local pod = self:pod_of(sandbox)
      if pod and not pod.metadata.deletionTimestamp then return end
      if #self:pods_of(sandbox) == 0 then return self:start_pod(sandbox, name, nil) end
      cqueues.sleep(STEP)
    end
  end)
end

-- Control ---------------------------------------------------------------------------------------

--- The chain of a claim: its Sandbox and pod, or nil.
function ctl_mt:chain(ns, claim_name)
  local claim = self.objects.get("sandboxclaims", ns, claim_name)
  local sb_name = claim and claim.status and claim.status.sandbox and claim.status.sandbox.name
  local sandbox = sb_name and self.objects.get("sandboxes", ns, sb_name)
  return claim, sandbox, sandbox and self:pod_of(sandbox)
end

--- The pod's phase becomes Succeeded or Failed: its container exited, and nothing restarts it.
function ctl_mt:end_pod(ns, pod_name, phase)
  local pod = self.objects.get("pods", ns, pod_name)
  if not pod then return nil end
  self:stop_agent(pod.metadata.uid)
  pod.status.phase = phase
  set_condition(pod, "Ready", "False", "PodCompleted", nil, nil, self.objects.now())
  self.objects.put("pods", pod, "MODIFIED")
  local ref = controller_of(pod)
  for _, sandbox in ipairs(self:each("sandboxes", ns)) do
    if ref and sandbox.metadata.uid == ref.uid then self:sync(sandbox) end
  end
  return true
end

--- A second pod under a claim's Sandbox (what an adoption race leaves): MultiplePods.
function ctl_mt:extra_pod(ns, claim_name)
  local _, sandbox = self:chain(ns, claim_name)
  if not sandbox then return nil end
  local pod = { apiVersion = "v1", kind = "Pod",
    metadata = { name = sandbox.metadata.name .. "-extra", namespace = ns, uid = self.objects.uuid(),
      creationTimestamp = self.objects.now(), labels = {},
      ownerReferences = { { apiVersion = API_SANDBOXES, kind = "Sandbox", name = sandbox.metadata.name,
        uid = sandbox.metadata.uid, controller = true } } },
    status = { phase = "Pending" } }
  self.objects.put("pods", pod, "ADDED")
  self:sync(sandbox)
  return true
end

--- A pod recreated under the same name: a new UID (and a new address unless same_ip).
function ctl_mt:recreate(ns, pod_name, same_ip)
  local pod = self.objects.get("pods", ns, pod_name)
  if not pod then return nil end
  local old = pod.metadata.uid
  local ip = same_ip and pod.status.podIP or nil
  self:stop_agent(old)
  pod.metadata.uid = self.objects.uuid()
  local agent = self:start_agent(pod.metadata.uid, ip)
  pod.status.podIP, pod.status.podIPs = agent.ip, { { ip = agent.ip } }
  self.objects.put("pods", pod, "MODIFIED")
  return { uid = pod.metadata.uid, ip = agent.ip, old_uid = old }
end

return kube_controller
