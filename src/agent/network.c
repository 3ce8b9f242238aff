/* network.c — see network.h. */
#include "network.h"

#include "agent.h"
#include "confine.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/nsfs.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long the stack may take to configure the namespace: pasta takes tens of milliseconds,
 * up to a few hundred on a loaded machine. */
#define NETWORK_START_MS 10000
/* How long the agent waits for a socket from the helper, which makes it at once: the bound is
 * only there so that a helper gone astray cannot stall the agent's loop. */
#define NETWORK_HELPER_MS 1000
/* The first line of a stack's complaint is what a failure quotes. */
#define COMPLAINT_MAX 256
/* The tun device's numbers (Documentation/admin-guide/devices.txt: misc 200). */
#define TUN_MAJOR 10
#define TUN_MINOR 200

/* The descriptors the stacks get (their command lines name them). */
enum { FD_USERNS = 3, FD_NETNS, FD_READY, FD_EXIT, FD_STACK_FREE };

static struct {
	pid_t helper;          /* -1 when none */
	int helper_fd;         /* the agent's end of the socket pair; -1 when none */
	pid_t stack;           /* pasta or slirp4netns; -1 when none */
	int stack_exit;        /* slirp4netns ends when this end closes; -1 when none */
} net = { -1, -1, -1, -1 };

/* What goes between the helper and the agent: one byte (0, or the errno of a socket the helper
 * could not make) and, with it, at most one descriptor. */
struct fd_message {
	struct iovec iov;
	union {
		struct cmsghdr h;
		char room[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct msghdr m;
};

/* Points fm at byte; with room for a descriptor when one is sent or may be received. */
static void fd_message_init(struct fd_message *fm, unsigned char *byte, int with_fd)
{
	memset(fm, 0, sizeof *fm);
	fm->iov.iov_base = byte;
	fm->iov.iov_len = 1;
	fm->m.msg_iov = &fm->iov;
	fm->m.msg_iovlen = 1;
	if (with_fd) {
		fm->m.msg_control = fm->ctl.room;
		fm->m.msg_controllen = sizeof fm->ctl.room;
	}
}

/* In a helper child: from root to the sandbox user's host uid; an unprivileged agent's helpers
 * already are that uid. 0 or -1. */
static int become_uid(const struct network_setup *s)
{
	if (!s->as_root)
		return 0;
	if (confine_drop_groups() < 0 || setresgid(s->uid, s->uid, s->uid) < 0 ||
	    setresuid(s->uid, s->uid, s->uid) < 0)
		return -1;
	return 0;
}

/* The helper: makes a socket in the session's namespace for each byte it reads, and ends with
 * the agent (the pair's end of file, or the agent's death). */
static void helper_main(int pair, const struct network_setup *s, pid_t agent_pid)
    __attribute__((noreturn));
static void helper_main(int pair, const struct network_setup *s, pid_t agent_pid)
{
	prctl(PR_SET_NAME, "sandkit-netns");
	if (dup2(pair, 3) < 0 || dup2(s->netns_fd, 4) < 0)
		_exit(1);
	close_range(5, ~0U, 0);
	if (setns(4, CLONE_NEWNET) < 0)
		_exit(1);
	close(4);
	/* It needs no right at all to make sockets. Root's change of uid takes every capability
	 * with it; an unprivileged agent's helper keeps its uid and gives them up itself. */
	if (s->as_root ? become_uid(s) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0
		       : confine_drop_capabilities() < 0)
		_exit(1);
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != agent_pid)
		_exit(0);
	for (;;) {
		char want;
		ssize_t r = recv(3, &want, 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			_exit(0);
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		unsigned char e = fd < 0 ? (unsigned char)errno : 0;
		struct fd_message fm;
		fd_message_init(&fm, &e, fd >= 0);
		if (fd >= 0) {
			struct cmsghdr *c = CMSG_FIRSTHDR(&fm.m);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &fd, sizeof fd);
		}
		ssize_t w;
		while ((w = sendmsg(3, &fm.m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
			;
		if (fd >= 0)
			close(fd);
		if (w < 0)
			_exit(0);
	}
}

static int start_helper(const struct network_setup *s, char *why, size_t whysz)
{
	int pair[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0) {
		snprintf(why, whysz, "cannot make the network helper's socket pair: %s", strerror(errno));
		return -1;
	}
	pid_t agent_pid = getpid();
	net.helper = fork();
	if (net.helper == 0)
		helper_main(pair[1], s, agent_pid);
	int e = errno;
	close(pair[1]);
	if (net.helper < 0) {
		close(pair[0]);
		snprintf(why, whysz, "cannot start the network helper: %s", strerror(e));
		return -1;
	}
	net.helper_fd = pair[0];
	struct timeval bound = { NETWORK_HELPER_MS / 1000, (NETWORK_HELPER_MS % 1000) * 1000 };
	setsockopt(net.helper_fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
	return 0;
}

int network_socket(void)
{
	if (net.helper_fd < 0) {
		errno = ENOTCONN;
		return -1;
	}
	if (send(net.helper_fd, "s", 1, MSG_NOSIGNAL) != 1)
		return -1;
	unsigned char e = 0;
	struct fd_message fm;
	fd_message_init(&fm, &e, 1);
	ssize_t r;
	while ((r = recvmsg(net.helper_fd, &fm.m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
		;
	if (r != 1) {
		errno = r == 0 ? ECONNRESET : errno;
		return -1;
	}
	struct cmsghdr *c = CMSG_FIRSTHDR(&fm.m);
	if (c == NULL || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(int))) {
		errno = e ? e : EPROTO;
		return -1;
	}
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof fd);
	return fd;
}

/* In the stack's child, as root: a tun device node of its own, owned by the sandbox user's host
 * uid, in a mount namespace of its own. The stack opens /dev/net/tun once it is in the session's
 * namespaces, where root's ownership of the host's node means nothing, and a host may keep that
 * node to root (0600) as machines without udev do. */
static int own_tun_node(uid_t uid)
{
	struct stat st;
	if (stat("/dev/net", &st) < 0)
		return 0; /* no tun support here: the stack will say so */
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
	    mount("tmpfs", "/dev/net", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755") < 0 ||
	    mknod("/dev/net/tun", S_IFCHR | 0600, makedev(TUN_MAJOR, TUN_MINOR)) < 0 ||
	    chown("/dev/net/tun", uid, uid) < 0)
		return -1;
	return 0;
}

static void stack_fail(const char *what) __attribute__((noreturn));
static void stack_fail(const char *what)
{
	dprintf(2, "%s: %s\n", what, strerror(errno));
	_exit(127);
}

/* In the stack's child: its descriptors (the user and network namespaces, the ready and exit
 * pipes, its error file), its uid, then the stack. */
static void stack_main(const struct network_setup *s, const int fds[FD_STACK_FREE - FD_USERNS],
		       int err, const char *const *argv)
{
	if (dup2(err, 2) < 0)
		_exit(127);
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0)
		stack_fail("cannot open /dev/null");
	if (s->as_root && own_tun_node(s->uid) < 0)
		stack_fail("cannot make a tun device node for the network stack");
	if (become_uid(s) < 0)
		stack_fail("cannot become the sandbox user's host uid");
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		stack_fail("cannot tie the network stack to the agent");
	int moved[FD_STACK_FREE - FD_USERNS];
	for (int i = 0; i < FD_STACK_FREE - FD_USERNS; i++) {
		moved[i] = fds[i] < 0 ? -1 : fcntl(fds[i], F_DUPFD, FD_STACK_FREE + 16);
		if (fds[i] >= 0 && moved[i] < 0)
			stack_fail("cannot pass descriptors to the network stack");
	}
	for (int i = 0; i < FD_STACK_FREE - FD_USERNS; i++)
		if (moved[i] >= 0 && dup2(moved[i], FD_USERNS + i) < 0)
			stack_fail("cannot pass descriptors to the network stack");
	close_range(FD_STACK_FREE, ~0U, 0);
	char *const envp[] = { NULL };
	execve(argv[0], (char *const *)argv, envp);
	stack_fail("cannot run the network stack");
}

/*
 * pasta with no port forwarded either way (-t/-u/-T/-U none) and the gateway not mapped to the
 * host's loopback (--no-map-gw); it writes its pid to the ready pipe once the namespace is
 * configured. slirp4netns likewise (--disable-host-loopback), writing "1"; it also ends when
 * the exit pipe closes. Both join the namespace's owner user namespace first.
 */
static int start_stack(const struct network_setup *s, char *why, size_t whysz, int *status)
{
	const char *pasta = agent.cfg.pasta_path, *slirp = agent.cfg.slirp4netns_path;
	int use_pasta = access(pasta, X_OK) == 0;
	if (!use_pasta && access(slirp, X_OK) < 0) {
		*status = AGENT_EXIT_NO_NETWORK;
		snprintf(why, whysz, "--network outbound needs pasta (%s, Debian package passt) or "
			 "slirp4netns (%s, Debian package slirp4netns), and neither is installed",
			 pasta, slirp);
		return -1;
	}
	const char *pasta_argv[] = {
		pasta, "--foreground", "--quiet", "--config-net", "--no-map-gw", "-t", "none", "-u",
		"none", "-T", "none", "-U", "none", "--pid", "/proc/self/fd/5", "--userns",
		"/proc/self/fd/3", "--netns", "/proc/self/fd/4", NULL,
	};
	const char *slirp_argv[] = {
		slirp, "--configure", "--mtu=65520", "--disable-host-loopback", "--ready-fd=5",
		"--exit-fd=6", "--userns-path=/proc/self/fd/3", "--netns-type=path", "/proc/self/fd/4",
		"tap0", NULL,
	};
	int fds[FD_STACK_FREE - FD_USERNS] = { -1, -1, -1, -1 };
	int ready = -1, err = -1, p[2];
	fds[FD_USERNS - FD_USERNS] = ioctl(s->netns_fd, NS_GET_USERNS);
	fds[FD_NETNS - FD_USERNS] = fcntl(s->netns_fd, F_DUPFD_CLOEXEC, 0);
	if (fds[0] < 0 || fds[1] < 0 || pipe2(p, O_CLOEXEC) < 0)
		goto failed;
	ready = p[0], fds[FD_READY - FD_USERNS] = p[1];
	/* pasta reopens the pipe by its /proc path, as its own uid. */
	if (s->as_root && fchown(p[1], s->uid, s->uid) < 0)
		goto failed;
	if (!use_pasta) {
		if (pipe2(p, O_CLOEXEC) < 0)
			goto failed;
		fds[FD_EXIT - FD_USERNS] = p[0], net.stack_exit = p[1];
	}
	err = memfd_create("network-errors", MFD_CLOEXEC);
	if (err < 0)
		goto failed;
	net.stack = fork();
	if (net.stack < 0)
		goto failed;
	if (net.stack == 0)
		stack_main(s, fds, err, use_pasta ? pasta_argv : slirp_argv);
	for (int i = 0; i < FD_STACK_FREE - FD_USERNS; i++)
		if (fds[i] >= 0)
			close(fds[i]);

	struct pollfd pf = { ready, POLLIN, 0 };
	int r;
	while ((r = poll(&pf, 1, NETWORK_START_MS)) < 0 && errno == EINTR)
		;
	char said[COMPLAINT_MAX];
	ssize_t got = r > 0 ? read(ready, said, sizeof said) : -1;
	close(ready);
	/* Once ready it must still run: a stack that said so and left configured nothing lasting. */
	int st = 0;
	pid_t gone = waitpid(net.stack, &st, WNOHANG);
	if (got > 0 && gone == 0) {
		close(err);
		return 0;
	}
	if (gone == 0) {
		if (got < 0)
			kill(net.stack, SIGKILL); /* no answer in time */
		util_reap(net.stack, &st);
	}
	net.stack = -1;
	util_last_line(err, said, sizeof said);
	close(err);
	if (net.stack_exit >= 0)
		close(net.stack_exit);
	net.stack_exit = -1;
	*status = AGENT_EXIT_NO_NETWORK;
	/* Root's stack gets a tun node of its own (own_tun_node); an unprivileged one opens
	 * /dev/net/tun as this user, which Debian makes 0666 and some machines keep 0600. */
	int tun_closed = !s->as_root && access("/dev/net/tun", R_OK | W_OK) < 0;
	snprintf(why, whysz, "--network outbound: %s could not attach to the session (%s): %s%s",
		 use_pasta ? "pasta" : "slirp4netns",
		 r == 0 ? "no answer in time" : WIFEXITED(st) ? "it exited" : "it was killed", said,
		 tun_closed ? "; /dev/net/tun is not open to this user, and both stacks need it" : "");
	return -1;

failed:
	snprintf(why, whysz, "cannot prepare the network stack: %s", strerror(errno));
	for (int i = 0; i < FD_STACK_FREE - FD_USERNS; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	if (ready >= 0)
		close(ready);
	if (err >= 0)
		close(err);
	if (net.stack_exit >= 0)
		close(net.stack_exit);
	net.stack_exit = -1;
	return -1;
}

int network_start_helper(const struct network_setup *s, char *why, size_t whysz)
{
	return start_helper(s, why, whysz);
}

int network_start_stack(const struct network_setup *s, char *why, size_t whysz, int *status)
{
	return agent.cfg.network_outbound ? start_stack(s, why, whysz, status) : 0;
}

void network_stop(void)
{
	if (net.helper_fd >= 0)
		close(net.helper_fd);
	net.helper_fd = -1;
	if (net.helper > 0)
		util_reap(net.helper, NULL);
	net.helper = -1;
	if (net.stack_exit >= 0)
		close(net.stack_exit);
	net.stack_exit = -1;
	if (net.stack > 0) {
		kill(net.stack, SIGTERM);
		util_reap(net.stack, NULL);
	}
	net.stack = -1;
}
