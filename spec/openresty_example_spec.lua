-- examples/openresty as its README runs it (run.sh, Debian's nginx): the gateway's API over
-- real HTTP, and its one-page client in headless Chromium (Debian's chromium), which must show
-- a command's streamed lines and its exit code.

local cjson = require "cjson"
local core = require "sandkit.core"
local files = require "support.files"
local nginx = require "support.nginx"
local processes = require "support.processes"
local raw_http = require "support.raw_http"

local CHROMIUM = "/usr/bin/chromium"
--- Seconds the example gets to listen, Chromium to finish, and run.sh to clean up.
local START_TIMEOUT, BROWSER_TIMEOUT, STOP_TIMEOUT = 20, 60, 10
local TOKEN = "0123456789abcdef0123456789abcdef"

--- Waits for pid to end, up to `seconds`; true when it did.
local function reaped(pid, seconds)
  return processes.within(seconds, function() return core.reap(pid) end)
end

--- Starts run.sh on a free port (another, when a race took the first); returns pid, port, log.
local function start_example()
  local build = assert(os.getenv("SANDKIT_NGINX_CPATH"), "make test sets SANDKIT_NGINX_CPATH")
    :match("^(.*)/luajit/%?%.so$")
  local log = files.temp_name()
  for _ = 1, 3 do
    local port = processes.free_port()
    local pid = assert(core.spawn({ "sh", "examples/openresty/run.sh" }, { setsid = true, stderr = log,
      stdout = log, env = processes.env({ PORT = tostring(port), BUILD = build, SANDKIT_NO_BUILD = "1",
        SANDKIT_AGENT = os.getenv("SANDKIT_AGENT"), SANDKIT_GATEWAY_TOKEN = TOKEN }, true) }))
    if processes.listening(port, pid, START_TIMEOUT) then return pid, port, log end
    core.kill(pid, core.SIGKILL)
    core.reap(pid, true)
  end
  error("the example did not start:\n" .. (files.read(log) or ""), 0)
end

--- SIGTERM: run.sh's trap stops nginx and every session's agent and removes its directory.
local function stop_example(pid)
  core.kill(pid, core.SIGTERM)
  if not reaped(pid, STOP_TIMEOUT) then
    for _, child in ipairs(processes.children(pid)) do core.kill(child, core.SIGKILL) end
    core.kill(pid, core.SIGKILL)
    core.reap(pid, true)
    error("run.sh did not stop on SIGTERM", 0)
  end
end

describe("the OpenResty example", function()
  local pid, port, log
  before_each(function() pid, port, log = start_example() end)
  after_each(function()
    stop_example(pid)
    os.remove(log)
  end)

  local function api(method, path, body, token)
    return assert(raw_http.request(port, method, path, { body = body, timeout = 30,
      headers = { Authorization = "Bearer " .. (token or TOKEN) } }))
  end

  it("creates sessions for its token only, moves files in and out, streams a run and deletes", function()
    assert.equal(401, api("POST", "/sessions", nil, "wrong").status)
    local created = api("POST", "/sessions")
    assert.equal(201, created.status, created.body)
    local id = cjson.decode(created.body).id
    assert.equal(204, api("PUT", "/sessions/" .. id .. "/files?path=/in/data.bin", "bytes\0in").status)
    local read = api("GET", "/sessions/" .. id .. "/files?path=/in/data.bin")
    assert.equal("bytes\0in", read.body)
    local run = api("POST", "/sessions/" .. id .. "/run", cjson.encode{ argv = { "cat", "/in/data.bin" } })
    assert.equal("text/event-stream", run.headers["content-type"])
    assert.equal("event: stdout\nid: 0\ndata: " .. core.b64encode("bytes\0in") .. "\n\n",
      run.body:match("^(.-\n\n)"))
    assert.same({ code = 0, truncated = false }, cjson.decode(run.body:match("event: exit\ndata: ([^\n]*)\n\n$")))
    local text = assert(raw_http.request(port, "POST", "/sessions/" .. id .. "/run?format=text", { timeout = 30,
      body = cjson.encode{ argv = { "sh", "-c", "cat /in/data.bin; exit 4" } },
      headers = { Authorization = "Bearer " .. TOKEN, TE = "trailers" } }))
    assert.equal("text/plain", text.headers["content-type"])
    assert.equal("bytes\0in\nsandkit: exit code 4\n", text.body)
    assert.same({ ["sandkit-exit"] = "4" }, text.trailers)
    assert.equal(204, api("DELETE", "/sessions/" .. id).status)
    assert.equal(404, api("GET", "/sessions/" .. id .. "/files?path=/in/data.bin").status)
  end)

  it("shows a command's streamed lines and its exit code in headless Chromium", function()
    assert(files.execute("test -x " .. CHROMIUM), "this spec needs Debian's chromium")
    local profile = nginx.temp_dir()
    local dom = profile .. "/dom.html"
    local command = "echo one; sleep 1; echo two >&2; exit 3"
    local url = string.format("http://127.0.0.1:%d/#token=%s&run=%s", port, TOKEN,
      (command:gsub("[^%w]", function(c) return string.format("%%%02X", c:byte()) end)))
    -- Virtual time stands still while a fetch is pending, so the budget outlasts the stream.
    -- Chromium makes its singleton socket's folder in $TMPDIR: the profile's, removed with it.
    local browser = assert(core.spawn({ CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
      "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
      "--disable-sync", "--user-data-dir=" .. profile .. "/profile", "--virtual-time-budget=20000",
      "--dump-dom", url }, { stdout = dom, stderr = profile .. "/chromium.log", setsid = true,
      env = processes.env({ HOME = profile, TMPDIR = profile }) }))
    local finished = reaped(browser, BROWSER_TIMEOUT)
    if not finished then
      -- Its own session (setsid): the renderers and the zygote go with it.
      os.execute("kill -KILL -- -" .. browser)
      core.reap(browser, true)
    end
    local page = files.read(dom) or ""
    core.remove_tree(profile)
    assert.is_true(finished, "Chromium did not finish within " .. BROWSER_TIMEOUT .. " s")
    local output = page:match('<pre id="output">(.-)</pre>')
    assert.equal('<span class="stdout">one\n</span><span class="stderr">two\n</span>', output, page)
    assert.equal("exit 3", page:match('<p id="status">(.-)</p>'))
  end)

  it("opens a shell on a terminal page in headless Chromium: typed input, a resize, and the shell ends with the page",
    function()
      assert(files.execute("test -x " .. CHROMIUM), "this spec needs Debian's chromium")
      if not files.execute("test -f examples/openresty/node_modules/@xterm/xterm/lib/xterm.js") then
        pending("the terminal page needs xterm.js, which examples/openresty/setup.sh installs with npm, "
          .. "and run.sh could not")
        return
      end
      local profile = nginx.temp_dir()
      local out = profile .. "/report.json"
      local driver = assert(core.spawn({ "/usr/bin/python3", "spec/support/cdp_terminal.py", CHROMIUM,
        profile .. "/profile", "http://127.0.0.1:" .. port, TOKEN },
        { stdout = out, stderr = profile .. "/driver.log", setsid = true,
          env = processes.env({ HOME = profile, TMPDIR = profile }) }))
      local finished = reaped(driver, 2 * BROWSER_TIMEOUT)
      if not finished then
        os.execute("kill -KILL -- -" .. driver)
        core.reap(driver, true)
      end
      local text = files.read(out) or ""
      local logged = files.read(profile .. "/driver.log") or ""
      core.remove_tree(profile)
      assert.is_true(finished, "the driver did not finish")
      local report = cjson.decode(text ~= "" and text or "{}")
      assert.is_true(report.ok, tostring(report.step) .. "\n" .. tostring(report.text) .. "\n" .. logged)
      assert.equal(string.format("%d %d", report.size[2], report.size[1]), report.stty)
      assert.is_true(report.gone_after <= 1, "the shell outlived its page by " .. tostring(report.gone_after) .. " s")
    end)
end)
