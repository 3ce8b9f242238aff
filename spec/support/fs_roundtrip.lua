--- One pass through a session's files as a filesystem, the same whatever the provider and the
-- transport (libcurl, or cosockets inside nginx): a local tree copied in, listed, stated,
-- renamed, pruned and copied back out, then removed. It asserts as it goes (luassert, which a
-- module loaded inside nginx can use too) and returns what it saw as plain data.
local assert = require "luassert"
local core = require "sandkit.core"
local files = require "support.files"

local fs_roundtrip = {}

--- Bytes no text encoding would pass unchanged.
fs_roundtrip.BINARY = "bin\0\1\2\255 end"

--- A fresh local tree: a.txt, sub/b.bin, an empty directory and a link. Its path.
function fs_roundtrip.tree()
  local dir = files.temp_dir()
  files.write(dir .. "/a.txt", "alpha")
  assert(core.mkdir(dir .. "/sub", 493))
  assert(core.mkdir(dir .. "/empty", 493))
  files.write(dir .. "/sub/b.bin", fs_roundtrip.BINARY)
  assert(files.execute("ln -s a.txt " .. files.shell_quote(dir .. "/link")))
  return dir
end

--- Runs the pass on session with the local tree at src, under the session's directory `at`.
function fs_roundtrip.run(session, src, at)
  local caps = session:capabilities()
  assert.is_true(caps.fs and caps.watch, "the session offers fs and watch")
  assert.is_true(assert(session:write_dir_from(at, src)) > 0)
  local paths = {}
  for _, e in ipairs(assert(session:list(at, { depth = 2 }))) do paths[#paths + 1] = e.path end
  local stat = assert(session:stat(at .. "/a.txt"))
  local absent, err = session:stat(at .. "/none")
  assert.is_nil(absent)
  assert.is_nil(err)
  local link = assert(session:stat(at .. "/link"))
  assert(session:rename(at .. "/a.txt", at .. "/sub/a2.txt"))
  local refused = select(2, session:rename(at .. "/sub/a2.txt", at .. "/sub/b.bin"))
  assert(session:remove(at .. "/empty"))
  local back = src .. ".back"
  assert(session:read_dir_to(at, back))
  local read_back = { files.read(back .. "/sub/a2.txt"), files.read(back .. "/sub/b.bin") }
  core.remove_tree(back)
  local not_empty = select(2, session:remove(at))
  assert(session:remove(at, { recursive = true }))
  assert.is_nil(session:stat(at))
  return { paths = paths, size = stat.size, type = stat.type, link = { link.type, link.target },
    read_back = read_back, refused = refused and refused.reason, not_empty = not_empty and not_empty.reason }
end

--- What every pass must have seen (the spec's side of the check).
function fs_roundtrip.check(seen, at)
  assert.same({ at .. "/a.txt", at .. "/empty", at .. "/link", at .. "/sub", at .. "/sub/b.bin" }, seen.paths)
  assert.equal(5, seen.size)
  assert.equal("file", seen.type)
  assert.same({ "symlink", "a.txt" }, seen.link)
  assert.same({ "alpha", fs_roundtrip.BINARY }, seen.read_back)
  assert.equal("PATH_EXISTS", seen.refused, "a rename over a file needs overwrite")
  assert.equal("PATH_EXISTS", seen.not_empty, "a directory with entries needs recursive")
end

return fs_roundtrip
