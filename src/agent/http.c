/* http.c — see http.h. */
#include "http.h"

#include "listener.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>

/* Keep-alive: a connection with no request in progress is closed after this long. Clients
 * keep pooled connections about this long, and an idle one costs a socket and a few hundred
 * bytes; the connection cap bounds how many there can be. */
#define IDLE_TIMEOUT_S 60
/* TCP keep-alive (tcp(7)): a connection silent this long is probed, every interval, and given
 * up after that many probes go unanswered. A caller whose machine or network vanished without
 * a FIN or a reset otherwise holds its slot (and a silent command's stream, which no write
 * deadline can end) for ever; this frees it within about a minute, at the cost of one small
 * packet per silent connection every half minute. A live caller's kernel answers the probes. */
#define KEEPALIVE_IDLE_S 30
#define KEEPALIVE_INTERVAL_S 10
#define KEEPALIVE_PROBES 3
/* Input held while a request is being answered: one pipelined head. More than that while the
 * reply is still being produced is no client of this protocol (none pipelines), and reading
 * it into memory is what an attacker wants; the connection is taken as gone instead. */
#define PIPELINE_MAX HTTP_HEAD_MAX
/* The bufferevent stops reading past this much unprocessed input. */
#define INPUT_HIGH (256 * 1024)
/* A refused request's body up to this size is read and dropped so the connection can carry the
 * next request; a longer one closes the connection instead of costing the agent its transfer. */
#define DISCARD_MAX (64 * 1024)
/* Bytes one read or write call on a connection moves at most: a stream's queue at its high
 * watermark and a whole frame behind it, or an upload's input up to INPUT_HIGH. */
#define SINGLE_IO_MAX (256 * 1024)
/* After the last reply of a connection that closes, the agent stops writing and reads (and
 * drops) what the caller is still sending for this long or this many bytes, so that the caller
 * reads the reply instead of a reset. Both bounds make a refusal cheap. */
#define CLOSE_LINGER_MS 1000
#define CLOSE_LINGER_MAX (1024 * 1024)
/* Why a buffered body is refused, whether its Content-Length or its chunks say so. */
#define BODY_TOO_LARGE "Request invalid: the body is over the agent's limit"

enum conn_state {
	C_IDLE,      /* waiting for the first byte of a request */
	C_HEAD,      /* reading a head, against the header deadline */
	C_BODY,      /* reading an admitted request's body */
	C_BUSY,      /* the handler or its reply has the connection */
	C_CLOSING,   /* the last reply written; draining what the caller still sends */
};

struct conn {
	struct listener_entry entry;  /* its place in the set the connection cap counts */
	struct bufferevent *bev;
	struct event *timer;
	enum conn_state state;
	uint64_t since_ms;       /* when the state was entered: the oldest idle is evicted first */
	struct http_request *req;
	int close_after;         /* close once the output is flushed */
	uint64_t discard;        /* body bytes of a refused request still to drop */
	size_t lingered;
	/* The head search resumes where the last one stopped, so that a head sent a byte at a
	 * time costs its length, not its length squared: input bytes from 0 to head_scan hold no
	 * head end; head_lead says whether the empty lines before the request line are behind. */
	size_t head_scan;
	int head_lead;
	int depth;               /* >0 while the connection's own callbacks run: no freeing then */
	int dead;                /* closed while depth > 0; freed when it returns to 0 */
	/* While a body is spliced: the socket's own read event (libevent reads nothing
	 * meanwhile), and either the pipe between socket and file, or the connection's own
	 * duplicate of the pipe the body goes into (sink_pipe) with the event that waits for its
	 * room while it is full; -1 where there is none. */
	struct event *splice_ev;
	int pipe_fd[2];
	int sink_pipe;
	struct event *sink_ev;
	/* File bytes of a reply the socket has not taken yet (http_reply_file): owed bytes of
	 * owed_fd, the connection's duplicate of the file, from owed_off on, sent as the socket
	 * takes them and before anything else; libevent writes nothing meanwhile. owed_ev (kept
	 * once made) waits for the socket's room. */
	struct event *owed_ev;
	int owed_fd;
	off_t owed_off;
	size_t owed;
};

struct http_request {
	struct conn *conn;
	char *head_buf;
	struct http_head head;
	struct evbuffer *headers;    /* extra reply header lines */
	enum http_body_mode mode;
	http_handler handler;
	/* the request body */
	struct evbuffer *body;       /* buffered mode */
	uint64_t body_left;          /* Content-Length bytes still to read */
	uint64_t reserved;           /* charged against the in-flight body budget */
	struct http_chunked ck;
	int body_done;
	int continued;               /* 100 Continue was sent: the caller is sending the body */
	int body_paused;             /* http_body_pause: no piece until http_body_resume */
	int (*on_data)(void *, const char *, size_t);
	void (*on_end)(void *, int);
	void (*on_sink_failed)(void *, int);
	int sink_fd;                 /* >= 0: the body may be spliced into it */
	/* >= 0: the body's next bytes go into this pipe (http_body_splice_pipe) */
	int splice_pipe;
	int (*on_moved)(void *, size_t);
	void *body_ctx;
	/* the reply */
	int replying;                /* a streamed reply started */
	int finished;                /* the reply was handed over in full */
	int reply_chunked;
	int reply_to_close;          /* HTTP/1.0, length unknown: the body ends with the connection */
	int cut;                     /* the streamed reply lost a piece: it must not end as whole */
	int64_t reply_left;          /* Content-Length bytes of a streamed reply still owed */
	void (*drain)(void *);
	void (*gone)(void *);
	void *watch_ctx;
};

static struct http_server {
	struct http_config cfg;
	uint64_t body_bytes, body_budget;    /* buffered bodies in flight, and their bound */
} srv;

static void process(struct conn *c);

static uint64_t now_ms(void)
{
	return util_now_us() / 1000;
}

static void set_state(struct conn *c, enum conn_state s)
{
	c->state = s;
	c->since_ms = now_ms();
}

static struct timeval timeval_of(unsigned ms)
{
	struct timeval tv = { ms / 1000, (suseconds_t)(ms % 1000) * 1000 };
	return tv;
}

static void arm(struct conn *c, unsigned ms)
{
	struct timeval tv = timeval_of(ms);
	evtimer_add(c->timer, &tv);
}

const char *http_reason(int status)
{
	switch (status) {
	case 100: return "Continue";
	case 200: return "OK";
	case 204: return "No Content";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 409: return "Conflict";
	case 413: return "Content Too Large";
	case 417: return "Expectation Failed";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	default: return "Status";
	}
}

/* ---- requests ---- */

static void request_free(struct http_request *req)
{
	srv.body_bytes -= req->reserved;
	if (req->body)
		evbuffer_free(req->body);
	if (req->headers)
		evbuffer_free(req->headers);
	free(req->head_buf);
	free(req);
}

const struct http_head *http_request_head(const struct http_request *req)
{
	return &req->head;
}

const char *http_request_body(struct http_request *req, size_t *len)
{
	*len = req->body ? evbuffer_get_length(req->body) : 0;
	if (*len == 0)
		return "";
	return (const char *)evbuffer_pullup(req->body, -1);
}

int http_add_header(struct http_request *req, const char *name, const char *value)
{
	if (req->headers == NULL && (req->headers = evbuffer_new()) == NULL)
		return -1;
	return evbuffer_add_printf(req->headers, "%s: %s\r\n", name, value) < 0 ? -1 : 0;
}

static void settle_body(struct http_request *req);

/* libevent writes the output buffer from here on, unless file bytes are still owed: then once
 * they went (owed_sent), so that nothing overtakes them. */
static void enable_writes(struct conn *c)
{
	if (c->owed == 0)
		bufferevent_enable(c->bev, EV_WRITE);
}

/* Status line and headers. length < 0: chunked, or, to an HTTP/1.0 caller, which knows no
 * chunked coding (RFC 9112 §6.1), the body runs to the connection's end; no Content-Length for
 * 204. From here on, a reply the caller stops taking is given up after the stall timeout: the
 * write deadline runs only while bytes wait for the caller, so a stream waiting on a silent
 * command is not cut, while one waiting on its reader is. */
static int write_head(struct http_request *req, int status, const char *content_type,
		      int64_t length)
{
	struct conn *c = req->conn;
	struct evbuffer *out = bufferevent_get_output(c->bev);
	struct timeval stall = timeval_of(srv.cfg.stall_timeout_ms);
	bufferevent_set_timeouts(c->bev, NULL, &stall);
	enable_writes(c);
	settle_body(req);
	if (!req->head.keep_alive)
		c->close_after = 1;
	if (length < 0 && req->head.minor == 0) {
		req->reply_to_close = 1;
		c->close_after = 1;
	}
	int r = evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", status, http_reason(status));
	if (r >= 0 && content_type)
		r = evbuffer_add_printf(out, "Content-Type: %s\r\n", content_type);
	if (r >= 0 && req->reply_to_close)
		; /* neither a length nor a coding: the close ends the body */
	else if (r >= 0 && length < 0)
		r = evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
	else if (r >= 0 && status != 204)
		r = evbuffer_add_printf(out, "Content-Length: %lld\r\n", (long long)length);
	if (r >= 0 && req->headers)
		r = evbuffer_add_buffer(out, req->headers);
	/* The caller learns the connection ends with this reply; then it is ended. */
	if (r >= 0 && c->close_after)
		r = evbuffer_add(out, "Connection: close\r\n", 19);
	if (r >= 0)
		r = evbuffer_add(out, "\r\n", 2);
	return r < 0 ? -1 : 0;
}

static void kick(struct conn *c);

/* A reply before the body was read to its end: the next request's start is unknown, so the
 * connection ends after this reply, unless what is left is short enough to drop. Decided
 * before the head is written, which says so. */
static void settle_body(struct http_request *req)
{
	if (req->body_done)
		return;
	/* A caller that asked for 100-continue and was not invited may never send the body (RFC
	 * 9110 §10.1.1): waiting to drop it would read its next request as this body. */
	int may_not_come = req->head.expect_continue && !req->continued;
	if (!req->head.chunked && req->body_left <= DISCARD_MAX && !req->on_data && !may_not_come)
		req->conn->discard = req->body_left;
	else
		req->conn->close_after = 1;
	req->body_done = 1;
}

/* Writes what the output holds now rather than a loop turn later, when libevent's write event
 * would (an epoll_ctl, an epoll_wait and then the same writev): a reply's last bytes, the exit
 * frame of a short command above all, are what its caller waits for. It is the write libevent's
 * own write callback makes, front unfrozen for it as there; the write event, already added,
 * then finds less or nothing to write and moves the connection on as before, or meets the
 * write's error again and closes it. */
static void write_now(struct conn *c)
{
	struct evbuffer *out = bufferevent_get_output(c->bev);
	if (c->owed > 0 || evbuffer_get_length(out) == 0 ||
	    !(bufferevent_get_enabled(c->bev) & EV_WRITE))
		return;
	evbuffer_unfreeze(out, 1);
	evbuffer_write_atmost(out, bufferevent_getfd(c->bev), SINGLE_IO_MAX);
	evbuffer_freeze(out, 1);
}

static void finish(struct http_request *req)
{
	req->finished = 1;
	settle_body(req);
	write_now(req->conn);
	kick(req->conn);
}

void http_reply(struct http_request *req, int status, const char *content_type,
		struct evbuffer *body)
{
	struct conn *c = req->conn;
	if (req->finished || req->replying) {
		/* A second answer to one request would be read as the answer to the next. */
		log_info("a reply to an answered request was dropped (status %d)", status);
		if (body)
			evbuffer_free(body);
		return;
	}
	size_t len = body ? evbuffer_get_length(body) : 0;
	if (write_head(req, status, body ? content_type : NULL, (int64_t)len) < 0 ||
	    (body && req->head.method != HTTP_HEAD &&
	     evbuffer_add_buffer(bufferevent_get_output(c->bev), body) < 0))
		c->close_after = 1; /* a reply cut short must not be taken for a whole one */
	if (body)
		evbuffer_free(body);
	finish(req);
}

int http_reply_start(struct http_request *req, int status, const char *content_type,
		     int64_t content_length)
{
	req->replying = 1;
	req->reply_left = content_length;
	if (write_head(req, status, content_type, content_length) < 0) {
		http_reply_cut(req);
		return -1;
	}
	req->reply_chunked = content_length < 0 && !req->reply_to_close;
	return 0;
}

void http_reply_cut(struct http_request *req)
{
	req->cut = 1;
	req->conn->close_after = 1;
}

int http_reply_chunk(struct http_request *req, struct evbuffer *b)
{
	struct evbuffer *out = bufferevent_get_output(req->conn->bev);
	size_t n = evbuffer_get_length(b);
	if (req->cut)
		goto cut; /* a piece after a lost one would hide the gap */
	if (n == 0)
		return 0;
	if (req->reply_chunked) {
		if (evbuffer_add_printf(out, "%zx\r\n", n) < 0 || evbuffer_add_buffer(out, b) < 0 ||
		    evbuffer_add(out, "\r\n", 2) < 0)
			goto cut;
		return 0;
	}
	if (req->reply_to_close) {
		if (evbuffer_add_buffer(out, b) < 0)
			goto cut;
		return 0;
	}
	if ((int64_t)n > req->reply_left || evbuffer_add_buffer(out, b) < 0)
		goto cut;
	req->reply_left -= (int64_t)n;
	return 0;
cut:
	/* The body is now unusable; closing without its end is the only honest end. */
	http_reply_cut(req);
	evbuffer_drain(b, evbuffer_get_length(b));
	return -1;
}

void http_reply_end(struct http_request *req)
{
	struct conn *c = req->conn;
	/* A cut reply gets no terminating chunk: the caller sees the connection close mid-body
	 * (http_reply_cut set close_after). */
	if (req->reply_chunked && !req->cut) {
		if (evbuffer_add(bufferevent_get_output(c->bev), "0\r\n\r\n", 5) < 0)
			c->close_after = 1;
	} else if (!req->reply_chunked && !req->reply_to_close && req->reply_left != 0) {
		c->close_after = 1;
	}
	req->drain = NULL;
	req->gone = NULL;
	finish(req);
}

size_t http_reply_queued(const struct http_request *req)
{
	return evbuffer_get_length(bufferevent_get_output(req->conn->bev)) + req->conn->owed;
}

/* Sends the owed file bytes as far as the socket takes them: 1 when all of them went, 0 when
 * the socket is full, -1 when sending failed or the file ended before them. */
static int send_owed(struct conn *c)
{
	int sock = bufferevent_getfd(c->bev);
	while (c->owed > 0) {
		ssize_t w = sendfile(sock, c->owed_fd, &c->owed_off, c->owed);
		if (w < 0 && errno == EINTR)
			continue;
		/* A regular file never makes its reader wait: a wait is the socket's. */
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		if (w <= 0)
			return -1; /* 0: the file shrank after its length was announced */
		c->owed -= (size_t)w;
	}
	return 1;
}

/* What was owed went, or is given up: the file's duplicate goes. */
static void owed_clear(struct conn *c)
{
	c->owed = 0;
	if (c->owed_fd >= 0)
		close(c->owed_fd);
	c->owed_fd = -1;
	if (c->owed_ev)
		event_del(c->owed_ev);
}

static void start_closing(struct conn *c);
static void enter(struct conn *c);
static void leave(struct conn *c);

/* The owed bytes went: libevent writes what was queued behind them, or the request hears that
 * its queue drained, or a connection whose last reply this ended closes. */
static void owed_sent(struct conn *c)
{
	owed_clear(c);
	struct evbuffer *out = bufferevent_get_output(c->bev);
	if (c->state == C_CLOSING && c->req == NULL && evbuffer_get_length(out) == 0) {
		start_closing(c);
		return;
	}
	bufferevent_enable(c->bev, EV_WRITE);
	if (evbuffer_get_length(out) == 0 && c->req && c->req->drain && !c->req->finished)
		c->req->drain(c->req->watch_ctx);
}

/* The socket has room for owed bytes, or took none of them for the stall timeout. */
static void on_owed_room(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	struct conn *c = arg;
	enter(c);
	if (what & EV_TIMEOUT) {
		log_debug("closed a connection whose caller stopped reading");
		conn_close(c);
		leave(c);
		return;
	}
	int r = send_owed(c);
	if (r < 0) {
		conn_close(c);
	} else if (r == 0) {
		struct timeval stall = timeval_of(srv.cfg.stall_timeout_ms);
		event_add(c->owed_ev, &stall);
	} else {
		owed_sent(c);
		process(c);
	}
	leave(c);
}

int http_reply_file(struct http_request *req, int fd, off_t off, size_t len)
{
	struct conn *c = req->conn;
	if (req->cut || req->reply_chunked || req->reply_to_close || len == 0 ||
	    (int64_t)len > req->reply_left || c->owed > 0 ||
	    evbuffer_get_length(bufferevent_get_output(c->bev)) > 0)
		return 1;
	req->reply_left -= (int64_t)len;
	c->owed_fd = fd; /* the caller's own until the socket makes the bytes wait */
	c->owed_off = off;
	c->owed = len;
	int r = send_owed(c);
	if (r > 0) {
		c->owed_fd = -1;
		return 0;
	}
	struct timeval stall = timeval_of(srv.cfg.stall_timeout_ms);
	if (r == 0 && (c->owed_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) >= 0 &&
	    (c->owed_ev || (c->owed_ev = event_new(srv.cfg.base, bufferevent_getfd(c->bev), EV_WRITE,
						   on_owed_room, c)) != NULL) &&
	    event_add(c->owed_ev, &stall) == 0) {
		bufferevent_disable(c->bev, EV_WRITE);
		return 2;
	}
	/* Some of the bytes may be on their way: the reply cannot go on whole. The caller's
	 * descriptor stays the caller's. */
	if (c->owed_fd == fd)
		c->owed_fd = -1;
	owed_clear(c);
	http_reply_cut(req);
	return -1;
}

void http_reply_hold_unsent(struct http_request *req, int bytes)
{
	setsockopt(bufferevent_getfd(req->conn->bev), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes,
		   sizeof bytes);
}

void http_reply_watch(struct http_request *req, void (*drain)(void *), void (*gone)(void *),
		      void *ctx)
{
	req->drain = drain;
	req->gone = gone;
	req->watch_ctx = ctx;
}

/* Answers a caller that asked for 100-continue with it, once its body is wanted. */
static void invite(struct http_request *req)
{
	if (!req->head.expect_continue || req->continued)
		return;
	/* Without memory for these 25 bytes the caller sends its body after its own wait. */
	evbuffer_add(bufferevent_get_output(req->conn->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
	enable_writes(req->conn);
	req->continued = 1;
}

void http_body_stream(struct http_request *req, int (*data)(void *, const char *, size_t),
		      void (*end)(void *, int), void *ctx)
{
	req->on_data = data;
	req->on_end = end;
	req->body_ctx = ctx;
	/* Invited only now that the handler wants the body: a request it refused on its head (a
	 * path, a file in the way) was never told to send it (RFC 9110 §10.1.1). */
	invite(req);
	kick(req->conn);
}

void http_body_pause(struct http_request *req)
{
	req->body_paused = 1;
}

void http_body_resume(struct http_request *req)
{
	if (!req->body_paused)
		return;
	req->body_paused = 0;
	kick(req->conn);
}

void http_body_stream_to_fd(struct http_request *req, int (*data)(void *, const char *, size_t),
			    void (*end)(void *, int), void (*failed)(void *, int), void *ctx, int fd)
{
	req->on_sink_failed = failed;
	req->sink_fd = fd;
	http_body_stream(req, data, end, ctx);
}

static void stop_splice(struct conn *c, int read_again);
static void splice_when_read(struct conn *c);

int http_body_splice_pipe(struct http_request *req, int fd, int (*moved)(void *, size_t),
			  void (*failed)(void *, int))
{
	if (req->head.chunked || req->body_done)
		return -1;
	struct conn *c = req->conn;
	req->on_moved = moved;
	req->on_sink_failed = failed;
	req->splice_pipe = fd;
	/* What the connection already read goes through data; nothing more is read ahead. Read
	 * whole and waiting for the socket, the body is spliced from now on (inside the
	 * connection's own callbacks, read_body sees to it). */
	if (c->splice_ev == NULL)
		bufferevent_disable(c->bev, EV_READ);
	if (c->depth == 0 && req->on_data && !req->body_paused)
		splice_when_read(c);
	return 0;
}

void http_body_unsplice(struct http_request *req)
{
	if (req->splice_pipe < 0)
		return;
	req->splice_pipe = -1;
	struct conn *c = req->conn;
	if (c->splice_ev)
		stop_splice(c, 1);
	else
		bufferevent_enable(c->bev, EV_READ);
}

/* ---- connections ---- */

/* The pipe a splice needs at most: 1 MiB, Linux's default ceiling for an unprivileged pipe
 * (/proc/sys/fs/pipe-max-size), so that one splice can take what a wake-up finds; where it is
 * refused the pipe keeps its 64 KiB and the splice moves less at a time. */
#define SPLICE_PIPE (1024 * 1024)

static void on_splice(evutil_socket_t fd, short what, void *arg);

/* Reads of the connection go back to libevent, and the pipe goes. */
static void stop_splice(struct conn *c, int read_again)
{
	if (c->splice_ev == NULL)
		return;
	event_free(c->splice_ev);
	c->splice_ev = NULL;
	if (c->sink_ev)
		event_free(c->sink_ev);
	c->sink_ev = NULL;
	int *fds[] = { &c->pipe_fd[0], &c->pipe_fd[1], &c->sink_pipe };
	for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++)
		if (*fds[i] >= 0) {
			close(*fds[i]);
			*fds[i] = -1;
		}
	if (read_again)
		bufferevent_enable(c->bev, EV_READ);
}

/* The body's reads move from libevent to on_splice. -1 when the pipe or the event could not be
 * had: the body is then read as any other. */
static int start_splice(struct conn *c)
{
	if (pipe2(c->pipe_fd, O_NONBLOCK | O_CLOEXEC) < 0)
		return -1;
	(void)fcntl(c->pipe_fd[1], F_SETPIPE_SZ, SPLICE_PIPE);
	c->splice_ev = event_new(srv.cfg.base, bufferevent_getfd(c->bev), EV_READ | EV_PERSIST, on_splice, c);
	if (c->splice_ev == NULL || event_add(c->splice_ev, NULL) < 0) {
		if (c->splice_ev)
			event_free(c->splice_ev);
		c->splice_ev = NULL;
		close(c->pipe_fd[0]);
		close(c->pipe_fd[1]);
		c->pipe_fd[0] = c->pipe_fd[1] = -1;
		return -1;
	}
	bufferevent_disable(c->bev, EV_READ);
	return 0;
}

static void on_sink_room(evutil_socket_t fd, short what, void *arg);

/* The body's reads move from libevent to on_splice, straight into the request's pipe through a
 * duplicate of it, so that the handler may close its own at any time. -1 when the duplicate or
 * an event could not be had: the body is then read as any other. */
static int start_pipe_splice(struct conn *c)
{
	int sock = bufferevent_getfd(c->bev);
	if ((c->sink_pipe = fcntl(c->req->splice_pipe, F_DUPFD_CLOEXEC, 0)) < 0)
		return -1;
	c->splice_ev = event_new(srv.cfg.base, sock, EV_READ | EV_PERSIST, on_splice, c);
	c->sink_ev = event_new(srv.cfg.base, c->sink_pipe, EV_WRITE, on_sink_room, c);
	if (c->splice_ev == NULL || c->sink_ev == NULL || event_add(c->splice_ev, NULL) < 0) {
		if (c->splice_ev == NULL) {
			if (c->sink_ev)
				event_free(c->sink_ev);
			c->sink_ev = NULL;
			close(c->sink_pipe);
			c->sink_pipe = -1;
		}
		stop_splice(c, 0);
		return -1;
	}
	bufferevent_disable(c->bev, EV_READ);
	return 0;
}

static void conn_free(struct conn *c)
{
	stop_splice(c, 0);
	owed_clear(c);
	if (c->owed_ev)
		event_free(c->owed_ev);
	listener_remove(&c->entry);
	event_free(c->timer);
	bufferevent_free(c->bev);
	free(c);
}

/* Ends the connection; an unfinished request hears it first. Inside one of the connection's
 * own callbacks it is only marked, and freed when the outermost one returns. */
void conn_close(struct conn *c)
{
	if (c->depth > 0) {
		c->dead = 1;
		return;
	}
	struct http_request *req = c->req;
	c->req = NULL;
	if (req) {
		c->depth++;
		if (!req->finished && req->on_end && !req->body_done) {
			req->body_done = 1;
			req->on_end(req->body_ctx, 0);
		} else if (!req->finished && req->gone) {
			req->gone(req->watch_ctx);
		}
		c->depth--;
		request_free(req);
	}
	conn_free(c);
}

static void enter(struct conn *c)
{
	c->depth++;
}

/* Leaves a callback; frees the connection if it was closed meanwhile. */
static void leave(struct conn *c)
{
	if (--c->depth == 0 && c->dead) {
		c->dead = 0;
		conn_close(c);
	}
}

/* Runs the connection from outside its callbacks (a reply that ended, a body now wanted). */
static void kick(struct conn *c)
{
	if (c->depth > 0)
		return; /* the running loop sees the change */
	enter(c);
	process(c);
	leave(c);
}

static void start_closing(struct conn *c)
{
	/* Not set_state: a closing connection keeps the since_ms of 0 end_request gave it, the
	 * first to go when the cap is reached. */
	c->state = C_CLOSING;
	c->since_ms = 0;
	shutdown(bufferevent_getfd(c->bev), SHUT_WR);
	bufferevent_disable(c->bev, EV_WRITE);
	c->lingered = 0;
	arm(c, CLOSE_LINGER_MS);
}

/* The body is in (or there is none): the handler runs. */
static void body_complete(struct conn *c)
{
	struct http_request *req = c->req;
	req->body_done = 1;
	evtimer_del(c->timer);
	set_state(c, C_BUSY);
	if (req->mode == HTTP_BODY_BUFFERED)
		req->handler(req);
	else
		req->on_end(req->body_ctx, 1);
}

/* A body to be spliced into a pipe is, once all the connection read of it went through data
 * (or libevent reads it again, when no splice could be had). */
static void splice_when_read(struct conn *c)
{
	struct http_request *req = c->req;
	if (req->splice_pipe < 0 || c->splice_ev != NULL || req->body_left == 0 ||
	    evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
		return;
	if (start_pipe_splice(c) < 0) {
		req->splice_pipe = -1;
		bufferevent_enable(c->bev, EV_READ);
	}
}

/* Moves the input the body wants. 1 when something changed, 0 when it waits for more. */
static int read_body(struct conn *c)
{
	struct http_request *req = c->req;
	struct evbuffer *in = bufferevent_get_input(c->bev);
	size_t avail = evbuffer_get_length(in);
	if (req->mode == HTTP_BODY_STREAMED && (req->on_data == NULL || req->body_paused))
		return 0; /* the handler has not asked for it yet, or asked for a pause */
	if (!req->head.chunked && req->body_left == 0) {
		body_complete(c);
		return 1;
	}
	if (avail == 0) {
		/* What came with the head went through on_data; the rest, if long, goes by splice. */
		if (req->sink_fd >= 0 && !req->head.chunked && c->splice_ev == NULL &&
		    req->body_left >= HTTP_SPLICE_MIN && start_splice(c) < 0)
			req->sink_fd = -1;
		splice_when_read(c);
		return 0;
	}
	size_t take = avail < HTTP_BODY_PIECE ? avail : HTTP_BODY_PIECE;
	const char *p = (const char *)evbuffer_pullup(in, (ev_ssize_t)take);
	if (p == NULL) {
		conn_close(c);
		return 1;
	}
	size_t used, off = 0, n = 0;
	int done;
	if (req->head.chunked) {
		int r = http_chunked_step(&req->ck, p, take, &used, &off, &n);
		if (r == HTTP_CHUNKED_ERROR) {
			evbuffer_drain(in, used);
			if (req->mode == HTTP_BODY_STREAMED) {
				conn_close(c); /* the handler hears it through end(0); no answer fits */
				return 1;
			}
			req->body_done = 1;
			c->close_after = 1;
			srv.cfg.refuse(req, 400, "Request invalid: the chunked body is malformed");
			return 1;
		}
		if (r != HTTP_CHUNKED_DATA)
			n = 0;
		done = r == HTTP_CHUNKED_DONE;
	} else {
		n = take < req->body_left ? take : (size_t)req->body_left;
		used = n;
		req->body_left -= n;
		done = req->body_left == 0;
	}
	if (req->mode == HTTP_BODY_BUFFERED) {
		if (n > 0 && req->head.chunked) {
			/* a chunked body is charged as it grows, against the same bounds */
			uint64_t have = evbuffer_get_length(req->body) + n;
			if (have > srv.cfg.body_max || srv.body_bytes + n > srv.body_budget) {
				evbuffer_drain(in, used);
				c->close_after = 1;
				req->body_done = 1;
				srv.cfg.refuse(req, 413, BODY_TOO_LARGE);
				return 1;
			}
			srv.body_bytes += n;
			req->reserved += n;
		}
		if (n > 0 && evbuffer_add(req->body, p + off, n) < 0) {
			conn_close(c);
			return 1;
		}
		evbuffer_drain(in, used);
	} else {
		int r = n > 0 ? req->on_data(req->body_ctx, p + off, n) : 0;
		evbuffer_drain(in, used);
		if (c->dead || r < 0 || req->finished)
			return 1; /* the handler refused mid-body and answered */
		arm(c, srv.cfg.stall_timeout_ms);
	}
	if (done)
		body_complete(c);
	return 1;
}

/* A head is complete: parse it, ask on_head, then read the body or run the handler. */
static void admit(struct conn *c, size_t head_len)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	struct http_request *req = calloc(1, sizeof *req);
	if (req == NULL || (req->head_buf = malloc(head_len)) == NULL) {
		free(req);
		conn_close(c);
		return;
	}
	req->conn = c;
	req->sink_fd = req->splice_pipe = -1;
	evbuffer_remove(in, req->head_buf, head_len);
	c->req = req;
	evtimer_del(c->timer);
	set_state(c, C_BUSY);
	const char *why;
	int status = http_parse_head(req->head_buf, head_len, &req->head, &why);
	req->body_left = req->head.content_length;
	req->body_done = !req->head.chunked && req->body_left == 0;
	if (status != 0) {
		/* The framing cannot be trusted: answer and end the connection. */
		req->head.keep_alive = 0;
		req->body_done = 1;
		c->close_after = 1;
		srv.cfg.refuse(req, status, why);
		return;
	}
	enum http_body_mode mode = HTTP_BODY_BUFFERED;
	http_handler h = srv.cfg.on_head(req, &mode);
	if (h == NULL || c->dead) {
		if (!req->finished && !c->dead)
			srv.cfg.refuse(req, 500, "the request was not answered");
		return;
	}
	req->handler = h;
	req->mode = mode;
	/* A route that takes no body answers without reading one: a body sent anyway costs the
	 * agent nothing but its dropping (write_head settles it), and the connection waits in a
	 * state the cap may evict, never in C_BODY. */
	if (mode == HTTP_BODY_NONE || (req->body_done && mode == HTTP_BODY_BUFFERED)) {
		h(req);
		return;
	}
	/* A streamed handler hears of an empty body through end(1) like of any other. */
	req->body_done = 0;
	if (mode == HTTP_BODY_BUFFERED) {
		uint64_t want = req->head.chunked ? 0 : req->body_left;
		if (want > srv.cfg.body_max) {
			srv.cfg.refuse(req, 413, BODY_TOO_LARGE);
			return;
		}
		if (srv.body_bytes + want > srv.body_budget) {
			srv.cfg.refuse(req, 503, "request bodies in flight exceed the agent's budget; retry");
			return;
		}
		if ((req->body = evbuffer_new()) == NULL) {
			srv.cfg.refuse(req, 500, "out of memory for the body");
			return;
		}
		req->reserved = want;
		srv.body_bytes += want;
		arm(c, srv.cfg.body_timeout_ms);
		/* Only an admitted request is invited to send its body; a streamed one is invited
		 * when its handler asks for the body (http_body_stream). */
		invite(req);
	} else {
		arm(c, srv.cfg.stall_timeout_ms);
	}
	set_state(c, C_BODY);
	if (mode == HTTP_BODY_STREAMED)
		h(req);
}

/*
 * The length of the head at the start of in (http_head_length's answer), 0 while it is not
 * all there or is over HTTP_HEAD_MAX. Each call looks only at what arrived since the last one
 * (and the 3 bytes before, for an end split across reads), with nothing made contiguous.
 */
static size_t head_length(struct conn *c, struct evbuffer *in, size_t avail)
{
	struct evbuffer_ptr at;
	/* RFC 9112 §2.2: empty lines before the request line are skipped, as http_head_length
	 * does; a lone CR waits for what follows it. */
	while (c->head_lead) {
		char two[2];
		if (c->head_scan + 2 > avail || c->head_scan >= HTTP_HEAD_MAX)
			return 0;
		if (evbuffer_ptr_set(in, &at, c->head_scan, EVBUFFER_PTR_SET) < 0 ||
		    evbuffer_copyout_from(in, &at, two, 2) != 2)
			return 0;
		if (two[0] != '\r' || two[1] != '\n')
			c->head_lead = 0;
		else
			c->head_scan += 2;
	}
	if (evbuffer_ptr_set(in, &at, c->head_scan, EVBUFFER_PTR_SET) < 0)
		return 0;
	struct evbuffer_ptr end = evbuffer_search(in, "\r\n\r\n", 4, &at);
	if (end.pos >= 0)
		return (size_t)end.pos + 4 <= HTTP_HEAD_MAX ? (size_t)end.pos + 4 : 0;
	if (avail > c->head_scan + 3)
		c->head_scan = avail - 3;
	return 0;
}

/* The reply was handed over in full: the request goes, and the connection either closes or
 * waits for the next request. */
static int end_request(struct conn *c)
{
	/* A body still being spliced, or that was to be, stopped libevent's reads: they go on. */
	if (c->splice_ev || c->req->splice_pipe >= 0) {
		stop_splice(c, 0);
		bufferevent_enable(c->bev, EV_READ);
	}
	request_free(c->req);
	c->req = NULL;
	if (c->close_after) {
		set_state(c, C_CLOSING);
		c->since_ms = 0; /* the first to go when the cap is reached */
		evtimer_del(c->timer);
		if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0 && c->owed == 0)
			start_closing(c);
		return 0;
	}
	set_state(c, C_IDLE);
	/* A refused request's body is dropped within the body deadline: the caller was given no
	 * credit, so the wait is bounded like any body's, not kept for ever. */
	if (c->discard > 0)
		arm(c, srv.cfg.body_timeout_ms);
	return 1;
}

/* While a request is answered, its input waits; past one pipelined head it is taken as gone. */
static int hold_input(struct conn *c)
{
	if (evbuffer_get_length(bufferevent_get_input(c->bev)) > PIPELINE_MAX) {
		log_debug("closed a connection that sent over %d bytes while being answered",
			  PIPELINE_MAX);
		conn_close(c);
	}
	return 0;
}

/* The last reply is out and the writing side shut: what the caller still sends is dropped,
 * up to CLOSE_LINGER_MAX, until the linger timer closes the connection. */
static int linger(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	if (c->req == NULL && evbuffer_get_length(bufferevent_get_output(c->bev)) == 0) {
		c->lingered += evbuffer_get_length(in);
		evbuffer_drain(in, evbuffer_get_length(in));
		if (c->lingered > CLOSE_LINGER_MAX)
			conn_close(c);
	}
	return 0;
}

/* A head that did not end within HTTP_HEAD_MAX: refused, and the connection ends. */
static int refuse_long_head(struct conn *c)
{
	struct http_request *req = calloc(1, sizeof *req);
	if (req == NULL) {
		conn_close(c);
		return 0;
	}
	req->conn = c;
	req->body_done = 1;
	c->req = req;
	c->close_after = 1;
	struct evbuffer *in = bufferevent_get_input(c->bev);
	evbuffer_drain(in, evbuffer_get_length(in));
	set_state(c, C_BUSY);
	srv.cfg.refuse(req, 431, HTTP_HEAD_TOO_LARGE);
	return 1;
}

/* Between requests and while a head arrives: what is left of a refused request's body is
 * dropped, then the next head is looked for and admitted once it is whole. */
static int read_head(struct conn *c)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	if (c->discard > 0) {
		size_t n = evbuffer_get_length(in);
		if (n > c->discard)
			n = (size_t)c->discard;
		evbuffer_drain(in, n);
		c->discard -= n;
		if (c->discard > 0)
			return 0;
	}
	/* A reply still waiting to be read holds back the next request: pipelining cannot pile up
	 * replies. The write callback steps again. */
	if (evbuffer_get_length(bufferevent_get_output(c->bev)) > HTTP_OUTPUT_HIGH)
		return 0;
	size_t avail = evbuffer_get_length(in);
	if (avail == 0) {
		if (c->state == C_IDLE)
			arm(c, IDLE_TIMEOUT_S * 1000);
		return 0;
	}
	if (c->state == C_IDLE) {
		set_state(c, C_HEAD);
		arm(c, srv.cfg.header_timeout_ms);
		c->head_scan = 0;
		c->head_lead = 1;
	}
	size_t hl = head_length(c, in, avail);
	if (hl > 0) {
		admit(c, hl);
		return 1;
	}
	if (avail < HTTP_HEAD_MAX)
		return 0;
	return refuse_long_head(c);
}

/* One step from what is buffered. 1 when something changed (step again), 0 when waiting. */
static int step(struct conn *c)
{
	if (c->dead)
		return 0;
	if (c->req && c->req->finished)
		return end_request(c);
	switch (c->state) {
	case C_IDLE:
	case C_HEAD:
		return read_head(c);
	case C_BODY:
		return read_body(c);
	case C_BUSY:
		return hold_input(c);
	case C_CLOSING:
		return linger(c);
	}
	return 0;
}

/* Steps until nothing changes. Runs inside enter/leave. */
static void process(struct conn *c)
{
	while (step(c))
		;
}

/* Moves what the socket holds of a spliced body into the pipe and from the pipe into the file;
 * the bytes never enter the agent. */
static void spliced(struct conn *c, int fd)
{
	struct http_request *req = c->req;
	if (req == NULL || req->finished || req->body_done || req->body_left == 0) {
		stop_splice(c, 1);
		return;
	}
	size_t want = req->body_left < SPLICE_PIPE ? (size_t)req->body_left : SPLICE_PIPE;
	ssize_t n = splice(fd, NULL, c->pipe_fd[1], NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		conn_close(c); /* the caller went away mid-body: the handler hears it through end(0) */
		return;
	}
	req->body_left -= (uint64_t)n;
	for (size_t left = (size_t)n; left > 0;) {
		ssize_t w = splice(c->pipe_fd[0], NULL, req->sink_fd, NULL, left, SPLICE_F_MOVE);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			int err = w == 0 ? EIO : errno;
			stop_splice(c, 1); /* what the pipe still holds is dropped with it */
			req->sink_fd = -1;
			req->on_sink_failed(req->body_ctx, err);
			return;
		}
		left -= (size_t)w;
	}
	arm(c, srv.cfg.stall_timeout_ms);
	if (req->body_left == 0) {
		stop_splice(c, 1);
		body_complete(c);
	}
}

/* Moves what the socket holds of the body and the request's pipe has room for, one splice a
 * wake-up; when either side has nothing to give, waits on the side that stopped it. */
static void spliced_to_pipe(struct conn *c, int fd)
{
	struct http_request *req = c->req;
	if (req != NULL && !req->finished && req->body_paused) {
		stop_splice(c, 0); /* read_body starts it again once resumed */
		return;
	}
	if (req == NULL || req->finished || req->body_done || req->body_left == 0) {
		stop_splice(c, 1);
		return;
	}
	size_t want = req->body_left < SPLICE_PIPE ? (size_t)req->body_left : SPLICE_PIPE;
	ssize_t n = splice(fd, NULL, c->sink_pipe, NULL, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
	if (n < 0 && errno == EINTR)
		return;
	if (n < 0 && errno == EAGAIN) {
		/* An empty socket or a full pipe: bytes waiting in the socket say it was the pipe,
		 * whose room is then waited for instead of a socket that would wake at once. */
		int queued = 0;
		if (ioctl(fd, FIONREAD, &queued) == 0 && queued > 0) {
			event_del(c->splice_ev);
			event_add(c->sink_ev, NULL);
		}
		return;
	}
	if (n < 0 && errno == EPIPE) {
		/* Nobody reads the pipe any more: the handler answers. */
		stop_splice(c, 1);
		req->splice_pipe = -1;
		req->on_sink_failed(req->body_ctx, EPIPE);
		return;
	}
	if (n <= 0) {
		conn_close(c); /* the caller went away mid-body: the handler hears it through end(0) */
		return;
	}
	req->body_left -= (uint64_t)n;
	arm(c, srv.cfg.stall_timeout_ms);
	int go_on = req->on_moved(req->body_ctx, (size_t)n) == 0;
	if (c->dead || req->finished)
		return;
	if (req->body_left == 0) {
		stop_splice(c, 1);
		req->splice_pipe = -1;
		body_complete(c);
	} else if (!go_on) {
		stop_splice(c, 1);
		req->splice_pipe = -1;
	}
}

static void on_splice(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct conn *c = arg;
	enter(c);
	if (c->sink_pipe >= 0)
		spliced_to_pipe(c, fd);
	else
		spliced(c, fd);
	process(c);
	leave(c);
}

/* The pipe a body goes into has room again: the socket is watched again, and read at once. */
static void on_sink_room(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct conn *c = arg;
	enter(c);
	if (c->splice_ev) {
		event_add(c->splice_ev, NULL);
		spliced_to_pipe(c, bufferevent_getfd(c->bev));
	}
	process(c);
	leave(c);
}

static void on_read(struct bufferevent *bev, void *arg)
{
	(void)bev;
	kick(arg);
}

static void on_write(struct bufferevent *bev, void *arg)
{
	struct conn *c = arg;
	if (c->state == C_CLOSING) {
		if (c->req == NULL && evbuffer_get_length(bufferevent_get_output(bev)) == 0)
			start_closing(c);
		return;
	}
	enter(c);
	if (c->req && c->req->drain && !c->req->finished)
		c->req->drain(c->req->watch_ctx);
	process(c);
	leave(c);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	struct conn *c = arg;
	/* A caller that half-closes is taken as gone: no client of this protocol sends its
	 * request and then shuts its side while expecting the reply to go on. */
	if (what & BEV_EVENT_TIMEOUT)
		log_debug("closed a connection whose caller stopped reading");
	conn_close(c);
}

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct conn *c = arg;
	if (c->state == C_HEAD)
		log_debug("closed a connection whose request head took over %u ms",
			  srv.cfg.header_timeout_ms);
	else if (c->state == C_BODY)
		log_debug("closed a connection whose request body took over %u ms",
			  srv.cfg.body_timeout_ms);
	else if (c->state == C_IDLE && c->discard > 0)
		log_debug("closed a connection whose refused request's body took over %u ms",
			  srv.cfg.body_timeout_ms);
	conn_close(c);
}

int conn_evictable(const struct conn *c, uint64_t *since_ms)
{
	*since_ms = c->since_ms;
	return c->state == C_IDLE || c->state == C_HEAD || (c->state == C_CLOSING && c->req == NULL);
}

void conn_open(int fd)
{
	struct conn *c = calloc(1, sizeof *c);
	if (c == NULL) {
		close(fd);
		return;
	}
	c->bev = bufferevent_socket_new(srv.cfg.base, fd, BEV_OPT_CLOSE_ON_FREE);
	c->timer = evtimer_new(srv.cfg.base, on_timer, c);
	if (c->bev == NULL || c->timer == NULL) {
		if (c->bev)
			bufferevent_free(c->bev);
		else
			close(fd);
		if (c->timer)
			event_free(c->timer);
		free(c);
		return;
	}
	c->pipe_fd[0] = c->pipe_fd[1] = c->sink_pipe = c->owed_fd = -1;
	bufferevent_setcb(c->bev, on_read, on_write, on_event, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, INPUT_HIGH);
	bufferevent_setwatermark(c->bev, EV_WRITE, HTTP_OUTPUT_LOW, 0);
	/* libevent moves at most 16 KiB per read or write call by default: a stream paid a loop
	 * turn (its wait, its timer reset, its write) per 16 KiB. Now one write takes whatever waits,
	 * which HTTP_OUTPUT_HIGH and a frame bound, and one read whatever INPUT_HIGH leaves room for;
	 * neither holds more than the watermarks already allowed. */
	bufferevent_set_max_single_write(c->bev, SINGLE_IO_MAX);
	bufferevent_set_max_single_read(c->bev, SINGLE_IO_MAX);
	/* Writing is enabled with the first reply (write_head): enabled now, with nothing to
	 * write, libevent would watch the socket for room at once and then stop watching, two
	 * epoll changes and a wake-up per connection for nothing. */
	bufferevent_enable(c->bev, EV_READ);
	c->entry.conn = c;
	listener_add(&c->entry);
	set_state(c, C_IDLE);
	arm(c, IDLE_TIMEOUT_S * 1000);
}

void http_listening_options(int fd)
{
	int one = 1, idle = KEEPALIVE_IDLE_S, interval = KEEPALIVE_INTERVAL_S, probes = KEEPALIVE_PROBES;
	/* Best effort: a socket without them is served all the same. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
	setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
}

int http_start(const struct http_config *cfg, unsigned *port)
{
	srv.cfg = *cfg;
	/* Two of the largest bodies at once; one alone always fits. */
	srv.body_budget = 2 * cfg->body_max;
	return listener_start(cfg, port);
}

void http_stop(void)
{
	struct conn *c;
	while ((c = listener_any()) != NULL) {
		c->depth = 0;
		conn_close(c);
	}
	listener_stop();
}
