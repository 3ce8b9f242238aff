/* tarstream.c — see tarstream.h. */
#include "tarstream.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define FIBER_ASAN 1
#endif

/*
 * libarchive reads by asking for bytes (a pull), and the stream arrives in pieces the caller
 * pushes. The reader therefore runs on a stack of its own (a fiber, ucontext): asked for bytes
 * it has not got, it switches back to the caller, which returns; the next piece switches in
 * again. One thread, no locks, and the reader's memory is libarchive's own plus this stack.
 */
/* The reader's stack: libarchive's tar reader and the entry handling below use a few KiB of it;
 * the rest is headroom (and what the sanitizers' redzones take). Mapped lazily, with a guard
 * page below it, so that an overflow faults instead of corrupting the heap. */
#define FIBER_STACK ((size_t)512 * 1024)
#define FIBER_GUARD ((size_t)4096)

/* Bytes of the stream gathered before the reader runs on them. A switch to the reader and back
 * costs two system calls (swapcontext saves and restores the signal mask), and the pieces a
 * socket hands over on loopback average 4 KiB: an archive of 10,000 files of 10 KB took 26,000
 * pieces, 52,000 sigprocmask calls and 34,000 writes, where pieces of 64 KiB make libarchive hand
 * most such files over in one block. */
#define UNTAR_GATHER ((size_t)64 * 1024)

/* Characters of an entry's path shown in an error: the message stays a line. */
#define SHOWN_MAX 200

/* A file is written under ".sandkit-tar-", 16 random hex digits and a count, renamed into place
 * when whole. */
#define TMP_PREFIX ".sandkit-tar-"

/* Mode bits kept from an archive: the permissions and the sticky bit; never set-user-ID or
 * set-group-ID, which would hand whoever runs the file the extracting user's rights. */
#define KEPT_MODE 01777

struct failure {
	enum sk_tar_failure kind;
	int err;
	char why[320];
	char entry[SK_WALK_PATH_MAX];
};

static void set_failure(struct failure *f, enum sk_tar_failure kind, int err, const char *entry,
			const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void set_failure(struct failure *f, enum sk_tar_failure kind, int err, const char *entry,
			const char *fmt, ...)
{
	if (f->kind != SK_TAR_OK)
		return; /* the first failure is the one that counts */
	f->kind = kind;
	f->err = err;
	snprintf(f->entry, sizeof f->entry, "%s", entry ? entry : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(f->why, sizeof f->why, fmt, ap);
	va_end(ap);
}

/* An entry's path as an error shows it: printable, and cut short. */
static const char *shown(const char *path, char *buf, size_t size)
{
	size_t o = 0;
	for (const char *p = path; *p && o + 4 < size; p++)
		buf[o++] = (*p < 0x20 || *p == 0x7f) ? '?' : *p;
	if (path[o] != '\0' && o + 4 >= size) {
		memcpy(buf + o, "...", 3);
		o += 3;
	}
	buf[o] = '\0';
	return buf;
}

/* A temporary name beside an entry: the extraction's random prefix, so that two writers never
 * meet, and a count, so that one extraction's names never repeat. */
static void tmp_name(char *out, size_t size, const char *prefix, unsigned long long *count)
{
	snprintf(out, size, TMP_PREFIX "%s-%llx", prefix, (*count)++);
}

/*
 * An entry's path, relative to the target: leading "./" and '.' components dropped, "" for the
 * target itself. NULL when acceptable, else why not.
 */
static const char *entry_path(const char *raw, char *out)
{
	if (raw == NULL)
		return "has no path";
	if (raw[0] == '/')
		return "is an absolute path";
	size_t o = 0;
	const char *p = raw;
	while (*p) {
		while (*p == '/')
			p++;
		const char *start = p;
		while (*p && *p != '/')
			p++;
		size_t n = (size_t)(p - start);
		if (n == 0 || (n == 1 && start[0] == '.'))
			continue;
		if (n == 2 && start[0] == '.' && start[1] == '.')
			return "climbs out of the target with '..'";
		if (o + (o > 0) + n + 1 > SK_WALK_PATH_MAX)
			return "has a path longer than 4095 bytes";
		if (o > 0)
			out[o++] = '/';
		memcpy(out + o, start, n);
		o += n;
	}
	out[o] = '\0';
	return NULL;
}

/* ---- extraction ---- */

/* A directory whose mode and time are set once the archive has left it. */
struct dir_meta {
	size_t len;          /* its path is meta_path[0..len) */
	mode_t mode;
	struct timespec mtime;
};

enum fiber_state { FIBER_NEW, FIBER_WAITING, FIBER_DONE };

struct sk_untar {
	int targetfd;
	sk_open_fn open_beneath;
	uint64_t max_entries, max_bytes, entries, bytes;
	struct failure f;
	/* the fiber */
	ucontext_t caller, reader;
	void *stack;
	enum fiber_state state;
	const char *in;
	size_t in_len;
	int in_end, stopping, saw_end;
	char *gather;              /* UNTAR_GATHER bytes: the stream's pieces, gathered */
	size_t gathered;
#ifdef FIBER_ASAN
	const void *caller_bottom;
	size_t caller_size;
#endif
	/* the parent directory of the last entry, kept for the next one in it */
	int parent_fd;
	char parent_path[SK_WALK_PATH_MAX];
	/* the file being written */
	int file_fd;
	char file_tmp[64];
	char tmp_prefix[17];       /* random, one per extraction */
	unsigned long long tmp_count;
	/* directories whose mode and time wait until the archive leaves them: each a prefix of
	 * the next */
	struct dir_meta *metas;
	size_t nmeta, meta_cap;
	char meta_path[SK_WALK_PATH_MAX];
	int has_root_meta;
	struct dir_meta root_meta;
	char path[SK_WALK_PATH_MAX];  /* the entry being extracted */
};

static void to_caller(sk_untar *u)
{
#ifdef FIBER_ASAN
	void *fake = NULL;
	__sanitizer_start_switch_fiber(&fake, u->caller_bottom, u->caller_size);
	swapcontext(&u->reader, &u->caller);
	__sanitizer_finish_switch_fiber(fake, &u->caller_bottom, &u->caller_size);
#else
	swapcontext(&u->reader, &u->caller);
#endif
}

static void to_reader(sk_untar *u)
{
#ifdef FIBER_ASAN
	void *fake = NULL;
	__sanitizer_start_switch_fiber(&fake, (char *)u->stack + FIBER_GUARD, FIBER_STACK);
	swapcontext(&u->caller, &u->reader);
	__sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
	swapcontext(&u->caller, &u->reader);
#endif
}

/* libarchive's read callback, on the fiber: the caller's piece, once; else back to the caller
 * until there is one. 0 is the end of the stream. */
static la_ssize_t read_piece(struct archive *a, void *ctx, const void **buf)
{
	sk_untar *u = ctx;
	while (u->in_len == 0 && !u->in_end && !u->stopping) {
		u->state = FIBER_WAITING;
		to_caller(u);
	}
	if (u->stopping) {
		archive_set_error(a, ECANCELED, "the stream was abandoned");
		return -1;
	}
	if (u->in_len == 0) {
		u->saw_end = 1;
		return 0;
	}
	*buf = u->in;
	la_ssize_t n = (la_ssize_t)u->in_len;
	u->in_len = 0;
	return n;
}

static void entry_failed(sk_untar *u, enum sk_tar_failure kind, int err, const char *why)
{
	char buf[SHOWN_MAX];
	set_failure(&u->f, kind, err, u->path, "entry '%s' %s", shown(u->path, buf, sizeof buf), why);
}

static void entry_errno(sk_untar *u, int err)
{
	/* openat2's refusals: a component that is a symbolic link, or would leave the target. */
	if (err == ELOOP || err == EXDEV)
		entry_failed(u, SK_TAR_REFUSED, err, "goes through a symbolic link");
	else
		entry_failed(u, SK_TAR_ERRNO, err, strerror(err));
}

static void drop_parent(sk_untar *u)
{
	if (u->parent_fd >= 0)
		close(u->parent_fd);
	u->parent_fd = -1;
	u->parent_path[0] = '\0';
}

/*
 * The directory that holds rel (rel's last component left in *last), made where missing
 * (0777 less the umask, as mkdir -p makes), each component opened beneath the one before. The
 * descriptor is kept for the next entry in the same directory.
 */
static int parent_of(sk_untar *u, const char *rel, const char **last)
{
	const char *slash = strrchr(rel, '/');
	size_t plen = slash ? (size_t)(slash - rel) : 0;
	*last = slash ? slash + 1 : rel;
	if (u->parent_fd >= 0 && strlen(u->parent_path) == plen && memcmp(u->parent_path, rel, plen) == 0)
		return u->parent_fd;
	drop_parent(u);
	char want[SK_WALK_PATH_MAX];
	memcpy(want, rel, plen);
	want[plen] = '\0';
	/* Most parents exist already: one resolution of the whole path. */
	int fd = u->open_beneath(u->targetfd, plen ? want : ".", O_PATH | O_DIRECTORY, 0);
	if (fd < 0 && errno == ENOENT) {
		int cur = -1;
		char *p = want;
		for (;;) {
			char *end = strchr(p, '/');
			if (end)
				*end = '\0';
			int base = cur < 0 ? u->targetfd : cur;
			int next = u->open_beneath(base, p, O_PATH | O_DIRECTORY, 0);
			if (next < 0 && errno == ENOENT) {
				if (mkdirat(base, p, 0777) < 0 && errno != EEXIST)
					next = -1;
				else
					next = u->open_beneath(base, p, O_PATH | O_DIRECTORY, 0);
			}
			int saved = errno;
			if (cur >= 0)
				close(cur);
			errno = saved;
			if (next < 0) {
				cur = -1;
				break;
			}
			cur = next;
			if (end == NULL)
				break;
			*end = '/';
			p = end + 1;
		}
		fd = cur;
	}
	if (fd < 0) {
		entry_errno(u, errno);
		return -1;
	}
	u->parent_fd = fd;
	memcpy(u->parent_path, rel, plen);
	u->parent_path[plen] = '\0';
	return fd;
}

/* Sets a directory's mode and time, opened again beneath the target by its path. */
static int apply_meta(sk_untar *u, const char *path, const struct dir_meta *m)
{
	int fd = u->open_beneath(u->targetfd, *path ? path : ".", O_RDONLY | O_DIRECTORY | O_NOCTTY, 0);
	struct timespec times[2] = { { 0, UTIME_OMIT }, m->mtime };
	int ok = fd >= 0 && fchmod(fd, m->mode) == 0 && futimens(fd, times) == 0;
	int saved = errno;
	if (fd >= 0)
		close(fd);
	if (!ok) {
		char buf[SHOWN_MAX];
		set_failure(&u->f, saved == ELOOP || saved == EXDEV ? SK_TAR_REFUSED : SK_TAR_ERRNO, saved,
			    path, "directory '%s' could not take its mode and time: %s",
			    shown(path, buf, sizeof buf), strerror(saved));
		return -1;
	}
	return 0;
}

/* Applies and forgets every waiting directory that does not hold path ("" once the archive
 * ended: all of them). */
static int leave_dirs(sk_untar *u, const char *path)
{
	size_t n = strlen(path);
	while (u->nmeta > 0) {
		struct dir_meta *m = &u->metas[u->nmeta - 1];
		if (n > m->len && path[m->len] == '/' && memcmp(path, u->meta_path, m->len) == 0)
			break;
		u->meta_path[m->len] = '\0';
		int r = apply_meta(u, u->meta_path, m);
		u->nmeta--;
		if (r < 0)
			return -1;
	}
	return 0;
}

static int wait_dir(sk_untar *u, const char *path, mode_t mode, struct timespec mtime)
{
	if (u->nmeta == u->meta_cap) {
		size_t cap = u->meta_cap ? u->meta_cap * 2 : 16;
		struct dir_meta *m = realloc(u->metas, cap * sizeof *m);
		if (m == NULL) {
			set_failure(&u->f, SK_TAR_NO_MEMORY, ENOMEM, path, "out of memory");
			return -1;
		}
		u->metas = m;
		u->meta_cap = cap;
	}
	size_t len = strlen(path);
	memcpy(u->meta_path, path, len + 1);
	u->metas[u->nmeta++] = (struct dir_meta){ len, mode, mtime };
	return 0;
}

static void drop_file(sk_untar *u)
{
	if (u->file_fd >= 0)
		close(u->file_fd);
	u->file_fd = -1;
	if (u->file_tmp[0] && u->parent_fd >= 0)
		unlinkat(u->parent_fd, u->file_tmp, 0);
	u->file_tmp[0] = '\0';
}

/* Moves the temporary name made in parent over last. */
static int put_in_place(sk_untar *u, int parent, const char *last)
{
	if (renameat(parent, u->file_tmp, parent, last) < 0) {
		entry_errno(u, errno);
		return -1;
	}
	u->file_tmp[0] = '\0';
	return 0;
}

static int extract_file(sk_untar *u, struct archive *a, struct archive_entry *e, int parent,
			const char *last)
{
	int64_t size = archive_entry_size(e);
	tmp_name(u->file_tmp, sizeof u->file_tmp, u->tmp_prefix, &u->tmp_count);
	u->file_fd = u->open_beneath(parent, u->file_tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOCTTY, 0600);
	if (u->file_fd < 0) {
		u->file_tmp[0] = '\0';
		entry_errno(u, errno);
		return -1;
	}
	int64_t end = 0; /* where the data written ends: short of the size only for a sparse file */
	for (;;) {
		const void *buf;
		size_t n;
		la_int64_t off;
		int r = archive_read_data_block(a, &buf, &n, &off);
		if (r == ARCHIVE_EOF)
			break;
		if (r < ARCHIVE_WARN) {
			char why[160];
			snprintf(why, sizeof why, "could not be read whole: %s",
				 archive_error_string(a) ? archive_error_string(a) : "the archive is damaged");
			entry_failed(u, SK_TAR_INVALID, 0, why);
			return -1;
		}
		/* A sparse map that writes outside the size its header declared is no archive. */
		if (off < 0 || (uint64_t)off > (uint64_t)size || n > (uint64_t)size - (uint64_t)off) {
			entry_failed(u, SK_TAR_INVALID, 0, "has data outside its declared size");
			return -1;
		}
		const char *p = buf;
		while (n > 0) {
			ssize_t w = pwrite(u->file_fd, p, n, off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0) {
				entry_errno(u, w == 0 ? EIO : errno);
				return -1;
			}
			p += w;
			n -= (size_t)w;
			off += w;
		}
		if (off > end)
			end = off;
	}
	struct timespec times[2] = { { 0, UTIME_OMIT },
				     { archive_entry_mtime(e), archive_entry_mtime_nsec(e) } };
	/* A sparse file's hole at its end has no data block to make it: the size does. */
	if ((end < size && ftruncate(u->file_fd, size) < 0) ||
	    fchmod(u->file_fd, archive_entry_perm(e) & KEPT_MODE & 0777) < 0 ||
	    futimens(u->file_fd, times) < 0) {
		entry_errno(u, errno);
		return -1;
	}
	int fd = u->file_fd;
	u->file_fd = -1;
	if (close(fd) < 0) {
		entry_errno(u, errno);
		return -1;
	}
	return put_in_place(u, parent, last);
}

static int extract_symlink(sk_untar *u, struct archive_entry *e, int parent, const char *last)
{
	const char *target = archive_entry_symlink(e);
	if (target == NULL || *target == '\0') {
		entry_failed(u, SK_TAR_INVALID, 0, "is a symbolic link to nothing");
		return -1;
	}
	if (strlen(target) >= SK_WALK_PATH_MAX) {
		entry_failed(u, SK_TAR_REFUSED, 0, "is a symbolic link longer than 4095 bytes");
		return -1;
	}
	tmp_name(u->file_tmp, sizeof u->file_tmp, u->tmp_prefix, &u->tmp_count);
	if (symlinkat(target, parent, u->file_tmp) < 0) {
		u->file_tmp[0] = '\0';
		entry_errno(u, errno);
		return -1;
	}
	if (put_in_place(u, parent, last) < 0)
		return -1;
	struct timespec times[2] = { { 0, UTIME_OMIT },
				     { archive_entry_mtime(e), archive_entry_mtime_nsec(e) } };
	if (utimensat(parent, last, times, AT_SYMLINK_NOFOLLOW) < 0) {
		entry_errno(u, errno);
		return -1;
	}
	return 0;
}

static int extract_hardlink(sk_untar *u, const char *link, int parent, const char *last)
{
	char source[SK_WALK_PATH_MAX];
	const char *why = entry_path(link, source);
	if (why == NULL && source[0] == '\0')
		why = "is the target itself";
	if (why) {
		char buf[SHOWN_MAX], msg[SHOWN_MAX + 80];
		snprintf(msg, sizeof msg, "is a hard link to '%s', which %s", shown(link, buf, sizeof buf), why);
		entry_failed(u, SK_TAR_REFUSED, 0, msg);
		return -1;
	}
	char *slash = strrchr(source, '/');
	const char *source_last = slash ? slash + 1 : source;
	if (slash)
		*slash = '\0';
	int dir = u->open_beneath(u->targetfd, slash ? source : ".", O_PATH | O_DIRECTORY, 0);
	if (dir < 0) {
		entry_errno(u, errno);
		return -1;
	}
	tmp_name(u->file_tmp, sizeof u->file_tmp, u->tmp_prefix, &u->tmp_count);
	/* No AT_SYMLINK_FOLLOW: a link to a symbolic link links the link, never what it names. */
	int r = linkat(dir, source_last, parent, u->file_tmp, 0);
	int saved = errno;
	close(dir);
	if (r < 0) {
		u->file_tmp[0] = '\0';
		if (saved == ENOENT)
			entry_failed(u, SK_TAR_REFUSED, saved, "is a hard link to an entry that is not in the target");
		else
			entry_errno(u, saved);
		return -1;
	}
	return put_in_place(u, parent, last);
}

static int extract_dir(sk_untar *u, struct archive_entry *e, int parent, const char *last)
{
	/* 0700 until the archive leaves it: the entries inside must be writable whatever its
	 * own mode says. */
	if (mkdirat(parent, last, 0700) < 0 && errno != EEXIST) {
		entry_errno(u, errno);
		return -1;
	}
	int fd = u->open_beneath(parent, last, O_PATH | O_DIRECTORY, 0);
	if (fd < 0) {
		entry_errno(u, errno);
		return -1;
	}
	close(fd);
	struct timespec mtime = { archive_entry_mtime(e), archive_entry_mtime_nsec(e) };
	return wait_dir(u, u->path, archive_entry_perm(e) & KEPT_MODE, mtime);
}

static int extract_entry(sk_untar *u, struct archive *a, struct archive_entry *e)
{
	const char *raw = archive_entry_pathname(e);
	const char *why = entry_path(raw, u->path);
	if (why) {
		snprintf(u->path, sizeof u->path, "%s", raw ? raw : "");
		entry_failed(u, SK_TAR_REFUSED, 0, why);
		return -1;
	}
	if (++u->entries > u->max_entries) {
		set_failure(&u->f, SK_TAR_TOO_LARGE, 0, u->path, "the archive has more than %llu entries",
			    (unsigned long long)u->max_entries);
		return -1;
	}
	const char *link = archive_entry_hardlink(e);
	mode_t type = archive_entry_filetype(e);
	if (link == NULL && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK) {
		entry_failed(u, SK_TAR_REFUSED, 0, type == AE_IFCHR || type == AE_IFBLK ? "is a device node"
						   : type == AE_IFIFO ? "is a FIFO"
						   : type == AE_IFSOCK ? "is a socket"
						   : "is of a kind that is not extracted");
		return -1;
	}
	int64_t size = link == NULL && type == AE_IFREG ? archive_entry_size(e) : 0;
	if (size < 0) {
		entry_failed(u, SK_TAR_INVALID, 0, "has a negative size");
		return -1;
	}
	if ((uint64_t)size > u->max_bytes - u->bytes) {
		char buf[SHOWN_MAX];
		set_failure(&u->f, SK_TAR_TOO_LARGE, 0, u->path,
			    "entry '%s' (%lld bytes) would take the archive past its %llu-byte bound",
			    shown(u->path, buf, sizeof buf), (long long)size, (unsigned long long)u->max_bytes);
		return -1;
	}
	u->bytes += (uint64_t)size;
	if (link == NULL && type == AE_IFDIR && u->nmeta > 0 &&
	    u->metas[u->nmeta - 1].len == strlen(u->path) &&
	    memcmp(u->meta_path, u->path, u->metas[u->nmeta - 1].len) == 0) {
		/* The directory just made, named again: it takes the later mode and time. */
		struct dir_meta *m = &u->metas[u->nmeta - 1];
		m->mode = archive_entry_perm(e) & KEPT_MODE;
		m->mtime = (struct timespec){ archive_entry_mtime(e), archive_entry_mtime_nsec(e) };
		return 0;
	}
	if (leave_dirs(u, u->path) < 0)
		return -1;
	if (u->path[0] == '\0') {
		/* The target itself: only a directory, whose mode and time it takes at the end. */
		if (link != NULL || type != AE_IFDIR) {
			entry_failed(u, SK_TAR_REFUSED, 0, "names the target itself and is not a directory");
			return -1;
		}
		u->has_root_meta = 1;
		u->root_meta = (struct dir_meta){ 0, archive_entry_perm(e) & KEPT_MODE,
						  { archive_entry_mtime(e), archive_entry_mtime_nsec(e) } };
		return 0;
	}
	const char *last;
	int parent = parent_of(u, u->path, &last);
	if (parent < 0)
		return -1;
	if (link)
		return extract_hardlink(u, link, parent, last);
	if (type == AE_IFDIR)
		return extract_dir(u, e, parent, last);
	if (type == AE_IFLNK)
		return extract_symlink(u, e, parent, last);
	return extract_file(u, a, e, parent, last);
}

static void extract(sk_untar *u)
{
	struct archive *a = archive_read_new();
	if (a == NULL) {
		set_failure(&u->f, SK_TAR_NO_MEMORY, ENOMEM, NULL, "out of memory");
		return;
	}
	/* Tar alone (ustar, pax, GNU), no compression: nothing inflates beyond the stream. */
	if (archive_read_support_format_tar(a) != ARCHIVE_OK ||
	    archive_read_open(a, u, NULL, read_piece, NULL) != ARCHIVE_OK) {
		set_failure(&u->f, SK_TAR_INVALID, 0, NULL, "the stream is not a tar archive: %s",
			    archive_error_string(a) ? archive_error_string(a) : "unrecognized");
		archive_read_free(a);
		return;
	}
	for (;;) {
		struct archive_entry *e;
		int r = archive_read_next_header(a, &e);
		if (r == ARCHIVE_EOF) {
			/* libarchive takes a stream that just ends between entries as over; only the
			 * end-of-archive blocks, seen before the stream ended, make it whole. */
			if (u->saw_end)
				set_failure(&u->f, SK_TAR_INVALID, 0, NULL,
					    "the archive is truncated: the stream ended without its end-of-archive blocks");
			break;
		}
		if (r < ARCHIVE_WARN) {
			set_failure(&u->f, SK_TAR_INVALID, 0, NULL, "the archive is truncated or damaged: %s",
				    archive_error_string(a) ? archive_error_string(a) : "unreadable");
			break;
		}
		if (extract_entry(u, a, e) < 0)
			break;
	}
	drop_file(u);
	if (u->f.kind == SK_TAR_OK && leave_dirs(u, "") == 0 && u->has_root_meta)
		apply_meta(u, "", &u->root_meta);
	archive_read_free(a);
}

static void reader_main(unsigned hi, unsigned lo)
{
	sk_untar *u = (sk_untar *)(((uintptr_t)hi << 16 << 16) | (uintptr_t)lo);
#ifdef FIBER_ASAN
	__sanitizer_finish_switch_fiber(NULL, &u->caller_bottom, &u->caller_size);
#endif
	extract(u);
	u->state = FIBER_DONE;
#ifdef FIBER_ASAN
	/* This stack is finished: nothing of it is kept. */
	__sanitizer_start_switch_fiber(NULL, u->caller_bottom, u->caller_size);
#endif
	/* Returning resumes the caller (uc_link). */
}

sk_untar *sk_untar_new(int targetfd, sk_open_fn open_beneath, uint64_t max_entries,
		       uint64_t max_bytes)
{
	sk_untar *u = calloc(1, sizeof *u);
	if (u == NULL)
		return NULL;
	if ((u->gather = malloc(UNTAR_GATHER)) == NULL) {
		free(u);
		return NULL;
	}
	u->stack = mmap(NULL, FIBER_STACK + FIBER_GUARD, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (u->stack == MAP_FAILED || mprotect(u->stack, FIBER_GUARD, PROT_NONE) < 0) {
		if (u->stack != MAP_FAILED)
			munmap(u->stack, FIBER_STACK + FIBER_GUARD);
		free(u->gather);
		free(u);
		return NULL;
	}
	unsigned char r[8];
	if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
		munmap(u->stack, FIBER_STACK + FIBER_GUARD);
		free(u->gather);
		free(u);
		return NULL;
	}
	snprintf(u->tmp_prefix, sizeof u->tmp_prefix, "%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2],
		 r[3], r[4], r[5], r[6], r[7]);
	u->targetfd = targetfd;
	u->open_beneath = open_beneath;
	u->max_entries = max_entries;
	u->max_bytes = max_bytes;
	u->parent_fd = u->file_fd = -1;
	return u;
}

/* Runs the reader until it needs another piece or is done. */
static void resume(sk_untar *u)
{
	if (u->state == FIBER_DONE)
		return;
	if (u->state == FIBER_NEW) {
		if (getcontext(&u->reader) < 0) {
			set_failure(&u->f, SK_TAR_NO_MEMORY, errno, NULL, "cannot start the reader: %s",
				    strerror(errno));
			u->state = FIBER_DONE;
			return;
		}
		u->reader.uc_stack.ss_sp = (char *)u->stack + FIBER_GUARD;
		u->reader.uc_stack.ss_size = FIBER_STACK;
		u->reader.uc_link = &u->caller;
		uintptr_t p = (uintptr_t)u;
		makecontext(&u->reader, (void (*)(void))reader_main, 2, (unsigned)(p >> 16 >> 16),
			    (unsigned)(p & 0xffffffffu));
	}
	u->state = FIBER_WAITING;
	to_reader(u);
}

/* The reader takes p whole (it has asked for the next piece when this returns). */
static void feed(sk_untar *u, const char *p, size_t n)
{
	u->in = p;
	u->in_len = n;
	resume(u);
	u->in_len = 0;
}

int sk_untar_write(sk_untar *u, const void *p, size_t n)
{
	const char *src = p;
	while (n > 0 && u->state != FIBER_DONE) {
		if (u->gathered == 0 && n >= UNTAR_GATHER) {
			feed(u, src, n); /* a piece as large as a gathering goes as it is */
			break;
		}
		size_t take = n < UNTAR_GATHER - u->gathered ? n : UNTAR_GATHER - u->gathered;
		memcpy(u->gather + u->gathered, src, take);
		u->gathered += take;
		src += take;
		n -= take;
		if (u->gathered == UNTAR_GATHER) {
			u->gathered = 0;
			feed(u, u->gather, UNTAR_GATHER);
		}
	}
	return u->f.kind == SK_TAR_OK ? 0 : -1;
}

int sk_untar_finish(sk_untar *u)
{
	if (u->gathered > 0 && u->state != FIBER_DONE) {
		size_t n = u->gathered;
		u->gathered = 0;
		feed(u, u->gather, n);
	}
	u->in_end = 1;
	while (u->state != FIBER_DONE)
		resume(u);
	return u->f.kind == SK_TAR_OK ? 0 : -1;
}

enum sk_tar_failure sk_untar_failure(const sk_untar *u)
{
	return u->f.kind;
}

int sk_untar_errno(const sk_untar *u)
{
	return u->f.err;
}

const char *sk_untar_error(const sk_untar *u)
{
	return u->f.why;
}

const char *sk_untar_entry(const sk_untar *u)
{
	return u->f.entry;
}

uint64_t sk_untar_entries(const sk_untar *u)
{
	return u->entries;
}

uint64_t sk_untar_bytes(const sk_untar *u)
{
	return u->bytes;
}

void sk_untar_free(sk_untar *u)
{
	if (u == NULL)
		return;
	if (u->state == FIBER_WAITING) {
		/* Unwound, not abandoned: libarchive and the file being written are let go on the
		 * reader's own stack. */
		u->stopping = 1;
		while (u->state != FIBER_DONE)
			resume(u);
	}
	drop_file(u);
	drop_parent(u);
	free(u->metas);
	free(u->gather);
	munmap(u->stack, FIBER_STACK + FIBER_GUARD);
	free(u);
}

/* ---- writing an archive ---- */

enum tar_state { TAR_ROOT, TAR_WALK, TAR_CLOSED };

struct sk_tar {
	int rootfd;
	sk_open_fn open_beneath;
	struct archive *a;
	struct archive_entry *e;
	sk_walk *w;
	enum tar_state state;
	struct failure f;
	/* what libarchive wrote and the reader has not taken yet */
	char *out;
	size_t out_len, out_off, out_cap;
	/* the file whose data is being written */
	int fd;
	uint64_t left;
	char path[SK_WALK_PATH_MAX];
	unsigned char piece[SK_TAR_PIECE];
};

/* libarchive's write callback: held until the reader takes it. At most a header (a few KiB
 * with a pax record for a long name), a piece, or the end-of-archive blocks at a time. */
static la_ssize_t take_output(struct archive *a, void *ctx, const void *buf, size_t n)
{
	sk_tar *t = ctx;
	if (t->out_off == t->out_len)
		t->out_off = t->out_len = 0;
	if (t->out_len + n > t->out_cap) {
		size_t cap = t->out_cap ? t->out_cap : 16384;
		while (cap < t->out_len + n)
			cap *= 2;
		char *p = realloc(t->out, cap);
		if (p == NULL) {
			archive_set_error(a, ENOMEM, "out of memory");
			return -1;
		}
		t->out = p;
		t->out_cap = cap;
	}
	memcpy(t->out + t->out_len, buf, n);
	t->out_len += n;
	return (la_ssize_t)n;
}

sk_tar *sk_tar_new(int dirfd, sk_open_fn open_beneath)
{
	sk_tar *t = calloc(1, sizeof *t);
	if (t == NULL)
		return NULL;
	t->rootfd = dirfd;
	t->open_beneath = open_beneath;
	t->fd = -1;
	t->a = archive_write_new();
	t->e = archive_entry_new();
	t->w = sk_walk_new(dirfd, open_beneath, SK_TAR_NAMES_MAX);
	/* No blocking: each header and piece goes to the reader as soon as it is written, and the
	 * archive ends right after its end-of-archive blocks. */
	if (t->a == NULL || t->e == NULL || t->w == NULL ||
	    archive_write_set_format_pax_restricted(t->a) != ARCHIVE_OK ||
	    archive_write_set_bytes_per_block(t->a, 0) != ARCHIVE_OK ||
	    archive_write_open(t->a, t, NULL, take_output, NULL) != ARCHIVE_OK) {
		sk_tar_free(t);
		return NULL;
	}
	return t;
}

static int tar_failed(sk_tar *t, enum sk_tar_failure kind, int err, const char *fmt, const char *what)
{
	char buf[SHOWN_MAX];
	set_failure(&t->f, kind, err, t->path, fmt, shown(t->path, buf, sizeof buf), what);
	return -1;
}

static int write_header(sk_tar *t, const char *path, const struct stat *st, const char *link)
{
	archive_entry_clear(t->e);
	archive_entry_copy_pathname(t->e, path);
	archive_entry_set_filetype(t->e, st->st_mode & S_IFMT);
	archive_entry_set_perm(t->e, st->st_mode & 07777);
	archive_entry_set_size(t->e, S_ISREG(st->st_mode) ? st->st_size : 0);
	archive_entry_set_mtime(t->e, st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
	if (link)
		archive_entry_copy_symlink(t->e, link);
	if (archive_write_header(t->a, t->e) < ARCHIVE_WARN)
		return tar_failed(t, SK_TAR_INVALID, 0, "'%s' could not be archived: %s",
				  archive_error_string(t->a) ? archive_error_string(t->a) : "unknown");
	return 0;
}

/* Writes the next piece of the archive into the output. */
static int produce(sk_tar *t)
{
	if (t->fd >= 0) {
		size_t want = t->left < SK_TAR_PIECE ? (size_t)t->left : SK_TAR_PIECE, got = 0;
		while (got < want) {
			ssize_t r = read(t->fd, t->piece + got, want - got);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0)
				return tar_failed(t, SK_TAR_ERRNO, errno, "'%s' could not be read: %s", strerror(errno));
			if (r == 0)
				return tar_failed(t, SK_TAR_ERRNO, EIO, "'%s' %s",
						  "shrank while it was archived");
			got += (size_t)r;
		}
		if (archive_write_data(t->a, t->piece, got) != (la_ssize_t)got)
			return tar_failed(t, SK_TAR_INVALID, 0, "'%s' could not be archived: %s",
					  archive_error_string(t->a) ? archive_error_string(t->a) : "unknown");
		t->left -= got;
		if (t->left == 0) {
			close(t->fd);
			t->fd = -1;
		}
		return 0;
	}
	struct stat st;
	if (t->state == TAR_ROOT) {
		t->state = TAR_WALK;
		t->path[0] = '\0';
		if (fstat(t->rootfd, &st) < 0)
			return tar_failed(t, SK_TAR_ERRNO, errno, "'%s' could not be read: %s", strerror(errno));
		return write_header(t, ".", &st, NULL);
	}
	struct sk_walk_entry e;
	int r = sk_walk_next(t->w, &e);
	if (r < 0) {
		int err = errno;
		return tar_failed(t, SK_TAR_ERRNO, err, "the tree could not be walked at '%s': %s",
				  err == E2BIG ? "a directory holds more names than an archive's walk may"
					       : strerror(err));
	}
	if (r == 0) {
		t->state = TAR_CLOSED;
		if (archive_write_close(t->a) != ARCHIVE_OK)
			return tar_failed(t, SK_TAR_INVALID, 0, "the archive could not be ended%s: %s",
					  archive_error_string(t->a) ? archive_error_string(t->a) : "");
		return 0;
	}
	if (e.leaving)
		return 0;
	memcpy(t->path, e.path, e.path_len + 1);
	if (S_ISDIR(e.st.st_mode))
		return write_header(t, e.path, &e.st, NULL);
	if (S_ISLNK(e.st.st_mode)) {
		char link[SK_WALK_PATH_MAX];
		ssize_t n = readlinkat(e.dirfd, e.name, link, sizeof link - 1);
		if (n < 0)
			return errno == ENOENT ? 0 : tar_failed(t, SK_TAR_ERRNO, errno, "'%s' could not be read: %s",
								 strerror(errno));
		link[n] = '\0';
		return write_header(t, e.path, &e.st, link);
	}
	if (!S_ISREG(e.st.st_mode))
		return 0; /* devices, FIFOs and sockets are left out */
	/* O_NONBLOCK: a FIFO swapped in since the lstat cannot hang the open. */
	int fd = t->open_beneath(e.dirfd, e.name, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
	if (fd < 0)
		return errno == ENOENT ? 0 : tar_failed(t, SK_TAR_ERRNO, errno, "'%s' could not be read: %s",
							 strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_ino != e.st.st_ino ||
	    st.st_dev != e.st.st_dev) {
		close(fd);
		return tar_failed(t, SK_TAR_ERRNO, EAGAIN, "'%s' %s", "was replaced while it was archived");
	}
	if (write_header(t, e.path, &st, NULL) < 0) {
		close(fd);
		return -1;
	}
	t->left = (uint64_t)st.st_size;
	if (t->left > 0)
		t->fd = fd;
	else
		close(fd);
	return 0;
}

/* Fills buf as far as cap: a header and a small file's data are pieces of their own, and a
 * reader handed each alone (a Lua string, a copy into libcurl's buffer) paid per piece for a
 * tree of small files. */
long sk_tar_read(sk_tar *t, void *buf, size_t cap)
{
	if (t->f.kind != SK_TAR_OK)
		return -1;
	size_t done = 0;
	while (done < cap) {
		if (t->out_off == t->out_len) {
			if (t->state == TAR_CLOSED)
				break;
			if (produce(t) < 0)
				return -1;
			continue;
		}
		size_t n = t->out_len - t->out_off;
		if (n > cap - done)
			n = cap - done;
		memcpy((char *)buf + done, t->out + t->out_off, n);
		t->out_off += n;
		done += n;
	}
	return (long)done;
}

enum sk_tar_failure sk_tar_failure(const sk_tar *t)
{
	return t->f.kind;
}

int sk_tar_errno(const sk_tar *t)
{
	return t->f.err;
}

const char *sk_tar_error(const sk_tar *t)
{
	return t->f.why;
}

const char *sk_tar_entry(const sk_tar *t)
{
	return t->f.entry;
}

void sk_tar_free(sk_tar *t)
{
	if (t == NULL)
		return;
	if (t->fd >= 0)
		close(t->fd);
	if (t->a)
		archive_write_free(t->a);
	if (t->e)
		archive_entry_free(t->e);
	sk_walk_free(t->w);
	free(t->out);
	free(t);
}
