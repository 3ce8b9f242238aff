/*
 * lua_tar.c — the C module sandkit.tar (sandkit/tar.so), Lua glue for common/tarstream.h: a
 * local directory as a tar stream, both ways, a piece at a time, for session:write_dir_from,
 * session:read_dir_to and local images. A module of its own, required where a tree moves:
 * libarchive and what it links (libxml2, ICU, the compressors) are then loaded by the programs
 * that move trees, not by every program that loads the C core.
 *
 *   local tar = require "sandkit.tar"
 *   local pack = tar.pack(dir)           -- | nil, why
 *   pack:read()                          -- the next piece (at most 64 KiB) | nil at the end
 *                                           | nil, why (the archive failed: cut it short)
 *   local unpack = tar.unpack(dir, max_entries, max_bytes)   -- | nil, why
 *   unpack:write(piece)                  -- true | nil, kind, why, entry
 *   unpack:finish()                      -- true | nil, kind, why, entry
 *                                           kind: "refused", "invalid", "too_large", "errno",
 *                                           "no_memory"; entry: the entry's path, "" for none
 *   unpack:entries(), unpack:bytes()     -- what landed so far
 *   pack:close(), unpack:close()         -- also on collection
 *   tar.MAX_ENTRIES, tar.MAX_BYTES       -- an extraction's bounds unless lowered
 *
 * Every path of an archive lands beneath dir, opened with openat2(RESOLVE_BENEATH |
 * RESOLVE_NO_SYMLINKS): an archive from a session is as hostile here as anywhere.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "common/beneath.h"
#include "common/tarstream.h"
#include "compat.h"

#define PACK_MT "sandkit.tar_pack"
#define UNPACK_MT "sandkit.tar_unpack"

struct pack {
	sk_tar *tar;
	int dirfd;
};

struct unpack {
	sk_untar *untar;
	int dirfd;
};

/* The local directory a stream comes from or goes to, opened as a directory. */
static int open_dir(lua_State *L, const char *dir)
{
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		lua_pushnil(L);
		lua_pushfstring(L, "%s: %s", dir, strerror(errno));
	}
	return fd;
}

static int pack_new(lua_State *L)
{
	const char *dir = luaL_checkstring(L, 1);
	struct pack *p = skc_newuserdata(L, sizeof *p);
	p->tar = NULL;
	p->dirfd = -1;
	luaL_setmetatable(L, PACK_MT);
	if ((p->dirfd = open_dir(L, dir)) < 0)
		return 2;
	if ((p->tar = sk_tar_new(p->dirfd, sk_open_beneath)) == NULL)
		return luaL_error(L, "out of memory");
	return 1;
}

static struct pack *check_pack(lua_State *L)
{
	struct pack *p = luaL_checkudata(L, 1, PACK_MT);
	if (p->tar == NULL)
		luaL_argerror(L, 1, "the archive is closed");
	return p;
}

static int pack_read(lua_State *L)
{
	struct pack *p = check_pack(L);
	skc_buffer b;
	char *out = skc_buffinitsize(L, &b, SK_TAR_PIECE);
	long n = sk_tar_read(p->tar, out, SK_TAR_PIECE);
	if (n > 0) {
		skc_pushresultsize(&b, (size_t)n);
		return 1;
	}
	lua_pushnil(L);
	if (n == 0)
		return 1;
	lua_pushstring(L, sk_tar_error(p->tar));
	return 2;
}

static int pack_close(lua_State *L)
{
	struct pack *p = luaL_checkudata(L, 1, PACK_MT);
	sk_tar_free(p->tar);
	p->tar = NULL;
	if (p->dirfd >= 0)
		close(p->dirfd);
	p->dirfd = -1;
	return 0;
}

static int unpack_new(lua_State *L)
{
	const char *dir = luaL_checkstring(L, 1);
	lua_Integer max_entries = luaL_checkinteger(L, 2), max_bytes = luaL_checkinteger(L, 3);
	luaL_argcheck(L, max_entries >= 0, 2, "a bound is not negative");
	luaL_argcheck(L, max_bytes >= 0, 3, "a bound is not negative");
	struct unpack *u = skc_newuserdata(L, sizeof *u);
	u->untar = NULL;
	u->dirfd = -1;
	luaL_setmetatable(L, UNPACK_MT);
	if ((u->dirfd = open_dir(L, dir)) < 0)
		return 2;
	u->untar = sk_untar_new(u->dirfd, sk_open_beneath, (uint64_t)max_entries, (uint64_t)max_bytes);
	if (u->untar == NULL)
		return luaL_error(L, "out of memory");
	return 1;
}

static struct unpack *check_unpack(lua_State *L)
{
	struct unpack *u = luaL_checkudata(L, 1, UNPACK_MT);
	if (u->untar == NULL)
		luaL_argerror(L, 1, "the extraction is closed");
	return u;
}

static int unpack_result(lua_State *L, struct unpack *u, int r)
{
	static const char *const kinds[] = { "ok", "refused", "invalid", "too_large", "errno", "no_memory" };
	if (r == 0) {
		lua_pushboolean(L, 1);
		return 1;
	}
	lua_pushnil(L);
	lua_pushstring(L, kinds[sk_untar_failure(u->untar)]);
	lua_pushstring(L, sk_untar_error(u->untar));
	lua_pushstring(L, sk_untar_entry(u->untar));
	return 4;
}

static int unpack_write(lua_State *L)
{
	struct unpack *u = check_unpack(L);
	size_t n;
	const char *s = luaL_checklstring(L, 2, &n);
	return unpack_result(L, u, sk_untar_write(u->untar, s, n));
}

static int unpack_finish(lua_State *L)
{
	struct unpack *u = check_unpack(L);
	return unpack_result(L, u, sk_untar_finish(u->untar));
}

static int unpack_entries(lua_State *L)
{
	lua_pushinteger(L, (lua_Integer)sk_untar_entries(check_unpack(L)->untar));
	return 1;
}

static int unpack_bytes(lua_State *L)
{
	lua_pushinteger(L, (lua_Integer)sk_untar_bytes(check_unpack(L)->untar));
	return 1;
}

static int unpack_close(lua_State *L)
{
	struct unpack *u = luaL_checkudata(L, 1, UNPACK_MT);
	sk_untar_free(u->untar);
	u->untar = NULL;
	if (u->dirfd >= 0)
		close(u->dirfd);
	u->dirfd = -1;
	return 0;
}

int luaopen_sandkit_tar(lua_State *L);

int luaopen_sandkit_tar(lua_State *L)
{
	static const luaL_Reg pack_methods[] = {
		{ "read", pack_read },
		{ "close", pack_close },
		{ NULL, NULL },
	};
	static const luaL_Reg unpack_methods[] = {
		{ "write", unpack_write },
		{ "finish", unpack_finish },
		{ "entries", unpack_entries },
		{ "bytes", unpack_bytes },
		{ "close", unpack_close },
		{ NULL, NULL },
	};
	skc_new_class(L, PACK_MT, pack_methods, pack_close);
	skc_new_class(L, UNPACK_MT, unpack_methods, unpack_close);
	static const luaL_Reg functions[] = {
		{ "pack", pack_new },
		{ "unpack", unpack_new },
		{ NULL, NULL },
	};
	lua_newtable(L);
	skc_setfuncs(L, functions);
	lua_pushinteger(L, (lua_Integer)SK_TAR_MAX_ENTRIES);
	lua_setfield(L, -2, "MAX_ENTRIES");
	lua_pushinteger(L, (lua_Integer)SK_TAR_MAX_BYTES);
	lua_setfield(L, -2, "MAX_BYTES");
	return 1;
}
