/* contain.c — see contain.h. */
#include "contain.h"

#include "agent.h"
#include "log.h"
#include "common/reaper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

enum contain_mode { CONTAIN_OFF, CONTAIN_PIDNS, CONTAIN_USERNS };

/* The agent's one keeper; the agent is single-threaded, as everywhere else in it. */
static struct {
	enum contain_mode mode;
	pid_t keeper;          /* -1 when there is none */
	int keeper_pidfd;      /* -1 when there is none */
	int lifeline;          /* the pipe end the keeper watches; the agent never writes it */
	struct event *watch;
	int lost;              /* the keeper was killed while the agent served */
} keep = { CONTAIN_OFF, -1, -1, -1, NULL, 0 };

/* The keeper: init of the namespace. It reaps the orphans the kernel hands it and ends when the
 * agent does, which ends everything in the namespace. */
static void keeper_main(int life) __attribute__((noreturn));
static void keeper_main(int life)
{
	prctl(PR_SET_NAME, "sandkit-keeper");
	/* The death signal covers an agent that dies from now on; the lifeline one that died
	 * before the request took effect (its end of the pipe is closed then). */
	struct pollfd pf = { life, POLLIN, 0 };
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || poll(&pf, 1, 0) != 0)
		_exit(0);
	/* Nothing of the agent's (its listening socket once there is one, the caller's ready
	 * descriptor) may stay open here. */
	if (life != 3 && dup2(life, 3) < 0)
		_exit(0);
	close_range(4, ~0U, 0);
	sk_reap_until(3);
	_exit(0);
}

static int start_keeper(void)
{
	int life[2];
	if (pipe2(life, O_CLOEXEC) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		close(life[1]);
		keeper_main(life[0]);
	}
	int e = errno;
	close(life[0]);
	if (pid < 0) {
		close(life[1]);
		errno = e;
		return -1;
	}
	keep.keeper = pid;
	keep.lifeline = life[1];
	keep.keeper_pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (keep.keeper_pidfd < 0) {
		e = errno;
		contain_stop();
		errno = e;
		return -1;
	}
	return 0;
}

static int write_proc(const char *path, const char *text)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, text, strlen(text));
	int e = errno;
	close(fd);
	errno = e;
	return n == (ssize_t)strlen(text) ? 0 : -1;
}

int contain_enter_user_namespace(void)
{
	unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();
	char map[64];
	if (unshare(CLONE_NEWUSER) < 0)
		return -1;
	/* An unprivileged process may map its group only once it gave up setgroups(2). */
	snprintf(map, sizeof map, "%u %u 1\n", uid, uid);
	if (write_proc("/proc/self/uid_map", map) < 0 || write_proc("/proc/self/setgroups", "deny") < 0)
		return -1;
	snprintf(map, sizeof map, "%u %u 1\n", gid, gid);
	return write_proc("/proc/self/gid_map", map);
}

int contain_enter_mounts(void)
{
	/* Host mounts made later still show (a slave receives, never sends); only /proc differs. */
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
		return -1;
	return mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/* Waits for a child of the probe; its exit status is an errno value, 0 when all worked. */
static int probe_status(pid_t pid)
{
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return errno;
	return WIFEXITED(status) ? WEXITSTATUS(status) : EINTR;
}

/*
 * Tries the whole arrangement in a throwaway process, since entering a user or PID namespace
 * cannot be undone: the namespaces, then a command's own /proc inside them. 0 when it works
 * here, else the errno that stopped it.
 */
static int probe(int userns)
{
	pid_t pid = fork();
	if (pid < 0)
		return errno;
	if (pid == 0) {
		if ((userns && contain_enter_user_namespace() < 0) || unshare(CLONE_NEWPID) < 0)
			_exit(errno);
		pid_t command = fork();
		if (command < 0)
			_exit(errno);
		if (command == 0)
			_exit(contain_enter_mounts() < 0 ? errno : 0);
		_exit(probe_status(command));
	}
	return probe_status(pid);
}

int contain_start(char *why, size_t whysz)
{
	/* Each way is probed, then taken for real; the real step can still fail (a limit reached
	 * in between), and then the next way is tried. Each failure keeps its own errno. */
	int direct = probe(0);
	if (direct == 0)
		direct = unshare(CLONE_NEWPID) == 0 ? 0 : errno;
	if (direct == 0) {
		keep.mode = CONTAIN_PIDNS;
	} else {
		int mapped = probe(1), entered = 0;
		if (mapped == 0) {
			/* A user namespace once entered cannot be left: a failure after it is said. */
			struct stat before, after;
			int known = stat("/proc/self/ns/user", &before) == 0;
			mapped = contain_enter_user_namespace() == 0 && unshare(CLONE_NEWPID) == 0 ? 0 : errno;
			entered = known && stat("/proc/self/ns/user", &after) == 0 &&
				  after.st_ino != before.st_ino;
		}
		if (mapped != 0) {
			snprintf(why, whysz, "no PID namespace for commands (%s), nor one in a user "
				 "namespace (%s%s)", strerror(direct), strerror(mapped),
				 entered ? "; the agent is left in that user namespace" : "");
			return -1;
		}
		keep.mode = CONTAIN_USERNS;
	}
	/* The first process started now becomes the namespace's init: it must be the keeper. */
	if (start_keeper() < 0) {
		snprintf(why, whysz, "cannot start the keeper of the commands' PID namespace: %s",
			 strerror(errno));
		keep.mode = CONTAIN_OFF;
		return -1;
	}
	return 0;
}

static void on_keeper_exit(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	/* Whoever killed it killed every command too, and no process can be started in a namespace
	 * whose init is gone: an agent that cannot contain its commands any more stops. */
	log_info("the keeper of the commands' PID namespace was killed: stopping");
	waitpid(keep.keeper, NULL, 0);
	keep.keeper = -1;
	keep.lost = 1;
	event_base_loopbreak(agent.base);
}

int contain_watch(void)
{
	if (keep.keeper < 0)
		return 0;
	keep.watch = event_new(agent.base, keep.keeper_pidfd, EV_READ, on_keeper_exit, NULL);
	return keep.watch && event_add(keep.watch, NULL) == 0 ? 0 : -1;
}

const char *contain_description(void)
{
	return keep.mode == CONTAIN_USERNS
		? "commands contained in a PID namespace of a user namespace"
		: "commands contained in a PID namespace";
}

int contain_active(void)
{
	return keep.mode != CONTAIN_OFF;
}

int contain_lost(void)
{
	return keep.lost;
}

pid_t contain_parent_pid(void)
{
	return keep.mode == CONTAIN_OFF ? getpid() : 0;
}

void contain_stop(void)
{
	if (keep.watch) {
		event_free(keep.watch);
		keep.watch = NULL;
	}
	if (keep.keeper > 0) {
		kill(keep.keeper, SIGKILL);
		while (waitpid(keep.keeper, NULL, 0) < 0 && errno == EINTR)
			;
		keep.keeper = -1;
	}
	if (keep.keeper_pidfd >= 0)
		close(keep.keeper_pidfd);
	if (keep.lifeline >= 0)
		close(keep.lifeline);
	keep.keeper_pidfd = keep.lifeline = -1;
}
