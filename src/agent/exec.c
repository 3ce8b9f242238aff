/* exec.c — see exec.h. */
#include "exec.h"

#include "agent.h"
#include "common/base64.h"
#include "confine.h"
#include "contain.h"
#include "limits.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>

/*
 * After the leader exits and its group is killed, the pipes normally reach EOF at once. Only a
 * descendant that left the group (setsid) can hold them open; past this grace the agent takes
 * what is already in the pipes and ends the command instead of waiting for the escapee.
 */
#define EXIT_PIPE_GRACE_MS 2000
/* Longest timeout honoured, in seconds (about 100 years): keeps the timeval far from overflow. */
#define TIMEOUT_MAX_S 3153600000ULL

struct pipe_in {
	struct command *c;
	int fd;              /* -1 once closed */
	struct event *ev;
	uint64_t kept;       /* bytes charged against the cap so far */
	int64_t left;        /* after the linger: bytes still to take before closing; -1 before */
};

struct command {
	struct command *prev, *next;
	pid_t pid;
	int pidfd;
	struct event *exit_ev, *deadline_ev, *linger_ev;
	struct pipe_in in[2];
	/* Input: what the command has not read yet, written as its pipe or terminal takes it. */
	int input_fd;        /* -1 when it takes none, or once closed */
	struct event *input_ev;
	struct evbuffer *input;
	int input_closing;   /* close once the buffer is written */
	int pty;             /* in[0] is the terminal's master; there is no stderr */
	uint64_t seq, cap, timeout_ms;
	uint64_t deadline_us;   /* util_now_us() when the timeout is up */
	size_t frame_cost;
	int truncated, paused, reaped, status;
	uint64_t oom_kills;  /* the memory bound's kill count when it started (limits.h) */
	int callbacks;       /* >0 while one of this command's handlers runs: no freeing then */
	const struct command_sink *sink;
	void *ctx;
};

/* Every command not yet reaped and freed, for shutdown. */
static struct command *live;

/* One read at a time in a single-threaded loop: one buffer of one frame's size serves all. */
static unsigned char readbuf[AGENT_FRAME_MAX];

void outcome_error(struct outcome *o, const char *code, const char *fmt, ...)
{
	memset(o, 0, sizeof *o);
	o->kind = OUTCOME_ERROR;
	o->error = code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o->message, sizeof o->message, fmt, ap);
	va_end(ap);
}

int frame_data(struct evbuffer *out, int stream, uint64_t seq, const unsigned char *data,
	       size_t len)
{
	char head[64];
	int n = snprintf(head, sizeof head, "{\"t\":\"%s\",\"seq\":%" PRIu64 ",\"data\":\"",
			 stream == STREAM_STDERR ? "stderr" : "stdout", seq);
	if (evbuffer_add(out, head, (size_t)n) < 0)
		return -1;
	size_t enc = SK_B64_ENCODED_LEN(len);
	if (enc > 0) {
		struct evbuffer_iovec v;
		if (evbuffer_reserve_space(out, (ev_ssize_t)enc, &v, 1) < 1)
			return -1;
		sk_b64_encode(data, len, v.iov_base);
		v.iov_len = enc;
		if (evbuffer_commit_space(out, &v, 1) < 0)
			return -1;
	}
	return evbuffer_add(out, "\"}", 2);
}

int frame_terminal(struct evbuffer *out, const struct outcome *o)
{
	if (o->kind == OUTCOME_EXIT) {
		char sig[32] = "";
		if (o->signal)
			snprintf(sig, sizeof sig, ",\"signal\":%d", o->signal);
		return evbuffer_add_printf(out, "{\"t\":\"exit\",\"code\":%d,\"truncated\":%s%s%s}",
					   o->code, o->truncated ? "true" : "false", sig,
					   o->oom ? ",\"oom\":true" : "") < 0 ? -1 : 0;
	}
	if (evbuffer_add_printf(out, "{\"t\":\"error\",\"code\":\"%s\",\"message\":", o->error) < 0 ||
	    util_json_string(out, o->message, strlen(o->message)) < 0)
		return -1;
	return evbuffer_add(out, "}", 1);
}

static void close_pipe(struct pipe_in *p)
{
	if (p->fd < 0)
		return;
	event_free(p->ev);
	p->ev = NULL;
	close(p->fd);
	p->fd = -1;
}

static void close_input(struct command *c)
{
	if (c->input_fd < 0)
		return;
	event_free(c->input_ev);
	c->input_ev = NULL;
	close(c->input_fd);
	c->input_fd = -1;
	evbuffer_drain(c->input, evbuffer_get_length(c->input));
}

static void kill_group(struct command *c)
{
	/* Only while the leader is unreaped: its zombie pins the group id, so the signal cannot
	 * reach a stranger that reused the number. */
	if (!c->reaped)
		kill(-c->pid, SIGKILL);
}

/* Kills the group and stops reading; the process is still reaped later. */
static void stop(struct command *c)
{
	kill_group(c);
	close_pipe(&c->in[0]);
	close_pipe(&c->in[1]);
	close_input(c);
	evtimer_del(c->deadline_ev);
	evtimer_del(c->linger_ev);
}

static void destroy(struct command *c)
{
	if (c->prev)
		c->prev->next = c->next;
	else
		live = c->next;
	if (c->next)
		c->next->prev = c->prev;
	close_pipe(&c->in[0]);
	close_pipe(&c->in[1]);
	close_input(c);
	evbuffer_free(c->input);
	if (c->exit_ev)
		event_free(c->exit_ev);
	if (c->pidfd >= 0)
		close(c->pidfd);
	event_free(c->deadline_ev);
	event_free(c->linger_ev);
	free(c);
}

/* Ends the command with an error: the group dies and the sink hears it once. */
static void fail_command(struct command *c, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void fail_command(struct command *c, const char *code, const char *fmt, ...)
{
	struct outcome o;
	outcome_error(&o, code, "%s", "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(o.message, sizeof o.message, fmt, ap);
	va_end(ap);
	o.truncated = c->truncated;
	const struct command_sink *sink = c->sink;
	c->sink = NULL;
	stop(c);
	if (sink) {
		c->callbacks++;
		sink->end(c->ctx, &o);
		c->callbacks--;
	}
}

/* Frees or finishes the command once nothing of it is running any more. */
static void settle(struct command *c)
{
	if (c->callbacks > 0)
		return;
	if (c->reaped)
		close_input(c); /* nobody is left to read it */
	if (c->sink && c->reaped && c->in[0].fd < 0 && c->in[1].fd < 0) {
		struct outcome o;
		memset(&o, 0, sizeof o);
		o.kind = OUTCOME_EXIT;
		o.truncated = c->truncated;
		if (WIFSIGNALED(c->status)) {
			o.signal = WTERMSIG(c->status);
			o.code = 128 + o.signal;
			/* The kernel's out-of-memory kill is a SIGKILL like any other: the bound's
			 * count growing while the command ran is what tells them apart. With
			 * commands running side by side it names each one killed then. */
			o.oom = o.signal == SIGKILL && limits_oom_kills() > c->oom_kills;
		} else {
			o.code = WEXITSTATUS(c->status);
		}
		const struct command_sink *sink = c->sink;
		c->sink = NULL;
		evtimer_del(c->linger_ev);
		c->callbacks++;
		sink->end(c->ctx, &o);
		c->callbacks--;
	}
	if (c->sink == NULL && c->reaped)
		destroy(c);
}

static void emit(struct command *c, int stream, const unsigned char *buf, size_t n)
{
	struct pipe_in *p = &c->in[stream];
	uint64_t seq = c->seq++; /* dropped output consumes its number too: a gap says so */
	size_t keep = 0;
	if (p->kept + c->frame_cost < c->cap) {
		uint64_t room = c->cap - p->kept - c->frame_cost;
		keep = n < room ? n : (size_t)room;
	}
	if (keep < n)
		c->truncated = 1;
	if (keep == 0 || c->sink == NULL)
		return;
	p->kept += keep + c->frame_cost;
	c->sink->frame(c->ctx, stream, seq, buf, keep);
}

static void on_readable(evutil_socket_t fd, short what, void *arg)
{
	(void)what;
	struct pipe_in *p = arg;
	struct command *c = p->c;
	size_t want = sizeof readbuf;
	if (p->left >= 0 && (uint64_t)p->left < want)
		want = (size_t)p->left;
	c->callbacks++;
	ssize_t n = read(fd, readbuf, want);
	if (n > 0) {
		emit(c, (int)(p - c->in), readbuf, (size_t)n);
		if (p->left >= 0 && (p->left -= n) == 0)
			close_pipe(p);
	} else if (n == 0 || (c->pty && errno == EIO)) {
		/* A terminal's master reads EIO, not 0, once no process holds the terminal open. */
		close_pipe(p);
	} else if (errno != EAGAIN && errno != EINTR) {
		fail_command(c, "outputReadFailed", "reading the command's output failed: %s",
			     strerror(errno));
	}
	c->callbacks--;
	settle(c);
}

static void on_exit_ready(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct command *c = arg;
	/* What the leader left behind in its group dies before the leader is reaped, while its
	 * zombie still pins the group id; otherwise a background child could hold the pipes
	 * open forever. */
	kill(-c->pid, SIGKILL);
	int status = 0;
	pid_t r = waitpid(c->pid, &status, WNOHANG);
	if (r == 0) {
		event_add(c->exit_ev, NULL);
		return;
	}
	c->reaped = 1;
	c->status = status;
	event_free(c->exit_ev);
	c->exit_ev = NULL;
	close(c->pidfd);
	c->pidfd = -1;
	evtimer_del(c->deadline_ev);
	c->callbacks++;
	if (r < 0) {
		fail_command(c, "waitFailed", "waiting for the command failed: %s", strerror(errno));
	} else if (c->sink && (c->in[0].fd >= 0 || c->in[1].fd >= 0)) {
		struct timeval tv = { EXIT_PIPE_GRACE_MS / 1000, (EXIT_PIPE_GRACE_MS % 1000) * 1000 };
		evtimer_add(c->linger_ev, &tv);
	}
	c->callbacks--;
	settle(c);
}

static void on_deadline(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct command *c = arg;
	/* libevent's clock is the coarse one (a tick, 4 ms here, behind): its timer can fire that
	 * much early, and a command gets at least the timeout it asked for. */
	uint64_t now = util_now_us();
	if (now < c->deadline_us) {
		uint64_t left = c->deadline_us - now;
		struct timeval tv = { (time_t)(left / 1000000), (suseconds_t)(left % 1000000) };
		evtimer_add(c->deadline_ev, &tv);
		return;
	}
	c->callbacks++;
	fail_command(c, "timeoutExceeded", "the command exceeded its %" PRIu64 "ms timeout",
		     c->timeout_ms);
	c->callbacks--;
	settle(c);
}

static void on_linger(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct command *c = arg;
	for (int i = 0; i < 2; i++) {
		struct pipe_in *p = &c->in[i];
		int avail = 0;
		if (p->fd < 0)
			continue;
		if (ioctl(p->fd, FIONREAD, &avail) < 0 || avail <= 0)
			close_pipe(p);
		else
			p->left = avail;
	}
	settle(c);
}

enum spawn_stage { STAGE_SETUP, STAGE_CWD, STAGE_EXEC };
struct spawn_report {
	int stage;
	int err;
};

static void child_fail(int report, int stage) __attribute__((noreturn));
static void child_fail(int report, int stage)
{
	struct spawn_report rep = { stage, errno };
	ssize_t w = write(report, &rep, sizeof rep);
	(void)w; /* nothing else can be told: the parent sees EOF and reports an exit of 127 */
	_exit(127);
}

/*
 * The signals whose disposition is the agent's own at the moment of a spawn: caught or
 * ignored, as the kernel reports them in /proc/self/status (SigCgt, SigIgn), one bit per
 * signal, signal s at bit s - 1. The child resets these, five or so, rather than every one of
 * the 64: a reset is a system call, and the 64 took 85-90 us of CPU on a two-core virtual
 * machine, more than anything else the child does before its exec, while the agent waits for
 * it; the read costs 4 us. Read at every spawn, not remembered, so a disposition set anywhere
 * (by libevent for a signal event, or inherited) is never missed. When the file cannot be read
 * or does not say, every signal is reset, as if all were the agent's.
 */
#define ALL_SIGNALS UINT64_MAX
/* /proc/self/status is about 1.5 KB; the two lines sit in its first half. */
#define STATUS_READ_MAX 4096

static uint64_t status_mask(const char *text, const char *field)
{
	const char *at = strstr(text, field);
	if (at == NULL)
		return ALL_SIGNALS;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(at + strlen(field), &end, 16);
	return errno != 0 || end == at + strlen(field) || *end != '\n' ? ALL_SIGNALS : (uint64_t)v;
}

static uint64_t own_dispositions(void)
{
	/* Opened once: pread at 0 has the kernel write the file anew, so one call a spawn. */
	static int status_fd = -2;
	if (status_fd == -2)
		status_fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	char text[STATUS_READ_MAX];
	ssize_t n = status_fd < 0 ? -1 : pread(status_fd, text, sizeof text - 1, 0);
	if (n <= 0)
		return ALL_SIGNALS;
	text[n] = '\0';
	return status_mask(text, "\nSigIgn:\t") | status_mask(text, "\nSigCgt:\t");
}

/* What the child needs, in the agent's memory, which the child shares until it execs. */
struct child_args {
	const struct command_spec *spec;
	char *const *envp;  /* the whole environment (struct environment) */
	int cwd_fd;
	int in, out, err, report; /* in: -1 for /dev/null; a terminal is in, out and err at once */
	int pty;
	pid_t parent;       /* the agent's pid as the child sees it */
	uint64_t dispositions; /* own_dispositions() */
};

/*
 * The child runs in the agent's own memory, on a stack of its own, while the agent is
 * suspended until it execs or exits (CLONE_VM | CLONE_VFORK, as posix_spawn does). Nothing is
 * copied, so a command starts in the time of an exec: no page-table copy, no copy-on-write
 * faults, no tear-down of a copy at exec, no wake-up of another CPU for the child. Of the
 * agent's memory the child writes only its stack, `environ` (restored after) and errno.
 * The stack holds the child's frames and execvp's, which for a script (ENOEXEC) builds a
 * new argument vector on it: room for that comes on top, by the command's argument count.
 */
#define CHILD_STACK (64 * 1024)

/* In the child: becomes the command. Only async-signal-safe-enough calls: the agent is
 * single-threaded, so no lock can be held by a thread that does not exist here. */
static int child(void *arg)
{
	const struct child_args *a = arg;
	const struct command_spec *spec = a->spec;
	int report = a->report;
	/* Leads its own group so the agent can kill everything it starts at once; on a terminal,
	 * a session of its own too, whose controlling terminal it becomes (below), so that ^C and
	 * job control act on what runs in it. */
	if (a->pty ? setsid() < 0 : setpgid(0, 0) < 0)
		child_fail(report, STAGE_SETUP);
	/* Dies with the agent rather than run on unsupervised (what it forks is covered by the
	 * namespace, contain.h); the check closes the race with an agent that died before the
	 * request took effect. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != a->parent)
		child_fail(report, STAGE_SETUP);
	/* The agent ignores SIGPIPE; a command must get the defaults it would get from a shell.
	 * Every signal arrives blocked and stays so until no disposition is the agent's: a
	 * handler of the agent's must never run here, in its memory. The others already are
	 * the defaults. */
	for (int s = 1; s < NSIG && s <= 64; s++) /* the mask's 64 bits: all Linux has */
		if (a->dispositions & ((uint64_t)1 << (s - 1)))
			signal(s, SIG_DFL);
	/* The descriptor limit the agent was started with, not the one it raised for itself. */
	struct rlimit nofile;
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && agent.cfg.nofile_soft < nofile.rlim_cur) {
		nofile.rlim_cur = (rlim_t)agent.cfg.nofile_soft;
		setrlimit(RLIMIT_NOFILE, &nofile);
	}
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	int in = a->in >= 0 ? a->in : open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (in < 0 || dup2(in, 0) < 0 || dup2(a->out, 1) < 0 || dup2(a->err, 2) < 0)
		child_fail(report, STAGE_SETUP);
	if (a->pty && ioctl(0, TIOCSCTTY, 0) < 0)
		child_fail(report, STAGE_SETUP);
	/* Into the session's control groups while still the agent's uid, which may move itself. */
	if (limits_join() < 0)
		child_fail(report, STAGE_SETUP);
	/* Into the session before the working directory, which is a directory of the session's
	 * mounts; the change of credentials clears the death signal, so it is asked for again. */
	if (confine_active() && (confine_enter() < 0 || prctl(PR_SET_PDEATHSIG, SIGKILL) < 0))
		child_fail(report, STAGE_SETUP);
	if (fchdir(a->cwd_fd) < 0)
		child_fail(report, STAGE_CWD);
	/* After the fchdir: a new mount namespace carries the working directory over into its own
	 * copy of the mounts, where a descriptor from the agent's would be unreachable. */
	if (contain_active() && contain_enter_mounts() < 0)
		child_fail(report, STAGE_SETUP);
	/* Whatever the agent inherited or holds (sockets, the root, other commands' pipes) must
	 * not reach the command; the report pipe still closes only at exec. */
	close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
	/* execvp searches the PATH of environ, in the session's own /usr once confined: make it
	 * the command's own. */
	environ = (char **)a->envp;
	execvp(spec->argv[0], spec->argv);
	child_fail(report, STAGE_EXEC);
}

static void spawn_failure(struct outcome *o, const struct command_spec *spec, int stage, int err)
{
	char prog[128];
	util_printable(spec->argv[0], strlen(spec->argv[0]), prog, sizeof prog);
	if (stage == STAGE_CWD)
		outcome_error(o, "spawnFailed", "cannot enter the working directory: %s", strerror(err));
	else if (stage == STAGE_EXEC)
		outcome_error(o, "spawnFailed", "cannot run '%s': %s", prog, strerror(err));
	else
		outcome_error(o, "spawnFailed", "cannot prepare '%s': %s", prog, strerror(err));
}

/* The variables a command starts from besides PATH (request.h), before the request's own
 * (which win), and their number: docs/agent.md "Execution". */
#define BASE_VARS 6
/* What a terminal command is told it talks to: what xterm.js and every common terminal
 * emulate. */
#define EXEC_TERM "xterm-256color"

/* A command's whole environment: the base variables the request does not set, then the
 * request's (PATH among them, request.h). The vector and the base strings are the agent's to
 * free; the rest is borrowed. */
struct environment {
	char **v;
	char *owned[BASE_VARS];
	size_t nowned;
};

static void environment_free(struct environment *e)
{
	while (e->nowned > 0)
		free(e->owned[--e->nowned]);
	free(e->v);
	e->v = NULL;
}

static int sets(char *const *envp, const char *name)
{
	size_t n = strlen(name);
	for (char *const *p = envp; *p; p++)
		if (strncmp(*p, name, n) == 0 && (*p)[n] == '=')
			return 1;
	return 0;
}

/* The agent's own user name, for an unconfined command's $USER; NULL when it has none. Looked
 * up once: the user of a running process does not change. */
static const char *agent_user(void)
{
	static int looked;
	static char name[64];
	if (!looked) {
		looked = 1;
		struct passwd *pw = getpwuid(geteuid());
		if (pw && strlen(pw->pw_name) < sizeof name)
			strcpy(name, pw->pw_name);
	}
	return name[0] ? name : NULL;
}

/* 0, or -1 when memory ran out. */
static int environment_build(struct environment *e, char *const *request, int cwd_fd, int pty)
{
	memset(e, 0, sizeof *e);
	char pwd[PATH_MAX], link[64];
	snprintf(link, sizeof link, "/proc/self/fd/%d", cwd_fd);
	ssize_t n = readlink(link, pwd, sizeof pwd - 1);
	pwd[n > 0 ? n : 0] = '\0';
	int confined = confine_active();
	const char *user = confined ? CONFINE_USER : agent_user();
	const char *base[BASE_VARS][2] = {
		/* Unconfined, the session's files are the home: what tools keep there stays in it. */
		{ "HOME", confined ? CONFINE_HOME : agent.cfg.root_path },
		{ "USER", user }, { "LOGNAME", user },
		{ "LANG", "C.UTF-8" },
		{ "PWD", pwd[0] ? pwd : NULL },
		{ "TERM", pty ? EXEC_TERM : NULL },
	};
	size_t count = 0;
	while (request[count])
		count++;
	e->v = malloc((count + BASE_VARS + 1) * sizeof *e->v);
	if (e->v == NULL)
		return -1;
	size_t k = 0;
	for (size_t i = 0; i < BASE_VARS; i++) {
		if (base[i][1] == NULL || sets(request, base[i][0]))
			continue;
		size_t len = strlen(base[i][0]) + strlen(base[i][1]) + 2;
		char *kv = malloc(len);
		if (kv == NULL) {
			environment_free(e);
			return -1;
		}
		snprintf(kv, len, "%s=%s", base[i][0], base[i][1]);
		e->owned[e->nowned++] = kv;
		e->v[k++] = kv;
	}
	for (size_t i = 0; i <= count; i++)
		e->v[k + i] = request[i];
	return 0;
}

static void on_writable(evutil_socket_t fd, short what, void *arg);

static int setup_events(struct command *c, const struct command_spec *spec)
{
	struct event_base *base = agent.base;
	c->exit_ev = event_new(base, c->pidfd, EV_READ, on_exit_ready, c);
	c->deadline_ev = evtimer_new(base, on_deadline, c);
	c->linger_ev = evtimer_new(base, on_linger, c);
	for (int i = 0; i < 2; i++) {
		c->in[i].c = c;
		c->in[i].left = -1;
		if (c->in[i].fd < 0)
			continue;
		c->in[i].ev = event_new(base, c->in[i].fd, EV_READ | EV_PERSIST, on_readable, &c->in[i]);
		if (c->in[i].ev == NULL || event_add(c->in[i].ev, NULL) < 0)
			return -1;
	}
	if (c->input_fd >= 0 &&
	    (c->input_ev = event_new(base, c->input_fd, EV_WRITE, on_writable, c)) == NULL)
		return -1;
	if (!c->exit_ev || !c->deadline_ev || !c->linger_ev)
		return -1;
	uint64_t s = spec->timeout_ms / 1000;
	struct timeval tv = { (time_t)(s > TIMEOUT_MAX_S ? TIMEOUT_MAX_S : s),
			      (suseconds_t)(spec->timeout_ms % 1000) * 1000 };
	c->deadline_us = util_now_us() + (uint64_t)tv.tv_sec * 1000000 + (uint64_t)tv.tv_usec;
	if (event_add(c->exit_ev, NULL) < 0 || evtimer_add(c->deadline_ev, &tv) < 0)
		return -1;
	return 0;
}

/*
 * A terminal of cols x rows: its master (the agent's, non-blocking) and its other end (the
 * command's). In a confined session it is one of the session's own devpts, opened beneath
 * its root, so that inside it is a terminal of the session's /dev/pts; the other end is
 * opened from the master (TIOCGPTPEER), never by a path the session could have replaced.
 * 0, or -1 with errno.
 */
static int open_terminal(unsigned cols, unsigned rows, int *master, int *peer)
{
	int m = confine_active() ? openat(agent.cfg.root_fd, "dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC)
				 : open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (m < 0)
		return -1;
	int unlock = 0;
	struct winsize ws = { (unsigned short)rows, (unsigned short)cols, 0, 0 };
	int p = -1;
	if (ioctl(m, TIOCSPTLCK, &unlock) < 0 || ioctl(m, TIOCSWINSZ, &ws) < 0 ||
	    (p = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 ||
	    fcntl(m, F_SETFL, O_NONBLOCK) < 0) {
		int e = errno;
		if (p >= 0)
			close(p);
		close(m);
		errno = e;
		return -1;
	}
	*master = m;
	*peer = p;
	return 0;
}

/* The descriptors a command is started with: the agent's ends and the child's. */
struct plumbing {
	int out[2], err[2], in[2], report[2];
	int master;   /* a terminal's: the agent reads out[0] = master and writes a duplicate */
};

static void plumbing_close(struct plumbing *pl)
{
	int *all[] = { pl->out, pl->err, pl->in, pl->report };
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		for (int k = 0; k < 2; k++)
			if (all[i][k] >= 0) {
				close(all[i][k]);
				all[i][k] = -1;
			}
}

/* 0, or -1 with errno. */
static int plumbing_open(struct plumbing *pl, const struct command_spec *spec)
{
	if (pipe2(pl->report, O_CLOEXEC) < 0)
		return -1;
	if (spec->cols > 0) {
		if (open_terminal(spec->cols, spec->rows, &pl->out[0], &pl->out[1]) < 0)
			return -1;
		pl->master = pl->out[0];
		/* Input goes to the master too, through a descriptor of its own, which closing the
		 * input lets go of without ending the output. */
		pl->in[1] = fcntl(pl->master, F_DUPFD_CLOEXEC, 0);
		return pl->in[1] < 0 ? -1 : 0;
	}
	if (pipe2(pl->out, O_CLOEXEC) < 0 || pipe2(pl->err, O_CLOEXEC) < 0)
		return -1;
	if (spec->stdin_pipe && (pipe2(pl->in, O_CLOEXEC) < 0 ||
				 fcntl(pl->in[1], F_SETFL, O_NONBLOCK) < 0))
		return -1;
	/* Where the kernel refuses the size, the pipe keeps its own and input goes as before, in
	 * more and smaller moves. */
	if (spec->stdin_pipe)
		(void)fcntl(pl->in[1], F_SETPIPE_SZ, EXEC_INPUT_PIPE);
	return 0;
}

struct command *command_start(const struct command_spec *spec, const struct command_sink *sink,
			      void *ctx, struct outcome *failure)
{
	struct plumbing pl = { { -1, -1 }, { -1, -1 }, { -1, -1 }, { -1, -1 }, -1 };
	struct environment env = { 0 };
	struct command *c = calloc(1, sizeof *c);
	if (c == NULL || (c->input = evbuffer_new()) == NULL) {
		outcome_error(failure, "spawnFailed", "the agent is out of memory");
		free(c);
		return NULL;
	}
	c->pid = -1;
	c->pidfd = c->in[0].fd = c->in[1].fd = c->input_fd = -1;
	c->pty = spec->cols > 0;
	int cwd_fd = spec->cwd_fd >= 0 ? spec->cwd_fd
		     : confine_active() ? confine_default_cwd() : agent.cfg.root_fd;
	if (environment_build(&env, spec->envp, cwd_fd, c->pty) < 0) {
		outcome_error(failure, "spawnFailed", "the agent is out of memory");
		goto fail;
	}
	if (plumbing_open(&pl, spec) < 0) {
		spawn_failure(failure, spec, STAGE_SETUP, errno);
		goto fail;
	}
	size_t argc = 0;
	while (spec->argv[argc])
		argc++;
	/* A multiple of 16: the stack grows down from its end, which the ABI wants aligned. */
	size_t stack_size = (CHILD_STACK + (argc + 3) * sizeof(char *) + 15) & ~(size_t)15;
	unsigned char *stack = malloc(stack_size);
	if (stack == NULL) {
		outcome_error(failure, "spawnFailed", "the agent is out of memory");
		goto fail;
	}
	/* A confined child is in the session's PID namespace, where the agent has no pid. */
	int child_out = pl.out[1];
	struct child_args args = { spec, env.v, cwd_fd, c->pty ? child_out : pl.in[0], child_out,
				   c->pty ? child_out : pl.err[1], pl.report[1], c->pty,
				   confine_active() ? 0 : contain_parent_pid(), own_dispositions() };
	char **own_environ = environ;
	c->oom_kills = limits_oom_kills();
	sigset_t all, mask;
	sigfillset(&all);
	sigprocmask(SIG_SETMASK, &all, &mask);
	c->pid = clone(child, stack + stack_size, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
	int clone_errno = errno;
	sigprocmask(SIG_SETMASK, &mask, NULL);
	environ = own_environ;
	free(stack);
	errno = clone_errno;
	if (c->pid < 0) {
		spawn_failure(failure, spec, STAGE_SETUP, errno);
		goto fail;
	}
	/* The child made its own group (setpgid in child(), or a terminal's session by setsid)
	 * before this returns: CLONE_VFORK holds the agent until the child ran exec or failed, so
	 * the group exists before the agent could act on it, and a setpgid from this side would
	 * only fail (the child has exec'd). */
	int *child_ends[] = { &pl.out[1], &pl.err[1], &pl.in[0], &pl.report[1] };
	for (size_t i = 0; i < sizeof child_ends / sizeof child_ends[0]; i++)
		if (*child_ends[i] >= 0) {
			close(*child_ends[i]);
			*child_ends[i] = -1;
		}
	/* The child writes here only if it fails before exec; a successful exec closes it. The
	 * child has exec'd or exited by now (CLONE_VFORK), so this read does not wait. */
	struct spawn_report rep;
	ssize_t got;
	while ((got = read(pl.report[0], &rep, sizeof rep)) < 0 && errno == EINTR)
		;
	if (got == (ssize_t)sizeof rep) {
		util_reap(c->pid, NULL);
		c->pid = -1;
		spawn_failure(failure, spec, rep.stage, rep.err);
		goto fail;
	}
	c->pidfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
	c->in[0].fd = pl.out[0];
	c->in[1].fd = pl.err[0];
	c->input_fd = pl.in[1];
	pl.out[0] = pl.err[0] = pl.in[1] = -1;
	c->cap = spec->output_cap ? spec->output_cap : agent.cfg.output_cap;
	c->frame_cost = spec->frame_cost;
	c->timeout_ms = spec->timeout_ms;
	if (c->pidfd < 0 || fcntl(c->in[0].fd, F_SETFL, O_NONBLOCK) < 0 ||
	    (c->in[1].fd >= 0 && fcntl(c->in[1].fd, F_SETFL, O_NONBLOCK) < 0) ||
	    setup_events(c, spec) < 0) {
		outcome_error(failure, "spawnFailed", "the agent cannot watch the command: %s",
			      strerror(errno));
		kill(-c->pid, SIGKILL);
		util_reap(c->pid, NULL);
		goto fail;
	}
	plumbing_close(&pl);
	environment_free(&env);
	c->sink = sink;
	c->ctx = ctx;
	c->next = live;
	if (live)
		live->prev = c;
	live = c;
	log_debug("started pid %d", (int)c->pid);
	return c;

fail:
	plumbing_close(&pl);
	for (int i = 0; i < 2; i++) {
		if (c->in[i].ev)
			event_free(c->in[i].ev);
		if (c->in[i].fd >= 0)
			close(c->in[i].fd);
	}
	if (c->input_ev)
		event_free(c->input_ev);
	if (c->input_fd >= 0)
		close(c->input_fd);
	if (c->exit_ev)
		event_free(c->exit_ev);
	if (c->deadline_ev)
		event_free(c->deadline_ev);
	if (c->linger_ev)
		event_free(c->linger_ev);
	if (c->pidfd >= 0)
		close(c->pidfd);
	environment_free(&env);
	evbuffer_free(c->input);
	free(c);
	return NULL;
}

/* Tells the sink its input has room again or ended; the sink may append from inside. */
static void input_room(struct command *c)
{
	if (c->sink && c->sink->input_room) {
		c->callbacks++;
		c->sink->input_room(c->ctx);
		c->callbacks--;
	}
}

/* Writes what the pipe or terminal takes now; waits for it to take more; closes once asked
 * and all is written. */
static void flush_input(struct command *c)
{
	size_t before = evbuffer_get_length(c->input);
	while (c->input_fd >= 0 && evbuffer_get_length(c->input) > 0) {
		int n = evbuffer_write(c->input, c->input_fd);
		if (n > 0)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
			event_add(c->input_ev, NULL);
			break;
		}
		/* EPIPE: the command closed its input (or exited); what it did not read is
		 * dropped, as a shell's pipe drops it, and no more is taken. */
		close_input(c);
	}
	if (c->input_fd >= 0 && c->input_closing && evbuffer_get_length(c->input) == 0)
		close_input(c);
	if (c->input_fd < 0 || evbuffer_get_length(c->input) < before)
		input_room(c);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct command *c = arg;
	c->callbacks++;
	flush_input(c);
	c->callbacks--;
	settle(c);
}

size_t command_input_room(const struct command *c)
{
	size_t held = evbuffer_get_length(c->input);
	if (c->input_fd < 0 || c->input_closing || held >= EXEC_INPUT_MAX)
		return 0;
	return EXEC_INPUT_MAX - held;
}

int command_input_open(const struct command *c)
{
	return c->input_fd >= 0 && !c->input_closing;
}

int command_input_pipe(const struct command *c)
{
	return c->pty || !command_input_open(c) ? -1 : c->input_fd;
}

size_t command_input_held(const struct command *c)
{
	return evbuffer_get_length(c->input);
}

int command_input(struct command *c, const void *p, size_t n)
{
	if (c->input_fd < 0 || c->input_closing)
		return 0;
	if (evbuffer_add(c->input, p, n) < 0)
		return -1;
	/* Written from the loop, never from inside the caller: the sink hears of room only from
	 * an event of its own. */
	event_active(c->input_ev, EV_WRITE, 0);
	return 0;
}

void command_input_close(struct command *c)
{
	if (c->input_fd < 0 || c->input_closing)
		return;
	if (c->pty) {
		/* The terminal stays: its line discipline turns ^D into end of file for the reader. */
		char eof = EXEC_PTY_EOF;
		if (evbuffer_add(c->input, &eof, 1) == 0)
			event_active(c->input_ev, EV_WRITE, 0);
		return;
	}
	c->input_closing = 1;
	event_active(c->input_ev, EV_WRITE, 0);
}

int command_resize(struct command *c, unsigned cols, unsigned rows)
{
	if (!c->pty || c->in[0].fd < 0) {
		errno = ENOTTY;
		return -1;
	}
	struct winsize ws = { (unsigned short)rows, (unsigned short)cols, 0, 0 };
	return ioctl(c->in[0].fd, TIOCSWINSZ, &ws);
}

int command_signal(struct command *c, int sig)
{
	/* The leader's zombie pins the group id until it is reaped (kill_group). */
	if (c->reaped) {
		errno = ESRCH;
		return -1;
	}
	return kill(-c->pid, sig);
}

void command_pause(struct command *c)
{
	if (c->paused)
		return;
	c->paused = 1;
	for (int i = 0; i < 2; i++)
		if (c->in[i].fd >= 0)
			event_del(c->in[i].ev);
}

void command_resume(struct command *c)
{
	if (!c->paused)
		return;
	c->paused = 0;
	for (int i = 0; i < 2; i++)
		if (c->in[i].fd >= 0)
			event_add(c->in[i].ev, NULL);
}

void command_abandon(struct command *c)
{
	c->sink = NULL;
	stop(c);
	settle(c);
}

void command_shutdown(void)
{
	for (struct command *c = live; c; c = c->next)
		kill_group(c);
	for (struct command *c = live; c; c = c->next) {
		if (c->reaped)
			continue;
		util_reap(c->pid, NULL);
		c->reaped = 1;
	}
}

void command_free_all(void)
{
	while (live)
		destroy(live);
}
