/* fserror.c — see fserror.h. */
#include "fserror.h"

#include <errno.h>
#include <stddef.h>

#define NOT_FOUND { 404, "PATH_NOT_FOUND", "No such file in the sandbox: ", "", "", PATH_MISSING }
#define REFUSED(why) { 400, "PATH_REFUSED", "Path '", "' refused: ", why, PATH_REFUSED }
#define LEAVES REFUSED("path leaves the sandbox root or goes through a symbolic link")
#define DENIED { 403, "PERMISSION_DENIED", "Permission denied for '", "': ", \
		 "the agent's user may not use it, or its filesystem is read-only", PATH_FAILED }
#define BUSY { 409, "PATH_BUSY", "Path '", "' is busy: ", \
	       "a running program's file or a mount point", PATH_FAILED }
#define IN_THE_WAY { 409, "PATH_EXISTS", "Path '", "' is in the way: ", "something else is there", \
		     PATH_FAILED }
#define FULL { 413, "NO_SPACE", "No room for '", "': ", "the filesystem or the disk quota is full", \
	       PATH_FAILED }

static const struct fs_error not_found = NOT_FOUND;

/*
 * Every errno a file route or a working directory can meet that is not the agent's own fault.
 * `reading` overrides the answer for a read where a reader and a writer must hear different
 * things: a file on the way means "no such file" to one and "cannot create there" to the other.
 */
static const struct row {
	int err;
	struct fs_error answer;
	const struct fs_error *reading;
} rows[] = {
	{ ENOENT, NOT_FOUND, NULL },
	{ ENOTDIR, { 400, "REQUEST_INVALID", "Request invalid: a parent of '", "' ",
		     "is not a directory", PATH_NOT_DIR }, &not_found },
	/* openat2's RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS: the walk would leave the root or
	 * follow a link. */
	{ EXDEV, LEAVES, NULL },
	{ ELOOP, LEAVES, NULL },
	/* A component over the filesystem's NAME_MAX: no such name can exist there. */
	{ ENAMETOOLONG, REFUSED("a path component is longer than the filesystem allows"), NULL },
	{ EISDIR, { 400, "REQUEST_INVALID", "Request invalid: '", "' ", "is not a regular file",
		    PATH_FAILED }, NULL },
	/* The request's own content is over what the filesystem takes for one file. */
	{ EFBIG, { 413, "FILE_TOO_LARGE", "File too large: '", "' ",
		   "would be over the filesystem's file size limit", PATH_FAILED }, NULL },
	/* The rest are not the agent's doing, and the same request fails again until something
	 * in the sandbox changes: a permission, a running program, what is in the way. */
	{ EACCES, DENIED, NULL },
	{ EPERM, DENIED, NULL },
	{ EROFS, DENIED, NULL },
	{ ETXTBSY, BUSY, NULL },
	{ EBUSY, BUSY, NULL },
	{ EEXIST, IN_THE_WAY, NULL },
	{ ENOTEMPTY, IN_THE_WAY, NULL },
	/*
	 * Both kinds of full are the caller's: the space is the sandbox's own (its root's
	 * filesystem or its user's quota), and the same write fails until the tenant frees some.
	 * A 5xx would read as "try again" and loop. A directory with too many links is full too.
	 */
	{ ENOSPC, FULL, NULL },
	{ EDQUOT, FULL, NULL },
	{ EMLINK, FULL, NULL },
};

/* Anything else (ENOMEM, EMFILE, EIO, EINVAL, …) is the agent's own failure. */
static const struct fs_error agent_fault = { 500, "AGENT_OPERATION_FAILED", "", "", "",
					     PATH_FAILED };

const struct fs_error *fs_error(int err, int writing)
{
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		if (rows[i].err != err)
			continue;
		return !writing && rows[i].reading ? rows[i].reading : &rows[i].answer;
	}
	return &agent_fault;
}
