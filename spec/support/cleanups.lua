--- Cleanups for one test, all of them run: busted keeps a single `finally` a test, the last one
-- given, so a second call silently drops the first cleanup (a server left running, a folder
-- left behind). cleanups.of(finally) hands it one function that runs every cleanup added since,
-- the last added first, each even when one before it failed; the first failure is raised after.
--
--   local defer = cleanups.of(finally)
--   defer(function() server:stop() end)

local cleanups = {}

function cleanups.of(finally)
  local list = {}
  finally(function()
    local first_err
    for i = #list, 1, -1 do
      local ok, err = pcall(list[i])
      if not ok and first_err == nil then first_err = err end
    end
    if first_err ~= nil then error(first_err, 0) end
  end)
  return function(fn) list[#list + 1] = fn end
end

return cleanups
