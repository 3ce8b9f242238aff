rockspec_format = "3.0"
package = "sandkit"
version = "scm-1"
source = {
  url = "git+https://example.invalid/sandkit.git",
}
description = {
  summary = "Run commands and move files in sandboxes, streaming output frame by frame",
  detailed = [[
    sandkit drives sandboxes — local ones served by its own sandkit-agent, and remote ones on
    AWS Lambda MicroVMs, Azure and Kubernetes — through the sandbox agent protocol. Output
    streams through a coroutine-friendly iterator with bounded memory, also inside
    OpenResty/nginx without blocking a worker; errors say whether a retry is safe.
    Installs the `sandkit` command and the `sandkit-agent` server.
  ]],
  license = "MIT",
  labels = { "sandbox", "curl", "streaming" },
}
-- Lua 5.4 and LuaJIT 2.1 build and pass; LuaRocks knows LuaJIT as Lua 5.1, and a module built
-- with PUC 5.1's headers (which `luarocks --lua-version=5.1` finds on Debian) loads into
-- LuaJIT, which is what OpenResty runs. LuaRocks cannot say "5.1 or 5.4": Lua 5.2 and 5.3 are
-- refused by the build itself in one line (src/compat.h), and PUC Lua 5.1 by `require "sandkit"`.
-- lua-cjson is needed at run time. With the system's copy (Debian's lua-cjson), which LuaRocks
-- cannot see, install with `--deps-mode=none`.
dependencies = {
  "lua >= 5.1, < 5.5",
  "lua-cjson",
}
-- libcurl is found by library, not by header: Debian keeps curl/curl.h in a multiarch folder
-- LuaRocks does not search.
external_dependencies = {
  CURL = { library = "curl" },
  OPENSSL = { header = "openssl/evp.h", library = "crypto" },
  LIBEVENT = { header = "event2/bufferevent.h", library = "event" },
  LIBARCHIVE = { header = "archive.h", library = "archive" },
}
build = {
  type = "make",
  build_target = "all",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    -- Warnings stay warnings in a user's build; `make check` turns them into errors.
    WERROR = "",
    LIBFLAG = "$(LIBFLAG)",
    LUA_INCDIR = "$(LUA_INCDIR)",
    LUA = "$(LUA)",
  },
  install_target = "install",
  -- The same headers and interpreter as the build: they name the build directory to install from.
  install_variables = {
    LUA_INCDIR = "$(LUA_INCDIR)",
    LUA = "$(LUA)",
    PREFIX = "$(PREFIX)",
    BINDIR = "$(BINDIR)",
    LUA_CMOD = "$(LIBDIR)",
    LUA_LMOD = "$(LUADIR)",
  },
}
-- `luarocks test` runs what `make check` runs after its bootstrap: the build, then the busted
-- suite with the paths and environment the Makefile sets (the agent binary, the C module of the
-- build tree), for the Lua LuaRocks runs the script with (lua5.4, or LuaJIT in a 5.1 tree).
-- Extra arguments reach make: `luarocks test -- BUSTED_ARGS=spec/cli_spec.lua`.
test = {
  type = "command",
  script = "tools/luarocks_test.lua",
}
