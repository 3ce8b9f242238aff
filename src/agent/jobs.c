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
#include <openssl/evp.h>

/* What one kept frame costs besides its bytes: its record, pointer and allocator overhead. */
#define JOBS_FRAME_COST 64
/* A job's request is kept as its SHA-256 (request_digest): a start naming a known id is the
 * same request exactly when the digests are equal, and a job holds 32 bytes for it however
 * large its command and environment. */
#define JOBS_DIGEST_BYTES 32

struct job_frame {
	uint64_t seq;
	uint32_t len;
	unsigned char stream;
	unsigned char data[];
};

struct job {
	char id[REQUEST_JOB_ID_MAX + 1];
	unsigned char request[JOBS_DIGEST_BYTES]; /* the start's request_digest */
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

/* One member of the digest: its name, its length and its bytes, so that no two requests'
 * members run together into the same bytes. 0, or -1 when the digest failed. */
static int digest_member(EVP_MD_CTX *md, const char *name, const void *p, size_t len)
{
	uint64_t n = len;
	return EVP_DigestUpdate(md, name, strlen(name) + 1) == 1 &&
	       EVP_DigestUpdate(md, &n, sizeof n) == 1 && EVP_DigestUpdate(md, p, len) == 1 ? 0 : -1;
}

/* A NULL-terminated list as one member: its length, then each string as a member. */
static int digest_list(EVP_MD_CTX *md, const char *name, char *const *v)
{
	size_t n = 0;
	while (v[n])
		n++;
	if (digest_member(md, name, &n, sizeof n) < 0)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (digest_member(md, name, v[i], strlen(v[i])) < 0)
			return -1;
	return 0;
}

/*
 * The identity of a start (jobIdempotency, docs/protocol.md §6): the request as the agent would
 * run it — argv, the working directory normalized ("." for the root, so "/", "." and none are
 * one), the environment as the command gets it (the default PATH included, names sorted), the
 * timeout. A member a start comes to carry joins with one more line here. 0, or -1 when the
 * digest could not be made.
 */
static int request_digest(const struct cmd_request *r, unsigned char out[JOBS_DIGEST_BYTES])
{
	char cwd[PATHS_MAX] = ".";
	if (r->cwd && paths_normalize(r->cwd, r->cwd_len, cwd) != NULL)
		snprintf(cwd, sizeof cwd, "%.*s", (int)r->cwd_len, r->cwd);
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned int n = 0;
	int ok = md != NULL && EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 &&
		 digest_list(md, "command", r->argv) == 0 &&
		 digest_member(md, "cwd", cwd, strlen(cwd)) == 0 &&
		 digest_list(md, "env", r->envp) == 0 &&
		 digest_member(md, "timeoutMs", &r->timeout_ms, sizeof r->timeout_ms) == 0 &&
		 EVP_DigestFinal_ex(md, out, &n) == 1 && n == JOBS_DIGEST_BYTES;
	EVP_MD_CTX_free(md);
	return ok ? 0 : -1;
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
	unsigned char digest[JOBS_DIGEST_BYTES];
	if (request_digest(&r, digest) < 0) {
		reply_out_of_memory(req, "start a job");
		goto out;
	}
	if (r.job_id[0]) {
		struct job *existing = find(r.job_id);
		/* jobIdempotency: a resent start runs nothing and names the same job; an id names one
		 * request, so another request under it is refused and starts nothing, rather than be
		 * answered with a job that runs some other command. */
		if (existing && memcmp(existing->request, digest, sizeof digest) == 0) {
			reply_job_id(req, existing->id);
			goto out;
		}
		if (existing) {
			reply_error(req, 409, "JOB_ID_CONFLICT",
				    "job '%s' was started with another command, cwd, env or timeout; "
				    "a job id names one request", existing->id);
			goto out;
		}
	}
	struct job *j = calloc(1, sizeof *j);
	if (j == NULL) {
		reply_out_of_memory(req, "start a job");
		goto out;
	}
	memcpy(j->request, digest, sizeof digest);
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

/* The members of a poll's or a cancel's body, as read_json_body hands them over. */
struct job_body {
	int with_since;           /* a poll's sinceSeq; a cancel names the job alone */
	int seen_id, seen_since, has_since;
	sk_json_str id;
	uint64_t since;
};

static const char *job_body_member(void *ctx, sk_json *j, const sk_json_str *key)
{
	struct job_body *jb = ctx;
	if (sk_json_str_is(key, "jobId") && !jb->seen_id) {
		jb->seen_id = 1;
		if (sk_json_peek(j) == SK_JSON_STRING) {
			sk_json_string(j, &jb->id);
			return NULL;
		}
		sk_json_skip(j);
		return "jobId must be a string";
	}
	if (jb->with_since && sk_json_str_is(key, "sinceSeq") && !jb->seen_since) {
		jb->seen_since = 1;
		if (sk_json_peek(j) == SK_JSON_NULL) {
			sk_json_null(j);
			return NULL;
		}
		sk_json saved = *j; /* a fraction, a sign or an overflow fails the reader: rewind */
		if (sk_json_peek(j) == SK_JSON_NUMBER && sk_json_u64(j, &jb->since) == 0) {
			jb->has_since = 1;
			return NULL;
		}
		*j = saved;
		sk_json_skip(j);
		return "sinceSeq must be a non-negative integer or null";
	}
	sk_json_skip(j);
	return NULL;
}

/* Reads {"jobId": "...", "sinceSeq": N|null} (poll) or {"jobId": "..."} (cancel). Answers the
 * request itself and returns NULL when the body is refused or the job is unknown. */
static struct job *job_of(struct http_request *req, int with_since, int *has_since,
			  uint64_t *since)
{
	struct job_body jb = { with_since, 0, 0, 0, { NULL, 0, 0 }, 0 };
	if (read_json_body(req, "read the job request", job_body_member, &jb) < 0)
		return NULL;
	if (!jb.seen_id) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: jobId is required");
		return NULL;
	}
	*has_since = jb.has_since;
	*since = jb.since;
	sk_json_str id = jb.id;
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
		if (evbuffer_add_printf(b, ",\"exitCode\":%d,\"truncated\":%s%s%s", o->code,
					o->truncated ? "true" : "false", sig,
					o->oom ? ",\"oom\":true" : "") < 0)
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
