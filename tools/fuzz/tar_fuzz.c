/*
 * tar_fuzz.c — libFuzzer target for the extraction of a tar stream a stranger chose
 * (src/common/tarstream.c over libarchive): what PUT /v1/fs/tar runs in the agent and
 * session:read_dir_to in the C core.
 *
 *   make fuzz FUZZ_TARGETS=tar
 * sources: src/common/tarstream.c src/common/walk.c src/common/tree_remove.c src/common/beneath.c
 * libs: -larchive
 * options: -max_len=65536
 *
 * The input's first byte picks the size of the pieces the rest is pushed in, so an archive is
 * cut at every possible place; it is extracted beneath a fresh directory inside a private one
 * made once, with small bounds (64 entries, 1 MiB), and the directory is removed after. Checked
 * on top of the sanitizers, for every input:
 *   - nothing lands beside the target: the private directory holds the target alone;
 *   - no temporary file is left in the target, whatever the outcome;
 *   - a stream that did not end with its end-of-archive blocks is never taken as whole.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/beneath.h"
#include "common/tarstream.h"
#include "common/tree_remove.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The names in dir, other than . and ..: how many, and whether one starts with prefix. */
static int count_names(int dirfd, const char *prefix, int *prefixed)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (d == NULL)
		abort();
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		n++;
		if (prefix && strncmp(e->d_name, prefix, strlen(prefix)) == 0)
			*prefixed = 1;
	}
	closedir(d);
	return n;
}

static int private_fd = -1;
static char private_dir[] = "/tmp/sandkit-tar-fuzz-XXXXXX";

/* Each input's tree is gone after it; the folder goes when the run ends, so that runs leave
 * nothing in /tmp (make check replays the seeds every time). */
static void remove_private_dir(void)
{
	rmdir(private_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (private_fd < 0) {
		if (mkdtemp(private_dir) == NULL || (private_fd = open(private_dir, O_PATH | O_DIRECTORY)) < 0)
			abort();
		atexit(remove_private_dir);
	}
	if (mkdirat(private_fd, "t", 0700) < 0)
		abort();
	int target = sk_open_beneath(private_fd, "t", O_PATH | O_DIRECTORY, 0);
	sk_untar *u = sk_untar_new(target, sk_open_beneath, 64, 1 << 20);
	if (target < 0 || u == NULL)
		abort();
	size_t piece = (size_t)data[0] * 61 + 1;
	const uint8_t *p = data + 1;
	size_t left = size - 1;
	int failed = 0;
	while (left > 0 && !failed) {
		size_t n = left < piece ? left : piece;
		failed = sk_untar_write(u, p, n) < 0;
		p += n;
		left -= n;
	}
	int whole = !failed && sk_untar_finish(u) == 0;
	/* Two blocks of zeros are the least an ended archive holds. */
	if (whole && size - 1 < 1024)
		abort();
	sk_untar_free(u);
	int temporary = 0;
	count_names(target, ".sandkit-tar-", &temporary);
	if (temporary)
		abort();
	close(target);
	if (count_names(private_fd, NULL, &temporary) != 1)
		abort();
	/* A directory the archive made without write permission is made writable by the
	 * removal itself. */
	if (sk_tree_remove(private_fd, "t", NULL, 0) < 0)
		abort();
	return 0;
}
