/*
 * compat.h — the few Lua C API differences between Lua 5.4 and LuaJIT 2.1 (Lua 5.1 ABI)
 * that the C core meets. Helpers carry an skc_ prefix so they can never collide with a symbol
 * LuaJIT already exports (luaL_setfuncs, luaL_testudata, …).
 */
#ifndef SANDKIT_COMPAT_H
#define SANDKIT_COMPAT_H

#include <stdio.h>

#include <lua.h>
#include <lauxlib.h>

/* The core builds for Lua 5.4 and for the Lua 5.1 ABI, which is LuaJIT 2.1's: a module built
 * against PUC 5.1's headers (what `luarocks --lua-version=5.1` finds on Debian) loads into
 * LuaJIT unchanged, the shims below standing in for the 5.2 auxiliary calls LuaJIT adds. 5.2
 * and 5.3 lack user values on full userdata; they are refused here in one line rather than in
 * a page of implicit-declaration errors. */
#if !(LUA_VERSION_NUM == 504 || LUA_VERSION_NUM == 501)
#error "sandkit builds for Lua 5.4 or LuaJIT 2.1 (the Lua 5.1 ABI) only"
#endif

#if LUA_VERSION_NUM >= 502
#define skc_newuserdata(L, size) lua_newuserdatauv((L), (size), 1)
#define skc_setuservalue(L, idx) lua_setiuservalue((L), (idx), 1)
#define skc_getuservalue(L, idx) ((void)lua_getiuservalue((L), (idx), 1))
#define skc_rawlen(L, idx) lua_rawlen((L), (idx))
#define skc_setfuncs(L, l) luaL_setfuncs((L), (l), 0)
#else
/* Lua 5.1 ABI: one environment table per userdata stands in for the user value. */
#define skc_newuserdata(L, size) lua_newuserdata((L), (size))
#define skc_setuservalue(L, idx) lua_setfenv((L), (idx))
#define skc_getuservalue(L, idx) lua_getfenv((L), (idx))
#define skc_rawlen(L, idx) lua_objlen((L), (idx))
/* LuaJIT 2.1 exports luaL_setfuncs; PUC 5.1 does not, so register by hand there. */
static inline void skc_setfuncs(lua_State *L, const luaL_Reg *l)
{
	for (; l->name != NULL; l++) {
		lua_pushcfunction(L, l->func);
		lua_setfield(L, -2, l->name);
	}
}
/* LuaJIT 2.1 has these two 5.2 calls and PUC 5.1 has not: a module built against PUC 5.1's
 * headers (`luarocks --lua-version=5.1`) loads into LuaJIT too, so both use these. */
static inline void skc_setmetatable(lua_State *L, const char *tname)
{
	luaL_getmetatable(L, tname);
	lua_setmetatable(L, -2);
}
static inline void *skc_testudata(lua_State *L, int ud, const char *tname)
{
	void *p = lua_touserdata(L, ud);
	if (p == NULL || !lua_getmetatable(L, ud))
		return NULL;
	luaL_getmetatable(L, tname);
	int same = lua_rawequal(L, -1, -2);
	lua_pop(L, 2);
	return same ? p : NULL;
}
#define luaL_setmetatable skc_setmetatable
#define luaL_testudata skc_testudata
#endif

/* Registers the metatable `name` (once per state): its methods as __index, and `close` as both
 * __gc and __close, so a handle is released whether it is closed, goes out of scope or is
 * collected. */
static inline void skc_new_class(lua_State *L, const char *name, const luaL_Reg *methods,
				 lua_CFunction close)
{
	static const char *const releases[] = { "__gc", "__close" };
	if (luaL_newmetatable(L, name)) {
		lua_newtable(L);
		skc_setfuncs(L, methods);
		lua_setfield(L, -2, "__index");
		for (size_t i = 0; i < sizeof releases / sizeof releases[0]; i++) {
			lua_pushcfunction(L, close);
			lua_setfield(L, -2, releases[i]);
		}
	}
	lua_pop(L, 1);
}

/* The stdio stream of an open Lua file handle (io.open's), or a Lua error. Both interpreters
 * keep it as the userdata's first member under the registry's LUA_FILEHANDLE metatable; 5.4
 * marks a closed handle by its close function, LuaJIT by the stream itself. */
#if LUA_VERSION_NUM >= 502
static inline FILE *skc_checkfile(lua_State *L, int idx)
{
	luaL_Stream *p = luaL_checkudata(L, idx, LUA_FILEHANDLE);
	if (p->closef == NULL)
		luaL_argerror(L, idx, "file is closed");
	return p->f;
}
#else
#include <lualib.h>
static inline FILE *skc_checkfile(lua_State *L, int idx)
{
	FILE **p = luaL_checkudata(L, idx, LUA_FILEHANDLE);
	if (*p == NULL)
		luaL_argerror(L, idx, "file is closed");
	return *p;
}
#endif

/* A result string of known maximum size, written in place: luaL_buffinitsize on 5.2+, a
 * scratch userdata on the 5.1 ABI (LuaJIT lacks the sized buffer calls). */
#if LUA_VERSION_NUM >= 502
typedef struct skc_buffer {
	luaL_Buffer b;
} skc_buffer;
#define skc_buffinitsize(L, B, size) luaL_buffinitsize((L), &(B)->b, (size))
#define skc_pushresultsize(B, n) luaL_pushresultsize(&(B)->b, (n))
#else
typedef struct skc_buffer {
	lua_State *L;
	char *p;
} skc_buffer;
static inline char *skc_buffinitsize(lua_State *L, skc_buffer *B, size_t size)
{
	B->L = L;
	B->p = (char *)lua_newuserdata(L, size ? size : 1);
	return B->p;
}
static inline void skc_pushresultsize(skc_buffer *B, size_t n)
{
	lua_pushlstring(B->L, B->p, n);
	lua_remove(B->L, -2);
}
#endif

#ifndef LUA_OK
#define LUA_OK 0
#endif

/* Reads an optional non-negative integer field; LuaJIT numbers are doubles, so integral
 * values up to 2^53 are accepted there and anything fractional is refused on both. */
static inline lua_Integer skc_checkinteger(lua_State *L, int idx)
{
	lua_Number n = luaL_checknumber(L, idx);
	lua_Integer i = (lua_Integer)n;
#if LUA_VERSION_NUM >= 503
	if (lua_isinteger(L, idx))
		return lua_tointeger(L, idx);
#endif
	if ((lua_Number)i != n)
		luaL_argerror(L, idx, "number has no integer representation");
	return i;
}

/* Pushes a u64 counter such as a frame's seq. Lua 5.4 keeps it exact up to 2^63-1 (the frame
 * decoder refuses anything larger); LuaJIT keeps it exact up to 2^53. */
static inline void skc_pushu64(lua_State *L, unsigned long long v)
{
	lua_pushinteger(L, (lua_Integer)v);
}

#endif
