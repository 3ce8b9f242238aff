/*
 * lua_ed25519.c — Lua glue for ed25519.c.
 *
 *   local key = core.ed25519_key(pem)       -- a private key | nil, err (PKCS#8 PEM text)
 *   key:sign(message)                       -- the 64-byte signature
 *   key:public()                            -- the raw 32-byte public key
 *   core.ed25519_verify(public, message, signature)   -- true | false
 *
 * Misuse (a wrong type, a public key or signature of the wrong length, a message past the
 * bound) raises; a PEM that is not one Ed25519 private key is nil and the reason.
 */
#include <string.h>

#include "common/ed25519.h"
#include "sandkit_core.h"

#define KEY_MT "sandkit.ed25519"
/* Capability payloads are a few hundred bytes; a message this long is a caller's mistake. */
#define MAX_MESSAGE ((size_t)64 * 1024)

struct key_ud {
	sk_ed25519_key *k;
};

static const char *check_message(lua_State *L, int idx, size_t *len)
{
	const char *msg = luaL_checklstring(L, idx, len);
	luaL_argcheck(L, *len <= MAX_MESSAGE, idx, "message over 65536 bytes");
	return msg;
}

static int key_new(lua_State *L)
{
	size_t len;
	const char *pem = luaL_checklstring(L, 1, &len);
	struct key_ud *u = skc_newuserdata(L, sizeof *u);
	u->k = NULL;
	luaL_setmetatable(L, KEY_MT);
	char err[160];
	u->k = sk_ed25519_private_from_pem(pem, len, err, sizeof err);
	if (u->k == NULL) {
		lua_pushnil(L);
		lua_pushstring(L, err);
		return 2;
	}
	return 1;
}

static int key_gc(lua_State *L)
{
	struct key_ud *u = luaL_checkudata(L, 1, KEY_MT);
	sk_ed25519_free(u->k);
	u->k = NULL;
	return 0;
}

static sk_ed25519_key *check_key(lua_State *L)
{
	struct key_ud *u = luaL_checkudata(L, 1, KEY_MT);
	if (u->k == NULL)
		luaL_argerror(L, 1, "key is closed");
	return u->k;
}

static int key_sign(lua_State *L)
{
	sk_ed25519_key *k = check_key(L);
	size_t len;
	const char *msg = check_message(L, 2, &len);
	unsigned char sig[SK_ED25519_SIGNATURE_BYTES];
	if (sk_ed25519_sign(k, msg, len, sig) < 0)
		return luaL_error(L, "ed25519: signing failed");
	lua_pushlstring(L, (const char *)sig, sizeof sig);
	return 1;
}

static int key_public(lua_State *L)
{
	sk_ed25519_key *k = check_key(L);
	unsigned char raw[SK_ED25519_PUBLIC_BYTES];
	if (sk_ed25519_public_raw(k, raw) < 0)
		return luaL_error(L, "ed25519: the public key could not be read");
	lua_pushlstring(L, (const char *)raw, sizeof raw);
	return 1;
}

static int verify(lua_State *L)
{
	size_t publen, len, siglen;
	const char *pub = luaL_checklstring(L, 1, &publen);
	const char *msg = check_message(L, 2, &len);
	const char *sig = luaL_checklstring(L, 3, &siglen);
	luaL_argcheck(L, publen == SK_ED25519_PUBLIC_BYTES, 1, "a public key is 32 bytes");
	luaL_argcheck(L, siglen == SK_ED25519_SIGNATURE_BYTES, 3, "a signature is 64 bytes");
	sk_ed25519_key *k = sk_ed25519_public_from_raw((const unsigned char *)pub);
	if (k == NULL) {
		/* Not every 32 bytes are a point on the curve: no signature verifies under them. */
		lua_pushboolean(L, 0);
		return 1;
	}
	int ok = sk_ed25519_verify(k, msg, len, (const unsigned char *)sig);
	sk_ed25519_free(k);
	lua_pushboolean(L, ok);
	return 1;
}

void skl_open_ed25519(lua_State *L)
{
	static const luaL_Reg methods[] = {
		{ "sign", key_sign },
		{ "public", key_public },
		{ NULL, NULL },
	};
	skc_new_class(L, KEY_MT, methods, key_gc);
	lua_pushcfunction(L, key_new);
	lua_setfield(L, -2, "ed25519_key");
	lua_pushcfunction(L, verify);
	lua_setfield(L, -2, "ed25519_verify");
}
