/* fs.c — see fs.h: list, stat, remove, rename, and what the fs routes share. */
#include "fs.h"

#include "common/json.h"
#include "common/tree_remove.h"
#include "common/walk.h"
#include "fserror.h"
#include "handler.h"
#include "http.h"
#include "paths.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <event2/buffer.h>

/* A list level's names are chosen in batches (the smallest names after the last one taken, in
 * one pass over the directory): the listed directory's own level takes up to a whole page at
 * once, so a directory of 10,000 entries is read once for a page of them; a deeper level takes
 * 1024 at a time. A level holds 272 bytes a name it chose (the name, its sort key and its
 * place), so a page at the deepest holds 10,000 + 31 × 1024 names (about 11 MiB) at the worst. */
#define LIST_BATCH_DEEP 1024
/* One getdents64 call's buffer. */
#define DENTS_BUF (32 * 1024)

int fs_open_beneath(int dirfd, const char *rel, int flags, mode_t mode)
{
	int fd;
	return paths_open_at(dirfd, rel, flags, mode, &fd) == PATH_OK ? fd : -1;
}

int fs_normalize(struct http_request *req, const char *p, size_t len, char *rel)
{
	const char *why = paths_normalize(p, len, rel);
	if (why) {
		reply_path_refused(req, p, len, why);
		return -1;
	}
	return 0;
}

size_t fs_shown_path(const char *rel, char *out)
{
	if (strcmp(rel, ".") == 0) {
		memcpy(out, "/", 2);
		return 1;
	}
	size_t n = strlen(rel);
	out[0] = '/';
	memcpy(out + 1, rel, n + 1);
	return n + 1;
}

/* ---- request bodies ---- */

/* What fs_read_body has read of a body so far, as read_json_body hands its members over. */
struct body_read {
	const struct fs_member *members;
	size_t n;
	unsigned seen;
	sk_json_str strings[8];   /* a string member's span, unescaped once the body is whole */
};

static const char *body_member(void *ctx, sk_json *j, const sk_json_str *key)
{
	struct body_read *br = ctx;
	size_t i = 0;
	while (i < br->n && !sk_json_str_is(key, br->members[i].name))
		i++;
	if (i == br->n) {
		sk_json_skip(j);
		return NULL;
	}
	const struct fs_member *m = &br->members[i];
	/* Which copy of a member given twice counts would be a guess, and readers guess
	 * differently. */
	if (br->seen & (1u << i)) {
		sk_json_skip(j);
		return "a member appears twice";
	}
	br->seen |= 1u << i;
	enum sk_json_kind kind = sk_json_peek(j);
	if (m->type == FS_STRING && kind == SK_JSON_STRING) {
		sk_json_string(j, &br->strings[i]);
		return NULL;
	}
	if (m->type == FS_BOOL && (kind == SK_JSON_TRUE || kind == SK_JSON_FALSE)) {
		sk_json_bool(j, m->flag);
		return NULL;
	}
	const char *wrong = m->type == FS_STRING ? "a member that must be a string is not one"
			    : m->type == FS_BOOL ? "a member that must be a boolean is not one"
						 : "a member that must be a whole number is not one";
	/* A number read but no whole one leaves the reader failed, which answers for the body. */
	if (m->type == FS_UINT && kind == SK_JSON_NUMBER)
		return sk_json_u64(j, m->num) == 0 ? NULL : wrong;
	sk_json_skip(j);
	return wrong;
}

int fs_read_body(struct http_request *req, const struct fs_member *members, size_t n)
{
	struct body_read br = { members, n, 0, { { NULL, 0, 0 } } };
	if (read_json_body(req, "read the request", body_member, &br) < 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (members[i].required && !(br.seen & (1u << i))) {
			reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s is required",
				    members[i].name);
			return -1;
		}
		if (members[i].type != FS_STRING || !(br.seen & (1u << i)))
			continue;
		const sk_json_str *s = &br.strings[i];
		if ((*members[i].str = malloc(s->len + 1)) == NULL) {
			reply_out_of_memory(req, "read the request");
			return -1;
		}
		*members[i].len = sk_json_unescape(s, *members[i].str);
		(*members[i].str)[*members[i].len] = '\0';
	}
	return 0;
}

/* A query parameter that is a whole number in [min, max], or def when absent. 0; or -1 after
 * answering 400. */
static int query_number(struct http_request *req, const char *name, unsigned long min,
			unsigned long max, unsigned long def, unsigned long *out)
{
	char *v;
	size_t n;
	int r = request_param(req, name, &v, &n);
	if (r == -1) {
		*out = def;
		return 0;
	}
	if (r == -3) {
		reply_out_of_memory(req, "read the request");
		return -1;
	}
	unsigned long value = 0;
	int ok = r == 0 && n > 0 && n <= 9;
	for (size_t i = 0; ok && i < n; i++) {
		ok = v[i] >= '0' && v[i] <= '9';
		value = value * 10 + (unsigned long)(v[i] - '0');
	}
	free(v);
	if (!ok || value < min || value > max) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s must be a whole number from %lu to %lu",
			    name, min, max);
		return -1;
	}
	*out = value;
	return 0;
}

/* ---- entries ---- */

static const char *type_name(mode_t mode)
{
	return S_ISREG(mode) ? "file" : S_ISDIR(mode) ? "dir" : S_ISLNK(mode) ? "symlink" : "other";
}

/* The longest entry's JSON: a name, a path and a link's target, every byte escaped as \u00XX,
 * and the numbers around them. */
#define ENTRY_JSON_MAX (6 * (255 + 2 * PATHS_MAX) + 256)

/* s as a JSON string, quotes included, at out; returns the bytes written. Bytes from 0x80 pass
 * as they are (a name is the filesystem's bytes), as util_json_string writes them. */
static size_t json_string_at(char *out, const char *s, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;
	out[o++] = '"';
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c != '"' && c != '\\') {
			out[o++] = (char)c;
		} else if (c == '"' || c == '\\') {
			out[o++] = '\\';
			out[o++] = (char)c;
		} else {
			memcpy(out + o, "\\u00", 4);
			out[o + 4] = hex[c >> 4];
			out[o + 5] = hex[c & 15];
			o += 6;
		}
	}
	out[o++] = '"';
	return o;
}

/* v in decimal at out; returns the digits written. */
static size_t decimal_at(char *out, unsigned long long v)
{
	char digits[20];
	size_t n = 0;
	do {
		digits[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v > 0);
	for (size_t i = 0; i < n; i++)
		out[i] = digits[n - 1 - i];
	return n;
}

/* {"name":…,"path":…,"type":…,"size":…,"mode":…,"mtime":…[,"target":…]} for name in dirfd,
 * whose caller path is path, built whole and added at once. The numbers are written by hand: a
 * page formats ten thousand entries, and snprintf's format parsing was a tenth of the agent's
 * time for it. -1 when memory ran out. */
static int entry_json(struct evbuffer *b, const char *name, size_t name_len, const char *path,
		      size_t path_len, int dirfd, const struct stat *st)
{
	/* One entry at a time in a single-threaded loop: one buffer serves every listing. */
	static char out[ENTRY_JSON_MAX];
	char target[PATHS_MAX];
	ssize_t tn = -1;
	if (S_ISLNK(st->st_mode))
		tn = readlinkat(dirfd, name, target, sizeof target - 1);
	size_t o = 0;
	memcpy(out, "{\"name\":", 8);
	o = 8;
	o += json_string_at(out + o, name, name_len);
	memcpy(out + o, ",\"path\":", 8);
	o += 8;
	o += json_string_at(out + o, path, path_len);
	const char *type = type_name(st->st_mode);
	size_t type_len = strlen(type);
	memcpy(out + o, ",\"type\":\"", 9);
	o += 9;
	memcpy(out + o, type, type_len);
	o += type_len;
	memcpy(out + o, "\",\"size\":", 9);
	o += 9;
	/* A size is never negative; as %lld would show one, it is shown signed. */
	if (st->st_size < 0)
		out[o++] = '-';
	o += decimal_at(out + o, st->st_size < 0 ? 0ULL - (unsigned long long)st->st_size
						 : (unsigned long long)st->st_size);
	memcpy(out + o, ",\"mode\":", 8);
	o += 8;
	o += decimal_at(out + o, (unsigned)(st->st_mode & 07777));
	memcpy(out + o, ",\"mtime\":", 9);
	o += 9;
	long long sec = (long long)st->st_mtim.tv_sec;
	if (sec < 0)
		out[o++] = '-';
	o += decimal_at(out + o, sec < 0 ? 0ULL - (unsigned long long)sec : (unsigned long long)sec);
	out[o++] = '.';
	unsigned long nsec = (unsigned long)st->st_mtim.tv_nsec;
	for (int i = 8; i >= 0; i--, nsec /= 10)
		out[o + (size_t)i] = (char)('0' + nsec % 10);
	o += 9;
	if (tn >= 0) {
		memcpy(out + o, ",\"target\":", 10);
		o += 10;
		o += json_string_at(out + o, target, (size_t)tn);
	}
	out[o++] = '}';
	return evbuffer_add(b, out, o);
}

/* ---- list ---- */

struct lister {
	struct http_request *req;
	int rootfd;      /* the listed directory, O_PATH: each level is opened again beneath it */
	struct evbuffer *out;
	unsigned long limit, count, depth_max;
	int full;        /* the page is done: count or bytes reached */
	int failed;      /* memory ran out (answered by the caller) */
	char shown[PATHS_MAX + 1]; /* the listed directory as the caller names it, "/" appended */
	size_t shown_len;
	char path[PATHS_MAX];      /* the entry's path relative to the listed directory */
	char *dents;
	int first;
};

/* A batch of names, the smallest ones after a given name: a max-heap of slots while the
 * directory is read (the largest kept name on top, replaced by any smaller one), then sorted.
 * Each slot also holds its name's first eight bytes as a big-endian number (zero-padded), which
 * orders names as strcmp does: most comparisons are one of those, and strcmp decides only
 * between names that share their first eight bytes. Sorting a directory of 10,000 names by
 * strcmp alone was an eighth of the agent's time for its listing. */
struct batch {
	char (*names)[256];
	uint64_t *keys;  /* by slot */
	size_t *heap;    /* slot numbers */
	size_t n, cap;
};

static uint64_t name_key(const char *name, size_t len)
{
	uint64_t k = 0;
	for (size_t i = 0; i < 8; i++)
		k = k << 8 | (i < len ? (unsigned char)name[i] : 0);
	return k;
}

/* Orders a name (with its key) against a slot's, as strcmp would. */
static int name_cmp(const struct batch *b, uint64_t key, const char *name, size_t slot)
{
	if (key != b->keys[slot])
		return key < b->keys[slot] ? -1 : 1;
	return strcmp(name, b->names[slot]);
}

static int slot_less(const struct batch *b, size_t i, size_t j)
{
	size_t si = b->heap[i];
	return name_cmp(b, b->keys[si], b->names[si], b->heap[j]) < 0;
}

static void heap_swap(struct batch *b, size_t i, size_t j)
{
	size_t t = b->heap[i];
	b->heap[i] = b->heap[j];
	b->heap[j] = t;
}

static void sift_down(struct batch *b, size_t i, size_t n)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && slot_less(b, m, l))
			m = l;
		if (r < n && slot_less(b, m, r))
			m = r;
		if (m == i)
			return;
		heap_swap(b, i, m);
		i = m;
	}
}

static void offer(struct batch *b, const char *name, size_t len)
{
	if (len > 255)
		return; /* no filesystem here names one so: nothing a caller could use */
	uint64_t key = name_key(name, len);
	if (b->n < b->cap) {
		size_t i = b->n++;
		b->heap[i] = i;
		b->keys[i] = key;
		memcpy(b->names[i], name, len + 1);
		while (i > 0 && slot_less(b, (i - 1) / 2, i)) {
			heap_swap(b, i, (i - 1) / 2);
			i = (i - 1) / 2;
		}
	} else if (name_cmp(b, key, name, b->heap[0]) < 0) {
		b->keys[b->heap[0]] = key;
		memcpy(b->names[b->heap[0]], name, len + 1);
		sift_down(b, 0, b->n);
	}
}

/* Fills b with the smallest names of dirfd after `after` (all when NULL), in order. */
static int select_names(struct lister *l, int dirfd, const char *after, struct batch *b)
{
	b->n = 0;
	if (lseek(dirfd, 0, SEEK_SET) < 0)
		return -1;
	for (;;) {
		long n = syscall(SYS_getdents64, dirfd, l->dents, DENTS_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		if (n == 0)
			break;
		for (long at = 0; at < n;) {
			/* linux_dirent64: ino, off, reclen, type, then the name. */
			unsigned short reclen;
			memcpy(&reclen, l->dents + at + 16, sizeof reclen);
			const char *name = l->dents + at + 19;
			at += reclen;
			if (name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0')))
				continue;
			if (after && strcmp(name, after) <= 0)
				continue;
			offer(b, name, strlen(name));
		}
	}
	for (size_t end = b->n; end > 1; end--) {
		heap_swap(b, 0, end - 1);
		sift_down(b, 0, end - 1);
	}
	return 0;
}

static int emit(struct lister *l, int dirfd, const char *name, size_t name_len, size_t path_len,
		const struct stat *st)
{
	char shown[2 * PATHS_MAX + 2];
	memcpy(shown, l->shown, l->shown_len);
	memcpy(shown + l->shown_len, l->path, path_len + 1);
	if ((!l->first && evbuffer_add(l->out, ",", 1) < 0) ||
	    entry_json(l->out, name, name_len, shown, l->shown_len + path_len, dirfd, st) < 0) {
		l->failed = 1;
		return -1;
	}
	l->first = 0;
	if (++l->count >= l->limit || evbuffer_get_length(l->out) >= FS_LIST_PAGE_BYTES)
		l->full = 1;
	return 0;
}

static int list_level(struct lister *l, int *dirfd, size_t prefix_len, unsigned long depth,
		      const char *cursor);

/*
 * Lists the directory name (in *dirfd, the level at prefix_len) one level deeper, when the
 * depth allows; it may have gone or become something else since it was seen, which only ends
 * that branch. The level's own descriptor is let go meanwhile and opened again by its path
 * beneath the listed directory after (and must be the same directory), so a listing holds two
 * directories open whatever its depth.
 */
static int descend(struct lister *l, int *dirfd, size_t prefix_len, const char *name, size_t path_len,
		   unsigned long depth, const char *cursor)
{
	if (depth >= l->depth_max)
		return 0;
	int fd;
	struct stat own, again;
	if (fstat(*dirfd, &own) < 0)
		return -1;
	if (paths_open_at(*dirfd, name, O_RDONLY | O_DIRECTORY | O_NOCTTY, 0, &fd) != PATH_OK)
		return errno == ENOENT || errno == ENOTDIR || errno == ELOOP ? 0 : -1;
	close(*dirfd);
	*dirfd = -1;
	int r = list_level(l, &fd, path_len, depth + 1, cursor);
	int saved = errno;
	if (fd >= 0)
		close(fd);
	char rel[PATHS_MAX];
	memcpy(rel, l->path, prefix_len);
	rel[prefix_len] = '\0';
	if (paths_open_at(l->rootfd, prefix_len ? rel : ".", O_RDONLY | O_DIRECTORY | O_NOCTTY, 0, dirfd) != PATH_OK) {
		*dirfd = -1;
		return -1;
	}
	if (fstat(*dirfd, &again) < 0 || again.st_dev != own.st_dev || again.st_ino != own.st_ino) {
		/* The directory was replaced while its entries were listed: the page cannot go on
		 * from a place that is no longer there. */
		errno = ESTALE;
		return -1;
	}
	errno = saved;
	return r;
}

/*
 * One directory of the listing, in name order, each entry followed by its own entries while
 * the depth allows (so a page ends anywhere in the tree). With a cursor (the path after which
 * the last page stopped, from this level down), the walk resumes right after it.
 */
static int list_level(struct lister *l, int *dirfd, size_t prefix_len, unsigned long depth,
		      const char *cursor)
{
	char after[256] = "";
	int has_after = 0;
	if (cursor) {
		const char *slash = strchr(cursor, '/');
		size_t n = slash ? (size_t)(slash - cursor) : strlen(cursor);
		if (n >= sizeof after)
			n = sizeof after - 1;
		memcpy(after, cursor, n);
		after[n] = '\0';
		has_after = 1;
		/* The cursor's own entry was sent, its entries perhaps not all. */
		size_t at = prefix_len + (prefix_len > 0);
		if (at + n + 1 <= PATHS_MAX) {
			if (prefix_len > 0)
				l->path[prefix_len] = '/';
			memcpy(l->path + at, after, n + 1);
			if (descend(l, dirfd, prefix_len, after, at + n, depth, slash ? slash + 1 : NULL) < 0)
				return -1;
			if (l->full || l->failed)
				return 0;
		}
	}
	struct batch b = { NULL, NULL, NULL, 0, depth == 1 ? FS_LIST_LIMIT_MAX : LIST_BATCH_DEEP };
	if (b.cap > l->limit - l->count)
		b.cap = l->limit - l->count;
	b.names = malloc(b.cap * sizeof *b.names);
	b.keys = malloc(b.cap * sizeof *b.keys);
	b.heap = malloc(b.cap * sizeof *b.heap);
	if (b.names == NULL || b.keys == NULL || b.heap == NULL) {
		free(b.names);
		free(b.keys);
		free(b.heap);
		l->failed = 1;
		return -1;
	}
	int r = 0;
	for (;;) {
		if (select_names(l, *dirfd, has_after ? after : NULL, &b) < 0) {
			r = -1;
			break;
		}
		for (size_t i = 0; i < b.n && !l->full && !l->failed; i++) {
			const char *name = b.names[b.heap[i]];
			struct stat st;
			if (fstatat(*dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
				if (errno == ENOENT)
					continue;
				r = -1;
				break;
			}
			size_t n = strlen(name), at = prefix_len + (prefix_len > 0);
			if (at + n + 1 > PATHS_MAX)
				continue; /* no caller could name it */
			if (prefix_len > 0)
				l->path[prefix_len] = '/';
			memcpy(l->path + at, name, n + 1);
			if (emit(l, *dirfd, name, n, at + n, &st) < 0 ||
			    (S_ISDIR(st.st_mode) && !l->full &&
			     descend(l, dirfd, prefix_len, name, at + n, depth, NULL) < 0)) {
				r = -1;
				break;
			}
		}
		if (r < 0 || l->full || l->failed || b.n < b.cap)
			break;
		snprintf(after, sizeof after, "%s", b.names[b.heap[b.n - 1]]);
		has_after = 1;
	}
	free(b.names);
	free(b.keys);
	free(b.heap);
	return r;
}

/* A page goes to its connection this much at a time, as the connection drains. */
#define PAGE_PIECE (64 * 1024)

/* Bytes of list pages made and not yet handed to their connections, all callers together. */
static size_t pages_in_flight;

/* A page on its way to its caller: moved to the connection a piece at a time as it drains. */
struct page_send {
	struct http_request *req;
	struct evbuffer *page;
	size_t charged;   /* what of pages_in_flight is this page's */
};

static void page_free(struct page_send *ps)
{
	pages_in_flight -= ps->charged;
	evbuffer_free(ps->page);
	free(ps);
}

static void page_gone(void *ctx)
{
	page_free(ctx);
}

static void page_pump(void *ctx)
{
	struct page_send *ps = ctx;
	while (http_reply_queued(ps->req) < HTTP_OUTPUT_HIGH && evbuffer_get_length(ps->page) > 0) {
		struct evbuffer *piece = evbuffer_new();
		int moved = piece ? evbuffer_remove_buffer(ps->page, piece, PAGE_PIECE) : -1;
		if (moved < 0 || http_reply_chunk(ps->req, piece) < 0) {
			/* The length was announced: a page cut short is no page to its caller. */
			if (piece)
				evbuffer_free(piece);
			http_reply_hold_unsent(ps->req, 0);
			http_reply_cut(ps->req);
			http_reply_end(ps->req);
			page_free(ps);
			return;
		}
		evbuffer_free(piece);
		size_t left = evbuffer_get_length(ps->page);
		pages_in_flight -= ps->charged - left;
		ps->charged = left;
	}
	if (evbuffer_get_length(ps->page) > 0)
		return; /* the rest when the connection drains */
	http_reply_hold_unsent(ps->req, 0);
	http_reply_end(ps->req);
	page_free(ps);
}

/* Sends a made page (consumed) as the caller takes it. */
static void send_page(struct http_request *req, struct evbuffer *page)
{
	struct page_send *ps = calloc(1, sizeof *ps);
	if (ps == NULL) {
		evbuffer_free(page);
		reply_out_of_memory(req, "list a directory");
		return;
	}
	ps->req = req;
	ps->page = page;
	ps->charged = evbuffer_get_length(page);
	pages_in_flight += ps->charged;
	if (http_reply_start(req, 200, "application/json", (int64_t)ps->charged) < 0) {
		http_reply_end(req);
		page_free(ps);
		return;
	}
	/* What the kernel takes of a page is no longer charged: it takes one piece at most. */
	http_reply_hold_unsent(req, PAGE_PIECE);
	http_reply_watch(req, page_pump, page_gone, ps);
	page_pump(ps);
}

void fs_list(struct http_request *req)
{
	size_t plen, clen = 0;
	char *p = request_path(req, &plen), *cursor = NULL;
	char rel[PATHS_MAX], crel[PATHS_MAX];
	struct lister l;
	memset(&l, 0, sizeof l);
	l.req = req;
	l.first = 1;
	int dirfd = -1;
	l.rootfd = -1;
	if (p == NULL)
		return;
	if (fs_normalize(req, p, plen, rel) < 0 ||
	    query_number(req, "depth", 1, FS_LIST_DEPTH_MAX, 1, &l.depth_max) < 0 ||
	    query_number(req, "limit", 1, FS_LIST_LIMIT_MAX, FS_LIST_LIMIT_DEFAULT, &l.limit) < 0)
		goto out;
	int r = request_param(req, "cursor", &cursor, &clen);
	if (r == -3) {
		reply_out_of_memory(req, "list a directory");
		goto out;
	}
	/* A cursor is what an earlier page said: a relative path that climbs nowhere. */
	if (r == -2 || (r == 0 && (clen == 0 || cursor[0] == '/' ||
				   paths_normalize(cursor, clen, crel) != NULL || strcmp(crel, ".") == 0))) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the cursor is not one a page gave");
		goto out;
	}
	/* Pages callers have not taken yet are bounded all together; past it, ask again later. */
	if (pages_in_flight + FS_LIST_PAGE_BYTES + 65536 > FS_LIST_IN_FLIGHT) {
		reply_error(req, 503, "AGENT_BUSY", "list pages waiting for their callers are over the "
			    "agent's budget (%zu bytes); retry", FS_LIST_IN_FLIGHT);
		goto out;
	}
	if (paths_open(rel, O_RDONLY | O_DIRECTORY | O_NOCTTY, 0, &dirfd) != PATH_OK) {
		int err = errno;
		if (err == ENOTDIR) {
			char shown[REPLY_SHOWN_PATH_MAX];
			util_printable(p, plen, shown, sizeof shown);
			reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' is not a directory", shown);
		} else {
			reply_fs_errno(req, err, p, plen, "list a directory", 0);
		}
		dirfd = -1;
		goto out;
	}
	l.shown_len = fs_shown_path(rel, l.shown);
	if (l.shown[l.shown_len - 1] != '/')
		l.shown[l.shown_len++] = '/';
	l.out = evbuffer_new();
	l.dents = malloc(DENTS_BUF);
	if (l.out == NULL || l.dents == NULL || evbuffer_add(l.out, "{\"entries\":[", 12) < 0) {
		reply_out_of_memory(req, "list a directory");
		goto out;
	}
	if (paths_open(rel, O_PATH | O_DIRECTORY, 0, &l.rootfd) != PATH_OK) {
		l.rootfd = -1;
		reply_fs_errno(req, errno, p, plen, "list a directory", 0);
		goto out;
	}
	if (list_level(&l, &dirfd, 0, 1, r == 0 ? crel : NULL) < 0 && !l.failed) {
		reply_fs_errno(req, errno, p, plen, "list a directory", 0);
		goto out;
	}
	/* The cursor of a full page is its last entry; a page that ran out of entries has none. */
	if (l.failed || evbuffer_add(l.out, "],\"next\":", 9) < 0 ||
	    (l.full ? util_json_string(l.out, l.path, strlen(l.path)) : evbuffer_add(l.out, "null", 4)) < 0 ||
	    evbuffer_add(l.out, "}", 1) < 0) {
		reply_out_of_memory(req, "list a directory");
		goto out;
	}
	send_page(req, l.out);
	l.out = NULL;
out:
	if (l.out)
		evbuffer_free(l.out);
	free(l.dents);
	if (dirfd >= 0)
		close(dirfd);
	if (l.rootfd >= 0)
		close(l.rootfd);
	free(cursor);
	free(p);
}

/* ---- stat ---- */

void fs_stat(struct http_request *req)
{
	size_t plen;
	char *p = request_path(req, &plen);
	char rel[PATHS_MAX], shown[PATHS_MAX + 1];
	int dirfd = -1;
	struct evbuffer *b = NULL;
	if (p == NULL)
		return;
	if (fs_normalize(req, p, plen, rel) < 0)
		goto out;
	const char *last;
	struct stat st;
	enum path_result r = paths_walk(rel, 0, 1, &dirfd, &last);
	int absent = r == PATH_MISSING || r == PATH_NOT_DIR;
	if (r == PATH_OK && fstatat(dirfd, last, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno != ENOENT && errno != ENOTDIR) {
			reply_fs_errno(req, errno, p, plen, "stat a path", 0);
			goto out;
		}
		absent = 1;
	} else if (r != PATH_OK && !absent) {
		reply_fs_errno(req, errno, p, plen, "stat a path", 0);
		goto out;
	}
	/* Absent is an answer, not an error: stat is how a caller asks. */
	if ((b = evbuffer_new()) == NULL)
		goto oom;
	if (absent) {
		if (evbuffer_add(b, "{\"exists\":false}", 16) < 0)
			goto oom;
	} else {
		size_t n = fs_shown_path(rel, shown);
		const char *name = strcmp(rel, ".") == 0 ? "/" : strrchr(shown, '/') + 1;
		if (evbuffer_add(b, "{\"exists\":true,\"entry\":", 23) < 0 ||
		    entry_json(b, name, strlen(name), shown, n, dirfd, &st) < 0 ||
		    evbuffer_add(b, "}", 1) < 0)
			goto oom;
	}
	reply_json(req, 200, b);
	b = NULL;
	goto out;
oom:
	reply_out_of_memory(req, "stat a path");
out:
	if (b)
		evbuffer_free(b);
	if (dirfd >= 0)
		close(dirfd);
	free(p);
}

/* ---- remove ---- */

void fs_remove(struct http_request *req)
{
	char *p = NULL;
	size_t plen = 0;
	int recursive = 0, dirfd = -1;
	const struct fs_member members[] = {
		{ "path", FS_STRING, 1, &p, &plen, NULL, NULL },
		{ "recursive", FS_BOOL, 0, NULL, NULL, &recursive, NULL },
	};
	char rel[PATHS_MAX];
	if (fs_read_body(req, members, 2) < 0 || fs_normalize(req, p, plen, rel) < 0)
		goto out;
	if (strcmp(rel, ".") == 0) {
		reply_path_refused(req, p, plen, "the sandbox root cannot be removed");
		goto out;
	}
	const char *last;
	enum path_result r = paths_walk(rel, 0, 1, &dirfd, &last);
	/* Idempotent, as terminate is: what is not there is removed already. */
	if (r == PATH_MISSING || r == PATH_NOT_DIR) {
		reply_empty(req, 204);
		goto out;
	}
	if (r != PATH_OK) {
		reply_fs_errno(req, errno, p, plen, "remove a path", 1);
		goto out;
	}
	struct stat st;
	if (fstatat(dirfd, last, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			reply_empty(req, 204);
		else
			reply_fs_errno(req, errno, p, plen, "remove a path", 1);
		goto out;
	}
	int dir = S_ISDIR(st.st_mode);
	if (unlinkat(dirfd, last, dir ? AT_REMOVEDIR : 0) == 0 || errno == ENOENT) {
		reply_empty(req, 204);
		goto out;
	}
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, plen, shown, sizeof shown);
	if (dir && (errno == ENOTEMPTY || errno == EEXIST)) {
		if (!recursive) {
			reply_error(req, 409, "PATH_EXISTS", "Path '%s' is a directory that is not empty: "
				    "remove it with recursive", shown);
			goto out;
		}
		char stopped[NAME_MAX + 1];
		if (sk_tree_remove(dirfd, last, stopped, sizeof stopped) == 0) {
			reply_empty(req, 204);
			goto out;
		}
		int err = errno;
		char at[REPLY_SHOWN_PATH_MAX];
		util_printable(stopped, strlen(stopped), at, sizeof at);
		const struct fs_error *e = fs_error(err, 1);
		if (e->status == 500)
			reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation 'remove a tree' failed at "
				    "'%s': %s", at, strerror(err));
		else
			reply_error(req, e->status, e->code, "Removing '%s' stopped at '%s': %s", shown, at, e->why);
		goto out;
	}
	reply_fs_errno(req, errno, p, plen, "remove a path", 1);
out:
	if (dirfd >= 0)
		close(dirfd);
	free(p);
}

/* ---- rename ---- */

void fs_rename(struct http_request *req)
{
	char *from = NULL, *to = NULL;
	size_t flen = 0, tlen = 0;
	int overwrite = 0, fromdir = -1, todir = -1;
	const struct fs_member members[] = {
		{ "from", FS_STRING, 1, &from, &flen, NULL, NULL },
		{ "to", FS_STRING, 1, &to, &tlen, NULL, NULL },
		{ "overwrite", FS_BOOL, 0, NULL, NULL, &overwrite, NULL },
	};
	char frel[PATHS_MAX], trel[PATHS_MAX];
	if (fs_read_body(req, members, 3) < 0 || fs_normalize(req, from, flen, frel) < 0 ||
	    fs_normalize(req, to, tlen, trel) < 0)
		goto out;
	if (strcmp(frel, ".") == 0 || strcmp(trel, ".") == 0) {
		int f = strcmp(frel, ".") == 0;
		reply_path_refused(req, f ? from : to, f ? flen : tlen, "the sandbox root cannot be renamed or replaced");
		goto out;
	}
	char fshown[REPLY_SHOWN_PATH_MAX], tshown[REPLY_SHOWN_PATH_MAX];
	util_printable(from, flen, fshown, sizeof fshown);
	util_printable(to, tlen, tshown, sizeof tshown);
	size_t fn = strlen(frel);
	if (strncmp(trel, frel, fn) == 0 && trel[fn] == '/') {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' cannot move into itself ('%s')",
			    fshown, tshown);
		goto out;
	}
	const char *flast, *tlast;
	enum path_result r = paths_walk(frel, 0, 1, &fromdir, &flast);
	if (r == PATH_NOT_DIR)
		errno = ENOENT;
	if (r != PATH_OK) {
		reply_fs_errno(req, errno, from, flen, "rename a path", 0);
		goto out;
	}
	/* The new name's directories are made as a write makes them. */
	if (paths_walk(trel, 1, 1, &todir, &tlast) != PATH_OK) {
		reply_fs_errno(req, errno, to, tlen, "rename a path", 1);
		goto out;
	}
	if (strcmp(frel, trel) == 0) {
		struct stat st;
		if (fstatat(fromdir, flast, &st, AT_SYMLINK_NOFOLLOW) < 0)
			reply_fs_errno(req, errno, from, flen, "rename a path", 0);
		else
			reply_empty(req, 204);
		goto out;
	}
	if (syscall(SYS_renameat2, fromdir, flast, todir, tlast, overwrite ? 0 : RENAME_NOREPLACE) == 0) {
		reply_empty(req, 204);
		goto out;
	}
	switch (errno) {
	case ENOENT:
		reply_fs_errno(req, ENOENT, from, flen, "rename a path", 0);
		break;
	case EEXIST:
	case ENOTEMPTY:
		/* Without overwrite anything there; with it, a directory that is not empty. */
		if (!overwrite)
			reply_error(req, 409, "PATH_EXISTS", "Path '%s' is in the way: rename with overwrite "
				    "to replace it", tshown);
		else
			reply_error(req, 409, "PATH_EXISTS", "Path '%s' is in the way: a directory that is "
				    "not empty", tshown);
		break;
	case EISDIR:
	case ENOTDIR:
		reply_error(req, 409, "PATH_EXISTS", "Path '%s' is in the way: a directory and a file "
			    "cannot replace each other", tshown);
		break;
	case EINVAL:
		/* The kernel's own refusal to move a directory beneath itself (seen through a
		 * mount or a race the lexical check could not see). */
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' cannot move into itself ('%s')",
			    fshown, tshown);
		break;
	case EXDEV:
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' and '%s' are on different "
			    "filesystems, which a rename cannot cross (copy, then remove)", fshown, tshown);
		break;
	default:
		reply_fs_errno(req, errno, to, tlen, "rename a path", 1);
	}
out:
	if (fromdir >= 0)
		close(fromdir);
	if (todir >= 0)
		close(todir);
	free(from);
	free(to);
}
