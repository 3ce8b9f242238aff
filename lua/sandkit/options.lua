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

-- Values of the command line -----------------------------------------------------------------
-- The `sandkit` command's converters of a flag's text (cli.lua's OPTIONS, a provider's
-- CLI_OPTIONS): each returns the value, or nil and what the text should be. Only finite numbers
-- pass: `inf` and `1e999` read as numbers to tonumber, and no deadline, cap or lifetime means them.

--- The largest whole number a flag takes: lua-cjson writes numbers with 14 significant digits,
-- so a bigger one would reach an agent rounded, or in exponent form that it refuses.
options.MAX_WHOLE = 99999999999999

local function finite(text)
  local n = tonumber(text)
  if n and n == n and n > -math.huge and n < math.huge then return n end
  return nil
end

local function whole(text)
  local n = json.integer(finite(text))
  if n and n >= 0 and n <= options.MAX_WHOLE then return n end
  return nil
end

--- A converter: the number `read` makes of the text when `fits` holds for it, else nil and
-- what the text should be.
local function converter(read, fits, what)
  return function(text)
    local n = read(text)
    if n and fits(n) then return n end
    return nil, what
  end
end

--- Seconds, more than none (a deadline, a wait).
options.seconds = converter(finite, function(n) return n > 0 end, "a positive number of seconds")
--- A count or a byte size, 0 included.
options.whole_number = converter(whole, function() return true end,
  "a whole number (at most " .. options.MAX_WHOLE .. ")")
--- Whole seconds, more than none (a lifetime kept by a clock that counts in seconds).
options.whole_seconds = converter(whole, function(n) return n > 0 end, "a whole positive number of seconds")
--- A session's lifetime: a second at least, the wall clock its record keeps counting in seconds.
options.lifetime = converter(finite, function(n) return n >= 1 end, "a number of seconds, 1 or more")
--- A TCP port.
options.port = converter(whole, function(n) return n <= 65535 and n >= 1 end, "a port number")

return options
