--- Ends the simulated snapshot restore of the end-to-end spec after a counted number of 502s,
-- run as its own process:
--   lua5.4 spec/support/aws_restore_gate.lua <access-log fifo> <flag file> <count> <copy file>
-- nginx answers 502 while the flag file exists and writes one "<status> <uri>" line per
-- request into the fifo. This reads those lines as nginx writes them, copies each to the copy
-- file (the spec's record of what nginx answered), and removes the flag once `count` health
-- probes were answered 502. It exits when nginx closes the fifo.

local fifo, flag, count, copy_path = arg[1], arg[2], tonumber(arg[3]), arg[4]
assert(fifo and flag and count and copy_path, "usage: aws_restore_gate.lua FIFO FLAG COUNT COPY")

local copy = assert(io.open(copy_path, "a"))
copy:setvbuf("line")
-- Blocks until nginx opens the fifo for writing, which it does as it starts.
local input = assert(io.open(fifo, "r"))
local seen = 0
for line in input:lines() do
  copy:write(line, "\n")
  local status, uri = line:match("^(%d+) (%S+)")
  if status == "502" and uri:match("^/v1/health") then
    seen = seen + 1
    if seen == count then os.remove(flag) end
  end
end
copy:close()
