-- deploy/agent/Containerfile, the agent's image: it builds the agent alone from what it copies,
-- and installs a package for every library the agent links against. Only C is built and
-- inspected here, so the interpreter running busted changes nothing (the Makefile's ONCE_SPECS).

local core = require "sandkit.core"
local files = require "support.files"

describe("deploy/agent/Containerfile", function()
  local text = assert(files.read("deploy/agent/Containerfile"))

  it("builds the agent alone from what it copies, with `make agent`", function()
    local dir = files.temp_dir()
    local ok, err = pcall(function()
      for from, to in text:gmatch("COPY (%S+) (%S+)") do
        if not from:find("^%-%-") then
          assert(files.execute("cp -r " .. files.shell_quote(from) .. " " .. files.shell_quote(dir .. "/" .. to)))
        end
      end
      local make = assert(text:match("\nRUN (make agent[^\n]*)\n"))
      -- One compiler a core, as a builder given -j would run, and no optimisation, which halves
      -- the compile: the case is about what the image copies; the code made of it is the suite's
      -- own build's. The command itself is the image's.
      assert(files.execute("cd " .. files.shell_quote(dir) .. " && MAKEFLAGS=-j$(nproc) CFLAGS=-O0 " .. make
        .. " >build.log 2>&1"),
        files.read(dir .. "/build.log"))
      assert.same({ "agent-obj", "common-obj", "sandkit-agent" }, (function()
        local names = core.listdir(dir .. "/build")
        table.sort(names)
        return names
      end)())
    end)
    core.remove_tree(dir)
    assert(ok, err)
  end)

  it("installs a package for every library the agent links against or opens", function()
    local packages = {}
    local runtime = text:match("FROM [^\n]*slim\n(.*)$")
    for list in runtime:gmatch("apt%-get install %-y %-%-no%-install%-recommends ([^\n&]+)") do
      for name in list:gmatch("%S+") do packages[name] = true end
    end
    local readelf = assert(io.popen("readelf -d " .. files.shell_quote(os.getenv("SANDKIT_AGENT"))))
    local needed = {}
    for lib in readelf:read("a"):gmatch("NEEDED%)%s+Shared library: %[([^%]]+)%]") do needed[#needed + 1] = lib end
    readelf:close()
    assert.is_true(#needed >= 3, "the agent links against libevent, libcrypto and libc")
    -- libarchive, opened at the first directory transfer rather than linked.
    needed[#needed + 1] = assert(assert(files.read("src/agent/archive_loader.c"))
      :match('#define ARCHIVE_LOADER_SONAME "([^"]+)"'))
    -- One dpkg for all of them: each run reads every installed package's file list.
    local patterns = {}
    for i, lib in ipairs(needed) do patterns[i] = files.shell_quote("*/" .. lib) end
    local owner = io.popen("dpkg -S " .. table.concat(patterns, " ") .. " 2>/dev/null")
    local found = {}
    for line in owner:read("a"):gmatch("[^\n]+") do
      local package, path = line:match("^([^:]+)"), line:match(": (/%S+)$")
      -- The C library is in every Debian image.
      if package and (packages[package] or package == "libc6") then found[path:match("[^/]+$")] = true end
    end
    owner:close()
    for _, lib in ipairs(needed) do
      assert.is_true(found[lib] == true, lib .. " comes from no package the image installs")
    end
  end)
end)
