-- AWS Signature Version 4 (src/common/sigv4.c, src/lua_sigv4.c, lua/sandkit/providers/aws/sigv4.lua)
-- against AWS's published test suite and the Lambda MicroVMs request shapes.
-- spec/fixtures/sigv4/SOURCES.md says where each fixture comes from.
local core = require "sandkit.core"
local cjson = require "cjson"
local sigv4 = require "sandkit.providers.aws.sigv4"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local fixtures = here .. "fixtures/sigv4/"

local function read(path)
  local f = assert(io.open(fixtures .. path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

-- Unix seconds of a "YYYY-MM-DDTHH:MM:SS(.fff)Z" or "YYYYMMDDTHHMMSSZ" timestamp (days from civil, as in sigv4.c but
-- the other way round), so the spec depends on no time zone setting.
local function unix_time(stamp)
  local y, m, d, hh, mm, ss = stamp:match("^(%d%d%d%d)-?(%d%d)-?(%d%d)T(%d%d):?(%d%d):?(%d%d)")
  y, m, d = tonumber(y), tonumber(m), tonumber(d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * (m > 2 and m - 3 or m + 9) + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  local days = era * 146097 + doe - 719468
  return days * 86400 + tonumber(hh) * 3600 + tonumber(mm) * 60 + tonumber(ss)
end

-- A header table for core.sigv4 from "Name:value" lines: a repeated name becomes a list in
-- order, and an obs-fold (a line starting with a blank) is unfolded into a space, as RFC 9112
-- §5.2 has a recipient do.
local function parse_headers(lines, first)
  local headers, last = {}, nil
  for i = first, #lines do
    local line = lines[i]
    if line:match("^[ \t]") then
      local list = headers[last]
      list[#list] = list[#list] .. " " .. line:match("^[ \t]*(.-)[ \t]*$")
    else
      local name, value = assert(line:match("^([^:]+):(.*)$"))
      headers[name] = headers[name] or {}
      table.insert(headers[name], value)
      last = name
    end
  end
  for name, list in pairs(headers) do
    if #list == 1 then headers[name] = list[1] end
  end
  return headers
end

-- The suite's request.txt: request line, header lines, and a body after a blank line. A path
-- may hold a raw space ("GET /example space/ HTTP/1.1"), so the target runs to " HTTP/1.1".
local function parse_request(text)
  local head, body = text:match("^(.-)\n\n(.*)$")
  if not head then head, body = text:gsub("\n$", ""), "" end
  local lines = {}
  for line in (head .. "\n"):gmatch("(.-)\n") do lines[#lines + 1] = line end
  local method, target = assert(lines[1]:match("^(%S+) (.*) HTTP/1%.1$"))
  local path, query = target:match("^([^?]*)%??(.*)$")
  return {
    method = method,
    path = path,
    query = query ~= "" and query or nil,
    headers = parse_headers(lines, 2),
    body = body,
  }
end

-- A header's value from the suite's signed request, found by case-insensitive name.
local function signed_header(text, name)
  for line in text:gmatch("[^\n]+") do
    local n, v = line:match("^([^:]+):(.*)$")
    if n and n:lower() == name then return v end
  end
  return nil
end

-- Every case of the v4 header-signing suite. Excluded on purpose: the suite's query-*.txt files
-- (presigned URLs: sandkit signs in headers only) and the v4a folder (ECDSA, not SigV4).
local suite_cases = {
  "get-header-key-duplicate", "get-header-value-multiline", "get-header-value-order",
  "get-header-value-trim", "get-relative-normalized", "get-relative-relative-normalized",
  "get-relative-relative-unnormalized", "get-relative-unnormalized",
  "get-slash-dot-slash-normalized", "get-slash-dot-slash-unnormalized", "get-slash-normalized",
  "get-slash-pointless-dot-normalized", "get-slash-pointless-dot-unnormalized",
  "get-slash-unnormalized", "get-slashes-normalized", "get-slashes-unnormalized",
  "get-space-normalized", "get-space-unnormalized", "get-unreserved", "get-utf8",
  "get-vanilla", "get-vanilla-empty-query-key", "get-vanilla-query",
  "get-vanilla-query-order-encoded", "get-vanilla-query-order-key-case",
  "get-vanilla-query-unreserved", "get-vanilla-utf8-query", "get-vanilla-with-session-token",
  "post-header-key-case", "post-header-key-sort", "post-header-value-case",
  "post-sts-header-after", "post-sts-header-before", "post-vanilla",
  "post-vanilla-empty-query-value", "post-vanilla-query", "post-x-www-form-urlencoded",
  "post-x-www-form-urlencoded-parameters",
}

describe("core.sigv4 on AWS's SigV4 test suite (aws-c-auth v4, header signing)", function()
  it("runs all 38 header-signing cases of the suite", function()
    assert.are.equal(38, #suite_cases)
  end)

  for _, name in ipairs(suite_cases) do
    it("signs the suite's " .. name ..
       " case to its canonical request, string to sign and Authorization header", function()
      local dir = "v4/" .. name .. "/"
      local ctx = cjson.decode(read(dir .. "context.json"))
      local req = parse_request(read(dir .. "request.txt"))
      local token = ctx.credentials.token
      local s = core.sigv4{
        method = req.method,
        path = req.path,
        query = req.query,
        headers = req.headers,
        body = req.body,
        region = ctx.region,
        service = ctx.service,
        access_key = ctx.credentials.access_key_id,
        secret_key = ctx.credentials.secret_access_key,
        session_token = token,
        time = unix_time(ctx.timestamp),
        normalize_path = ctx.normalize,
        content_sha256_header = ctx.sign_body,
        sign_session_token = not ctx.omit_session_token,
      }
      local sreq = read(dir .. "header-signed-request.txt")
      assert.are.equal(read(dir .. "header-canonical-request.txt"), s.canonical_request)
      assert.are.equal(read(dir .. "header-string-to-sign.txt"), s.string_to_sign)
      assert.are.equal(read(dir .. "header-signature.txt"), s.signature)
      assert.are.equal(signed_header(sreq, "authorization"), s.authorization)
      assert.are.equal(signed_header(sreq, "x-amz-date"), s["x-amz-date"])
      assert.are.equal(signed_header(sreq, "x-amz-security-token"), s["x-amz-security-token"])
      assert.are.equal(signed_header(sreq, "x-amz-content-sha256"), s["x-amz-content-sha256"])
    end)
  end
end)

describe("core.sigv4 on the @aws-sdk/signature-v4 suite fixture", function()
  local suite = cjson.decode(read("signature-v4-suite.json"))

  it("runs all 24 cases of the fixture", function()
    assert.are.equal(24, #suite.requests)
  end)

  for _, case in ipairs(suite.requests) do
    it("signs the fixture's " .. case.name ..
       " case to its Authorization header, with the query given as decoded parameters", function()
      local r = case.request
      -- The fixture's requests already carry the x-amz-date that the signer sets itself.
      local headers, date = {}, nil
      for k, v in pairs(r.headers) do
        if k == "x-amz-date" then date = v else headers[k] = v end
      end
      local s = core.sigv4{
        method = r.method,
        path = r.path,
        query = r.query,
        headers = headers,
        body = r.body,
        region = suite.region,
        service = suite.service,
        access_key = suite.credentials.accessKeyId,
        secret_key = suite.credentials.secretAccessKey,
        time = unix_time(suite.signingDate),
      }
      assert.are.equal(date, s["x-amz-date"])
      assert.are.equal(case.authorization, s.authorization)
    end)
  end
end)

describe("core.sigv4 on the Lambda MicroVMs request shapes", function()
  local lambda = cjson.decode(read("lambda.json"))

  for _, case in ipairs(lambda.cases) do
    it(case.name, function()
      local r = case.request
      local opts = {
        method = r.method, path = r.path, query = r.query, headers = r.headers, body = r.body,
        payload_hash = r.payload_hash, region = r.region, service = r.service,
        access_key = r.access_key, secret_key = r.secret_key, session_token = r.session_token,
        time = r.time,
      }
      for flag, v in pairs(r.flags or {}) do opts[flag] = v end
      local s = core.sigv4(opts)
      for _, field in ipairs{ "canonical_request", "string_to_sign", "signature", "authorization",
                              "signed_headers", "query", "x-amz-date", "x-amz-security-token",
                              "x-amz-content-sha256" } do
        assert.are.equal(case.expected[field], s[field], field)
      end
    end)
  end
end)

describe("core.sigv4", function()
  local function base(over)
    local t = {
      method = "GET", path = "/", headers = { host = "example.amazonaws.com" },
      region = "us-east-1", service = "service", access_key = "AKIDEXAMPLE",
      secret_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", time = 1440938160,
    }
    for k, v in pairs(over or {}) do t[k] = v end
    return t
  end

  it("renders x-amz-date as the UTC date and time of the Unix seconds, across leap days and the extremes", function()
    for t, date in pairs{ [0] = "19700101T000000Z", [951782400] = "20000229T000000Z",
                          [1709251199] = "20240229T235959Z", [253402300799] = "99991231T235959Z" } do
      assert.are.equal(date, core.sigv4(base{ time = t })["x-amz-date"])
    end
  end)

  it("signs every value of a header given as a list, joined with commas in list order", function()
    local s = core.sigv4(base{ headers = { host = "example.amazonaws.com", ["X-Multi"] = { " b ", "a" } } })
    assert.truthy(s.canonical_request:find("\nx-multi:b,a\n", 1, true))
  end)

  it("accepts a payload hash in place of a body and signs it as given", function()
    local s = core.sigv4(base{ payload_hash = "UNSIGNED-PAYLOAD" })
    assert.are.equal("UNSIGNED-PAYLOAD", s.canonical_request:match("[^\n]*$"))
  end)

  it("encodes a '+' in a raw query as a plus sign, not a space", function()
    assert.are.equal("a=b%2Bc&d=e%20f", core.sigv4(base{ query = "d=e%20f&a=b+c" }).query)
  end)

  it("refuses a request without a host header", function()
    assert.has_error(function() core.sigv4(base{ headers = {} }) end,
                     "sigv4: headers must include host")
  end)

  it("refuses a header value holding CR or LF, which could smuggle a header into the request", function()
    for _, v in ipairs{ "a\r\nx-evil: 1", "a\nb", "a\0b" } do
      assert.has_error(function()
        core.sigv4(base{ headers = { host = "example.amazonaws.com", ["x-a"] = v } })
      end)
    end
  end)

  it("refuses headers the signer sets itself", function()
    for _, h in ipairs{ "X-Amz-Date", "Authorization" } do
      assert.has_error(function()
        core.sigv4(base{ headers = { host = "example.amazonaws.com", [h] = "x" } })
      end)
    end
    assert.has_error(function()
      core.sigv4(base{ session_token = "tok",
                       headers = { host = "example.amazonaws.com", ["x-amz-security-token"] = "tok" } })
    end)
    assert.has_error(function()
      core.sigv4(base{ content_sha256_header = true,
                       headers = { host = "example.amazonaws.com", ["x-amz-content-sha256"] = "x" } })
    end)
  end)

  it("refuses two header keys that differ only in case, since their order would be undefined", function()
    assert.has_error(function()
      core.sigv4(base{ headers = { host = "example.amazonaws.com", ["X-A"] = "1", ["x-a"] = "2" } })
    end)
  end)

  it("refuses a body and a payload hash together", function()
    assert.has_error(function() core.sigv4(base{ body = "", payload_hash = "UNSIGNED-PAYLOAD" }) end,
                     "sigv4: give body or payload_hash, not both")
  end)

  it("refuses an unknown option and names it", function()
    assert.has_error(function() core.sigv4(base{ session_tokn = "x" }) end,
                     "sigv4: unknown option 'session_tokn'")
  end)

  it("refuses a time that is fractional, negative or past 9999", function()
    for _, t in ipairs{ 1.5, -1, 253402300800 } do
      assert.has_error(function() core.sigv4(base{ time = t }) end)
    end
  end)

  it("refuses a path that is not absolute or that carries a query or fragment", function()
    for _, p in ipairs{ "", "a/b", "/a?b=c", "/a#b", "/a\rb" } do
      assert.has_error(function() core.sigv4(base{ path = p }) end)
    end
  end)

  it("refuses more than 64 header lines and more than 256 query parameters", function()
    local headers, params = { host = "example.amazonaws.com" }, {}
    for i = 1, 64 do headers["x-h" .. i] = "v" end
    for i = 1, 257 do params["p" .. i] = "v" end
    assert.has_error(function() core.sigv4(base{ headers = headers }) end,
                     "sigv4: at most 64 header lines and 32768 bytes of headers can be signed")
    assert.has_error(function() core.sigv4(base{ query = params }) end)
    assert.has_error(function() core.sigv4(base{ query = ("a=b&"):rep(257) }) end)
  end)

  it("never puts a credential into an error message", function()
    local secret, token = "SECRET-" .. ("s"):rep(200), "TOKEN with space"
    for _, over in ipairs{ { secret_key = secret }, { session_token = token },
                           { access_key = "AKID/SECRET" } } do
      local ok, err = pcall(core.sigv4, base(over))
      assert.is_false(ok)
      assert.falsy(tostring(err):find("SECRET", 1, true))
      assert.falsy(tostring(err):find("TOKEN", 1, true))
    end
  end)

  it("computes sha256_hex as the lowercase hex SHA-256 of a binary-safe string", function()
    assert.are.equal("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", core.sha256_hex(""))
    assert.are.equal("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", core.sha256_hex("abc"))
    assert.are.equal("6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d", core.sha256_hex("\0"))
  end)
end)

describe("sandkit.providers.aws.sigv4.sign", function()
  local creds = { access_key_id = "AKIDEXAMPLE", secret_access_key = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY" }

  it("signs the suite's get-vanilla-query-order-key-case from a URL and returns the sorted query in the URL to send",
     function()
    local signed = sigv4.sign{
      method = "GET", url = "https://example.amazonaws.com/?Param2=value2&Param1=value1",
      credentials = creds, region = "us-east-1", service = "service", time = 1440938160,
    }
    local sreq = read("v4/get-vanilla-query-order-key-case/header-signed-request.txt")
    assert.are.equal(signed_header(sreq, "authorization"), signed.headers.authorization)
    assert.are.equal("example.amazonaws.com", signed.headers.host)
    assert.are.equal("20150830T123600Z", signed.headers["x-amz-date"])
    assert.are.equal("https://example.amazonaws.com/?Param1=value1&Param2=value2", signed.url)
  end)

  it("signs a lambda request with temporary credentials exactly as core.sigv4 does", function()
    local case = cjson.decode(read("lambda.json")).cases[1]
    local r = case.request
    local signed = sigv4.sign{
      method = r.method, url = "https://" .. r.headers.host .. ":443" .. r.path,
      headers = { ["content-type"] = r.headers["content-type"] }, body = r.body,
      credentials = { access_key_id = r.access_key, secret_access_key = r.secret_key,
                      session_token = r.session_token },
      region = r.region, service = r.service, time = r.time,
    }
    assert.are.equal(case.expected.authorization, signed.headers.authorization)
    assert.are.equal(r.session_token, signed.headers["x-amz-security-token"])
    assert.are.equal("application/json", signed.headers["content-type"])
    assert.are.equal("https://" .. r.headers.host .. r.path, signed.url)
  end)

  it("treats an empty session token as long-term credentials", function()
    local signed = sigv4.sign{
      method = "GET", url = "https://example.amazonaws.com/",
      credentials = { access_key_id = "AKIDEXAMPLE", secret_access_key = creds.secret_access_key,
                      session_token = "" },
      region = "us-east-1", service = "service", time = 1440938160,
    }
    assert.is_nil(signed.headers["x-amz-security-token"])
    assert.are.equal(signed_header(read("v4/get-vanilla/header-signed-request.txt"), "authorization"),
                     signed.headers.authorization)
  end)

  it("signs an S3 path as sent and adds x-amz-content-sha256", function()
    local case = cjson.decode(read("lambda.json")).cases[9]
    local r = case.request
    local signed = sigv4.sign{
      method = r.method, url = "https://" .. r.headers.host .. r.path, s3 = true,
      payload_hash = r.payload_hash, credentials = { access_key_id = r.access_key,
      secret_access_key = r.secret_key }, region = r.region, service = r.service, time = r.time,
    }
    assert.are.equal(case.expected.authorization, signed.headers.authorization)
    assert.are.equal("UNSIGNED-PAYLOAD", signed.headers["x-amz-content-sha256"])
  end)

  it("signs with the current time when none is given", function()
    local before = os.time()
    local signed = sigv4.sign{ method = "GET", url = "https://example.amazonaws.com/",
                               credentials = creds, region = "us-east-1", service = "service" }
    local t = unix_time(signed.headers["x-amz-date"])
    assert.is_true(t >= before and t <= os.time())
  end)

  it("refuses a URL that is not absolute http(s) or that carries user information", function()
    for _, url in ipairs{ "/relative", "ftp://example.com/", "https://user:pw@example.com/" } do
      assert.has_error(function()
        sigv4.sign{ method = "GET", url = url, credentials = creds, region = "us-east-1", service = "s" }
      end)
    end
  end)
end)
