/*
 * jobs_live.h — what a running job takes besides polls (docs/protocol.md §6 jobStdin, jobPty,
 * jobSignal, jobStream, jobList): input at byte offsets, a terminal's size, signals by name to
 * its process group, its frames streamed live from a cursor, and the list of jobs.
 *
 * Input is exactly-once: the agent counts the bytes of a job's input it took, a write names the
 * offset of its first byte, bytes below the count are skipped (a resend after a lost answer is
 * harmless) and an offset past it is refused (no gap forms). What a job holds of its input is
 * bounded (exec.h EXEC_INPUT_MAX plus one body piece): past that the write's body waits in the
 * caller's socket until the command reads.
 */
#ifndef SANDKIT_AGENT_JOBS_LIVE_H
#define SANDKIT_AGENT_JOBS_LIVE_H

struct http_request;

void jobs_stdin(struct http_request *req);
void jobs_resize(struct http_request *req);
void jobs_signal(struct http_request *req);
void jobs_stream(struct http_request *req);
void jobs_list(struct http_request *req);

#endif
