/*
 * process.c — the little of POSIX the local provider needs and Lua lacks: starting a detached
 * agent process and learning when it is ready, signalling it, and private files and trees.
 *
 *   core.spawn(argv, { env = {K=V} | nil (inherit), stdout = path, stderr = path,
 *                      ready_fd = N | nil, setsid = bool })   -- pid, reader | nil, err
 *       With ready_fd, the child gets the write end of a pipe as descriptor N and the reader
 *       is the read end: a pollable (pollfd/events/timeout) with reader:read() returning
 *       bytes | false (nothing yet) | nil (closed) | nil, err, and reader:close(). No other
 *       descriptor of this process reaches the child past 2 (or past N).
 *   core.kill(pid, signal)      -- true | nil, err      (core.SIGTERM, core.SIGKILL)
 *   core.alive(pid)             -- true when a process with that pid exists
 *   core.reap(pid[, block])     -- collects the status of a child of ours that has ended;
 *                                  true once it is gone, false while it runs (never with block);
 *                                  when this call collected it, also its status (the exit
 *                                  code, or 128 + the signal that killed it)
 *   core.isatty(fd)             -- whether descriptor fd is a terminal
 *   core.mkdir(path, mode)      -- true | nil, err, errno_name
 *   core.write_private(path, s) -- creates path (must not exist) with mode 0600 and writes s;
 *                                  true | nil, err, errno_name
 *   core.create_new(path)       -- a file for bytes to land in (a download's partial file),
 *                                  made new with the mode io.open gives (0666 less the umask):
 *                                  a name already there, a symbolic link included, is refused
 *                                  rather than written through | nil, err, errno_name. Its
 *                                  methods: f:write(s) -> true | nil, err; f:close() -> true |
 *                                  nil, err; t:read_to_file(f) writes into it.
 *   core.listdir(path)          -- array of names | nil, err, errno_name
 *   core.is_directory(path)     -- whether path names a directory (links followed), looked at
 *                                  without opening it: a pipe named as a path (`<(tar c .)`)
 *                                  keeps every byte for whoever reads it
 *   core.read_regular(path, max) -- the first max + 1 bytes of a configuration or secret file
 *                                  (one past the bound tells a longer file from one at it),
 *                                  refusing anything but a regular file before opening it could
 *                                  block (src/common/regular_file.h) | nil, why, absent (true
 *                                  when nothing is at path)
 *   core.remove_tree(path)      -- removes path and everything under it, following no
 *                                  symlink, at any depth, whatever modes (and, as root,
 *                                  owners) its directories were left with; true | nil, err,
 *                                  errno_name (an absent path succeeds; the name says whether
 *                                  it may recur)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/regular_file.h"
#include "common/tree_remove.h"
#include "sandkit_core.h"

extern char **environ;

#define READER_MT "sandkit.fdreader"
#define NEW_FILE_MT "sandkit.newfile"
/* argv and env entries a spawn accepts: far more than an agent's command line needs. */
#define MAX_SPAWN_ARGS 256
/* Bytes one reader:read() returns at most; a ready line is well under 200. */
#define READ_CHUNK 4096

struct reader {
	int fd;
};

static int push_errno(lua_State *L, const char *what, int err)
{
	lua_pushnil(L);
	lua_pushfstring(L, "%s: %s", what, strerror(err));
	return 2;
}

/* The few errno names a caller decides on (whether a folder exists, whether a removal may
 * succeed when asked again, whether the user lacks permission); the message carries the rest. */
static const char *errno_name(int err)
{
	switch (err) {
	case EEXIST: return "EEXIST";
	case ENOENT: return "ENOENT";
	case EACCES: return "EACCES";
	case EPERM: return "EPERM";
	case EBUSY: return "EBUSY";
	case EROFS: return "EROFS";
	case EXDEV: return "EXDEV";
	case ENOTEMPTY: return "ENOTEMPTY";
	case ENOMEM: return "ENOMEM";
	case EMFILE: return "EMFILE";
	case ENFILE: return "ENFILE";
	case EINTR: return "EINTR";
	case EIO: return "EIO";
	default: return "other";
	}
}

/* Also the errno's name (errno_name) as a third value. */
static int push_errno_named(lua_State *L, const char *what, int err)
{
	push_errno(L, what, err);
	lua_pushstring(L, errno_name(err));
	return 3;
}

/* Collects the strings of a Lua array (argv) or map (env, as K=V) into a NULL-terminated
 * vector; the strings are anchored in a table left on the stack. */
static char **string_vector(lua_State *L, int idx, int as_env, char **vec)
{
	int n = 0;
	lua_newtable(L);
	int anchor = lua_gettop(L);
	if (as_env) {
		lua_pushnil(L);
		while (lua_next(L, idx) != 0) {
			if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
				luaL_error(L, "spawn env must map strings to strings");
			if (n >= MAX_SPAWN_ARGS)
				luaL_error(L, "spawn env has too many entries");
			lua_pushfstring(L, "%s=%s", lua_tostring(L, -2), lua_tostring(L, -1));
			vec[n++] = (char *)lua_tostring(L, -1);
			lua_rawseti(L, anchor, n);
			lua_pop(L, 1);
		}
	} else {
		int len = (int)skc_rawlen(L, idx);
		if (len < 1 || len >= MAX_SPAWN_ARGS)
			luaL_error(L, "spawn argv must have 1 to %d entries", MAX_SPAWN_ARGS - 1);
		for (int i = 1; i <= len; i++) {
			lua_rawgeti(L, idx, i);
			if (lua_type(L, -1) != LUA_TSTRING)
				luaL_error(L, "spawn argv entries must be strings");
			vec[n++] = (char *)lua_tostring(L, -1);
			lua_rawseti(L, anchor, n);
		}
	}
	vec[n] = NULL;
	return vec;
}

static int core_spawn(lua_State *L)
{
	luaL_checktype(L, 1, LUA_TTABLE);
	int has_opts = !lua_isnoneornil(L, 2);
	if (has_opts)
		luaL_checktype(L, 2, LUA_TTABLE);
	char *argv[MAX_SPAWN_ARGS + 1], *envv[MAX_SPAWN_ARGS + 1];
	string_vector(L, 1, 0, argv);
	char **env = environ;
	const char *out_path = NULL, *err_path = NULL;
	int ready_fd = -1, setsid_flag = 0;
	if (has_opts) {
		lua_getfield(L, 2, "env");
		if (!lua_isnil(L, -1)) {
			luaL_checktype(L, -1, LUA_TTABLE);
			env = string_vector(L, lua_gettop(L), 1, envv);
		}
		lua_getfield(L, 2, "stdout");
		out_path = lua_tostring(L, -1);
		lua_getfield(L, 2, "stderr");
		err_path = lua_tostring(L, -1);
		lua_getfield(L, 2, "ready_fd");
		if (!lua_isnil(L, -1)) {
			ready_fd = (int)skc_checkinteger(L, -1);
			luaL_argcheck(L, ready_fd >= 3 && ready_fd < 64, 2, "ready_fd must be 3..63");
		}
		lua_getfield(L, 2, "setsid");
		setsid_flag = lua_toboolean(L, -1);
	}

	int pipefd[2] = { -1, -1 };
	if (ready_fd >= 0) {
		if (pipe2(pipefd, O_CLOEXEC) < 0)
			return push_errno(L, "pipe", errno);
		/* Kept above 63 so the dup2 onto ready_fd is never a same-descriptor no-op that
		 * would leave close-on-exec set. */
		int high = fcntl(pipefd[1], F_DUPFD_CLOEXEC, 64);
		if (high < 0) {
			int e = errno;
			close(pipefd[0]);
			close(pipefd[1]);
			return push_errno(L, "fcntl", e);
		}
		close(pipefd[1]);
		pipefd[1] = high;
	}

	posix_spawn_file_actions_t fa;
	posix_spawnattr_t attr;
	posix_spawn_file_actions_init(&fa);
	posix_spawnattr_init(&attr);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	posix_spawn_file_actions_addopen(&fa, 1, out_path ? out_path : "/dev/null",
	                                 O_WRONLY | O_CREAT | O_APPEND, 0600);
	posix_spawn_file_actions_addopen(&fa, 2, err_path ? err_path : "/dev/null",
	                                 O_WRONLY | O_CREAT | O_APPEND, 0600);
	if (ready_fd >= 0)
		posix_spawn_file_actions_adddup2(&fa, pipefd[1], ready_fd);
	/* Whatever the host program left open without close-on-exec (a socket of nginx's, a pipe of
	 * make's) is none of the child's: mmdebstrap, for one, fails when its descriptor 12 is
	 * taken by something it did not open. */
	posix_spawn_file_actions_addclosefrom_np(&fa, ready_fd >= 0 ? ready_fd + 1 : 3);
	short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
	/* A new session: the agent outlives this process and no terminal signal reaches it. */
	if (setsid_flag)
		flags |= POSIX_SPAWN_SETSID;
	sigset_t none, all;
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &all);
	posix_spawnattr_setflags(&attr, flags);

	pid_t pid;
	int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&attr);
	if (ready_fd >= 0)
		close(pipefd[1]);
	if (rc != 0) {
		if (ready_fd >= 0)
			close(pipefd[0]);
		return push_errno(L, argv[0], rc);
	}
	lua_pushinteger(L, (lua_Integer)pid);
	if (ready_fd < 0)
		return 1;
	fcntl(pipefd[0], F_SETFL, fcntl(pipefd[0], F_GETFL) | O_NONBLOCK);
	struct reader *r = skc_newuserdata(L, sizeof *r);
	r->fd = pipefd[0];
	luaL_setmetatable(L, READER_MT);
	return 2;
}

static struct reader *check_reader(lua_State *L)
{
	struct reader *r = luaL_checkudata(L, 1, READER_MT);
	if (r->fd < 0)
		luaL_argerror(L, 1, "reader is closed");
	return r;
}

static int reader_read(lua_State *L)
{
	struct reader *r = check_reader(L);
	char buf[READ_CHUNK];
	for (;;) {
		ssize_t n = read(r->fd, buf, sizeof buf);
		if (n > 0) {
			lua_pushlstring(L, buf, (size_t)n);
			return 1;
		}
		if (n == 0) {
			lua_pushnil(L);
			return 1;
		}
		if (errno == EAGAIN) {
			lua_pushboolean(L, 0);
			return 1;
		}
		if (errno != EINTR)
			return push_errno(L, "read", errno);
	}
}

static int reader_pollfd(lua_State *L)
{
	lua_pushinteger(L, check_reader(L)->fd);
	return 1;
}

static int reader_events(lua_State *L)
{
	lua_pushliteral(L, "r");
	return 1;
}

static int reader_timeout(lua_State *L)
{
	lua_pushnil(L);
	return 1;
}

static int reader_close(lua_State *L)
{
	struct reader *r = luaL_checkudata(L, 1, READER_MT);
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
	return 0;
}

static int core_kill(lua_State *L)
{
	pid_t pid = (pid_t)skc_checkinteger(L, 1);
	int sig = (int)skc_checkinteger(L, 2);
	/* 0 and negatives would signal a whole process group, never what a caller means here. */
	luaL_argcheck(L, pid > 0, 1, "pid must be positive");
	if (kill(pid, sig) < 0)
		return push_errno(L, "kill", errno);
	lua_pushboolean(L, 1);
	return 1;
}

static int core_alive(lua_State *L)
{
	pid_t pid = (pid_t)skc_checkinteger(L, 1);
	luaL_argcheck(L, pid > 0, 1, "pid must be positive");
	lua_pushboolean(L, kill(pid, 0) == 0 || errno == EPERM);
	return 1;
}

static int core_reap(lua_State *L)
{
	pid_t pid = (pid_t)skc_checkinteger(L, 1);
	luaL_argcheck(L, pid > 0, 1, "pid must be positive");
	int block = lua_toboolean(L, 2);
	int status;
	pid_t r;
	do
		r = waitpid(pid, &status, block ? 0 : WNOHANG);
	while (r < 0 && errno == EINTR);
	/* true: it is gone (or was never our child to wait for); false: still running. */
	lua_pushboolean(L, r == pid || (r < 0 && errno == ECHILD));
	if (r != pid)
		return 1;
	lua_pushinteger(L, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
	return 2;
}

static int core_isatty(lua_State *L)
{
	lua_pushboolean(L, isatty((int)skc_checkinteger(L, 1)) == 1);
	return 1;
}

static int core_mkdir(lua_State *L)
{
	const char *path = luaL_checkstring(L, 1);
	lua_Integer mode = skc_checkinteger(L, 2);
	if (mkdir(path, (mode_t)mode) < 0)
		return push_errno_named(L, path, errno);
	lua_pushboolean(L, 1);
	return 1;
}

/* Writes all of data to fd, a regular file's descriptor; 0, or -1 with errno set. */
static int write_whole(int fd, const char *data, size_t len)
{
	for (size_t off = 0; off < len;) {
		ssize_t n = write(fd, data + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -1;
		off += (size_t)n;
	}
	return 0;
}

static int core_write_private(lua_State *L)
{
	const char *path = luaL_checkstring(L, 1);
	size_t len;
	const char *data = luaL_checklstring(L, 2, &len);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return push_errno_named(L, path, errno);
	if (write_whole(fd, data, len) < 0) {
		int e = errno;
		close(fd);
		unlink(path);
		return push_errno_named(L, path, e);
	}
	if (close(fd) < 0)
		return push_errno_named(L, path, errno);
	lua_pushboolean(L, 1);
	return 1;
}

/* A file core.create_new made; fd is -1 once closed. */
struct new_file {
	int fd;
};

/* A file method's result: true, or nil and errno's text when it failed. */
static int push_done(lua_State *L, int failed)
{
	if (!failed) {
		lua_pushboolean(L, 1);
		return 1;
	}
	lua_pushnil(L);
	lua_pushstring(L, strerror(errno));
	return 2;
}

static int core_create_new(lua_State *L)
{
	const char *path = luaL_checkstring(L, 1);
	struct new_file *f = lua_newuserdata(L, sizeof *f);
	f->fd = -1;
	luaL_setmetatable(L, NEW_FILE_MT);
	/* O_EXCL also refuses a dangling link: a name planted beside the destination (a link to
	 * a file of the caller's) must not be where a download's bytes go. */
	f->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
	if (f->fd < 0)
		return push_errno_named(L, path, errno);
	return 1;
}

int skl_new_file_fd(lua_State *L, int idx)
{
	struct new_file *f = luaL_testudata(L, idx, NEW_FILE_MT);
	if (f == NULL)
		return -1;
	if (f->fd < 0)
		luaL_argerror(L, idx, "file is closed");
	return f->fd;
}

static int new_file_write(lua_State *L)
{
	struct new_file *f = luaL_checkudata(L, 1, NEW_FILE_MT);
	if (f->fd < 0)
		return luaL_argerror(L, 1, "file is closed");
	int fd = f->fd;
	size_t len;
	const char *data = luaL_checklstring(L, 2, &len);
	return push_done(L, write_whole(fd, data, len) < 0);
}

static int new_file_close(lua_State *L)
{
	struct new_file *f = luaL_checkudata(L, 1, NEW_FILE_MT);
	if (f->fd < 0) {
		lua_pushboolean(L, 1);
		return 1;
	}
	int fd = f->fd;
	f->fd = -1;
	/* Linux releases the descriptor whatever close returns: never closed twice. */
	return push_done(L, close(fd) < 0 && errno != EINTR);
}

static int core_is_directory(lua_State *L)
{
	struct stat st;
	lua_pushboolean(L, stat(luaL_checkstring(L, 1), &st) == 0 && S_ISDIR(st.st_mode));
	return 1;
}

static int core_read_regular(lua_State *L)
{
	const char *path = luaL_checkstring(L, 1);
	lua_Integer max = luaL_checkinteger(L, 2);
	luaL_argcheck(L, max >= 0 && (lua_Integer)(size_t)max == max && (size_t)max < SIZE_MAX, 2,
		      "a bound of bytes");
	char why[128];
	int fd = sk_open_regular(path, why, sizeof why);
	if (fd < 0) {
		int absent = errno == ENOENT;
		lua_pushnil(L);
		lua_pushfstring(L, "%s: %s", path, why);
		lua_pushboolean(L, absent);
		return 3;
	}
	size_t want = (size_t)max + 1, got = 0;
	luaL_Buffer b;
	luaL_buffinit(L, &b);
	while (got < want) {
		size_t room = want - got < LUAL_BUFFERSIZE ? want - got : LUAL_BUFFERSIZE;
		char *p = luaL_prepbuffer(&b);
		ssize_t n = read(fd, p, room);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			close(fd);
			return push_errno(L, path, e);
		}
		if (n == 0)
			break;
		luaL_addsize(&b, (size_t)n);
		got += (size_t)n;
	}
	close(fd);
	luaL_pushresult(&b);
	return 1;
}

static int core_listdir(lua_State *L)
{
	const char *path = luaL_checkstring(L, 1);
	DIR *d = opendir(path);
	if (d == NULL)
		return push_errno_named(L, path, errno);
	lua_newtable(L);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		lua_pushstring(L, e->d_name);
		lua_rawseti(L, -2, ++n);
	}
	closedir(d);
	return 1;
}

static int core_remove_tree(lua_State *L)
{
	const char *path = luaL_checkstring(L, 1);
	if (sk_tree_remove(AT_FDCWD, path, NULL, 0) < 0)
		return push_errno_named(L, path, errno);
	lua_pushboolean(L, 1);
	return 1;
}

void skl_open_process(lua_State *L)
{
	static const luaL_Reg reader_methods[] = {
		{ "read", reader_read },
		{ "pollfd", reader_pollfd },
		{ "events", reader_events },
		{ "timeout", reader_timeout },
		{ "close", reader_close },
		{ NULL, NULL },
	};
	skc_new_class(L, READER_MT, reader_methods, reader_close);
	static const luaL_Reg new_file_methods[] = {
		{ "write", new_file_write },
		{ "close", new_file_close },
		{ NULL, NULL },
	};
	skc_new_class(L, NEW_FILE_MT, new_file_methods, new_file_close);
	static const luaL_Reg functions[] = {
		{ "spawn", core_spawn },
		{ "kill", core_kill },
		{ "alive", core_alive },
		{ "reap", core_reap },
		{ "isatty", core_isatty },
		{ "mkdir", core_mkdir },
		{ "write_private", core_write_private },
		{ "create_new", core_create_new },
		{ "listdir", core_listdir },
		{ "read_regular", core_read_regular },
		{ "is_directory", core_is_directory },
		{ "remove_tree", core_remove_tree },
		{ NULL, NULL },
	};
	skc_setfuncs(L, functions);
	lua_pushinteger(L, SIGTERM);
	lua_setfield(L, -2, "SIGTERM");
	lua_pushinteger(L, SIGKILL);
	lua_setfield(L, -2, "SIGKILL");
}
