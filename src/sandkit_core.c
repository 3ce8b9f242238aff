/*
 * sandkit_core.c — the sandkit.core module: registration, clocks, randomness and core.wait,
 * the only call in the C core that blocks.
 *
 *   core.now()                 -- monotonic seconds (a number)
 *   core.random(n)             -- n bytes from the OpenSSL CSPRNG
 *   core.wait(pollable, s)     -- poll(2) on pollable:pollfd() for pollable:events(), at most
 *                                 min(s, pollable:timeout()) seconds; pollable may be nil (a
 *                                 sleep) and s nil (no bound). true when ready, false on time.
 *   core.poll(list, s)         -- poll(2) on several pollables at once (their own timeouts are
 *                                 the caller's business here): an array of booleans, one per
 *                                 pollable, true where it is ready; all false on time.
 * Both also return early (false, all false) when a signal interrupts them, and — once
 * core.trap was called (signals.c) — as soon as a trapped signal arrives: callers re-check
 * their state anyway, and the `sandkit` command asks core.caught() what happened.
 *
 *   core.LIMITS                -- the libcurl transfer's bounds (transfer.h), which the nginx
 *                                 transport reads so that both hold a server to the same ones:
 *                                 { BUFFER, MIN_BUFFER, MAX_HEADER_BYTES, MAX_HEADERS,
 *                                   MAX_REQUEST_HEADERS, MAX_PEM }
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "sandkit_core.h"
#include "common/transfer.h"

/* The most randomness one call hands out; tokens and ids need 16–32 bytes. */
#define MAX_RANDOM_BYTES 4096
/* Descriptors one core.poll watches; a runner needs one per distinct pollable, not per task. */
#define MAX_POLL 1024

static double monotonic_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int core_now(lua_State *L)
{
	lua_pushnumber(L, monotonic_now());
	return 1;
}

static int core_random(lua_State *L)
{
	lua_Integer n = skc_checkinteger(L, 1);
	luaL_argcheck(L, n > 0 && n <= MAX_RANDOM_BYTES, 1, "between 1 and 4096 bytes");
	unsigned char buf[MAX_RANDOM_BYTES];
	if (RAND_bytes(buf, (int)n) != 1)
		return luaL_error(L, "the system's random generator failed");
	lua_pushlstring(L, (const char *)buf, (size_t)n);
	return 1;
}

/* Calls pollable:name() and leaves its first result on the stack. */
static void call_method(lua_State *L, int obj, const char *name)
{
	lua_getfield(L, obj, name);
	if (lua_type(L, -1) != LUA_TFUNCTION)
		luaL_error(L, "a pollable needs a %s method", name);
	lua_pushvalue(L, obj);
	lua_call(L, 1, 1);
}

static short poll_events(lua_State *L, int obj)
{
	call_method(L, obj, "events");
	const char *ev = luaL_optstring(L, -1, "r");
	short events = 0;
	if (strchr(ev, 'r'))
		events |= POLLIN;
	if (strchr(ev, 'w'))
		events |= POLLOUT;
	lua_pop(L, 1);
	return events;
}

static int poll_ms(double deadline)
{
	if (deadline < 0)
		return -1;
	double left = deadline - monotonic_now();
	/* Rounded up: a wait cut short by rounding would spin on zero-length polls. */
	return left <= 0 ? 0 : left > 2e6 ? 2000000000 : (int)ceil(left * 1000);
}

static int core_poll(lua_State *L)
{
	luaL_checktype(L, 1, LUA_TTABLE);
	int n = (int)skc_rawlen(L, 1);
	luaL_argcheck(L, n <= MAX_POLL, 1, "more than 1024 pollables");
	double limit = lua_isnoneornil(L, 2) ? -1 : luaL_checknumber(L, 2);
	struct pollfd pfd[MAX_POLL + 1]; /* the last slot for the trapped-signal pipe */
	for (int i = 0; i < n; i++) {
		lua_rawgeti(L, 1, i + 1);
		int obj = lua_gettop(L);
		call_method(L, obj, "pollfd");
		pfd[i].fd = (int)luaL_checkinteger(L, -1);
		lua_pop(L, 1);
		pfd[i].events = poll_events(L, obj);
		pfd[i].revents = 0;
		lua_pop(L, 1);
	}
	int watched = n;
	if (skl_signal_fd() >= 0) {
		pfd[watched].fd = skl_signal_fd();
		pfd[watched].events = POLLIN;
		pfd[watched].revents = 0;
		watched++;
	}
	double deadline = limit < 0 ? -1 : monotonic_now() + limit;
	/* EINTR ends the wait: a signal is news the caller may need at once. */
	int r = poll(pfd, (nfds_t)watched, poll_ms(deadline));
	if (r < 0 && errno != EINTR)
		return luaL_error(L, "poll: %s", strerror(errno));
	lua_createtable(L, n, 0);
	for (int i = 0; i < n; i++) {
		lua_pushboolean(L, r > 0 && pfd[i].revents != 0);
		lua_rawseti(L, -2, i + 1);
	}
	return 1;
}

static int core_wait(lua_State *L)
{
	double limit = -1;
	if (!lua_isnoneornil(L, 2)) {
		limit = luaL_checknumber(L, 2);
		if (limit < 0)
			limit = 0;
	}
	struct pollfd pfd[2] = { { .fd = -1, .events = 0, .revents = 0 },
				 { .fd = skl_signal_fd(), .events = POLLIN, .revents = 0 } };
	if (!lua_isnoneornil(L, 1)) {
		call_method(L, 1, "pollfd");
		pfd[0].fd = (int)luaL_checkinteger(L, -1);
		lua_pop(L, 1);
		pfd[0].events = poll_events(L, 1);
		call_method(L, 1, "timeout");
		if (!lua_isnil(L, -1)) {
			double t = luaL_checknumber(L, -1);
			if (t < 0)
				t = 0;
			if (limit < 0 || t < limit)
				limit = t;
		}
		lua_pop(L, 1);
	}
	double deadline = limit < 0 ? -1 : monotonic_now() + limit;
	/* poll(2) skips entries whose fd is negative, so a sleep without a trap polls nothing. */
	int r = poll(pfd, 2, poll_ms(deadline));
	if (r < 0 && errno != EINTR)
		return luaL_error(L, "poll: %s", strerror(errno));
	lua_pushboolean(L, r > 0 && pfd[0].revents != 0);
	return 1;
}

/* core.LIMITS: a table of the transfer's constants, named as in transfer.h without SK_TRANSFER_. */
static void push_limits(lua_State *L)
{
	static const struct {
		const char *name;
		size_t value;
	} limits[] = {
		{ "BUFFER", SK_TRANSFER_BUFFER },
		{ "MIN_BUFFER", SK_TRANSFER_MIN_BUFFER },
		{ "READ_SIZE", (size_t)SK_TRANSFER_READ_SIZE },
		{ "READ_MAX", (size_t)SK_TRANSFER_READ_MAX },
		{ "READ_BUDGET", SK_TRANSFER_READ_BUDGET },
		{ "MAX_HEADER_BYTES", SK_TRANSFER_MAX_HEADER_BYTES },
		{ "MAX_HEADERS", SK_TRANSFER_MAX_HEADERS },
		{ "MAX_REQUEST_HEADERS", SK_TRANSFER_MAX_REQUEST_HEADERS },
		{ "MAX_PEM", SK_TRANSFER_MAX_PEM },
		{ "MAX_UNIX_SOCKET", SK_UNIX_SOCKET_PATH_MAX },
		{ "UNIX_SEND_BUFFER", SK_TRANSFER_UNIX_SEND_BUFFER },
	};
	lua_createtable(L, 0, (int)(sizeof limits / sizeof limits[0]));
	for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
		lua_pushinteger(L, (lua_Integer)limits[i].value);
		lua_setfield(L, -2, limits[i].name);
	}
}

int luaopen_sandkit_core(lua_State *L);

int luaopen_sandkit_core(lua_State *L)
{
	static const luaL_Reg functions[] = {
		{ "now", core_now },
		{ "random", core_random },
		{ "wait", core_wait },
		{ "poll", core_poll },
		{ NULL, NULL },
	};
	lua_newtable(L);
	skc_setfuncs(L, functions);
	skl_open_frames(L);
	skl_open_transfer(L);
	skl_open_process(L);
	skl_open_sigv4(L);
	skl_open_signals(L);
	skl_open_terminal(L);
	skl_open_ed25519(L);
	skl_open_fslist(L);
	push_limits(L);
	lua_setfield(L, -2, "LIMITS");
	lua_pushliteral(L, SANDKIT_VERSION);
	lua_setfield(L, -2, "_VERSION");
	lua_pushinteger(L, SANDKIT_ABI);
	lua_setfield(L, -2, "_ABI");
	return 1;
}
