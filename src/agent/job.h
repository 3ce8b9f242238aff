/*
 * job.h — a job as jobs.c (start, poll, cancel) and jobs_live.c (input, terminal size,
 * signals, live streams, the list) both see it. Nothing else includes it.
 */
#ifndef SANDKIT_AGENT_JOB_H
#define SANDKIT_AGENT_JOB_H

#include "exec.h"
#include "request.h"

#include <stddef.h>
#include <stdint.h>

/* A job's request is kept as its SHA-256 (request_digest). */
#define JOBS_DIGEST_BYTES 32

struct job_frame {
	uint64_t seq;
	uint32_t len;
	unsigned char stream;
	unsigned char data[];
};

struct job_follower;
struct stdin_write;

struct job {
	char id[REQUEST_JOB_ID_MAX + 1];
	unsigned char request[JOBS_DIGEST_BYTES]; /* the start's request_digest */
	uint64_t order;           /* start order: "oldest" for eviction */
	struct command *cmd;      /* while running */
	int finished;
	int ending_returned;      /* a poll or a stream has returned the ending: it may be evicted */
	int readers;              /* polls, streams and writes still being served: not evicted */
	struct outcome outcome;   /* the first outcome recorded wins */
	/* Frames [first, nframes) are kept. A terminal job keeps its latest output, dropping its
	 * oldest frames past the cap (kept_bytes counts what is kept, bookkeeping included);
	 * every other job keeps its first output up to the cap (exec.h). */
	struct job_frame **frames;
	size_t first, nframes, cap_frames;
	uint64_t kept_bytes;
	/* jobList: what the list shows of the command (a JSON array, cut short at a bound), and
	 * when the job started, in milliseconds since the epoch. */
	char *command_json;
	int64_t started_ms;
	/* jobStdin and jobPty */
	int has_stdin, pty;
	uint64_t stdin_taken;     /* bytes of input taken: the offset the next new byte has */
	int stdin_closed;         /* a write closed the input */
	struct stdin_write *writer; /* the one write whose body is being taken */
	struct job_follower *followers; /* jobStream: live streams of this job */
};

/* The job with this id, or NULL. */
struct job *job_find(const char *id);
/* Every slot, for the list: AGENT_JOBS_MAX entries, NULL where none. */
struct job *const *job_slots(void);
/* First kept frame with seq > since (frames are in seq order). */
size_t job_first_after(const struct job *j, uint64_t since);

/* jobs_live.c's part of a job's life, called by jobs.c: a frame was kept, the job ended (its
 * outcome is recorded), the command's input has room again or ended. */
void job_live_frame(struct job *j);
void job_live_end(struct job *j);
void job_live_input_room(struct job *j);

/*
 * The members of a job route's JSON body (read_json_body): the job's id always, and those the
 * route asks for with `wants` (JOB_BODY_* bits). Answers the request itself and returns NULL
 * when the body is refused or no job has the id.
 */
enum { JOB_BODY_SINCE = 1, JOB_BODY_KEEPALIVE = 2, JOB_BODY_SIZE = 4, JOB_BODY_SIGNAL = 8 };
struct job_body {
	unsigned wants;
	int seen_id, seen_since, has_since, seen_keepalive, seen_cols, seen_rows, seen_signal;
	const char *id_p;
	size_t id_len;
	int id_escaped;
	uint64_t since, keepalive_ms, cols, rows;
	char signal[8];           /* a name in the signal table is shorter */
	const char *problem;
};
struct http_request;
struct job *job_of(struct http_request *req, struct job_body *jb);

#endif
