/*
 * walk.h — a depth-first walk of the tree beneath a directory descriptor, in name order, that
 * never follows a symbolic link and never leaves the tree: every directory is opened through
 * the caller's confined open function (sk_open_fn), one component beneath the one above it.
 *
 * Bounded in descriptors and memory whatever the tree: the walk holds one directory open (the
 * one being read) and, per level on the way down, that directory's names as one block; going
 * back up it opens the parent again by its path beneath the root and checks it is the same
 * directory (its device and inode), so a tree renamed under the walk ends it rather than send
 * it somewhere else. What the names of all the levels on the way down may take together is the
 * caller's bound (names_max).
 *
 * Plain C, no Lua: shared by sandkit-agent (archives, watches) and the C core (a local
 * directory archived for an upload). Removing a tree is tree_remove.h's, which reaches any depth.
 */
#ifndef SANDKIT_WALK_H
#define SANDKIT_WALK_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Longest path beneath the root, terminator included: the kernel's PATH_MAX. */
#define SK_WALK_PATH_MAX 4096

/*
 * Opens rel (one component, or a relative path of them) beneath dirfd, never through a
 * symbolic link nor out of dirfd's tree: the agent's paths_open_at, or openat2 with
 * RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS in the C core. The descriptor, or -1 with errno.
 */
typedef int (*sk_open_fn)(int dirfd, const char *rel, int flags, mode_t mode);

struct sk_walk_entry {
	const char *path;   /* relative to the root, NUL-terminated; valid until the next call */
	size_t path_len;
	const char *name;   /* its last component, inside path */
	int dirfd;          /* its parent directory, readable; valid until the next call */
	struct stat st;     /* what lstat says: a link is a link */
	unsigned depth;     /* 1 for the root's own entries */
	int leaving;        /* a directory whose entries were all walked (after them, once) */
};

typedef struct sk_walk sk_walk;

/* A walk of what rootfd holds (rootfd itself is not an entry, and stays the caller's). NULL
 * when out of memory. */
sk_walk *sk_walk_new(int rootfd, sk_open_fn open_beneath, size_t names_max);

/*
 * The next entry: 1 with *e filled, 0 when the walk is over, -1 with errno when it cannot go
 * on: E2BIG for names over names_max, ENAMETOOLONG for a path over SK_WALK_PATH_MAX, ESTALE
 * when a directory was replaced under the walk, or what opening or reading one said. An entry
 * that vanished between its directory's reading and its lstat is passed over.
 * A directory is entered after it was returned, unless sk_walk_prune says otherwise; it is then
 * returned again with leaving set once its entries were.
 */
int sk_walk_next(sk_walk *w, struct sk_walk_entry *e);

/* The directory sk_walk_next just returned is not entered (nor returned as leaving). */
void sk_walk_prune(sk_walk *w);

void sk_walk_free(sk_walk *w);

#endif
