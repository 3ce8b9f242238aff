/* transfer.c — see transfer.h. */
#include "transfer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

struct header_span {
	uint16_t name, name_len, value, value_len;
};

struct sk_transfer {
	sk_client *client;
	sk_transfer *prev, *next;
	CURL *easy;
	struct curl_slist *request_headers;
	struct curl_slist *connect_to; /* with tls_server_name: where the connection really goes */
	int in_multi;

	int sent, headers, done, too_long, paused;
	uint64_t progress;
	long status;
	CURLcode result;
	uint64_t received;
	size_t max_body, max_error_body;
	char errbuf[CURL_ERROR_SIZE];

	/* Unread body bytes are buf[start, start + len); cap is the bound (see transfer.h). */
	char *buf;
	size_t cap, start, len, buffer_size;
	long read_size;              /* libcurl's read buffer (transfer.h), counted by its client */

	/* A streamed request body: fed bytes libcurl has not read yet are
	 * send_buf[send_start, send_start + send_len), at most SK_TRANSFER_SEND_BUFFER. */
	int streaming, send_finished, send_paused;
	char *send_buf;
	size_t send_start, send_len;
	uint64_t uploaded;
	/* The announced length (-1: chunked) and the bytes fed so far, which never pass it: bytes
	 * past a Content-Length would be read as the start of another request. */
	int64_t send_length;
	uint64_t fed;

	struct header_span header[SK_TRANSFER_MAX_HEADERS];
	int header_count;
	size_t header_used;
	/* Last: sk_transfer_start zeroes everything before it. */
	char header_bytes[SK_TRANSFER_MAX_HEADER_BYTES];
};

struct sk_client {
	CURLM *multi;
	int epfd;
	int64_t timer_deadline_ms; /* monotonic; -1 when libcurl wants no timer */
	sk_transfer *transfers;
	int transfer_count;
	size_t read_buffers;        /* the read sizes of its transfers, summed (transfer.h) */
	char *user_agent;
};

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* libcurl tells us which sockets it wants watched; they all live in one epoll set. */
static int on_socket(CURL *easy, curl_socket_t s, int what, void *clientp, void *socketp)
{
	sk_client *c = clientp;
	(void)easy;
	if (what == CURL_POLL_REMOVE) {
		epoll_ctl(c->epfd, EPOLL_CTL_DEL, s, NULL);
		return 0;
	}
	struct epoll_event ev;
	memset(&ev, 0, sizeof ev);
	ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
	ev.data.fd = s;
	/* libcurl hands back what curl_multi_assign gave a socket until it asks for the socket's
	 * removal: a socket seen first is added, one seen before is changed, a system call each
	 * (every connection and every resumed pause used to pay a failed change first). The
	 * other verb still follows a refusal: a descriptor number can come back after a close
	 * that epoll already forgot, or still be registered from before. */
	int op = socketp ? EPOLL_CTL_MOD : EPOLL_CTL_ADD;
	if (epoll_ctl(c->epfd, op, s, &ev) < 0) {
		if (errno == ENOENT)
			epoll_ctl(c->epfd, EPOLL_CTL_ADD, s, &ev);
		else if (errno == EEXIST)
			epoll_ctl(c->epfd, EPOLL_CTL_MOD, s, &ev);
	}
	if (socketp == NULL)
		curl_multi_assign(c->multi, s, c);
	return 0;
}

static int on_timer(CURLM *multi, long timeout_ms, void *clientp)
{
	sk_client *c = clientp;
	(void)multi;
	c->timer_deadline_ms = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	return 0;
}

sk_client *sk_client_new(const struct sk_client_options *opt, char *err, size_t errlen)
{
	static const struct sk_client_options none = { NULL };
	if (opt == NULL)
		opt = &none;
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		snprintf(err, errlen, "libcurl could not be initialised");
		return NULL;
	}
	sk_client *c = calloc(1, sizeof *c);
	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->epfd = -1;
	c->timer_deadline_ms = -1;
	c->user_agent = dup_or_null(opt->user_agent);
	if (opt->user_agent && !c->user_agent) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	c->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (c->epfd < 0) {
		snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
		goto fail;
	}
	c->multi = curl_multi_init();
	if (c->multi == NULL) {
		snprintf(err, errlen, "curl_multi_init failed");
		goto fail;
	}
	curl_multi_setopt(c->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
	curl_multi_setopt(c->multi, CURLMOPT_SOCKETDATA, c);
	curl_multi_setopt(c->multi, CURLMOPT_TIMERFUNCTION, on_timer);
	curl_multi_setopt(c->multi, CURLMOPT_TIMERDATA, c);
	return c;
fail:
	if (c->epfd >= 0)
		close(c->epfd);
	free(c->user_agent);
	free(c);
	return NULL;
}

static void detach(sk_transfer *t)
{
	sk_client *c = t->client;
	if (c == NULL)
		return;
	if (t->in_multi)
		curl_multi_remove_handle(c->multi, t->easy);
	t->in_multi = 0;
	if (t->prev)
		t->prev->next = t->next;
	else
		c->transfers = t->next;
	if (t->next)
		t->next->prev = t->prev;
	c->transfer_count--;
	c->read_buffers -= (size_t)t->read_size;
	t->client = NULL;
	t->prev = t->next = NULL;
}

void sk_client_free(sk_client *c)
{
	if (c == NULL)
		return;
	/* The transfers' own owners free them later; here they only lose their connection. */
	while (c->transfers) {
		sk_transfer *t = c->transfers;
		detach(t);
		if (!t->done) {
			t->done = 1;
			t->progress++;
			t->result = CURLE_ABORTED_BY_CALLBACK;
			snprintf(t->errbuf, sizeof t->errbuf, "the client was closed");
		}
	}
	curl_multi_cleanup(c->multi);
	close(c->epfd);
	free(c->user_agent);
	free(c);
}

int sk_client_fd(const sk_client *c)
{
	return c->epfd;
}

int sk_client_transfers(const sk_client *c)
{
	return c->transfer_count;
}

long sk_client_timeout_ms(sk_client *c)
{
	if (c->timer_deadline_ms < 0)
		return -1;
	int64_t left = c->timer_deadline_ms - now_ms();
	return left < 0 ? 0 : (long)left;
}

static void collect_done(sk_client *c)
{
	CURLMsg *msg;
	int queued;
	while ((msg = curl_multi_info_read(c->multi, &queued)) != NULL) {
		if (msg->msg != CURLMSG_DONE)
			continue;
		sk_transfer *t = NULL;
		curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
		if (t == NULL)
			continue;
		t->done = 1;
		t->progress++;
		t->result = msg->data.result;
		if (t->result != CURLE_OK && t->errbuf[0] == '\0')
			snprintf(t->errbuf, sizeof t->errbuf, "%s", curl_easy_strerror(t->result));
		/* Out of the multi at once, so its connection goes back to the pool for reuse. */
		curl_multi_remove_handle(c->multi, t->easy);
		t->in_multi = 0;
	}
}

int sk_client_step(sk_client *c)
{
	struct epoll_event ev[64];
	int running, rc = 0;
	int n = epoll_wait(c->epfd, ev, 64, 0);
	for (int i = 0; i < n; i++) {
		int flags = 0;
		if (ev[i].events & (EPOLLIN | EPOLLHUP))
			flags |= CURL_CSELECT_IN;
		if (ev[i].events & EPOLLOUT)
			flags |= CURL_CSELECT_OUT;
		if (ev[i].events & EPOLLERR)
			flags |= CURL_CSELECT_ERR;
		if (curl_multi_socket_action(c->multi, ev[i].data.fd, flags, &running) != CURLM_OK)
			rc = -1;
	}
	if (c->timer_deadline_ms >= 0 && now_ms() >= c->timer_deadline_ms) {
		c->timer_deadline_ms = -1;
		if (curl_multi_socket_action(c->multi, CURL_SOCKET_TIMEOUT, 0, &running) != CURLM_OK)
			rc = -1;
	}
	collect_done(c);
	return rc;
}

static int on_prereq(void *ud, char *primary_ip, char *local_ip, int primary_port, int local_port)
{
	sk_transfer *t = ud;
	(void)primary_ip;
	(void)local_ip;
	(void)primary_port;
	(void)local_port;
	t->sent = 1;
	return CURL_PREREQFUNC_OK;
}

static void keep_header(sk_transfer *t, const char *line, size_t len)
{
	while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == '\n'))
		len--;
	const char *colon = memchr(line, ':', len);
	if (colon == NULL || t->header_count >= SK_TRANSFER_MAX_HEADERS ||
	    len > SK_TRANSFER_MAX_HEADER_BYTES - t->header_used)
		return;
	size_t name_len = (size_t)(colon - line);
	const char *value = colon + 1;
	const char *end = line + len;
	while (value < end && (*value == ' ' || *value == '\t'))
		value++;
	struct header_span *h = &t->header[t->header_count++];
	memcpy(t->header_bytes + t->header_used, line, len);
	h->name = (uint16_t)t->header_used;
	h->name_len = (uint16_t)name_len;
	h->value = (uint16_t)(t->header_used + (size_t)(value - line));
	h->value_len = (uint16_t)(end - value);
	t->header_used += len;
}

static size_t on_header(char *line, size_t size, size_t nitems, void *ud)
{
	sk_transfer *t = ud;
	size_t len = size * nitems;
	if (t->headers)
		return len; /* trailers: not part of what a caller classifies */
	if (len >= 5 && memcmp(line, "HTTP/", 5) == 0) {
		/* A new status line starts a new response (after a 1xx): forget the last one's. */
		t->header_count = 0;
		t->header_used = 0;
		return len;
	}
	if (len <= 2 && (line[0] == '\r' || line[0] == '\n')) {
		long status = 0;
		curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &status);
		if (status >= 200) {
			t->status = status;
			t->headers = 1;
			t->progress++;
		}
		return len;
	}
	keep_header(t, line, len);
	return len;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
	sk_transfer *t = ud;
	size_t n = size * nmemb;
	int success = t->status >= 200 && t->status < 300;
	size_t bound = success ? t->max_body : t->max_error_body;
	if (bound && t->received + n > bound) {
		t->too_long = 1;
		snprintf(t->errbuf, sizeof t->errbuf, "the response body exceeded %zu bytes", bound);
		return 0; /* aborts the transfer: CURLE_WRITE_ERROR */
	}
	if (t->buf == NULL) {
		t->cap = t->buffer_size > n ? t->buffer_size : n;
		t->buf = malloc(t->cap);
		if (t->buf == NULL) {
			snprintf(t->errbuf, sizeof t->errbuf, "out of memory for the response body");
			return 0;
		}
	}
	if (n > t->cap - t->start - t->len && t->start > 0) {
		memmove(t->buf, t->buf + t->start, t->len);
		t->start = 0;
	}
	if (n > t->cap - t->len) {
		if (t->len > 0) {
			/* Full: libcurl keeps this chunk and stops reading the socket until resumed. */
			t->paused = 1;
			return CURL_WRITEFUNC_PAUSE;
		}
		/* An empty buffer always takes one whole chunk, so a transfer can never stall on a
		 * chunk larger than its buffer; libcurl's chunks are at most CURL_MAX_WRITE_SIZE. */
		char *bigger = realloc(t->buf, n);
		if (bigger == NULL) {
			snprintf(t->errbuf, sizeof t->errbuf, "out of memory for the response body");
			return 0;
		}
		t->buf = bigger;
		t->cap = n;
	}
	memcpy(t->buf + t->start + t->len, data, n);
	t->len += n;
	t->received += n;
	t->progress++;
	return n;
}

/* libcurl asks for body bytes; an empty buffer pauses the upload until the next feed. */
static size_t on_read(char *dest, size_t size, size_t nitems, void *ud)
{
	sk_transfer *t = ud;
	size_t room = size * nitems;
	if (t->send_len == 0) {
		/* A body finished short of its Content-Length would leave the server waiting for
		 * the rest: the transfer fails instead. */
		if (t->send_finished && t->send_length >= 0 && t->uploaded < (uint64_t)t->send_length)
			return CURL_READFUNC_ABORT;
		if (t->send_finished)
			return 0; /* the end of the body */
		t->send_paused = 1;
		return CURL_READFUNC_PAUSE;
	}
	size_t n = t->send_len < room ? t->send_len : room;
	memcpy(dest, t->send_buf + t->send_start, n);
	t->send_start += n;
	t->send_len -= n;
	if (t->send_len == 0)
		t->send_start = 0;
	t->uploaded += n;
	t->progress++; /* room in the buffer is news for a caller waiting to feed */
	return n;
}

/* The pause state of a transfer is one call for both directions: each resume keeps the other
 * direction as it is. */
static void resume_direction(sk_transfer *t)
{
	if (t->in_multi)
		curl_easy_pause(t->easy, (t->paused ? CURLPAUSE_RECV : 0) | (t->send_paused ? CURLPAUSE_SEND : 0));
}

/* A request body's Unix socket gets SK_TRANSFER_UNIX_SEND_BUFFER of room; TCP's is the
 * kernel's to size, as it grows it with the connection. */
static int on_stream_socket(void *data, curl_socket_t fd, curlsocktype purpose)
{
	(void)data;
	struct sockaddr_storage addr;
	socklen_t len = sizeof addr;
	if (purpose == CURLSOCKTYPE_IPCXN && getsockname(fd, (struct sockaddr *)&addr, &len) == 0 &&
	    addr.ss_family == AF_UNIX) {
		int size = SK_TRANSFER_UNIX_SEND_BUFFER;
		/* Advice: a kernel that caps it lower (net.core.wmem_max) still sends, slower. */
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
	}
	return CURL_SOCKOPT_OK;
}

static void set_stream_body(CURL *e, sk_transfer *t, const struct sk_request *req)
{
	curl_easy_setopt(e, CURLOPT_SOCKOPTFUNCTION, on_stream_socket);
	curl_off_t length = req->body_length >= 0 ? (curl_off_t)req->body_length : -1;
	curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
	curl_easy_setopt(e, CURLOPT_READDATA, t);
	/* As much as the send buffer holds goes to the socket in one send: at libcurl's 64 KiB,
	 * a file went up in a send, a poll and a wait per 64 KiB. */
	curl_easy_setopt(e, CURLOPT_UPLOAD_BUFFERSIZE, (long)SK_TRANSFER_SEND_BUFFER);
	/* A stream cannot be rewound for a resend on a dead pooled connection; and, as for
	 * fresh_connect, its connection is never pooled afterwards. */
	curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
	curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
	if (strcmp(req->method, "PUT") == 0) {
		curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(e, CURLOPT_INFILESIZE_LARGE, length);
		return;
	}
	curl_easy_setopt(e, CURLOPT_POST, 1L);
	curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, length);
	if (strcmp(req->method, "POST") != 0)
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method);
}

static int has_header(const struct sk_request *req, const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 0; i < req->header_count; i++)
		if (strncasecmp(req->headers[i], name, n) == 0 && req->headers[i][n] == ':')
			return 1;
	return 0;
}

/*
 * For tls_server_name: libcurl verifies the certificate against, and sends as SNI, the host of
 * the URL it is given. So the URL it gets names tls_server_name, CURLOPT_CONNECT_TO sends the
 * connection to the original host and port, and a Host header keeps naming them (as a client
 * with a separate TLS server name sends it). Returns the URL to use (curl_free it), or NULL
 * with err filled.
 */
static char *redirect_name(sk_transfer *t, const struct sk_request *req, char *err, size_t errlen)
{
	static const char dns[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-";
	const char *name = req->tls_server_name;
	size_t n = strlen(name);
	/* Only a DNS name: anything else could break out of the CONNECT_TO line below. */
	if (n == 0 || n > SK_TRANSFER_MAX_SERVER_NAME || strspn(name, dns) != n || name[0] == '-' ||
	    name[0] == '.') {
		snprintf(err, errlen, "tls_server_name must be a DNS name of at most %d characters",
			 SK_TRANSFER_MAX_SERVER_NAME);
		return NULL;
	}
	CURLU *u = curl_url();
	char *host = NULL, *port = NULL, *given_port = NULL, *url = NULL;
	char line[2 * SK_TRANSFER_MAX_SERVER_NAME + 64];
	if (u == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (curl_url_set(u, CURLUPART_URL, req->url, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK ||
	    strlen(host) > SK_TRANSFER_MAX_SERVER_NAME + 2) {
		snprintf(err, errlen, "the URL does not parse as one with a host");
		goto done;
	}
	if (curl_url_get(u, CURLUPART_PORT, &given_port, 0) != CURLUE_OK)
		given_port = NULL; /* none in the URL: the Host header names none either */
	snprintf(line, sizeof line, "%s:%s:%s:%s", name, port, host, port);
	t->connect_to = curl_slist_append(NULL, line);
	if (t->connect_to == NULL)
		goto nomem;
	if (!has_header(req, "Host")) {
		snprintf(line, sizeof line, "Host: %s%s%s", host, given_port ? ":" : "",
			 given_port ? given_port : "");
		struct curl_slist *l = curl_slist_append(t->request_headers, line);
		if (l == NULL)
			goto nomem;
		t->request_headers = l;
	}
	if (curl_url_set(u, CURLUPART_HOST, name, 0) != CURLUE_OK ||
	    curl_url_get(u, CURLUPART_URL, &url, 0) != CURLUE_OK) {
		snprintf(err, errlen, "the URL could not be rewritten for tls_server_name");
		url = NULL;
	}
	goto done;
nomem:
	snprintf(err, errlen, "out of memory");
done:
	curl_free(host);
	curl_free(port);
	curl_free(given_port);
	curl_url_cleanup(u);
	return url;
}

/* Checks the in-memory TLS fields against each other and their bounds. */
static int check_tls(const struct sk_request *req, char *err, size_t errlen)
{
	if (req->ca_pem && req->ca_file) {
		snprintf(err, errlen, "ca_pem and ca_file exclude each other");
		return -1;
	}
	if ((req->client_cert_pem == NULL) != (req->client_key_pem == NULL)) {
		snprintf(err, errlen, "client_cert_pem and client_key_pem come together");
		return -1;
	}
	if ((req->ca_pem && req->ca_pem_len > SK_TRANSFER_MAX_PEM) ||
	    (req->client_cert_pem && req->client_cert_pem_len > SK_TRANSFER_MAX_PEM) ||
	    (req->client_key_pem && req->client_key_pem_len > SK_TRANSFER_MAX_PEM)) {
		snprintf(err, errlen, "PEM text over %zu bytes", SK_TRANSFER_MAX_PEM);
		return -1;
	}
	return 0;
}

/* Hands libcurl the PEM texts; it copies each blob (CURL_BLOB_COPY) before this returns. */
static void set_tls_blobs(CURL *e, const struct sk_request *req)
{
	if (req->ca_pem) {
		struct curl_blob b = { (void *)req->ca_pem, req->ca_pem_len, CURL_BLOB_COPY };
		curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &b);
		/* The given CA alone is trusted, as a kubeconfig means it: no system store. */
		curl_easy_setopt(e, CURLOPT_CAINFO, NULL);
		curl_easy_setopt(e, CURLOPT_CAPATH, NULL);
	}
	if (req->client_cert_pem) {
		struct curl_blob c = { (void *)req->client_cert_pem, req->client_cert_pem_len,
				       CURL_BLOB_COPY };
		struct curl_blob k = { (void *)req->client_key_pem, req->client_key_pem_len,
				       CURL_BLOB_COPY };
		curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
		curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &c);
		curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
		curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &k);
	}
}

/* Methods libcurl knows by option rather than by CUSTOMREQUEST. */
static void set_method(CURL *e, const struct sk_request *req)
{
	if (strcmp(req->method, "GET") == 0 && req->body == NULL) {
		curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
		return;
	}
	if (strcmp(req->method, "HEAD") == 0) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
		return;
	}
	if (req->body != NULL || strcmp(req->method, "POST") == 0) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body ? req->body : "");
	}
	if (strcmp(req->method, "POST") != 0)
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req->method);
}

sk_transfer *sk_transfer_start(sk_client *c, const struct sk_request *req, char *err, size_t errlen)
{
	if (req->header_count > SK_TRANSFER_MAX_REQUEST_HEADERS) {
		snprintf(err, errlen, "more than %d request headers", SK_TRANSFER_MAX_REQUEST_HEADERS);
		return NULL;
	}
	if (check_tls(req, err, errlen) < 0)
		return NULL;
	if (req->unix_socket && strlen(req->unix_socket) > SK_UNIX_SOCKET_PATH_MAX) {
		snprintf(err, errlen, "a Unix socket's path over %zu bytes", SK_UNIX_SOCKET_PATH_MAX);
		return NULL;
	}
	/* Zeroed but for the head's bytes, last in the struct: header_used says how many hold
	 * anything, and zeroing all 16 KiB was a tenth of a round trip's instructions. */
	sk_transfer *t = malloc(sizeof *t);
	if (t == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	memset(t, 0, offsetof(sk_transfer, header_bytes));
	t->max_body = req->max_body;
	t->max_error_body = req->max_error_body;
	t->buffer_size = req->buffer_size ? req->buffer_size : SK_TRANSFER_BUFFER;
	if (t->buffer_size < SK_TRANSFER_MIN_BUFFER)
		t->buffer_size = SK_TRANSFER_MIN_BUFFER;
	t->easy = curl_easy_init();
	if (t->easy == NULL) {
		snprintf(err, errlen, "curl_easy_init failed");
		free(t);
		return NULL;
	}
	for (size_t i = 0; i < req->header_count; i++) {
		struct curl_slist *l = curl_slist_append(t->request_headers, req->headers[i]);
		if (l == NULL)
			goto nomem;
		t->request_headers = l;
	}
	/* A body of any size goes at once: "Expect: 100-continue" would add a round trip and a
	 * second place where a request can be half sent. */
	struct curl_slist *l = curl_slist_append(t->request_headers, "Expect:");
	if (l == NULL)
		goto nomem;
	t->request_headers = l;

	CURL *e = t->easy;
	curl_easy_setopt(e, CURLOPT_PRIVATE, (char *)t);
	if (req->tls_server_name) {
		char *url = redirect_name(t, req, err, errlen);
		if (url == NULL)
			goto fail;
		curl_easy_setopt(e, CURLOPT_URL, url); /* libcurl keeps its own copy */
		curl_free(url);
		curl_easy_setopt(e, CURLOPT_CONNECT_TO, t->connect_to);
	} else {
		curl_easy_setopt(e, CURLOPT_URL, req->url);
	}
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	/* A redirect could carry a request (and its credentials) somewhere it was never meant to
	 * go; the protocol has none, so any 3xx is reported as it is. */
	curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
	/* The retry and pause reasoning in this file is about HTTP/1.1's one-request-per-
	 * connection-at-a-time semantics, so that is what is spoken. */
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
	/* libcurl copies both strings, and matches them before it reuses a pooled connection. */
	if (req->ca_file)
		curl_easy_setopt(e, CURLOPT_CAINFO, req->ca_file);
	set_tls_blobs(e, req);
	/* An empty string disables the proxy environment variables too: proxies only when asked. */
	curl_easy_setopt(e, CURLOPT_PROXY, req->proxy ? req->proxy : "");
	if (req->unix_socket)
		curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, req->unix_socket);
	if (c->user_agent)
		curl_easy_setopt(e, CURLOPT_USERAGENT, c->user_agent);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
	t->read_size = c->read_buffers + SK_TRANSFER_READ_MAX <= SK_TRANSFER_READ_BUDGET ?
		SK_TRANSFER_READ_MAX : SK_TRANSFER_READ_SIZE;
	curl_easy_setopt(e, CURLOPT_BUFFERSIZE, t->read_size);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, t->request_headers);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, t);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, t);
	curl_easy_setopt(e, CURLOPT_PREREQFUNCTION, on_prereq);
	curl_easy_setopt(e, CURLOPT_PREREQDATA, t);
	/* A request that may start a command goes out on a connection of its own, never one
	 * pooled (a dead one would make libcurl send it twice), and that connection is closed
	 * when it is over rather than pooled: the nginx transport does the same, so both keep
	 * the pool for idempotent requests alone. */
	if (req->fresh_connect) {
		curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L);
		curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L);
	}
	if (req->connect_timeout_ms > 0)
		curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, req->connect_timeout_ms);
	if (req->body_stream) {
		t->streaming = 1;
		t->send_length = req->body_length;
		set_stream_body(e, t, req);
	} else {
		set_method(e, req);
	}

	CURLMcode mc = curl_multi_add_handle(c->multi, e);
	if (mc != CURLM_OK) {
		snprintf(err, errlen, "curl_multi_add_handle: %s", curl_multi_strerror(mc));
		goto fail;
	}
	t->in_multi = 1;
	t->client = c;
	t->next = c->transfers;
	if (c->transfers)
		c->transfers->prev = t;
	c->transfers = t;
	c->transfer_count++;
	c->read_buffers += (size_t)t->read_size;
	return t;
nomem:
	snprintf(err, errlen, "out of memory");
fail:
	curl_slist_free_all(t->request_headers);
	curl_slist_free_all(t->connect_to);
	curl_easy_cleanup(t->easy);
	free(t);
	return NULL;
}

void sk_transfer_free(sk_transfer *t)
{
	if (t == NULL)
		return;
	detach(t);
	curl_easy_cleanup(t->easy);
	curl_slist_free_all(t->request_headers);
	curl_slist_free_all(t->connect_to);
	free(t->buf);
	free(t->send_buf);
	free(t);
}

void sk_transfer_state(const sk_transfer *t, struct sk_transfer_state *st)
{
	st->sent = t->sent;
	st->headers = t->headers;
	st->status = t->status;
	st->done = t->done;
	st->ok = t->done && t->result == CURLE_OK && !t->too_long;
	st->too_long = t->too_long;
	st->result = (int)t->result;
	st->error = t->done && !st->ok ? t->errbuf : NULL;
	st->received = t->received;
	st->uploaded = t->uploaded;
	st->read_size = t->read_size;
	st->progress = t->progress;
}

uint64_t sk_transfer_progress(const sk_transfer *t)
{
	return t->progress;
}

int sk_transfer_header(const sk_transfer *t, int i, const char **name, size_t *name_len,
                       const char **value, size_t *value_len)
{
	if (i < 0 || i >= t->header_count)
		return 0;
	const struct header_span *h = &t->header[i];
	*name = t->header_bytes + h->name;
	*name_len = h->name_len;
	*value = t->header_bytes + h->value;
	*value_len = h->value_len;
	return 1;
}

const char *sk_transfer_peek(const sk_transfer *t, size_t *len)
{
	*len = t->len;
	return t->buf ? t->buf + t->start : "";
}

int sk_transfer_paused(const sk_transfer *t)
{
	return t->paused;
}

void sk_transfer_consume(sk_transfer *t, size_t n)
{
	if (n > t->len)
		n = t->len;
	t->start += n;
	t->len -= n;
	if (t->len == 0)
		t->start = 0;
	/* Resume below half full, not at the first free byte: fewer pause/resume round trips. */
	if (t->paused && t->in_multi && t->len <= t->cap / 2) {
		t->paused = 0;
		resume_direction(t);
	}
}

long sk_transfer_drain_fd(sk_transfer *t, int fd)
{
	size_t n;
	const char *p = sk_transfer_peek(t, &n);
	if (n == 0)
		return 0;
	ssize_t written;
	do
		written = write(fd, p, n);
	while (written < 0 && errno == EINTR);
	if (written < 0)
		return -1;
	sk_transfer_consume(t, (size_t)written);
	return (long)written;
}

/* The send buffer, made at the first feed, with its unsent bytes moved to its front when
 * `wanted` more would not fit behind them. 0, or -1 when memory ran out. */
static int send_room(sk_transfer *t, size_t wanted)
{
	if (t->send_buf == NULL) {
		t->send_buf = malloc(SK_TRANSFER_SEND_BUFFER);
		if (t->send_buf == NULL)
			return -1;
	}
	if (t->send_start > 0 && wanted > SK_TRANSFER_SEND_BUFFER - t->send_start - t->send_len) {
		memmove(t->send_buf, t->send_buf + t->send_start, t->send_len);
		t->send_start = 0;
	}
	return 0;
}

static void fed(sk_transfer *t, size_t n)
{
	t->send_len += n;
	t->fed += n;
	if (n > 0 && t->send_paused) {
		t->send_paused = 0;
		resume_direction(t);
	}
}

long sk_transfer_feed(sk_transfer *t, const char *data, size_t len)
{
	if (!t->streaming || t->send_finished)
		return -1;
	if (t->send_length >= 0 && len > (uint64_t)t->send_length - t->fed)
		return -1;
	if (send_room(t, len) < 0)
		return -1;
	size_t room = SK_TRANSFER_SEND_BUFFER - t->send_start - t->send_len;
	size_t n = len < room ? len : room;
	memcpy(t->send_buf + t->send_start + t->send_len, data, n);
	fed(t, n);
	return (long)n;
}

long sk_transfer_feed_fd(sk_transfer *t, int fd)
{
	if (!t->streaming || t->send_finished)
		return SK_FEED_REFUSED;
	if (send_room(t, SK_TRANSFER_SEND_BUFFER) < 0) {
		errno = ENOMEM;
		return -1;
	}
	size_t want = SK_TRANSFER_SEND_BUFFER - t->send_start - t->send_len;
	if (want == 0)
		return 0;
	/* At the announced length one byte more is asked for, into a byte of its own: a file
	 * that grew since its length was taken is a body the server would misread, not one to
	 * cut silently. */
	char past;
	char *into = t->send_buf + t->send_start + t->send_len;
	if (t->send_length >= 0) {
		uint64_t left = (uint64_t)t->send_length - t->fed;
		if (left == 0) {
			into = &past;
			want = 1;
		} else if (want > left) {
			want = (size_t)left;
		}
	}
	ssize_t n;
	do
		n = pread(fd, into, want, (off_t)t->fed);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	if (n == 0)
		return SK_FEED_END;
	if (into == &past)
		return SK_FEED_PAST;
	fed(t, (size_t)n);
	return (long)n;
}

void sk_transfer_finish(sk_transfer *t)
{
	if (!t->streaming)
		return;
	t->send_finished = 1;
	if (t->send_paused) {
		t->send_paused = 0;
		resume_direction(t);
	}
}
