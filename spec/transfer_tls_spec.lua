-- The TLS fields of a request (http.lua, transfer.c): a CA, a client certificate and key given
-- as PEM text, and a TLS server name other than the URL's host, against a real nginx with a
-- test CA (spec/support/kube_cluster.lua's front, which logs what it saw of each client).

local http = require "sandkit.http"
local wait = require "sandkit.wait"
local files = require "support.files"
local kube_cluster = require "support.kube_cluster"
local local_state = require "support.local_state"

describe("a request's TLS material in memory", function()
  local cluster
  setup(function() cluster = kube_cluster.start{} end)
  teardown(function() if cluster then cluster:stop() end end)

  local PATH = "/api/v1/namespaces/sandkit-test/pods/none"

  local function exchange(fields)
    local spec = { method = "GET", url = cluster.server .. PATH, deadline = wait.now() + 10,
      headers = { Authorization = fields.token and ("Bearer " .. fields.token) or nil } }
    for k, v in pairs(fields) do if k ~= "token" then spec[k] = v end end
    return http.exchange(spec)
  end

  --- What the server saw of the last request: user, SNI, Host.
  local function last_seen()
    local entries = cluster:log_entries()
    for i = #entries, 1, -1 do
      if entries[i].request then return entries[i] end
    end
  end

  local function pem(name) return files.read(cluster.dir .. "/" .. name) end

  it("trusts exactly the CA given as ca_pem", function()
    local answer, failure = exchange{ ca_pem = cluster.ca_pem, token = kube_cluster.TOKEN }
    assert(answer, failure and failure.detail)
    assert.equal(404, answer.status)
    -- The system's store does not know the test CA, and another CA does not vouch for it.
    local _, refused = exchange{ token = kube_cluster.TOKEN }
    assert.equal("refused", refused.kind)
    local _, other = exchange{ ca_pem = pem("other-ca.crt"), token = kube_cluster.TOKEN }
    assert.equal("refused", other.kind)
    assert.is_false(other.sent)
  end)

  it("presents a client certificate and key given as PEM (mTLS)", function()
    local answer = assert(exchange{ ca_pem = cluster.ca_pem, client_cert_pem = pem("client.crt"),
      client_key_pem = pem("client.key") })
    assert.equal(404, answer.status)
    assert.equal(kube_cluster.CLIENT_CN, last_seen().user)
    -- Without it the server knows nobody.
    local anonymous = assert(exchange{ ca_pem = cluster.ca_pem })
    assert.equal(401, anonymous.status)
  end)

  it("sends tls_server_name as SNI and verifies the certificate by it, still connecting to the URL's host", function()
    local answer = assert(exchange{ ca_pem = cluster.ca_pem, tls_server_name = kube_cluster.SERVER_NAME,
      token = kube_cluster.TOKEN })
    assert.equal(404, answer.status)
    local seen = last_seen()
    assert.equal(kube_cluster.SERVER_NAME, seen.sni)
    assert.equal("127.0.0.1:" .. cluster.port, seen.host, "the Host header names the URL's host")
    -- A name the certificate nginx picks for it does not carry is refused: verification
    -- follows the name, not the address.
    local _, failure = exchange{ ca_pem = cluster.ca_pem, tls_server_name = "other.sandkit.test",
      token = kube_cluster.TOKEN }
    assert.equal("refused", failure.kind)
    -- Without it, the URL's host is the name: the certificate for 127.0.0.1.
    assert(exchange{ ca_pem = cluster.ca_pem, token = kube_cluster.TOKEN })
    assert.is_nil(last_seen().sni)
  end)

  it("reads a ca_file as a configuration file: trusted alone, or refused by its type before it can block", function()
    local answer, failure = exchange{ ca_file = cluster.ca_file, token = kube_cluster.TOKEN }
    assert(answer, failure and failure.detail)
    assert.equal(404, answer.status)
    -- A FIFO would block whoever opens it: the request runs in a process of its own that a bound
    -- kills, so one that blocks fails here instead of hanging the suite.
    local dir = files.temp_dir()
    local fifo = dir .. "/ca.fifo"
    assert(files.execute("mkfifo " .. files.shell_quote(fifo)))
    for path, kind in pairs{ [fifo] = "a FIFO", [dir] = "a directory", ["/dev/zero"] = "a character device" } do
      local out, err, status = local_state.sh(local_state.lua_env() .. " timeout -s KILL 10 "
        .. (os.getenv("SANDKIT_TEST_LUA") or "lua5.4") .. " -e " .. files.shell_quote(string.format([[
          local http = require "sandkit.http"
          local _, failure = http.exchange{ method = "GET", url = %q, ca_file = %q,
            deadline = require("sandkit.core").now() + 5 }
          io.write(failure.kind, " ", tostring(failure.sent), " ", failure.detail)]], cluster.server .. PATH, path)))
      assert.equal(0, status, err)
      assert.equal("refused false the request's CA file cannot be read: " .. path .. ": it is " .. kind
        .. ", not a regular file", out)
    end
    files.execute("rm -rf " .. files.shell_quote(dir))
  end)

  it("refuses misuse before anything is sent", function()
    local function refused(fields, pattern)
      local ok, err = pcall(exchange, fields)
      assert.is_false(ok)
      assert.matches(pattern, tostring(err))
    end
    refused({ ca_pem = cluster.ca_pem, ca_file = cluster.ca_file }, "exclude each other")
    refused({ ca_pem = cluster.ca_pem, client_cert_pem = pem("client.crt") }, "come together")
    refused({ ca_pem = cluster.ca_pem, tls_server_name = "bad:name" }, "must be a DNS name")
    refused({ ca_pem = cluster.ca_pem, tls_server_name = string.rep("a", 254) }, "must be a DNS name")
    refused({ ca_pem = string.rep("x", 1024 * 1024 + 1) }, "PEM text over 1048576 bytes")
    -- At the bound exactly: accepted (and then not a CA libcurl can use).
    local _, failure = exchange{ ca_pem = cluster.ca_pem .. string.rep("\n", 1024 * 1024 - #cluster.ca_pem),
      token = kube_cluster.TOKEN }
    assert.is_nil(failure)
  end)
end)
