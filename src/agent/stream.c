/* stream.c — see stream.h. */
#include "stream.h"

#include "exec.h"
#include "framing.h"
#include "handler.h"
#include "http.h"
#include "keepalive.h"
#include "paths.h"
#include "request.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

/*
 * Backpressure (docs/protocol.md §3.3 "a bounded number"): frames go to the connection until
 * HTTP_OUTPUT_HIGH bytes wait for the caller; then the agent stops reading the command's pipes
 * and the command blocks on its own full pipe, until the connection drains (http.h). A stalled
 * reader costs at most that plus one frame line (~87.5 KB).
 */
struct stream {
	struct http_request *req;
	struct command *cmd;      /* NULL once the command ended or was abandoned */
	struct keepalive *keepalive; /* NULL when the caller asked for none */
	enum framing framing;     /* what the caller asked for (docs/protocol.md §6 binaryFrames) */
};

/* Sends the terminal frame and ends the body. If even that cannot be allocated the body ends
 * without one, which every client reads as a transport failure — never as success. */
static void finish(struct stream *s, const struct outcome *o)
{
	keepalive_stop(s->keepalive);
	struct evbuffer *b = evbuffer_new();
	if (b && framing_terminal(b, s->framing, o) == 0)
		http_reply_chunk(s->req, b);
	if (b)
		evbuffer_free(b);
	http_reply_end(s->req);
	free(s);
}

static void on_drained(void *arg)
{
	struct stream *s = arg;
	if (s->cmd && http_reply_queued(s->req) < HTTP_OUTPUT_HIGH)
		command_resume(s->cmd);
}

static void on_frame(void *ctx, int stream, uint64_t seq, const unsigned char *data, size_t len)
{
	struct stream *s = ctx;
	struct evbuffer *b = evbuffer_new();
	if (b == NULL || framing_output(b, s->framing, stream, seq, data, len) < 0 ||
	    http_reply_chunk(s->req, b) < 0) {
		/* Dropping a frame silently would corrupt the stream: kill and say so instead. */
		if (b)
			evbuffer_free(b);
		struct outcome o;
		outcome_error(&o, "outputReadFailed", "the agent ran out of memory for the output");
		command_abandon(s->cmd);
		s->cmd = NULL;
		finish(s, &o);
		return;
	}
	evbuffer_free(b);
	keepalive_sent(s->keepalive);
	if (http_reply_queued(s->req) >= HTTP_OUTPUT_HIGH)
		command_pause(s->cmd);
}

static void on_end(void *ctx, const struct outcome *o)
{
	struct stream *s = ctx;
	s->cmd = NULL;
	finish(s, o);
}

static const struct command_sink stream_sink = { on_frame, on_end, NULL };

/*
 * The caller went away mid-stream: the connection saw EOF or a reset (it keeps reading while
 * the reply streams, holding at most one pipelined head). The command's group is killed even
 * if it is silent.
 */
static void on_gone(void *arg)
{
	struct stream *s = arg;
	if (s->cmd)
		command_abandon(s->cmd);
	keepalive_stop(s->keepalive);
	free(s);
}

void stream_exec(struct http_request *req)
{
	struct cmd_request r;
	int rc = read_cmd_request(req, &r, "read the exec request");
	if (rc == -2)
		return;
	if (rc == -1) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s", r.invalid);
		cmd_request_free(&r);
		return;
	}
	int cwd_fd;
	const char *why = NULL;
	enum path_result pr = paths_open_cwd(r.cwd, r.cwd_len, &cwd_fd, &why);
	if (pr == PATH_REFUSED) {
		reply_path_refused(req, r.cwd, r.cwd_len, why);
		cmd_request_free(&r);
		return;
	}
	struct stream *s = calloc(1, sizeof *s);
	if (s == NULL) {
		if (cwd_fd >= 0)
			close(cwd_fd);
		cmd_request_free(&r);
		reply_out_of_memory(req, "start the exec stream");
		return;
	}
	s->req = req;
	/* A request the agent refuses is answered as NDJSON, which every caller reads: its
	 * framing may be the very member that was refused. */
	s->framing = r.invalid ? FRAMING_NDJSON : r.framing;
	if (http_reply_start(req, 200, framing_content_type(s->framing), -1) < 0) {
		if (cwd_fd >= 0)
			close(cwd_fd);
		cmd_request_free(&r);
		http_reply_end(req);
		free(s);
		return;
	}

	/* From here every failure is a frame (docs/protocol.md §3.3). */
	struct outcome early;
	if (r.invalid) {
		outcome_error(&early, "requestInvalid", "%s", r.invalid);
		finish(s, &early);
	} else if (r.stdin_pipe || r.cols > 0) {
		/* Input goes to a job by its id, which an exec stream has none of. */
		outcome_error(&early, "requestInvalid", "stdin and pty are for jobs "
			      "(POST /v1/jobs/start), which take input at /v1/jobs/stdin");
		finish(s, &early);
	} else if (pr != PATH_OK) {
		char shown[REPLY_SHOWN_PATH_MAX];
		util_printable(r.cwd, r.cwd_len, shown, sizeof shown);
		outcome_error(&early, "spawnFailed", "cannot enter the working directory '%s': %s",
			      shown, why);
		finish(s, &early);
	} else if (r.keepalive_ms && (s->keepalive = keepalive_start(req, r.keepalive_ms, s->framing)) == NULL) {
		outcome_error(&early, "spawnFailed", "the agent ran out of memory for the stream's "
			      "keep-alives");
		finish(s, &early);
	} else {
		/* outputCap 0 asks for no cap at all. */
		uint64_t cap = !r.has_output_cap ? 0 : r.output_cap ? r.output_cap : UINT64_MAX;
		struct command_spec spec = { r.argv, r.envp, cwd_fd, r.timeout_ms, 0, cap, 0, 0, 0 };
		s->cmd = command_start(&spec, &stream_sink, s, &early);
		if (s->cmd)
			http_reply_watch(req, on_drained, on_gone, s);
		else
			finish(s, &early);
	}
	if (cwd_fd >= 0)
		close(cwd_fd);
	cmd_request_free(&r);
}
