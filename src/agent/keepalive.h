/*
 * keepalive.h — keep-alive frames on a streamed reply of frames (docs/protocol.md §6 keepalive):
 * {"t":"keepalive"} whenever nothing else went to the caller for the interval it asked for, so
 * that a proxy that cuts a connection silent for longer than its per-read timeout
 * (agent-sandbox's router, nginx's proxy_read_timeout) keeps one whose command is quiet. Any
 * streamed reply of frames can carry them; the exec stream does.
 */
#ifndef SANDKIT_AGENT_KEEPALIVE_H
#define SANDKIT_AGENT_KEEPALIVE_H

#include <stdint.h>

#include "framing.h"

struct http_request;
struct keepalive;

/* keepaliveMs bounds. Below a tenth of a second keep-alives would be most of a quiet stream's
 * traffic; past an hour no proxy's read timeout is left to outlast. */
#define KEEPALIVE_MIN_MS 100
#define KEEPALIVE_MAX_MS 3600000

/* Starts keep-alives on req's streamed reply, in its framing, every interval_ms of silence.
 * NULL when memory ran out. */
struct keepalive *keepalive_start(struct http_request *req, uint64_t interval_ms,
				  enum framing framing);
/* Something else was sent: the silence starts again. k may be NULL (none asked for). */
void keepalive_sent(struct keepalive *k);
/* Stops and frees; before the request is finished or freed. k may be NULL. */
void keepalive_stop(struct keepalive *k);

#endif
