/*
 * util.h — small helpers shared by the agent's modules: randomness, constant-time comparison,
 * and writing JSON and error text safely.
 */
#ifndef SANDKIT_AGENT_UTIL_H
#define SANDKIT_AGENT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct evbuffer;

/* Fills buf from the kernel's CSPRNG; 0 or -1 (errno set). */
int util_random(void *buf, size_t len);

/* A random (version 4) UUID in hyphenated lower-case form, NUL-terminated: out holds 37 bytes. */
int util_uuid(char *out);

/* 1 when the n bytes at a and b are equal; the time taken does not depend on where they differ. */
int util_ct_equal(const void *a, const void *b, size_t n);

/* Appends s[0..len) as a JSON string literal, quotes included. -1 on allocation failure. */
int util_json_string(struct evbuffer *out, const char *s, size_t len);

/*
 * Copies caller-supplied text into out (outsz >= 8) for an error message: control and non-ASCII
 * bytes become '?', so a path cannot forge extra lines in a text/plain body nor put invalid
 * UTF-8 into a JSON message, and text longer than outsz - 4
 * is cut with "...", so an error body stays far below the client's 4096-byte bound.
 */
void util_printable(const char *s, size_t len, char *out, size_t outsz);

/* Microseconds on CLOCK_MONOTONIC: the precise clock, which libevent's timers are not. */
uint64_t util_now_us(void);

/* Waits for the child pid, through interruptions; its wait status in *status when not NULL. */
void util_reap(pid_t pid, int *status);

/* The first line of what a helper the agent started wrote to the file fd (from its start), in
 * out (size bytes, NUL-terminated, the line cut to fit); "no message" when it wrote none. */
void util_first_line(int fd, char *out, size_t size);

/* The last line of what a helper wrote to the file fd, as util_first_line: for a helper that
 * says what ended it last, after lines of its own noise (pasta's "Failed to send … to syslog"
 * where there is no syslog). */
void util_last_line(int fd, char *out, size_t size);

#endif
