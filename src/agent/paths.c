/* paths.c — see paths.h. */
#include "paths.h"

#include "agent.h"
#include "common/beneath.h"
#include "fserror.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *paths_normalize(const char *p, size_t len, char *out)
{
	if (len == 0)
		return "path is empty";
	if (memchr(p, '\0', len) != NULL)
		return "path contains a NUL byte";
	size_t o = 0, i = 0;
	while (i < len) {
		while (i < len && p[i] == '/')
			i++;
		size_t start = i;
		while (i < len && p[i] != '/')
			i++;
		size_t n = i - start;
		if (n == 0 || (n == 1 && p[start] == '.'))
			continue;
		if (n == 2 && p[start] == '.' && p[start + 1] == '.')
			return "path traverses upward";
		if (o + (o > 0) + n + 1 > PATHS_MAX)
			return "path is too long";
		if (o > 0)
			out[o++] = '/';
		memcpy(out + o, p + start, n);
		o += n;
	}
	if (o == 0)
		out[o++] = '.';
	out[o] = '\0';
	return NULL;
}

static enum path_result classify(int err)
{
	return fs_error(err, 1)->result;
}

enum path_result paths_open_at(int dirfd, const char *rel, int flags, mode_t mode, int *fd)
{
	*fd = sk_open_beneath(dirfd, rel, flags, mode);
	return *fd >= 0 ? PATH_OK : classify(errno);
}

enum path_result paths_open(const char *rel, int flags, mode_t mode, int *fd)
{
	return paths_open_at(agent.cfg.root_fd, rel, flags, mode, fd);
}

enum path_result paths_walk(const char *rel, int create, int parent_only, int *dirfd,
			    const char **last)
{
	char comp[PATHS_MAX];
	int cur = -1; /* -1 stands for the root, which is never closed here */
	const char *p = strcmp(rel, ".") == 0 ? "" : rel;
	for (;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		if (n == 0 || (parent_only && slash == NULL))
			break;
		memcpy(comp, p, n);
		comp[n] = '\0';
		int base = cur < 0 ? agent.cfg.root_fd : cur, next;
		enum path_result r = paths_open_at(base, comp, O_PATH | O_DIRECTORY, 0, &next);
		if (r == PATH_MISSING && create) {
			/* One component, made beneath a confined descriptor: mkdirat cannot follow a
			 * link here, and a link planted meanwhile fails the re-open below. */
			if (mkdirat(base, comp, 0777) < 0 && errno != EEXIST) {
				r = classify(errno);
			} else {
				r = paths_open_at(base, comp, O_PATH | O_DIRECTORY, 0, &next);
			}
		}
		if (r != PATH_OK) {
			int saved = errno;
			if (cur >= 0)
				close(cur);
			errno = saved;
			return r;
		}
		if (cur >= 0)
			close(cur);
		cur = next;
		if (slash == NULL) {
			p += n;
			break;
		}
		p = slash + 1;
	}
	if (cur < 0) {
		/* Still at the root: hand out a descriptor of its own so callers always close. */
		cur = fcntl(agent.cfg.root_fd, F_DUPFD_CLOEXEC, 0);
		if (cur < 0)
			return PATH_FAILED;
	}
	*dirfd = cur;
	if (last)
		*last = *p ? p : ".";
	return PATH_OK;
}

enum path_result paths_open_cwd(const char *cwd, size_t len, int *fd, const char **why)
{
	char rel[PATHS_MAX];
	*fd = -1;
	if (cwd == NULL)
		return PATH_OK;
	if ((*why = paths_normalize(cwd, len, rel)) != NULL)
		return PATH_REFUSED;
	enum path_result r = paths_open(rel, O_PATH | O_DIRECTORY, 0, fd);
	switch (r) {
	case PATH_OK: break;
	case PATH_REFUSED: *why = fs_error(errno, 0)->why; break;
	case PATH_MISSING: *why = "it does not exist"; break;
	case PATH_NOT_DIR: *why = "it is not a directory"; break;
	default: *why = strerror(errno); break;
	}
	return r;
}
