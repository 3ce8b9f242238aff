/* confine.c — see confine.h. */
#include "confine.h"

#include "agent.h"
#include "contain.h"
#include "log.h"
#include "network.h"
#include "paths.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/loop.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

/* How long bubblewrap may take to build the session before the start fails: it takes a few
 * milliseconds; seconds mean a machine too loaded to serve anyway. */
#define CONFINE_START_MS 10000
/* bubblewrap's --info-fd document is a few lines of JSON; anything longer is not it. */
#define INFO_MAX 1024
/* The first line of bubblewrap's complaint is what a failure quotes; the rest of the sentence
 * around it must fit why. */
#define COMPLAINT_MAX 256

/* The descriptors bubblewrap and the init get (src/init/init.c reads 3 and 4). */
enum { FD_READY = 3, FD_LIFELINE, FD_INFO, FD_PASSWD, FD_GROUP, FD_HOSTS, FD_INIT, FD_FIRST_FREE };

/* The one session of this agent; the agent is single-threaded, as everywhere else in it. */
static struct {
	int active;
	int as_root;            /* the agent runs as host root: the sandbox user is --host-uid */
	uid_t uid;              /* the host uid (and gid) the sandbox user is */
	pid_t bwrap;            /* bubblewrap, the agent's child; -1 when none */
	pid_t init;             /* the session's process 1, as the host sees it */
	int init_pidfd;         /* what commands join through; -1 when none */
	int lifeline;           /* the pipe end whose closing ends the init; -1 when none */
	int home_fd;            /* the sandbox user's home; -1: / */
	int join;               /* the namespaces a command joins */
	struct event *watch;
	int lost;
} session = { 0, 0, 0, -1, -1, -1, -1, -1, 0, NULL, 0 };

/* fuse-overlayfs, when it lays the session's image: the prep, which starts it, leaves its pid in
 * a page shared with the agent (0: none), and the agent ends it once the session is over. Its
 * parent-death signal cannot: the kernel clears that at the daemon's first change of filesystem
 * uid, made to create a file as the sandbox user. */
static pid_t *fuse_pid_slot;
static int fuse_pidfd = -1;
/* How long fuse-overlayfs gets to leave after SIGTERM before SIGKILL: it unmounts and exits in
 * milliseconds when it is not blocked waiting for a request that will never come. */
#define FUSE_STOP_MS 1000

/* The host's top-level directories that merged-/usr systems keep as links into /usr: each is
 * made the same link in the session's tree, or bound read-only when the host has a directory. */
static const char *const usr_links[] = { "bin", "sbin", "lib", "lib32", "lib64", "libx32" };
/* What of the host's /etc programs need, read-only; the rest of /etc is the session's own. */
static const char *const etc_files[] = {
	"/etc/ld.so.cache", "/etc/nsswitch.conf", "/etc/resolv.conf", "/etc/ssl/certs",
	"/etc/alternatives", "/etc/localtime",
};
#define N_USR_LINKS (sizeof usr_links / sizeof usr_links[0])
#define N_ETC_FILES (sizeof etc_files / sizeof etc_files[0])

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* The agent's own directory + CONFINE_INIT_NAME, in out (PATH_MAX bytes); -1 when unknown. */
static int init_beside_agent(char *out)
{
	ssize_t n = readlink("/proc/self/exe", out, PATH_MAX - 1);
	if (n <= 0)
		return -1;
	out[n] = '\0';
	char *slash = strrchr(out, '/');
	if (slash == NULL || (size_t)(slash - out) + 1 + sizeof CONFINE_INIT_NAME > PATH_MAX)
		return -1;
	strcpy(slash + 1, CONFINE_INIT_NAME);
	return 0;
}

/* A pipe whose read end holds text: what bubblewrap copies into a file of the session. The
 * texts are far below a pipe's 64 KiB, so the write cannot block. The read end, or -1. */
static int data_pipe(const char *text)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	size_t len = strlen(text);
	ssize_t w = write(p[1], text, len);
	int e = errno;
	close(p[1]);
	if (w != (ssize_t)len) {
		close(p[0]);
		errno = w < 0 ? e : EIO;
		return -1;
	}
	return p[0];
}

/* The login shell of the sandbox user: bash where the host has it, else sh. */
static const char *user_shell(void)
{
	/* An image's shells are not the host's: /bin/sh is the one every image has. */
	if (agent.cfg.image_path)
		return "/bin/sh";
	return access("/usr/bin/bash", X_OK) == 0 ? "/bin/bash" : "/bin/sh";
}

/* The files of /etc the session gets from the agent rather than from the host: only the users
 * and groups that exist inside, and a hosts file naming the session's own name. */
static int make_etc(int fds[3])
{
	char passwd[512], group[256];
	snprintf(passwd, sizeof passwd,
		 "root:x:0:0:root:/root:/bin/sh\n"
		 "%s:x:%d:%d:%s:%s:%s\n"
		 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		 CONFINE_USER, CONFINE_UID, CONFINE_UID, CONFINE_USER, CONFINE_HOME, user_shell());
	snprintf(group, sizeof group, "root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", CONFINE_USER,
		 CONFINE_UID);
	const char *hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
			    "127.0.1.1\t" CONFINE_HOSTNAME "\n";
	fds[0] = data_pipe(passwd);
	fds[1] = data_pipe(group);
	fds[2] = data_pipe(hosts);
	if (fds[0] >= 0 && fds[1] >= 0 && fds[2] >= 0)
		return 0;
	int e = errno;
	for (int i = 0; i < 3; i++)
		close_fd(&fds[i]);
	errno = e;
	return -1;
}

/*
 * bubblewrap's arguments: the namespaces, the session's tree as / (bound at /tmp of the prep's
 * mount namespace, see prep_main), what comes from the host read-only, and the init to run
 * through its descriptor. host_dirs says which of usr_links the host has as directories. A
 * session from an image has the image's /usr and /etc instead of the host's: only the files
 * the agent generates, and the host's resolv.conf, are laid over it.
 * The vector has room for every word (see the size in confine_start).
 */
static void bwrap_argv(const char **v, const char *bwrap, const int host_dirs[N_USR_LINKS])
{
	static const char *const head[] = {
		"--unshare-user", "--uid", "1000", "--gid", "1000", "--unshare-pid", "--unshare-ipc",
		"--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--hostname", CONFINE_HOSTNAME,
		"--die-with-parent", "--as-pid-1", "--info-fd", "5",
		"--bind", "/tmp", "/",
	};
	static const char *const host_usr[] = { "--ro-bind", "/usr", "/usr" };
	/* Modes as a system has them: bubblewrap would make its own files and folders private to
	 * the user, which programs running as another uid inside could not read. */
	static const char *const tail[] = {
		"--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp",
	};
	static const char *const host_etc[] = {
		"--perms", "0755", "--tmpfs", "/etc", "--perms", "0755", "--dir", "/etc/ssl",
	};
	static const char *const data[] = {
		"--perms", "0644", "--ro-bind-data", "6", "/etc/passwd",
		"--perms", "0644", "--ro-bind-data", "7", "/etc/group",
		"--perms", "0644", "--ro-bind-data", "8", "/etc/hosts",
		"--chdir", "/", "--", "/proc/self/fd/9",
	};
	static char top[N_USR_LINKS][16];
	int image = agent.cfg.image_path != NULL;
	size_t k = 0;
	v[k++] = bwrap;
	for (size_t i = 0; i < sizeof head / sizeof *head; i++)
		v[k++] = head[i];
	for (size_t i = 0; !image && i < sizeof host_usr / sizeof *host_usr; i++)
		v[k++] = host_usr[i];
	for (size_t i = 0; !image && i < N_USR_LINKS; i++) {
		if (!host_dirs[i])
			continue;
		snprintf(top[i], sizeof top[i], "/%s", usr_links[i]);
		v[k++] = "--ro-bind";
		v[k++] = top[i];
		v[k++] = top[i];
	}
	for (size_t i = 0; i < sizeof tail / sizeof *tail; i++)
		v[k++] = tail[i];
	for (size_t i = 0; !image && i < sizeof host_etc / sizeof *host_etc; i++)
		v[k++] = host_etc[i];
	for (size_t i = 0; i < N_ETC_FILES; i++) {
		/* An image keeps its own, except where to find names, which is this machine's. */
		if (image && strcmp(etc_files[i], "/etc/resolv.conf") != 0)
			continue;
		v[k++] = "--ro-bind-try";
		v[k++] = etc_files[i];
		v[k++] = etc_files[i];
	}
	for (size_t i = 0; i < sizeof data / sizeof *data; i++)
		v[k++] = data[i];
	v[k] = NULL;
}
#define BWRAP_ARGV_MAX (1 + 19 + 3 + 3 * N_USR_LINKS + 8 + 8 + 3 * N_ETC_FILES + 19 + 1)

/* The mount points bubblewrap needs in a session from an image, made as root in the session's
 * own layer (never the image's) before bubblewrap, which as the sandbox user could not make them
 * in the image's root-owned folders. What is in the way with another kind (a link a stranger's
 * image planted where /etc/hosts goes) is removed from the session's view first, so no mount
 * follows it out. */
static const struct { const char *path; mode_t mode; int dir; } image_points[] = {
	{ "proc", 0555, 1 }, { "dev", 0755, 1 }, { "tmp", 01777, 1 }, { "etc", 0755, 1 },
	{ "home", 0755, 1 }, { "home/" CONFINE_USER, 0755, 1 }, { "etc/passwd", 0644, 0 },
	{ "etc/group", 0644, 0 }, { "etc/hosts", 0644, 0 }, { "etc/resolv.conf", 0644, 0 },
};

static int prepare_image_tree(int root)
{
	for (size_t i = 0; i < sizeof image_points / sizeof *image_points; i++) {
		const char *path = image_points[i].path;
		struct stat st;
		int want_dir = image_points[i].dir;
		if (fstatat(root, path, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			if (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode))
				continue;
			if (unlinkat(root, path, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0)
				return -1;
		} else if (errno != ENOENT) {
			return -1;
		}
		if (want_dir) {
			if (mkdirat(root, path, image_points[i].mode) < 0 ||
			    fchmodat(root, path, image_points[i].mode, 0) < 0)
				return -1;
		} else {
			int fd = openat(root, path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
					image_points[i].mode);
			if (fd < 0)
				return -1;
			close(fd);
		}
	}
	/* The sandbox user's home is its own, as in a session without an image. */
	return fchownat(root, "home/" CONFINE_USER, session.uid, session.uid, AT_SYMLINK_NOFOLLOW);
}

/* In the session's tree, as the sandbox user: the home, and the merged-/usr links the host has
 * (bubblewrap cannot make a link that exists, which a revived session's tree has). Each step is
 * beneath the tree and follows no link a command planted; what is in the way stays. */
static void prepare_tree(int root, const int host_dirs[N_USR_LINKS])
{
	char target[PATH_MAX];
	for (size_t i = 0; i < N_USR_LINKS; i++) {
		char top[16];
		snprintf(top, sizeof top, "/%s", usr_links[i]);
		ssize_t n = readlink(top, target, sizeof target - 1);
		if (host_dirs[i] || n <= 0)
			continue;
		target[n] = '\0';
		if (symlinkat(target, root, usr_links[i]) < 0 && errno != EEXIST)
			return;
	}
	if (mkdirat(root, "home", 0755) < 0 && errno != EEXIST)
		return;
	int home;
	if (paths_open_at(root, "home", O_PATH | O_DIRECTORY, 0, &home) != PATH_OK)
		return;
	mkdirat(home, CONFINE_USER, 0755);
	close(home);
}

/* A free loop device may be taken by another process between the kernel's naming it and the
 * agent's configuring it (EBUSY): a few more tries ride that out. */
#define LOOP_TRIES 8

/*
 * --disk: the session's filesystem image, attached to a loop device that detaches itself once
 * its last mount is gone (the prep's mount namespace and bubblewrap's, which end with the
 * session), mounted over the root in the prep's mount namespace (not over /tmp, which may hold the
 * image and the state folder) without devices or set-user-ID. 0, or -1 with errno.
 */
static int mount_disk(void)
{
	int image = open(agent.cfg.disk_path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	int control = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
	int rc = -1;
	for (int tries = 0; image >= 0 && control >= 0 && rc < 0 && tries < LOOP_TRIES; tries++) {
		int n = ioctl(control, LOOP_CTL_GET_FREE);
		if (n < 0)
			break;
		char dev[32];
		snprintf(dev, sizeof dev, "/dev/loop%d", n);
		int loop = open(dev, O_RDWR | O_CLOEXEC);
		if (loop < 0)
			continue;
		struct loop_config config;
		memset(&config, 0, sizeof config);
		config.fd = (unsigned)image;
		config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
		if (ioctl(loop, LOOP_CONFIGURE, &config) == 0)
			rc = mount(dev, agent.cfg.root_path, "ext4", MS_NOSUID | MS_NODEV, NULL);
		int e = errno;
		/* The mount holds the device now; without one, autoclear detaches it here. */
		close(loop);
		errno = e;
		if (rc < 0 && errno != EBUSY)
			break;
	}
	int e = errno;
	if (image >= 0)
		close(image);
	if (control >= 0)
		close(control);
	errno = e;
	return rc;
}

/* In the session's disk, as root: the folders the session's files live in, the sandbox user's
 * (tree, or an image's upper) and overlayfs's work folder. */
static int prepare_disk(void)
{
	int top = open(agent.cfg.root_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (top < 0)
		return -1;
	const char *own = agent.cfg.image_path ? "upper" : "tree";
	int rc = 0;
	if ((mkdirat(top, own, 0755) < 0 && errno != EEXIST) ||
	    fchownat(top, own, session.uid, session.uid, AT_SYMLINK_NOFOLLOW) < 0 ||
	    (agent.cfg.image_path && mkdirat(top, "work", 0700) < 0 && errno != EEXIST))
		rc = -1;
	close(top);
	return rc;
}

/* How long fuse-overlayfs may take to mount the session's tree (milliseconds: it is up in a few),
 * and how often the prep looks. */
#define FUSE_MOUNT_MS 5000
#define FUSE_LOOK_MS 5

/*
 * Where the kernel refuses overlayfs (or --overlay fuse asks): fuse-overlayfs serves the same
 * layers at /tmp of the prep's mount namespace, in the foreground, as a child of the prep. The
 * prep then becomes bubblewrap, so the child is bubblewrap's: its parent-death signal reaches it
 * when bubblewrap ends, which is when the session does, and it unmounts and exits. allow_other
 * lets the sandbox user's uid, not only the mounter, use the mount; what it may do there is
 * what the layers' owners and modes allow. Its pid, or -1 with errno.
 */
static pid_t mount_fuse_overlay(const char *opts)
{
	struct stat before, now;
	if (stat("/tmp", &before) < 0)
		return -1;
	char all[3 * PATH_MAX + 96];
	snprintf(all, sizeof all, "%s,allow_other", opts);
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		/* Nothing of bubblewrap's may stay open here: a pipe end held by this process
		 * would hide from the agent that the session's init is gone. Its complaints go
		 * nowhere: bubblewrap's standard error says why a start failed. */
		if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent || dup2(1, 2) < 0)
			_exit(127);
		close_range(3, ~0U, 0);
		char *const argv[] = { (char *)agent.cfg.fuse_overlayfs_path, "-f", "-o", all, "/tmp",
				       NULL };
		char *const envp[] = { NULL };
		execve(argv[0], argv, envp);
		_exit(127);
	}
	struct timespec pause = { 0, FUSE_LOOK_MS * 1000000L };
	for (int waited = 0; waited < FUSE_MOUNT_MS; waited += FUSE_LOOK_MS) {
		if (stat("/tmp", &now) == 0 && now.st_dev != before.st_dev)
			return pid;
		if (waitpid(pid, NULL, WNOHANG) == pid) {
			errno = EIO;
			return -1;
		}
		nanosleep(&pause, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	errno = ETIMEDOUT;
	return -1;
}

/* The agent's hold on the fuse-overlayfs the prep started, if any, taken once the prep is past
 * starting it (bubblewrap runs, or failed). */
static void take_fuse_daemon(void)
{
	if (fuse_pid_slot == NULL)
		return;
	if (*fuse_pid_slot > 0 && fuse_pidfd < 0)
		fuse_pidfd = (int)syscall(SYS_pidfd_open, *fuse_pid_slot, 0);
	munmap(fuse_pid_slot, sizeof *fuse_pid_slot);
	fuse_pid_slot = NULL;
}

/* Ends fuse-overlayfs once nothing of the session uses its mount. */
static void stop_fuse_daemon(void)
{
	take_fuse_daemon();
	if (fuse_pidfd < 0)
		return;
	syscall(SYS_pidfd_send_signal, fuse_pidfd, SIGTERM, NULL, 0);
	struct pollfd p = { fuse_pidfd, POLLIN, 0 };
	if (poll(&p, 1, FUSE_STOP_MS) != 1)
		syscall(SYS_pidfd_send_signal, fuse_pidfd, SIGKILL, NULL, 0);
	close_fd(&fuse_pidfd);
}

/* Lays the image below the session's own tree at /tmp: overlayfs, or fuse-overlayfs where the
 * kernel refuses it (no overlayfs, or none in a user namespace before Linux 5.11) or --overlay
 * fuse asks. 0, or -1 with why. */
static int mount_overlay(const char *opts, char *why, size_t whysz)
{
	if (!agent.cfg.overlay_fuse) {
		if (mount("overlay", "/tmp", "overlay", 0, opts) == 0)
			return 0;
		if (errno != EPERM && errno != EINVAL && errno != ENODEV) {
			snprintf(why, whysz, "overlayfs: %s", strerror(errno));
			return -1;
		}
	}
	int refused = errno;
	if (access(agent.cfg.fuse_overlayfs_path, X_OK) < 0) {
		snprintf(why, whysz, "overlayfs: %s, and fuse-overlayfs is not installed (%s; Debian "
			 "package fuse-overlayfs)", agent.cfg.overlay_fuse ? "not asked for" :
			 strerror(refused), agent.cfg.fuse_overlayfs_path);
		return -1;
	}
	if (fuse_pid_slot == NULL) {
		errno = ENOMEM;
		snprintf(why, whysz, "fuse-overlayfs: no page to say its pid in");
		return -1;
	}
	pid_t daemon = mount_fuse_overlay(opts);
	if (daemon < 0) {
		snprintf(why, whysz, "fuse-overlayfs: %s", strerror(errno));
		return -1;
	}
	*fuse_pid_slot = daemon;
	return 0;
}

/* Says why the prep failed on its standard error (bubblewrap's, which the agent reads back). */
static void prep_fail(const char *what) __attribute__((noreturn));
static void prep_fail(const char *what)
{
	dprintf(2, "%s: %s\n", what, strerror(errno));
	_exit(127);
}

/*
 * The prep: a child of the agent that makes the mount namespace bubblewrap starts from. There
 * the tree is bound onto /tmp, so bubblewrap, run as the sandbox user's host uid, reaches it as
 * /tmp whatever folders above it that uid may not enter (a state folder of mode 0700 owned by
 * root): the bind is made before the uid changes. fds holds, in order, the descriptors
 * bubblewrap gets as 3 to 9; err becomes its standard error.
 */
static void prep_main(const int fds[FD_FIRST_FREE - FD_READY], int err, const char *const *argv,
		      const int host_dirs[N_USR_LINKS])
{
	if (dup2(err, 2) < 0)
		_exit(127);
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0)
		prep_fail("cannot open /dev/null");
	/* The root is reached through the working directory, which a new mount namespace carries
	 * over into its own copy of the mounts (a descriptor would still name the old ones). */
	if (fchdir(agent.cfg.root_fd) < 0)
		prep_fail("cannot enter the root");
	if (unshare(CLONE_NEWNS) < 0)
		prep_fail("cannot make a mount namespace");
	/* A slave receives the host's later mounts and sends none back. */
	if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
		prep_fail("cannot make the mounts private");
	/* With a disk, the session's files are on it, mounted over the root first; the bind or
	 * the overlay below then takes the folder of it the session sees. */
	char on_disk[2][PATH_MAX + 8];
	snprintf(on_disk[0], sizeof on_disk[0], "%s/upper", agent.cfg.root_path);
	snprintf(on_disk[1], sizeof on_disk[1], "%s/work", agent.cfg.root_path);
	if (agent.cfg.disk_path && (mount_disk() < 0 || prepare_disk() < 0))
		prep_fail("cannot mount the session's disk");
	if (agent.cfg.image_path) {
		/* The image below, the session's own tree above it: every write lands in the
		 * session's tree, and the image is read by every session alike. */
		char opts[3 * PATH_MAX + 64];
		int disk = agent.cfg.disk_path != NULL;
		snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s",
			 agent.cfg.image_path, disk ? on_disk[0] : agent.cfg.root_path,
			 disk ? on_disk[1] : agent.cfg.image_work_path);
		char why[4 * PATH_MAX];
		if (mount_overlay(opts, why, sizeof why) < 0) {
			dprintf(2, "cannot lay the session's tree over its image: %s\n", why);
			_exit(127);
		}
		int top = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (top < 0 || prepare_image_tree(top) < 0)
			prep_fail("cannot make the image's mount points in the session's tree");
		close(top);
	} else {
		char tree_path[PATH_MAX + 8];
		snprintf(tree_path, sizeof tree_path, "%s/tree", agent.cfg.root_path);
		if (mount(agent.cfg.disk_path ? tree_path : ".", "/tmp", NULL, MS_BIND | MS_REC,
			  NULL) < 0)
			prep_fail("cannot bind the root");
	}
	/* The tree as bubblewrap will see it, opened while the prep may still enter it. */
	int tree = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (tree < 0)
		prep_fail("cannot open the session's tree");
	/* Host root's supplementary groups must not follow it in, nor any capability. */
	if (session.as_root && (confine_drop_groups() < 0 || setresgid(session.uid, session.uid,
									  session.uid) < 0 ||
				setresuid(session.uid, session.uid, session.uid) < 0))
		prep_fail("cannot become the sandbox user's host uid");
	if (agent.cfg.image_path == NULL)
		prepare_tree(tree, host_dirs);
	close(tree);
	/* Into place from above the range, so no move overwrites a descriptor still to move. */
	int moved[FD_FIRST_FREE - FD_READY];
	for (int i = 0; i < FD_FIRST_FREE - FD_READY; i++) {
		moved[i] = fcntl(fds[i], F_DUPFD, FD_FIRST_FREE + 16);
		if (moved[i] < 0)
			prep_fail("cannot pass descriptors to bubblewrap");
	}
	for (int i = 0; i < FD_FIRST_FREE - FD_READY; i++)
		if (dup2(moved[i], FD_READY + i) < 0)
			prep_fail("cannot pass descriptors to bubblewrap");
	close_range(FD_FIRST_FREE, ~0U, 0);
	char *const envp[] = { NULL };
	execve(argv[0], (char *const *)argv, envp);
	prep_fail("cannot run bubblewrap");
}

/* Waits up to the start deadline for fd to be readable; 1 when it is, 0 at the deadline. */
static int wait_readable(int fd, const struct timespec *deadline)
{
	for (;;) {
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		long long ms = (deadline->tv_sec - now.tv_sec) * 1000LL +
			       (deadline->tv_nsec - now.tv_nsec) / 1000000;
		if (ms <= 0)
			return 0;
		struct pollfd p = { fd, POLLIN, 0 };
		int r = poll(&p, 1, (int)ms);
		if (r > 0)
			return 1;
		if (r < 0 && errno != EINTR)
			return 0;
	}
}

/* The init's host pid from bubblewrap's --info-fd document; -1 when it does not say. */
static pid_t read_child_pid(int fd, const struct timespec *deadline)
{
	char info[INFO_MAX + 1];
	size_t got = 0;
	while (got < INFO_MAX && wait_readable(fd, deadline)) {
		ssize_t r = read(fd, info + got, INFO_MAX - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
		info[got] = '\0';
		if (strchr(info, '}'))
			break;
	}
	info[got] = '\0';
	const char *at = strstr(info, "\"child-pid\"");
	if (at == NULL || (at = strchr(at, ':')) == NULL)
		return -1;
	char *end;
	long pid = strtol(at + 1, &end, 10);
	return pid > 0 && pid <= INT_MAX && end != at + 1 ? (pid_t)pid : -1;
}

/* An exit status as the shell says it. */
static int status_code(int status)
{
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* What a root agent's probe found: the namespace refused, or the uid it could not become. */
enum probe_stage { PROBE_OK, PROBE_NAMESPACE, PROBE_UID };

/*
 * Whether this machine lets the agent make a user namespace — as the sandbox user's host uid
 * when as_uid, as bubblewrap will — tried in a throwaway child, since a namespace once entered
 * cannot be left. The stage that failed, with its errno in *err.
 */
static enum probe_stage probe_user_namespace(int as_uid, int *err)
{
	int report[2];
	if (pipe2(report, O_CLOEXEC) < 0) {
		*err = errno;
		return PROBE_NAMESPACE;
	}
	pid_t pid = fork();
	if (pid == 0) {
		int said[2] = { PROBE_UID, 0 };
		if (as_uid && (confine_drop_groups() < 0 ||
			       setresgid(session.uid, session.uid, session.uid) < 0 ||
			       setresuid(session.uid, session.uid, session.uid) < 0))
			said[1] = errno;
		else if (said[0] = PROBE_NAMESPACE, unshare(CLONE_NEWUSER) < 0)
			said[1] = errno;
		else
			said[0] = PROBE_OK;
		ssize_t w = write(report[1], said, sizeof said);
		_exit(w == (ssize_t)sizeof said ? 0 : 1);
	}
	int said[2] = { PROBE_NAMESPACE, errno };
	close(report[1]);
	if (pid > 0) {
		ssize_t r;
		while ((r = read(report[0], said, sizeof said)) < 0 && errno == EINTR)
			;
		if (r != (ssize_t)sizeof said)
			said[0] = PROBE_NAMESPACE, said[1] = ECHILD;
		util_reap(pid, NULL);
	}
	close(report[0]);
	*err = said[1];
	return (enum probe_stage)said[0];
}

/*
 * Why bubblewrap could not build the session, when a root agent's probes can tell: the
 * machine refuses user namespaces, to everyone or to the sandbox user's uid, or that uid is
 * none of the agent's user namespace. Asked only once bubblewrap failed, so that a start that
 * works pays no probe. 1 with the sentence in why, 0 when the probes find nothing wrong.
 */
static int explain_refusal(char *why, size_t whysz)
{
	/* The sandbox user's own try is the one that counts; only when it fails does the agent's
	 * own say whether the machine refuses user namespaces to everyone. */
	int err, plain_err;
	enum probe_stage stage = probe_user_namespace(1, &err);
	if (stage == PROBE_OK)
		return 0;
	if (probe_user_namespace(0, &plain_err) != PROBE_OK)
		snprintf(why, whysz, "cannot confine commands: this machine refuses user namespaces "
			 "(%s; the sysctl user.max_user_namespaces, or a container's policy)",
			 strerror(plain_err));
	else if (stage == PROBE_UID)
		snprintf(why, whysz, "cannot confine commands: the agent cannot become uid %u (%s): "
			 "it is no uid of this user namespace", (unsigned)session.uid, strerror(err));
	else
		snprintf(why, whysz, "cannot confine commands: this machine refuses user namespaces to "
			 "the sandbox user's host uid %u (%s; a policy for unprivileged users)",
			 (unsigned)session.uid, strerror(err));
	return 1;
}

/* Who the sandbox user is on the host: --host-uid as root (or the root's owner), then given
 * the root; the agent's own uid otherwise, from a user namespace of its own. -1 with why and
 * *status set. */
static int choose_identity(char *why, size_t whysz, int *status)
{
	struct stat st;
	if (fstat(agent.cfg.root_fd, &st) < 0) {
		snprintf(why, whysz, "cannot look at the root: %s", strerror(errno));
		return -1;
	}
	session.as_root = geteuid() == 0;
	if (!session.as_root) {
		if (agent.cfg.host_uid >= 0 && (uid_t)agent.cfg.host_uid != geteuid()) {
			snprintf(why, whysz, "--host-uid is for an agent run as root: this one runs as "
				 "uid %u, which the sandbox user maps to", (unsigned)geteuid());
			return -1;
		}
		session.uid = geteuid();
		/* The user namespace gives the agent the capability to make mounts and join the
		 * session's PID namespace; it maps the agent's user onto itself. */
		if (contain_enter_user_namespace() < 0) {
			*status = AGENT_EXIT_NO_ISOLATION;
			snprintf(why, whysz, "cannot confine commands: this machine refuses user "
				 "namespaces (%s; the sysctl user.max_user_namespaces, or a container's "
				 "policy)", strerror(errno));
			return -1;
		}
		return 0;
	}
	if (agent.cfg.host_uid >= 0) {
		session.uid = (uid_t)agent.cfg.host_uid;
	} else if (st.st_uid != 0) {
		session.uid = st.st_uid;
	} else {
		snprintf(why, whysz, "as root, --isolate bwrap needs --host-uid UID: the unprivileged "
			 "host uid the sandbox user is");
		return -1;
	}
	if (session.uid == 0) {
		snprintf(why, whysz, "--host-uid 0 would make the sandbox user root on the host");
		return -1;
	}
	if (st.st_uid != 0 && st.st_uid != session.uid) {
		snprintf(why, whysz, "the root belongs to uid %u, not to the sandbox user's host uid "
			 "%u", (unsigned)st.st_uid, (unsigned)session.uid);
		return -1;
	}
	/* The tree belongs to the sandbox user: a fresh one is taken over, one made for another
	 * uid is refused rather than left unwritable. */
	if (st.st_uid == 0 && fchownat(agent.cfg.root_fd, "", session.uid, session.uid,
				       AT_EMPTY_PATH) < 0) {
		int e = errno;
		/* A uid the agent's user namespace does not map is refused here first. */
		if (explain_refusal(why, whysz)) {
			*status = AGENT_EXIT_NO_ISOLATION;
			return -1;
		}
		snprintf(why, whysz, "cannot give the root to uid %u: %s", (unsigned)session.uid,
			 strerror(e));
		return -1;
	}
	return 0;
}

/* Ends what a failed start left: bubblewrap (and the init with it) and every descriptor. */
static void abandon(int fds[FD_FIRST_FREE - FD_READY], int *ready, int *info, int *err)
{
	for (int i = 0; i < FD_FIRST_FREE - FD_READY; i++)
		close_fd(&fds[i]);
	close_fd(ready);
	close_fd(info);
	close_fd(err);
	network_stop();
	close_fd(&session.lifeline);
	close_fd(&session.init_pidfd);
	if (session.bwrap > 0) {
		kill(session.bwrap, SIGKILL);
		util_reap(session.bwrap, NULL);
		session.bwrap = -1;
	}
	stop_fuse_daemon();
}

/* The session's network namespace, by its init: a descriptor, or -1 with why. */
static int open_netns(char *why, size_t whysz)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/ns/net", (int)session.init);
	int netns = open(path, O_RDONLY | O_CLOEXEC);
	if (netns < 0)
		snprintf(why, whysz, "cannot open the session's network namespace: %s", strerror(errno));
	return netns;
}

/* The namespaces a command joins: the init's, the cgroup one only where bubblewrap made one. */
static int join_flags(pid_t init)
{
	int flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS;
	char path[64];
	struct stat ours, theirs;
	snprintf(path, sizeof path, "/proc/%d/ns/cgroup", (int)init);
	if (stat("/proc/self/ns/cgroup", &ours) == 0 && stat(path, &theirs) == 0 &&
	    ours.st_ino != theirs.st_ino)
		flags |= CLONE_NEWCGROUP;
	return flags;
}

/* Builds the session with bubblewrap: 0, or -1 with why and *status. */
static int build(char *why, size_t whysz, int *status)
{
	int fds[FD_FIRST_FREE - FD_READY];
	for (int i = 0; i < FD_FIRST_FREE - FD_READY; i++)
		fds[i] = -1;
	int ready = -1, info = -1, err = -1, p[2];
	char init_path[PATH_MAX];
	const char *init = agent.cfg.init_path;
	if (init == NULL) {
		if (init_beside_agent(init_path) < 0) {
			snprintf(why, whysz, "cannot find %s beside the agent (give --init)",
				 CONFINE_INIT_NAME);
			return -1;
		}
		init = init_path;
	}
	fds[FD_INIT - FD_READY] = open(init, O_PATH | O_CLOEXEC);
	if (fds[FD_INIT - FD_READY] < 0) {
		snprintf(why, whysz, "cannot open the session's init %s: %s", init, strerror(errno));
		return -1;
	}
	if (pipe2(p, O_CLOEXEC) < 0)
		goto failed;
	ready = p[0], fds[FD_READY - FD_READY] = p[1];
	if (pipe2(p, O_CLOEXEC) < 0)
		goto failed;
	fds[FD_LIFELINE - FD_READY] = p[0], session.lifeline = p[1];
	if (pipe2(p, O_CLOEXEC) < 0)
		goto failed;
	info = p[0], fds[FD_INFO - FD_READY] = p[1];
	if (make_etc(&fds[FD_PASSWD - FD_READY]) < 0)
		goto failed;
	err = memfd_create("bwrap-errors", MFD_CLOEXEC);
	if (err < 0)
		goto failed;
	int host_dirs[N_USR_LINKS];
	for (size_t i = 0; i < N_USR_LINKS; i++) {
		struct stat st;
		char top[16];
		snprintf(top, sizeof top, "/%s", usr_links[i]);
		host_dirs[i] = lstat(top, &st) == 0 && S_ISDIR(st.st_mode);
	}
	const char *argv[BWRAP_ARGV_MAX];
	bwrap_argv(argv, agent.cfg.bwrap_path, host_dirs);
	if (agent.cfg.image_path) {
		void *page = mmap(NULL, sizeof *fuse_pid_slot, PROT_READ | PROT_WRITE,
				  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		fuse_pid_slot = page == MAP_FAILED ? NULL : page;
	}
	session.bwrap = fork();
	if (session.bwrap < 0)
		goto failed;
	if (session.bwrap == 0)
		prep_main(fds, err, argv, host_dirs);
	for (int i = 0; i < FD_FIRST_FREE - FD_READY; i++)
		close_fd(&fds[i]);

	struct timespec deadline, now;
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += CONFINE_START_MS / 1000;
	/* bubblewrap says which process the init is as soon as it made it, while it still builds
	 * the session's mounts: the network's helper starts meanwhile. The helper is no process of
	 * the session's (the agent joins its PID namespace only later), so commands cannot see it. */
	session.init = read_child_pid(info, &deadline);
	if (session.init > 0)
		session.init_pidfd = (int)syscall(SYS_pidfd_open, session.init, 0);
	if (session.init_pidfd >= 0) {
		int netns = open_netns(why, whysz);
		struct network_setup net = { netns, session.uid, session.as_root };
		int started = netns >= 0 && network_start_helper(&net, why, whysz) == 0;
		if (netns >= 0)
			close(netns);
		if (!started) {
			abandon(fds, &ready, &info, &err);
			return -1;
		}
	}
	char byte;
	ssize_t r = -1;
	if (session.init_pidfd >= 0 && wait_readable(ready, &deadline))
		while ((r = read(ready, &byte, 1)) < 0 && errno == EINTR)
			;
	if (r != 1) {
		char said[COMPLAINT_MAX];
		int st = 0;
		/* Ended already, or still at it when the time was up: either way it goes now. */
		kill(session.bwrap, SIGKILL);
		util_reap(session.bwrap, &st);
		session.bwrap = -1;
		util_first_line(err, said, sizeof said);
		*status = AGENT_EXIT_NO_ISOLATION;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec > deadline.tv_sec ||
		    (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec))
			snprintf(why, whysz, "cannot confine commands: bubblewrap did not build the "
				 "session within %d ms", CONFINE_START_MS);
		else if (!session.as_root || !explain_refusal(why, whysz))
			snprintf(why, whysz, "cannot confine commands: bubblewrap could not build the "
				 "session (status %d): %s", status_code(st), said);
		abandon(fds, &ready, &info, &err);
		return -1;
	}
	close_fd(&ready);
	close_fd(&info);
	close_fd(&err);
	take_fuse_daemon();
	return 0;

failed:
	snprintf(why, whysz, "cannot prepare the session: %s", strerror(errno));
	abandon(fds, &ready, &info, &err);
	return -1;
}

/* For outbound, the session's stack; then the agent moves its later children into the session's
 * PID namespace and looks at files through the init's root. */
static int enter(char *why, size_t whysz, int *status)
{
	char path[64];
	int netns = open_netns(why, whysz);
	if (netns < 0)
		return -1;
	struct network_setup net = { netns, session.uid, session.as_root };
	/* Before the PID namespace is joined: the stack must not be a process of the session,
	 * which could see it. */
	int r = network_start_stack(&net, why, whysz, status);
	close(netns);
	if (r < 0)
		return -1;
	if (setns(session.init_pidfd, CLONE_NEWPID) < 0) {
		snprintf(why, whysz, "cannot join the session's PID namespace: %s", strerror(errno));
		return -1;
	}
	snprintf(path, sizeof path, "/proc/%d/root", (int)session.init);
	int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0) {
		snprintf(why, whysz, "cannot open the session's root: %s", strerror(errno));
		return -1;
	}
	close(agent.cfg.root_fd);
	agent.cfg.root_fd = root;
	if (paths_open_at(root, CONFINE_HOME + 1, O_PATH | O_DIRECTORY, 0, &session.home_fd) !=
	    PATH_OK)
		session.home_fd = -1;
	session.join = join_flags(session.init);
	return 0;
}

int confine_start(char *why, size_t whysz, int *status)
{
	*status = AGENT_EXIT_START;
	if (access(agent.cfg.bwrap_path, X_OK) < 0) {
		*status = AGENT_EXIT_NO_ISOLATION;
		snprintf(why, whysz, "cannot confine commands: bubblewrap is not installed (%s: %s; "
			 "Debian package bubblewrap)", agent.cfg.bwrap_path, strerror(errno));
		return -1;
	}
	if (choose_identity(why, whysz, status) < 0)
		return -1;
	if (build(why, whysz, status) < 0)
		return -1;
	if (enter(why, whysz, status) < 0) {
		int s = *status;
		confine_stop();
		*status = s;
		return -1;
	}
	session.active = 1;
	return 0;
}

static void on_init_exit(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
	/* Whoever killed it ended the session and every command in it: no process can start in
	 * a PID namespace whose init is gone. */
	log_info("the session's init was killed: stopping");
	session.lost = 1;
	event_base_loopbreak(agent.base);
}

int confine_watch(void)
{
	if (!session.active)
		return 0;
	session.watch = event_new(agent.base, session.init_pidfd, EV_READ, on_init_exit, NULL);
	return session.watch && event_add(session.watch, NULL) == 0 ? 0 : -1;
}

int confine_lost(void)
{
	return session.lost;
}

void confine_settle(void)
{
	/* Root's file capabilities go with the change of fsuid; the rest stay for what the agent
	 * still does (commands' namespaces, signals). A file the agent makes in the session's own
	 * tmpfs needs an owner the session's user namespace maps, which root is not. */
	if (session.active && session.as_root) {
		setfsgid(session.uid);
		setfsuid(session.uid);
	}
}

int confine_active(void)
{
	return session.active;
}

const char *confine_description(void)
{
	static char text[160];
	snprintf(text, sizeof text, "commands confined in the session's own namespaces as uid %d "
		 "(host uid %u), network %s", CONFINE_UID, (unsigned)session.uid,
		 agent.cfg.network_outbound ? "outbound" : "none");
	return text;
}

int confine_default_cwd(void)
{
	return session.home_fd >= 0 ? session.home_fd : agent.cfg.root_fd;
}

int confine_drop_groups(void)
{
	/* A user namespace may forbid setgroups(2) (setgroups "deny"): then the groups are the
	 * ones its creator had, which it could not drop either, and none of root's. */
	return setgroups(0, NULL) == 0 || errno == EPERM ? 0 : -1;
}

int confine_drop_capabilities(void)
{
	/* The bounding set first: dropping from it needs CAP_SETPCAP, which goes below. The
	 * kernel answers EINVAL past the last capability it knows. */
	for (int cap = 0;; cap++) {
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0)
			continue;
		if (errno == EINVAL)
			break;
		return -1;
	}
	struct __user_cap_header_struct head = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3];
	memset(none, 0, sizeof none);
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 ||
	    syscall(SYS_capset, &head, none) < 0)
		return -1;
	return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

int confine_enter(void)
{
	if (session.as_root && confine_drop_groups() < 0)
		return -1;
	if (setns(session.init_pidfd, session.join) < 0)
		return -1;
	/* The kernel keeps the capabilities this change would drop elsewhere: the user namespace
	 * joined does not map the uid the child came with. They are given up just after. */
	if (setresgid(CONFINE_UID, CONFINE_UID, CONFINE_UID) < 0 ||
	    setresuid(CONFINE_UID, CONFINE_UID, CONFINE_UID) < 0)
		return -1;
	return confine_drop_capabilities();
}

void confine_stop(void)
{
	if (session.watch) {
		event_free(session.watch);
		session.watch = NULL;
	}
	network_stop();
	/* The lifeline's end stops the init, and the kill covers an init a command stopped or
	 * traced; either way the kernel then kills every process of the session. */
	close_fd(&session.lifeline);
	if (session.init_pidfd >= 0)
		syscall(SYS_pidfd_send_signal, session.init_pidfd, SIGKILL, NULL, 0);
	if (session.bwrap > 0)
		util_reap(session.bwrap, NULL);
	session.bwrap = -1;
	stop_fuse_daemon();
	close_fd(&session.init_pidfd);
	close_fd(&session.home_fd);
	session.active = 0;
}
