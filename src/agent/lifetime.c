/*
 * lifetime.c — the session's end on the agent's own clock (lifetime.h). The end is wall-clock
 * time, as the file names it; the timer that waits for it is checked against the wall clock
 * when it fires, and armed again if the clock says the end is not there yet. The file is opened
 * once, at start: a confined agent may no longer open it by its name afterwards (its user
 * namespace no longer maps the file's owner), so it is read again through that descriptor, and
 * whoever moves the end writes it in place (lifetime.h).
 */
#include "lifetime.h"

#include "agent.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Bytes the file may hold, one less than this: an end has at most twelve digits, and the local
 * provider's line is twenty bytes with its padding; a longer file is no end anyone wrote. */
#define LIFETIME_FILE_MAX 32

static const char *lifetime_path;
static int lifetime_fd = -1;
static long long lifetime_end = -1; /* -1: no end */
static struct event *end_timer, *hup_watch;

/* Reads the file: 0 with *end set (-1 for an empty file), or -1 with why. */
static int read_end(long long *end, char *why, size_t why_len)
{
	char buf[LIFETIME_FILE_MAX + 1];
	size_t got = 0;
	for (;;) {
		ssize_t n = pread(lifetime_fd, buf + got, sizeof buf - 1 - got, (off_t)got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			snprintf(why, why_len, "cannot read --lifetime-file %s: %s", lifetime_path,
				 strerror(errno));
			return -1;
		}
		if (n == 0 || (got += (size_t)n) == sizeof buf - 1)
			break;
	}
	buf[got] = '\0';
	if (got == sizeof buf - 1) {
		snprintf(why, why_len, "--lifetime-file %s holds more than %d bytes", lifetime_path,
			 LIFETIME_FILE_MAX - 1);
		return -1;
	}
	/* One line: digits, then spaces (a writer pads to a fixed width, so that it need never
	 * truncate), its newline optional; nothing after it, a NUL included. */
	size_t line = strcspn(buf, "\n");
	int bad = !(line == got || (buf[line] == '\n' && line + 1 == got));
	size_t len = line;
	while (len > 0 && buf[len - 1] == ' ')
		len--;
	long long n = 0;
	for (size_t i = 0; i < len && !bad; i++) {
		int digit = buf[i] - '0';
		if (digit < 0 || digit > 9 || n > (LIFETIME_LAST_END - digit) / 10)
			bad = 1;
		else
			n = n * 10 + digit;
	}
	if (!bad && len == 0) {
		*end = -1;
		return 0;
	}
	if (bad) {
		snprintf(why, why_len, "--lifetime-file %s must hold the Unix time of the end in "
			 "seconds (at most %lld) or nothing", lifetime_path, LIFETIME_LAST_END);
		return -1;
	}
	*end = n;
	return 0;
}

/* Arms the timer for the end read last: at once when it has passed (the loop may not run
 * yet, so its ending waits for the loop), else when the wall clock should reach it. */
static void arm(void)
{
	evtimer_del(end_timer);
	if (lifetime_end < 0)
		return;
	long long now = (long long)time(NULL);
	struct timeval tv = { .tv_sec = (time_t)(lifetime_end > now ? lifetime_end - now : 0),
			      .tv_usec = 0 };
	evtimer_add(end_timer, &tv);
}

/* The timer fired: the end has come unless the wall clock says otherwise (it was set back). */
static void on_end(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	if (lifetime_end >= 0 && (long long)time(NULL) >= lifetime_end) {
		log_info("the session's lifetime ended: stopping");
		event_base_loopbreak(agent.base);
		return;
	}
	arm();
}

static void on_hup(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	char why[512];
	long long end;
	/* A file that cannot be read now keeps the end it had: a half-done edit must not end the
	 * session, nor make it endless. */
	if (read_end(&end, why, sizeof why) < 0) {
		log_info("%s: the session keeps its end", why);
		return;
	}
	lifetime_end = end;
	if (end < 0)
		log_info("the session has no end now");
	else
		log_info("the session ends at %lld", end);
	arm();
}

int lifetime_start(const char *path, char *why, size_t why_len)
{
	if (path == NULL) {
		signal(SIGHUP, SIG_IGN);
		return 0;
	}
	lifetime_path = path;
	lifetime_fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (lifetime_fd < 0) {
		snprintf(why, why_len, "cannot open --lifetime-file %s: %s", path, strerror(errno));
		return -1;
	}
	if (read_end(&lifetime_end, why, why_len) < 0)
		return -1;
	end_timer = evtimer_new(agent.base, on_end, NULL);
	hup_watch = evsignal_new(agent.base, SIGHUP, on_hup, NULL);
	if (end_timer == NULL || hup_watch == NULL || event_add(hup_watch, NULL) < 0) {
		snprintf(why, why_len, "cannot watch the session's end");
		return -1;
	}
	if (lifetime_end >= 0)
		log_info("the session ends at %lld", lifetime_end);
	arm();
	return 0;
}

void lifetime_stop(void)
{
	if (end_timer)
		event_free(end_timer);
	if (hup_watch)
		event_free(hup_watch);
	end_timer = hup_watch = NULL;
	if (lifetime_fd >= 0)
		close(lifetime_fd);
	lifetime_fd = -1;
}
