--- The `sandkit` commands over a session's files as a filesystem: `cp [-r] SRC DST` between
-- this machine and a session (one side NAME:PATH, as docker cp and scp write it; `-` a tar
-- stream on standard input or output) and `fs NAME ls|stat|rm|mv|mkdir|watch`. cli.lua's table
-- describes them (arguments, options, help) and loads this file to run one, handing it its
-- helpers.

local json = require "sandkit.json"
local localfile = require "sandkit.localfile"
local time = require "sandkit.time"

local cli_files = {}

--- Which side of a cp is a session's: NAME:PATH, where NAME holds no '/' (write ./a:b for a
-- local name with a colon, as scp wants).
local function remote_of(arg)
  local name, path = arg:match("^([^/:]+):(.*)$")
  if not name then return nil end
  return { name = name, path = path }
end

local function basename(path)
  return path:match("([^/]+)/*$") or path
end

--- A path inside a directory, as cp places a copy into a directory that exists.
local function inside(dir, path)
  local base = basename(path)
  if base == "." then return dir end
  return dir:gsub("/+$", "") .. "/" .. base
end

local TYPE_LETTER = { file = "-", dir = "d", symlink = "l", other = "?" }

--- rwxr-xr-x for a mode's nine permission bits, after the type's letter.
local function mode_text(entry)
  local out, bits = { TYPE_LETTER[entry.type] or "?" }, entry.mode
  for shift = 8, 0, -1 do
    local on = math.floor(bits / 2 ^ shift) % 2 == 1
    out[#out + 1] = on and ("rwx"):sub(3 - shift % 3, 3 - shift % 3) or "-"
  end
  return table.concat(out)
end

local function entry_line(entry)
  return string.format("%s %12d %s %s%s\n", mode_text(entry), entry.size, time.rfc3339(entry.mtime),
    entry.path, entry.target and (" -> " .. entry.target) or "")
end

local function entry_document(entry)
  return { name = entry.name, path = entry.path, type = entry.type, size = entry.size, mode = entry.mode,
    mtime = entry.mtime, target = entry.target or json.null }
end

--- The handlers of these commands by name; `h` holds cli.lua's helpers.
function cli_files.handlers(h)
  local fail, one_line = h.fail, h.one_line

  local function cp(ctx)
    local src, dst = ctx.args[1], ctx.args[2]
    local rs, rd = remote_of(src), remote_of(dst)
    if (rs == nil) == (rd == nil) then
      return fail(h.EXIT_USAGE, "cp copies between this machine and a session: one side is NAME:PATH, "
        .. "the other a local path or -")
    end
    local remote = rs or rd
    if remote.path == "" then return fail(h.EXIT_USAGE, "cp needs a path after " .. remote.name .. ":") end
    local session, err = h.open_session(ctx.sandbox, remote.name)
    if not session then return h.no_session(err) end
    local recursive = ctx.opts.recursive
    if rs then
      -- Out of the session.
      if dst == "-" then return h.transfer(session.read_dir_to, session, rs.path, io.stdout) end
      if recursive then
        local into = localfile.is_directory(dst) and inside(dst, rs.path) or dst
        return h.transfer(session.read_dir_to, session, rs.path, into)
      end
      local entry = session:stat(rs.path)
      if entry and entry.type == "dir" then
        return fail(h.EXIT_FAILED, rs.path .. " is a directory: cp -r copies a directory")
      end
      local into = localfile.is_directory(dst) and inside(dst, rs.path) or dst
      return h.transfer(session.read_file_to, session, rs.path, into)
    end
    -- Into the session.
    if src == "-" then return h.transfer(session.write_dir_from, session, rd.path, io.stdin) end
    local is_dir = localfile.is_directory(src)
    if is_dir and not recursive then
      return fail(h.EXIT_FAILED, src .. " is a directory: cp -r copies a directory")
    end
    if recursive and not is_dir then
      return fail(h.EXIT_FAILED, src .. " is not a directory: cp without -r copies a file")
    end
    local there
    there, err = session:stat(rd.path)
    if err then return fail(h.EXIT_FAILED, one_line(err)) end
    local into = there and there.type == "dir" and inside(rd.path, src) or rd.path
    if recursive then return h.transfer(session.write_dir_from, session, into, src) end
    return h.transfer(session.write_file_from, session, into, src)
  end

  local function fs_ls(ctx)
    local o, status, all = ctx.opts, 0, json.array{}
    local paths = {}
    for i = 2, #ctx.args do paths[#paths + 1] = ctx.args[i] end
    if #paths == 0 then paths = { "/" } end
    for _, path in ipairs(paths) do
      local entries, err = ctx.session:list(path, { depth = o.depth })
      if not entries then
        status = fail(h.EXIT_FAILED, path .. ": " .. one_line(err))
      else
        for _, entry in ipairs(entries) do
          if o.json then all[#all + 1] = entry_document(entry) else io.stdout:write(entry_line(entry)) end
        end
        if entries.next then
          io.stderr:write("sandkit: ", path, " holds more entries than one listing shows\n")
          status = h.EXIT_FAILED
        end
      end
    end
    if o.json then h.print_json{ entries = all } end
    return status
  end

  local function fs_stat(ctx)
    local status, all = 0, json.array{}
    for i = 2, #ctx.args do
      local path = ctx.args[i]
      local entry, err = ctx.session:stat(path)
      if err then
        status = fail(h.EXIT_FAILED, path .. ": " .. one_line(err))
      elseif not entry then
        if ctx.opts.json then all[#all + 1] = { path = path, exists = false } end
        status = fail(h.EXIT_FAILED, "no such path in the session: " .. path)
      elseif ctx.opts.json then
        local doc = entry_document(entry)
        doc.exists = true
        all[#all + 1] = doc
      else
        io.stdout:write(entry_line(entry))
      end
    end
    if ctx.opts.json then h.print_json{ entries = all } end
    return status
  end

  --- Runs fn(session, path, …) for each PATH argument; the status of the last failure.
  local function each_path(ctx, fn, ...)
    local status = 0
    for i = 2, #ctx.args do
      local ok, err = fn(ctx.session, ctx.args[i], ...)
      if not ok then status = fail(h.EXIT_FAILED, ctx.args[i] .. ": " .. one_line(err)) end
    end
    return status
  end

  local function fs_rm(ctx)
    return each_path(ctx, ctx.session.remove, { recursive = ctx.opts.recursive == true })
  end

  local function fs_mkdir(ctx)
    return each_path(ctx, ctx.session.mkdir)
  end

  local function fs_mv(ctx)
    local ok, err = ctx.session:rename(ctx.args[2], ctx.args[3], { overwrite = ctx.opts.overwrite == true })
    if not ok then return fail(h.EXIT_FAILED, one_line(err)) end
    return 0
  end

  local function fs_watch(ctx)
    local o = ctx.opts
    local events = ctx.session:watch(ctx.args[2], { recursive = o.recursive == true,
      timeout = o.timeout or h.DEFAULT_TIMEOUT })
    local ok, failure = h.interruptible(function()
      for event in events do
        if o.json then
          h.print_json{ type = event.type, path = event.path or json.null, from = event.from or json.null }
        elseif event.type == "rename" then
          io.stdout:write("rename ", event.from, " -> ", event.path, "\n")
        else
          io.stdout:write(event.type, event.path and (" " .. event.path) or "", "\n")
        end
        io.stdout:flush()
      end
    end)
    events:close()
    if h.interrupted() then return h.interrupted_status() end
    if not ok then return fail(h.EXIT_FAILED, one_line(failure)) end
    if events.reason ~= "timeout" then
      io.stderr:write("sandkit: the watch ended: ", ctx.args[2], " was ", tostring(events.reason), "\n")
    end
    return 0
  end

  return { cp = cp, ["fs ls"] = fs_ls, ["fs stat"] = fs_stat, ["fs rm"] = fs_rm, ["fs mv"] = fs_mv,
    ["fs mkdir"] = fs_mkdir, ["fs watch"] = fs_watch }
end

return cli_files
