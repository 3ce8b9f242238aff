/*
 * lua_fslist.c — a page of a directory's listing (docs/protocol.md §6.1), read straight into
 * the entries session:list hands out: the page can hold ten thousand entries, and reading it
 * in C costs a fraction of decoding it to a generic table first and copying it again.
 *
 *   core.list_page(text)   -- { { name=, path=, type=, size=, mode=, mtime=, target= }…,
 *                                next = cursor | nil }
 *                           | nil, why, offset (from 0): not a page this client takes
 *
 * The rules are every JSON answer's (protocol.md §4): strict JSON by json.c, no object naming a
 * member twice (json_unique.c), nesting bounded; then the page's own shape: `entries` a list of
 * objects each with a string `name`, `path` and `type` (file, dir, symlink or other), whole
 * numbers `size` and `mode`, a number `mtime`, and a string `target` or none; `next` a string or
 * null. Other members are passed over.
 *
 * A page whose objects name only the members above, each once, is known to name none twice from
 * the reading itself; only a page with another member (whose value may hold objects of its own),
 * a member named twice, or a fault, is walked again by json_unique.c, whose answer comes first,
 * as if it had run first. That second walk was a fifth of a page's reading.
 *
 * The member names and the four types are Lua strings made once (upvalues of list_page), so an
 * entry's table takes them without a string lookup each.
 */
#include <stdint.h>
#include <string.h>

#include "common/json.h"
#include "common/json_unique.h"
#include "sandkit_core.h"

/* The longest number `mtime` is read from: seconds with nanoseconds, and room to spare. */
#define MTIME_TEXT_MAX 40

struct page {
	lua_State *L;
	sk_json j;
	const char *why;
	int unsure;      /* a member the reading passed over or saw twice: json_unique.c decides */
};

/* list_page's upvalues: the member names, then the types, then "next". */
enum { UP_NAME = 1, UP_TYPE_FILE = 8, UP_NEXT = 12 };

static int refuse(struct page *pg, const char *why)
{
	if (pg->why == NULL)
		pg->why = pg->j.err ? pg->j.err : why;
	return -1;
}

/* A JSON number as a double, by hand: strtod follows the C locale's decimal point, which a
 * host application may have changed. Digits beyond what a double holds only round. */
static int read_number(struct page *pg, double *out)
{
	const char *start = pg->j.p;
	if (sk_json_skip(&pg->j) < 0)
		return refuse(pg, "mtime is no number");
	const char *p = start, *end = pg->j.p;
	if ((size_t)(end - p) > MTIME_TEXT_MAX)
		return refuse(pg, "mtime is longer than a time");
	int negative = *p == '-';
	p += negative;
	double v = 0, scale = 1;
	while (p < end && *p >= '0' && *p <= '9')
		v = v * 10 + (*p++ - '0');
	if (p < end && *p == '.') {
		for (p++; p < end && *p >= '0' && *p <= '9'; p++) {
			scale /= 10;
			v += (*p - '0') * scale;
		}
	}
	if (p < end && (*p == 'e' || *p == 'E')) {
		p++;
		int eneg = *p == '-';
		p += *p == '-' || *p == '+';
		int e = 0;
		while (p < end && *p >= '0' && *p <= '9' && e < 400)
			e = e * 10 + (*p++ - '0');
		for (; e > 0; e--)
			v = eneg ? v / 10 : v * 10;
	}
	*out = negative ? -v : v;
	return 0;
}

/* Sets the member whose name is upvalue `key` of the table on top to the string s. */
static void set_string(struct page *pg, const sk_json_str *s, int key)
{
	lua_State *L = pg->L;
	lua_pushvalue(L, lua_upvalueindex(key));
	if (!s->escaped) {
		lua_pushlstring(L, s->p, s->len);
	} else {
		skc_buffer b;
		char *out = skc_buffinitsize(L, &b, s->len);
		skc_pushresultsize(&b, sk_json_unescape(s, out));
	}
	lua_rawset(L, -3);
}

static const char *const entry_members[] = { "name", "path", "type", "size", "mode", "mtime", "target" };
static const char *const entry_types[] = { "file", "dir", "symlink", "other" };

/* One entry, pushed as a table; -1 when it is not one. */
static int read_entry(struct page *pg)
{
	lua_State *L = pg->L;
	sk_json *j = &pg->j;
	if (sk_json_peek(j) != SK_JSON_OBJECT || sk_json_object_begin(j) < 0)
		return refuse(pg, "an entry is not an object");
	lua_createtable(L, 0, 7);
	unsigned seen = 0;
	sk_json_str key;
	int more;
	while ((more = sk_json_object_key(j, &key)) == 1) {
		unsigned i = 0;
		while (i < sizeof entry_members / sizeof entry_members[0] && !sk_json_str_is(&key, entry_members[i]))
			i++;
		if (i == sizeof entry_members / sizeof entry_members[0] || (seen & (1u << i))) {
			pg->unsure = 1;
			if (sk_json_skip(j) < 0)
				return refuse(pg, "an entry is not JSON");
			continue;
		}
		seen |= 1u << i;
		if (i == 0 || i == 1 || i == 2 || i == 6) {
			sk_json_str s;
			if (sk_json_peek(j) != SK_JSON_STRING || sk_json_string(j, &s) < 0)
				return refuse(pg, "an entry's name, path, type or target is not a string");
			if (i == 2) {
				unsigned t = 0;
				while (t < sizeof entry_types / sizeof entry_types[0] && !sk_json_str_is(&s, entry_types[t]))
					t++;
				if (t == sizeof entry_types / sizeof entry_types[0])
					return refuse(pg, "an entry's type is none of file, dir, symlink, other");
				lua_pushvalue(L, lua_upvalueindex(UP_NAME + 2));
				lua_pushvalue(L, lua_upvalueindex(UP_TYPE_FILE + (int)t));
				lua_rawset(L, -3);
			} else {
				set_string(pg, &s, UP_NAME + (int)i);
			}
		} else if (i == 3 || i == 4) {
			uint64_t n;
			if (sk_json_peek(j) != SK_JSON_NUMBER || sk_json_u64(j, &n) < 0 || n > (uint64_t)INT64_MAX)
				return refuse(pg, "an entry's size or mode is not a whole number");
			lua_pushvalue(L, lua_upvalueindex(UP_NAME + (int)i));
			lua_pushinteger(L, (lua_Integer)n);
			lua_rawset(L, -3);
		} else {
			double t;
			if (sk_json_peek(j) != SK_JSON_NUMBER || read_number(pg, &t) < 0)
				return refuse(pg, "an entry's mtime is not a number");
			lua_pushvalue(L, lua_upvalueindex(UP_NAME + 5));
			lua_pushnumber(L, t);
			lua_rawset(L, -3);
		}
	}
	if (more < 0)
		return refuse(pg, "an entry is not JSON");
	if ((seen & 0x3f) != 0x3f)
		return refuse(pg, "an entry lacks a name, path, type, size, mode or mtime");
	return 0;
}

/* nil, why, offset when json_unique.c refuses the text (returns 3), else 0. */
static int refused_as_json(lua_State *L, const char *text, size_t len)
{
	sk_json_unique_report report;
	switch (sk_json_unique(text, len, &report)) {
	case SK_JSON_UNIQUE_OK:
		return 0;
	case SK_JSON_UNIQUE_REPEATED:
		lua_pushnil(L);
		lua_pushliteral(L, "an object names a member twice");
		lua_pushinteger(L, (lua_Integer)report.at);
		return 3;
	case SK_JSON_UNIQUE_UNREADABLE:
		lua_pushnil(L);
		lua_pushstring(L, report.err);
		lua_pushinteger(L, (lua_Integer)report.at);
		return 3;
	default:
		return luaL_error(L, "not enough memory to read a listing's page");
	}
}

static int list_page(lua_State *L)
{
	size_t len;
	const char *text = luaL_checklstring(L, 1, &len);
	struct page pg = { L, { 0 }, NULL, 0 };
	sk_json_init(&pg.j, text, len);
	lua_newtable(L);
	int result = lua_gettop(L);
	lua_Integer n = 0;
	int has_entries = 0, has_next = 0, more;
	sk_json_str key;
	if (sk_json_object_begin(&pg.j) < 0) {
		refuse(&pg, "the page is not an object");
		goto fail;
	}
	while ((more = sk_json_object_key(&pg.j, &key)) == 1) {
		if (sk_json_str_is(&key, "entries") && !has_entries) {
			has_entries = 1;
			if (sk_json_peek(&pg.j) != SK_JSON_ARRAY || sk_json_array_begin(&pg.j) < 0) {
				refuse(&pg, "entries is not a list");
				goto fail;
			}
			int r;
			while ((r = sk_json_array_next(&pg.j)) == 1) {
				if (read_entry(&pg) < 0)
					goto fail;
				lua_rawseti(L, result, ++n);
			}
			if (r < 0) {
				refuse(&pg, "entries is not JSON");
				goto fail;
			}
		} else if (sk_json_str_is(&key, "next") && !has_next) {
			has_next = 1;
			enum sk_json_kind kind = sk_json_peek(&pg.j);
			if (kind == SK_JSON_NULL) {
				sk_json_null(&pg.j);
				continue;
			}
			sk_json_str s;
			if (kind != SK_JSON_STRING || sk_json_string(&pg.j, &s) < 0) {
				refuse(&pg, "next is neither a string nor null");
				goto fail;
			}
			set_string(&pg, &s, UP_NEXT);
		} else {
			pg.unsure = 1;
			if (sk_json_skip(&pg.j) < 0)
				goto fail;
		}
	}
	if (more < 0 || sk_json_finish(&pg.j) < 0) {
		refuse(&pg, "the page is not JSON");
		goto fail;
	}
	if (!has_entries) {
		refuse(&pg, "the page has no entries");
		goto fail;
	}
	/* Its nil, why and offset go on top of the page made, which is let go. */
	if (pg.unsure && refused_as_json(L, text, len))
		return 3;
	lua_settop(L, result);
	return 1;
fail:
	lua_settop(L, result - 1);
	if (refused_as_json(L, text, len))
		return 3;
	lua_pushnil(L);
	lua_pushstring(L, pg.why ? pg.why : "the page is not JSON");
	lua_pushinteger(L, (lua_Integer)(pg.j.p - text));
	return 3;
}

void skl_open_fslist(lua_State *L)
{
	for (size_t i = 0; i < sizeof entry_members / sizeof entry_members[0]; i++)
		lua_pushstring(L, entry_members[i]);
	for (size_t i = 0; i < sizeof entry_types / sizeof entry_types[0]; i++)
		lua_pushstring(L, entry_types[i]);
	lua_pushliteral(L, "next");
	lua_pushcclosure(L, list_page, UP_NEXT);
	lua_setfield(L, -2, "list_page");
}
