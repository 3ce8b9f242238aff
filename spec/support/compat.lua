--- What specs need that Lua 5.4 has and LuaJIT (the 5.1 ABI) lacks, in one place.
local compat = {}

compat.pack = table.pack or function(...) return { n = select("#", ...), ... } end
compat.unpack = table.unpack or rawget(_G, "unpack")

return compat
