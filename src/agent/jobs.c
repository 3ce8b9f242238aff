/* jobs.c — see jobs.h. */
#include "jobs.h"

#include "agent.h"
#include "common/json.h"
#include "exec.h"
#include "handler.h"
#include "http.h"
#include "job.h"
#include "keepalive.h"
#include "paths.h"
#include "request.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <openssl/evp.h>

/* What one kept frame costs besides its bytes: its record, pointer and allocator overhead. */
#define JOBS_FRAME_COST 64
/* What the list shows of a job's command: its JSON array up to this many bytes, then cut
 * (commandTruncated): sixteen jobs' commands fit a small answer whatever they were started
 * with. */
#define JOBS_COMMAND_SHOWN 4096

static struct job *jobs[AGENT_JOBS_MAX];
static uint64_t next_order;

static void job_free(struct job *j)
{
	if (j->cmd)
		command_abandon(j->cmd);
	for (size_t i = j->first; i < j->nframes; i++)
		free(j->frames[i]);
	free(j->frames);
	free(j->command_json);
	free(j);
}

static void record(struct job *j, const struct outcome *o)
{
	if (j->finished)
		return;
	j->finished = 1;
	j->outcome = *o;
	j->cmd = NULL;
	job_live_end(j);
}

/* A terminal job's oldest frames go once it holds more than the cap; a poll being answered
 * meanwhile steps over what went (poll_pump), and the room is reclaimed when none is. */
static void drop_oldest(struct job *j)
{
	while (j->kept_bytes > agent.cfg.output_cap && j->first + 1 < j->nframes) {
		struct job_frame *f = j->frames[j->first];
		j->kept_bytes -= f->len + JOBS_FRAME_COST;
		free(f);
		j->frames[j->first++] = NULL;
	}
	if (j->readers == 0 && j->first > 0 && j->first * 2 >= j->nframes) {
		memmove(j->frames, j->frames + j->first, (j->nframes - j->first) * sizeof *j->frames);
		j->nframes -= j->first;
		j->first = 0;
	}
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
	j->kept_bytes += len + JOBS_FRAME_COST;
	if (j->pty)
		drop_oldest(j);
	job_live_frame(j);
}

static void on_end(void *ctx, const struct outcome *o)
{
	record(ctx, o);
}

static void on_input_room(void *ctx)
{
	job_live_input_room(ctx);
}

static const struct command_sink job_sink = { on_frame, on_end, on_input_room };

struct job *job_find(const char *id)
{
	for (int i = 0; i < AGENT_JOBS_MAX; i++)
		if (jobs[i] && strcmp(jobs[i]->id, id) == 0)
			return jobs[i];
	return NULL;
}

struct job *const *job_slots(void)
{
	return jobs;
}

/* The command as the list shows it: its JSON array, cut at JOBS_COMMAND_SHOWN between two
 * arguments (then with a last member saying how many more there were). NULL when memory ran
 * out. */
static char *command_json(char *const *argv)
{
	struct evbuffer *b = evbuffer_new();
	if (b == NULL)
		return NULL;
	int ok = evbuffer_add(b, "[", 1) == 0;
	size_t i = 0;
	for (; ok && argv[i]; i++) {
		size_t len = strlen(argv[i]);
		if (evbuffer_get_length(b) + len > JOBS_COMMAND_SHOWN)
			break;
		ok = (i == 0 || evbuffer_add(b, ",", 1) == 0) && util_json_string(b, argv[i], len) == 0;
	}
	size_t more = 0;
	while (argv[i + more])
		more++;
	if (ok && more > 0)
		ok = evbuffer_add_printf(b, "%s\"... %zu more\"", i ? "," : "", more) >= 0;
	ok = ok && evbuffer_add(b, "]", 1) == 0;
	size_t n = evbuffer_get_length(b);
	char *out = ok ? malloc(n + 1) : NULL;
	if (out) {
		evbuffer_remove(b, out, n);
		out[n] = '\0';
	}
	evbuffer_free(b);
	return out;
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
		 digest_member(md, "stdin", &r->stdin_pipe, sizeof r->stdin_pipe) == 0 &&
		 digest_member(md, "cols", &r->cols, sizeof r->cols) == 0 &&
		 digest_member(md, "rows", &r->rows, sizeof r->rows) == 0 &&
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
		struct job *existing = job_find(r.job_id);
		/* jobIdempotency: a resent start runs nothing and names the same job; an id names one
		 * request, so another request under it is refused and starts nothing, rather than be
		 * answered with a job that runs some other command. */
		if (existing && memcmp(existing->request, digest, sizeof digest) == 0) {
			reply_job_id(req, existing->id);
			goto out;
		}
		if (existing) {
			reply_error(req, 409, "JOB_ID_CONFLICT",
				    "job '%s' was started with another command, cwd, env, timeout, stdin "
				    "or pty; "
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
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	j->started_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
	j->has_stdin = r.stdin_pipe || r.cols > 0;
	j->pty = r.cols > 0;
	if ((j->command_json = command_json(r.argv)) == NULL) {
		free(j);
		reply_out_of_memory(req, "start a job");
		goto out;
	}
	if (r.job_id[0]) {
		memcpy(j->id, r.job_id, sizeof j->id);
	} else {
		do {
			if (util_uuid(j->id) < 0) {
				free(j->command_json);
				free(j);
				reply_error(req, 500, "AGENT_OPERATION_FAILED",
					    "Agent operation 'make a job id' failed: %s", strerror(errno));
				goto out;
			}
		} while (job_find(j->id));
	}
	int slot = reserve_slot();
	if (slot < 0) {
		free(j->command_json);
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
		/* Jobs keep the agent's cap whatever outputCap says: their output stays in its memory.
		 * A terminal job's cap is its window (drop_oldest), so the command drops nothing. */
		struct command_spec spec = { r.argv, r.envp, cwd_fd, r.timeout_ms, JOBS_FRAME_COST,
					     j->pty ? UINT64_MAX : 0, r.stdin_pipe, r.cols, r.rows };
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

/* A non-negative integer member into *out: NULL, or the refusal naming it. */
static const char *job_body_u64(sk_json *j, uint64_t *out, const char *refusal)
{
	sk_json saved = *j; /* a fraction, a sign or an overflow fails the reader: rewind */
	if (sk_json_peek(j) == SK_JSON_NUMBER && sk_json_u64(j, out) == 0)
		return NULL;
	*j = saved;
	sk_json_skip(j);
	return refusal;
}

static const char *job_body_member(void *ctx, sk_json *j, const sk_json_str *key)
{
	struct job_body *jb = ctx;
	if (sk_json_str_is(key, "jobId") && !jb->seen_id) {
		jb->seen_id = 1;
		sk_json_str id;
		if (sk_json_peek(j) == SK_JSON_STRING) {
			sk_json_string(j, &id);
			jb->id_p = id.p;
			jb->id_len = id.len;
			jb->id_escaped = id.escaped;
			return NULL;
		}
		sk_json_skip(j);
		return "jobId must be a string";
	}
	if ((jb->wants & JOB_BODY_SINCE) && sk_json_str_is(key, "sinceSeq") && !jb->seen_since) {
		jb->seen_since = 1;
		if (sk_json_peek(j) == SK_JSON_NULL) {
			sk_json_null(j);
			return NULL;
		}
		const char *bad = job_body_u64(j, &jb->since,
					       "sinceSeq must be a non-negative integer or null");
		jb->has_since = bad == NULL;
		return bad;
	}
	if ((jb->wants & JOB_BODY_KEEPALIVE) && sk_json_str_is(key, "keepaliveMs") &&
	    !jb->seen_keepalive) {
		jb->seen_keepalive = 1;
		const char *bad = job_body_u64(j, &jb->keepalive_ms, "keepaliveMs is out of range");
		if (bad || jb->keepalive_ms < KEEPALIVE_MIN_MS || jb->keepalive_ms > KEEPALIVE_MAX_MS)
			return "keepaliveMs must be an integer from 100 to 3600000";
		return NULL;
	}
	if ((jb->wants & JOB_BODY_SIZE) && sk_json_str_is(key, "cols") && !jb->seen_cols) {
		jb->seen_cols = 1;
		return job_body_u64(j, &jb->cols, "cols must be an integer from 1 to 10000");
	}
	if ((jb->wants & JOB_BODY_SIZE) && sk_json_str_is(key, "rows") && !jb->seen_rows) {
		jb->seen_rows = 1;
		return job_body_u64(j, &jb->rows, "rows must be an integer from 1 to 10000");
	}
	if ((jb->wants & JOB_BODY_SIGNAL) && sk_json_str_is(key, "signal") && !jb->seen_signal) {
		jb->seen_signal = 1;
		sk_json_str name;
		if (sk_json_peek(j) == SK_JSON_STRING && sk_json_string(j, &name) == 0) {
			if (!name.escaped && name.len < sizeof jb->signal) {
				memcpy(jb->signal, name.p, name.len);
				jb->signal[name.len] = '\0';
			}
			return NULL; /* an unknown name is the route's to refuse, naming the known */
		}
		sk_json_skip(j);
		return "signal must be a string";
	}
	sk_json_skip(j);
	return NULL;
}

struct job *job_of(struct http_request *req, struct job_body *jb)
{
	if (read_json_body(req, "read the job request", job_body_member, jb) < 0)
		return NULL;
	if (!jb->seen_id) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: jobId is required");
		return NULL;
	}
	struct job *found = NULL;
	/* Ids are plain ASCII by construction; an escaped or overlong one names no job. */
	if (!jb->id_escaped && jb->id_len <= REQUEST_JOB_ID_MAX) {
		char key_id[REQUEST_JOB_ID_MAX + 1];
		memcpy(key_id, jb->id_p, jb->id_len);
		key_id[jb->id_len] = '\0';
		if (strlen(key_id) == jb->id_len)
			found = job_find(key_id);
	}
	if (found == NULL) {
		char shown[80];
		util_printable(jb->id_p, jb->id_len, shown, sizeof shown);
		reply_error(req, 404, "JOB_NOT_FOUND", "No job '%s' in this agent", shown);
	}
	return found;
}

size_t job_first_after(const struct job *j, uint64_t since)
{
	size_t lo = j->first, hi = j->nframes;
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
	size_t next, end;         /* frames [next, end) still to send */
	int sent_one;             /* a frame went out: the next one follows a comma */
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
		if (ps->next < j->first)
			ps->next = j->first; /* a terminal job dropped them meanwhile: its seq shows */
		if (ps->end < ps->next)
			ps->end = ps->next;
		struct evbuffer *b = evbuffer_new();
		int ok = b != NULL;
		int last = ps->next == ps->end;
		if (ok && last) {
			ok = poll_ending(b, ps) == 0;
		} else if (ok) {
			const struct job_frame *f = j->frames[ps->next];
			ok = !ps->sent_one || evbuffer_add(b, ",", 1) == 0;
			ps->sent_one = 1;
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
	struct job_body jb = { .wants = JOB_BODY_SINCE };
	struct job *j = job_of(req, &jb);
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
	ps->next = jb.has_since ? job_first_after(j, jb.since) : j->first;
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
	struct job_body jb = { .wants = 0 };
	struct job *j = job_of(req, &jb);
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
