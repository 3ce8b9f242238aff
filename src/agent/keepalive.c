/* keepalive.c — see keepalive.h. */
#include "keepalive.h"

#include "agent.h"
#include "http.h"

#include <stdlib.h>

#include <event2/buffer.h>
#include <event2/event.h>

struct keepalive {
	struct http_request *req;
	struct event *timer;
	struct timeval interval;
	enum framing framing;
};

/* The frame's whole text. */
static const char TEXT[] = "{\"t\":\"keepalive\"}";

static void on_silence(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct keepalive *k = arg;
	/* Armed again first: k is not touched after the reply was given a line. */
	evtimer_add(k->timer, &k->interval);
	/* Bytes still waiting for the caller will reach a proxy as soon as it reads again: a
	 * keep-alive would only add to them. */
	if (http_reply_queued(k->req) == 0) {
		struct evbuffer *b = evbuffer_new();
		/* A reply that cannot take the line is cut (http_reply_chunk), which the caller
		 * sees as a failed stream, never as a quiet one. */
		if (b == NULL || framing_json(b, k->framing, TEXT, sizeof TEXT - 1) < 0)
			http_reply_cut(k->req);
		else
			http_reply_chunk(k->req, b);
		if (b)
			evbuffer_free(b);
	}
}

struct keepalive *keepalive_start(struct http_request *req, uint64_t interval_ms,
				  enum framing framing)
{
	struct keepalive *k = calloc(1, sizeof *k);
	if (k == NULL)
		return NULL;
	k->req = req;
	k->framing = framing;
	k->interval.tv_sec = (time_t)(interval_ms / 1000);
	k->interval.tv_usec = (suseconds_t)(interval_ms % 1000) * 1000;
	k->timer = evtimer_new(agent.base, on_silence, k);
	if (k->timer == NULL || evtimer_add(k->timer, &k->interval) < 0) {
		keepalive_stop(k);
		return NULL;
	}
	return k;
}

void keepalive_sent(struct keepalive *k)
{
	/* Adding a pending timer again moves it: the next keep-alive is an interval from now. */
	if (k)
		evtimer_add(k->timer, &k->interval);
}

void keepalive_stop(struct keepalive *k)
{
	if (k == NULL)
		return;
	if (k->timer)
		event_free(k->timer);
	free(k);
}
