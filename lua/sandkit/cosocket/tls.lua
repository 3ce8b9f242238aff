--- TLS for the nginx transport (sandkit.cosocket): nginx's own handshake, verified against
-- `lua_ssl_trusted_certificate`, and through LuaJIT's FFI into the OpenSSL nginx is linked
-- with what nginx does not check: a server reached by IP address against its certificate's
-- addresses, and a request's own CAs (`ca_pem`, `ca_file`) as the only ones it trusts, as
-- over libcurl. A client certificate goes through `tcpsock:setclientcert`.
--
--   tls.handshake(sock, url, spec) -> true | nil, why      (url: sandkit.http1.parse_url's)
--   tls.MAX_PEM                    -- the most PEM text a request may hand in

local core = require "sandkit.core"
local localfile = require "sandkit.localfile"

local tls = {}


--- PEM text a request may hand in (ca_pem, client_cert_pem, client_key_pem, a ca_file's
-- contents, which localfile.read_ca_file holds to it): the libcurl transport's bound, so both
-- transports refuse the same requests.
local MAX_PEM = core.LIMITS.MAX_PEM
tls.MAX_PEM = MAX_PEM

local x509

--- Declares what the checks below call of the OpenSSL nginx is linked with, once.
local function openssl()
  if not x509 then
    local ffi = require "ffi"
    for _, decl in ipairs{ "typedef struct x509_st X509;", "typedef struct bio_st BIO;",
        "typedef struct x509_store_st X509_STORE;", "typedef struct x509_store_ctx_st X509_STORE_CTX;",
        "X509 *SSL_SESSION_get0_peer(void *session);",
        "int X509_check_ip_asc(X509 *x, const char *address, unsigned int flags);",
        "BIO *BIO_new_mem_buf(const void *buf, int len);", "int BIO_free(BIO *a);",
        "X509 *PEM_read_bio_X509(BIO *bp, X509 **x, void *cb, void *u);", "void X509_free(X509 *a);",
        "X509_STORE *X509_STORE_new(void);", "void X509_STORE_free(X509_STORE *v);",
        "int X509_STORE_add_cert(X509_STORE *ctx, X509 *x);",
        "int X509_STORE_set_flags(X509_STORE *ctx, unsigned long flags);",
        "X509_STORE_CTX *X509_STORE_CTX_new(void);", "void X509_STORE_CTX_free(X509_STORE_CTX *ctx);",
        "int X509_STORE_CTX_init(X509_STORE_CTX *ctx, X509_STORE *store, X509 *x509, void *chain);",
        "int X509_verify_cert(X509_STORE_CTX *ctx);", "int X509_STORE_CTX_get_error(X509_STORE_CTX *ctx);",
        "const char *X509_verify_cert_error_string(long n);", "void ERR_clear_error(void);" } do
      -- Another module may have declared it already; a second declaration is an error.
      pcall(ffi.cdef, decl)
    end
    x509 = { ffi = ffi, C = ffi.C }
  end
  return x509
end

--- X509_V_FLAG_PARTIAL_CHAIN: a certificate of the request's own CAs is an anchor even when it
-- is an intermediate, as it is for libcurl's CAINFO.
local PARTIAL_CHAIN = 0x80000

--- The check nginx does not do: a peer reached by IP address must name that address among its
-- certificate's IP addresses (X509_check_ip_asc).
local function names_ip(peer, address)
  return openssl().C.X509_check_ip_asc(peer, address, 0) == 1
end

--- Whether the peer certificate chains to a CA of the PEM bundle `anchors` alone: nil when it
-- does, else why not. nginx has already verified the chain against its own trusted CAs; this
-- keeps a request's CA meaning what it means over libcurl, the only CAs trusted. The chain
-- the server sent is not kept in the session, so an intermediate between the certificate and
-- the request's CA must be in the bundle itself.
local function chains_to(peer, anchors)
  local o = openssl()
  local C, ffi = o.C, o.ffi
  local store = C.X509_STORE_new()
  local ctx = C.X509_STORE_CTX_new()
  local bio = C.BIO_new_mem_buf(anchors, #anchors)
  local why
  if store == nil or ctx == nil or bio == nil then
    why = "out of memory"
  else
    local count = 0
    while true do
      local cert = C.PEM_read_bio_X509(bio, nil, nil, nil)
      if cert == nil then break end
      count = count + 1
      -- The store holds its own reference; this one is released either way.
      local added = C.X509_STORE_add_cert(store, cert)
      C.X509_free(cert)
      if added ~= 1 then
        why = "a certificate of it could not be used"
        break
      end
    end
    if not why and count == 0 then why = "it holds no PEM certificate" end
    if not why then
      C.X509_STORE_set_flags(store, PARTIAL_CHAIN)
      if C.X509_STORE_CTX_init(ctx, store, peer, nil) ~= 1 then
        why = "out of memory"
      elseif C.X509_verify_cert(ctx) ~= 1 then
        why = ffi.string(C.X509_verify_cert_error_string(C.X509_STORE_CTX_get_error(ctx)))
      end
    end
  end
  if bio ~= nil then C.BIO_free(bio) end
  if ctx ~= nil then C.X509_STORE_CTX_free(ctx) end
  if store ~= nil then C.X509_STORE_free(store) end
  -- The end of the bundle leaves "no start line" queued, and nginx reads the queue after its
  -- own TLS calls on this worker.
  C.ERR_clear_error()
  return why
end

--- A request's own CAs, as PEM text: ca_pem, else the file ca_file. nil when it names none;
-- nil, why when the file cannot be read.
local function request_anchors(spec)
  if spec.ca_pem ~= nil then return spec.ca_pem, "ca_pem" end
  if spec.ca_file == nil then return nil end
  local text, why = localfile.read_ca_file(spec.ca_file)
  if not text then return nil, why end
  return text, "ca_file " .. spec.ca_file
end

local function present_client_certificate(sock, spec)
  if spec.client_cert_pem == nil and spec.client_key_pem == nil then return true end
  if type(spec.client_cert_pem) ~= "string" or type(spec.client_key_pem) ~= "string" then
    return nil, "a client certificate needs both client_cert_pem and client_key_pem"
  end
  local ssl = require "ngx.ssl"
  local cert, err = ssl.parse_pem_cert(spec.client_cert_pem)
  if not cert then return nil, "the client certificate did not parse: " .. tostring(err) end
  local key
  key, err = ssl.parse_pem_priv_key(spec.client_key_pem)
  if not key then return nil, "the client key did not parse: " .. tostring(err) end
  return sock:setclientcert(cert, key)
end

--- Verifies the server and, for mTLS, presents the client certificate. true, or nil and why.
-- The name checked and sent as SNI is `tls_server_name`, else the URL's host; nginx checks DNS
-- names only, so a host that is an IP address is sent no SNI and checked here.
function tls.handshake(sock, url, spec)
  local anchors, source = request_anchors(spec)
  if source and not anchors then return nil, source end
  local ok, err = present_client_certificate(sock, spec)
  if not ok then return nil, err end
  local name = spec.tls_server_name
  if name == nil and not url.ip then name = url.host end
  local peer_name = name or url.ip
  local session
  session, err = sock:sslhandshake(nil, name, true)
  if not session then return nil, "TLS handshake with " .. peer_name .. " failed: " .. tostring(err) end
  -- The handshake verified the chain against nginx's CAs (and a DNS name); what it did not
  -- check is read from the session's peer certificate.
  local peer = session ~= nil and openssl().C.SSL_SESSION_get0_peer(session) or nil
  if peer == nil then
    return nil, "TLS handshake with " .. peer_name .. " failed: no peer certificate to check"
  end
  if not name and not names_ip(peer, url.ip) then
    return nil, "TLS handshake with " .. url.ip .. " failed: the certificate does not name "
      .. url.ip .. " (certificate host mismatch)"
  end
  if anchors then
    local why = chains_to(peer, anchors)
    if why then
      return nil, "TLS handshake with " .. peer_name .. " failed: its certificate does not chain "
        .. "to the CA this request trusts (" .. source .. "): " .. why
    end
  end
  return true
end

return tls
