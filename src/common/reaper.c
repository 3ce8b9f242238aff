/* reaper.c — see reaper.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* ppoll */
#endif
#include "reaper.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

static void on_child(int sig)
{
	(void)sig; /* only interrupts ppoll, so the loop reaps */
}

void sk_reap_until(int lifeline_fd)
{
	sigset_t chld, wait_mask;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &wait_mask);
	sigdelset(&wait_mask, SIGCHLD);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_child;
	sigaction(SIGCHLD, &sa, NULL);
	struct pollfd life = { lifeline_fd, POLLIN, 0 };
	for (;;) {
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		int r = ppoll(&life, 1, NULL, &wait_mask);
		if (r > 0 || (r < 0 && errno != EINTR))
			return;
	}
}
