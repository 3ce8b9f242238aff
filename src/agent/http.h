/*
 * http.h — sandkit-agent's own HTTP/1.1 server on libevent bufferevents (docs/agent.md
 * "Architecture"): connections, the request head and its deadline, request bodies (buffered
 * or streamed to the handler), replies (whole, or streamed with a drain callback), and the
 * bounds that keep any number of callers from exhausting the agent. It knows HTTP and nothing
 * of the protocol served over it: its user fills struct http_config (server.c does), routes
 * and authorizes in on_head and words the server's own refusals in refuse. The listening
 * socket and the connection cap are listener.c's.
 *
 * One request at a time per connection. Once its head is in, the server calls on_head, which
 * either answers (a refusal: nothing of the body has been read) or admits the request with a
 * handler; only then is the body read. A request lives until its reply has been handed to the
 * connection in full, or until the connection dies (then its gone callback runs instead).
 */
#ifndef SANDKIT_AGENT_HTTP_H
#define SANDKIT_AGENT_HTTP_H

#include "http_parse.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct evbuffer;
struct event_base;
struct http_request;

typedef void (*http_handler)(struct http_request *req);

enum http_body_mode {
	HTTP_BODY_NONE,      /* the route takes no body: the handler runs at once, and a body sent
			      * anyway is never read into memory nor charged against the budget;
			      * it is dropped like a refused request's (or the connection closes) */
	HTTP_BODY_BUFFERED,  /* the whole body is read (bounded), then the handler runs */
	HTTP_BODY_STREAMED,  /* the handler runs at once and takes the body with http_body_stream */
};

/* Default --max-connections: a session's client keeps a handful of connections; room for a few
 * hundred concurrent streams, while the worst-case memory below stays within reach. */
#define HTTP_DEFAULT_MAX_CONNECTIONS 256
/* Default --header-timeout: a request line and headers arrive in one packet from any real
 * client; ten seconds is generous for a slow link and short enough that a slowloris that
 * sends a byte at a time holds a connection ten seconds, not for ever. */
#define HTTP_DEFAULT_HEADER_TIMEOUT_MS 10000
/* Default --body-timeout: a buffered body (at most the body limit) must arrive whole within this
 * long after its head; the largest one takes 120 s only below 0.4 MB/s. Only authorized
 * requests get this far. */
#define HTTP_DEFAULT_BODY_TIMEOUT_MS 120000
/* Default --stall-timeout: a reply, or a streamed upload, that makes no progress for this long
 * is given up. A minute outlasts any pause of a live reader or sender; a reader that stopped
 * holds its connection (and a command blocked on its output, a file, a job's pin) no longer. */
#define HTTP_DEFAULT_STALL_TIMEOUT_MS 60000

struct http_config {
	struct event_base *base;     /* the loop the listener and every connection run on */
	const char *host;
	unsigned port;
	/* Non-NULL: listen on a Unix socket made at this path, mode 0600, instead of host and
	 * port; at most SK_UNIX_SOCKET_PATH_MAX bytes (common/unix_socket.h). */
	const char *socket_path;
	unsigned max_connections;
	/* The connection cap is lowered to what RLIMIT_NOFILE leaves after fds_reserved, at
	 * fds_per_connection descriptors each (what serving one request may hold at once). */
	unsigned fds_per_connection;
	unsigned fds_reserved;
	unsigned header_timeout_ms;
	unsigned body_timeout_ms;
	unsigned stall_timeout_ms;
	uint64_t body_max;   /* largest buffered body; streamed bodies have no limit */
	/* The text/plain body of the 503 a connection over the cap gets before it is closed,
	 * when no connection could be evicted for it. */
	const char *busy_text;
	/* Called with every admitted head. Answers the request itself (returns NULL) or returns
	 * the handler and sets *mode. */
	http_handler (*on_head)(struct http_request *req, enum http_body_mode *mode);
	/* Answers a refusal of the server's own with status, why in words: a head that does not
	 * parse (http_parse_head's status and why) or is over HTTP_HEAD_MAX (431), a body over
	 * body_max (413) or malformed (400), bodies in flight over their budget (503), memory
	 * that ran out (500), a head on_head neither answered nor admitted (500). */
	void (*refuse)(struct http_request *req, int status, const char *why);
};

/* Binds and starts accepting; *port receives the port actually bound. -1 with errno. */
int http_start(const struct http_config *cfg, unsigned *port);
/* Closes every connection (gone callbacks run) and the listener. */
void http_stop(void);
/* The connection cap in force: max_connections, lowered to what RLIMIT_NOFILE allows
 * (listener.c). */
unsigned http_max_connections(void);

/* Sets on the listening socket fd the options every connection needs (no Nagle delay, TCP
 * keep-alive): Linux hands them on to each socket accept() returns, which then needs no system
 * call of its own for them. */
void http_listening_options(int fd);

/* The request. */
const struct http_head *http_request_head(const struct http_request *req);
/* The buffered body (HTTP_BODY_BUFFERED) as one span; "" when there is none; NULL when memory
 * ran out making it contiguous. */
const char *http_request_body(struct http_request *req, size_t *len);

/* Adds a header to the reply (before it starts). name and value are the agent's own text. */
int http_add_header(struct http_request *req, const char *name, const char *value);

/* A whole reply; body may be NULL (no body) and is consumed. The request is finished after.
 * Only for small bodies (errors, JSON of a few KB): anything that can be large is streamed, so
 * that no connection holds more than HTTP_OUTPUT_HIGH for a caller who does not read. */
void http_reply(struct http_request *req, int status, const char *content_type,
		struct evbuffer *body);

/*
 * A streamed reply: content_length >= 0 announces the length, -1 makes it chunked. Chunks are
 * moved out of b. http_reply_end finishes the request (a Content-Length reply that is short of
 * its length, or a reply that was cut, makes the connection close, which the caller sees as a
 * cut body).
 */
int http_reply_start(struct http_request *req, int status, const char *content_type,
		     int64_t content_length);
int http_reply_chunk(struct http_request *req, struct evbuffer *b);
void http_reply_end(struct http_request *req);
/* Marks a streamed reply as cut short (a piece could not be made or queued; http_reply_chunk
 * does it itself when it fails): no more pieces go out, http_reply_end writes no ending, and
 * the connection closes, so that no caller takes what it got for a whole body. */
void http_reply_cut(struct http_request *req);

/*
 * The next len bytes of a reply of a known length (never chunked), taken from the regular file
 * fd from offset off on and moved into the socket by sendfile(2), never through the agent's
 * memory. Only where nothing of the reply waits in the output buffer, so that no byte can
 * overtake another: 1 when that is not so, and nothing was taken (the caller queues the bytes
 * itself). 0 when they went; 2 when the socket took part of them: the rest goes from a
 * duplicate of fd as the socket takes it (the caller's offset untouched), before anything
 * queued after, counted by http_reply_queued meanwhile, and the drain callback runs once it
 * went; the stall timeout runs while the socket takes none. -1 when sending failed at once
 * (the file ended early, the connection failed): the reply is cut. A file that ends early
 * later cuts the reply as well, and the connection closes short of the announced length.
 */
int http_reply_file(struct http_request *req, int fd, off_t off, size_t len);

/*
 * Bytes of this request's reply waiting for the caller to read them. A producer stops at
 * HTTP_OUTPUT_HIGH and waits for the drain callback, which runs when the connection's queue
 * fell to HTTP_OUTPUT_LOW. gone runs (once) if the caller goes away before the reply ended;
 * the request is freed right after it.
 */
size_t http_reply_queued(const struct http_request *req);

/*
 * Keeps at most about `bytes` of this connection's replies unsent in the kernel (0: the
 * kernel's default again). A loopback socket's send buffer starts at the kernel's maximum
 * (4 MiB here), which would take a whole reply a caller does not read out of the agent's
 * accounting: a producer that budgets what its callers have not taken sets this, so that
 * what they leave stays where its budget counts it.
 */
void http_reply_hold_unsent(struct http_request *req, int bytes);
void http_reply_watch(struct http_request *req, void (*drain)(void *ctx), void (*gone)(void *ctx),
		      void *ctx);

/* Per connection: what a streaming producer queues before waiting for the caller. 128 KiB keeps
 * a loopback stream at full speed (the kernel's socket buffer holds far more) while a thousand
 * stalled readers cost 128 MiB at most. */
#define HTTP_OUTPUT_HIGH (128 * 1024)
#define HTTP_OUTPUT_LOW (32 * 1024)

/*
 * Takes the body of an HTTP_BODY_STREAMED request as it arrives, in pieces of at most
 * HTTP_BODY_PIECE bytes; the next piece is read only after data returned. data returns 0 to
 * go on, -1 to stop (then the handler has answered). end runs once: complete = 1 after the
 * whole body (the handler then answers), 0 when the caller went away or stalled (no answer is
 * possible; the request is freed after end returns). A caller that asked for 100-continue is
 * invited here, so a handler that refuses the request before calling this never invites it.
 */
#define HTTP_BODY_PIECE (64 * 1024)
void http_body_stream(struct http_request *req, int (*data)(void *ctx, const char *p, size_t n),
		      void (*end)(void *ctx, int complete), void *ctx);
/* Stops handing over pieces (data may call it) until http_body_resume: the caller's bytes then
 * wait in its socket, the connection holding at most its input bound. The stall timeout runs
 * on meanwhile, so a pause nobody ends closes the connection like a stalled caller. */
void http_body_pause(struct http_request *req);
void http_body_resume(struct http_request *req);

/*
 * As http_body_stream, for a body that goes unchanged into the file fd: what arrived with the
 * head still goes through data, and a body of a known length of at least HTTP_SPLICE_MIN is
 * then moved from the socket into fd by splice(2) through a pipe, never read by the agent.
 * failed(ctx, err) is told when writing fd failed with errno err; it answers, as data does
 * before it returns -1.
 */
#define HTTP_SPLICE_MIN (1024 * 1024)
void http_body_stream_to_fd(struct http_request *req, int (*data)(void *ctx, const char *p, size_t n),
			    void (*end)(void *ctx, int complete), void (*failed)(void *ctx, int err),
			    void *ctx, int fd);

/*
 * While a streamed body is taken (http_body_stream), has its next bytes go from the socket
 * straight into the pipe fd by splice(2), never read by the agent, instead of through data:
 * what the connection already read still goes through data first (it reads nothing more ahead
 * meanwhile), and a pause holds the splice as it holds the pieces. Each splice moves what the
 * socket holds and the pipe has room for; a full pipe's room is waited for, never blocked on.
 * moved(ctx, n) hears of each n bytes moved and returns 0 to go on, or -1 to have the rest go
 * through data again (as http_body_unsplice does); failed(ctx, EPIPE) is told when nobody
 * reads the pipe any more, and answers as data does before it returns -1. The connection
 * splices through a duplicate of fd of its own, so the caller may close fd at any time.
 * -1 for a body that cannot be spliced (chunked): it goes on through data.
 * Neither this nor http_body_unsplice calls anything of the handler's at once: the next bytes
 * go on as the connection reads them, or when a pause ends.
 */
int http_body_splice_pipe(struct http_request *req, int fd, int (*moved)(void *ctx, size_t n),
			  void (*failed)(void *ctx, int err));
void http_body_unsplice(struct http_request *req);

#endif
