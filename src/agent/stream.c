/* stream.c — see stream.h. */
#include "stream.h"

#include "exec.h"
#include "paths.h"
#include "request.h"
#include "server.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/http.h>

/*
 * Frames that may wait in the connection's output buffer before the agent stops reading the
 * command's pipes (docs/protocol.md §3.3 "a bounded number"). A frame line is at most ~87.5 KB, so
 * a stalled reader costs at most ~1.4 MB here; past that the command blocks on its own full
 * pipe.
 */
#define STREAM_FRAMES_IN_FLIGHT 16

struct stream {
	struct evhttp_request *req;
	struct evhttp_connection *evcon;
	struct command *cmd;      /* NULL once the command ended or was abandoned */
	unsigned in_flight;       /* frames queued since the output buffer was last empty */
};

static void end_reply(struct stream *s)
{
	evhttp_connection_set_closecb(s->evcon, NULL, NULL);
	evhttp_connection_set_timeout(s->evcon, SERVER_IO_TIMEOUT_S);
	evhttp_send_reply_end(s->req);
	free(s);
}

/* Sends the terminal frame and ends the body. If even that cannot be allocated the body ends
 * without one, which every client reads as a transport failure — never as success. */
static void finish(struct stream *s, const struct outcome *o)
{
	struct evbuffer *b = evbuffer_new();
	if (b && frame_terminal(b, o) == 0 && evbuffer_add(b, "\n", 1) == 0)
		evhttp_send_reply_chunk(s->req, b);
	if (b)
		evbuffer_free(b);
	end_reply(s);
}

static void on_drained(struct evhttp_connection *evcon, void *arg)
{
	(void)evcon;
	struct stream *s = arg;
	s->in_flight = 0;
	if (s->cmd)
		command_resume(s->cmd);
}

static void on_frame(void *ctx, int stream, uint64_t seq, const unsigned char *data, size_t len)
{
	struct stream *s = ctx;
	struct evbuffer *b = evbuffer_new();
	if (b == NULL || frame_data(b, stream, seq, data, len) < 0 || evbuffer_add(b, "\n", 1) < 0) {
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
	evhttp_send_reply_chunk_with_cb(s->req, b, on_drained, s);
	evbuffer_free(b);
	if (++s->in_flight >= STREAM_FRAMES_IN_FLIGHT)
		command_pause(s->cmd);
}

static void on_end(void *ctx, const struct outcome *o)
{
	struct stream *s = ctx;
	s->cmd = NULL;
	finish(s, o);
}

static const struct command_sink stream_sink = { on_frame, on_end };

/*
 * The caller went away mid-stream. evhttp reports it because it keeps reading the socket while
 * a reply is written (only to notice EOF), then detaches the unfinished request from the dying
 * connection and calls this. The command's group is killed even if it is silent.
 */
static void on_close(struct evhttp_connection *evcon, void *arg)
{
	(void)evcon;
	struct stream *s = arg;
	if (s->cmd)
		command_abandon(s->cmd);
	/* A detached request is ours to free; one still attached (agent shutdown) is evhttp's. */
	if (evhttp_request_get_connection(s->req) == NULL)
		evhttp_request_free(s->req);
	free(s);
}

void stream_exec(struct evhttp_request *req)
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
	s->evcon = evhttp_request_get_connection(req);
	if (evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			      "application/x-ndjson") < 0) {
		free(s);
		if (cwd_fd >= 0)
			close(cwd_fd);
		cmd_request_free(&r);
		reply_out_of_memory(req, "start the exec stream");
		return;
	}
	evhttp_send_reply_start(req, 200, "OK");
	bufferevent_set_timeouts(evhttp_connection_get_bufferevent(s->evcon), NULL, NULL);

	/* From here every failure is a frame (docs/protocol.md §3.3). */
	struct outcome early;
	if (r.invalid) {
		outcome_error(&early, "requestInvalid", "%s", r.invalid);
		finish(s, &early);
	} else if (pr != PATH_OK) {
		char shown[REPLY_SHOWN_PATH_MAX];
		util_printable(r.cwd, r.cwd_len, shown, sizeof shown);
		outcome_error(&early, "spawnFailed", "cannot enter the working directory '%s': %s",
			      shown, why);
		finish(s, &early);
	} else {
		struct command_spec spec = { r.argv, r.envp, cwd_fd, r.timeout_ms, 0 };
		s->cmd = command_start(&spec, &stream_sink, s, &early);
		if (s->cmd)
			evhttp_connection_set_closecb(s->evcon, on_close, s);
		else
			finish(s, &early);
	}
	if (cwd_fd >= 0)
		close(cwd_fd);
	cmd_request_free(&r);
}
