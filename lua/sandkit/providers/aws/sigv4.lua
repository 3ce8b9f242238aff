--- sandkit.providers.aws.sigv4 — AWS Signature Version 4 for a request about to be sent.
--
-- A thin layer over core.sigv4 (src/lua_sigv4.c, docs/sigv4.md) that takes a URL and a
-- credentials table and hands back what to send:
--
--   local signed = sigv4.sign{
--     method = "POST",
--     url = "https://lambda.us-east-2.amazonaws.com/2025-09-09/microvms",  -- path percent-encoded
--     headers = { ["content-type"] = "application/json" },  -- every header sent; host comes from url
--     body = '{"imageIdentifier":"..."}',                    -- or payload_hash = "UNSIGNED-PAYLOAD"
--     credentials = { access_key_id = "AKID...", secret_access_key = "...", session_token = nil },
--     region = "us-east-2", service = "lambda",
--     time = nil,                     -- Unix seconds; now when nil
--     s3 = false,                     -- S3 signs the path as sent and asks for x-amz-content-sha256
--     content_sha256_header = nil,    -- overrides what s3 implies
--   }
--   signed.url      -- the URL to send: its query is exactly the one that was signed
--   signed.headers  -- the given headers plus host, authorization, x-amz-date and, when they
--                   -- apply, x-amz-security-token and x-amz-content-sha256
--   signed.signing  -- core.sigv4's result (canonical_request, string_to_sign, signature, ...)
--
-- Misuse raises. Nothing here puts a credential into an error message.

local core = require "sandkit.core"

local M = {}

local default_port = { http = "80", https = "443" }

-- Splits an http(s) URL into the Host header curl will send (the authority as written, without
-- a default port), the path as sent and the raw query.
local function split_url(url)
  local scheme, authority, path, query = url:match("^(%a[%w+.-]*)://([^/?#]*)([^?#]*)%??([^#]*)$")
  scheme = scheme and scheme:lower()
  if not default_port[scheme] or authority == "" then
    error("sigv4: url must be an absolute http or https URL", 3)
  end
  if authority:find("@", 1, true) then
    error("sigv4: url must not carry user information", 3)
  end
  local host, port = authority:match("^(.*):(%d+)$")
  if host and port == default_port[scheme] then authority = host end
  return scheme, authority, path ~= "" and path or "/", query
end

local function has_header(headers, name)
  for k in pairs(headers) do
    if type(k) == "string" and k:lower() == name then return true end
  end
  return false
end

function M.sign(req)
  if type(req) ~= "table" then error("sigv4: sign expects a table", 2) end
  if type(req.url) ~= "string" then error("sigv4: url must be a string", 2) end
  local creds = req.credentials
  if type(creds) ~= "table" then error("sigv4: credentials must be a table", 2) end
  local headers = req.headers or {}
  if type(headers) ~= "table" then error("sigv4: headers must be a table", 2) end

  local scheme, authority, path, query = split_url(req.url)
  local out = {}
  for k, v in pairs(headers) do out[k] = v end
  if not has_header(headers, "host") then out.host = authority end

  -- An empty AWS_SESSION_TOKEN means long-term credentials, not an empty token.
  local token = creds.session_token
  if token == "" then token = nil end
  local s3 = req.s3 == true
  local content_sha256 = req.content_sha256_header
  if content_sha256 == nil then content_sha256 = s3 end

  local signing = core.sigv4{
    method = req.method,
    path = path,
    query = query ~= "" and query or nil,
    headers = out,
    body = req.body,
    payload_hash = req.payload_hash,
    region = req.region,
    service = req.service,
    access_key = creds.access_key_id,
    secret_key = creds.secret_access_key,
    session_token = token,
    time = req.time or os.time(),
    content_sha256_header = content_sha256,
    double_encode_path = not s3,
    normalize_path = not s3,
  }

  out.authorization = signing.authorization
  out["x-amz-date"] = signing["x-amz-date"]
  out["x-amz-security-token"] = signing["x-amz-security-token"]
  out["x-amz-content-sha256"] = signing["x-amz-content-sha256"]
  local url = scheme .. "://" .. authority .. path
  if signing.query ~= "" then url = url .. "?" .. signing.query end
  return { url = url, headers = out, signing = signing }
end

return M
