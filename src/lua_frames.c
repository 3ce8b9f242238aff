/*
 * lua_frames.c — Lua glue for frames.c and base64.c.
 *
 *   local dec = core.decoder([max_line [, keep_base64]])
 *                              -- keep_base64: output frames carry `base64` (the wire's text,
 *                                 checked) instead of `data` (see sk_frames_keep_base64)
 *   dec:binary()               -- the body is in the binary syntax (docs/protocol.md §6
 *                                 binaryFrames), not NDJSON; before the first feed()
 *   dec:admit(kind)            -- the stream also takes frames of this kind: "keepalive" (asked
 *                                 of the agent, consumed here and never returned; without
 *                                 it a keep-alive fails the stream as an unknown kind does)
 *   dec:expect(kind, ...)      -- the stream takes frames of these kinds only ("stdout",
 *                                 "stderr", "exit", "error", "event", "end"); without it, an
 *                                 exec stream's four (see sk_frames_expect)
 *   dec:feed(chunk)            -- hand over bytes; call after next() returned false
 *   dec:next()                 -- frame table | false (needs more) | nil, kind, message
 *   dec:pending()              -- bytes of an unterminated line held back
 *   core.b64encode(s)          -- string
 *   core.b64decode(s)          -- string | nil, offset-of-first-bad-symbol
 *   core.json_unique(s)        -- true: no object of the JSON text s names a member twice
 *                                 | false, name, offset: one does (name unescaped; offset of
 *                                   the later naming's quote, from 0)
 *                                 | nil, why, offset: s is not one JSON value (json_unique.h)
 */
#include <stdlib.h>
#include <string.h>

#include "common/base64.h"
#include "common/frames.h"
#include "common/json_unique.h"
#include "sandkit_core.h"

#define DECODER_MT "sandkit.decoder"

/*
 * (Said of lines, as NDJSON has them; a binary frame still arriving is treated alike.)
 * A chunk's unterminated last line is left in the chunk (anchored until the next feed()) and
 * gathered into the decoder's line buffer only then, with the rest of the line; the frame it
 * makes is taken at once and the buffer released (sk_frames_release). So between frames, when
 * a relay in nginx waits on its HTTP client with every stream at once, a stream holds no line
 * buffer; and while it waits for more bytes it holds the chunk it has, not a copy of it too
 * (a line spread over three chunks or more keeps the earlier ones gathered).
 */
struct decoder {
	sk_frames *d;
	const char *input; /* the unread part of the last fed chunk, anchored in the user value */
	size_t input_len;
	int input_held;    /* next() found the rest of the input to end no frame: it waits there */
	size_t max_line;
	int keep_base64;   /* core.decoder's second argument */
	int encode_output; /* binary and keep_base64: output frames are encoded (relay_base64) */
};

/*
 * The decoder's metatable is upvalue 1 of each method, so a method knows its decoder by one
 * comparison of metatables rather than luaL_checkudata's look-up of the type's name in the
 * registry: next() runs once per frame, and a frame of a short line costs a few hundred ns.
 * The metatable also holds the names a frame's table is built with, at the FRAME_KEY_ indices
 * below, so that building it hashes no C string (lua_setfield's look-up of its key).
 */
enum { FRAME_KEY_TYPE = 1, FRAME_KEY_SEQ, FRAME_KEY_DATA, FRAME_KEY_BASE64, FRAME_KEY_STDOUT,
       FRAME_KEY_STDERR, FRAME_KEYS };
static const char *const frame_key_names[FRAME_KEYS] = { NULL, "type", "seq", "data", "base64",
							 "stdout", "stderr" };

static struct decoder *check_method(lua_State *L)
{
	struct decoder *u = lua_touserdata(L, 1);
	int same = u != NULL && lua_getmetatable(L, 1) && lua_rawequal(L, -1, lua_upvalueindex(1));
	if (u != NULL)
		lua_pop(L, 1);
	if (!same)
		u = luaL_checkudata(L, 1, DECODER_MT); /* raises the usual error */
	if (u->d == NULL)
		luaL_argerror(L, 1, "decoder is closed");
	return u;
}

static struct decoder *check(lua_State *L, int idx)
{
	struct decoder *u = luaL_checkudata(L, idx, DECODER_MT);
	if (u->d == NULL)
		luaL_argerror(L, idx, "decoder is closed");
	return u;
}

sk_frames *skl_check_decoder(lua_State *L, int idx)
{
	return check(L, idx)->d;
}

/* Sets t[k] = v, t and v on top of the stack, k one of the names the metatable at mt holds. */
static void set_frame_key(lua_State *L, int mt, int k)
{
	lua_rawgeti(L, mt, k);
	lua_insert(L, -2);
	lua_rawset(L, -3);
}

/*
 * Room for the base64 of a relay's binary output frames, one per Lua state, in the registry: a
 * frame is encoded there and copied into its Lua string at once, and a state runs one frame at
 * a time, so one room of the longest frame's size serves every stream. Room of each decoder's,
 * given back after each frame (as the decoders' other room is, to keep a stream's memory low
 * between frames), cost a malloc and a free of about 87 KB per frame, and when that block lay
 * at the top of glibc's heap, a brk to grow it and one to shrink it (bench/RESULTS.md).
 */
static const char relay_room_key = 0;

/* Pushes the base64 of f's data as a string. */
static void push_relay_base64(lua_State *L, const sk_frame *f)
{
	size_t n = SK_B64_ENCODED_LEN(f->data_len);
	lua_pushlightuserdata(L, (void *)&relay_room_key);
	lua_rawget(L, LUA_REGISTRYINDEX);
	char *room = lua_touserdata(L, -1);
	if (room == NULL || skc_rawlen(L, -1) < n) {
		lua_pop(L, 1);
		room = lua_newuserdata(L, n ? n : 1);
		lua_pushlightuserdata(L, (void *)&relay_room_key);
		lua_pushvalue(L, -2);
		lua_rawset(L, LUA_REGISTRYINDEX);
	}
	sk_b64_encode(f->data, f->data_len, room);
	lua_pushlstring(L, room, n);
	lua_remove(L, -2);
}

void skl_push_frame(lua_State *L, int decoder, const sk_frame *f)
{
	if (f->type == SK_FRAME_STDOUT || f->type == SK_FRAME_STDERR) {
		/* The frame nearly every stream is made of, built with the metatable's names. */
		const struct decoder *u = lua_touserdata(L, decoder);
		lua_getmetatable(L, decoder);
		int mt = lua_gettop(L);
		lua_createtable(L, 0, 3);
		lua_rawgeti(L, mt, f->type == SK_FRAME_STDOUT ? FRAME_KEY_STDOUT : FRAME_KEY_STDERR);
		set_frame_key(L, mt, FRAME_KEY_TYPE);
		skc_pushu64(L, f->seq);
		set_frame_key(L, mt, FRAME_KEY_SEQ);
		if (u->encode_output) {
			push_relay_base64(L, f);
			set_frame_key(L, mt, FRAME_KEY_BASE64);
		} else {
			lua_pushlstring(L, (const char *)f->data, f->data_len);
			set_frame_key(L, mt, f->data_is_base64 ? FRAME_KEY_BASE64 : FRAME_KEY_DATA);
		}
		lua_remove(L, mt);
		return;
	}
	switch (f->type) {
	case SK_FRAME_STDOUT:
	case SK_FRAME_STDERR:
		break; /* above */
	case SK_FRAME_EXIT:
		lua_createtable(L, 0, 5);
		lua_pushliteral(L, "exit");
		lua_setfield(L, -2, "type");
		lua_pushinteger(L, f->code);
		lua_setfield(L, -2, "code");
		lua_pushboolean(L, f->truncated);
		lua_setfield(L, -2, "truncated");
		if (f->has_signal) {
			lua_pushinteger(L, f->signal);
			lua_setfield(L, -2, "signal");
		}
		if (f->oom) {
			lua_pushboolean(L, 1);
			lua_setfield(L, -2, "oom");
		}
		break;
	case SK_FRAME_ERROR:
		lua_createtable(L, 0, 3);
		lua_pushliteral(L, "error");
		lua_setfield(L, -2, "type");
		lua_pushlstring(L, f->error_code, f->error_code_len);
		lua_setfield(L, -2, "code");
		lua_pushlstring(L, f->message, f->message_len);
		lua_setfield(L, -2, "message");
		break;
	case SK_FRAME_KEEPALIVE:
		/* sk_frames_decode consumes keep-alives; the case only keeps the switch whole. */
		lua_pushnil(L);
		break;
	case SK_FRAME_EVENT:
		lua_createtable(L, 0, 4);
		lua_pushliteral(L, "event");
		lua_setfield(L, -2, "type");
		lua_pushlstring(L, f->event, f->event_len);
		lua_setfield(L, -2, "event");
		if (f->path) {
			lua_pushlstring(L, f->path, f->path_len);
			lua_setfield(L, -2, "path");
		}
		if (f->from) {
			lua_pushlstring(L, f->from, f->from_len);
			lua_setfield(L, -2, "from");
		}
		break;
	case SK_FRAME_END:
		lua_createtable(L, 0, 2);
		lua_pushliteral(L, "end");
		lua_setfield(L, -2, "type");
		lua_pushlstring(L, f->reason, f->reason_len);
		lua_setfield(L, -2, "reason");
		break;
	}
}

int skl_push_decoder_failure(lua_State *L, const sk_frames *d)
{
	static const char *const kinds[] = { "none", "unparsable", "undecodable", "too_long",
		                             "no_memory" };
	lua_pushnil(L);
	lua_pushstring(L, kinds[sk_frames_failure(d)]);
	lua_pushstring(L, sk_frames_error(d));
	return 3;
}

static int decoder_new(lua_State *L)
{
	lua_Integer max_line = lua_isnoneornil(L, 1) ? 0 : skc_checkinteger(L, 1);
	luaL_argcheck(L, max_line >= 0, 1, "max_line must not be negative");
	int keep_base64 = lua_toboolean(L, 2);
	struct decoder *u = skc_newuserdata(L, sizeof *u);
	memset(u, 0, sizeof *u);
	luaL_setmetatable(L, DECODER_MT);
	u->d = sk_frames_new((size_t)max_line);
	if (u->d == NULL)
		return luaL_error(L, "out of memory");
	u->max_line = max_line ? (size_t)max_line : SK_FRAMES_MAX_LINE;
	u->keep_base64 = keep_base64;
	if (keep_base64)
		sk_frames_keep_base64(u->d);
	return 1;
}

static int decoder_binary(lua_State *L)
{
	struct decoder *u = check_method(L);
	/* A syntax changed mid-body would read what came under one as the other. */
	luaL_argcheck(L, u->input_len == 0 && sk_frames_pending(u->d) == 0, 1,
		      "the syntax is chosen before the first feed()");
	sk_frames_binary(u->d);
	u->encode_output = u->keep_base64;
	return 0;
}

static int decoder_admit(lua_State *L)
{
	struct decoder *u = check_method(L);
	/* The kinds beyond the default a stream may ask for; output, exit and error are always
	 * taken. */
	static const char *const names[] = { "keepalive", NULL };
	static const enum sk_frame_type kinds[] = { SK_FRAME_KEEPALIVE };
	int i = luaL_checkoption(L, 2, NULL, names);
	sk_frames_admit(u->d, SK_FRAMES_KIND(kinds[i]));
	return 0;
}

static int decoder_expect(lua_State *L)
{
	struct decoder *u = check_method(L);
	/* The kinds a stream may take in place of the default (keep-alives are admit's). */
	static const char *const names[] = { "stdout", "stderr", "exit", "error", "event", "end", NULL };
	static const enum sk_frame_type kinds[] = { SK_FRAME_STDOUT, SK_FRAME_STDERR, SK_FRAME_EXIT,
						    SK_FRAME_ERROR, SK_FRAME_EVENT, SK_FRAME_END };
	unsigned set = 0;
	int n = lua_gettop(L);
	luaL_argcheck(L, n >= 2, 2, "a stream takes at least one kind of frame");
	for (int i = 2; i <= n; i++)
		set |= SK_FRAMES_KIND(kinds[luaL_checkoption(L, i, NULL, names)]);
	sk_frames_expect(u->d, set);
	return 0;
}

static int decoder_feed(lua_State *L)
{
	struct decoder *u = check_method(L);
	size_t len;
	const char *s = luaL_checklstring(L, 2, &len);
	if (u->input_len > 0) {
		/* What next() left of the last chunk is the start of a frame, gathered now while that
		 * chunk is still anchored (a failure is next()'s to report). Until then it waited
		 * where it lay: a stream spends its waits there, and the chunk is held anyway. Fed
		 * again before next() ran out of the chunk, a whole line may be left, which would be
		 * handed out after later ones. */
		if (!u->input_held && sk_frames_whole(u->d, u->input, u->input_len, 0) > 0)
			return luaL_error(L, "feed() before next() has used up the previous chunk");
		(void)sk_frames_gather(u->d, u->input, u->input_len);
		u->input_len = 0;
	}
	lua_pushvalue(L, 2);
	skc_setuservalue(L, 1);
	u->input = s;
	u->input_len = len;
	u->input_held = 0;
	return 0;
}

static int decoder_next(lua_State *L)
{
	struct decoder *u = check_method(L);
	if (u->input_held) {
		lua_pushboolean(L, 0);
		return 1;
	}
	sk_frame f;
	/* Lines are found forwards, each by the one scan that parses it; an unterminated last
	 * line stays in its chunk until the next feed(), unless it is already over the limit,
	 * which is reported now. */
	int r = sk_frames_decode_whole(u->d, &u->input, &u->input_len, &f);
	if (r == SK_FRAMES_FRAME) {
		skl_push_frame(L, 1, &f);
		sk_frames_release(u->d);
		/* A chunk used up is let go now rather than at the next feed(): a relay's stream
		 * waits on its client right after this frame, and would hold the chunk meanwhile. */
		if (u->input_len == 0) {
			/* A string, as feed() anchors: under LuaJIT the user value is the
			 * environment, which must be an object, never nil. */
			lua_pushliteral(L, "");
			skc_setuservalue(L, 1);
		}
		return 1;
	}
	if (r == SK_FRAMES_FAILED) {
		u->input_len = 0; /* nothing after a failure is ever read */
		return skl_push_decoder_failure(L, u->d);
	}
	u->input_held = u->input_len > 0;
	lua_pushboolean(L, 0);
	return 1;
}

static int decoder_pending(lua_State *L)
{
	struct decoder *u = check_method(L);
	lua_pushinteger(L, (lua_Integer)(sk_frames_pending(u->d) + u->input_len));
	return 1;
}

static int decoder_close(lua_State *L)
{
	struct decoder *u = luaL_checkudata(L, 1, DECODER_MT);
	sk_frames_free(u->d);
	u->d = NULL;
	u->input_len = 0;
	u->input_held = 0;
	return 0;
}

static int b64encode(lua_State *L)
{
	size_t len;
	const char *s = luaL_checklstring(L, 1, &len);
	if (len > ((size_t)-1) / 4 * 3 - 3)
		return luaL_error(L, "string too long to encode");
	skc_buffer b;
	char *out = skc_buffinitsize(L, &b, SK_B64_ENCODED_LEN(len));
	sk_b64_encode((const unsigned char *)s, len, out);
	skc_pushresultsize(&b, SK_B64_ENCODED_LEN(len));
	return 1;
}

static int b64decode(lua_State *L)
{
	size_t len, n;
	const char *s = luaL_checklstring(L, 1, &len);
	skc_buffer b;
	unsigned char *out = (unsigned char *)skc_buffinitsize(L, &b, SK_B64_DECODED_MAX(len) + 1);
	if (sk_b64_decode(s, len, out, &n) < 0) {
		lua_pushnil(L);
		lua_pushinteger(L, (lua_Integer)n);
		return 2;
	}
	skc_pushresultsize(&b, n);
	return 1;
}

static int json_unique(lua_State *L)
{
	size_t len;
	const char *s = luaL_checklstring(L, 1, &len);
	sk_json_unique_report report;
	switch (sk_json_unique(s, len, &report)) {
	case SK_JSON_UNIQUE_OK:
		lua_pushboolean(L, 1);
		return 1;
	case SK_JSON_UNIQUE_REPEATED: {
		skc_buffer b;
		lua_pushboolean(L, 0);
		char *name = skc_buffinitsize(L, &b, report.name.len);
		skc_pushresultsize(&b, sk_json_unescape(&report.name, name));
		lua_pushinteger(L, (lua_Integer)report.at);
		return 3;
	}
	case SK_JSON_UNIQUE_UNREADABLE:
		lua_pushnil(L);
		lua_pushstring(L, report.err);
		lua_pushinteger(L, (lua_Integer)report.at);
		return 3;
	default:
		return luaL_error(L, "not enough memory to check a JSON text's member names");
	}
}

void skl_open_frames(lua_State *L)
{
	static const luaL_Reg methods[] = {
		{ "binary", decoder_binary },
		{ "admit", decoder_admit },
		{ "expect", decoder_expect },
		{ "feed", decoder_feed },
		{ "next", decoder_next },
		{ "pending", decoder_pending },
		{ "close", decoder_close },
		{ NULL, NULL },
	};
	if (luaL_newmetatable(L, DECODER_MT)) {
		for (int k = FRAME_KEY_TYPE; k < FRAME_KEYS; k++) {
			lua_pushstring(L, frame_key_names[k]);
			lua_rawseti(L, -2, k);
		}
		lua_newtable(L);
		for (const luaL_Reg *m = methods; m->name != NULL; m++) {
			lua_pushvalue(L, -2);
			lua_pushcclosure(L, m->func, 1);
			lua_setfield(L, -2, m->name);
		}
		lua_setfield(L, -2, "__index");
		lua_pushcfunction(L, decoder_close);
		lua_setfield(L, -2, "__gc");
		lua_pushcfunction(L, decoder_close);
		lua_setfield(L, -2, "__close");
	}
	lua_pop(L, 1);
	static const luaL_Reg functions[] = {
		{ "decoder", decoder_new },
		{ "b64encode", b64encode },
		{ "b64decode", b64decode },
		{ "json_unique", json_unique },
		{ NULL, NULL },
	};
	skc_setfuncs(L, functions);
}
