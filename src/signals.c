/*
 * signals.c — signals a waiting program must notice at once (a Ctrl-C, a SIGTERM), for the
 * `sandkit` command: it has a remote command to stop and a session to remove before it goes.
 *
 *   core.trap{ core.SIGINT, core.SIGTERM }   -- catch these from now on; true | nil, err
 *                                               (SIGINT, SIGTERM, SIGHUP, SIGPIPE, and
 *                                               SIGWINCH: a terminal's new size)
 *   core.caught()                            -- the first signal caught since the last call, or nil
 *
 * Once a trap is set, core.wait and core.poll return as soon as a trapped signal arrives: the
 * handler writes the signal's number to a pipe both of them watch (the self-pipe trick), so a
 * signal is seen whether it interrupts poll(2), lands just before it, or is delivered to
 * another thread (libcurl's resolver). Until core.caught() takes the signal, every wait
 * returns at once, so a program that traps must ask after each wait (the `sandkit` command's
 * wait scheduler does). A program that never calls core.trap keeps its signals as they were.
 *
 * Signal dispositions belong to the whole process, so this file keeps the one piece of
 * process-wide state in the core: that pipe.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "sandkit_core.h"

/* Signals one trap may name: the handful a command line program is asked to stop by. */
#define MAX_TRAPPED 8

static int trap_pipe[2] = { -1, -1 };

static void on_signal(int sig)
{
	int saved = errno;
	unsigned char b = (unsigned char)sig;
	/* Non-blocking: a pipe already full of signal numbers has said all this one would. */
	if (write(trap_pipe[1], &b, 1) < 0) {
		/* nothing to do in a handler */
	}
	errno = saved;
}

int skl_signal_fd(void)
{
	return trap_pipe[0];
}

static int core_trap(lua_State *L)
{
	luaL_checktype(L, 1, LUA_TTABLE);
	int n = (int)skc_rawlen(L, 1);
	luaL_argcheck(L, n >= 1 && n <= MAX_TRAPPED, 1, "between 1 and 8 signals");
	int sigs[MAX_TRAPPED];
	for (int i = 0; i < n; i++) {
		lua_rawgeti(L, 1, i + 1);
		sigs[i] = (int)skc_checkinteger(L, -1);
		lua_pop(L, 1);
		luaL_argcheck(L, sigs[i] == SIGINT || sigs[i] == SIGTERM || sigs[i] == SIGHUP ||
				  sigs[i] == SIGPIPE || sigs[i] == SIGWINCH, 1,
			      "only SIGINT, SIGTERM, SIGHUP, SIGPIPE and SIGWINCH can be trapped");
	}
	if (trap_pipe[0] < 0 && pipe2(trap_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		lua_pushnil(L);
		lua_pushfstring(L, "pipe: %s", strerror(errno));
		return 2;
	}
	for (int i = 0; i < n; i++) {
		struct sigaction old, sa;
		/* A signal ignored when this process started (nohup, a background job) stays so. */
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
			continue;
		memset(&sa, 0, sizeof sa);
		sa.sa_handler = on_signal;
		sigfillset(&sa.sa_mask);
		/* No SA_RESTART: a read or write blocked on a terminal or pipe returns too. */
		sa.sa_flags = 0;
		if (sigaction(sigs[i], &sa, NULL) < 0) {
			lua_pushnil(L);
			lua_pushfstring(L, "sigaction: %s", strerror(errno));
			return 2;
		}
	}
	lua_pushboolean(L, 1);
	return 1;
}

static int core_caught(lua_State *L)
{
	unsigned char buf[64];
	int first = 0;
	ssize_t got;
	if (trap_pipe[0] >= 0) {
		while ((got = read(trap_pipe[0], buf, sizeof buf)) > 0 || (got < 0 && errno == EINTR))
			if (got > 0 && first == 0)
				first = buf[0];
	}
	if (first == 0)
		lua_pushnil(L);
	else
		lua_pushinteger(L, first);
	return 1;
}

void skl_open_signals(lua_State *L)
{
	static const luaL_Reg functions[] = {
		{ "trap", core_trap },
		{ "caught", core_caught },
		{ NULL, NULL },
	};
	skc_setfuncs(L, functions);
	lua_pushinteger(L, SIGINT);
	lua_setfield(L, -2, "SIGINT");
	lua_pushinteger(L, SIGHUP);
	lua_setfield(L, -2, "SIGHUP");
	lua_pushinteger(L, SIGPIPE);
	lua_setfield(L, -2, "SIGPIPE");
	lua_pushinteger(L, SIGWINCH);
	lua_setfield(L, -2, "SIGWINCH");
}
