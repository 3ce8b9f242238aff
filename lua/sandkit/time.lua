--- Times as sandkit writes and reads them: RFC 3339 timestamps ("2026-03-05T17:30:20Z", with
-- an optional fraction and numeric offset, as Kubernetes writes them and the `sandkit` command
-- prints them), to and from Unix seconds, without the local time zone.

local time = {}

--- Days from 1970-01-01 to a civil date (proleptic Gregorian; H. Hinnant's algorithm).
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

--- Unix seconds (an integer) of a timestamp, or nil when it is not one.
function time.parse_rfc3339(s)
  if type(s) ~= "string" then return nil end
  local y, mo, d, h, mi, sec, rest = s:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)[Tt](%d%d):(%d%d):(%d%d)(.*)$")
  if not y then return nil end
  rest = rest:gsub("^%.%d+", "")
  local offset
  if rest == "Z" or rest == "z" then
    offset = 0
  else
    local sign, oh, om = rest:match("^([%+%-])(%d%d):(%d%d)$")
    if not sign then return nil end
    offset = (tonumber(oh) * 60 + tonumber(om)) * 60
    if sign == "-" then offset = -offset end
  end
  y, mo, d, h, mi, sec = tonumber(y), tonumber(mo), tonumber(d), tonumber(h), tonumber(mi), tonumber(sec)
  if mo < 1 or mo > 12 or d < 1 or d > 31 or h > 23 or mi > 59 or sec > 60 then return nil end
  return days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + sec - offset
end

--- The UTC timestamp of Unix seconds, as Kubernetes writes metav1.Time.
function time.rfc3339(t)
  return os.date("!%Y-%m-%dT%H:%M:%SZ", math.floor(t))
end

return time
