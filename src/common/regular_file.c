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
	if (S_ISREG(mode))
		return "another regular file";
	return "no regular file";
}

/* A refusal of the system's: its errno stays for the caller. */
static int refuse(char *why, size_t whylen, int err)
{
	snprintf(why, whylen, "%s", strerror(err));
	errno = err;
	return -1;
}

/* A refusal of the file's type, which no errno names. */
static int refuse_type(char *why, size_t whylen, const char *how, mode_t mode)
{
	snprintf(why, whylen, how, file_type(mode));
	errno = 0;
	return -1;
}

int sk_open_regular(const char *path, char *why, size_t whylen)
{
	struct stat before, after;
	if (stat(path, &before) < 0)
		return refuse(why, whylen, errno);
	if (!S_ISREG(before.st_mode))
		return refuse_type(why, whylen, "it is %s, not a regular file", before.st_mode);
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return refuse(why, whylen, errno);
	int err = fstat(fd, &after) < 0 ? errno : 0;
	if (err == 0 && (!S_ISREG(after.st_mode) || after.st_ino != before.st_ino ||
			 after.st_dev != before.st_dev)) {
		close(fd);
		/* S_IFREG: another regular file took its place, which file_type cannot say. */
		return refuse_type(why, whylen, "it was replaced while it was opened (now %s)",
				   S_ISREG(after.st_mode) ? S_IFREG : after.st_mode);
	}
	/* A regular file's reads never wait anyway; cleared so that no reader meets EAGAIN. */
	int flags = err ? -1 : fcntl(fd, F_GETFL);
	if (err == 0 && (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0))
		err = errno;
	if (err) {
		close(fd);
		return refuse(why, whylen, err);
	}
	return fd;
}
