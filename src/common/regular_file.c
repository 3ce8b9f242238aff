/* regular_file.c — see regular_file.h. */
#include "regular_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *file_type(mode_t mode)
{
	if (S_ISDIR(mode))
		return "a directory";
	if (S_ISFIFO(mode))
		return "a FIFO";
	if (S_ISSOCK(mode))
		return "a socket";
	if (S_ISCHR(mode))
		return "a character device";
	if (S_ISBLK(mode))
		return "a block device";
	return "no regular file";
}

static int refuse(char *why, size_t whylen, const char *what)
{
	snprintf(why, whylen, "%s", what);
	return -1;
}

int sk_open_regular(const char *path, char *why, size_t whylen)
{
	struct stat before, after;
	if (stat(path, &before) < 0)
		return refuse(why, whylen, strerror(errno));
	if (!S_ISREG(before.st_mode)) {
		snprintf(why, whylen, "it is %s, not a regular file", file_type(before.st_mode));
		return -1;
	}
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return refuse(why, whylen, strerror(errno));
	if (fstat(fd, &after) < 0) {
		int e = errno;
		close(fd);
		return refuse(why, whylen, strerror(e));
	}
	if (!S_ISREG(after.st_mode) || after.st_ino != before.st_ino || after.st_dev != before.st_dev) {
		close(fd);
		snprintf(why, whylen, "it was replaced by %s while it was opened",
			 S_ISREG(after.st_mode) ? "another file" : file_type(after.st_mode));
		return -1;
	}
	/* A regular file's reads never wait anyway; cleared so that no reader meets EAGAIN. */
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
		int e = errno;
		close(fd);
		return refuse(why, whylen, strerror(e));
	}
	return fd;
}
