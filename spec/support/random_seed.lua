--- Seeds math.random from the kernel before any spec runs (.busted names this file as busted's
-- helper). Specs draw the names of what they make on the machine from it (sleep lengths they find
-- their processes by, network namespaces, addresses), and LuaJIT, unlike Lua 5.4, starts every
-- process from the same seed: two runs of one spec at once, in two passes of the suite or in
-- two checkouts on one machine, would otherwise make the same names and meet.
local urandom = assert(io.open("/dev/urandom", "rb"))
local bytes = assert(urandom:read(4))
urandom:close()
local a, b, c, d = bytes:byte(1, 4)
math.randomseed(((a * 256 + b) * 256 + c) * 256 + d)
