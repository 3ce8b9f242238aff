/* walk.c — see walk.h. */
#include "walk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* One getdents64 call's buffer: a few hundred names a call, whatever the directory's size. */
#define DENTS_BUF (32 * 1024)

/* What the kernel's getdents64 writes (linux_dirent64); glibc declares no such type. */
struct dent64 {
	uint64_t ino;
	int64_t off;
	unsigned short reclen;
	unsigned char type;
	char name[];
};

struct level {
	char *names;        /* the directory's names, each NUL-terminated */
	size_t *offs;       /* where each name starts, in name order */
	size_t count, next;
	size_t charged;     /* bytes of names and offs counted against names_max */
	size_t prefix_len;  /* length of the directory's own path ("" for the root) */
	struct stat st;     /* the directory, to know it again on the way back up */
};

struct sk_walk {
	int rootfd;
	sk_open_fn open_beneath;
	size_t names_max, names_used;
	int curfd;          /* the directory of the deepest level, ours to close */
	struct level *levels;
	size_t depth, cap;
	char path[SK_WALK_PATH_MAX];
	size_t path_len;
	int enter;          /* the last entry returned is a directory to enter next */
	struct stat enter_st;
	int started, done;
	char *dents;
};

sk_walk *sk_walk_new(int rootfd, sk_open_fn open_beneath, size_t names_max)
{
	sk_walk *w = calloc(1, sizeof *w);
	if (w == NULL)
		return NULL;
	if ((w->dents = malloc(DENTS_BUF)) == NULL) {
		free(w);
		return NULL;
	}
	w->rootfd = rootfd;
	w->open_beneath = open_beneath;
	w->names_max = names_max;
	w->curfd = -1;
	return w;
}

static void drop_level(sk_walk *w)
{
	struct level *l = &w->levels[--w->depth];
	free(l->names);
	free(l->offs);
	w->names_used -= l->charged;
}

void sk_walk_free(sk_walk *w)
{
	if (w == NULL)
		return;
	while (w->depth > 0)
		drop_level(w);
	if (w->curfd >= 0)
		close(w->curfd);
	free(w->levels);
	free(w->dents);
	free(w);
}

void sk_walk_prune(sk_walk *w)
{
	w->enter = 0;
}

static int by_name(const void *a, const void *b, void *names)
{
	return strcmp((const char *)names + *(const size_t *)a, (const char *)names + *(const size_t *)b);
}

/* Grows *buf to hold need bytes, charging what it adds against the walk's bound. */
static int grow(sk_walk *w, void **buf, size_t *cap, size_t need, size_t *charged)
{
	if (need <= *cap)
		return 0;
	size_t n = *cap ? *cap : 4096;
	while (n < need)
		n *= 2;
	if (w->names_used - *charged + n > w->names_max) {
		errno = E2BIG;
		return -1;
	}
	void *p = realloc(*buf, n);
	if (p == NULL)
		return -1;
	w->names_used += n - *cap;
	*charged += n - *cap;
	*buf = p;
	*cap = n;
	return 0;
}

/* Reads every name of fd (a directory opened for reading) into a new level, in name order. */
static int push_level(sk_walk *w, int fd, const struct stat *st, size_t prefix_len)
{
	if (w->depth == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 8;
		struct level *l = realloc(w->levels, cap * sizeof *l);
		if (l == NULL)
			return -1;
		w->levels = l;
		w->cap = cap;
	}
	struct level *l = &w->levels[w->depth++];
	memset(l, 0, sizeof *l);
	l->prefix_len = prefix_len;
	l->st = *st;
	size_t names_cap = 0, offs_cap = 0, used = 0;
	for (;;) {
		long n = syscall(SYS_getdents64, fd, w->dents, DENTS_BUF);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			goto fail;
		if (n == 0)
			break;
		for (long at = 0; at < n;) {
			struct dent64 *d = (struct dent64 *)(w->dents + at);
			at += d->reclen;
			if (strcmp(d->name, ".") == 0 || strcmp(d->name, "..") == 0)
				continue;
			size_t len = strlen(d->name) + 1;
			if (grow(w, (void **)&l->names, &names_cap, used + len, &l->charged) < 0 ||
			    grow(w, (void **)&l->offs, &offs_cap, (l->count + 1) * sizeof *l->offs,
				 &l->charged) < 0)
				goto fail;
			memcpy(l->names + used, d->name, len);
			l->offs[l->count++] = used;
			used += len;
		}
	}
	if (l->count > 1)
		qsort_r(l->offs, l->count, sizeof *l->offs, by_name, l->names);
	return 0;
fail:;
	int saved = errno;
	drop_level(w);
	errno = saved;
	return -1;
}

static int same_dir(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Opens rel (or the root itself, "") beneath the root for reading its names; checks it is the
 * directory want says, when want is given. */
static int open_dir(sk_walk *w, int base, const char *rel, const struct stat *want, struct stat *st)
{
	int fd = w->open_beneath(base, *rel ? rel : ".", O_RDONLY | O_DIRECTORY | O_NOCTTY, 0);
	if (fd < 0)
		return -1;
	if (fstat(fd, st) < 0 || (want && !same_dir(want, st))) {
		int saved = errno;
		close(fd);
		errno = want && !same_dir(want, st) ? ESTALE : saved;
		return -1;
	}
	return fd;
}

static int fail(sk_walk *w)
{
	w->done = 1;
	return -1;
}

int sk_walk_next(sk_walk *w, struct sk_walk_entry *e)
{
	if (w->done)
		return 0;
	struct stat st;
	if (!w->started) {
		w->started = 1;
		w->curfd = open_dir(w, w->rootfd, "", NULL, &st);
		if (w->curfd < 0 || push_level(w, w->curfd, &st, 0) < 0)
			return fail(w);
	}
	if (w->enter) {
		w->enter = 0;
		const char *name = w->path + w->levels[w->depth - 1].prefix_len;
		name += *name == '/';
		int fd = open_dir(w, w->curfd, name, &w->enter_st, &st);
		if (fd < 0)
			return fail(w);
		if (push_level(w, fd, &st, w->path_len) < 0) {
			int saved = errno;
			close(fd);
			errno = saved;
			return fail(w);
		}
		close(w->curfd);
		w->curfd = fd;
	}
	for (;;) {
		struct level *l = &w->levels[w->depth - 1];
		if (l->next < l->count) {
			const char *name = l->names + l->offs[l->next++];
			size_t n = strlen(name), at = l->prefix_len + (l->prefix_len > 0);
			if (at + n + 1 > sizeof w->path) {
				errno = ENAMETOOLONG;
				return fail(w);
			}
			if (l->prefix_len > 0)
				w->path[l->prefix_len] = '/';
			memcpy(w->path + at, name, n + 1);
			if (fstatat(w->curfd, name, &e->st, AT_SYMLINK_NOFOLLOW) < 0) {
				if (errno == ENOENT)
					continue; /* gone since the directory was read */
				return fail(w);
			}
			w->path_len = at + n;
			e->path = w->path;
			e->path_len = w->path_len;
			e->name = w->path + at;
			e->dirfd = w->curfd;
			e->depth = (unsigned)w->depth;
			e->leaving = 0;
			if (S_ISDIR(e->st.st_mode)) {
				w->enter = 1;
				w->enter_st = e->st;
			}
			return 1;
		}
		/* This directory is done: back up to its parent, opened again by its path. */
		struct stat left = l->st;
		size_t left_len = l->prefix_len;
		drop_level(w);
		close(w->curfd);
		w->curfd = -1;
		if (w->depth == 0) {
			w->done = 1;
			return 0;
		}
		struct level *parent = &w->levels[w->depth - 1];
		char kept = w->path[parent->prefix_len];
		w->path[parent->prefix_len] = '\0';
		w->curfd = open_dir(w, w->rootfd, w->path, &parent->st, &st);
		w->path[parent->prefix_len] = kept;
		if (w->curfd < 0)
			return fail(w);
		w->path[left_len] = '\0';
		w->path_len = left_len;
		e->path = w->path;
		e->path_len = left_len;
		const char *slash = strrchr(w->path, '/');
		e->name = slash ? slash + 1 : w->path;
		e->dirfd = w->curfd;
		e->st = left;
		e->depth = (unsigned)w->depth;
		e->leaving = 1;
		return 1;
	}
}
