/* jobs_live.c — see jobs_live.h. */
#include "jobs_live.h"

#include "agent.h"
#include "handler.h"
#include "http.h"
#include "job.h"
#include "keepalive.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

/* ---- input: POST /v1/jobs/stdin?jobId=ID&offset=N[&close=true] ---- */

/*
 * One write: its body's bytes at offset onwards. Bytes the agent already took are skipped (a
 * resend), the rest go to the command's input buffer, and the body waits in the caller's
 * socket while that buffer is full (exec.h EXEC_INPUT_MAX): a job holds at most the buffer
 * and one body piece, however much is sent and however slowly the command reads.
 *
 * A command that reads a pipe (no terminal) gets the body's new bytes straight from the
 * socket instead, by splice(2), once the buffer ahead of them is written: the agent then holds
 * none of them, the pipe (EXEC_INPUT_PIPE) is what the command has not read, and a full pipe
 * leaves the body in the socket as a full buffer does.
 */
struct stdin_write {
	struct http_request *req;
	struct job *job;
	uint64_t offset;      /* where the next byte of the body belongs */
	int close;            /* close the input after the body */
	int paused;
	int splicing;         /* the body's next bytes go straight into the command's pipe */
	int superseded;       /* a newer write took over: this one takes nothing more */
};

static void stdin_write_free(struct stdin_write *w)
{
	if (w->job->writer == w)
		w->job->writer = NULL;
	w->job->readers--;
	free(w);
}

static void stdin_pause(struct stdin_write *w)
{
	w->paused = 1;
	http_body_pause(w->req);
}

/* The rest of the body goes through stdin_data again, which skips, takes or refuses it. */
static void stdin_unsplice(struct stdin_write *w)
{
	if (!w->splicing)
		return;
	w->splicing = 0;
	http_body_unsplice(w->req);
}

/* Why a job's input takes no new byte, as a refusal (409: the job's state, not the request,
 * stands in the way), or NULL when it does. */
static const char *input_refusal(const struct job *j, const char **message)
{
	if (!j->has_stdin) {
		*message = "was started without stdin";
		return "JOB_STDIN_NONE";
	}
	if (j->stdin_closed) {
		*message = "had its stdin closed";
		return "JOB_STDIN_CLOSED";
	}
	if (j->finished || j->cmd == NULL) {
		*message = "has ended";
		return "JOB_ENDED";
	}
	if (!command_input_open(j->cmd)) {
		*message = "stopped reading its stdin";
		return "JOB_STDIN_CLOSED";
	}
	return NULL;
}

static void reply_input_refused(struct http_request *req, const struct job *j)
{
	const char *message = NULL;
	const char *code = input_refusal(j, &message);
	reply_error(req, 409, code, "job '%s' %s; the agent took %" PRIu64 " bytes of its input",
		    j->id, message, j->stdin_taken);
}

static void reply_taken(struct http_request *req, const struct job *j)
{
	struct evbuffer *b = evbuffer_new();
	if (b == NULL || evbuffer_add_printf(b, "{\"offset\":%" PRIu64 ",\"closed\":%s}",
					     j->stdin_taken, j->stdin_closed ? "true" : "false") < 0) {
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "answer a job's input");
		return;
	}
	reply_json(req, 200, b);
}

static int stdin_moved(void *ctx, size_t n)
{
	struct stdin_write *w = ctx;
	struct job *j = w->job;
	j->stdin_taken += n;
	w->offset += n;
	/* The command's input ended meanwhile: its next bytes are refused through stdin_data. */
	if (input_refusal(j, &(const char *){ NULL })) {
		w->splicing = 0;
		return -1;
	}
	return 0;
}

static void stdin_splice_failed(void *ctx, int err)
{
	(void)err; /* EPIPE: the command closed its end of the pipe */
	struct stdin_write *w = ctx;
	struct job *j = w->job;
	w->splicing = 0;
	/* As a write into the pipe that met EPIPE: the input is closed and takes nothing more. */
	if (j->cmd)
		command_input_close(j->cmd);
	reply_input_refused(w->req, j);
	stdin_write_free(w);
}

/* Has the rest of the body go straight into the command's pipe when nothing stands before its
 * bytes: all new, the job's input an open pipe, and its buffer written (job_live_input_room
 * asks again once it is). What the connection read already still comes as pieces, each
 * written before the body goes on (stdin_data pauses it). */
static void stdin_splice(struct stdin_write *w)
{
	struct job *j = w->job;
	if (w->splicing || w->superseded || w->offset != j->stdin_taken || j->cmd == NULL ||
	    command_input_held(j->cmd) > 0)
		return;
	int fd = command_input_pipe(j->cmd);
	if (fd >= 0 && http_body_splice_pipe(w->req, fd, stdin_moved, stdin_splice_failed) == 0)
		w->splicing = 1;
}

static int stdin_data(void *ctx, const char *p, size_t n)
{
	struct stdin_write *w = ctx;
	struct job *j = w->job;
	if (w->offset < j->stdin_taken) {
		uint64_t have = j->stdin_taken - w->offset;
		size_t skip = have < n ? (size_t)have : n;
		p += skip;
		n -= skip;
		w->offset += skip;
	}
	if (n == 0) {
		stdin_splice(w);
		return 0;
	}
	if (w->superseded) {
		reply_error(w->req, 409, "JOB_STDIN_BUSY", "a newer write to job '%s''s input took "
			    "over; the agent took %" PRIu64 " bytes of it", j->id, j->stdin_taken);
		stdin_write_free(w);
		return -1;
	}
	/* Refused mid-body, the write goes: the http layer hears no end of it after -1. */
	if (input_refusal(j, &(const char *){ NULL })) {
		reply_input_refused(w->req, j);
		stdin_write_free(w);
		return -1;
	}
	if (command_input(j->cmd, p, n) < 0) {
		reply_out_of_memory(w->req, "take a job's input");
		stdin_write_free(w);
		return -1;
	}
	j->stdin_taken += n;
	w->offset += n;
	if (command_input_room(j->cmd) == 0 || w->splicing)
		stdin_pause(w);
	return 0;
}

static void stdin_end(void *ctx, int complete)
{
	struct stdin_write *w = ctx;
	if (complete) {
		struct job *j = w->job;
		/* A write another took over closes nothing: the newer one's bytes may follow. */
		if (w->close && !w->superseded && !j->stdin_closed) {
			j->stdin_closed = 1;
			if (j->cmd)
				command_input_close(j->cmd);
		}
		reply_taken(w->req, j);
	}
	stdin_write_free(w);
}

void job_live_input_room(struct job *j)
{
	struct stdin_write *w = j->writer;
	if (w == NULL)
		return;
	int ended = j->cmd == NULL || !command_input_open(j->cmd);
	if (ended)
		stdin_unsplice(w);
	else if (command_input_held(j->cmd) == 0)
		stdin_splice(w);
	/* Room again, or the input ended: either way the next piece is taken or refused. A body
	 * spliced waits for the buffer ahead of it to be written whole. */
	if (w->paused && (ended || (w->splicing ? command_input_held(j->cmd) == 0 :
					  command_input_room(j->cmd) > 0))) {
		w->paused = 0;
		http_body_resume(w->req);
	}
}

/* A query parameter as an unsigned integer: 0, -1 absent, -2 not one. */
static int param_u64(struct http_request *req, const char *name, uint64_t *out)
{
	char *v;
	size_t len;
	int r = request_param(req, name, &v, &len);
	if (r < 0)
		return r == -1 ? -1 : -2;
	char *end = NULL;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	int ok = len > 0 && v[0] >= '0' && v[0] <= '9' && end == v + len && errno == 0;
	free(v);
	*out = n;
	return ok ? 0 : -2;
}

void jobs_stdin(struct http_request *req)
{
	char *id;
	size_t id_len;
	int r = request_param(req, "jobId", &id, &id_len);
	if (r == -3) {
		reply_out_of_memory(req, "read the job request");
		return;
	}
	if (r < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the query needs a jobId");
		return;
	}
	struct job *j = strlen(id) == id_len ? job_find(id) : NULL;
	if (j == NULL) {
		char shown[80];
		util_printable(id, id_len, shown, sizeof shown);
		free(id);
		reply_error(req, 404, "JOB_NOT_FOUND", "No job '%s' in this agent", shown);
		return;
	}
	free(id);
	uint64_t offset = 0, close_flag = 0;
	if (param_u64(req, "offset", &offset) < 0) {
		reply_error(req, 400, "REQUEST_INVALID",
			    "Request invalid: offset must be the byte offset of the body's first byte");
		return;
	}
	r = param_u64(req, "close", &close_flag);
	if (r == -2 || close_flag > 1) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: close must be 0 or 1");
		return;
	}
	/* A gap would make the command read bytes in another order than they were sent. */
	if (offset > j->stdin_taken) {
		reply_error(req, 409, "JOB_STDIN_GAP",
			    "offset %" PRIu64 " is past the %" PRIu64 " bytes the agent took of job "
			    "'%s''s input: the bytes between were never sent", offset,
			    j->stdin_taken, j->id);
		return;
	}
	/* One writer at a time, so that two cannot interleave new bytes: the newest takes over.
	 * The one before may be a writer killed mid-write, whose connection the agent cannot see
	 * closed while its body waits in the socket (paused): its next piece is refused. */
	if (j->writer) {
		struct stdin_write *old = j->writer;
		old->superseded = 1;
		j->writer = NULL;
		stdin_unsplice(old);
		if (old->paused) {
			old->paused = 0;
			http_body_resume(old->req);
		}
	}
	const struct http_head *h = http_request_head(req);
	/* New bytes, or a close, that the job can no longer take are refused before the body is
	 * read; a resend of bytes it took (offset below what it has) is still answered. */
	int nothing_new = offset < j->stdin_taken ||
			  (!h->chunked && h->content_length == 0 && !close_flag);
	if (!nothing_new && input_refusal(j, &(const char *){ NULL })) {
		reply_input_refused(req, j);
		return;
	}
	struct stdin_write *w = calloc(1, sizeof *w);
	if (w == NULL) {
		reply_out_of_memory(req, "take a job's input");
		return;
	}
	w->req = req;
	w->job = j;
	w->offset = offset;
	w->close = (int)close_flag;
	j->writer = w;
	j->readers++;
	stdin_splice(w);
	http_body_stream(req, stdin_data, stdin_end, w);
}

/* ---- terminal size and signals ---- */

static void reply_done(struct http_request *req)
{
	reply_empty(req, 204);
}

void jobs_resize(struct http_request *req)
{
	struct job_body jb = { .wants = JOB_BODY_SIZE };
	struct job *j = job_of(req, &jb);
	if (j == NULL)
		return;
	if (jb.cols < 1 || jb.cols > REQUEST_PTY_MAX || jb.rows < 1 || jb.rows > REQUEST_PTY_MAX) {
		reply_error(req, 400, "REQUEST_INVALID",
			    "Request invalid: cols and rows must be integers from 1 to %d",
			    REQUEST_PTY_MAX);
		return;
	}
	if (!j->pty) {
		reply_error(req, 409, "JOB_NOT_PTY", "job '%s' was started without a pty", j->id);
		return;
	}
	if (j->finished || j->cmd == NULL) {
		reply_error(req, 409, "JOB_ENDED", "job '%s' has ended", j->id);
		return;
	}
	if (command_resize(j->cmd, (unsigned)jb.cols, (unsigned)jb.rows) < 0) {
		reply_error(req, 500, "AGENT_OPERATION_FAILED",
			    "Agent operation 'resize a terminal' failed: %s", strerror(errno));
		return;
	}
	reply_done(req);
}

/* The signals a caller may send by name: those a terminal or a supervisor sends. */
static const struct { const char *name; int number; } signal_names[] = {
	{ "INT", SIGINT }, { "TERM", SIGTERM }, { "HUP", SIGHUP }, { "KILL", SIGKILL },
	{ "QUIT", SIGQUIT }, { "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { "WINCH", SIGWINCH },
};

void jobs_signal(struct http_request *req)
{
	struct job_body jb = { .wants = JOB_BODY_SIGNAL };
	struct job *j = job_of(req, &jb);
	if (j == NULL)
		return;
	int number = 0;
	for (size_t i = 0; i < sizeof signal_names / sizeof signal_names[0]; i++)
		if (strcmp(jb.signal, signal_names[i].name) == 0)
			number = signal_names[i].number;
	if (number == 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: signal must be one of INT, "
			    "TERM, HUP, KILL, QUIT, USR1, USR2 and WINCH");
		return;
	}
	if (j->finished || j->cmd == NULL || command_signal(j->cmd, number) < 0) {
		reply_error(req, 409, "JOB_ENDED", "job '%s' has ended", j->id);
		return;
	}
	reply_done(req);
}

/* ---- live streams: POST /v1/jobs/stream {jobId, sinceSeq, keepaliveMs} ---- */

/*
 * A job's frames after the cursor, then each new one as it is kept, then the terminal frame:
 * the exec stream's body (stream.c), taken from the job's kept frames. A follower holds no
 * frames of its own: it sends from the job's while the caller's queue is under
 * HTTP_OUTPUT_HIGH, so one that stops reading costs that much and pins the job's slot.
 */
struct job_follower {
	struct job_follower *next;
	struct http_request *req;
	struct job *job;
	uint64_t since;
	int has_since;
	struct keepalive *keepalive;
};

static void follower_free(struct job_follower *f)
{
	struct job_follower **p = &f->job->followers;
	while (*p && *p != f)
		p = &(*p)->next;
	if (*p)
		*p = f->next;
	keepalive_stop(f->keepalive);
	f->job->readers--;
	free(f);
}

static void follow_pump(struct job_follower *f)
{
	struct job *j = f->job;
	while (http_reply_queued(f->req) < HTTP_OUTPUT_HIGH) {
		size_t at = f->has_since ? job_first_after(j, f->since) : j->first;
		int ending = at >= j->nframes;
		if (ending && !j->finished)
			return; /* the next frame or the ending pumps again */
		struct evbuffer *b = evbuffer_new();
		int ok = b != NULL;
		if (ok && ending) {
			ok = frame_terminal(b, &j->outcome) == 0;
			j->ending_returned = 1;
		} else if (ok) {
			const struct job_frame *fr = j->frames[at];
			ok = frame_data(b, fr->stream, fr->seq, fr->data, fr->len) == 0;
			f->since = fr->seq;
			f->has_since = 1;
		}
		ok = ok && evbuffer_add(b, "\n", 1) == 0;
		if (!ok || http_reply_chunk(f->req, b) < 0 || ending) {
			if (!ok)
				http_reply_cut(f->req); /* the ending is not faked: the caller sees a cut */
			if (b)
				evbuffer_free(b);
			struct http_request *req = f->req;
			follower_free(f);
			http_reply_end(req);
			return;
		}
		evbuffer_free(b);
		keepalive_sent(f->keepalive);
	}
}

static void follow_drained(void *ctx)
{
	follow_pump(ctx);
}

static void follow_gone(void *ctx)
{
	follower_free(ctx);
}

static void pump_all(struct job *j)
{
	struct job_follower *f = j->followers;
	while (f) {
		struct job_follower *next = f->next; /* f may end and go */
		follow_pump(f);
		f = next;
	}
}

void job_live_frame(struct job *j)
{
	pump_all(j);
}

void job_live_end(struct job *j)
{
	pump_all(j);
	job_live_input_room(j);
}

void jobs_stream(struct http_request *req)
{
	struct job_body jb = { .wants = JOB_BODY_SINCE | JOB_BODY_KEEPALIVE };
	struct job *j = job_of(req, &jb);
	if (j == NULL)
		return;
	struct job_follower *f = calloc(1, sizeof *f);
	if (f == NULL) {
		reply_out_of_memory(req, "follow a job");
		return;
	}
	f->req = req;
	f->job = j;
	f->since = jb.since;
	f->has_since = jb.has_since;
	if (http_reply_start(req, 200, "application/x-ndjson", -1) < 0 ||
	    (jb.seen_keepalive && (f->keepalive = keepalive_start(req, jb.keepalive_ms, FRAMING_NDJSON)) == NULL)) {
		http_reply_cut(req);
		http_reply_end(req);
		free(f);
		return;
	}
	f->next = j->followers;
	j->followers = f;
	j->readers++;
	http_reply_watch(req, follow_drained, follow_gone, f);
	follow_pump(f);
}

/* ---- GET /v1/jobs/list ---- */

void jobs_list(struct http_request *req)
{
	struct evbuffer *b = evbuffer_new();
	int ok = b != NULL && evbuffer_add(b, "{\"jobs\":[", 9) == 0;
	struct job *const *slots = job_slots();
	int any = 0;
	for (int i = 0; ok && i < AGENT_JOBS_MAX; i++) {
		const struct job *j = slots[i];
		if (j == NULL)
			continue;
		ok = evbuffer_add_printf(b, "%s{\"jobId\":\"%s\",\"command\":%s,\"running\":%s,"
					 "\"startedAt\":%" PRId64 ",\"stdin\":%s,\"pty\":%s,"
					 "\"stdinOffset\":%" PRIu64, any ? "," : "", j->id,
					 j->command_json, j->finished ? "false" : "true",
					 j->started_ms, j->has_stdin ? "true" : "false",
					 j->pty ? "true" : "false", j->stdin_taken) >= 0;
		if (ok && j->finished && j->outcome.kind == OUTCOME_EXIT)
			ok = evbuffer_add_printf(b, ",\"exitCode\":%d", j->outcome.code) >= 0 &&
			     (!j->outcome.signal ||
			      evbuffer_add_printf(b, ",\"signal\":%d", j->outcome.signal) >= 0);
		else if (ok && j->finished)
			ok = evbuffer_add_printf(b, ",\"error\":{\"code\":\"%s\"}", j->outcome.error) >= 0;
		ok = ok && evbuffer_add(b, "}", 1) == 0;
		any = 1;
	}
	if (!ok || evbuffer_add(b, "]}", 2) < 0) {
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "list the jobs");
		return;
	}
	reply_json(req, 200, b);
}
