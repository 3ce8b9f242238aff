/*
 * request.h — the body shared by POST /v1/exec and POST /v1/jobs/start (docs/protocol.md §3.3, §6):
 * {"command": [...], "timeoutMs"|"deadlineMs": N, "cwd"|"workingDirectory": "...",
 *  "env": {...}, "jobId": "...", "outputCap": N, "keepaliveMs": N, "framing": "binary",
 *  "stdin": bool, "pty": {"cols": N, "rows": N}} (the last two for jobs alone, §6 jobStdin and
 *  jobPty). The newer field names win when both spellings are present.
 */
#ifndef SANDKIT_AGENT_REQUEST_H
#define SANDKIT_AGENT_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "framing.h"

/* Caller-chosen job ids: 1-64 of [A-Za-z0-9_-] (docs/protocol.md §6). */
#define REQUEST_JOB_ID_MAX 64

/* A terminal's columns and rows, each from 1: far past any screen, and within the kernel's
 * 16-bit winsize. */
#define REQUEST_PTY_MAX 10000

/* The environment every command starts from; the request's env may replace PATH. */
#define REQUEST_DEFAULT_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

struct cmd_request {
	char **argv;          /* NULL-terminated; NULL when absent */
	char **envp;          /* NULL-terminated "K=V" list, PATH first */
	uint64_t timeout_ms;
	char *cwd;            /* NULL: the root */
	size_t cwd_len;
	char job_id[REQUEST_JOB_ID_MAX + 1]; /* "" when the caller chose none */
	uint64_t output_cap;  /* outputCap (docs/protocol.md §6), when has_output_cap */
	int has_output_cap;
	/* keepaliveMs (docs/protocol.md §6 keepalive), within keepalive.h's bounds; 0 when not
	 * asked. Streams of frames take it; a job start has no stream and ignores it. */
	uint64_t keepalive_ms;
	/* framing (docs/protocol.md §6 binaryFrames): "ndjson", the default, or "binary". A job
	 * start has no stream and ignores it. */
	enum framing framing;
	int stdin_pipe;       /* "stdin": true */
	unsigned cols, rows;  /* "pty": both set, or both 0 */
	/* Set when the body is JSON but says something the protocol refuses: for exec this
	 * becomes a requestInvalid frame after the 200, for jobs a 400. Static or in reason_buf. */
	const char *invalid;
	char reason_buf[160];
};

/*
 * Parses body into r (zeroed first). Returns -1 when the body is not a JSON object at all
 * (then r->invalid says why), 0 otherwise. -2 when memory ran out. cmd_request_free releases
 * what was allocated in every case.
 */
int cmd_request_parse(const char *body, size_t len, struct cmd_request *r);
void cmd_request_free(struct cmd_request *r);

/* 1 when s[0..len) is an acceptable caller job id. */
int request_job_id_valid(const char *s, size_t len);

#endif
