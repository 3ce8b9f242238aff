--- Option tables are checked against the keys their call knows: a misspelt key (`comand_timeout`,
-- `cwdd`) would otherwise be silently ignored, and the caller would get a default they never
-- chose. The refusal is INVALID_INPUT naming the key and the nearest known one.

local errors = require "sandkit.errors"

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

return options
