/*
 * lua_transfer.c — Lua glue for transfer.c.
 *
 *   local client = core.client{ user_agent = nil }
 *   client:pollfd(), client:events(), client:timeout()     -- the cqueues pollable convention
 *   client:step()                                          -- ready I/O, never blocks
 *   local t = client:request{ method =, url =, headers = { [name] = value }, body =,
 *                             fresh_connect =, ca_file =, proxy =, connect_timeout = <s>,
 *                             unix_socket = <path>,
 *                             max_body =, max_error_body =, buffer_size =,
 *                             body_stream =, body_length =,
 *                             ca_pem =, client_cert_pem =, client_key_pem =,  -- PEM text
 *                             tls_server_name = }                             -- see transfer.h
 *   t:read()        -- bytes | false (would block) | nil (the body is over: see t:state())
 *   t:read_to_file(f) -- the same into the open file f (io.open's or core.create_new's: a
 *                      regular file or a device that never holds a write; a pipe or a socket
 *                      is refused), written from the transfer's buffer: the bytes written |
 *                      false | nil, or nil and the write's error
 *   t:decode(dec)   -- frame | false | nil (over) | nil, kind, message (the decoder failed)
 *   t:state()       -- { sent=, headers=, status=, done=, ok=, too_long=, error=, received=,
 *                        uploaded=, read_size= }
 *   t:headers()     -- { [lower-case name] = value }
 *   t:progress()    -- a counter that moves whenever headers, body bytes or the end arrive
 *   t:step()        -- client:step() for the transfer's client (a scheduler holds transfers)
 *   t:feed(bytes)   -- with body_stream: bytes of the body taken (0: the buffer is full, wait
 *                      on the transfer and feed the rest)
 *   t:feed_file(f)  -- with body_stream: the next bytes of the body read from the open file f
 *                      (io.open's, a regular file; the body is the file from its start, at the
 *                      offset of the bytes fed so far, whatever f's own position) straight
 *                      into the send buffer: the bytes taken (0: full), nil at the file's end,
 *                      false when it holds more than body_length, or nil and the read's error
 *   t:finish()      -- with body_stream: the body is complete
 *   t:close()       -- stops it; also __close and __gc
 * A transfer is pollable too (it answers for its client), so cqueues.poll(t) works.
 */
#include <ctype.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "common/frames.h"
#include "common/transfer.h"
#include "sandkit_core.h"

#define CLIENT_MT "sandkit.client"
#define TRANSFER_MT "sandkit.transfer"

struct client_ud {
	sk_client *c;
};

struct transfer_ud {
	sk_transfer *t;
	/* Leading unread bytes known to hold no newline: a frame line still arriving. */
	size_t partial;
};

static struct client_ud *check_client(lua_State *L, int idx)
{
	struct client_ud *u = luaL_checkudata(L, idx, CLIENT_MT);
	if (u->c == NULL)
		luaL_argerror(L, idx, "client is closed");
	return u;
}

static struct transfer_ud *check_transfer(lua_State *L, int idx)
{
	struct transfer_ud *u = luaL_checkudata(L, idx, TRANSFER_MT);
	if (u->t == NULL)
		luaL_argerror(L, idx, "transfer is closed");
	return u;
}

static const char *opt_string(lua_State *L, int idx, const char *key)
{
	lua_getfield(L, idx, key);
	const char *s = lua_isnil(L, -1) ? NULL : luaL_checkstring(L, -1);
	lua_pop(L, 1); /* the string stays alive in the options table the caller still holds */
	return s;
}

/* A string option with its length; like opt_string, kept alive by the options table. */
static const char *opt_lstring(lua_State *L, int idx, const char *key, size_t *len)
{
	lua_getfield(L, idx, key);
	const char *s = lua_isnil(L, -1) ? NULL : luaL_checklstring(L, -1, len);
	lua_pop(L, 1);
	return s;
}

static lua_Integer opt_size(lua_State *L, int idx, const char *key)
{
	lua_getfield(L, idx, key);
	lua_Integer v = lua_isnil(L, -1) ? 0 : skc_checkinteger(L, -1);
	lua_pop(L, 1);
	if (v < 0)
		luaL_error(L, "option %s must not be negative", key);
	return v;
}

static int client_new(lua_State *L)
{
	struct sk_client_options opt = { NULL };
	if (!lua_isnoneornil(L, 1)) {
		luaL_checktype(L, 1, LUA_TTABLE);
		opt.user_agent = opt_string(L, 1, "user_agent");
	}
	struct client_ud *u = skc_newuserdata(L, sizeof *u);
	u->c = NULL;
	luaL_setmetatable(L, CLIENT_MT);
	char err[256];
	u->c = sk_client_new(&opt, err, sizeof err);
	if (u->c == NULL)
		return luaL_error(L, "%s", err);
	return 1;
}

static int client_close(lua_State *L)
{
	struct client_ud *u = luaL_checkudata(L, 1, CLIENT_MT);
	sk_client_free(u->c);
	u->c = NULL;
	return 0;
}

static int client_step(lua_State *L)
{
	struct client_ud *u = check_client(L, 1);
	if (sk_client_step(u->c) < 0)
		return luaL_error(L, "libcurl's multi interface failed");
	lua_pushinteger(L, sk_client_transfers(u->c));
	return 1;
}

static int push_pollfd(lua_State *L, sk_client *c)
{
	lua_pushinteger(L, sk_client_fd(c));
	return 1;
}

static int push_timeout(lua_State *L, sk_client *c)
{
	long ms = sk_client_timeout_ms(c);
	if (ms < 0)
		lua_pushnil(L);
	else
		lua_pushnumber(L, (lua_Number)ms / 1000.0);
	return 1;
}

static int client_pollfd(lua_State *L)
{
	return push_pollfd(L, check_client(L, 1)->c);
}

static int client_timeout(lua_State *L)
{
	return push_timeout(L, check_client(L, 1)->c);
}

static int events(lua_State *L)
{
	lua_pushliteral(L, "r");
	return 1;
}

static int valid_header_text(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
			return 0;
	return 1;
}

/* Formats the headers table as "Name: value" lines. The strings are anchored in a table left
 * on the stack, so the pointers in lines stay valid while it is there. Returns their count. */
static int header_lines(lua_State *L, int opts, const char **lines)
{
	int n = 0;
	lua_newtable(L);
	int anchor = lua_gettop(L);
	lua_getfield(L, opts, "headers");
	if (lua_isnil(L, -1)) {
		lua_pop(L, 1);
		return 0;
	}
	luaL_checktype(L, -1, LUA_TTABLE);
	lua_pushnil(L);
	while (lua_next(L, anchor + 1) != 0) {
		size_t kn, vn;
		/* Checked before any conversion: lua_next breaks if a key is converted in place. */
		if (lua_type(L, -2) != LUA_TSTRING)
			return luaL_error(L, "request header names must be strings");
		const char *k = lua_tolstring(L, -2, &kn);
		const char *v = luaL_checklstring(L, -1, &vn);
		/* A CR or LF in a header would let a value start a header of its own. */
		if (kn == 0 || !valid_header_text(k, kn) || !valid_header_text(v, vn) ||
		    memchr(k, ':', kn) != NULL)
			return luaL_error(L, "invalid request header %s", k);
		if (n >= SK_TRANSFER_MAX_REQUEST_HEADERS)
			return luaL_error(L, "more than %d request headers", SK_TRANSFER_MAX_REQUEST_HEADERS);
		lua_pushfstring(L, "%s: %s", k, v);
		lines[n++] = lua_tostring(L, -1);
		lua_rawseti(L, anchor, n);
		lua_pop(L, 1);
	}
	lua_pop(L, 1);
	return n;
}

static int client_request(lua_State *L)
{
	struct client_ud *cu = check_client(L, 1);
	luaL_checktype(L, 2, LUA_TTABLE);
	struct sk_request req;
	memset(&req, 0, sizeof req);
	req.method = opt_string(L, 2, "method");
	req.url = opt_string(L, 2, "url");
	req.ca_file = opt_string(L, 2, "ca_file");
	req.proxy = opt_string(L, 2, "proxy");
	req.unix_socket = opt_string(L, 2, "unix_socket");
	req.ca_pem = opt_lstring(L, 2, "ca_pem", &req.ca_pem_len);
	req.client_cert_pem = opt_lstring(L, 2, "client_cert_pem", &req.client_cert_pem_len);
	req.client_key_pem = opt_lstring(L, 2, "client_key_pem", &req.client_key_pem_len);
	req.tls_server_name = opt_string(L, 2, "tls_server_name");
	if (req.method == NULL || req.url == NULL)
		return luaL_error(L, "a request needs a method and a url");
	lua_getfield(L, 2, "body");
	int body_idx = lua_gettop(L);
	if (!lua_isnil(L, body_idx))
		req.body = luaL_checklstring(L, body_idx, &req.body_len);
	lua_getfield(L, 2, "fresh_connect");
	req.fresh_connect = lua_toboolean(L, -1);
	lua_pop(L, 1);
	lua_getfield(L, 2, "connect_timeout");
	if (!lua_isnil(L, -1))
		req.connect_timeout_ms = (long)(luaL_checknumber(L, -1) * 1000.0);
	lua_pop(L, 1);
	req.max_body = (size_t)opt_size(L, 2, "max_body");
	req.max_error_body = (size_t)opt_size(L, 2, "max_error_body");
	req.buffer_size = (size_t)opt_size(L, 2, "buffer_size");
	lua_getfield(L, 2, "body_stream");
	req.body_stream = lua_toboolean(L, -1);
	lua_pop(L, 1);
	lua_getfield(L, 2, "body_length");
	req.body_length = lua_isnil(L, -1) ? -1 : (int64_t)skc_checkinteger(L, -1);
	lua_pop(L, 1);
	if (req.body_stream && req.body != NULL)
		return luaL_error(L, "a request has a body or a body_stream, not both");
	if (req.body_length < -1)
		return luaL_error(L, "option body_length must not be negative");

	const char *lines[SK_TRANSFER_MAX_REQUEST_HEADERS];
	req.header_count = (size_t)header_lines(L, 2, lines);
	req.headers = lines;

	struct transfer_ud *u = skc_newuserdata(L, sizeof *u);
	u->t = NULL;
	u->partial = 0;
	luaL_setmetatable(L, TRANSFER_MT);
	/* The user value keeps the client and the body alive for as long as the transfer. */
	lua_createtable(L, 2, 0);
	lua_pushvalue(L, 1);
	lua_rawseti(L, -2, 1);
	lua_pushvalue(L, body_idx);
	lua_rawseti(L, -2, 2);
	skc_setuservalue(L, -2);

	char err[256];
	u->t = sk_transfer_start(cu->c, &req, err, sizeof err);
	if (u->t == NULL)
		return luaL_error(L, "%s", err);
	return 1;
}

static int transfer_close(lua_State *L)
{
	struct transfer_ud *u = luaL_checkudata(L, 1, TRANSFER_MT);
	sk_transfer_free(u->t);
	u->t = NULL;
	return 0;
}

/* The client behind a transfer, or NULL once that client was closed. */
static sk_client *transfer_client(lua_State *L, int idx)
{
	skc_getuservalue(L, idx);
	lua_rawgeti(L, -1, 1);
	struct client_ud *cu = luaL_testudata(L, -1, CLIENT_MT);
	sk_client *c = cu ? cu->c : NULL;
	lua_pop(L, 2);
	return c;
}

static int transfer_pollfd(lua_State *L)
{
	check_transfer(L, 1);
	sk_client *c = transfer_client(L, 1);
	if (c == NULL)
		return luaL_error(L, "the transfer's client is closed");
	return push_pollfd(L, c);
}

static int transfer_timeout(lua_State *L)
{
	check_transfer(L, 1);
	sk_client *c = transfer_client(L, 1);
	if (c == NULL) {
		lua_pushnumber(L, 0);
		return 1;
	}
	return push_timeout(L, c);
}

/*
 * For read and decode once nothing they can use is buffered: pushes nil when the body is over,
 * or false (would block) when the client was already stepped once or is gone, and returns 1;
 * otherwise steps the client — without waiting — and returns 0 so the caller looks again.
 */
static int nothing_buffered(lua_State *L, struct transfer_ud *u, int stepped)
{
	struct sk_transfer_state st;
	sk_transfer_state(u->t, &st);
	if (st.done) {
		lua_pushnil(L);
		return 1;
	}
	sk_client *c = transfer_client(L, 1);
	if (stepped || c == NULL) {
		lua_pushboolean(L, 0);
		return 1;
	}
	if (sk_client_step(c) < 0)
		return luaL_error(L, "libcurl's multi interface failed");
	return 0;
}

static int transfer_read(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	for (int stepped = 0;; stepped = 1) {
		size_t n;
		const char *p = sk_transfer_peek(u->t, &n);
		if (n > 0) {
			lua_pushlstring(L, p, n);
			sk_transfer_consume(u->t, n);
			return 1;
		}
		if (nothing_buffered(L, u, stepped))
			return 1;
	}
}

static int transfer_read_to_file(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	int fd = skl_new_file_fd(L, 2);
	FILE *f = fd < 0 ? skc_checkfile(L, 2) : NULL;
	if (f != NULL)
		fd = fileno(f);
	/* A pipe or a socket whose reader stalls would hold the write, and the whole client with
	 * it: the C core never blocks, so such a file takes the bytes through t:read(). */
	struct stat st;
	if (fstat(fd, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
		return luaL_argerror(L, 2, "a pipe or a socket may block a write: read the bytes instead");
	/* Bytes the stream still holds would land after these: written first. */
	if (f != NULL && fflush(f) != 0)
		goto failed;
	for (int stepped = 0;; stepped = 1) {
		long n = sk_transfer_drain_fd(u->t, fd);
		if (n < 0)
			goto failed;
		if (n > 0) {
			lua_pushinteger(L, (lua_Integer)n);
			return 1;
		}
		if (nothing_buffered(L, u, stepped))
			return 1;
	}
failed:
	lua_pushnil(L);
	lua_pushstring(L, strerror(errno));
	return 2;
}

static int transfer_decode(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	sk_frames *d = skl_check_decoder(L, 2);
	struct sk_transfer_state st;
	for (int stepped = 0;;) {
		size_t n;
		const char *p = sk_transfer_peek(u->t, &n);
		while (n > 0) {
			/* A line still arriving stays in the transfer's buffer, where the rest of it
			 * lands: handed to the decoder now, every byte of it would be copied into a
			 * second buffer per stream. It is handed over incomplete only when the
			 * transfer paused on it (a line longer than the buffer) or the body ended. */
			if (u->partial > n)
				u->partial = 0; /* read() took bytes since: nothing is known any more */
			if (sk_frames_pending(d) == 0 && !sk_transfer_paused(u->t)) {
				sk_transfer_state(u->t, &st);
				if (!st.done && sk_frames_whole(d, p, n, u->partial) == 0) {
					u->partial = n;
					break;
				}
			}
			u->partial = 0;
			const char *q = p;
			size_t left = n;
			sk_frame f;
			int r = sk_frames_decode(d, &q, &left, &f);
			/* Consuming may resume the transfer and move the buffer: re-peek after it. */
			sk_transfer_consume(u->t, n - left);
			if (r == SK_FRAMES_FRAME) {
				skl_push_frame(L, 2, &f);
				sk_frames_release(d);
				return 1;
			}
			if (r == SK_FRAMES_FAILED)
				return skl_push_decoder_failure(L, d);
			p = sk_transfer_peek(u->t, &n);
		}
		if (nothing_buffered(L, u, stepped))
			return 1;
		stepped = 1;
	}
}

static int transfer_state(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	struct sk_transfer_state st;
	sk_transfer_state(u->t, &st);
	lua_createtable(L, 0, 8);
	lua_pushboolean(L, st.sent);
	lua_setfield(L, -2, "sent");
	lua_pushboolean(L, st.headers);
	lua_setfield(L, -2, "headers");
	if (st.headers) {
		lua_pushinteger(L, st.status);
		lua_setfield(L, -2, "status");
	}
	lua_pushboolean(L, st.done);
	lua_setfield(L, -2, "done");
	lua_pushboolean(L, st.ok);
	lua_setfield(L, -2, "ok");
	lua_pushboolean(L, st.too_long);
	lua_setfield(L, -2, "too_long");
	if (st.error) {
		lua_pushstring(L, st.error);
		lua_setfield(L, -2, "error");
	}
	lua_pushinteger(L, (lua_Integer)st.received);
	lua_setfield(L, -2, "received");
	lua_pushinteger(L, (lua_Integer)st.uploaded);
	lua_setfield(L, -2, "uploaded");
	lua_pushinteger(L, (lua_Integer)st.read_size);
	lua_setfield(L, -2, "read_size");
	return 1;
}

static int transfer_feed(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	size_t len;
	const char *data = luaL_checklstring(L, 2, &len);
	long n = sk_transfer_feed(u->t, data, len);
	if (n < 0)
		return luaL_error(L, "the transfer takes no more body bytes (no body_stream, finished, "
				     "past its body_length, or out of memory)");
	lua_pushinteger(L, (lua_Integer)n);
	return 1;
}

static int transfer_feed_file(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	long n = sk_transfer_feed_fd(u->t, fileno(skc_checkfile(L, 2)));
	if (n == SK_FEED_END) {
		lua_pushnil(L);
		return 1;
	}
	if (n == SK_FEED_PAST) {
		lua_pushboolean(L, 0);
		return 1;
	}
	if (n == SK_FEED_REFUSED)
		return luaL_error(L, "the transfer takes no more body bytes (no body_stream, or finished)");
	if (n < 0) {
		lua_pushnil(L);
		lua_pushstring(L, strerror(errno));
		return 2;
	}
	lua_pushinteger(L, (lua_Integer)n);
	return 1;
}

static int transfer_finish(lua_State *L)
{
	sk_transfer_finish(check_transfer(L, 1)->t);
	return 0;
}

static int transfer_step(lua_State *L)
{
	check_transfer(L, 1);
	sk_client *c = transfer_client(L, 1);
	if (c != NULL && sk_client_step(c) < 0)
		return luaL_error(L, "libcurl's multi interface failed");
	return 0;
}

static int transfer_progress(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	lua_pushinteger(L, (lua_Integer)sk_transfer_progress(u->t));
	return 1;
}

static int transfer_headers(lua_State *L)
{
	struct transfer_ud *u = check_transfer(L, 1);
	const char *name, *value;
	size_t name_len, value_len;
	char lower[256];
	lua_newtable(L);
	for (int i = 0; sk_transfer_header(u->t, i, &name, &name_len, &value, &value_len); i++) {
		if (name_len >= sizeof lower)
			continue; /* no header the protocol reads has a name this long */
		for (size_t k = 0; k < name_len; k++)
			lower[k] = (char)tolower((unsigned char)name[k]);
		lua_pushlstring(L, lower, name_len);
		lua_pushlstring(L, value, value_len);
		lua_settable(L, -3);
	}
	return 1;
}

void skl_open_transfer(lua_State *L)
{
	static const luaL_Reg client_methods[] = {
		{ "request", client_request },
		{ "step", client_step },
		{ "pollfd", client_pollfd },
		{ "events", events },
		{ "timeout", client_timeout },
		{ "close", client_close },
		{ NULL, NULL },
	};
	static const luaL_Reg transfer_methods[] = {
		{ "read", transfer_read },
		{ "decode", transfer_decode },
		{ "state", transfer_state },
		{ "headers", transfer_headers },
		{ "progress", transfer_progress },
		{ "step", transfer_step },
		{ "pollfd", transfer_pollfd },
		{ "events", events },
		{ "timeout", transfer_timeout },
		{ "feed", transfer_feed },
		{ "feed_file", transfer_feed_file },
		{ "read_to_file", transfer_read_to_file },
		{ "finish", transfer_finish },
		{ "close", transfer_close },
		{ NULL, NULL },
	};
	skc_new_class(L, CLIENT_MT, client_methods, client_close);
	skc_new_class(L, TRANSFER_MT, transfer_methods, transfer_close);
	lua_pushcfunction(L, client_new);
	lua_setfield(L, -2, "client");
}
