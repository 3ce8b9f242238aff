--- Option tables are checked against the keys their call knows: a misspelt key (`comand_timeout`,
-- `cwdd`) would otherwise be silently ignored, and the caller would get a default they never
-- chose. The refusal is INVALID_INPUT naming the key and the nearest known one.

local errors = require "sandkit.errors"
local json = require "sandkit.json"

local options = {}

--- Edit distance between two short strings (option names), for "did you mean".
local function distance(a, b)
  local prev = {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = { [0] = i }
    local ca = a:sub(i, i)
    for j = 1, #b do
      local cost = ca == b:sub(j, j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return prev[#b]
end

--- The known key nearest to `key`, or nil when none is near enough to be a slip: at most a
-- third of the key's letters (and at least two) changed.
function options.nearest(key, ...)
  local best, best_d
  for i = 1, select("#", ...) do
    for known in pairs((select(i, ...))) do
      local d = distance(key, known)
      if not best_d or d < best_d or (d == best_d and known < best) then best, best_d = known, d end
    end
  end
  if best and best_d <= math.max(2, math.floor(#key / 3)) then return best end
  return nil
end

--- nil when every key of `given` is in one of the sets (tables whose keys are names), else an
-- INVALID_INPUT error for `operation` naming the first unknown key (in sorted order, so the
-- same mistake always gets the same message).
function options.check(operation, given, ...)
  if given == nil then return nil end
  local unknown
  for key in pairs(given) do
    local known = false
    for i = 1, select("#", ...) do
      if (select(i, ...))[key] ~= nil then
        known = true
        break
      end
    end
    if not known and (unknown == nil or tostring(key) < tostring(unknown)) then unknown = key end
  end
  if unknown == nil then return nil end
  if type(unknown) ~= "string" then
    return errors.invalid_input(operation, tostring(unknown), "option names are strings, not "
      .. type(unknown) .. "s")
  end
  local near = options.nearest(unknown, ...)
  return errors.invalid_input(operation, unknown, "unknown option " .. unknown
    .. (near and (" (did you mean " .. near .. "?)") or ""))
end

--- A set from a list of names.
function options.set(list)
  local s = {}
  for _, name in ipairs(list) do s[name] = true end
  return s
end

-- Values ---------------------------------------------------------------------------------------
-- Each kind of number an option holds is written once, as what a value must be and the words
-- saying so. The options of a call or a sandbox are held to it (options.seconds and its
-- siblings below), and so is the text of a `sandkit` flag (options.flag). NaN fails every
-- comparison and infinity is no deadline, cap or lifetime, so neither is ever one.

--- The largest whole number a value may be: lua-cjson writes numbers with 14 significant
-- digits, so a bigger one would reach an agent rounded, or in exponent form that it refuses.
options.MAX_WHOLE = 99999999999999

local function finite(n)
  return type(n) == "number" and n > -math.huge and n < math.huge
end

local function whole(n)
  local i = json.integer(n)
  return i ~= nil and i >= 0 and i <= options.MAX_WHOLE
end

local KINDS = {
  --- Seconds, more than none (a deadline, a wait).
  seconds = { fits = function(n) return finite(n) and n > 0 end, says = "a positive number of seconds" },
  --- Whole seconds, more than none (a lifetime kept by a clock that counts in seconds).
  whole_seconds = { fits = function(n) return whole(n) and n > 0 end,
    says = "a whole positive number of seconds" },
  --- A session's lifetime: a second at least, the wall clock its record keeps counting in seconds.
  lifetime = { fits = function(n) return finite(n) and n >= 1 end, says = "a number of seconds, 1 or more" },
  --- A count or a byte size, 0 included.
  whole_number = { fits = whole, says = "a whole number (at most " .. options.MAX_WHOLE .. ")" },
  --- Seconds of a stream's silence after which the agent sends a keep-alive (docs/protocol.md
  -- §6 keepalive), within the agent's bounds on keepaliveMs; false asks for none.
  keepalive = { fits = function(n) return n == false or (finite(n) and n >= 0.1 and n <= 3600) end,
    says = "a number of seconds from 0.1 to 3600, or false for none" },
  --- A TCP port.
  port = { fits = function(n) return whole(n) and n >= 1 and n <= 65535 end, says = "a port number" },
}

--- A checker of option tables for one kind: (operation, given, name, default) -> given[name],
-- or `default` when it is absent; nil and INVALID_INPUT naming the option when it is not of
-- the kind.
local function checker(kind)
  return function(operation, given, name, default)
    local v = given and given[name]
    if v == nil then return default end
    if KINDS[kind].fits(v) then return v end
    return nil, errors.invalid_input(operation, name, name .. " is " .. KINDS[kind].says)
  end
end

--- Whether `v` is a value of `kind` ("seconds", "whole_seconds", "lifetime", "whole_number",
-- "keepalive", "port").
function options.is(kind, v)
  return KINDS[kind].fits(v)
end

options.seconds = checker("seconds")
options.whole_seconds = checker("whole_seconds")
options.lifetime = checker("lifetime")
options.whole_number = checker("whole_number")
options.keepalive = checker("keepalive")
options.port = checker("port")

--- The values of `names` (a list) held to `check` (options.seconds or a sibling) one by one,
-- in the list's order: a table of name -> value (its default in `defaults` when absent), or
-- nil and the first refusal.
function options.each(check, operation, given, names, defaults)
  local values = {}
  for _, name in ipairs(names) do
    local v, bad = check(operation, given, name, defaults and defaults[name])
    if bad then return nil, bad end
    values[name] = v
  end
  return values
end

--- The number a flag's text writes in decimal digits, with a fraction or not, or nil: tonumber
-- also reads `0x10` as 16, `1e3` as 1000, ` 16` and `+16` as 16, and `inf` as infinity, and a
-- flag that meant something else by them would be taken to mean a number nobody wrote. The one
-- reader of a flag's number, as sandkit-agent has one (src/agent/main.c).
local function decimal(text)
  if type(text) ~= "string" or not text:match("^%d*%.?%d*$") or not text:match("%d") then return nil end
  return tonumber(text)
end

--- The `sandkit` command's converters of a flag's text (cli.lua's OPTIONS, a provider's
-- CLI_OPTIONS), one per kind: each returns the value, or nil and what the text should be.
-- 400 digits read as infinity; the kinds refuse it.
options.flag = {}
for kind, rule in pairs(KINDS) do
  options.flag[kind] = function(text)
    local n = decimal(text)
    if n and rule.fits(n) then return json.integer(n) or n end
    return nil, rule.says
  end
end

-- Lifetimes and labels ---------------------------------------------------------------------------

--- 9999-12-31T23:59:59Z: the last second RFC 3339 can write with a four-digit year (a claim's
-- shutdownTime) and the last end sandkit-agent's --lifetime-file takes. No session outlives it.
options.LAST_TIME = 253402300799

--- The Unix time a session asked to live `seconds` more from now ends at (whole seconds: the
-- clocks that keep it count in seconds, so a fraction is a second more), or nil and
-- INVALID_INPUT naming `name`: NaN, infinity, less than a second, or past options.LAST_TIME.
function options.lifetime_end(operation, seconds, name)
  local s, bad = options.lifetime(operation, { [name] = seconds }, name)
  if bad then return nil, bad end
  if s == nil then
    return nil, errors.invalid_input(operation, name, name .. " is " .. KINDS.lifetime.says)
  end
  local ends = os.time() + math.ceil(s)
  if ends > options.LAST_TIME then
    return nil, errors.invalid_input(operation, name, name .. " ends after 9999-12-31T23:59:59Z, "
      .. "the last time a session's lifetime can name")
  end
  return ends
end

--- Labels a session carries at most: enough to tag a session by team, run and purpose many
-- times over, few enough that a record, a claim's metadata and a label selector stay small.
options.MAX_LABELS = 32

--- A label name, as Kubernetes has them (its rules are the strictest of the providers', so a
-- label valid here is valid everywhere): 1 to 63 of [A-Za-z0-9._-], starting and ending
-- alphanumeric. A value is the same, or empty.
local MAX_LABEL_NAME = 63
local function label_name(s)
  return #s >= 1 and #s <= MAX_LABEL_NAME
    and (s:match("^%w$") ~= nil or s:match("^%w[%w%._%-]*%w$") ~= nil)
end

--- A key's optional prefix is a DNS subdomain: at most 253 characters, dot-separated parts of
-- [a-z0-9-] that start and end alphanumeric.
local MAX_LABEL_PREFIX = 253
local function dns_subdomain(s)
  if #s < 1 or #s > MAX_LABEL_PREFIX then return false end
  for part in (s .. "."):gmatch("([^.]*)%.") do
    if not (part:match("^[a-z0-9]$") or part:match("^[a-z0-9][a-z0-9%-]*[a-z0-9]$")) then return false end
  end
  return true
end

--- Whether `key` is a label key: [PREFIX/]NAME, PREFIX a DNS subdomain, NAME a label name.
local function label_key(key)
  local prefix, name = key:match("^([^/]*)/([^/]*)$")
  if prefix then return dns_subdomain(prefix) and label_name(name) end
  return label_name(key)
end

--- What a refusal quotes of a key or value: enough to find it, bounded whatever was given.
local function quoted(s)
  return string.format("%q", #s > 64 and (s:sub(1, 64) .. "...") or s)
end

--- The one check of labels, for every provider and call: given[name] as a fresh table of
-- key -> value, nil when absent, or nil and INVALID_INPUT naming the first bad key (in sorted
-- order, so the same mistake always gets the same message).
function options.labels(operation, given, name)
  local labels = given and given[name]
  if labels == nil then return nil end
  local function bad(why) return nil, errors.invalid_input(operation, name, why) end
  if type(labels) ~= "table" then return bad(name .. " maps label keys to values, not a " .. type(labels)) end
  local keys = {}
  for k in pairs(labels) do
    if type(k) ~= "string" then return bad("a label key is a string, not a " .. type(k)) end
    keys[#keys + 1] = k
    if #keys > options.MAX_LABELS then return bad("at most " .. options.MAX_LABELS .. " labels") end
  end
  table.sort(keys)
  local out = {}
  for _, k in ipairs(keys) do
    local v = labels[k]
    if not label_key(k) then
      return bad("label key " .. quoted(k) .. " is not [PREFIX/]NAME: NAME 1 to 63 of "
        .. "[A-Za-z0-9._-] starting and ending alphanumeric, PREFIX a DNS subdomain of at most 253")
    end
    if type(v) ~= "string" then return bad("label " .. quoted(k) .. " has a " .. type(v) .. " value, not a string") end
    if v ~= "" and not label_name(v) then
      return bad("label " .. quoted(k) .. " has the value " .. quoted(v) .. ": a value is empty, or 1 to 63 "
        .. "of [A-Za-z0-9._-] starting and ending alphanumeric")
    end
    out[k] = v
  end
  return out
end

--- Whether a session's `labels` hold every key of `wanted` with its value.
function options.labels_match(labels, wanted)
  for k, v in pairs(wanted or {}) do
    if (labels or {})[k] ~= v then return false end
  end
  return true
end

-- Ids --------------------------------------------------------------------------------------------

--- The ids sandkit checks, each as { max = characters, pattern = what it matches, valid = a
-- further test (optional), what = the sentence saying what one is }.
--- A session id of the local and Azure providers (and a job's, one longer): a directory name, a
-- URL path segment, the same in each so that ids move between them.
options.SESSION_ID = { max = 63, pattern = "^[%w_%-]+$", what = "a session id is 1 to 63 of [A-Za-z0-9_-]" }
--- A job id: the agent protocol's bound (docs/protocol.md).
options.JOB_ID = { max = 64, pattern = "^[%w_%-]+$", what = "a job id is 1 to 64 of [A-Za-z0-9_-]" }

--- nil when `id` is one of `rule`'s ids, else INVALID_INPUT for `operation` saying what one is
-- (`field`, "id" unless given, names it).
function options.id(operation, id, rule, field)
  if type(id) == "string" and #id >= 1 and #id <= rule.max and id:match(rule.pattern)
      and (rule.valid == nil or rule.valid(id)) then
    return nil
  end
  return errors.invalid_input(operation, field or "id", rule.what)
end

return options
