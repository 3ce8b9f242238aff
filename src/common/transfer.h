/*
 * transfer.h — HTTP transfers on one libcurl multi handle, with no Lua in sight.
 *
 * A client owns one multi handle (connections are pooled and reused across its transfers) and
 * one epoll descriptor that gathers every socket libcurl watches, so a caller can wait on all
 * transfers at once through a single pollable descriptor plus sk_client_timeout_ms().
 *
 * Nothing here blocks or waits: sk_client_step() does whatever I/O is ready and returns.
 * Deadlines are the caller's policy; this layer reports facts a caller needs to classify an
 * outcome: whether the request left (libcurl's pre-request callback ran), whether response
 * headers arrived, the status, and whether the body ended cleanly.
 *
 * Memory: a transfer's body sits in a buffer of at most buffer_size bytes (default
 * SK_TRANSFER_BUFFER). When a chunk does not fit, the write callback pauses the transfer
 * (CURL_WRITEFUNC_PAUSE): libcurl stops reading the socket, TCP's window closes, and the
 * sender is slowed. Consuming bytes resumes it. So a slow reader costs a bounded amount of RAM.
 */
#ifndef SANDKIT_TRANSFER_H
#define SANDKIT_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "common/unix_socket.h"

/* Per-transfer body buffer: one full output frame line (a 64 KiB payload is ~87.4 KB of
 * base64 and JSON) and the next 16 KiB chunk fit in it, and 128 concurrent streams stay
 * within 16 MiB of buffers. */
#define SK_TRANSFER_BUFFER ((size_t)128 * 1024)
/* libcurl hands the write callback at most CURL_MAX_WRITE_SIZE (16 KiB) at once; a buffer
 * must hold at least one such chunk or a paused transfer could never resume. */
#define SK_TRANSFER_MIN_BUFFER ((size_t)16 * 1024)
/* What libcurl reads from the socket at once (CURLOPT_BUFFERSIZE; its default is 16 KiB), a
 * buffer each transfer holds until it is freed. Every read is a recv, a poll of the socket and,
 * on a Unix socket, a wake-up of the agent's writer for the room it made: a transfer reads
 * SK_TRANSFER_READ_MAX at once while its client's transfers hold at most
 * SK_TRANSFER_READ_BUDGET of read buffers between them (one 1 GiB stream or get then costs
 * the client a fifth less CPU than at 32 KiB), and SK_TRANSFER_READ_SIZE beyond that, so that
 * 128 streams hold 4 MiB of them (64 KiB reads put 128 streams' client within 4 MiB of its 64
 * MiB target). A client holds at most the budget plus SK_TRANSFER_READ_SIZE a transfer. Either
 * reaches the write callback in pieces of at most CURL_MAX_WRITE_SIZE. */
#define SK_TRANSFER_READ_SIZE ((long)32 * 1024)
#define SK_TRANSFER_READ_MAX ((long)256 * 1024)
#define SK_TRANSFER_READ_BUDGET ((size_t)4 * 1024 * 1024)
/* Response headers kept per transfer, names and values together; more is dropped, not kept. */
#define SK_TRANSFER_MAX_HEADER_BYTES ((size_t)16 * 1024)
#define SK_TRANSFER_MAX_HEADERS 64
/* Request headers a caller may add. */
#define SK_TRANSFER_MAX_REQUEST_HEADERS 64
/* A streamed request body waits here between the caller's feeds and libcurl's reads: four of
 * libcurl's 64 KiB upload buffers, so one feed from Lua keeps the socket busy for several
 * sends, and a file of any size goes up in this much memory. */
#define SK_TRANSFER_SEND_BUFFER ((size_t)256 * 1024)
/* The kernel's send buffer for a request body over a Unix socket (SO_SNDBUF; Linux holds
 * twice it, within net.core.wmem_max). At the default (net.core.wmem_default, 208 KiB) a 1 GiB
 * put woke the agent about 6,000 times, each wake-up a splice of some 170 KiB; at this, the put
 * ran 3155-4440 MB/s where it ran 2638-2982, the agent's CPU 0.22 s where it was 0.31. Kernel
 * memory, held only while the agent is slower than the sender, for a transfer with a body. */
#define SK_TRANSFER_UNIX_SEND_BUFFER (1024 * 1024)
/* PEM text handed in memory (a CA bundle, a client certificate or key): a kubeconfig's CA is a
 * few kilobytes and Debian's whole system bundle about 220 KB, so a megabyte is never a real
 * one cut short. */
#define SK_TRANSFER_MAX_PEM ((size_t)1024 * 1024)
/* A DNS name is at most 253 characters (RFC 1035 §2.3.4). */
#define SK_TRANSFER_MAX_SERVER_NAME 253

typedef struct sk_client sk_client;
typedef struct sk_transfer sk_transfer;

struct sk_client_options {
	const char *user_agent;
};

struct sk_request {
	const char *method; /* GET, POST, PUT, DELETE, … */
	const char *url;
	const char *const *headers; /* "Name: value" lines */
	size_t header_count;
	const char *body; /* not copied: must outlive the transfer; NULL for none */
	size_t body_len;
	/* Never send this request on a pooled connection. libcurl silently resends a request
	 * whose reused connection turns out dead; for a request that may start a command, that
	 * resend could run it twice. A fresh connection has no such retry, and it is closed when
	 * the request is over, never pooled for another. */
	int fresh_connect;
	const char *ca_file;     /* NULL: the system's trust store */
	/* TLS material in memory, PEM text (not copied: libcurl copies it at start). ca_pem is the
	 * only trust for the request — the system store is not consulted — and excludes ca_file;
	 * a client certificate and its key (mTLS) come together or not at all. */
	const char *ca_pem;
	size_t ca_pem_len;
	const char *client_cert_pem;
	size_t client_cert_pem_len;
	const char *client_key_pem;
	size_t client_key_pem_len;
	/* The name the server's certificate is verified against and sent as SNI, when it is not
	 * the URL's host (a kubeconfig's tls-server-name): the connection still goes to the URL's
	 * host and port, and the Host header still names them. NULL: the URL's host. */
	const char *tls_server_name;
	const char *proxy;       /* NULL: no proxy at all, whatever the environment says */
	/* A Unix socket to connect to instead of the URL's host and port, which then only name
	 * the request (its Host header); at most SK_UNIX_SOCKET_PATH_MAX bytes. NULL: TCP. */
	const char *unix_socket;
	long connect_timeout_ms; /* 0: libcurl's default */
	size_t max_body;         /* bytes a 2xx body may have; 0: unbounded (streamed) */
	size_t max_error_body;   /* bytes a non-2xx body may have; 0: unbounded */
	size_t buffer_size;      /* 0: SK_TRANSFER_BUFFER */
	/* A body the caller feeds as it goes (sk_transfer_feed, sk_transfer_finish) instead of
	 * `body`: sent with Content-Length when body_length >= 0, chunked when it is -1. Always
	 * on a fresh connection: a stream cannot be rewound for a resend on a dead pooled one. */
	int body_stream;
	int64_t body_length;
};

struct sk_transfer_state {
	int sent;         /* the request went out on a connection */
	int headers;      /* a final status line and its headers arrived */
	long status;      /* HTTP status, 0 before headers */
	int done;         /* libcurl finished with the transfer */
	int ok;           /* done, and the body ended cleanly */
	int too_long;     /* the body passed its bound (max_body or max_error_body) */
	int result;       /* libcurl's CURLcode when done */
	const char *error; /* libcurl's message when done and not ok */
	uint64_t received; /* body bytes accepted so far */
	uint64_t uploaded; /* streamed request body bytes libcurl has taken */
	long read_size;    /* what libcurl reads from the socket at once (SK_TRANSFER_READ_*) */
	/* Counts events a waiter may care about (headers, body bytes, the end): a scheduler that
	 * saw it unchanged knows this transfer has nothing new for its reader. */
	uint64_t progress;
};

/* Returns NULL and fills err (errlen bytes) when the client cannot be made. */
sk_client *sk_client_new(const struct sk_client_options *opt, char *err, size_t errlen);
/* Ends every transfer still open, then frees the client. */
void sk_client_free(sk_client *c);

/* The descriptor that is readable whenever a step() may make progress. */
int sk_client_fd(const sk_client *c);
/* Milliseconds until libcurl's next timer must run; -1 when none is due. */
long sk_client_timeout_ms(sk_client *c);
/* Performs ready I/O and due timers without blocking. Returns 0, or -1 on a multi error. */
int sk_client_step(sk_client *c);
int sk_client_transfers(const sk_client *c);

/* Starts a request; returns NULL and fills err when it cannot be started. */
sk_transfer *sk_transfer_start(sk_client *c, const struct sk_request *req, char *err, size_t errlen);
/* Stops the transfer (closing its connection if it is mid-body) and frees it. */
void sk_transfer_free(sk_transfer *t);

void sk_transfer_state(const sk_transfer *t, struct sk_transfer_state *st);
uint64_t sk_transfer_progress(const sk_transfer *t);
/* Response header i (0-based) as name/value spans, or 0 when there is no such header. */
int sk_transfer_header(const sk_transfer *t, int i, const char **name, size_t *name_len,
                       const char **value, size_t *value_len);

/* The unread body bytes: a view valid until the next call on this transfer or its client. */
const char *sk_transfer_peek(const sk_transfer *t, size_t *len);
/* Marks n bytes of the view as read; resumes a paused transfer once there is room. */
void sk_transfer_consume(sk_transfer *t, size_t n);
/* The same read into a file (a session's file got into a local one): the unread body bytes are
 * written to fd as they lie in the buffer, with no copy through the caller, and consumed as far
 * as they were written. The file must not block a write (a regular file). Returns the bytes
 * written (0 when none are buffered), or -1 with errno set by the write. */
long sk_transfer_drain_fd(sk_transfer *t, int fd);
/* Whether the transfer waits for its reader: its buffer could not take the last chunk, and
 * nothing more arrives until bytes are consumed. */
int sk_transfer_paused(const sk_transfer *t);

/* Streamed request bodies (body_stream). Copies up to len bytes into the send buffer and
 * returns how many it took (0 when full: wait for the transfer's progress, then feed the
 * rest); -1 when the transfer has no streamed body, its body was finished, the bytes would
 * pass its body_length, or memory ran out. A body finished short of its body_length fails. */
long sk_transfer_feed(sk_transfer *t, const char *data, size_t len);
/* The same from a file (a local file put into a session): the next bytes are read straight
 * into the send buffer, at the offset of the bytes fed so far (pread), so the descriptor's own
 * position and a stdio buffer over it do not matter; no copy passes through the caller. The
 * file must not block a read (a regular file; the caller reads a pipe with its own waits).
 * Returns the bytes taken (0 when full), SK_FEED_END when the file holds no more,
 * SK_FEED_PAST when it holds more than body_length, SK_FEED_REFUSED when the transfer has no
 * streamed body or it was finished, or -1 with errno set (ENOMEM, or the read's own). */
#define SK_FEED_END (-2L)
#define SK_FEED_PAST (-3L)
#define SK_FEED_REFUSED (-4L)
long sk_transfer_feed_fd(sk_transfer *t, int fd);
/* Marks the end of the streamed body; libcurl ends it once the buffer drained. */
void sk_transfer_finish(sk_transfer *t);

#endif
