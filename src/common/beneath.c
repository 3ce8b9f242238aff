/* beneath.c — see beneath.h. */
#include "beneath.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* openat2 answers EAGAIN when a concurrent rename could have fooled the resolution; a few
 * retries ride out a race, a loop that never ends would let whoever renames stall the caller. */
#define OPENAT2_RETRIES 8

int sk_open_beneath(int dirfd, const char *rel, int flags, mode_t mode)
{
	struct open_how how;
	memset(&how, 0, sizeof how);
	how.flags = (uint64_t)(flags | O_CLOEXEC);
	how.mode = (flags & O_CREAT) ? mode : 0;
	how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
	for (int tries = 0; tries < OPENAT2_RETRIES; tries++) {
		long r = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
		if (r >= 0)
			return (int)r;
		if (errno != EAGAIN && errno != EINTR)
			break;
	}
	return -1;
}
