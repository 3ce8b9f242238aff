-- The aws provider (lua/sandkit/providers/aws/init.lua) through the public API, against a fake
-- Lambda MicroVMs control plane and fake agents over real sockets. Every call the provider
-- makes is recorded, so "never called" is asserted from what arrived, not assumed.

local sandkit = require "sandkit"
local aws = require "sandkit.providers.aws"
local microvms = require "sandkit.providers.aws.microvms"
local fake_http = require "support.fake_http"
local aws_control_plane = require "support.aws_control_plane"

local IMAGE = "sbx-image"
local SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"

--- A sandbox on the fake control plane, pinned to version 3 of IMAGE, with the short waits
-- specs use. Fake agents are plain http on 127.0.0.1, which allow_loopback_http admits.
local function sandbox_for(cp, extra)
  local options = { provider = "aws", region = "us-east-2", image = IMAGE, image_version = "3",
    endpoint = cp.url, access_key_id = "AKIDEXAMPLE", secret_access_key = SECRET,
    api_timeout = 5, header_timeout = 2, ready_timeout = 0.3, ready_interval = 0.02,
    allow_loopback_http = true }
  for k, v in pairs(extra or {}) do options[k] = v end
  return assert(sandkit.sandbox(options))
end

--- A MicroVM record of this sandbox's image.
local function owned(state, endpoint)
  return { imageArn = IMAGE, state = state, imageVersion = "1", endpoint = endpoint }
end

--- A fake agent whose health answers a bodyless 502 (what AWS's proxy sends while a snapshot
-- restores), or `status` (a status line) with `body`, for the first `restoring` probes, or for
-- ever when `restoring` is nil; exec answers one stdout frame and exit 0.
local function fake_agent(restoring, status, body)
  return fake_http.start(string.format([[
    local respond = require "support.respond"
    local restoring = %s
    return { handle = function(req, conn)
      if req.path == "/v1/health" then
        conn.state.probes = (conn.state.probes or 0) + 1
        if restoring == nil or conn.state.probes <= restoring then
          return respond.status(conn, %q, %q)
        end
        return respond.health(conn)
      end
      respond.frames(conn, { '{"t":"stdout","seq":0,"data":"aGk="}\n', '{"t":"exit","code":0}\n' })
    end }
  ]], tostring(restoring), status or "502 Bad Gateway", body or ""))
end

local function endpoint_of(server)
  return server.url:match("^http://(.*)$")
end

local function ids(calls)
  local list = {}
  for i, call in ipairs(calls) do list[i] = call.id end
  return list
end

describe("the aws provider", function()
  local cp, agent
  after_each(function()
    if cp then cp:stop() cp = nil end
    if agent then agent:stop() agent = nil end
  end)

  -- AWS reaps a MicroVM's record after it terminates, so a caller's retried terminate must
  -- not start failing once the record is gone.
  it("terminates a session AWS already reaped without sending a terminate", function()
    cp = aws_control_plane.start{}
    assert.is_true(sandbox_for(cp):terminate("already-reaped"))
    assert.same({ "GetMicrovm" }, cp:operations())
    assert.same({}, cp:calls_to("TerminateMicrovm"), "never called")
  end)

  -- preview() would refuse every port of a sandbox that declared none, so the capability says
  -- so up front and callers can branch on it instead of calling and failing.
  it("offers preview exactly when preview ports were declared", function()
    cp = aws_control_plane.start{}
    local caps = sandbox_for(cp):capabilities()
    assert.is_false(caps.preview, "no declared ports, no preview")
    assert.same({ files = true, jobs = true, reconnect = true, pause_resume = true,
      preview = false, list = false, snapshot = false, fs = true, watch = true, set_lifetime = false,
      labels = false, stdin = true, pty = true }, caps)
    assert.is_true(sandbox_for(cp, { preview_ports = { 8080 } }):capabilities().preview,
      "a declared port makes preview real")
    assert.same({}, cp:calls(), "capabilities ask AWS nothing")
    local session, err = sandbox_for(cp):create{ labels = { team = "ml" } }
    assert.is_nil(session)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("RunMicrovm keeps no labels", err.message)
    assert.same({}, cp:calls(), "labels it cannot keep are refused before anything is sent")
  end)

  -- RunMicrovm has nowhere to put a session-level env or a tenant key; a value that silently
  -- never applies is worse than no session.
  it("refuses a session-level env or tenant key before any call", function()
    cp = aws_control_plane.start{ microvms = { ours = owned("RUNNING") } }
    local sandbox = sandbox_for(cp)
    local session, err = sandbox:create{ env = { KEY = "value" } }
    assert.is_nil(session)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("env per command", err.message, 1, true)
    session, err = sandbox:create{ tenant_key = "tenant-1" }
    assert.is_nil(session)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("tenant_key", err.message, 1, true)
    -- An existing session honours them no more than a fresh one would.
    session, err = sandbox:get_or_create{ id = "ours", env = { KEY = "value" } }
    assert.is_nil(session)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.same({}, cp:calls(), "nothing reached AWS")
  end)

  -- IAM cannot draw this line: the token mint is granted for every image of a stack, so a
  -- sibling sandbox's session id would be authorized. The record's imageArn says whose it is.
  it("refuses another sandbox's session before any token is minted, and reads it as absent", function()
    cp = aws_control_plane.start{ microvms = { ["a-siblings-session"] = {
      imageArn = "someone-elses-image", state = "RUNNING", endpoint = "vm.example.invalid",
      imageVersion = "1" } } }
    local sandbox = sandbox_for(cp, { preview_ports = { 8080 } })
    local provider = sandbox.provider
    local record = { id = "a-siblings-session" }
    local conn = assert(provider:connection(record))
    local outcomes = {
      select(2, provider:preview(record, 8080)),
      select(2, sandbox:terminate("a-siblings-session")),
      select(2, provider:pause(record)),
      select(2, provider:resume(record)),
      select(2, require("sandkit.protocol").exec(conn, { "true" }, { timeout = 5 })),
    }
    assert.equal(5, #outcomes)
    for _, err in ipairs(outcomes) do
      assert.equal("SANDBOX_UNREACHABLE", err.code)
      assert.matches("does not belong to this sandbox", err.message, 1, true)
    end
    local session, err = sandbox:get("a-siblings-session")
    assert.is_nil(session, "a sibling's session reads as absent, not as ours")
    assert.is_nil(err, "and reading it is not an error")
    for _, operation in ipairs{ "CreateMicrovmAuthToken", "TerminateMicrovm", "SuspendMicrovm",
        "ResumeMicrovm" } do
      assert.same({}, cp:calls_to(operation), operation .. " is never called")
    end
  end)

  -- get_or_create reads get's answer to decide whether to create: an error for a missing
  -- session would leave a caller with a fresh id unable to create one at all.
  it("reads a session that does not exist as absent rather than as a failure", function()
    cp = aws_control_plane.start{}
    local session, err = sandbox_for(cp):get("never-existed")
    assert.is_nil(session)
    assert.is_nil(err, "absent is an answer, not an error")
    assert.same({ "GetMicrovm" }, cp:operations())
  end)

  -- Flattening a failed read into "absent" would have get_or_create start a second session
  -- while the first still runs.
  it("reports a throttled read as an error, never as an absent session", function()
    cp = aws_control_plane.start{ fail = { GetMicrovm = { status = 429, where = "header",
      type = "ThrottlingException", message = "Rate exceeded", retry_after = "2" } } }
    local sandbox = sandbox_for(cp)
    local session, err = sandbox:get("ours")
    assert.is_nil(session)
    assert.is_not_nil(err, "a throttle is not an absent session")
    assert.equal("RATE_LIMIT_EXCEEDED", err.code)
    assert.equal(2, err.retry_after)
    local created
    session, created = sandbox:get_or_create{ id = "ours" }
    assert.is_nil(session)
    assert.equal("RATE_LIMIT_EXCEEDED", created.code)
    assert.same({}, cp:calls_to("RunMicrovm"), "no second session is started")
  end)

  -- Defaulting the other way would make every record the client could not attribute belong
  -- to whoever asked.
  it("does not take a session whose record names no image for one of its own", function()
    cp = aws_control_plane.start{ microvms = { unlabelled = { state = "RUNNING",
      endpoint = "vm.example.invalid" } } }
    local sandbox = sandbox_for(cp, { preview_ports = { 8080 } })
    local capability, err = sandbox.provider:preview({ id = "unlabelled" }, 8080)
    assert.is_nil(capability)
    assert.matches("does not belong to this sandbox", err.message, 1, true)
    assert.is_nil((sandbox:get("unlabelled")))
    assert.same({}, cp:calls_to("CreateMicrovmAuthToken"), "never called")
  end)

  -- The check costs one GetMicrovm, which can be granted on this image alone; enumerating
  -- would need ListMicrovms, which no scoped grant carries.
  it("reads a session with one GetMicrovm and never enumerates", function()
    cp = aws_control_plane.start{ microvms = { ours = owned("RUNNING") } }
    local session = assert(sandbox_for(cp):get("ours"))
    assert.equal("ours", session.id)
    assert.equal(1, session.generation)
    assert.same({ "GetMicrovm" }, cp:operations())
    assert.same({}, cp:calls_to("ListMicrovms"), "never called")
    assert.same({}, cp:calls_to("MicrovmImages"), "never called")
  end)

  -- AWS's proxy answers 502 while a MicroVM's snapshot restores; create outlasts that window
  -- rather than hand back a session whose first command races it.
  it("keeps probing through the 502s of a snapshot restore until the agent answers", function()
    agent = fake_agent(2)
    cp = aws_control_plane.start{ run = { microvmId = "mvm-restoring", endpoint = endpoint_of(agent),
      publish_after = 2 } }
    local session = assert(sandbox_for(cp, { ready_timeout = 5 }):create{})
    assert.equal("mvm-restoring", session.id)
    assert.equal("running", session.state)
    assert.equal(3, #agent:requests_to("/v1/health"),
      "two 502s, then the answer: it kept probing rather than give up on the first 502")
    assert.equal(1, #cp:calls_to("CreateMicrovmAuthToken"), "one token serves the whole wait")
    assert.same({ "RunMicrovm", "GetMicrovm", "GetMicrovm", "CreateMicrovmAuthToken" },
      cp:operations())
    assert.same({}, cp:calls_to("TerminateMicrovm"), "a servable MicroVM is kept")
    local result = assert(session:exec({ "true" }, { timeout = 5 }))
    assert.equal("hi", result.stdout)
  end)

  -- The counterpart: a MicroVM that never answers fails create, which names it and what it
  -- last saw, and terminates it, since the caller never learns its id.
  it("gives up on a MicroVM that never answers, names it and what it last saw, and terminates it", function()
    agent = fake_agent(nil)
    cp = aws_control_plane.start{ run = { microvmId = "mvm-dead", endpoint = endpoint_of(agent) } }
    -- Probes at about 0, 0.2 and 0.4 s: the last one still has about 0.1 s of the 0.5 s wait,
    -- so what it saw is the agent's 502, not its own cut-off.
    local session, err = sandbox_for(cp, { ready_timeout = 0.5, ready_interval = 0.2 }):create{}
    assert.is_nil(session)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.matches("mvm-dead", err.message, 1, true)
    assert.matches("502", err.message, 1, true)
    assert.is_true(#agent:requests_to("/v1/health") >= 2, "it probed more than once")
    assert.same({ "mvm-dead" }, ids(cp:calls_to("TerminateMicrovm")))
  end)

  -- An endpoint token may take a moment to be honoured: the proxy's 403 meanwhile is one more
  -- answer that is not ready, not a refusal to give up on.
  it("waits through the 403s of an endpoint token still propagating, and keeps the MicroVM", function()
    agent = fake_agent(2, "403 Forbidden", '{"message":"Forbidden"}')
    cp = aws_control_plane.start{ run = { microvmId = "mvm-token", endpoint = endpoint_of(agent) } }
    local session = assert(sandbox_for(cp, { ready_timeout = 5 }):create{})
    assert.equal("mvm-token", session.id)
    assert.equal(3, #agent:requests_to("/v1/health"))
    assert.same({}, cp:calls_to("TerminateMicrovm"), "a servable MicroVM is kept")
  end)

  it("gives up on a token never honoured at the deadline, naming the 403, and terminates", function()
    agent = fake_agent(nil, "403 Forbidden", '{"message":"Forbidden"}')
    cp = aws_control_plane.start{ run = { microvmId = "mvm-refused", endpoint = endpoint_of(agent) } }
    local session, err = sandbox_for(cp, { ready_timeout = 0.5, ready_interval = 0.2 }):create{}
    assert.is_nil(session)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.matches("did not become ready within", err.message, 1, true)
    assert.matches("returned 403", err.message, 1, true)
    assert.is_true(#agent:requests_to("/v1/health") >= 2, "it probed more than once")
    assert.same({ "mvm-refused" }, ids(cp:calls_to("TerminateMicrovm")))
  end)

  -- A bare URL would be useless: the endpoint refuses anything without the token headers and
  -- the port header, and a caller cannot mint them.
  it("hands out a preview as the endpoint with the token and port headers a caller cannot make", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = owned("RUNNING", "mvm-1.lambda-microvms.aws") },
      auth_token = { ["X-aws-proxy-auth"] = "jwe-value" } }
    local session = assert(sandbox_for(cp, { preview_ports = { 8080 } }):get("mvm-1"))
    local capability = assert(session:preview(8080))
    assert.same({
      endpoint = "https://mvm-1.lambda-microvms.aws",
      headers = { ["X-aws-proxy-auth"] = "jwe-value", ["X-aws-proxy-port"] = "8080" },
      allowed_ports = { 8080 },
      expires_in = 1800,
    }, capability)
    local mint = cp:calls_to("CreateMicrovmAuthToken")
    assert.equal(1, #mint)
    assert.same({ allowedPorts = { { port = 8080 } }, expirationInMinutes = 30 }, mint[1].json)
  end)

  -- The mint grants whatever port it is handed, so the declared list is the only bound on
  -- ingress here: an undeclared port is refused before any call.
  it("refuses an undeclared preview port before anything is read or minted", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = owned("RUNNING", "mvm-1.lambda-microvms.aws") } }
    local session = assert(sandbox_for(cp, { preview_ports = { 8080 } }):get("mvm-1"))
    local before = #cp:calls()
    local capability, err = session:preview(22)
    assert.is_nil(capability)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("port 22", err.message, 1, true)
    assert.equal(before, #cp:calls(), "no call for an undeclared port")
    assert.same({}, cp:calls_to("CreateMicrovmAuthToken"), "never called")
  end)

  -- AWS mints for 60 minutes at most; a figure past that would promise a caller more life
  -- than the token has.
  it("never reports a preview lifetime longer than AWS will mint", function()
    assert.equal(1800, aws.preview_lifetime_seconds())
    assert.is_true(aws.preview_lifetime_seconds() <= microvms.MAX_AUTH_TOKEN_MINUTES * 60)
    local saved = aws.PREVIEW_TOKEN_MINUTES
    aws.PREVIEW_TOKEN_MINUTES = 90
    local raised = aws.preview_lifetime_seconds()
    aws.PREVIEW_TOKEN_MINUTES = saved
    assert.equal(3600, raised, "a longer ask is reported at the cap")
  end)

  -- Anything that is not yet running is on its way up: reporting it running would invite
  -- commands to something that cannot answer.
  it("maps AWS lifecycle states to running, paused, terminated and starting", function()
    cp = aws_control_plane.start{ microvms = {
      pending = owned("PENDING"), running = owned("RUNNING"), suspended = owned("SUSPENDED"),
      terminated = owned("TERMINATED"), terminating = owned("TERMINATING"), odd = owned("UPDATING"),
    } }
    local sandbox = sandbox_for(cp)
    for id, expected in pairs{ pending = "starting", running = "running", suspended = "paused",
        terminated = "terminated", terminating = "terminated", odd = "starting" } do
      assert.equal(expected, assert(sandbox:get(id)).state, "AWS state of " .. id)
    end
  end)

  -- Only the run call puts a declared ceiling on the wire; a field dropped here would leave a
  -- sandbox running past a limit it declared, with every other test green.
  it("puts the declared lifetime, idle suspend and egress connectors on the run call", function()
    cp = aws_control_plane.start{ run = { microvmId = "mvm-1", state = "RUNNING" } }
    local session, err = sandbox_for(cp, { max_lifetime_seconds = 1800, idle_suspend_seconds = 600,
      egress_connectors = { "connector" } }):create{}
    assert.is_nil(session)
    local run = cp:calls_to("RunMicrovm")
    assert.equal(1, #run)
    assert.equal(1800, run[1].json.maximumDurationInSeconds)
    assert.same({ maxIdleDurationSeconds = 600, autoResumeEnabled = false }, run[1].json.idlePolicy)
    assert.same({ "connector" }, run[1].json.egressNetworkConnectors)
    assert.equal(IMAGE, run[1].json.imageIdentifier)
    assert.equal("3", run[1].json.imageVersion)
    assert.is_nil(run[1].json.executionRoleArn, "never a role")
    -- With no endpoint ever published, the wait is what fails, and what it started is gone.
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.matches("published no endpoint", err.message, 1, true)
    assert.same({ "mvm-1" }, ids(cp:calls_to("TerminateMicrovm")))
  end)

  -- AWS hands back the MicroVM a client token created before, even once it was terminated: a
  -- caller's id as the token would return a dead MicroVM and wait on it for ever.
  it("never uses a caller's session id as the client token, and carries AWS's id forward", function()
    cp = aws_control_plane.start{ run = { microvmId = "mvm-9", state = "RUNNING" } }
    local sandbox = sandbox_for(cp, { ready_timeout = 0.1 })
    local session, err = sandbox:create{ id = "caller-chosen" }
    assert.is_nil(session)
    assert.matches("published no endpoint", err.message, 1, true)
    sandbox:create{ id = "caller-chosen" }
    local runs = cp:calls_to("RunMicrovm")
    assert.equal(2, #runs)
    for _, run in ipairs(runs) do
      assert.are_not.equal("caller-chosen", run.json.clientToken)
      assert.matches("^%x+$", run.json.clientToken)
      assert.equal(32, #run.json.clientToken)
    end
    assert.are_not.equal(runs[1].json.clientToken, runs[2].json.clientToken, "fresh per create")
    for _, call in ipairs(cp:calls()) do
      if call.id then assert.equal("mvm-9", call.id, call.operation .. " names AWS's id") end
    end
    assert.same({ "mvm-9", "mvm-9" }, ids(cp:calls_to("TerminateMicrovm")))
  end)

  -- A command without a timeout is one the agent must refuse anyway: saying so here costs no
  -- read and no mint.
  it("refuses a command with a zero timeout before any AWS call", function()
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = owned("RUNNING", "vm.example.invalid") } }
    local session = assert(sandbox_for(cp):get("mvm-1"))
    local before = #cp:calls()
    local result, err = session:exec({ "/bin/echo" }, { timeout = 0 })
    assert.is_nil(result)
    assert.equal("INVALID_INPUT", err.code)
    assert.equal("timeout", err.field)
    assert.matches("non-zero timeout", err.message, 1, true)
    assert.equal(before, #cp:calls(), "no read, no mint")
  end)

  -- A rolled image version neither ends the sessions on the previous one nor changes whose
  -- they are; comparing versions would read a live session as expired.
  it("still owns a session running on a previous image version", function()
    cp = aws_control_plane.start{ microvms = { older = { imageArn = IMAGE, state = "RUNNING",
      imageVersion = "2" } } }
    local session = assert(sandbox_for(cp):get("older"),
      "a session on the previous version is still live and still ours")
    assert.equal("older", session.id)
  end)

  -- Enumerating would need an account-wide ListMicrovms grant, and Lambda already reaps the
  -- orphans it would find.
  it("does not enumerate sessions, points to get instead, and asks AWS nothing", function()
    cp = aws_control_plane.start{}
    local sandbox = sandbox_for(cp)
    local list, err = sandbox.provider:list()
    assert.is_nil(list)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("with get", err.message, 1, true)
    list, err = sandbox:list()
    assert.is_nil(list)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("with get", err.message, 1, true)
    assert.same({}, cp:calls(), "ListMicrovms is never called")
  end)

  -- The refused action is what sends an operator to the role rather than to this code; an
  -- IAM identity in the sentence keeps all of it away from a tenant.
  it("reports AWS's own sentence for a refused create, internal because it names an IAM identity", function()
    cp = aws_control_plane.start{ fail = { RunMicrovm = { status = 403, body =
      '{"Message":"User: arn:aws:sts::123456789012:assumed-role/stack-access/session is not '
      .. 'authorized to perform: lambda:PassNetworkConnector on resource: arn:aws:lambda:us-east-2:'
      .. 'aws:network-connector:aws-network-connector:INTERNET_EGRESS"}' } } }
    local session, err = sandbox_for(cp):create{}
    assert.is_nil(session)
    assert.equal("SANDBOX_UNREACHABLE", err.code)
    assert.matches("could not start a MicroVM from 'sbx-image'", err.message, 1, true)
    assert.matches("is not authorized to perform: lambda:PassNetworkConnector", err.message, 1, true)
    assert.is_true(err.internal, "an IAM identity in the message makes the error internal")
    assert.equal("Internal server error", err:external().message)
    assert.same({ "RunMicrovm" }, cp:operations(), "nothing was started, so nothing is cleaned up")
  end)

  it("mints a fresh 5-minute token for port 8971 per agent request and sends it as headers, never a bearer", function()
    agent = fake_agent(0)
    cp = aws_control_plane.start{ microvms = { ["mvm-1"] = owned("RUNNING", endpoint_of(agent)) } }
    local session = assert(sandbox_for(cp):get("mvm-1"))
    assert(session:exec({ "true" }, { timeout = 5 }))
    assert(session:exec({ "true" }, { timeout = 5 }))
    local execs = agent:requests_to("/v1/exec")
    assert.equal(2, #execs)
    assert.equal("token-1", execs[1].headers["x-aws-proxy-auth"])
    assert.equal("token-2", execs[2].headers["x-aws-proxy-auth"], "a token per request")
    for _, exec in ipairs(execs) do
      assert.equal("8971", exec.headers["x-aws-proxy-port"])
      assert.is_nil(exec.headers.authorization, "never as a bearer")
    end
    assert.same({ "GetMicrovm", "GetMicrovm", "CreateMicrovmAuthToken", "GetMicrovm",
      "CreateMicrovmAuthToken" }, cp:operations(), "ownership and endpoint read before each mint")
    for _, mint in ipairs(cp:calls_to("CreateMicrovmAuthToken")) do
      assert.same({ allowedPorts = { { port = 8971 } }, expirationInMinutes = 5 }, mint.json)
    end
  end)

  it("waits for a starting session in get_or_create before returning it", function()
    agent = fake_agent(1)
    cp = aws_control_plane.start{ microvms = { booting = { imageArn = IMAGE, state = "PENDING",
      pending_endpoint = endpoint_of(agent), publish_after = 3 } } }
    local session, created = sandbox_for(cp, { ready_timeout = 5 }):get_or_create{ id = "booting" }
    assert(session, created)
    assert.is_false(created)
    assert.equal("booting", session.id)
    assert.equal("running", session.state)
    assert.equal(2, #agent:requests_to("/v1/health"), "it waited until the agent answered")
    assert.same({}, cp:calls_to("RunMicrovm"), "an existing session is not created again")
  end)

  it("returns a running session from get_or_create as found, and creates an absent one", function()
    agent = fake_agent(0)
    cp = aws_control_plane.start{ microvms = { ours = owned("RUNNING", endpoint_of(agent)) },
      run = { microvmId = "mvm-new", endpoint = endpoint_of(agent) } }
    local sandbox = sandbox_for(cp, { ready_timeout = 5 })
    local session, created = sandbox:get_or_create{ id = "ours" }
    assert.equal("ours", session.id)
    assert.is_false(created)
    assert.same({}, agent:requests_to("/v1/health"), "a running session is not probed")
    session, created = sandbox:get_or_create{ id = "gone" }
    assert.equal("mvm-new", session.id)
    assert.is_true(created)
  end)

  it("checks ownership before suspending or resuming, then asks AWS to", function()
    cp = aws_control_plane.start{ microvms = { ours = owned("RUNNING") } }
    local session = assert(sandbox_for(cp):get("ours"))
    assert.is_true(session:pause())
    assert.equal("paused", session.state)
    assert.is_true(session:resume())
    assert.same({ "GetMicrovm", "GetMicrovm", "SuspendMicrovm", "GetMicrovm", "ResumeMicrovm" },
      cp:operations())
  end)

  it("terminates its own session with one TerminateMicrovm", function()
    cp = aws_control_plane.start{ microvms = { ours = owned("RUNNING") } }
    local session = assert(sandbox_for(cp):get("ours"))
    assert.is_true(session:terminate())
    assert.equal("terminated", session.state)
    assert.same({ "GetMicrovm", "GetMicrovm", "TerminateMicrovm" }, cp:operations())
  end)

  it("offers no snapshot, since Lambda MicroVMs have no snapshot API", function()
    cp = aws_control_plane.start{ microvms = { ours = owned("RUNNING") } }
    local sandbox = sandbox_for(cp)
    local session = assert(sandbox:get("ours"))
    local snapshot, err = session:snapshot()
    assert.is_nil(snapshot)
    assert.equal("OPERATION_NOT_SUPPORTED", err.code)
    assert.matches("no snapshot API", select(2, sandbox.provider:snapshot()).message, 1, true)
    assert.same({ "GetMicrovm" }, cp:operations())
  end)

  it("reports a run answer without a MicroVM id as unexpected and waits on nothing", function()
    cp = aws_control_plane.start{ run = { omit_id = true } }
    local session, err = sandbox_for(cp):create{}
    assert.is_nil(session)
    assert.equal("UNEXPECTED_RESPONSE_FORMAT", err.code)
    assert.equal("microvmId", err.field)
    assert.same({ "RunMicrovm" }, cp:operations())
  end)

  it("refuses at once a MicroVM that reads back with another image", function()
    cp = aws_control_plane.start{ run = { microvmId = "mvm-x", imageArn = "arn:other" } }
    local session, err = sandbox_for(cp, { ready_timeout = 30 }):create{}
    assert.is_nil(session)
    assert.matches("does not belong to this sandbox", err.message, 1, true)
    assert.matches("arn:other", err.message, 1, true)
    assert.equal(1, #cp:calls_to("GetMicrovm"), "refused on the first read, not after 30 s")
    assert.same({ "mvm-x" }, ids(cp:calls_to("TerminateMicrovm")))
  end)

  it("says so when the MicroVM it could not make servable also could not be terminated", function()
    cp = aws_control_plane.start{ run = { microvmId = "mvm-stuck", state = "PENDING" },
      fail = { TerminateMicrovm = { status = 500, type = "ServiceException", message = "try later" } } }
    local _, err = sandbox_for(cp, { ready_timeout = 0.1 }):create{}
    assert.matches("published no endpoint", err.message, 1, true)
    assert.matches("terminating MicroVM 'mvm-stuck' failed too", err.message, 1, true)
  end)

  it("refuses a configuration it cannot honour when the sandbox is made", function()
    local function refusal(extra)
      local options = { provider = "aws", region = "us-east-2", image = IMAGE, image_version = "3",
        access_key_id = "AKIDEXAMPLE", secret_access_key = SECRET }
      for k, v in pairs(extra) do options[k] = v end
      if extra.image == false then options.image = nil end
      local sandbox, err = sandkit.sandbox(options)
      assert.is_nil(sandbox)
      return err
    end
    assert.equal("image", refusal{ image = false }.field)
    assert.equal("image_version", refusal{ image_version = "" }.field)
    assert.matches("agent", refusal{ preview_ports = { 8971 } }.message, 1, true)
    assert.matches("28800", refusal{ max_lifetime_seconds = 28801 }.message, 1, true)
    assert.equal("idle_suspend_seconds", refusal{ idle_suspend_seconds = 1.5 }.field)
    assert.equal("endpoint", refusal{ endpoint = "http://lambda.example.com" }.field)
  end)
end)
