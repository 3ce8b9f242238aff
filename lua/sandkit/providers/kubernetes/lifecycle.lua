--- A Kubernetes session's life: a SandboxClaim posted once and settled by reading it back,
-- waited for until its chain holds and its agent answers, handed back, listed, and deleted.
-- Methods of the kubernetes provider (lifecycle.methods).

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local options_check = require "sandkit.options"
local readiness = require "sandkit.readiness"
local time = require "sandkit.time"
local wait = require "sandkit.wait"
local claims = require "sandkit.providers.kubernetes.claims"
local watch = require "sandkit.providers.kubernetes.watch"

local lifecycle = { methods = {} }
local methods = lifecycle.methods

--- The annotation a create writes its nonce to, by which it knows its claim read back.
lifecycle.NONCE_ANNOTATION = "sandkit.dev/nonce"
--- 9999-12-31T23:59:59Z, the last time RFC 3339 (a claim's shutdownTime) can write.
local LAST_SHUTDOWN_TIME = options_check.LAST_TIME
--- A few conflicts in a row are the controller writing an object as it is read; more say
-- something else writes it all the time.
local MAX_CONFLICTS = 5

local meta, ready_condition, describe = claims.meta, claims.ready_condition, claims.describe

local function hex(n)
  return (core.random(n):gsub(".", function(c) return string.format("%02x", c:byte()) end))
end

--- Deletes a claim (Background: its Sandbox and pod go after it). With the uid, only that
-- object: a claim of the same name made since is someone else's. True also when it is gone.
function methods:delete_claim(id, uid, operation)
  local _, err = self.api:call{ operation = operation, verb = "delete", resource = "sandboxclaims",
    namespace = self.namespace, name = id, method = "DELETE", path = self:claims_path(id),
    absent_on_404 = true, body = { apiVersion = "v1", kind = "DeleteOptions",
      propagationPolicy = "Background", preconditions = uid and { uid = uid } or nil } }
  -- 409 is the uid precondition failing: the claim meant is already gone.
  if err and err.status ~= 409 then return nil, err end
  return true
end

--- What waits on a claim say of a reason it cannot serve for (claims.stopped's): the
-- installation's refusal is INVALID_INPUT, anything else unreachable for good.
local function terminal_error(operation, claim, reason, kind, grace)
  local message = operation .. ": claim " .. meta(claim).name .. " cannot become ready: "
    .. describe(claim)
  if kind == "missing" then
    return errors.new("INVALID_INPUT", { operation = operation, reason = reason, field = "warm_pool",
      message = message .. string.format(" for %gs (pool_grace); agent-sandbox takes the claim up again "
        .. "once the SandboxWarmPool and its SandboxTemplate exist", grace) })
  elseif kind == "config" then
    return errors.new("INVALID_INPUT", { operation = operation, reason = reason, message = message })
  elseif kind == "paused" then
    message = message .. "; resume the session first"
  end
  return errors.new("SANDBOX_UNREACHABLE", { operation = operation, reason = reason,
    message = message, retryable = false })
end

--- Follows a claim through a watch (watch.follow), read again wherever the watch cannot say,
-- until `judge` (watch.follow's) stops, `deadline` passes (an error saying it did not become
-- `goal` within ready_timeout, and what was last seen) or the claim is deleted.
function methods:follow(claim, operation, deadline, goal, judge)
  local id = meta(claim).name
  return watch.follow{
    object = claim, deadline = deadline, seen = describe(claim), judge = judge,
    read = function() return self:read_claim(id, operation) end,
    open = function(query)
      return self.api:watch{ operation = operation, verb = "watch", resource = "sandboxclaims",
        namespace = self.namespace, name = id, method = "GET", path = self:claims_path(),
        deadline = deadline, query = query }
    end,
    ended = function(why, seen)
      if why == "deleted" then
        return errors.unreachable(operation, "claim " .. id .. " was deleted while it was awaited; "
          .. "last seen: " .. tostring(seen))
      end
      return errors.unreachable(operation, string.format("claim %s did not become %s within %gs; "
        .. "last seen: %s", id, goal, self.times.ready_timeout, tostring(seen)))
    end,
  }
end

--- Waits for a claim to be Ready, its chain to hold and its agent to answer; returns the
-- session record, or nil and an error naming what was last seen. The claim is followed through
-- a watch (watch.follow), read again wherever the watch cannot say. A missing pool or template
-- is waited for within pool_grace; a suspended Sandbox only by a resume (`resuming`), which
-- waits for the new pod instead.
function methods:await(claim, operation, resuming)
  local id = meta(claim).name
  local deadline = wait.now() + self.times.ready_timeout
  local missing_since
  local pod, ready_claim = self:follow(claim, operation, deadline, "ready",
    function(current)
      local c = ready_condition(current)
      if meta(current).deletionTimestamp then
        return "stop", nil, errors.unreachable(operation, "claim " .. id .. " is being deleted")
      end
      local reason, kind = claims.stopped(current)
      if kind == "missing" then
        missing_since = missing_since or wait.now()
        local grace_ends = missing_since + self.times.pool_grace
        if wait.now() < grace_ends then return nil, describe(current), grace_ends end
        return "stop", nil, terminal_error(operation, current, reason, kind, self.times.pool_grace)
      end
      missing_since = nil
      if kind and not (kind == "paused" and resuming) then
        return "stop", nil, terminal_error(operation, current, reason, kind)
      end
      local seen = describe(current)
      if not (c and c.status == "True") then return nil, seen end
      local found, why = self:chain(current, operation)
      if found == nil then return "stop", nil, why end
      if found then return "stop", found, current end
      -- The claim is Ready but its pod is not in view yet: no claim event may come, so the
      -- chain is read again shortly.
      return "again", seen .. "; " .. why
    end)
  if not pod then return nil, ready_claim end
  return self:await_agent(ready_claim, pod, operation, deadline)
end

--- Waits for the pod's agent to answer health (protocol version 1, ready).
function methods:await_agent(claim, pod, operation, deadline)
  local record = claims.session_record(claim)
  local id = record.id
  record.state, record.pod = "running", pod
  local conn = self:connection(record)
  local health, err = readiness.wait(conn, { timeout = math.max(0.001, deadline - wait.now()),
    interval = self.times.ready_interval, operation = operation })
  if not health then
    return nil, errors.unreachable(operation, "the agent of claim " .. id .. " (pod " .. pod.name .. ") did "
      .. "not become ready: " .. err.message, { cause = err })
  end
  record.features = health.features
  record.boot_id = health.bootId
  return record
end

--- A new claim that could not be handed back is deleted; when that fails too, the error says
-- so and names it in `left_behind`.
function methods:discard(claim, err, operation)
  local id = meta(claim).name
  local ok, derr = self:delete_claim(id, meta(claim).uid, operation)
  if not ok then
    err.message = err.message .. "; deleting claim " .. id .. " failed too (" .. derr.message .. ")"
    err.left_behind = id
  end
  return nil, err
end

--- Whether a claim read back after an unanswered or refused create is this call's.
local function made_by(claim, nonce)
  local annotations = meta(claim).annotations
  return type(annotations) == "table" and annotations[lifecycle.NONCE_ANNOTATION] == nonce
end

--- POSTs the claim. An answer lost, a 5xx or a 409 is settled by reading the claim back and
-- comparing its nonce — never by sending the create again.
function methods:post_claim(id, lifetime, labels, operation)
  local nonce = hex(16)
  local body = {
    apiVersion = "extensions.agents.x-k8s.io/v1beta1", kind = "SandboxClaim",
    metadata = { name = id, labels = claims.claim_labels(labels),
      annotations = { [lifecycle.NONCE_ANNOTATION] = nonce } },
    spec = { warmPoolRef = { name = self.warm_pool },
      lifecycle = { shutdownTime = time.rfc3339(os.time() + lifetime),
        shutdownPolicy = "Delete" } },
  }
  local claim, err = self.api:call{ operation = operation, verb = "create",
    resource = "sandboxclaims", namespace = self.namespace, name = id, method = "POST",
    path = self:claims_path(), body = body, once = true }
  if claim then return claim end
  local unsettled = err.status == 409 or err.code == "SANDBOX_OUTCOME_UNKNOWN"
    or (err.status and err.status >= 500)
  if not unsettled then return nil, err end
  local found, ferr = self:read_claim(id, operation)
  if ferr then
    return nil, errors.new("SANDBOX_OUTCOME_UNKNOWN", { operation = operation, cause = err,
      message = operation .. ": the create of claim " .. id .. " was not settled and reading it "
        .. "back failed, so a claim may exist: " .. ferr.message })
  end
  if not found then
    return nil, errors.unreachable(operation, "claim " .. id .. " does not exist after its create "
      .. (err.status == 409 and "was refused as a duplicate" or "went unanswered")
      .. "; nothing was created, and the same create may be sent again", { cause = err })
  end
  if not made_by(found, nonce) then
    return nil, errors.new("INVALID_INPUT", { operation = operation, field = "id",
      message = operation .. ": a claim named " .. id .. " already exists and is not this call's" })
  end
  return found
end

local function refuse_env(opts, operation)
  if opts.env ~= nil and (type(opts.env) ~= "table" or next(opts.env) ~= nil) then
    -- agent-sandbox's claim env forces a cold start outside the warm pool: env goes per command.
    return errors.invalid_input(operation, "env", "kubernetes sessions take no session env "
      .. "(a claim's env forces a cold start); give env per command")
  end
  return claims.label_refusal(opts.labels, operation)
end

function methods:create(opts)
  local op = "sandbox.create"
  local refusal = refuse_env(opts, op)
  if refusal then return nil, refusal end
  local id = opts.id or ("sandkit-" .. hex(5))
  local lifetime, bad = options_check.whole_seconds(op, opts, "lifetime", self.times.lifetime)
  -- The claim's shutdownTime must be a time RFC 3339 can write, whose year has four digits.
  if not lifetime or os.time() + lifetime > LAST_SHUTDOWN_TIME then
    return nil, bad or errors.invalid_input(op, "lifetime", "lifetime is a whole number of seconds, "
      .. "ending before the year 10000")
  end
  local claim, err = self:post_claim(id, lifetime, opts.labels, op)
  if not claim then return nil, err end
  local record
  record, err = self:await(claim, op)
  if not record then return self:discard(claim, err, op) end
  return record
end

function methods:get(id)
  local op = "sandbox.get"
  local claim, err = self:read_claim(id, op)
  if err then return nil, err end
  if not claim or not self:owns(claim) then return nil end
  return self:record(claim, op)
end

--- An existing session is handed back once it serves: one still starting is waited for (and
-- never deleted here: it is not this call's to give up on).
function methods:serve(record, operation)
  if record.state ~= "starting" then return record end
  local claim, err = self:read_claim(record.id, operation)
  if not claim then return nil, err or errors.unreachable(operation, "claim " .. record.id .. " was deleted") end
  return self:await(claim, operation)
end

--- Session env and prefixed label keys are refused by get_or_create before it looks, as
-- create refuses them.
function methods:check_create(opts, operation)
  return refuse_env(opts, operation)
end

--- Every session of this sandbox: its claims, page by page, each with its chain checked as
-- `get` checks it — a session whose chain does not hold is not listed. The Sandboxes and
-- pods are read with one list each (only when some claim names a Sandbox). With `labels`, the
-- API server selects the claims carrying them.
function methods:list(labels)
  local op = "sandbox.list"
  local refusal = claims.label_refusal(labels, op)
  if refusal then return nil, refusal end
  local listed, wanted = {}, {}
  local ok, err = self:each_listed(op, "sandboxclaims",
    { { "labelSelector", claims.selector(labels) } },
    function(claim)
      if self:owns(claim) and claims.dns_label(meta(claim).name) then
        listed[#listed + 1] = claim
        local sb_name = claims.sandbox_name(claim)
        if sb_name then wanted[sb_name] = true end
      end
    end, function() listed, wanted = {}, {} end)
  if not ok then return nil, err end
  local lookup
  if next(wanted) then
    lookup, err = self:bulk_lookup(op, wanted)
    if not lookup then return nil, err end
  end
  local records = {}
  for _, claim in ipairs(listed) do
    local record, rerr = self:record(claim, op, lookup)
    if rerr then return nil, rerr end
    if record then records[#records + 1] = record end
  end
  return records
end

--- Idempotent: an absent claim is terminated. One that is not this sandbox's is refused, and
-- so is one whose chain does not hold: its Sandbox or pod is another's, and "never operated
-- on" means no DELETE. That is the refusal another pool's claim gets, not the success an
-- absent one gets: the claim is still there, and a caller told its session was terminated
-- would believe the claim gone; a chain that broke under a claim sandkit made is worth an
-- error someone reads. The claim is left to its owner and to its own shutdownTime.
function methods:terminate(id)
  local op = "sandbox.terminate"
  local claim, err = self:read_claim(id, op)
  if err then return nil, err end
  if not claim then return true end
  if not self:owns(claim) then return nil, errors.not_ours(op, id) end
  local pod, why = self:chain(claim, op)
  if pod == nil then return nil, why end
  local ok
  ok, err = self:delete_claim(id, meta(claim).uid, op)
  if not ok then return nil, errors.wrap(op, "claim " .. id .. " could not be deleted", err) end
  return true
end

--- Moves the session's end to `ends` (Unix seconds): its claim's spec.lifecycle.shutdownTime, by
-- a merge patch carrying the resourceVersion just read, so that only the claim whose ownership
-- was checked changes; a 409 (written since) reads it again. Setting an end twice is setting it
-- once: a patch whose answer was lost may go again.
function methods:set_lifetime(record, ends)
  local op = "sandbox.setLifetime"
  for _ = 1, MAX_CONFLICTS do
    local claim, err = self:read_claim(record.id, op)
    if err then return nil, err end
    if not claim or not self:owns(claim) then return nil, errors.not_ours(op, record.id) end
    local _, perr = self.api:call{ operation = op, verb = "patch", resource = "sandboxclaims",
      namespace = self.namespace, name = record.id, method = "PATCH", path = self:claims_path(record.id),
      content_type = "application/merge-patch+json",
      body = { metadata = { resourceVersion = meta(claim).resourceVersion },
        spec = { lifecycle = { shutdownTime = time.rfc3339(ends) } } } }
    if not perr then return true end
    if perr.status ~= 409 then
      return nil, errors.wrap(op, "the lifetime of session '" .. record.id .. "' could not be set", perr)
    end
  end
  return nil, errors.unreachable(op, "the claim of session '" .. record.id .. "' changed under each of "
    .. MAX_CONFLICTS .. " patches of its lifetime")
end

-- Pause and resume ------------------------------------------------------------------------------


--- The Sandbox of a session of this sandbox, read now, and its claim: sandbox, claim | nil, err.
function methods:owned_sandbox(id, operation)
  local claim, err = self:read_claim(id, operation)
  if err then return nil, err end
  if not claim or not self:owns(claim) then return nil, errors.not_ours(operation, id) end
  local sb_name = claims.sandbox_name(claim)
  local sandbox
  if sb_name then
    sandbox, err = self:read(operation, "sandboxes", sb_name)
    if err then return nil, err end
  end
  if not sandbox then
    return nil, errors.unreachable(operation, "session '" .. id .. "' has no Sandbox yet ("
      .. describe(claim) .. ")")
  end
  if not claims.controlled_by(sandbox, "SandboxClaim", meta(claim).uid) then
    return nil, errors.not_ours(operation, id)
  end
  return sandbox, claim
end

--- Sets the session's Sandbox's spec.operatingMode with a merge patch carrying the
-- resourceVersion just read, so that only the Sandbox whose chain was checked changes; a 409
-- (written since) reads it again. Setting a mode twice is setting it once: a patch whose answer
-- was lost may go again. Returns the claim as read before the patch, or nil and an error.
function methods:set_mode(id, mode, operation)
  for _ = 1, MAX_CONFLICTS do
    local sandbox, claim = self:owned_sandbox(id, operation)
    if not sandbox then return nil, claim end
    local _, err = self.api:call{ operation = operation, verb = "patch", resource = "sandboxes",
      namespace = self.namespace, name = meta(sandbox).name, method = "PATCH",
      path = self:path("sandboxes", meta(sandbox).name), content_type = "application/merge-patch+json",
      body = { metadata = { resourceVersion = meta(sandbox).resourceVersion },
        spec = { operatingMode = mode } } }
    if not err then return claim end
    if err.status ~= 409 then
      return nil, errors.wrap(operation, "the Sandbox of session '" .. id .. "' could not be set to " .. mode, err)
    end
  end
  return nil, errors.unreachable(operation, "the Sandbox of session '" .. id .. "' changed under each of "
    .. MAX_CONFLICTS .. " patches setting it " .. mode)
end

--- Suspends the session: agent-sandbox deletes its pod (what ran there is gone; the Sandbox and
-- its volumes stay). Returns once the claim says so, so that get reads it paused.
function methods:pause(record)
  local op = "sandbox.pause"
  local claim, err = self:set_mode(record.id, "Suspended", op)
  if not claim then return nil, err end
  local done
  done, err = self:follow(claim, op, wait.now() + self.times.ready_timeout, "paused", function(current)
    local state = claims.claim_state(current)
    if state == "paused" then return "stop", true end
    if state == "terminated" then
      return "stop", nil, errors.unreachable(op, "session '" .. record.id .. "' ended while it was being "
        .. "paused: " .. describe(current), { retryable = false })
    end
    return nil, describe(current)
  end)
  if not done then return nil, err end
  record.state, record.pod = "paused", nil
  return true
end

--- Resumes the session on a new pod (a new UID and address: every request reads it again) and
-- returns once its agent serves.
function methods:resume(record)
  local op = "sandbox.resume"
  local claim, err = self:set_mode(record.id, "Running", op)
  if not claim then return nil, err end
  local fresh
  fresh, err = self:await(claim, op, true)
  if not fresh then return nil, err end
  for k, v in pairs(fresh) do record[k] = v end
  return true
end

return lifecycle
