--- Tar archives byte by byte, for the specs that hand sandkit archives no honest writer makes:
-- ustar headers with any name, type and size, pax records, and streams generated as they are
-- read (ten million entries are never held).
local tar = {}

local BLOCK = 512

local function octal(n, width)
  return string.format("%0" .. (width - 1) .. "o", n) .. "\0"
end

local function field(s, width)
  s = s or ""
  assert(#s <= width, "a tar field holds " .. width .. " bytes")
  return s .. string.rep("\0", width - #s)
end

--- One 512-byte ustar header. h: name, type ("0" file, "1" hard link, "2" symlink, "3"/"4"
-- devices, "5" directory, "6" FIFO, "x" pax records), size, mode, uid, gid, mtime, linkname,
-- devmajor, devminor.
function tar.header(h)
  local head = field(h.name, 100) .. octal(h.mode or 420, 8) .. octal(h.uid or 0, 8) .. octal(h.gid or 0, 8)
    .. octal(h.size or 0, 12) .. octal(h.mtime or 0, 12)
  local tail = (h.type or "0") .. field(h.linkname, 100) .. "ustar\0" .. "00" .. field("", 32)
    .. field("", 32) .. octal(h.devmajor or 0, 8) .. octal(h.devminor or 0, 8) .. field("", 155)
  local unsummed = head .. "        " .. tail
  local sum = 0
  for i = 1, #unsummed do sum = sum + unsummed:byte(i) end
  local header = head .. string.format("%06o", sum) .. "\0 " .. tail
  return header .. string.rep("\0", BLOCK - #header)
end

--- Data padded to whole blocks.
function tar.padded(data)
  local over = #data % BLOCK
  return over == 0 and data or (data .. string.rep("\0", BLOCK - over))
end

--- An entry: its header, then its data (a file's contents), padded.
function tar.entry(h, data)
  data = data or ""
  local copy = {}
  for k, v in pairs(h) do copy[k] = v end
  if copy.size == nil then copy.size = #data end
  return tar.header(copy) .. tar.padded(data)
end

--- A pax extended header ("x") carrying records { key = value } for the entry after it.
function tar.pax(records)
  local body = {}
  local keys = {}
  for k in pairs(records) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local text = " " .. k .. "=" .. records[k] .. "\n"
    -- The length counts its own digits.
    local n = #text + 1
    while #tostring(n) + #text ~= n do n = #tostring(n) + #text end
    body[#body + 1] = n .. text
  end
  return tar.entry({ name = "PaxHeaders/x", type = "x" }, table.concat(body))
end

--- The end-of-archive blocks.
tar.END = string.rep("\0", 2 * BLOCK)

--- A whole archive from entries (strings made by tar.entry), ended.
function tar.archive(...)
  return table.concat({ ... }) .. tar.END
end

--- A reader (a function returning the next chunk, then nil) of `count` copies of `unit`, in
-- chunks of about 64 KiB, then the end blocks; `taken()` says how many bytes were read.
function tar.repeated(unit, count)
  local per = math.max(1, math.floor(65536 / #unit))
  local chunk = string.rep(unit, per)
  local left, taken, ended = count, 0, false
  local function read()
    if left <= 0 then
      if ended then return nil end
      ended = true
      taken = taken + #tar.END
      return tar.END
    end
    local n = math.min(per, left)
    left = left - n
    local piece = n == per and chunk or string.rep(unit, n)
    taken = taken + #piece
    return piece
  end
  return read, function() return taken end
end

return tar
