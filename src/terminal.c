/*
 * terminal.c — the local terminal of `sandkit run -t` and `sandkit shell`, and a look at
 * standard input without waiting:
 *
 *   core.tty_raw(fd)            -- the settings to restore (a string) | nil, err: the terminal
 *                                  now passes every byte on at once (^C and ^D included) and
 *                                  echoes nothing: the remote terminal does both
 *   core.tty_restore(fd, saved) -- true | nil, err
 *   core.tty_size(fd)           -- cols, rows | nil, err
 *   core.read_ready(fd, max)    -- what read(2) gives now: bytes (at most max, at most 64 KiB),
 *                                  "" at end of file, false when nothing is waiting | nil, err
 *
 * A terminal's settings belong to the terminal, not to this process: whatever ends the
 * command must give them back, which the Lua side does on every path.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "sandkit_core.h"

/* One read's most: what one keystroke burst or one pipe read brings, and one write's piece. */
#define READ_READY_MAX (64 * 1024)

static int push_failure(lua_State *L, const char *what)
{
	lua_pushnil(L);
	lua_pushfstring(L, "%s: %s", what, strerror(errno));
	return 2;
}

static int core_tty_raw(lua_State *L)
{
	int fd = (int)skc_checkinteger(L, 1);
	struct termios saved, raw;
	if (tcgetattr(fd, &saved) < 0)
		return push_failure(L, "tcgetattr");
	raw = saved;
	cfmakeraw(&raw);
	/* TCSANOW: what was typed before keeps its place, and goes to the command. */
	if (tcsetattr(fd, TCSANOW, &raw) < 0)
		return push_failure(L, "tcsetattr");
	lua_pushlstring(L, (const char *)&saved, sizeof saved);
	return 1;
}

static int core_tty_restore(lua_State *L)
{
	int fd = (int)skc_checkinteger(L, 1);
	size_t len;
	const char *saved = luaL_checklstring(L, 2, &len);
	luaL_argcheck(L, len == sizeof(struct termios), 2, "not a terminal's saved settings");
	struct termios t;
	memcpy(&t, saved, sizeof t);
	/* TCSADRAIN: the command's last output is shown under the settings it was written for. */
	if (tcsetattr(fd, TCSADRAIN, &t) < 0)
		return push_failure(L, "tcsetattr");
	lua_pushboolean(L, 1);
	return 1;
}

static int core_tty_size(lua_State *L)
{
	int fd = (int)skc_checkinteger(L, 1);
	struct winsize ws;
	if (ioctl(fd, TIOCGWINSZ, &ws) < 0)
		return push_failure(L, "TIOCGWINSZ");
	lua_pushinteger(L, ws.ws_col);
	lua_pushinteger(L, ws.ws_row);
	return 2;
}

static int core_read_ready(lua_State *L)
{
	int fd = (int)skc_checkinteger(L, 1);
	lua_Integer max = skc_checkinteger(L, 2);
	luaL_argcheck(L, max >= 1, 2, "at least one byte");
	if (max > READ_READY_MAX)
		max = READ_READY_MAX;
	struct pollfd p = { .fd = fd, .events = POLLIN, .revents = 0 };
	int r;
	while ((r = poll(&p, 1, 0)) < 0 && errno == EINTR)
		;
	if (r < 0)
		return push_failure(L, "poll");
	if (r == 0) {
		lua_pushboolean(L, 0);
		return 1;
	}
	char buf[READ_READY_MAX];
	ssize_t n;
	while ((n = read(fd, buf, (size_t)max)) < 0 && errno == EINTR)
		;
	if (n < 0 && errno == EAGAIN) {
		lua_pushboolean(L, 0);
		return 1;
	}
	if (n < 0)
		return push_failure(L, "read");
	lua_pushlstring(L, buf, (size_t)n);
	return 1;
}

void skl_open_terminal(lua_State *L)
{
	static const luaL_Reg functions[] = {
		{ "tty_raw", core_tty_raw },
		{ "tty_restore", core_tty_restore },
		{ "tty_size", core_tty_size },
		{ "read_ready", core_read_ready },
		{ NULL, NULL },
	};
	skc_setfuncs(L, functions);
}
