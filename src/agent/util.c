/* util.c — see util.h. */
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>

int util_random(void *buf, size_t len)
{
	unsigned char *p = buf;
	while (len > 0) {
		ssize_t n = getrandom(p, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int util_uuid(char *out)
{
	unsigned char b[16];
	if (util_random(b, sizeof b) < 0)
		return -1;
	b[6] = (unsigned char)((b[6] & 0x0f) | 0x40); /* version 4: random */
	b[8] = (unsigned char)((b[8] & 0x3f) | 0x80); /* RFC 4122 variant */
	snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
		 b[14], b[15]);
	return 0;
}

int util_ct_equal(const void *a, const void *b, size_t n)
{
	const volatile unsigned char *x = a, *y = b;
	unsigned char diff = 0;
	for (size_t i = 0; i < n; i++)
		diff |= (unsigned char)(x[i] ^ y[i]);
	return diff == 0;
}

int util_json_string(struct evbuffer *out, const char *s, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	if (evbuffer_add(out, "\"", 1) < 0)
		return -1;
	size_t run = 0;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c >= 0x20 && c != '"' && c != '\\') {
			run++;
			continue;
		}
		if (run > 0 && evbuffer_add(out, s + i - run, run) < 0)
			return -1;
		run = 0;
		char esc[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };
		if (c == '"' || c == '\\') {
			esc[1] = (char)c;
			if (evbuffer_add(out, esc, 2) < 0)
				return -1;
		} else if (evbuffer_add(out, esc, 6) < 0) {
			return -1;
		}
	}
	if (run > 0 && evbuffer_add(out, s + len - run, run) < 0)
		return -1;
	return evbuffer_add(out, "\"", 1);
}

void util_printable(const char *s, size_t len, char *out, size_t outsz)
{
	size_t room = outsz - 4, o = 0;
	for (size_t i = 0; i < len; i++) {
		if (o == room) {
			memcpy(out + o, "...", 3);
			o += 3;
			break;
		}
		unsigned char c = (unsigned char)s[i];
		out[o++] = (c < 0x20 || c >= 0x7f) ? '?' : (char)c;
	}
	out[o] = '\0';
}

void util_reap(pid_t pid, int *status)
{
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (status)
		*status = st;
}

void util_first_line(int fd, char *out, size_t size)
{
	ssize_t n = pread(fd, out, size - 1, 0);
	out[n > 0 ? n : 0] = '\0';
	out[strcspn(out, "\n")] = '\0';
	if (out[0] == '\0')
		snprintf(out, size, "no message");
}

void util_last_line(int fd, char *out, size_t size)
{
	struct stat st;
	off_t from = 0;
	if (fstat(fd, &st) == 0 && st.st_size > (off_t)(size - 1))
		from = st.st_size - (off_t)(size - 1);
	ssize_t n = pread(fd, out, size - 1, from);
	size_t len = n > 0 ? (size_t)n : 0;
	while (len > 0 && out[len - 1] == '\n')
		len--;
	out[len] = '\0';
	char *last = strrchr(out, '\n');
	if (last)
		memmove(out, last + 1, strlen(last + 1) + 1);
	if (out[0] == '\0')
		snprintf(out, size, "no message");
}

uint64_t util_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}
