/* listener.c — see listener.h. */
#include "listener.h"

#include "common/unix_socket.h"
#include "http.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <event2/event.h>
#include <event2/util.h>

/* accept() failures (out of descriptors or memory): wait this long before trying again,
 * doubling up to the maximum, and say so at most once per interval. */
#define ACCEPT_BACKOFF_MIN_MS 50
#define ACCEPT_BACKOFF_MAX_MS 1000
#define ACCEPT_LOG_INTERVAL_S 10
/* Connections accepted per wake-up, so a flood cannot starve the other events. */
#define ACCEPT_BATCH 32
/* The whole 503 for a connection over the cap, head and busy_text: kept ready so that refusing
 * allocates nothing, and small enough for one send() into a fresh socket's buffer. */
#define BUSY_REPLY_MAX 512
/* A socket closed with its caller's request unread makes the kernel send a reset, which can
 * destroy the 503 before the caller reads it (and a caller still sending its body fails with
 * EPIPE and never reads it). So a refused socket has its writing side shut after the 503 and
 * what its caller sends is read and dropped until it closes: for at most this long and this
 * many bytes, and at most this many sockets at once (they hold descriptors past the cap, which
 * the cap's sizing reserves); past that, a refused socket is closed at once, best effort. */
#define REFUSED_LINGER_MS 1000
#define REFUSED_LINGER_MAX (64 * 1024)
#define REFUSED_LINGERING 8
/* One read of a refused socket's input, dropped. */
#define REFUSED_READ 4096

/* A refused socket draining its caller's request; fd -1 when the slot is free. */
struct refused {
	evutil_socket_t fd;
	struct event *ev;        /* made at start: refusing allocates nothing */
	uint64_t until_ms;       /* CLOCK_MONOTONIC: the end of its linger */
	size_t dropped;
};

static struct listener {
	evutil_socket_t fd;
	struct event *accept_ev, *backoff_ev;
	int backoff_ms;
	time_t accept_logged;
	unsigned long accept_failures;   /* since the last report */
	struct listener_entry *conns;
	unsigned nconns, max_conns;
	char busy_reply[BUSY_REPLY_MAX];
	size_t busy_len;
	struct event_base *base;
	struct refused refused[REFUSED_LINGERING];
	const char *socket_path;         /* the Unix socket's name while it is bound, else NULL */
} lis = { .fd = -1 };

void listener_add(struct listener_entry *e)
{
	e->prev = NULL;
	e->next = lis.conns;
	if (lis.conns)
		lis.conns->prev = e;
	lis.conns = e;
	lis.nconns++;
}

void listener_remove(struct listener_entry *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		lis.conns = e->next;
	if (e->next)
		e->next->prev = e->prev;
	lis.nconns--;
}

struct conn *listener_any(void)
{
	return lis.conns ? lis.conns->conn : NULL;
}

/* At the cap, the connection that has waited longest without a request in progress gives
 * way: idle and half-sent heads are what an attacker holds, and an authorized caller's request
 * is never among them. */
static int evict_one(void)
{
	struct conn *victim = NULL;
	uint64_t oldest = 0;
	for (struct listener_entry *e = lis.conns; e; e = e->next) {
		uint64_t since;
		if (conn_evictable(e->conn, &since) && (victim == NULL || since < oldest)) {
			victim = e->conn;
			oldest = since;
		}
	}
	if (victim == NULL)
		return -1;
	conn_close(victim);
	return 0;
}

static void refused_close(struct refused *r)
{
	event_del(r->ev);
	close(r->fd);
	r->fd = -1;
}

static uint64_t now_ms(void)
{
	return util_now_us() / 1000;
}

/* Waits for more of the refused caller's input until its linger ends; -1 once it has. */
static int refused_wait(struct refused *r)
{
	uint64_t now = now_ms();
	if (now >= r->until_ms)
		return -1;
	uint64_t left = r->until_ms - now;
	struct timeval tv = { (time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000 };
	return event_add(r->ev, &tv);
}

/* Drops what the refused caller sent; closes on its end, an error, or a bound reached. */
static void on_refused(evutil_socket_t fd, short what, void *arg)
{
	struct refused *r = arg;
	static char scratch[REFUSED_READ]; /* single-threaded loop: one buffer serves all */
	if (what & EV_READ) {
		for (;;) {
			ssize_t n = recv(fd, scratch, sizeof scratch, MSG_DONTWAIT);
			if (n > 0 && (r->dropped += (size_t)n) <= REFUSED_LINGER_MAX)
				continue;
			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				break;
			refused_close(r); /* its end, an error, or past the byte bound */
			return;
		}
	}
	if (refused_wait(r) < 0)
		refused_close(r);
}

static void refuse_socket(evutil_socket_t fd)
{
	ssize_t w = send(fd, lis.busy_reply, lis.busy_len, MSG_DONTWAIT | MSG_NOSIGNAL);
	(void)w; /* best effort: the close says the same */
	shutdown(fd, SHUT_WR);
	for (int i = 0; i < REFUSED_LINGERING; i++) {
		struct refused *r = &lis.refused[i];
		if (r->fd >= 0)
			continue;
		r->until_ms = now_ms() + REFUSED_LINGER_MS;
		if (event_assign(r->ev, lis.base, fd, EV_READ, on_refused, r) < 0 || refused_wait(r) < 0)
			break;
		r->fd = fd;
		r->dropped = 0;
		return;
	}
	close(fd);
}

static void take(evutil_socket_t fd)
{
	if (lis.nconns >= lis.max_conns && evict_one() < 0) {
		refuse_socket(fd);
		return;
	}
	conn_open(fd);
}

static void on_backoff(evutil_socket_t fd, short what, void *arg);

static void accept_failed(int err)
{
	lis.accept_failures++;
	time_t now = time(NULL);
	if (now - lis.accept_logged >= ACCEPT_LOG_INTERVAL_S) {
		log_info("cannot accept connections: %s (%lu times since the last report); "
			 "retrying with back-off", strerror(err), lis.accept_failures);
		lis.accept_logged = now;
		lis.accept_failures = 0;
	}
	lis.backoff_ms = lis.backoff_ms ? lis.backoff_ms * 2 : ACCEPT_BACKOFF_MIN_MS;
	if (lis.backoff_ms > ACCEPT_BACKOFF_MAX_MS)
		lis.backoff_ms = ACCEPT_BACKOFF_MAX_MS;
	event_del(lis.accept_ev);
	struct timeval tv = { lis.backoff_ms / 1000, (suseconds_t)(lis.backoff_ms % 1000) * 1000 };
	evtimer_add(lis.backoff_ev, &tv);
}

static void on_accept(evutil_socket_t lfd, short what, void *arg)
{
	(void)what;
	(void)arg;
	for (int i = 0; i < ACCEPT_BATCH; i++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
				continue;
			/* EMFILE, ENFILE, ENOBUFS, ENOMEM: retrying at once would spin on the same
			 * error; the kernel keeps the connections queued meanwhile. */
			accept_failed(errno);
			return;
		}
		lis.backoff_ms = 0;
		take(fd);
	}
}

static void on_backoff(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	event_add(lis.accept_ev, NULL);
	/* backoff_ms stays set until an accept succeeds, so the next failure waits longer */
	on_accept(lis.fd, EV_READ, NULL);
}

/* Sizes the connection cap to the soft descriptor limit (main.c raised it to the hard one). */
static unsigned connection_cap(const struct http_config *cfg)
{
	unsigned wanted = cfg->max_connections;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return wanted;
	uint64_t fds = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
	uint64_t reserved = (uint64_t)cfg->fds_reserved + REFUSED_LINGERING;
	uint64_t room = fds > reserved ? (fds - reserved) / cfg->fds_per_connection : 0;
	if (room < 1)
		room = 1;
	if (room < wanted) {
		log_info("descriptor limit %llu allows %llu connections, not %u",
			 (unsigned long long)fds, (unsigned long long)room, wanted);
		return (unsigned)room;
	}
	return wanted;
}

unsigned http_max_connections(void)
{
	return lis.max_conns;
}

/* The 503 for a connection over the cap, whole, with busy_text as its body. */
static int prepare_busy_reply(const char *text)
{
	int n = snprintf(lis.busy_reply, sizeof lis.busy_reply,
			 "HTTP/1.1 503 %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
			 "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
			 http_reason(503), strlen(text), text);
	if (n < 0 || (size_t)n >= sizeof lis.busy_reply) {
		errno = EINVAL;
		return -1;
	}
	lis.busy_len = (size_t)n;
	return 0;
}

/* A Unix socket made at `path`, listening, mode 0600: only the agent's own user (and root) may
 * connect, whatever the folder around it allows. The umask is the process's, so it is set
 * for the bind alone, before any thread or command exists. -1 with errno. */
static int bind_unix(const char *path)
{
	struct sockaddr_un at;
	memset(&at, 0, sizeof at);
	at.sun_family = AF_UNIX;
	if (strlen(path) > SK_UNIX_SOCKET_PATH_MAX) {
		errno = ENAMETOOLONG;
		return -1;
	}
	memcpy(at.sun_path, path, strlen(path));
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	mode_t was = umask(0177);
	int bound = bind(fd, (struct sockaddr *)&at, sizeof at);
	umask(was);
	if (bound < 0 || listen(fd, SOMAXCONN) < 0) {
		int e = errno;
		close(fd);
		if (bound == 0)
			unlink(path);
		errno = e;
		return -1;
	}
	return fd;
}

/* A TCP socket bound to cfg->host:cfg->port and listening; *port receives the port bound. */
static int bind_inet(const struct http_config *cfg, unsigned *port)
{
	char portstr[16];
	snprintf(portstr, sizeof portstr, "%u", cfg->port);
	struct evutil_addrinfo hints, *ai = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = EVUTIL_AI_PASSIVE | EVUTIL_AI_ADDRCONFIG;
	int gai = evutil_getaddrinfo(cfg->host, portstr, &hints, &ai);
	if (gai != 0) {
		errno = EADDRNOTAVAIL;
		return -1;
	}
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int one = 1;
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
	    bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		evutil_freeaddrinfo(ai);
		errno = e;
		return -1;
	}
	evutil_freeaddrinfo(ai);
	http_listening_options(fd);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
		close(fd);
		return -1;
	}
	*port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
					       : ((struct sockaddr_in *)&ss)->sin_port);
	return fd;
}

int listener_start(const struct http_config *cfg, unsigned *port)
{
	if (prepare_busy_reply(cfg->busy_text) < 0)
		return -1;
	lis.max_conns = connection_cap(cfg);
	int fd;
	if (cfg->socket_path) {
		*port = 0;
		fd = bind_unix(cfg->socket_path);
		if (fd >= 0)
			lis.socket_path = cfg->socket_path;
	} else {
		fd = bind_inet(cfg, port);
	}
	if (fd < 0)
		return -1;
	lis.fd = fd;
	lis.base = cfg->base;
	lis.accept_ev = event_new(cfg->base, fd, EV_READ | EV_PERSIST, on_accept, NULL);
	lis.backoff_ev = evtimer_new(cfg->base, on_backoff, NULL);
	int ok = lis.accept_ev != NULL && lis.backoff_ev != NULL;
	for (int i = 0; i < REFUSED_LINGERING; i++) {
		lis.refused[i].fd = -1;
		lis.refused[i].ev = event_new(cfg->base, -1, 0, on_refused, &lis.refused[i]);
		ok = ok && lis.refused[i].ev != NULL;
	}
	if (!ok || event_add(lis.accept_ev, NULL) < 0) {
		int e = ok ? errno : ENOMEM;
		listener_stop();
		errno = e;
		return -1;
	}
	return 0;
}

void listener_stop(void)
{
	for (int i = 0; i < REFUSED_LINGERING; i++) {
		struct refused *r = &lis.refused[i];
		if (r->ev && r->fd >= 0)
			refused_close(r);
		if (r->ev)
			event_free(r->ev);
		r->ev = NULL;
	}
	if (lis.accept_ev)
		event_free(lis.accept_ev);
	if (lis.backoff_ev)
		event_free(lis.backoff_ev);
	lis.accept_ev = lis.backoff_ev = NULL;
	if (lis.fd >= 0)
		close(lis.fd);
	lis.fd = -1;
	/* The socket's name goes with it: nobody is listening there any more. */
	if (lis.socket_path)
		unlink(lis.socket_path);
	lis.socket_path = NULL;
}
