/*
 * fserror.h — what an errno met on a caller's path means for the caller (docs/protocol.md §3.6):
 * one table, in fserror.c, for every file route and for a command's working directory.
 *
 * A client reads a 5xx as a sandbox it could not reach and may send the same request again, so
 * every error a caller's request can cause — a name too long, a file busy or in the way, a
 * permission, a full or read-only filesystem — is a 4xx that names it, and only the agent's own
 * failures (memory, descriptors, I/O errors) are a 500.
 */
#ifndef SANDKIT_AGENT_FSERROR_H
#define SANDKIT_AGENT_FSERROR_H

#include "paths.h"

struct fs_error {
	int status;                /* 500 for the agent's own failures */
	const char *code;          /* AGENT_OPERATION_FAILED with status 500 */
	/* The message is before + the caller's path + after + why (a 500 names the operation and
	 * the system's own sentence instead). */
	const char *before, *after, *why;
	enum path_result result;   /* how paths.c's walks treat it */
};

/* The answer for err met while reading (writing = 0) or while creating or writing. */
const struct fs_error *fs_error(int err, int writing);

#endif
