--- What a failed file operation on this machine means to whoever must fix it. The system's words
-- leave out the part that matters when permission is what failed: "Permission denied" names no
-- user, and a folder that could not be made shows up one level down as "No such file or
-- directory". So a refusal (EACCES, EPERM) is said as one, with the path and the user this
-- process runs as — inside nginx, the worker's user, which is rarely the one who made the folder.
--
--   oserror.describe(message, errno_name, path, action) -> the sentence
--   oserror.user() -> "user nobody (uid 65534)"

local oserror = {}

--- The errno names (sandkit.core's) that mean the user may not do it.
local REFUSED = { EACCES = true, EPERM = true }

--- Bytes of the user database read looking for a name: far more than a machine's local users
-- take; a longer file leaves the user named by uid alone.
oserror.MAX_PASSWD = 1024 * 1024

--- The name of uid in passwd_path (default /etc/passwd), or nil. Only the local file is read:
-- asking the system (getpwuid) may ask a directory server, which would block an nginx worker.
function oserror.user_name(uid, passwd_path)
  local f = io.open(passwd_path or "/etc/passwd", "rb")
  if not f then return nil end
  local text = f:read(oserror.MAX_PASSWD + 1) or ""
  f:close()
  if #text > oserror.MAX_PASSWD then return nil end
  for line in text:gmatch("[^\n]+") do
    local name, id = line:match("^([^:]+):[^:]*:(%d+):")
    if name and tonumber(id) == uid then return name end
  end
  return nil
end

--- Bytes of /proc/self/status read: its Uid line comes within the first kilobyte.
local MAX_STATUS = 16384

--- The effective user of this process, as a phrase: "user <name> (uid N)", or "user uid N" for
-- a uid without a local name.
function oserror.user(passwd_path)
  local f = io.open("/proc/self/status", "rb")
  local status = f and f:read(MAX_STATUS) or ""
  if f then f:close() end
  local uid = tonumber(status:match("\nUid:%s+%d+%s+(%d+)"))
  if not uid then return "this process's user" end
  local name = oserror.user_name(uid, passwd_path)
  return "user " .. (name and (name .. " (uid " .. uid .. ")") or ("uid " .. uid))
end

--- A failure's sentence: for a refusal, "permission denied: user nobody (uid 65534) may not
-- <action> <path> (EACCES)"; anything else keeps the system's message.
function oserror.describe(message, errno_name, path, action)
  if not REFUSED[errno_name] then return tostring(message) end
  return "permission denied: " .. oserror.user() .. " may not " .. action .. " " .. path
    .. " (" .. errno_name .. ")"
end

return oserror
