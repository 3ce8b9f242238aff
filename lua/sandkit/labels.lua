--- Session labels where a provider keeps them among labels of its own (a Kubernetes claim's, an
-- Azure sandbox's): each key of a session's under one prefix, apart from the labels sandkit and
-- the platform read (app.kubernetes.io/managed-by, alienAgentTransport), which no session label
-- can then set or overwrite. A key with a prefix of its own cannot go under another, and is
-- refused there. The keys and values themselves are checked by options.labels.

local errors = require "sandkit.errors"

local labels = {}

labels.PREFIX = "label.sandkit.dev/"

--- The platform labels a session's labels are stored as, added to `into` (a fresh table when nil).
function labels.stored(session_labels, into)
  local out = into or {}
  for k, v in pairs(session_labels or {}) do out[labels.PREFIX .. k] = v end
  return out
end

--- The session labels among a platform's `stored` labels (string keys and values only).
function labels.of(stored)
  local out = {}
  for k, v in pairs(type(stored) == "table" and stored or {}) do
    if type(k) == "string" and type(v) == "string" and k:sub(1, #labels.PREFIX) == labels.PREFIX then
      out[k:sub(#labels.PREFIX + 1)] = v
    end
  end
  return out
end

--- nil, or INVALID_INPUT naming the first key (sorted) with a prefix of its own; `where` names
-- the provider.
function labels.refuse_prefixed(session_labels, operation, where)
  local keys = {}
  for k in pairs(session_labels or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    if k:find("/", 1, true) then
      return errors.invalid_input(operation, "labels", string.format("label key %q has a prefix: on "
        .. "%s a session's labels go under %s, and a key there takes no other prefix",
        k:sub(1, 64), where, labels.PREFIX))
    end
  end
end

return labels
