/*
 * init.c — sandkit-init, process 1 of a confined session (src/agent/confine.h).
 *
 * bubblewrap runs it as the first process of the session's PID namespace, through a descriptor
 * the agent opened, so it runs whatever the session's root holds — also a root without a C
 * library, which is why it is linked statically. It has three jobs:
 *
 *   - say that the session is built: one byte on descriptor 3 once it runs, which is after
 *     bubblewrap made every mount and changed the root;
 *   - reap the orphans the kernel hands it, so no zombie outlives its parent;
 *   - end when the agent does: descriptor 4 is a pipe whose write end only the agent holds;
 *     at its end of file this process exits, and the kernel then kills every process of the
 *     namespace, whatever it did to leave its group or session.
 *
 * It reads no argument and no environment, and opens nothing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/reaper.h"

/* The descriptors the agent hands over (src/agent/confine.c says the same). */
#define READY_FD 3
#define LIFELINE_FD 4
/* What ps shows for it, written over its argv[0] where that is long enough (bubblewrap runs it
 * as /proc/self/fd/N). */
#define NAME "sandkit-init"

int main(int argc, char **argv)
{
	/* Commands run as the same user: they may see it, but not trace it or read its
	 * descriptors. And it is named for what it is, not the descriptor it was run from. */
	prctl(PR_SET_DUMPABLE, 0);
	prctl(PR_SET_NAME, NAME);
	if (argc > 0 && strlen(argv[0]) >= sizeof NAME - 1) {
		size_t len = strlen(argv[0]);
		memset(argv[0], 0, len);
		memcpy(argv[0], NAME, sizeof NAME - 1);
	}
	/* Nothing else bubblewrap or the agent held (the descriptor this program was run from
	 * among them) may stay open in the session. */
	close_range(LIFELINE_FD + 1, ~0U, 0);
	ssize_t w;
	while ((w = write(READY_FD, "R", 1)) < 0 && errno == EINTR)
		;
	close(READY_FD);
	if (w != 1)
		return 1;
	/* Any readiness of the lifeline is its end: the agent never writes to it. */
	sk_reap_until(LIFELINE_FD);
	return 0;
}
