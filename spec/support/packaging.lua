--- What the packaging specs share: the environment of a make or luarocks they start, a source
-- rock packed from this checkout, and a folder a case installs into.
local assert = require "luassert"
local core = require "sandkit.core"
local files = require "support.files"
local local_state = require "support.local_state"

local packaging = {}

local q = files.shell_quote

--- The environment of a make or luarocks started from inside `make test`: the outer make's
-- flags and variables would otherwise leak into the inner one.
packaging.CLEAN_ENV = "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u BUSTED_ARGS "
--- Added to CLEAN_ENV where a make only compiles: one job a core, as a user's -j would.
packaging.PARALLEL = "MAKEFLAGS=-j$(nproc) "
--- The CFLAGS a rock's install is given, as a user may give LuaRocks any: no optimisation, which
-- compiles in about half the CPU time. These cases are about what a rock carries and where it
-- installs; the code the compiler makes of the sources is the suite's own build's, at -O2.
packaging.ROCK_CFLAGS = "-O0 -fPIC"

--- Packs a source rock of this checkout with `make rock` into the folder build: its path.
function packaging.make_rock(build)
  local out, err, status = local_state.sh(packaging.CLEAN_ENV .. "make rock BUILD=" .. q(build))
  assert.equal(0, status, out .. err)
  local rock = build .. "/sandkit-scm-1.src.rock"
  assert.truthy(files.read(rock))
  return rock
end

--- Removes a case's folder (local_state.new's) and the state folder (`<dir>/state`) its
-- sessions used, their agents stopped.
function packaging.remove_folder(dir)
  local_state.clean(dir .. "/state")
  core.remove_tree(dir)
end

return packaging
