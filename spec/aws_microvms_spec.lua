-- The Lambda MicroVMs control-plane client (lua/sandkit/providers/aws/microvms.lua) against a fake control
-- plane over real sockets: the request shapes and their SigV4 signatures as they arrive, how
-- AWS's answers are classified, and what an error may say.

local core = require "sandkit.core"
local microvms = require "sandkit.providers.aws.microvms"
local aws_control_plane = require "support.aws_control_plane"
local files = require "support.files"

local LUA = os.getenv("SANDKIT_TEST_LUA") or "lua5.4"

local ACCESS_KEY = "AKIDEXAMPLE"
local SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
local SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN"

--- Unix seconds of an x-amz-date (YYYYMMDDTHHMMSSZ), independent of the local time zone.
local function amz_time(stamp)
  local y, m, d, hh, mm, ss = stamp:match("^(%d%d%d%d)(%d%d)(%d%d)T(%d%d)(%d%d)(%d%d)Z$")
  y, m, d = tonumber(y), tonumber(m), tonumber(d)
  local shifted = m <= 2 and y - 1 or y
  local era = math.floor(shifted / 400)
  local yoe = shifted - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return (era * 146097 + doe - 719468) * 86400 + tonumber(hh) * 3600 + tonumber(mm) * 60 + tonumber(ss)
end

--- Recomputes the signature of a recorded call from what arrived on the wire and the secret
-- the client was given: equal only if the client signed exactly what it sent.
local function assert_signed(call, credentials)
  local auth = call.headers.authorization
  assert.is_string(auth, "the call carries an Authorization header")
  local key, scope, signed_names, signature = auth:match(
    "^AWS4%-HMAC%-SHA256 Credential=([^/]+)/(%d+/[^/]+/[^/]+/aws4_request), SignedHeaders=([^,]+), Signature=(%x+)$")
  assert.is_string(signature, "an AWS4-HMAC-SHA256 Authorization: " .. auth)
  assert.equal(credentials.access_key_id, key)
  local headers = {}
  for name in signed_names:gmatch("[^;]+") do
    if name ~= "x-amz-date" and name ~= "x-amz-security-token" then
      headers[name] = assert(call.headers[name], "signed header " .. name .. " was sent")
    end
  end
  local expected = core.sigv4{
    method = call.method, path = call.path, query = call.query ~= "" and call.query or nil,
    headers = headers, body = call.body, region = scope:match("^%d+/([^/]+)/"), service = "lambda",
    access_key = credentials.access_key_id, secret_key = credentials.secret_access_key,
    session_token = credentials.session_token, time = amz_time(call.headers["x-amz-date"]),
  }
  assert.equal(expected.signature, signature, "the signature covers what was sent")
  return { scope = scope, signed = signed_names }
end

local LONG_TERM = { access_key_id = ACCESS_KEY, secret_access_key = SECRET }
local TEMPORARY = { access_key_id = "ASIAEXAMPLE", secret_access_key = SECRET,
  session_token = SESSION_TOKEN }

local function client_for(cp, extra)
  local options = { region = "us-east-2", endpoint = cp.url, timeout = 5,
    access_key_id = ACCESS_KEY, secret_access_key = SECRET }
  for k, v in pairs(extra or {}) do options[k] = v end
  return assert(microvms.new(options))
end

--- Runs `code` in a child Lua with exactly `env` (plus the module paths) and returns its stdout.
local function run_child(code, env)
  local out = files.temp_name()
  local pid = assert(core.spawn({ LUA, "-e", code }, { env = files.child_env(env), stdout = out,
    stderr = out }))
  core.reap(pid, true)
  local f = assert(io.open(out))
  local text = f:read("a")
  f:close()
  os.remove(out)
  return text
end

describe("the Lambda MicroVMs client", function()
  local cp
  after_each(function() if cp then cp:stop() cp = nil end end)

  it("sends RunMicrovm as a signed POST carrying the documented body", function()
    cp = aws_control_plane.start{ run = { microvmId = "mvm-1", state = "PENDING" } }
    local vm = assert(client_for(cp):run{ image_identifier = "sbx-image", image_version = "3",
      client_token = "0123456789abcdef0123456789abcdef", egress_network_connectors = { "arn:connector" },
      max_idle_duration_seconds = 600, maximum_duration_seconds = 1800 })
    assert.same({ id = "mvm-1", state = "PENDING", image_arn = "sbx-image", image_version = "3" }, vm)
    local calls = cp:calls()
    assert.equal(1, #calls)
    local call = calls[1]
    assert.equal("POST", call.method)
    assert.equal("/2025-09-09/microvms", call.path)
    assert.same({ imageIdentifier = "sbx-image", imageVersion = "3",
      clientToken = "0123456789abcdef0123456789abcdef", egressNetworkConnectors = { "arn:connector" },
      idlePolicy = { maxIdleDurationSeconds = 600, autoResumeEnabled = false },
      maximumDurationInSeconds = 1800 }, call.json)
    assert.equal("application/json", call.headers["content-type"])
    assert.matches("^%d%d%d%d%d%d%d%dT%d%d%d%d%d%dZ$", call.headers["x-amz-date"])
    assert.is_nil(call.headers["x-amz-security-token"], "long-term credentials carry no token")
    local signing = assert_signed(call, LONG_TERM)
    assert.matches("^%d+/us%-east%-2/lambda/aws4_request$", signing.scope)
    assert.equal("content-type;host;x-amz-date", signing.signed)
  end)

  it("leaves undeclared egress, idle policy and lifetime out of RunMicrovm", function()
    cp = aws_control_plane.start{}
    assert(client_for(cp):run{ image_identifier = "sbx-image", image_version = "3",
      client_token = "t1", egress_network_connectors = {} })
    assert.same({ imageIdentifier = "sbx-image", imageVersion = "3", clientToken = "t1" },
      cp:calls()[1].json)
  end)

  it("reads, terminates, suspends and resumes a MicroVM at its documented paths", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = { imageArn = "sbx-image",
      state = "RUNNING", endpoint = "mvm-1.lambda-microvms.aws", imageVersion = "3" } } }
    local client = client_for(cp)
    assert.same({ id = "mvm-1", state = "RUNNING", endpoint = "mvm-1.lambda-microvms.aws",
      image_arn = "sbx-image", image_version = "3" }, client:get("mvm-1"))
    assert.is_true(client:suspend("mvm-1"))
    assert.is_true(client:resume("mvm-1"))
    assert.is_true(client:terminate("mvm-1"))
    local seen = {}
    for _, call in ipairs(cp:calls()) do
      seen[#seen + 1] = call.method .. " " .. call.path .. " " .. call.body
      assert_signed(call, LONG_TERM)
    end
    assert.same({
      "GET /2025-09-09/microvms/mvm-1 ",
      "POST /2025-09-09/microvms/mvm-1/suspend {}",
      "POST /2025-09-09/microvms/mvm-1/resume {}",
      "DELETE /2025-09-09/microvms/mvm-1 ",
    }, seen)
  end)

  it("mints an auth token for the ports asked for and returns its header map", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = { imageArn = "sbx-image" } },
      auth_token = { ["X-aws-proxy-auth"] = "jwe-value", ["X-aws-proxy-token-id"] = "t-1" } }
    local headers = assert(client_for(cp):create_auth_token("mvm-1", { 8971 }, 5))
    assert.same({ ["X-aws-proxy-auth"] = "jwe-value", ["X-aws-proxy-token-id"] = "t-1" }, headers)
    local call = cp:calls_to("CreateMicrovmAuthToken")[1]
    assert.equal("/2025-09-09/microvms/mvm-1/auth-token", call.path)
    assert.same({ allowedPorts = { { port = 8971 } }, expirationInMinutes = 5 }, call.json)
    assert_signed(call, LONG_TERM)
  end)

  it("clamps a token's life to the 60 minutes AWS mints at most", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = { imageArn = "sbx-image" } } }
    assert(client_for(cp):create_auth_token("mvm-1", { 8080 }, 90))
    assert.equal(60, microvms.MAX_AUTH_TOKEN_MINUTES)
    assert.equal(60, cp:calls()[1].json.expirationInMinutes)
  end)

  it("signs the session token of temporary credentials and sends it", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = { imageArn = "sbx-image" } } }
    assert(client_for(cp, { access_key_id = "ASIAEXAMPLE", session_token = SESSION_TOKEN })
      :get("mvm-1"))
    local call = cp:calls()[1]
    assert.equal(SESSION_TOKEN, call.headers["x-amz-security-token"])
    local signing = assert_signed(call, TEMPORARY)
    assert.equal("host;x-amz-date;x-amz-security-token", signing.signed)
  end)

  it("escapes an id into one path segment, so no id reaches another route", function()
    cp = aws_control_plane.start{ microvms = { ["a/b c"] = { imageArn = "sbx-image" } } }
    local vm = assert(client_for(cp):get("a/b c"))
    assert.equal("a/b c", vm.id)
    local call = cp:calls()[1]
    assert.equal("/2025-09-09/microvms/a%2Fb%20c", call.path)
    assert_signed(call, LONG_TERM)
  end)

  it("asks a credentials function before every call, so rotated credentials are used", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = { imageArn = "sbx-image" } } }
    local asked = 0
    local client = assert(microvms.new{ region = "us-east-2", endpoint = cp.url,
      credentials = function()
        asked = asked + 1
        return { access_key_id = "ASIAROTATED" .. asked, secret_access_key = SECRET,
          session_token = SESSION_TOKEN .. asked }
      end })
    assert(client:get("mvm-1"))
    assert(client:get("mvm-1"))
    assert.equal(2, asked)
    local calls = cp:calls()
    assert_signed(calls[1], { access_key_id = "ASIAROTATED1", secret_access_key = SECRET,
      session_token = SESSION_TOKEN .. "1" })
    assert_signed(calls[2], { access_key_id = "ASIAROTATED2", secret_access_key = SECRET,
      session_token = SESSION_TOKEN .. "2" })
  end)

  it("refuses a call when the credentials function has none, and sends nothing", function()
    cp = aws_control_plane.start{}
    local client = assert(microvms.new{ region = "us-east-2", endpoint = cp.url,
      credentials = function() return nil, "the role session expired" end })
    local vm, err = client:get("mvm-1")
    assert.is_nil(vm)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("the role session expired", err.message, 1, true)
    assert.same({}, cp:calls(), "nothing was sent")
  end)

  it("reads credentials from the standard AWS environment variables", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = { imageArn = "sbx-image" } } }
    local out = run_child(string.format([[
      local m = require "sandkit.providers.aws.microvms"
      local c = assert(m.new{ region = "eu-west-1", endpoint = %q })
      local vm, err = c:get("mvm-1")
      io.write(vm and vm.id or tostring(err))
    ]], cp.url), { AWS_ACCESS_KEY_ID = "ASIAFROMENV", AWS_SECRET_ACCESS_KEY = SECRET,
      AWS_SESSION_TOKEN = SESSION_TOKEN })
    assert.equal("mvm-1", out)
    local call = cp:calls()[1]
    local signing = assert_signed(call, { access_key_id = "ASIAFROMENV",
      secret_access_key = SECRET, session_token = SESSION_TOKEN })
    assert.matches("/eu%-west%-1/lambda/", signing.scope)
  end)

  it("with no credentials anywhere, says where they are looked for and sends nothing", function()
    cp = aws_control_plane.start{}
    local out = run_child(string.format([[
      local m = require "sandkit.providers.aws.microvms"
      local c = assert(m.new{ region = "us-east-2", endpoint = %q })
      local vm, err = c:get("mvm-1")
      io.write(err.code, "|", err.message)
    ]], cp.url), {})
    assert.matches("^INVALID_INPUT|", out)
    assert.matches("AWS_ACCESS_KEY_ID", out, 1, true)
    assert.same({}, cp:calls())
  end)

  it("reads a 404 as absent, not as an error, for every call on a MicroVM", function()
    cp = aws_control_plane.start{}
    local client = client_for(cp)
    for _, call in ipairs{
      function() return client:get("gone") end,
      function() return client:terminate("gone") end,
      function() return client:suspend("gone") end,
      function() return client:resume("gone") end,
      function() return client:create_auth_token("gone", { 8971 }, 5) end,
    } do
      local value, err = call()
      assert.is_nil(value)
      assert.is_nil(err, "absent is an answer")
    end
    assert.equal(5, #cp:calls())
  end)

  it("reads a 404 from RunMicrovm as a refusal, not as absent", function()
    cp = aws_control_plane.start{ fail = { RunMicrovm = { status = 404,
      type = "ResourceNotFoundException", message = "Image sbx-image not found" } } }
    local vm, err = client_for(cp):run{ image_identifier = "sbx-image", image_version = "3",
      client_token = "t" }
    assert.is_nil(vm)
    assert.equal(404, err.status)
    assert.matches("Image sbx-image not found", err.message, 1, true)
  end)

  it("reports throttling as a retryable rate limit with the seconds Retry-After gave", function()
    cp = aws_control_plane.start{ fail = { GetMicrovm = { status = 429, where = "header",
      type = "ThrottlingException", message = "Rate exceeded", retry_after = "3" } } }
    local vm, err = client_for(cp):get("mvm-1")
    assert.is_nil(vm)
    assert.equal("RATE_LIMIT_EXCEEDED", err.code)
    assert.is_true(err.retryable)
    assert.equal(3, err.retry_after)
    assert.equal(429, err.status)
    assert.matches("Rate exceeded", err.message, 1, true)
  end)

  it("recognizes throttling named in the body's __type or code", function()
    for _, case in ipairs{ { where = "json", type = "ThrottlingException" },
        { where = "code", type = "TooManyRequestsException" } } do
      cp = aws_control_plane.start{ fail = { GetMicrovm = { status = 429, where = case.where,
        type = case.type, message = "slow down" } } }
      local _, err = client_for(cp):get("mvm-1")
      assert.equal("RATE_LIMIT_EXCEEDED", err.code, case.where)
      assert.is_true(err.retryable)
      assert.is_nil(err.retry_after, "no Retry-After, no figure")
      cp:stop()
      cp = nil
    end
  end)

  it("reports an exhausted account quota as QUOTA_EXCEEDED", function()
    cp = aws_control_plane.start{ fail = { RunMicrovm = { status = 402,
      type = "ServiceQuotaExceededException", message = "Memory quota exceeded" } } }
    local _, err = client_for(cp):run{ image_identifier = "sbx-image", image_version = "3",
      client_token = "t" }
    assert.equal("QUOTA_EXCEEDED", err.code)
    assert.is_true(err.retryable)
    assert.matches("Memory quota exceeded", err.message, 1, true)
  end)

  it("keeps AWS's own message for any other refusal", function()
    cp = aws_control_plane.start{ fail = {
      RunMicrovm = { status = 400, type = "ValidationException", message_key = "Message",
        message = "1 validation error detected: imageVersion must not be empty" },
      GetMicrovm = { status = 500, type = "ServiceException", message = "We encountered an internal error" },
    } }
    local client = client_for(cp)
    local _, refused = client:run{ image_identifier = "sbx-image", image_version = "3", client_token = "t" }
    assert.equal("SANDBOX_UNREACHABLE", refused.code)
    assert.equal(400, refused.status)
    assert.matches("ValidationException", refused.message, 1, true)
    assert.matches("imageVersion must not be empty", refused.message, 1, true)
    assert.is_false(refused.retryable, "the same request gets the same refusal")
    assert.is_false(refused.internal)
    local _, broken = client:get("mvm-1")
    assert.matches("We encountered an internal error", broken.message, 1, true)
    assert.is_true(broken.retryable, "AWS failing is worth another try")
  end)

  it("makes an error that names an IAM identity internal, so a tenant sees none of it", function()
    for _, arn in ipairs{ "arn:aws:sts::123456789012:assumed-role/stack-access/session",
        "arn:aws:iam::123456789012:user/deployer" } do
      cp = aws_control_plane.start{ fail = { RunMicrovm = { status = 403,
        type = "AccessDeniedException", message_key = "Message",
        message = "User: " .. arn .. " is not authorized to perform: lambda:RunMicrovm" } } }
      local _, err = client_for(cp):run{ image_identifier = "sbx-image", image_version = "3",
        client_token = "t" }
      assert.is_true(err.internal, arn)
      assert.matches("is not authorized to perform: lambda:RunMicrovm", err.message, 1, true)
      local public = err:external()
      assert.equal("Internal server error", public.message)
      assert.is_nil(tostring(public):find("arn:", 1, true))
      cp:stop()
      cp = nil
    end
  end)

  it("never puts a credential into an error's text", function()
    cp = aws_control_plane.start{ fail = { GetMicrovm = { status = 403,
      type = "InvalidSignatureException", message = "The request signature we calculated does not match" } } }
    local temporary = { access_key_id = "ASIAEXAMPLE", secret_access_key = SECRET,
      session_token = SESSION_TOKEN }
    local failures = {}
    local _, refused = client_for(cp, temporary):get("mvm-1")
    failures[#failures + 1] = refused
    local closed = aws_control_plane.start{}
    local closed_url = closed.url
    closed:stop()
    local _, unreachable = client_for({ url = closed_url }, temporary):get("mvm-1")
    failures[#failures + 1] = unreachable
    local _, unsignable = client_for(cp, { access_key_id = "AKID WITH SPACE",
      secret_access_key = SECRET, session_token = SESSION_TOKEN }):get("mvm-1")
    failures[#failures + 1] = unsignable
    for _, err in ipairs(failures) do
      local text = tostring(err)
      assert.is_nil(text:find(SECRET, 1, true), text)
      assert.is_nil(text:find(SESSION_TOKEN, 1, true), text)
      assert.is_nil(text:find("AKID WITH SPACE", 1, true), text)
    end
    assert.equal("SANDBOX_UNREACHABLE", unreachable.code)
    assert.is_false(unreachable.sent)
    assert.is_true(unreachable.retryable, "nothing was sent")
    assert.equal("INVALID_INPUT", unsignable.code)
  end)

  it("sends each state-changing call once, on a connection of its own", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = { imageArn = "sbx-image" } } }
    local client = client_for(cp)
    assert(client:get("mvm-1"))
    assert(client:get("mvm-1"))
    assert(client:run{ image_identifier = "sbx-image", image_version = "3", client_token = "t" })
    assert(client:suspend("mvm-1"))
    assert(client:resume("mvm-1"))
    local calls = cp:calls()
    assert.same({ "GetMicrovm", "GetMicrovm", "RunMicrovm", "SuspendMicrovm", "ResumeMicrovm" },
      cp:operations())
    local conn = {}
    for i, call in ipairs(calls) do conn[i] = cp:connection_of(call) end
    assert.equal(conn[1], conn[2], "reads share a pooled connection")
    for i = 3, 5 do
      for j = 1, #calls do
        if j ~= i then assert.are_not.equal(conn[j], conn[i], calls[i].operation .. " shares a connection") end
      end
    end
  end)

  it("does not resend a RunMicrovm whose answer never came, and says it may have taken effect", function()
    cp = aws_control_plane.start{ drop = { RunMicrovm = true } }
    local vm, err = client_for(cp):run{ image_identifier = "sbx-image", image_version = "3",
      client_token = "t" }
    assert.is_nil(vm)
    assert.equal("SANDBOX_OUTCOME_UNKNOWN", err.code)
    assert.is_false(err.retryable)
    assert.matches("may have taken effect", err.message, 1, true)
    assert.equal(1, #cp:calls_to("RunMicrovm"), "sent exactly once")
  end)

  it("refuses plain http to anything but this machine, and defaults to AWS's regional endpoint", function()
    local client, err = microvms.new{ region = "us-east-2", endpoint = "http://lambda.example.com" }
    assert.is_nil(client)
    assert.equal("INVALID_INPUT", err.code)
    assert.matches("https", err.message, 1, true)
    assert.is_nil((microvms.new{ region = "us-east-2", endpoint = "https://lambda.example.com/path" }))
    assert.equal("https://lambda.example.com:8443/2025-09-09",
      assert(microvms.new{ region = "us-east-2", endpoint = "https://lambda.example.com:8443" }).base)
    assert.equal("http://127.0.0.1:9/2025-09-09",
      assert(microvms.new{ region = "us-east-2", endpoint = "http://127.0.0.1:9/" }).base)
    assert.equal("https://lambda.us-east-2.amazonaws.com/2025-09-09",
      assert(microvms.new{ region = "us-east-2" }).base)
    local bad = select(2, microvms.new{ region = "" })
    assert.equal("INVALID_INPUT", bad.code)
    assert.equal("region", bad.field)
  end)
end)
