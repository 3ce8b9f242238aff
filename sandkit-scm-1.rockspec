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
    AWS Lambda MicroVMs and Azure — through the sandbox agent protocol. Output streams through a
    coroutine-friendly iterator with bounded memory; errors say whether a retry is safe.
    Installs the `sandkit` command and the `sandkit-agent` server.
  ]],
  license = "MIT",
  labels = { "sandbox", "curl", "streaming" },
}
-- lua-cjson is needed at run time. It is not listed here because LuaRocks cannot see a copy
-- installed by the system's package manager (Debian's lua-cjson), and listing it would make
-- an offline `luarocks make` fail; install it with `apt-get install lua-cjson` or
-- `luarocks install lua-cjson`.
dependencies = {
  "lua >= 5.1",
}
-- libcurl is found by library, not by header: Debian keeps curl/curl.h in a multiarch folder
-- LuaRocks does not search.
external_dependencies = {
  CURL = { library = "curl" },
  OPENSSL = { header = "openssl/evp.h", library = "crypto" },
  LIBEVENT = { header = "event2/http.h", library = "event" },
}
build = {
  type = "make",
  build_target = "all",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
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
test = {
  type = "busted",
}
