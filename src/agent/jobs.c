/* jobs.c — see jobs.h. */
#include "jobs.h"

#include "agent.h"
#include "common/json.h"
#include "exec.h"
#include "handler.h"
#include "http.h"
#include "paths.h"
#include "request.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/buffer.h>

/* What one kept frame costs besides its bytes: its record, pointer and allocator overhead. */
#define JOBS_FRAME_COST 64

struct job_frame {
	uint64_t seq;
	uint32_t len;
	unsigned char stream;
	unsigned char data[];
};

struct job {
	char id[REQUEST_JOB_ID_MAX + 1];
	uint64_t order;           /* start order: "oldest" for eviction */
	struct command *cmd;      /* while running */
	int finished;
	int ending_returned;      /* a poll has returned the ending: the job may be evicted */
	int readers;              /* polls whose answers are still being sent: not evicted */
	struct outcome outcome;   /* the first outcome recorded wins */
	struct job_frame **frames;
	size_t nframes, cap_frames;
};

static struct job *jobs[AGENT_JOBS_MAX];
static uint64_t next_order;

static void job_free(struct job *j)
{
	if (j->cmd)
		command_abandon(j->cmd);
	for (size_t i = 0; i < j->nframes; i++)
		free(j->frames[i]);
	free(j->frames);
	free(j);
}

static void record(struct job *j, const struct outcome *o)
{
	if (j->finished)
		return;
	j->finished = 1;
	j->outcome = *o;
	j->cmd = NULL;
}

static void on_frame(void *ctx, int stream, uint64_t seq, const unsigned char *data, size_t len)
{
	struct job *j = ctx;
	struct job_frame *f = malloc(sizeof *f + len);
	if (f && j->nframes == j->cap_frames) {
		size_t cap = j->cap_frames ? j->cap_frames * 2 : 16;
		struct job_frame **v = realloc(j->frames, cap * sizeof *v);
		if (v) {
			j->frames = v;
			j->cap_frames = cap;
		}
	}
	if (f == NULL || j->nframes == j->cap_frames) {
		/* A job that silently lost output would look complete: end it, saying why. */
		free(f);
		struct outcome o;
		outcome_error(&o, "outputReadFailed", "the agent ran out of memory for the job's output");
		struct command *c = j->cmd;
		record(j, &o);
		command_abandon(c);
		return;
	}
	f->seq = seq;
	f->len = (uint32_t)len;
	f->stream = (unsigned char)stream;
	memcpy(f->data, data, len);
	j->frames[j->nframes++] = f;
}

static void on_end(void *ctx, const struct outcome *o)
{
	record(ctx, o);
}

static const struct command_sink job_sink = { on_frame, on_end };

static struct job *find(const char *id)
{
	for (int i = 0; i < AGENT_JOBS_MAX; i++)
		if (jobs[i] && strcmp(jobs[i]->id, id) == 0)
			return jobs[i];
	return NULL;
}

/* A free slot, evicting if it must; -1 when every job is running or unread. */
static int reserve_slot(void)
{
	int victim = -1;
	for (int i = 0; i < AGENT_JOBS_MAX; i++) {
		if (jobs[i] == NULL)
			return i;
		if (jobs[i]->finished && jobs[i]->ending_returned && jobs[i]->readers == 0 &&
		    (victim < 0 || jobs[i]->order < jobs[victim]->order))
			victim = i;
	}
	if (victim >= 0) {
		job_free(jobs[victim]);
		jobs[victim] = NULL;
	}
	return victim;
}

static void reply_job_id(struct http_request *req, const char *id)
{
	struct evbuffer *b = evbuffer_new();
	if (b == NULL || evbuffer_add(b, "{\"jobId\":", 9) < 0 || util_json_string(b, id, strlen(id)) < 0 ||
	    evbuffer_add(b, "}", 1) < 0) {
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "answer a job start");
		return;
	}
	reply_json(req, 200, b);
}

void jobs_start(struct http_request *req)
{
	struct cmd_request r;
	int rc = read_cmd_request(req, &r, "read the job request");
	if (rc == -2)
		return;
	/* Validation before anything is reserved: an invalid start holds no slot. */
	int cwd_fd = -1;
	const char *why = NULL;
	enum path_result pr = PATH_OK;
	if (rc == 0)
		pr = paths_open_cwd(r.cwd, r.cwd_len, &cwd_fd, &why);
	if (pr == PATH_REFUSED) {
		reply_path_refused(req, r.cwd, r.cwd_len, why);
		goto out;
	}
	if (r.invalid) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s", r.invalid);
		goto out;
	}
	if (r.job_id[0]) {
		struct job *existing = find(r.job_id);
		if (existing) {
			/* jobIdempotency: a resent start runs nothing and names the same job. */
			reply_job_id(req, existing->id);
			goto out;
		}
	}
	struct job *j = calloc(1, sizeof *j);
	if (j == NULL) {
		reply_out_of_memory(req, "start a job");
		goto out;
	}
	if (r.job_id[0]) {
		memcpy(j->id, r.job_id, sizeof j->id);
	} else {
		do {
			if (util_uuid(j->id) < 0) {
				free(j);
				reply_error(req, 500, "AGENT_OPERATION_FAILED",
					    "Agent operation 'make a job id' failed: %s", strerror(errno));
				goto out;
			}
		} while (find(j->id));
	}
	int slot = reserve_slot();
	if (slot < 0) {
		free(j);
		reply_error(req, 429, "JOB_LIMIT_REACHED",
			    "all %d job slots hold running jobs or endings no poll has returned yet",
			    AGENT_JOBS_MAX);
		goto out;
	}
	j->order = next_order++;
	jobs[slot] = j;
	struct outcome failure;
	if (pr != PATH_OK) {
		char shown[REPLY_SHOWN_PATH_MAX];
		util_printable(r.cwd, r.cwd_len, shown, sizeof shown);
		outcome_error(&failure, "spawnFailed", "cannot enter the working directory '%s': %s",
			      shown, why);
		record(j, &failure);
	} else {
		/* Jobs keep the agent's cap whatever outputCap says: their output stays in its memory. */
		struct command_spec spec = { r.argv, r.envp, cwd_fd, r.timeout_ms, JOBS_FRAME_COST, 0 };
		j->cmd = command_start(&spec, &job_sink, j, &failure);
		if (j->cmd == NULL)
			record(j, &failure);
	}
	reply_job_id(req, j->id);
out:
	if (cwd_fd >= 0)
		close(cwd_fd);
	cmd_request_free(&r);
}

/* Reads {"jobId": "...", "sinceSeq": N|null} (poll) or {"jobId": "..."} (cancel). Answers the
 * request itself and returns NULL when the body is refused or the job is unknown. */
static struct job *job_of(struct http_request *req, int with_since, int *has_since,
			  uint64_t *since)
{
	size_t len;
	const char *body = http_request_body(req, &len);
	if (body == NULL) {
		reply_out_of_memory(req, "read the job request");
		return NULL;
	}
	sk_json j;
	sk_json_init(&j, body, len);
	sk_json_str key, id = { NULL, 0, 0 };
	const char *problem = NULL;
	int more, seen_id = 0;
	*has_since = 0;
	if (sk_json_object_begin(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not a JSON object");
		return NULL;
	}
	while ((more = sk_json_object_key(&j, &key)) == 1) {
		if (sk_json_str_is(&key, "jobId") && !seen_id) {
			seen_id = 1;
			if (sk_json_peek(&j) != SK_JSON_STRING) {
				problem = "jobId must be a string";
				sk_json_skip(&j);
			} else {
				sk_json_string(&j, &id);
			}
		} else if (with_since && sk_json_str_is(&key, "sinceSeq") && !*has_since) {
			if (sk_json_peek(&j) == SK_JSON_NULL) {
				sk_json_null(&j);
			} else if (sk_json_peek(&j) == SK_JSON_NUMBER) {
				sk_json saved = j;
				if (sk_json_u64(&j, since) == 0) {
					*has_since = 1;
				} else {
					j = saved;
					sk_json_skip(&j);
					problem = "sinceSeq must be a non-negative integer or null";
				}
			} else {
				problem = "sinceSeq must be a non-negative integer or null";
				sk_json_skip(&j);
			}
		} else {
			sk_json_skip(&j);
		}
	}
	if (more < 0 || sk_json_finish(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not valid JSON: %s",
			    j.err ? j.err : "malformed");
		return NULL;
	}
	if (problem == NULL && !seen_id)
		problem = "jobId is required";
	if (problem) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s", problem);
		return NULL;
	}
	struct job *found = NULL;
	/* Ids are plain ASCII by construction; an escaped or overlong one names no job. */
	if (!id.escaped && id.len <= REQUEST_JOB_ID_MAX) {
		char key_id[REQUEST_JOB_ID_MAX + 1];
		memcpy(key_id, id.p, id.len);
		key_id[id.len] = '\0';
		if (strlen(key_id) == id.len)
			found = find(key_id);
	}
	if (found == NULL) {
		char shown[80];
		util_printable(id.p, id.len, shown, sizeof shown);
		reply_error(req, 404, "JOB_NOT_FOUND", "No job '%s' in this agent", shown);
	}
	return found;
}

/* First frame with seq > since (frames are in seq order). */
static size_t first_after(const struct job *j, uint64_t since)
{
	size_t lo = 0, hi = j->nframes;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (j->frames[mid]->seq <= since)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* A poll's answer on its way to the caller: the frames there were when the poll came, encoded
 * a few at a time as the caller takes them (http.h), so an unread poll holds little. */
struct poll_send {
	struct http_request *req;
	struct job *job;          /* pinned: not evicted while its frames are being sent */
	size_t start, next, end;  /* frames [next, end) still to send, from start */
	int finished;             /* the ending as it was when the poll came */
	struct outcome outcome;
};

static int poll_ending(struct evbuffer *b, const struct poll_send *ps)
{
	const struct outcome *o = &ps->outcome;
	if (evbuffer_add(b, "]", 1) < 0)
		return -1;
	if (ps->finished && o->kind == OUTCOME_EXIT) {
		char sig[32] = "";
		if (o->signal)
			snprintf(sig, sizeof sig, ",\"signal\":%d", o->signal);
		if (evbuffer_add_printf(b, ",\"exitCode\":%d,\"truncated\":%s%s", o->code,
					o->truncated ? "true" : "false", sig) < 0)
			return -1;
	} else if (ps->finished) {
		if (evbuffer_add_printf(b, ",\"error\":{\"code\":\"%s\",\"message\":", o->error) < 0 ||
		    util_json_string(b, o->message, strlen(o->message)) < 0 ||
		    evbuffer_add(b, "}", 1) < 0)
			return -1;
	}
	return evbuffer_add(b, "}", 1);
}

static void poll_free(struct poll_send *ps)
{
	ps->job->readers--;
	free(ps);
}

/* Sends frames until the caller's queue is full, then the ending (http.h drain callback). */
static void poll_pump(void *ctx)
{
	struct poll_send *ps = ctx;
	const struct job *j = ps->job;
	while (http_reply_queued(ps->req) < HTTP_OUTPUT_HIGH) {
		struct evbuffer *b = evbuffer_new();
		int ok = b != NULL;
		int last = ps->next == ps->end;
		if (ok && last) {
			ok = poll_ending(b, ps) == 0;
		} else if (ok) {
			const struct job_frame *f = j->frames[ps->next];
			ok = ps->next == ps->start || evbuffer_add(b, ",", 1) == 0;
			ok = ok && frame_data(b, f->stream, f->seq, f->data, f->len) == 0;
			ps->next++;
		}
		if (!ok || http_reply_chunk(ps->req, b) < 0 || last) {
			/* Memory ran out mid-answer: the reply is cut (no terminating chunk, the
			 * connection closes), which no caller can take for a whole answer. */
			if (!ok)
				http_reply_cut(ps->req);
			if (b)
				evbuffer_free(b);
			http_reply_end(ps->req);
			poll_free(ps);
			return;
		}
		evbuffer_free(b);
	}
}

static void poll_gone(void *ctx)
{
	poll_free(ctx);
}

void jobs_poll(struct http_request *req)
{
	int has_since;
	uint64_t since = 0;
	struct job *j = job_of(req, 1, &has_since, &since);
	if (j == NULL)
		return;
	struct poll_send *ps = calloc(1, sizeof *ps);
	struct evbuffer *b = evbuffer_new();
	if (ps == NULL || b == NULL ||
	    evbuffer_add_printf(b, "{\"running\":%s,\"frames\":[", j->finished ? "false" : "true") < 0) {
		free(ps);
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "answer a job poll");
		return;
	}
	ps->req = req;
	ps->job = j;
	ps->next = ps->start = has_since ? first_after(j, since) : 0;
	ps->end = j->nframes;
	ps->finished = j->finished;
	ps->outcome = j->outcome;
	j->readers++;
	if (j->finished)
		j->ending_returned = 1;
	if (http_reply_start(req, 200, "application/json", -1) < 0 || http_reply_chunk(req, b) < 0) {
		evbuffer_free(b);
		http_reply_end(req);
		poll_free(ps);
		return;
	}
	evbuffer_free(b);
	http_reply_watch(req, poll_pump, poll_gone, ps);
	poll_pump(ps);
}

void jobs_cancel(struct http_request *req)
{
	int has_since;
	uint64_t since;
	struct job *j = job_of(req, 0, &has_since, &since);
	if (j == NULL)
		return;
	if (!j->finished) {
		struct outcome o;
		outcome_error(&o, "cancelled", "the job was cancelled");
		struct command *c = j->cmd;
		record(j, &o);
		command_abandon(c);
	}
	struct evbuffer *b = evbuffer_new();
	if (b == NULL || evbuffer_add(b, "{}", 2) < 0) {
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "answer a job cancel");
		return;
	}
	reply_json(req, 200, b);
}

void jobs_free_all(void)
{
	for (int i = 0; i < AGENT_JOBS_MAX; i++) {
		if (jobs[i])
			job_free(jobs[i]);
		jobs[i] = NULL;
	}
}
