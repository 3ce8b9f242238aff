/*
 * paths.h — confinement of caller paths to the sandbox root (docs/protocol.md §1, §3.5).
 *
 * A caller path is always relative to the root, a leading '/' included. It is first checked
 * lexically (empty, NUL, '..' refused; '.' and repeated '/' dropped), then every open goes
 * through openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) from the root's
 * descriptor, so the kernel refuses a symlink in any component — one a command planted a
 * moment ago included — and nothing is resolved by a path string twice.
 */
#ifndef SANDKIT_AGENT_PATHS_H
#define SANDKIT_AGENT_PATHS_H

#include <stddef.h>
#include <sys/types.h>

/* Longest normalized path accepted, terminator included: the kernel's own PATH_MAX. */
#define PATHS_MAX 4096

enum path_result {
	PATH_OK = 0,
	PATH_REFUSED,     /* leaves the root, goes through a symlink, or names what cannot exist */
	PATH_MISSING,     /* a component does not exist */
	PATH_NOT_DIR,     /* a component that must be a directory is something else */
	PATH_FAILED       /* any other failure; errno kept, and fserror.h says what it means */
};

/*
 * Lexical check. On success writes the normalized relative path ("." for the root itself) to
 * out (PATHS_MAX bytes) and returns NULL; otherwise returns the reason for PATH_REFUSED.
 */
const char *paths_normalize(const char *p, size_t len, char *out);

/* Opens rel (normalized) beneath the root with openat2; flags may include O_CREAT. */
enum path_result paths_open(const char *rel, int flags, mode_t mode, int *fd);

/*
 * Walks the directories of rel from the root, each component opened beneath the previous one,
 * creating missing ones (mode 0777 before umask) when create is set. With parent_only the last
 * component is left for the caller: *last points into rel and *dirfd is its parent. The
 * returned descriptor is an O_PATH directory the caller closes.
 */
enum path_result paths_walk(const char *rel, int create, int parent_only, int *dirfd,
			    const char **last);

/* openat2 beneath dirfd for one component or a normalized relative path. */
enum path_result paths_open_at(int dirfd, const char *rel, int flags, mode_t mode, int *fd);

/*
 * A command's working directory. PATH_OK with *fd an O_PATH directory (or -1 for the root when
 * cwd is NULL). Otherwise *why says what is wrong: PATH_REFUSED is a 400 before anything runs,
 * anything else means it cannot be entered, which the protocol reports as spawnFailed once the
 * command would have started.
 */
enum path_result paths_open_cwd(const char *cwd, size_t len, int *fd, const char **why);

#endif
