/* isolate.c — see isolate.h. */
#include "isolate.h"

#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The directories --hide named (canonical paths, heap copies kept for the agent's life). */
static struct {
	char *path[ISOLATE_HIDE_MAX];
	size_t n;
} hidden;

int isolate_hide(const char *dir, char *why, size_t whysz)
{
	if (hidden.n == ISOLATE_HIDE_MAX) {
		snprintf(why, whysz, "--hide is accepted at most %d times", ISOLATE_HIDE_MAX);
		return -1;
	}
	char *real = realpath(dir, NULL);
	struct stat st;
	if (real == NULL || stat(real, &st) < 0 || !S_ISDIR(st.st_mode)) {
		snprintf(why, whysz, "--hide %s is not a directory: %s", dir,
			 real ? "it is something else" : strerror(errno));
		free(real);
		return -1;
	}
	const char *root = agent.cfg.root_path;
	size_t rn = strlen(root);
	/* Hiding / leaves nothing to run; hiding part of the root would make commands and the
	 * file routes disagree about what it holds. */
	if (strcmp(real, "/") == 0 || (strncmp(real, root, rn) == 0 && (real[rn] == '\0' ||
									 real[rn] == '/'))) {
		snprintf(why, whysz, "--hide %s must be a directory other than / and outside the root",
			 dir);
		free(real);
		return -1;
	}
	hidden.path[hidden.n++] = real;
	return 0;
}

void isolate_free(void)
{
	while (hidden.n > 0)
		free(hidden.path[--hidden.n]);
}

/* The options in front of the command. The hidden directories become empty tmpfs mounts, then
 * the root is bound writable on top, so a root under /tmp or under a hidden directory stays
 * reachable (bwrap makes the mount point inside the tmpfs). --cap-drop ALL: a root agent must not
 * hand the command the capabilities to remount what is read-only. */
#define HEAD_ARGS 14
#define TAIL_ARGS 8
static size_t options(const char **v, const char *cwd_path)
{
	const char *root = agent.cfg.root_path;
	const char *head[HEAD_ARGS] = {
		ISOLATE_BWRAP, "--die-with-parent", "--unshare-pid", "--unshare-net", "--unshare-ipc",
		"--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
	};
	const char *tail[TAIL_ARGS] = {
		"--bind", root, root, "--cap-drop", "ALL", "--chdir", cwd_path, "--",
	};
	size_t k = 0;
	memcpy(v, head, sizeof head);
	k += HEAD_ARGS;
	for (size_t i = 0; i < hidden.n; i++) {
		v[k++] = "--tmpfs";
		v[k++] = hidden.path[i];
	}
	memcpy(v + k, tail, sizeof tail);
	return k + TAIL_ARGS;
}

char **isolate_argv(char *const *argv, const char *cwd_path)
{
	size_t n = 0;
	while (argv[n])
		n++;
	const char **v = malloc((HEAD_ARGS + 2 * hidden.n + TAIL_ARGS + n + 1) * sizeof *v);
	if (v == NULL)
		return NULL;
	size_t k = options(v, cwd_path);
	for (size_t i = 0; i <= n; i++)
		v[k + i] = argv[i];
	return (char **)v;
}

int isolate_probe(char *why, size_t whysz)
{
	if (access(ISOLATE_BWRAP, X_OK) < 0) {
		snprintf(why, whysz, "--isolate bwrap needs %s (Debian package bubblewrap): %s",
			 ISOLATE_BWRAP, strerror(errno));
		return -1;
	}
	char *const probe[] = { "/bin/true", NULL };
	char **v = isolate_argv(probe, agent.cfg.root_path);
	int errp[2];
	if (v == NULL || pipe2(errp, O_CLOEXEC) < 0) {
		free(v);
		snprintf(why, whysz, "cannot prepare the bwrap probe: %s", strerror(errno));
		return -1;
	}
	pid_t pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR);
		if (null >= 0)
			dup2(null, 0), dup2(null, 1);
		dup2(errp[1], 2);
		char *const envp[] = { NULL };
		execve(ISOLATE_BWRAP, v, envp);
		_exit(127);
	}
	free(v);
	close(errp[1]);
	/* Blocking is fine here: this runs once before the agent serves anything. The first
	 * 255 bytes of bwrap's complaint are enough to say why. */
	char msg[256];
	size_t got = 0;
	for (;;) {
		ssize_t r = read(errp[0], msg + got, sizeof msg - 1 - got);
		if (r > 0 && (got += (size_t)r) < sizeof msg - 1)
			continue;
		if (r < 0 && errno == EINTR)
			continue;
		break;
	}
	close(errp[0]);
	msg[got] = '\0';
	msg[strcspn(msg, "\n")] = '\0';
	int status = 0;
	if (pid < 0 || waitpid(pid, &status, 0) < 0) {
		snprintf(why, whysz, "cannot run %s: %s", ISOLATE_BWRAP, strerror(errno));
		return -1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		snprintf(why, whysz, "%s cannot create its sandbox on this machine (status %d): %s",
			 ISOLATE_BWRAP, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status),
			 got ? msg : "no message");
		return -1;
	}
	return 0;
}

int isolate_find_program(const char *prog, char *const *envp, int cwd_fd)
{
	if (prog[0] == '\0')
		return ENOENT;
	if (strchr(prog, '/'))
		return faccessat(cwd_fd, prog, X_OK, 0) == 0 ? 0 : errno;
	/* glibc's execvp default when PATH is unset. */
	const char *path = "/bin:/usr/bin";
	for (char *const *e = envp; *e; e++)
		if (strncmp(*e, "PATH=", 5) == 0)
			path = *e + 5;
	int last = ENOENT;
	char buf[PATH_MAX];
	for (const char *p = path;; p++) {
		const char *colon = strchr(p, ':');
		size_t n = colon ? (size_t)(colon - p) : strlen(p);
		/* An empty PATH entry means the current directory, as execvp reads it. */
		int len = snprintf(buf, sizeof buf, "%.*s%s%s", (int)n, p, n ? "/" : "", prog);
		if (len > 0 && (size_t)len < sizeof buf) {
			if (faccessat(cwd_fd, buf, X_OK, 0) == 0)
				return 0;
			if (errno != ENOENT && errno != ENOTDIR)
				last = errno;
		}
		if (colon == NULL)
			break;
		p = colon;
	}
	return last;
}
