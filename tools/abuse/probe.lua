-- probe.lua PORT TOKEN SECONDS — runs authorized execs of `true` one after another against the
-- agent for SECONDS and prints each one's latency in milliseconds ("fail" when it did not end
-- with exit 0 within 5 s). tools/abuse/run.lua runs it beside every attack.
local raw = require "support.raw_http"
local socket = require "socket"

local port, token, seconds = tonumber(arg[1]), arg[2], tonumber(arg[3])
local body = '{"command":["true"],"timeoutMs":5000}'
local stop = socket.gettime() + seconds
while socket.gettime() < stop do
  local t0 = socket.gettime()
  local res = raw.request(port, "POST", "/v1/exec", { timeout = 5, body = body,
    headers = { Authorization = "Bearer " .. token, ["Content-Type"] = "application/json" } })
  if res and res.status == 200 and res.body:find('"t":"exit","code":0', 1, true) then
    io.write(string.format("%.2f\n", (socket.gettime() - t0) * 1000))
  else
    io.write("fail\n")
  end
  io.flush()
  socket.sleep(0.05)
end
