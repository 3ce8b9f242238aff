--- What the packaging specs share: the environment of a make or luarocks they start, and a source
-- rock packed from this checkout.
local assert = require "luassert"
local files = require "support.files"
local local_state = require "support.local_state"

local packaging = {}

local q = files.shell_quote

--- The environment of a make or luarocks started from inside `make test`: the outer make's
-- flags and variables would otherwise leak into the inner one.
packaging.CLEAN_ENV = "env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u BUSTED_ARGS "
--- Added to CLEAN_ENV where a make only compiles: one job a core, as a user's -j would.
packaging.PARALLEL = "MAKEFLAGS=-j$(nproc) "

--- Packs a source rock of this checkout with `make rock` into the folder build: its path.
function packaging.make_rock(build)
  local out, err, status = local_state.sh(packaging.CLEAN_ENV .. "make rock BUILD=" .. q(build))
  assert.equal(0, status, out .. err)
  local rock = build .. "/sandkit-scm-1.src.rock"
  assert.truthy(files.read(rock))
  return rock
end

return packaging
