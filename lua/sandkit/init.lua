--- sandkit: run commands and move files in sandboxes — local ones, and remote ones on AWS
-- Lambda MicroVMs, Azure and Kubernetes — through the sandbox agent protocol.
--
--   local sandkit = require "sandkit"
--   local sandbox = assert(sandkit.sandbox{ provider = "local" })
--   local session = assert(sandbox:create{})
--   for frame in session:run({ "echo", "hi" }, { timeout = 10 }) do … end

-- PUC Lua 5.1 shares LuaJIT's C ABI, so a 5.1 build of the C core would load there; the Lua
-- layer needs what PUC 5.1 lacks (yielding across pcall and metamethods, among others).
if _VERSION == "Lua 5.1" and not rawget(_G, "jit") then
  error("sandkit needs Lua 5.4 or LuaJIT 2.1, not PUC Lua 5.1", 0)
end

local core = require "sandkit.core"
local errors = require "sandkit.errors"
local options_check = require "sandkit.options"
local protocol = require "sandkit.protocol"
local runner = require "sandkit.runner"
local sandbox = require "sandkit.sandbox"

local sandkit = {}

--- The C core and this Lua layer are released together; a mismatch is a broken install.
local ABI = 1
if core._ABI ~= ABI then
  error(string.format("sandkit: the C core (ABI %s) does not match the Lua layer (ABI %d)",
    tostring(core._ABI), ABI))
end

sandkit.VERSION = core._VERSION
sandkit.errors = errors
--- sandkit.run(main, ...) and sandkit.spawn(fn, ...): see sandkit/runner.lua.
sandkit.run = runner.run
sandkit.spawn = runner.spawn

local PROVIDERS = {
  ["local"] = "sandkit.providers.local",
  agent = "sandkit.providers.agent",
  aws = "sandkit.providers.aws",
  azure = "sandkit.providers.azure",
  kubernetes = "sandkit.providers.kubernetes",
}

--- The names sandkit.sandbox{ provider = … } knows, sorted.
sandkit.PROVIDERS = {}
for name in pairs(PROVIDERS) do sandkit.PROVIDERS[#sandkit.PROVIDERS + 1] = name end
table.sort(sandkit.PROVIDERS)

--- Options every provider takes: the provider's name, the protocol's timeouts, the default
-- command timeout and a stream's keep-alive. A provider module adds its own as `OPTIONS`, a set
-- of names.
local COMMON_OPTIONS = options_check.set{ "provider", "command_timeout", "keepalive" }
for name in pairs(protocol.DEFAULTS) do COMMON_OPTIONS[name] = true end

--- Makes a sandbox for a provider: `local` (the default), `agent`, `aws`, `azure`,
-- `kubernetes`. Returns the sandbox, or nil and an error.
function sandkit.sandbox(options)
  options = options or {}
  if type(options) ~= "table" then error("sandkit.sandbox takes an options table", 2) end
  local name = options.provider or "local"
  local module_name = PROVIDERS[name]
  if not module_name then
    return nil, errors.invalid_input("sandkit.sandbox", "provider", "unknown provider " .. tostring(name))
  end
  -- Absent from this installation is said plainly; a module that is there and fails to load
  -- is a broken install, and its first line says why.
  if not package.loaded[module_name] and not package.searchpath(module_name, package.path) then
    return nil, errors.not_supported("sandkit.sandbox",
      "the " .. name .. " provider is not part of this sandkit installation")
  end
  local ok, module = pcall(require, module_name)
  if not ok then
    return nil, errors.not_supported("sandkit.sandbox", "the " .. name
      .. " provider could not be loaded: " .. tostring(module):match("^[^\n]*"))
  end
  local refusal = options_check.check("sandkit.sandbox", options, COMMON_OPTIONS, module.OPTIONS or {})
    or protocol.check_timings("sandkit.sandbox", options)
    or select(2, options_check.seconds("sandkit.sandbox", options, "command_timeout"))
  if refusal then return nil, refusal end
  local provider, err = module.new(options)
  if not provider then return nil, err end
  return sandbox.new(provider, options, module)
end

return sandkit
