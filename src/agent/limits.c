/* limits.c — see limits.h. */
#include "limits.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A line of /proc/self/mounts or /proc/self/cgroup: a path and a few words, far below this. */
#define LINE_MAX_LEN 4096
/* The kernel's CFS period the quota is a share of: its default, 100 ms. */
#define CPU_PERIOD_US 100000
/* How long the removal of a group waits for the last killed command to leave it. */
#define STOP_WAIT_MS 1000

enum controller { C_MEMORY, C_PIDS, C_CPU, N_CONTROLLERS };
static const char *const controller_names[N_CONTROLLERS] = { "memory", "pids", "cpu" };

/* One group of the session's: a directory in one hierarchy, and its cgroup.procs. */
struct group {
	char path[PATH_MAX];
	int v2;
	int procs;  /* -1 when none */
};

static struct {
	struct group groups[N_CONTROLLERS];  /* at most one per controller */
	int n_groups;
	int of[N_CONTROLLERS];               /* the group each controller is bounded in, or -1 */
	int oom_fd;                          /* memory.oom_control (v1) or memory.events (v2) */
	uint64_t memory;
} state = { .n_groups = 0, .of = { -1, -1, -1 }, .oom_fd = -1, .memory = 0 };

/* Where a controller can be bounded: the directory the session's group goes under, and
 * whether it is cgroup v2. 0, or -1 when nowhere. */
struct location {
	char parent[PATH_MAX];
	int v2;
};

/* Whether word is one of the comma- or space-separated words of list. */
static int has_word(const char *list, const char *word, const char *separators)
{
	size_t n = strlen(word);
	for (const char *p = list; *p;) {
		size_t len = strcspn(p, separators);
		if (len == n && strncmp(p, word, n) == 0)
			return 1;
		p += len;
		p += strspn(p, separators);
	}
	return 0;
}

/* The agent's own group in the hierarchy of controller (v1), or in cgroup v2 (controller
 * NULL), from /proc/self/cgroup, into out. 0, or -1 when it has none there. */
static int own_group(const char *controller, char *out, size_t outsz)
{
	FILE *f = fopen("/proc/self/cgroup", "re");
	if (f == NULL)
		return -1;
	char line[LINE_MAX_LEN];
	int found = -1;
	while (found < 0 && fgets(line, sizeof line, f)) {
		line[strcspn(line, "\n")] = '\0';
		char *c1 = strchr(line, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (c2 == NULL)
			continue;
		*c2 = '\0';
		int match = controller ? has_word(c1 + 1, controller, ",")
				       : strcmp(line, "0") == 0 && c1[1] == '\0';
		if (match && (size_t)snprintf(out, outsz, "%s", c2 + 1) < outsz)
			found = 0;
	}
	fclose(f);
	return found;
}

/* The mount point of the hierarchy of controller (v1), or of cgroup v2 (controller NULL). */
static int mount_point(const char *controller, char *out, size_t outsz)
{
	FILE *f = fopen("/proc/self/mounts", "re");
	if (f == NULL)
		return -1;
	char line[LINE_MAX_LEN];
	int found = -1;
	while (found < 0 && fgets(line, sizeof line, f)) {
		char *fields[4];
		char *save = NULL, *p = line;
		int n = 0;
		while (n < 4 && (fields[n] = strtok_r(p, " \n", &save)) != NULL)
			n++, p = NULL;
		if (n < 4)
			continue;
		int match = controller ? strcmp(fields[2], "cgroup") == 0 &&
						 has_word(fields[3], controller, ",")
				       : strcmp(fields[2], "cgroup2") == 0;
		/* A mount point with a space is written escaped; such a machine is left alone. */
		if (match && strchr(fields[1], '\\') == NULL &&
		    (size_t)snprintf(out, outsz, "%s", fields[1]) < outsz)
			found = 0;
	}
	fclose(f);
	return found;
}

/* The first line of a small file, into out; -1 when unreadable. */
static int read_small(const char *path, char *out, size_t outsz)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, out, outsz - 1);
	close(fd);
	if (n < 0)
		return -1;
	out[n] = '\0';
	return 0;
}

static int locate(enum controller c, struct location *loc)
{
	const char *name = controller_names[c];
	char mnt[PATH_MAX], own[PATH_MAX], path[PATH_MAX * 2 + 32], list[512];
	/* v2 first, but only where the agent's own group hands the controller to children. */
	if (mount_point(NULL, mnt, sizeof mnt) == 0 && own_group(NULL, own, sizeof own) == 0) {
		snprintf(path, sizeof path, "%s%s/cgroup.subtree_control", mnt, own);
		if (read_small(path, list, sizeof list) == 0 && has_word(list, name, " \n") &&
		    (size_t)snprintf(loc->parent, sizeof loc->parent, "%s%s", mnt, own) <
			    sizeof loc->parent) {
			loc->v2 = 1;
			return 0;
		}
	}
	if (mount_point(name, mnt, sizeof mnt) == 0 && own_group(name, own, sizeof own) == 0 &&
	    (size_t)snprintf(loc->parent, sizeof loc->parent, "%s%s", mnt, own) <
		    sizeof loc->parent) {
		loc->v2 = 0;
		return access(loc->parent, W_OK) == 0 ? 0 : -1;
	}
	return -1;
}

/* Writes text into the file name of group dir; 0 or -1 (errno set). */
static int put(const char *dir, const char *name, const char *text)
{
	char path[PATH_MAX + 64];
	if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
		errno = ENAMETOOLONG;
		return -1;
	}
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len = strlen(text);
	ssize_t w = write(fd, text, len);
	int e = errno;
	close(fd);
	if (w != (ssize_t)len) {
		errno = w < 0 ? e : EIO;
		return -1;
	}
	return 0;
}

/* Groups of agents that are gone (killed before they could remove them) are removed when a
 * new agent starts beside them; a live agent's is left alone, as is any group still in use. */
static void sweep_stale(const char *parent)
{
	DIR *d = opendir(parent);
	if (d == NULL)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char *end;
		if (strncmp(e->d_name, "sandkit-", 8) != 0)
			continue;
		long pid = strtol(e->d_name + 8, &end, 10);
		if (*end != '\0' || pid <= 0 || pid > INT_MAX || pid == (long)getpid())
			continue;
		if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		char path[PATH_MAX + 300];
		snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
		rmdir(path);
	}
	closedir(d);
}

/* The group for a location: an existing one of the same hierarchy, or a new one. */
static int group_for(const struct location *loc, char *why, size_t whysz)
{
	char path[PATH_MAX];
	if ((size_t)snprintf(path, sizeof path, "%s/sandkit-%d", loc->parent, (int)getpid()) >=
	    sizeof path) {
		snprintf(why, whysz, "cannot make a control group: the path is too long");
		return -1;
	}
	for (int i = 0; i < state.n_groups; i++)
		if (strcmp(state.groups[i].path, path) == 0)
			return i;
	sweep_stale(loc->parent);
	/* A group left by an agent that had this pid before is taken over. */
	if (mkdir(path, 0755) < 0 && errno != EEXIST) {
		snprintf(why, whysz, "cannot make the control group %s: %s", path, strerror(errno));
		return -1;
	}
	struct group *g = &state.groups[state.n_groups];
	snprintf(g->path, sizeof g->path, "%s", path);
	g->v2 = loc->v2;
	g->procs = -1;
	return state.n_groups++;
}

/* Writes the bound of controller c into group g; 0 or -1 with why. */
static int bound(enum controller c, const struct group *g, const struct limits_request *r,
		 char *why, size_t whysz)
{
	char text[64];
	int rc = 0;
	const char *file = "";
	if (c == C_MEMORY) {
		snprintf(text, sizeof text, "%" PRIu64, r->memory);
		file = g->v2 ? "memory.max" : "memory.limit_in_bytes";
		rc = put(g->path, file, text);
		/* Swap would let the bound be passed rather than enforced; a machine without
		 * swap accounting has no such file, and then nothing to pass it with either. */
		if (rc == 0 && g->v2)
			put(g->path, "memory.swap.max", "0");
		else if (rc == 0)
			put(g->path, "memory.memsw.limit_in_bytes", text);
	} else if (c == C_PIDS) {
		snprintf(text, sizeof text, "%" PRIu64, r->pids);
		file = "pids.max";
		rc = put(g->path, file, text);
	} else {
		uint64_t quota = r->cpu_centi * CPU_PERIOD_US / 100;
		if (g->v2) {
			snprintf(text, sizeof text, "%" PRIu64 " %d", quota, CPU_PERIOD_US);
			file = "cpu.max";
			rc = put(g->path, file, text);
		} else {
			snprintf(text, sizeof text, "%d", CPU_PERIOD_US);
			file = "cpu.cfs_period_us";
			rc = put(g->path, file, text);
			snprintf(text, sizeof text, "%" PRIu64, quota);
			if (rc == 0)
				file = "cpu.cfs_quota_us", rc = put(g->path, file, text);
		}
	}
	if (rc < 0)
		snprintf(why, whysz, "cannot bound %s: writing %s/%s failed: %s", controller_names[c],
			 g->path, file, strerror(errno));
	return rc;
}

static void remove_groups(void)
{
	if (state.oom_fd >= 0)
		close(state.oom_fd);
	state.oom_fd = -1;
	struct timespec pause = { 0, 10 * 1000000L };
	for (int i = 0; i < state.n_groups; i++) {
		struct group *g = &state.groups[i];
		if (g->procs >= 0)
			close(g->procs);
		g->procs = -1;
		/* A killed command leaves its group a moment after the signal. */
		for (int tries = 0; rmdir(g->path) < 0 && errno == EBUSY &&
				    tries < STOP_WAIT_MS / 10; tries++)
			nanosleep(&pause, NULL);
	}
	state.n_groups = 0;
	for (int c = 0; c < N_CONTROLLERS; c++)
		state.of[c] = -1;
}

int limits_start(const struct limits_request *r, char *why, size_t whysz)
{
	const uint64_t asked[N_CONTROLLERS] = { r->memory, r->pids, r->cpu_centi };
	for (int c = 0; c < N_CONTROLLERS; c++) {
		if (asked[c] == 0)
			continue;
		struct location loc;
		if (locate((enum controller)c, &loc) < 0) {
			snprintf(why, whysz, "cannot bound %s here: no cgroup v2 group of the agent's "
				 "delegates the %s controller, and no cgroup v1 %s hierarchy is "
				 "writable (as root)", controller_names[c], controller_names[c],
				 controller_names[c]);
			remove_groups();
			return -1;
		}
		int g = group_for(&loc, why, whysz);
		if (g < 0 || bound((enum controller)c, &state.groups[g], r, why, whysz) < 0) {
			remove_groups();
			return -1;
		}
		state.of[c] = g;
	}
	for (int i = 0; i < state.n_groups; i++) {
		char path[PATH_MAX + 16];
		snprintf(path, sizeof path, "%s/cgroup.procs", state.groups[i].path);
		state.groups[i].procs = open(path, O_WRONLY | O_CLOEXEC);
		if (state.groups[i].procs < 0) {
			snprintf(why, whysz, "cannot open %s: %s", path, strerror(errno));
			remove_groups();
			return -1;
		}
	}
	if (state.of[C_MEMORY] >= 0) {
		const struct group *g = &state.groups[state.of[C_MEMORY]];
		char path[PATH_MAX + 32];
		snprintf(path, sizeof path, "%s/%s", g->path,
			 g->v2 ? "memory.events" : "memory.oom_control");
		state.oom_fd = open(path, O_RDONLY | O_CLOEXEC);
		if (state.oom_fd < 0) {
			snprintf(why, whysz, "cannot read %s (a kernel without the memory "
				 "controller's kill count cannot say a command was killed for "
				 "memory): %s", path, strerror(errno));
			remove_groups();
			return -1;
		}
		state.memory = r->memory;
	}
	return 0;
}

int limits_join(void)
{
	for (int i = 0; i < state.n_groups; i++)
		if (write(state.groups[i].procs, "0", 1) != 1)
			return -1;
	return 0;
}

uint64_t limits_oom_kills(void)
{
	if (state.oom_fd < 0)
		return 0;
	char text[1024];
	ssize_t n = pread(state.oom_fd, text, sizeof text - 1, 0);
	if (n <= 0)
		return 0;
	text[n] = '\0';
	const char *at = strstr(text, "oom_kill ");
	return at ? strtoull(at + 9, NULL, 10) : 0;
}

uint64_t limits_memory(void)
{
	return state.memory;
}

void limits_stop(void)
{
	if (state.n_groups == 0)
		return;
	/* The agent may be touching files as the sandbox user (confine_settle); the groups are
	 * root's to remove. */
	setfsuid(geteuid());
	setfsgid(getegid());
	remove_groups();
}

const char *limits_probe(void)
{
	static char words[64];
	words[0] = '\0';
	for (int c = 0; c < N_CONTROLLERS; c++) {
		struct location loc;
		char path[PATH_MAX + 64];
		if (locate((enum controller)c, &loc) < 0 ||
		    (size_t)snprintf(path, sizeof path, "%s/sandkit-probe-%d", loc.parent,
				     (int)getpid()) >= sizeof path)
			continue;
		if (mkdir(path, 0755) < 0)
			continue;
		rmdir(path);
		if (words[0])
			strcat(words, " ");
		strcat(words, controller_names[c]);
	}
	/* A disk is a loop device's filesystem (confine.c), which only root may attach. */
	if (geteuid() == 0 && access("/dev/loop-control", R_OK | W_OK) == 0)
		strcat(words, words[0] ? " disk" : "disk");
	return words;
}
