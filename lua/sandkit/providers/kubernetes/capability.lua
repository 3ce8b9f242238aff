--- Capabilities: the Ed25519-signed tokens that authorize a request to one Kubernetes
-- session's agent (docs/protocol.md §2.1).
--
--   token  = P "." S
--   P      = base64url_nopad(claims JSON)
--   S      = base64url_nopad(Ed25519 signature over the ASCII bytes of P)
--   claims = { sessionId = <pod UID>, operation = "execute", generation = 1,
--              expiresAt = <unix seconds>, keyId = <the signing key's id> }
--
-- The session is the pod's UID: the pod knows it at boot through the Downward API, and a pod
-- recreated under the same name has a new one, so tokens minted for the pod before it are
-- refused.

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local json = require "sandkit.json"
local localfile = require "sandkit.localfile"

local capability = {}

--- Seconds a token lives unless the sandbox says otherwise: long enough to serve a burst of
-- requests, short enough that a leaked token is soon worthless.
capability.DEFAULT_LIFETIME = 300
--- The longest life a token is minted for, whatever is asked: the agent refuses anything
-- claiming more than an hour, and a quarter of that bounds what a leak can do.
capability.MAX_LIFETIME = 900
--- A token with less than this left is minted again rather than sent: a request must arrive,
-- and an exec stream's headers come back, well before it expires, even over a slow path.
capability.REMINT_MARGIN = 60
--- The only generation a Kubernetes session has (a recreated pod is a new session).
capability.GENERATION = 1

local B64URL = { ["+"] = "-", ["/"] = "_", ["="] = "" }

--- base64url without padding (RFC 4648 §5), from the core's standard base64.
function capability.b64url(bytes)
  return (core.b64encode(bytes):gsub("[+/=]", B64URL))
end

--- The token for claims, signed by key (a core.ed25519_key).
function capability.encode(key, claims)
  local payload = capability.b64url(json.encode(claims))
  return payload .. "." .. capability.b64url(key:sign(payload))
end

--- Reads an Ed25519 private key from a PKCS#8 PEM file: key | nil, err naming the field.
function capability.load_key(path, operation)
  if type(path) ~= "string" or path == "" then
    return nil, errors.invalid_input(operation, "signing_key", "the kubernetes provider needs "
      .. "signing_key, the path of an Ed25519 private key in PKCS#8 PEM "
      .. "(openssl genpkey -algorithm ed25519 -out key.pem)")
  end
  -- A PEM key is 119 bytes: a file of more than this is none.
  local max = 64 * 1024
  local pem, problem, detail = localfile.read_config(path, max)
  if problem == "too_long" then
    detail = "larger than " .. max .. " bytes"
  elseif not pem then
    return nil, errors.invalid_input(operation, "signing_key", "signing_key cannot be read: " .. detail)
  end
  local key, why
  if pem then key, why = core.ed25519_key(pem) else why = detail end
  if not key then
    return nil, errors.invalid_input(operation, "signing_key", "signing_key " .. path .. " is "
      .. "not an Ed25519 private key: " .. tostring(why))
  end
  return key
end

local minter_mt = {}
minter_mt.__index = minter_mt

--- A token source for one session: mints, keeps the token while more than REMINT_MARGIN
-- seconds of it remain, and mints again for a new session id (a recreated pod).
-- opts: key, key_id, lifetime (seconds, clamped to MAX_LIFETIME), now (a clock, os.time).
function capability.minter(opts)
  -- Whole seconds: expiresAt is an integer on the wire.
  local lifetime = math.floor(math.min(opts.lifetime or capability.DEFAULT_LIFETIME,
    capability.MAX_LIFETIME))
  return setmetatable({ key = opts.key, key_id = opts.key_id, lifetime = lifetime,
    now = opts.now or os.time }, minter_mt)
end

--- The token to send to session_id now, and its expiresAt.
function minter_mt:token(session_id)
  local now = self.now()
  if self.session ~= session_id or self.expires_at - now < capability.REMINT_MARGIN then
    self.expires_at = math.floor(now) + self.lifetime
    self.session = session_id
    self.value = capability.encode(self.key, { sessionId = session_id, operation = "execute",
      generation = capability.GENERATION, expiresAt = self.expires_at, keyId = self.key_id })
  end
  return self.value, self.expires_at
end

--- Drops the kept token: the next request mints a fresh one.
function minter_mt:forget()
  self.session = nil
end

return capability
