--- Small root filesystems for the image specs, made on the spot from Debian's busybox-static
-- (one static binary: a shell and the usual tools), so no spec needs a download.
local core = require "sandkit.core"
local files = require "support.files"

local images = {}

images.BUSYBOX = "/bin/busybox"
--- The applets the specs' commands use, each a link to busybox in the tree's /bin.
local APPLETS = { "sh", "ls", "cat", "echo", "id", "stat", "rm", "mkdir", "dd", "wc", "true", "sleep" }

--- Whether this machine has the static busybox the trees are made of.
function images.available()
  local f = io.open(images.BUSYBOX, "rb")
  if not f then return false end
  f:close()
  return true
end

--- Makes a busybox system in `dir` (made here): /bin with the applets, plus `extra` files
-- { [path] = contents } and the folders their paths need. Returns dir.
function images.busybox_tree(dir, extra)
  assert(core.mkdir(dir, 493))
  assert(core.mkdir(dir .. "/bin", 493))
  assert(files.execute("cp " .. images.BUSYBOX .. " " .. files.shell_quote(dir .. "/bin/busybox")))
  for _, applet in ipairs(APPLETS) do
    assert(files.execute("ln -s busybox " .. files.shell_quote(dir .. "/bin/" .. applet)))
  end
  for path, contents in pairs(extra or {}) do
    local parent = (dir .. "/" .. path):match("^(.*)/[^/]+$")
    assert(files.execute("mkdir -p " .. files.shell_quote(parent)))
    files.write(dir .. "/" .. path, contents)
  end
  return dir
end

return images
