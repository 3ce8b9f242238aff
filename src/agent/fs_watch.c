/*
 * fs_watch.c — POST /v1/fs/watch (docs/protocol.md §6 fsWatch): a path's changes as an NDJSON
 * stream of event frames, through inotify, until the caller's timeout, the path's removal, or
 * the caller leaving.
 *
 * The path is opened beneath the root (paths.h) and watched through its descriptor
 * (/proc/self/fd/N), so the watch is on what the caller named, never on what a link points at.
 * Events are read as soon as inotify has them; those a slow caller has not taken yet wait in a
 * bounded queue, and past it are dropped and said to be with one `overflow` event (inotify's
 * own overflow says the same).
 */
#include "fs.h"

#include "agent.h"
#include "common/walk.h"
#include "handler.h"
#include "http.h"
#include "keepalive.h"
#include "log.h"
#include "paths.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

/* Watches at once in one agent: each holds an inotify instance, of which a user has 128 by
 * default across the machine. */
#define WATCH_STREAMS_MAX 16
/* Directories one recursive watch follows: what inotify gives a user (8192 watches by default
 * on older kernels) shared with other watches. */
#define WATCH_DIRS_MAX 4096
/* Events waiting for a slow caller, and their bytes, before newer ones are dropped for an
 * `overflow` event. */
#define WATCH_QUEUE_EVENTS 1024
#define WATCH_QUEUE_BYTES ((size_t)1 << 20)
/* One read of inotify: many events, at most one name each of NAME_MAX. */
#define WATCH_READ_BUF (64 * 1024)
/* The longest timeout taken, in milliseconds: ten years, well inside a timeval. */
#define WATCH_TIMEOUT_MAX_MS (10ULL * 366 * 24 * 3600 * 1000)

#define DIR_EVENTS (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | \
		    IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
#define FILE_EVENTS (IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF)

struct watched {
	int wd;
	char *rel;             /* relative to the watched path; "" for itself */
};

struct watch {
	struct http_request *req;
	struct keepalive *keepalive; /* NULL when the caller asked for none */
	int ifd;
	/* The watched path, opened again by it for each directory that joins: no descriptor is
	 * held, which would keep a removed file's inode, and its removal unsaid. */
	char root_rel[PATHS_MAX];
	struct event *readable, *deadline;
	int recursive, is_dir;
	struct watched *dirs;  /* in order of wd, which inotify hands out increasing */
	size_t ndirs, cap;
	char shown[PATHS_MAX + 2];  /* the watched path as the caller names it */
	size_t shown_len;
	struct evbuffer *pending;
	size_t npending;
	int overflowed;
	/* a move out of one directory, waiting for its move into another (same cookie) */
	uint32_t from_cookie;
	char *from_rel;
	int from_dir;
	/* the last modify sent, so that a burst of writes to one file is one event */
	int last_modify_wd;
	char last_modify[256];
	char *buf;
};

static unsigned streams;

static void watch_free(struct watch *w)
{
	keepalive_stop(w->keepalive);
	if (w->readable)
		event_free(w->readable);
	if (w->deadline)
		event_free(w->deadline);
	if (w->ifd >= 0)
		close(w->ifd);
	for (size_t i = 0; i < w->ndirs; i++)
		free(w->dirs[i].rel);
	free(w->dirs);
	if (w->pending)
		evbuffer_free(w->pending);
	free(w->from_rel);
	free(w->buf);
	free(w);
	streams--;
}

static struct watched *find(struct watch *w, int wd)
{
	size_t lo = 0, hi = w->ndirs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (w->dirs[mid].wd == wd)
			return &w->dirs[mid];
		if (w->dirs[mid].wd < wd)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static void forget(struct watch *w, struct watched *d)
{
	size_t i = (size_t)(d - w->dirs);
	free(d->rel);
	memmove(d, d + 1, (w->ndirs - i - 1) * sizeof *d);
	w->ndirs--;
}

/* Opens rel (relative to the watched path) beneath the root. */
static enum path_result open_rel(struct watch *w, const char *rel, int flags, int *fd)
{
	char full[PATHS_MAX];
	int n = strcmp(w->root_rel, ".") == 0 ? snprintf(full, sizeof full, "%s", *rel ? rel : ".")
		: snprintf(full, sizeof full, "%s%s%s", w->root_rel, *rel ? "/" : "", rel);
	if (n < 0 || (size_t)n >= sizeof full) {
		errno = ENAMETOOLONG;
		return PATH_REFUSED;
	}
	return paths_open(full, flags, 0, fd);
}

/* Watches rel (relative to the watched path) through a confined descriptor. 0; 1 when the
 * bound on directories is reached; -1 with errno. */
static int add_dir(struct watch *w, const char *rel)
{
	int fd;
	if (open_rel(w, rel, O_PATH | O_DIRECTORY, &fd) != PATH_OK)
		return -1;
	char proc[64];
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
	int wd = inotify_add_watch(w->ifd, proc, DIR_EVENTS);
	int saved = errno;
	close(fd);
	if (wd < 0) {
		errno = saved;
		return -1;
	}
	struct watched *known = find(w, wd);
	char *copy = strdup(rel);
	if (copy == NULL)
		return -1;
	if (known) {
		free(known->rel);
		known->rel = copy;
		return 0;
	}
	if (w->ndirs == WATCH_DIRS_MAX) {
		free(copy);
		inotify_rm_watch(w->ifd, wd);
		return 1;
	}
	if (w->ndirs == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 16;
		struct watched *d = realloc(w->dirs, cap * sizeof *d);
		if (d == NULL) {
			free(copy);
			return -1;
		}
		w->dirs = d;
		w->cap = cap;
	}
	size_t at = w->ndirs;
	while (at > 0 && w->dirs[at - 1].wd > wd)
		at--;
	memmove(w->dirs + at + 1, w->dirs + at, (w->ndirs - at) * sizeof *w->dirs);
	w->dirs[at] = (struct watched){ wd, copy };
	w->ndirs++;
	return 0;
}

/* ---- frames ---- */

static int frame_text(struct watch *w, struct evbuffer *b, const char *event, const char *from,
		      const char *rel)
{
	if (evbuffer_add_printf(b, "{\"t\":\"event\",\"event\":\"%s\"", event) < 0)
		return -1;
	const char *names[2] = { "from", "path" }, *rels[2] = { from, rel };
	for (int i = 0; i < 2; i++) {
		if (rels[i] == NULL)
			continue;
		char path[2 * PATHS_MAX + 4];
		size_t n = w->shown_len;
		memcpy(path, w->shown, n);
		if (*rels[i]) {
			if (n > 1)
				path[n++] = '/';
			size_t r = strlen(rels[i]);
			memcpy(path + n, rels[i], r);
			n += r;
		}
		if (evbuffer_add_printf(b, ",\"%s\":", names[i]) < 0 || util_json_string(b, path, n) < 0)
			return -1;
	}
	return evbuffer_add(b, "}\n", 2);
}

/* Sends b now, or queues it behind what a slow caller has not taken; past the queue's bound it
 * is dropped, and the loss is said once the queue drains. */
static void deliver(struct watch *w, struct evbuffer *b)
{
	if (w->npending == 0 && !w->overflowed && http_reply_queued(w->req) < HTTP_OUTPUT_HIGH) {
		http_reply_chunk(w->req, b);
		keepalive_sent(w->keepalive);
		return;
	}
	if (w->overflowed || w->npending >= WATCH_QUEUE_EVENTS ||
	    evbuffer_get_length(w->pending) + evbuffer_get_length(b) > WATCH_QUEUE_BYTES) {
		w->overflowed = 1;
		return;
	}
	evbuffer_add_buffer(w->pending, b);
	w->npending++;
}

static void event_frame(struct watch *w, const char *event, const char *from, const char *rel)
{
	struct evbuffer *b = evbuffer_new();
	if (b == NULL || frame_text(w, b, event, from, rel) < 0)
		w->overflowed = 1; /* memory ran out for it: lost, and said to be */
	else
		deliver(w, b);
	if (b)
		evbuffer_free(b);
}

/* What waited goes out, then the overflow that followed it (http.h drain callback). */
static void flush(struct watch *w, int all)
{
	if (!all && http_reply_queued(w->req) >= HTTP_OUTPUT_HIGH)
		return;
	if (w->npending > 0) {
		http_reply_chunk(w->req, w->pending);
		w->npending = 0;
		keepalive_sent(w->keepalive);
	}
	if (w->overflowed) {
		struct evbuffer *b = evbuffer_new();
		if (b && evbuffer_add(b, "{\"t\":\"event\",\"event\":\"overflow\"}\n", 33) == 0)
			http_reply_chunk(w->req, b);
		if (b)
			evbuffer_free(b);
		w->overflowed = 0;
	}
}

static void on_drained(void *ctx)
{
	flush(ctx, 0);
}

/* The terminal frame, then the end of the body; the watch is over. */
static void finish(struct watch *w, const char *t, const char *code, const char *message)
{
	flush(w, 1);
	keepalive_stop(w->keepalive);
	w->keepalive = NULL;
	struct evbuffer *b = evbuffer_new();
	int ok = b != NULL;
	if (ok && code)
		ok = evbuffer_add_printf(b, "{\"t\":\"error\",\"code\":\"%s\",\"message\":", code) >= 0 &&
		     util_json_string(b, message, strlen(message)) == 0 && evbuffer_add(b, "}\n", 2) == 0;
	else if (ok)
		ok = evbuffer_add_printf(b, "{\"t\":\"end\",\"reason\":\"%s\"}\n", t) >= 0;
	/* Without memory for it the body ends without its terminal frame, which no caller
	 * takes for a watch that ended. */
	if (ok)
		http_reply_chunk(w->req, b);
	if (b)
		evbuffer_free(b);
	http_reply_end(w->req);
	watch_free(w);
}

static void on_gone(void *ctx)
{
	watch_free(ctx);
}

static void on_deadline(evutil_socket_t fd, short what, void *ctx)
{
	(void)fd;
	(void)what;
	finish(ctx, "timeout", NULL, NULL);
}

/* ---- inotify ---- */

static int join(char *out, const char *dir, const char *name)
{
	int n = snprintf(out, PATHS_MAX, "%s%s%s", dir, *dir && name ? "/" : "", name ? name : "");
	return n >= 0 && n < PATHS_MAX ? 0 : -1;
}

/* A directory that came into the tree: watched with what it holds, each entry said to be
 * created (they may have been before the watch could see them). 1 when a bound was hit. */
static int follow_new_dir(struct watch *w, const char *rel)
{
	int r = add_dir(w, rel);
	if (r != 0)
		return 1;
	int fd;
	if (open_rel(w, rel, O_PATH | O_DIRECTORY, &fd) != PATH_OK)
		return 0; /* gone again already: its removal follows */
	sk_walk *walk = sk_walk_new(fd, fs_open_beneath, FS_WALK_NAMES_MAX);
	struct sk_walk_entry e;
	int limit = 0;
	while (walk && sk_walk_next(walk, &e) == 1) {
		if (e.leaving)
			continue;
		char sub[PATHS_MAX];
		if (join(sub, rel, e.path) < 0)
			continue;
		event_frame(w, "create", NULL, sub);
		if (S_ISDIR(e.st.st_mode) && add_dir(w, sub) != 0) {
			limit = 1;
			break;
		}
	}
	sk_walk_free(walk);
	close(fd);
	return limit;
}

/* Paths beneath a directory moved within the tree follow it. */
static void moved_dir(struct watch *w, const char *from, const char *to)
{
	size_t fn = strlen(from);
	for (size_t i = 0; i < w->ndirs; i++) {
		char *rel = w->dirs[i].rel;
		if (strncmp(rel, from, fn) != 0 || (rel[fn] != '\0' && rel[fn] != '/'))
			continue;
		char next[PATHS_MAX];
		if (snprintf(next, sizeof next, "%s%s", to, rel + fn) >= (int)sizeof next)
			continue;
		char *copy = strdup(next);
		if (copy) {
			free(rel);
			w->dirs[i].rel = copy;
		}
	}
}

/* A directory that left the tree: its watches go. */
static void left_dir(struct watch *w, const char *rel)
{
	size_t n = strlen(rel);
	for (size_t i = w->ndirs; i-- > 0;) {
		const char *d = w->dirs[i].rel;
		if (strncmp(d, rel, n) == 0 && (d[n] == '\0' || d[n] == '/')) {
			inotify_rm_watch(w->ifd, w->dirs[i].wd);
			forget(w, &w->dirs[i]);
		}
	}
}

/* A move out whose move in did not follow: the path left the tree. */
static void flush_move(struct watch *w)
{
	if (w->from_rel == NULL)
		return;
	event_frame(w, "remove", NULL, w->from_rel);
	if (w->from_dir && w->recursive)
		left_dir(w, w->from_rel);
	free(w->from_rel);
	w->from_rel = NULL;
}

/* One inotify event. 1 when the watch ended (and was freed). */
static int handle(struct watch *w, const struct inotify_event *ev)
{
	if (ev->mask & IN_Q_OVERFLOW) {
		flush_move(w);
		w->overflowed = 1;
		return 0;
	}
	struct watched *d = find(w, ev->wd);
	if (d == NULL)
		return 0; /* a watch already forgotten */
	int is_root = d->rel[0] == '\0';
	if (ev->mask & IN_IGNORED) {
		forget(w, d);
		if (is_root) {
			flush_move(w);
			finish(w, "removed", NULL, NULL);
			return 1;
		}
		return 0;
	}
	if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
		if (!is_root)
			return 0; /* the parent said it already */
		flush_move(w);
		if (ev->mask & IN_DELETE_SELF) {
			event_frame(w, "remove", NULL, "");
			finish(w, "removed", NULL, NULL);
		} else {
			finish(w, "moved", NULL, NULL);
		}
		return 1;
	}
	char rel[PATHS_MAX];
	if (join(rel, d->rel, ev->len ? ev->name : NULL) < 0)
		return 0;
	int is_dir = (ev->mask & IN_ISDIR) != 0;
	if (ev->mask & IN_MOVED_TO && w->from_rel && w->from_cookie == ev->cookie) {
		event_frame(w, "rename", w->from_rel, rel);
		if (is_dir && w->recursive)
			moved_dir(w, w->from_rel, rel);
		free(w->from_rel);
		w->from_rel = NULL;
		return 0;
	}
	flush_move(w);
	if (ev->mask & IN_MOVED_FROM) {
		w->from_rel = strdup(rel);
		w->from_cookie = ev->cookie;
		w->from_dir = is_dir;
		if (w->from_rel == NULL)
			w->overflowed = 1;
		return 0;
	}
	if (ev->mask & IN_MODIFY) {
		const char *name = ev->len ? ev->name : "";
		if (w->last_modify_wd == ev->wd && strcmp(w->last_modify, name) == 0)
			return 0;
		w->last_modify_wd = ev->wd;
		snprintf(w->last_modify, sizeof w->last_modify, "%s", name);
		event_frame(w, "modify", NULL, rel);
		return 0;
	}
	w->last_modify_wd = -1;
	if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
		event_frame(w, "create", NULL, rel);
		if (is_dir && w->recursive && follow_new_dir(w, rel)) {
			finish(w, NULL, "watchLimitReached", "the watched tree grew past the 4096 directories "
			       "a watch follows");
			return 1;
		}
	} else if (ev->mask & IN_DELETE) {
		event_frame(w, "remove", NULL, rel);
	}
	return 0;
}

static void on_readable(evutil_socket_t fd, short what, void *ctx)
{
	(void)what;
	struct watch *w = ctx;
	for (;;) {
		ssize_t n = read(fd, w->buf, WATCH_READ_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		for (ssize_t at = 0; at < n;) {
			const struct inotify_event *ev = (const struct inotify_event *)(w->buf + at);
			at += (ssize_t)(sizeof *ev + ev->len);
			if (handle(w, ev))
				return;
		}
	}
	/* A move out and its move in come in one read: one still alone here left the tree. */
	flush_move(w);
	w->last_modify_wd = -1;
}

void fs_watch(struct http_request *req)
{
	char *p = NULL;
	size_t plen = 0;
	int recursive = 0;
	uint64_t timeout_ms = 0, keepalive_ms = 0;
	const struct fs_member members[] = {
		{ "path", FS_STRING, 1, &p, &plen, NULL, NULL },
		{ "recursive", FS_BOOL, 0, NULL, NULL, &recursive, NULL },
		{ "timeoutMs", FS_UINT, 1, NULL, NULL, NULL, &timeout_ms },
		{ "keepaliveMs", FS_UINT, 0, NULL, NULL, NULL, &keepalive_ms },
	};
	char rel[PATHS_MAX];
	struct watch *w = NULL;
	if (fs_read_body(req, members, 4) < 0 || fs_normalize(req, p, plen, rel) < 0)
		goto fail;
	if (timeout_ms == 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: timeoutMs must be above 0");
		goto fail;
	}
	/* keepaliveMs, when given, is the exec stream's (docs/protocol.md §6 keepalive). */
	if (keepalive_ms != 0 && (keepalive_ms < KEEPALIVE_MIN_MS || keepalive_ms > KEEPALIVE_MAX_MS)) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: keepaliveMs must be from %d to %d",
			    KEEPALIVE_MIN_MS, KEEPALIVE_MAX_MS);
		goto fail;
	}
	if (timeout_ms > WATCH_TIMEOUT_MAX_MS)
		timeout_ms = WATCH_TIMEOUT_MAX_MS;
	if (streams >= WATCH_STREAMS_MAX) {
		reply_error(req, 429, "WATCH_LIMIT_REACHED", "the agent follows %d watches at once; "
			    "end one first", WATCH_STREAMS_MAX);
		goto fail;
	}
	if ((w = calloc(1, sizeof *w)) == NULL) {
		reply_out_of_memory(req, "watch a path");
		goto fail;
	}
	streams++;
	w->req = req;
	w->ifd = -1;
	w->last_modify_wd = -1;
	w->recursive = recursive;
	memcpy(w->root_rel, rel, strlen(rel) + 1);
	int rootfd;
	if (paths_open(rel, O_PATH, 0, &rootfd) != PATH_OK) {
		reply_fs_errno(req, errno, p, plen, "watch a path", 0);
		goto fail;
	}
	struct stat st;
	int r = fstat(rootfd, &st);
	w->is_dir = r == 0 && S_ISDIR(st.st_mode);
	w->shown_len = fs_shown_path(rel, w->shown);
	w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	w->pending = evbuffer_new();
	w->buf = malloc(WATCH_READ_BUF);
	if (r < 0 || w->ifd < 0 || w->pending == NULL || w->buf == NULL) {
		int err = r < 0 || w->ifd < 0 ? errno : ENOMEM;
		close(rootfd);
		reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation 'watch a path' failed: %s",
			    strerror(err));
		goto fail;
	}
	if (w->is_dir) {
		r = add_dir(w, "");
		sk_walk *walk = recursive && r == 0 ? sk_walk_new(rootfd, fs_open_beneath, FS_WALK_NAMES_MAX) : NULL;
		struct sk_walk_entry e;
		while (walk && r == 0 && sk_walk_next(walk, &e) == 1)
			if (!e.leaving && S_ISDIR(e.st.st_mode))
				r = add_dir(w, e.path);
		sk_walk_free(walk);
	} else {
		char proc[64];
		snprintf(proc, sizeof proc, "/proc/self/fd/%d", rootfd);
		int wd = inotify_add_watch(w->ifd, proc, FILE_EVENTS);
		char *copy = strdup("");
		if (wd < 0 || copy == NULL || (w->dirs = malloc(sizeof *w->dirs)) == NULL) {
			free(copy);
			r = -1;
		} else {
			w->dirs[0] = (struct watched){ wd, copy };
			w->ndirs = w->cap = 1;
		}
	}
	int saved = errno;
	close(rootfd);
	errno = saved;
	if (r != 0) {
		char shown[REPLY_SHOWN_PATH_MAX];
		util_printable(p, plen, shown, sizeof shown);
		if (r == 1 || errno == ENOSPC)
			reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' holds more directories "
				    "than a watch follows (%d, within the machine's inotify watches); watch a "
				    "smaller tree", shown, WATCH_DIRS_MAX);
		else
			reply_fs_errno(req, errno, p, plen, "watch a path", 0);
		goto fail;
	}
	w->readable = event_new(agent.base, w->ifd, EV_READ | EV_PERSIST, on_readable, w);
	w->deadline = evtimer_new(agent.base, on_deadline, w);
	struct timeval tv = { (time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000 };
	if (w->readable == NULL || w->deadline == NULL || event_add(w->readable, NULL) < 0 ||
	    evtimer_add(w->deadline, &tv) < 0) {
		reply_out_of_memory(req, "watch a path");
		goto fail;
	}
	if (http_reply_start(req, 200, "application/x-ndjson", -1) < 0) {
		http_reply_end(req);
		goto fail;
	}
	if (keepalive_ms && (w->keepalive = keepalive_start(req, keepalive_ms, FRAMING_NDJSON)) == NULL) {
		http_reply_cut(req);
		http_reply_end(req);
		goto fail;
	}
	http_reply_watch(req, on_drained, on_gone, w);
	free(p);
	return;
fail:
	if (w)
		watch_free(w);
	free(p);
}
