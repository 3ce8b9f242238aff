/* tree_remove.c — see tree_remove.h. */
#include "common/tree_remove.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Name prefix of the directories moved up into the top one; a counter makes each fresh. */
#define MOVED_PREFIX ".sandkit-removing-"

struct removal {
	int top;                 /* the directory being drained, read through its DIR */
	unsigned long long moved; /* directories moved up so far: the next fresh name */
	char *stopped;
	size_t stopped_size;
};

static int stop_at(struct removal *r, const char *name)
{
	int saved = errno;
	if (r->stopped_size > 0)
		snprintf(r->stopped, r->stopped_size, "%s", name);
	errno = saved;
	return -1;
}

/*
 * Makes the directory name in dirfd (dirfd itself, opened for reading, when name is "") this
 * process's to clear: its owner where it may take it, then open to its owner (0700). Neither
 * step follows a link: one a command swapped in for the directory is refused, never changed
 * through.
 */
static int take_dir(int dirfd, const char *name)
{
	int at = name[0] ? AT_SYMLINK_NOFOLLOW : AT_EMPTY_PATH;
	if (fchownat(dirfd, name, geteuid(), getegid(), at) < 0 && errno != EPERM)
		return -1;
	return name[0] ? fchmodat(dirfd, name, 0700, AT_SYMLINK_NOFOLLOW) : fchmod(dirfd, 0700);
}

/* Opens a directory of the tree for reading; one a command left unreadable is still ours to
 * clear. */
static int open_dir_at(int dirfd, const char *name)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno == EACCES && take_dir(dirfd, name) == 0)
		fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	return fd;
}

/* Unlinks name in dirfd (opened for reading); a directory left read-only by a command is made
 * writable first. */
static int unlink_in(int dirfd, const char *name, int flags)
{
	if (unlinkat(dirfd, name, flags) == 0 || errno == ENOENT)
		return 0;
	if (errno == EACCES && take_dir(dirfd, "") == 0 && unlinkat(dirfd, name, flags) == 0)
		return 0;
	return errno == ENOENT ? 0 : -1;
}

/* Moves the directory name in dirfd up into the top one under a name of the MOVED_PREFIX
 * series. */
static int move_up(struct removal *r, int dirfd, const char *name)
{
	char fresh[sizeof MOVED_PREFIX + 24];
	for (;;) {
		snprintf(fresh, sizeof fresh, MOVED_PREFIX "%llu", r->moved++);
		if (renameat2(dirfd, name, r->top, fresh, RENAME_NOREPLACE) == 0)
			return 0;
		if (errno == EEXIST)
			continue;
		/* Moving a directory rewrites its "..", which needs write permission on it. */
		if (errno == EACCES && take_dir(dirfd, name) == 0 && take_dir(dirfd, "") == 0 &&
		    renameat2(dirfd, name, r->top, fresh, RENAME_NOREPLACE) == 0)
			return 0;
		return errno == ENOENT ? 0 : -1;
	}
}

/* Empties the directory name in the top one (files deleted, subdirectories moved up), then
 * removes it. */
static int clear_child(struct removal *r, const char *name)
{
	int fd = open_dir_at(r->top, name);
	if (fd < 0)
		return errno == ENOENT ? 0 : stop_at(r, name);
	DIR *d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return stop_at(r, name);
	}
	int rc = 0;
	struct dirent *e;
	while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (unlink_in(fd, e->d_name, 0) == 0)
			continue;
		if (errno != EISDIR || move_up(r, fd, e->d_name) < 0)
			rc = stop_at(r, e->d_name);
	}
	if (rc == 0 && errno != 0)
		rc = stop_at(r, name);
	int saved = errno;
	closedir(d);
	errno = saved;
	if (rc == 0 && unlink_in(r->top, name, AT_REMOVEDIR) < 0)
		rc = stop_at(r, name);
	return rc;
}

int sk_tree_remove(int dirfd, const char *name, char *stopped, size_t stopped_size)
{
	struct removal r = { -1, 0, stopped, stopped_size };
	if (stopped_size > 0)
		stopped[0] = '\0';
	if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno != EISDIR)
		return stop_at(&r, name);
	int fd = open_dir_at(dirfd, name);
	if (fd < 0)
		return errno == ENOENT ? 0 : stop_at(&r, name);
	DIR *d = fdopendir(fd);
	if (d == NULL) {
		close(fd);
		return stop_at(&r, name);
	}
	r.top = fd;
	int rc = 0, seen;
	/* Directories moved up during a pass may or may not be listed by it: passes repeat
	 * until one finds the directory empty. */
	do {
		seen = 0;
		rewinddir(d);
		struct dirent *e;
		while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			seen = 1;
			if (unlink_in(fd, e->d_name, 0) == 0)
				continue;
			rc = errno == EISDIR ? clear_child(&r, e->d_name) : stop_at(&r, e->d_name);
		}
		if (rc == 0 && errno != 0)
			rc = stop_at(&r, name);
	} while (rc == 0 && seen);
	int saved = errno;
	closedir(d);
	errno = saved;
	if (rc == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		rc = stop_at(&r, name);
	return rc;
}
