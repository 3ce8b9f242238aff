--- Test certificates made with the openssl command line tool, for the specs that speak TLS:
-- a CA, server certificates it signs, and client certificates for mutual TLS.
--
--   local ca = tls.ca(dir, "ca")                  -- dir/ca.crt, dir/ca.key
--   tls.issue(dir, ca, "server", { "IP:127.0.0.1", "DNS:localhost" })   -- dir/server.crt/.key
--   tls.issue(dir, ca, "client", nil, "client")   -- a client certificate, CN=client
--   tls.issue(dir, ca, "admin", nil, "client", "/O=system:masters/CN=admin")  -- its own subject
--   tls.run(dir, "openssl genpkey -algorithm ed25519 -out key.pem")         -- any command
--
-- Anything that fails fails the spec with openssl's own words.

local files = require "support.files"

local tls = {}

local EC = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"

--- Runs a shell command in dir, failing the spec with its output when it fails.
function tls.run(dir, command)
  local log = dir .. "/openssl.log"
  if not files.execute("cd " .. files.shell_quote(dir) .. " && " .. command .. " >" .. files.shell_quote(log)
      .. " 2>&1") then
    error("`" .. command .. "` failed:\n" .. (files.read(log) or ""), 0)
  end
end

--- Whether the openssl command was found: asked once a process.
local have_openssl

function tls.require_openssl()
  have_openssl = have_openssl or files.execute("command -v openssl >/dev/null 2>&1")
  if not have_openssl then
    error("this spec needs the openssl command line tool (Debian package openssl)", 0)
  end
end

--- A self-signed CA named `name` in dir; returns its name.
function tls.ca(dir, name)
  tls.require_openssl()
  tls.run(dir, "openssl req -x509 " .. EC .. " -keyout " .. name .. ".key -out " .. name .. ".crt -days 1"
    .. " -subj '/CN=sandkit test CA " .. name .. "' -addext 'basicConstraints=critical,CA:TRUE'"
    .. " -addext 'keyUsage=critical,keyCertSign,cRLSign'")
  return name
end

--- A certificate `name` signed by CA `ca`: for a server with the subject alternative names
-- `sans` (e.g. { "IP:127.0.0.1", "DNS:localhost" }), or for a client when `usage` is "client";
-- its subject is `subject` (default /CN=<name>).
function tls.issue(dir, ca, name, sans, usage, subject)
  local ext = { "basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
    "extendedKeyUsage=" .. (usage == "client" and "clientAuth" or "serverAuth") }
  if sans then ext[#ext + 1] = "subjectAltName=" .. table.concat(sans, ",") end
  files.write(dir .. "/" .. name .. ".ext", table.concat(ext, "\n") .. "\n")
  tls.run(dir, "openssl req " .. EC .. " -keyout " .. name .. ".key -out " .. name .. ".csr -subj '"
    .. (subject or "/CN=" .. name) .. "'")
  tls.run(dir, "openssl x509 -req -in " .. name .. ".csr -CA " .. ca .. ".crt -CAkey " .. ca .. ".key -set_serial "
    .. math.random(1, 2 ^ 30) .. " -days 1 -extfile " .. name .. ".ext -out " .. name .. ".crt")
end

return tls
