/*
 * lua_sigv4.c — Lua glue for sigv4.c.
 *
 *   local s = core.sigv4{
 *     method = "POST", path = "/2025-09-09/microvms",  -- the path as sent, percent-encoded
 *     query = "a=1&b=2" | { name = "value" | { "value", ... } } | nil,
 *     headers = { host = "lambda.us-east-1.amazonaws.com", ["content-type"] = "application/json",
 *                 ["x-repeated"] = { "first", "second" } },   -- every header sent, all signed
 *     body = "..." | payload_hash = "UNSIGNED-PAYLOAD" | neither (an empty body),
 *     region = "us-east-1", service = "lambda",
 *     access_key = "AKID...", secret_key = "...", session_token = nil | "...",
 *     time = 1440938160,                       -- Unix seconds, an integer
 *     content_sha256_header = false,           -- add and sign x-amz-content-sha256 (S3)
 *     double_encode_path = true,               -- false for S3
 *     normalize_path = true,                   -- false for S3
 *     sign_session_token = true,               -- false only for services that want it unsigned
 *   }
 *   --> { authorization = , ["x-amz-date"] = , ["x-amz-security-token"] = (with a token),
 *         ["x-amz-content-sha256"] = (when asked), canonical_request = , string_to_sign = ,
 *         signature = , signed_headers = , query = (the canonical query: send exactly this) }
 *
 *   core.sha256_hex(s) --> 64 lowercase hex digits
 *
 * Misuse (a wrong type, an unknown option, a value sigv4.c refuses) raises "sigv4: ..."; no
 * message ever contains a credential. Every string handed to sigv4.c stays on the Lua stack
 * until it returns, and the workspace is a userdata, so nothing leaks when Lua raises.
 */
#include <string.h>
#include <strings.h>

#include "common/sigv4.h"
#include "sandkit_core.h"

static const char *const options[] = {
	"method", "path", "query", "headers", "body", "payload_hash", "region", "service",
	"access_key", "secret_key", "session_token", "time", "content_sha256_header",
	"double_encode_path", "normalize_path", "sign_session_token", NULL
};

static void check_options(lua_State *L)
{
	luaL_checkstack(L, 3, "sigv4: options");
	lua_pushnil(L);
	while (lua_next(L, 1) != 0) {
		int known = 0;
		lua_pop(L, 1);
		if (lua_type(L, -1) == LUA_TSTRING)
			for (const char *const *o = options; *o != NULL && !known; o++)
				known = strcmp(lua_tostring(L, -1), *o) == 0;
		if (!known) {
			if (lua_type(L, -1) == LUA_TSTRING)
				luaL_error(L, "sigv4: unknown option '%s'", lua_tostring(L, -1));
			luaL_error(L, "sigv4: option names must be strings");
		}
	}
}

/* Leaves options[field] on the stack (keeping it alive) and returns it, or NULL when nil. */
static const char *field_string(lua_State *L, const char *field, int required, size_t *len)
{
	luaL_checkstack(L, 1, "sigv4: options");
	lua_getfield(L, 1, field);
	if (lua_isnil(L, -1) && !required) {
		*len = 0;
		return NULL;
	}
	if (lua_type(L, -1) != LUA_TSTRING)
		luaL_error(L, "sigv4: %s must be a string", field);
	return lua_tolstring(L, -1, len);
}

static int field_bool(lua_State *L, const char *field, int dflt)
{
	int v = dflt;
	luaL_checkstack(L, 1, "sigv4: options");
	lua_getfield(L, 1, field);
	if (lua_type(L, -1) == LUA_TBOOLEAN)
		v = lua_toboolean(L, -1);
	else if (!lua_isnil(L, -1))
		luaL_error(L, "sigv4: %s must be a boolean", field);
	lua_pop(L, 1);
	return v;
}

static int64_t field_time(lua_State *L)
{
	int64_t t = -1;
	luaL_checkstack(L, 1, "sigv4: options");
	lua_getfield(L, 1, "time");
	if (lua_type(L, -1) != LUA_TNUMBER)
		luaL_error(L, "sigv4: time must be an integer (Unix seconds)");
#if LUA_VERSION_NUM >= 503
	if (lua_isinteger(L, -1)) {
		lua_Integer i = lua_tointeger(L, -1);
		t = i >= 0 && i <= SK_SIGV4_MAX_TIME ? (int64_t)i : -1;
	} else
#endif
	{
		/* LuaJIT has only doubles; refuse a fraction rather than round it. The range is checked
		 * before the conversion, which is undefined for a double out of int64_t's range. */
		lua_Number n = lua_tonumber(L, -1);
		if (n >= 0 && n <= (lua_Number)SK_SIGV4_MAX_TIME && n == (lua_Number)(int64_t)n)
			t = (int64_t)n;
	}
	if (t < 0)
		luaL_error(L, "sigv4: %s", sk_sigv4_strerror(SK_SIGV4_ETIME));
	lua_pop(L, 1);
	return t;
}

/*
 * Reads the table at stack index t, { name = "value" | { "value", ... } }, into pairs (at most
 * max; the same name's values in list order). Keys, values and list items stay on the stack.
 * When owner is not NULL, owner[i] numbers the table key that pair i came from. Returns how
 * many pairs there are.
 */
static size_t read_pairs(lua_State *L, int t, const char *what, sk_sigv4_pair *pairs, int *owner,
                         size_t max, int too_many)
{
	size_t n = 0;
	int key = 0;

	luaL_checkstack(L, 1, "sigv4: options");
	lua_pushnil(L);
	while (lua_next(L, t) != 0) {
		size_t name_len, items = 1;
		int list = lua_type(L, -1) == LUA_TTABLE;
		if (lua_type(L, -2) != LUA_TSTRING)
			luaL_error(L, "sigv4: %s names must be strings", what);
		const char *name = lua_tolstring(L, -2, &name_len);
		if (list) {
			items = skc_rawlen(L, -1);
			if (items == 0)
				luaL_error(L, "sigv4: %s '%s' has an empty list of values", what, name);
		} else if (lua_type(L, -1) != LUA_TSTRING) {
			luaL_error(L, "sigv4: %s '%s' must be a string or a list of strings", what, name);
		}
		for (size_t i = 1; i <= items; i++) {
			if (n == max)
				luaL_error(L, "sigv4: %s", sk_sigv4_strerror(too_many));
			luaL_checkstack(L, 1, "sigv4: too many values");
			if (list)
				lua_rawgeti(L, -1 - (int)(i - 1), (int)i);
			else
				lua_pushvalue(L, -1);
			if (lua_type(L, -1) != LUA_TSTRING)
				luaL_error(L, "sigv4: %s '%s' must be a string or a list of strings", what,
				           name);
			pairs[n].name = name;
			pairs[n].name_len = name_len;
			pairs[n].value = lua_tolstring(L, -1, &pairs[n].value_len);
			if (owner != NULL)
				owner[n] = key;
			n++;
		}
		key++;
		/* Keep this key and its items pinned; iterate on with a copy of the key. */
		luaL_checkstack(L, 1, "sigv4: too many values");
		lua_pushvalue(L, -(int)items - 2);
	}
	return n;
}

static int l_sigv4(lua_State *L)
{
	sk_sigv4_request req;
	sk_sigv4_pair headers[SK_SIGV4_MAX_HEADERS], params[SK_SIGV4_MAX_PARAMS];
	int header_owner[SK_SIGV4_MAX_HEADERS];
	size_t body_len;
	const char *body;

	luaL_checktype(L, 1, LUA_TTABLE);
	lua_settop(L, 1);
	check_options(L);
	memset(&req, 0, sizeof req);

	req.method = field_string(L, "method", 1, &req.method_len);
	req.path = field_string(L, "path", 1, &req.path_len);
	req.region = field_string(L, "region", 1, &req.region_len);
	req.service = field_string(L, "service", 1, &req.service_len);
	req.access_key = field_string(L, "access_key", 1, &req.access_key_len);
	req.secret_key = field_string(L, "secret_key", 1, &req.secret_key_len);
	req.session_token = field_string(L, "session_token", 0, &req.session_token_len);
	req.payload_hash = field_string(L, "payload_hash", 0, &req.payload_hash_len);
	body = field_string(L, "body", 0, &body_len);
	if (body != NULL && req.payload_hash != NULL)
		luaL_error(L, "sigv4: give body or payload_hash, not both");
	req.body = (const unsigned char *)body;
	req.body_len = body_len;
	req.time = field_time(L);

	if (field_bool(L, "double_encode_path", 1))
		req.flags |= SK_SIGV4_DOUBLE_ENCODE_PATH;
	if (field_bool(L, "normalize_path", 1))
		req.flags |= SK_SIGV4_NORMALIZE_PATH;
	if (field_bool(L, "content_sha256_header", 0))
		req.flags |= SK_SIGV4_CONTENT_SHA256_HEADER;
	if (!field_bool(L, "sign_session_token", 1))
		req.flags |= SK_SIGV4_UNSIGNED_SESSION_TOKEN;

	luaL_checkstack(L, 1, "sigv4: options");
	lua_getfield(L, 1, "query");
	if (lua_type(L, -1) == LUA_TSTRING) {
		req.query = lua_tolstring(L, -1, &req.query_len);
	} else if (lua_type(L, -1) == LUA_TTABLE) {
		req.nparams = read_pairs(L, lua_gettop(L), "query parameter", params, NULL,
		                         SK_SIGV4_MAX_PARAMS, SK_SIGV4_EQUERY);
		req.params = params;
	} else if (!lua_isnil(L, -1)) {
		luaL_error(L, "sigv4: query must be a string or a table");
	}

	luaL_checkstack(L, 1, "sigv4: options");
	lua_getfield(L, 1, "headers");
	if (lua_type(L, -1) != LUA_TTABLE)
		luaL_error(L, "sigv4: headers must be a table");
	req.nheaders = read_pairs(L, lua_gettop(L), "header", headers, header_owner,
	                          SK_SIGV4_MAX_HEADERS, SK_SIGV4_EHEADERS);
	req.headers = headers;
	/* Two keys naming one header ("Host" and "host") have no order between them, so the
	 * signature would depend on table traversal: make the caller give one name and a list. */
	for (size_t i = 0; i < req.nheaders; i++)
		for (size_t j = i + 1; j < req.nheaders; j++)
			if (header_owner[i] != header_owner[j] && headers[i].name_len == headers[j].name_len &&
			    strncasecmp(headers[i].name, headers[j].name, headers[i].name_len) == 0)
				luaL_error(L, "sigv4: headers '%s' and '%s' differ only in case; give one "
				              "name with a list of values", headers[i].name, headers[j].name);

	int rc = sk_sigv4_check(&req);
	if (rc != SK_SIGV4_OK)
		luaL_error(L, "sigv4: %s", sk_sigv4_strerror(rc));
	size_t ws_size = sk_sigv4_workspace_size(&req);
	luaL_checkstack(L, 3, "sigv4: result");
	char *ws = lua_newuserdata(L, ws_size);
	sk_sigv4_result res;
	rc = sk_sigv4_sign(&req, ws, ws_size, &res);
	if (rc != SK_SIGV4_OK)
		luaL_error(L, "sigv4: %s", sk_sigv4_strerror(rc));

	lua_createtable(L, 0, 10);
	lua_pushlstring(L, res.authorization, res.authorization_len);
	lua_setfield(L, -2, "authorization");
	lua_pushlstring(L, res.amz_date, 16);
	lua_setfield(L, -2, "x-amz-date");
	if (req.session_token != NULL) {
		lua_pushlstring(L, req.session_token, req.session_token_len);
		lua_setfield(L, -2, "x-amz-security-token");
	}
	if (req.flags & SK_SIGV4_CONTENT_SHA256_HEADER) {
		lua_pushlstring(L, res.payload_hash, res.payload_hash_len);
		lua_setfield(L, -2, "x-amz-content-sha256");
	}
	lua_pushlstring(L, res.canonical_request, res.canonical_request_len);
	lua_setfield(L, -2, "canonical_request");
	lua_pushlstring(L, res.string_to_sign, res.string_to_sign_len);
	lua_setfield(L, -2, "string_to_sign");
	lua_pushlstring(L, res.signature, 64);
	lua_setfield(L, -2, "signature");
	lua_pushlstring(L, res.signed_headers, res.signed_headers_len);
	lua_setfield(L, -2, "signed_headers");
	lua_pushlstring(L, res.canonical_query, res.canonical_query_len);
	lua_setfield(L, -2, "query");
	return 1;
}

static int l_sha256_hex(lua_State *L)
{
	size_t len;
	const char *s = luaL_checklstring(L, 1, &len);
	char hex[65];
	if (sk_sha256_hex(s, len, hex) != 0)
		return luaL_error(L, "sha256_hex: %s", sk_sigv4_strerror(SK_SIGV4_ECRYPTO));
	lua_pushlstring(L, hex, 64);
	return 1;
}

void skl_open_sigv4(lua_State *L)
{
	static const luaL_Reg fns[] = {
		{ "sigv4", l_sigv4 },
		{ "sha256_hex", l_sha256_hex },
		{ NULL, NULL },
	};
	skc_setfuncs(L, fns);
}
