/*
 * stream.h — POST /v1/exec: one command whose frames are written to the caller in a chunked body
 * while it runs, as NDJSON (docs/protocol.md §3.3) or binary frames (§6 binaryFrames).
 */
#ifndef SANDKIT_AGENT_STREAM_H
#define SANDKIT_AGENT_STREAM_H

struct http_request;

void stream_exec(struct http_request *req);

#endif
