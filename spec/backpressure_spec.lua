-- A slow reader slows the command: the transfer pauses, the agent stops reading the pipe and
-- the command blocks on write, so memory on neither side grows with what the command writes.

local sandkit = require "sandkit"
local core = require "sandkit.core"
local local_state = require "support.local_state"

local BLOCK = 65536

describe("a slow consumer", function()
  local root, sandbox, session
  before_each(function()
    root = local_state.new()
    -- Past the output cap the agent drops output instead of delivering it, and nothing needs
    -- holding back; with a cap above what the command writes, every byte must be delivered.
    sandbox = assert(sandkit.sandbox{ provider = "local", root = root, output_cap = 1024 * 1024 * 1024 })
    session = assert(sandbox:create{ id = "slow" })
  end)
  after_each(function() local_state.clean(root) end)

  it("holds back a command that would write a gigabyte", function()
    local writer = local_state.writer(BLOCK)
    local frames, bytes = 0, 0
    local started = core.now()
    for frame in session:run(writer, { timeout = 120 }) do
      if frame.type == "stdout" then
        frames = frames + 1
        bytes = bytes + #frame.data
      end
      core.wait(nil, 0.01) -- the slow consumer: 10 ms per frame
      if core.now() - started > 1.5 then break end
    end
    local written = tonumber(assert(session:read_file("/written"))) * BLOCK
    -- Unthrottled, the writer manages hundreds of MiB in 1.5 s. Held back, it can be ahead of
    -- what was read only by what the buffers between hold: the agent's frame queue, the
    -- kernel's pipe and socket buffers and the client's transfer buffer — a few MiB.
    assert.is_true(bytes > 0)
    assert.is_true(written - bytes < 32 * 1024 * 1024, string.format(
      "the command wrote %d bytes while the reader took %d", written, bytes))
    -- Leaving the loop closed the stream, which stops the command: give the agent a moment to
    -- act on the close, then the count stays put.
    local settled = assert(session:exec({ "sh", "-c", "sleep 0.3; cat /written" }, { timeout = 10 })).stdout
    local later = assert(session:exec({ "sh", "-c", "sleep 0.3; cat /written" }, { timeout = 10 })).stdout
    assert.equal(settled, later)
  end)
end)
