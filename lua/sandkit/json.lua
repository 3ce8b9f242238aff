--- JSON for sandkit, over lua-cjson: the one place that knows its habits.
--
-- lua-cjson 2.1 decodes every number as a float under Lua 5.4 (7 comes back as 7.0), so wire
-- integers — seqs, exit codes, ports — go through json.integer before anyone sees them. It
-- also writes '/' as '\/', which is valid JSON and left alone.

local found, cjson = pcall(require, "cjson.safe")
if not found then
  -- Said in one sentence: require's own text lists every path searched, which is no help.
  error("sandkit needs lua-cjson, which is not installed: apt-get install lua-cjson, "
    .. "or luarocks install lua-cjson", 0)
end

local json = {}

json.null = cjson.null

--- A whole number as an integer (Lua 5.4), or as it is where numbers have no subtype; nil
-- for anything else, fractions and NaN included.
function json.integer(v)
  if type(v) ~= "number" or v ~= v or v % 1 ~= 0 then return nil end
  return math.tointeger and math.tointeger(v) or v
end

--- The value of a JSON text, or nil and why it is not one.
function json.decode(text)
  return cjson.decode(text)
end

--- The JSON text of a value; raises for a value JSON cannot hold (a caller's mistake: a
-- function, a sparse array), naming what was refused.
function json.encode(value)
  local text, err = cjson.encode(value)
  if not text then error("sandkit: cannot encode as JSON: " .. tostring(err), 2) end
  return text
end

--- Marks a list as a JSON array, so that an empty one is written [] and not {}.
local array_mt = {}
function json.array(list)
  return setmetatable(list, array_mt)
end

--- The JSON text of a document people and scripts read (the `sandkit` command's --json): object
-- keys in sorted order, so the same document is always the same text, and arrays marked with
-- json.array kept arrays when empty. Scalars are lua-cjson's.
function json.encode_document(value)
  if type(value) ~= "table" then return json.encode(value) end
  local parts = {}
  if getmetatable(value) == array_mt then
    for i, item in ipairs(value) do parts[i] = json.encode_document(item) end
    return "[" .. table.concat(parts, ",") .. "]"
  end
  local keys = {}
  for k in pairs(value) do
    if type(k) ~= "string" then error("sandkit: a JSON document's keys are strings", 2) end
    keys[#keys + 1] = k
  end
  table.sort(keys)
  for i, k in ipairs(keys) do parts[i] = json.encode(k) .. ":" .. json.encode_document(value[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

return json
