/* preview.c — see preview.h. */
#include "preview.h"

#include "agent.h"
#include "common/json.h"
#include "confine.h"
#include "handler.h"
#include "http.h"
#include "log.h"
#include "network.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

/* Connections a listener may have waiting for accept(2). */
#define PREVIEW_BACKLOG 64

struct preview {
	unsigned port;                   /* inside the session */
	unsigned host_port;              /* on the host's 127.0.0.1 */
	struct evconnlistener *listener;
};

/* One accepted connection and its twin inside the session. */
struct splice {
	struct splice *prev, *next;
	struct bufferevent *side[2];     /* 0: the caller's, 1: the session's */
	int ended[2];                    /* side i sent its end of file */
	int shut[2];                     /* side i was told the other's end (shutdown for writing) */
};

static struct preview previews[PREVIEW_PORTS_MAX];
static size_t npreviews;
static struct splice *splices;
static unsigned nsplices;

static void splice_free(struct splice *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		splices = s->next;
	if (s->next)
		s->next->prev = s->prev;
	for (int i = 0; i < 2; i++)
		if (s->side[i])
			bufferevent_free(s->side[i]);
	free(s);
	nsplices--;
}

static int side_of(const struct splice *s, const struct bufferevent *bev)
{
	return bev == s->side[1];
}

/*
 * Once side i ended and what it sent was written to the other side: the caller's end ends the
 * connection (a server that keeps its side open must not hold one of the bounded connections
 * for ever); the session's end is passed on to the caller (shutdown for writing), whose own end
 * then ends it. 1 when the pair was freed.
 */
static int pass_end(struct splice *s, int i)
{
	int other = 1 - i;
	if (!s->ended[i] || evbuffer_get_length(bufferevent_get_output(s->side[other])) > 0)
		return 0;
	if (i == 0 || s->ended[other]) {
		splice_free(s);
		return 1;
	}
	if (!s->shut[other]) {
		shutdown(bufferevent_getfd(s->side[other]), SHUT_WR);
		s->shut[other] = 1;
	}
	return 0;
}

static void on_read(struct bufferevent *bev, void *arg)
{
	struct splice *s = arg;
	int i = side_of(s, bev), other = 1 - i;
	struct evbuffer *out = bufferevent_get_output(s->side[other]);
	evbuffer_add_buffer(out, bufferevent_get_input(bev));
	/* Backpressure: the sender waits until the receiver took half of what is waiting. */
	if (evbuffer_get_length(out) >= PREVIEW_BUFFER) {
		bufferevent_disable(bev, EV_READ);
		bufferevent_setwatermark(s->side[other], EV_WRITE, PREVIEW_BUFFER / 2, 0);
	}
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct splice *s = arg;
	int i = side_of(s, bev), other = 1 - i;
	if (!s->ended[other] && !(bufferevent_get_enabled(s->side[other]) & EV_READ)) {
		bufferevent_setwatermark(bev, EV_WRITE, 0, 0);
		bufferevent_enable(s->side[other], EV_READ);
	}
	pass_end(s, other);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	struct splice *s = arg;
	int i = side_of(s, bev);
	if (what & BEV_EVENT_CONNECTED)
		return;
	if (what & BEV_EVENT_EOF) {
		s->ended[i] = 1;
		bufferevent_disable(bev, EV_READ);
		pass_end(s, i);
		return;
	}
	/* A reset, a refused connection inside (nothing listens on the port yet), a failure:
	 * both sides close, which the caller sees as the connection's end. */
	splice_free(s);
}

static void on_accept(struct evconnlistener *listener, evutil_socket_t fd, struct sockaddr *sa,
		      int salen, void *arg)
{
	(void)listener;
	(void)sa;
	(void)salen;
	const struct preview *p = arg;
	if (nsplices >= PREVIEW_CONNECTIONS_MAX) {
		log_debug("preview of port %u: %d connections already, one refused", p->port,
			  PREVIEW_CONNECTIONS_MAX);
		close(fd);
		return;
	}
	int inside = network_socket();
	if (inside < 0) {
		log_info("preview of port %u: no socket in the session: %s", p->port, strerror(errno));
		close(fd);
		return;
	}
	struct splice *s = calloc(1, sizeof *s);
	if (s == NULL) {
		close(fd);
		close(inside);
		return;
	}
	s->side[0] = bufferevent_socket_new(agent.base, fd, BEV_OPT_CLOSE_ON_FREE);
	s->side[1] = bufferevent_socket_new(agent.base, inside, BEV_OPT_CLOSE_ON_FREE);
	nsplices++;
	s->next = splices;
	if (splices)
		splices->prev = s;
	splices = s;
	if (s->side[0] == NULL || s->side[1] == NULL) {
		if (s->side[0] == NULL)
			close(fd);
		if (s->side[1] == NULL)
			close(inside);
		splice_free(s);
		return;
	}
	struct sockaddr_in to;
	memset(&to, 0, sizeof to);
	to.sin_family = AF_INET;
	to.sin_port = htons((unsigned short)p->port);
	to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; i < 2; i++) {
		bufferevent_setcb(s->side[i], on_read, on_write, on_event, s);
		/* Each read takes at most what the other side's queue has room for. */
		bufferevent_setwatermark(s->side[i], EV_READ, 0, PREVIEW_BUFFER);
	}
	if (bufferevent_socket_connect(s->side[1], (struct sockaddr *)&to, sizeof to) < 0 ||
	    bufferevent_enable(s->side[0], EV_READ | EV_WRITE) < 0 ||
	    bufferevent_enable(s->side[1], EV_READ | EV_WRITE) < 0)
		splice_free(s);
}

static void on_accept_error(struct evconnlistener *listener, void *arg)
{
	(void)listener;
	const struct preview *p = arg;
	/* Out of descriptors or memory for a moment: libevent keeps listening. */
	log_info("preview of port %u: cannot accept: %s", p->port, strerror(errno));
}

static void reply_endpoint(struct http_request *req, const struct preview *p)
{
	struct evbuffer *b = evbuffer_new();
	if (b == NULL || evbuffer_add_printf(b, "{\"port\":%u,\"endpoint\":\"http://127.0.0.1:%u\"}",
					     p->port, p->host_port) < 0) {
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "answer a preview");
		return;
	}
	reply_json(req, 200, b);
}

/* The port of {"port": N}; 0 after answering when the body says no port. */
static unsigned read_port(struct http_request *req)
{
	size_t len;
	const char *body = http_request_body(req, &len);
	if (body == NULL) {
		reply_out_of_memory(req, "read the request");
		return 0;
	}
	sk_json j;
	sk_json_init(&j, body, len);
	sk_json_str key;
	uint64_t port = 0;
	int more, seen = 0;
	const char *problem = NULL;
	if (sk_json_object_begin(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not a JSON object");
		return 0;
	}
	while ((more = sk_json_object_key(&j, &key)) == 1) {
		if (!sk_json_str_is(&key, "port")) {
			sk_json_skip(&j);
			continue;
		}
		if (seen++)
			problem = "port is given twice";
		sk_json saved = j; /* a fraction, a sign or an overflow fails the reader: rewind */
		if (sk_json_peek(&j) != SK_JSON_NUMBER || sk_json_u64(&j, &port) < 0) {
			j = saved;
			sk_json_skip(&j);
			port = 0;
		}
		if (port < 1 || port > 65535)
			problem = "port must be an integer from 1 to 65535";
	}
	if (more < 0 || sk_json_finish(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not valid JSON: %s",
			    j.err ? j.err : "malformed");
		return 0;
	}
	if (problem == NULL && !seen)
		problem = "port is required";
	if (problem) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s", problem);
		return 0;
	}
	return (unsigned)port;
}

void preview_open(struct http_request *req)
{
	unsigned port = read_port(req);
	if (port == 0)
		return;
	if (!confine_active()) {
		/* Its commands share the host's network: the port is the host's own already. */
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: this agent does not confine "
			    "its commands; port %u is this machine's own", port);
		return;
	}
	for (size_t i = 0; i < npreviews; i++)
		if (previews[i].port == port) {
			reply_endpoint(req, &previews[i]);
			return;
		}
	if (npreviews == PREVIEW_PORTS_MAX) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: a session previews at most "
			    "%d ports", PREVIEW_PORTS_MAX);
		return;
	}
	struct preview *p = &previews[npreviews];
	struct sockaddr_in at;
	memset(&at, 0, sizeof at);
	at.sin_family = AF_INET;
	at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	p->port = port;
	p->listener = evconnlistener_new_bind(agent.base, on_accept, p,
					      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
					      PREVIEW_BACKLOG, (struct sockaddr *)&at, sizeof at);
	socklen_t atlen = sizeof at;
	if (p->listener == NULL ||
	    getsockname(evconnlistener_get_fd(p->listener), (struct sockaddr *)&at, &atlen) < 0) {
		reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation 'preview a port' "
			    "failed: %s", strerror(errno));
		if (p->listener)
			evconnlistener_free(p->listener);
		p->listener = NULL;
		return;
	}
	evconnlistener_set_error_cb(p->listener, on_accept_error);
	p->host_port = ntohs(at.sin_port);
	npreviews++;
	log_info("previewing port %u of the session on 127.0.0.1:%u", port, p->host_port);
	reply_endpoint(req, p);
}

void preview_close_all(void)
{
	while (splices)
		splice_free(splices);
	while (npreviews > 0)
		evconnlistener_free(previews[--npreviews].listener);
}
