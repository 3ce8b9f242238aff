/*
 * lifetime.h — the session's end on the agent's own clock (--lifetime-file): a file holding the
 * Unix time, in seconds, at which the agent stops as on SIGTERM (its commands killed, then it
 * exits 0). It is read at start and again on every SIGHUP, so whoever wrote it can move the end
 * either way while commands run. An empty file (or spaces) is no end. The agent keeps the file
 * open and reads it again through that descriptor: a new end is written into the same file
 * (padded with spaces to a fixed width, never truncated first), not a file renamed over it.
 */
#ifndef SANDKIT_AGENT_LIFETIME_H
#define SANDKIT_AGENT_LIFETIME_H

#include <stddef.h>

/* The last end the file may name: 9999-12-31T23:59:59Z, the last second RFC 3339 writes with
 * a four-digit year (the same bound sandkit's Lua side holds a lifetime to). */
#define LIFETIME_LAST_END 253402300799LL

/* Reads the file and arms the end, and watches SIGHUP to read it again; path NULL: no end, and
 * SIGHUP is ignored (it would otherwise end the agent). On a bad file at start: -1, with why
 * (the caller dies with it). */
int lifetime_start(const char *path, char *why, size_t why_len);
/* Frees the timer and the SIGHUP watch. */
void lifetime_stop(void);

#endif
