/*
 * jobs.h — POST /v1/jobs/{start,poll,cancel} (docs/protocol.md §3.4, §6 jobIdempotency): commands
 * that outlive the connection that started them, their output kept for polling.
 *
 * At most AGENT_JOBS_MAX jobs exist, running and retained together. A start when full evicts
 * the oldest finished job whose ending a poll has already returned, else it is refused with
 * 429 JOB_LIMIT_REACHED. A job's memory is bounded by the output cap per stream, bookkeeping
 * included (JOBS_FRAME_COST), so all jobs together hold at most 16 x 2 x cap.
 */
#ifndef SANDKIT_AGENT_JOBS_H
#define SANDKIT_AGENT_JOBS_H

struct http_request;

void jobs_start(struct http_request *req);
void jobs_poll(struct http_request *req);
void jobs_cancel(struct http_request *req);

/* Agent shutdown: abandons every running job's command and frees every job. */
void jobs_free_all(void);

#endif
