/* capability.c — see capability.h. */
#include "capability.h"

#include "common/base64.h"
#include "common/ed25519.h"
#include "common/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A token sandkit mints is about 360 characters; one past this is not a token, and the bound
 * keeps every buffer below on the stack. */
#define CAPABILITY_TOKEN_MAX 2048
/* A Kubernetes UID is 36 characters; room for any other scheme of session names. */
#define CAPABILITY_SESSION_MAX 128
#define CAPABILITY_KID_MAX 64
/* A ring holds the current key and the next one or two; each key costs one verification of a
 * forged token, so the ring is kept small. */
#define CAPABILITY_KEYS_MAX 16
/* --public-keys with CAPABILITY_KEYS_MAX entries of the longest kind fits easily. */
#define CAPABILITY_KEYS_SPEC_MAX 4096
/* A trusted key in --public-keys: the raw Ed25519 key in standard base64 with padding. */
#define KEY_CHARS SK_B64_ENCODED_LEN(SK_ED25519_PUBLIC_BYTES)
/* An Ed25519 signature is 64 bytes: 86 characters of unpadded base64url. */
#define CAPABILITY_SIGNATURE_CHARS 86
/* The only generation Kubernetes sessions have: a recreated pod is a new session (a new UID),
 * not a new generation of the old one. */
#define CAPABILITY_GENERATION 1
/* sandkit mints tokens for at most 15 minutes; one claiming to live over an hour did not come
 * from it, and would outlive any rotation of the key that signed it. */
#define CAPABILITY_MAX_LIFETIME 3600
/* Characters of a session id and a key id: what a UID and a rotation label need, and nothing
 * that could forge a line in a log. */
#define ID_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-"

struct trusted_key {
	char kid[CAPABILITY_KID_MAX + 1];
	sk_ed25519_key *key;
};

struct capability {
	char session[CAPABILITY_SESSION_MAX + 1];
	size_t nkeys;
	struct trusted_key keys[CAPABILITY_KEYS_MAX];
};

struct claims {
	char session[CAPABILITY_SESSION_MAX + 1];
	char kid[CAPABILITY_KID_MAX + 1];
	char operation[16];
	uint64_t generation;
	int64_t expires_at;
};

static int valid_id(const char *s, size_t len, size_t max)
{
	return len > 0 && len <= max && strspn(s, ID_CHARS) >= len;
}

void capability_free(struct capability *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->nkeys; i++)
		sk_ed25519_free(c->keys[i].key);
	free(c);
}

size_t capability_key_count(const struct capability *c)
{
	return c->nkeys;
}

/* Adds one "kid:BASE64" entry of len bytes. */
static int add_key(struct capability *c, const char *entry, size_t len, char *err, size_t errlen)
{
	const char *colon = memchr(entry, ':', len);
	size_t kid_len = colon ? (size_t)(colon - entry) : 0;
	const char *b64 = colon + 1;
	size_t b64_len = len - kid_len - 1;
	unsigned char raw[SK_B64_DECODED_MAX(KEY_CHARS)];
	size_t raw_len;
	if (colon == NULL || !valid_id(entry, kid_len, CAPABILITY_KID_MAX)) {
		snprintf(err, errlen, "--public-keys entries are kid:BASE64, the kid 1 to %d of "
			 "[A-Za-z0-9._:-]", CAPABILITY_KID_MAX);
		return -1;
	}
	if (b64_len != KEY_CHARS || sk_b64_decode(b64, b64_len, raw, &raw_len) < 0 ||
	    raw_len != SK_ED25519_PUBLIC_BYTES) {
		snprintf(err, errlen, "the key of '%.*s' is not %d bytes of standard base64 (%d "
			 "characters)", (int)kid_len, entry, SK_ED25519_PUBLIC_BYTES, KEY_CHARS);
		return -1;
	}
	if (c->nkeys == CAPABILITY_KEYS_MAX) {
		snprintf(err, errlen, "--public-keys holds more than %d keys", CAPABILITY_KEYS_MAX);
		return -1;
	}
	for (size_t i = 0; i < c->nkeys; i++) {
		/* Two keys under one kid would make keyId name either. */
		if (strlen(c->keys[i].kid) == kid_len && memcmp(c->keys[i].kid, entry, kid_len) == 0) {
			snprintf(err, errlen, "--public-keys names '%.*s' twice", (int)kid_len, entry);
			return -1;
		}
	}
	struct trusted_key *k = &c->keys[c->nkeys];
	k->key = sk_ed25519_public_from_raw(raw);
	if (k->key == NULL) {
		snprintf(err, errlen, "the key of '%.*s' is not an Ed25519 public key", (int)kid_len,
			 entry);
		return -1;
	}
	memcpy(k->kid, entry, kid_len);
	k->kid[kid_len] = '\0';
	c->nkeys++;
	return 0;
}

struct capability *capability_new(const char *session_id, const char *public_keys, char *err,
				  size_t errlen)
{
	if (session_id == NULL || !valid_id(session_id, strlen(session_id), CAPABILITY_SESSION_MAX)) {
		snprintf(err, errlen, "--session-id must be 1 to %d of [A-Za-z0-9._:-]",
			 CAPABILITY_SESSION_MAX);
		return NULL;
	}
	if (public_keys == NULL || public_keys[0] == '\0') {
		snprintf(err, errlen, "--public-keys is required: kid:BASE64[,kid:BASE64...]");
		return NULL;
	}
	if (strlen(public_keys) > CAPABILITY_KEYS_SPEC_MAX) {
		snprintf(err, errlen, "--public-keys is over %d characters", CAPABILITY_KEYS_SPEC_MAX);
		return NULL;
	}
	struct capability *c = calloc(1, sizeof *c);
	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	snprintf(c->session, sizeof c->session, "%s", session_id);
	const char *p = public_keys;
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t len = comma ? (size_t)(comma - p) : strlen(p);
		if (add_key(c, p, len, err, errlen) < 0) {
			capability_free(c);
			return NULL;
		}
		if (comma == NULL)
			break;
		p = comma + 1;
	}
	return c;
}

/* Unpadded base64url (RFC 4648 §5), by mapping it onto the strict standard decoder: the same
 * rules (unused bits zero included), one decoder. Returns 0 or -1. */
static int b64url_decode(const char *in, size_t len, unsigned char *out, size_t outmax,
			 size_t *outlen)
{
	char std[CAPABILITY_TOKEN_MAX + 4];
	if (len > CAPABILITY_TOKEN_MAX || len % 4 == 1)
		return -1;
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		char ch = in[i];
		if ((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'))
			std[n++] = ch;
		else if (ch == '-')
			std[n++] = '+';
		else if (ch == '_')
			std[n++] = '/';
		else
			return -1; /* padding and the standard alphabet's own symbols included */
	}
	while (n % 4 != 0)
		std[n++] = '=';
	if (SK_B64_DECODED_MAX(n) > outmax)
		return -1;
	return sk_b64_decode(std, n, out, outlen);
}

/* Reads a string member into dst (max characters); -1 when it is not a string that fits. */
static int claim_string(sk_json *j, char *dst, size_t max)
{
	sk_json_str s;
	char buf[CAPABILITY_TOKEN_MAX];
	if (sk_json_string(j, &s) < 0 || s.len >= sizeof buf)
		return -1;
	size_t n = sk_json_unescape(&s, buf);
	if (n > max || memchr(buf, '\0', n) != NULL)
		return -1;
	memcpy(dst, buf, n);
	dst[n] = '\0';
	return 0;
}

/* The claims object: every member once, each of its type; others are ignored. */
static int parse_claims(const char *text, size_t len, struct claims *cl)
{
	enum { SESSION = 1, OPERATION = 2, GENERATION = 4, EXPIRES = 8, KID = 16, ALL = 31 };
	int seen = 0;
	sk_json j;
	sk_json_str key;
	sk_json_init(&j, text, len);
	if (sk_json_object_begin(&j) < 0)
		return -1;
	for (;;) {
		int r = sk_json_object_key(&j, &key);
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		int bit = sk_json_str_is(&key, "sessionId") ? SESSION
			: sk_json_str_is(&key, "operation") ? OPERATION
			: sk_json_str_is(&key, "generation") ? GENERATION
			: sk_json_str_is(&key, "expiresAt") ? EXPIRES
			: sk_json_str_is(&key, "keyId") ? KID : 0;
		/* A member given twice could be read either way: refused. */
		if (bit & seen)
			return -1;
		seen |= bit;
		int bad = 0;
		switch (bit) {
		case SESSION: bad = claim_string(&j, cl->session, CAPABILITY_SESSION_MAX); break;
		case OPERATION: bad = claim_string(&j, cl->operation, sizeof cl->operation - 1); break;
		case KID: bad = claim_string(&j, cl->kid, CAPABILITY_KID_MAX); break;
		case GENERATION: bad = sk_json_u64(&j, &cl->generation); break;
		case EXPIRES: bad = sk_json_i64(&j, &cl->expires_at); break;
		default: bad = sk_json_skip(&j); break;
		}
		if (bad < 0)
			return -1;
	}
	if (sk_json_finish(&j) < 0 || seen != ALL)
		return -1;
	return 0;
}

static int refuse(char *why, size_t whylen, const char *reason)
{
	snprintf(why, whylen, "%s", reason);
	return 403;
}

/* The token's verdict: 0 or 403. */
static int check_token(const struct capability *c, const char *token, size_t len, char *why,
		       size_t whylen)
{
	if (len > CAPABILITY_TOKEN_MAX)
		return refuse(why, whylen, "the token is too long");
	const char *dot = memchr(token, '.', len);
	if (dot == NULL || memchr(dot + 1, '.', len - (size_t)(dot - token) - 1) != NULL)
		return refuse(why, whylen, "the token is not two parts joined by one '.'");
	size_t payload_len = (size_t)(dot - token);
	size_t sig_chars = len - payload_len - 1;
	unsigned char sig[SK_B64_DECODED_MAX(CAPABILITY_SIGNATURE_CHARS + 2)];
	size_t sig_len;
	if (sig_chars != CAPABILITY_SIGNATURE_CHARS ||
	    b64url_decode(dot + 1, sig_chars, sig, sizeof sig, &sig_len) < 0 ||
	    sig_len != SK_ED25519_SIGNATURE_BYTES)
		return refuse(why, whylen, "the signature is not 64 bytes of base64url");
	/* The signature covers the payload's characters exactly as they arrived: nothing of the
	 * payload is decoded, let alone parsed, before a trusted key vouches for it. */
	size_t signer = c->nkeys;
	for (size_t i = 0; i < c->nkeys && signer == c->nkeys; i++)
		if (sk_ed25519_verify(c->keys[i].key, token, payload_len, sig))
			signer = i;
	if (signer == c->nkeys)
		return refuse(why, whylen, "the signature does not verify under any trusted key");

	unsigned char text[CAPABILITY_TOKEN_MAX];
	size_t text_len;
	struct claims cl;
	memset(&cl, 0, sizeof cl);
	if (b64url_decode(token, payload_len, text, sizeof text, &text_len) < 0 ||
	    parse_claims((const char *)text, text_len, &cl) < 0)
		return refuse(why, whylen, "the claims are not the JSON object a capability carries");
	if (strcmp(cl.kid, c->keys[signer].kid) != 0)
		return refuse(why, whylen, "keyId does not name the key that signed the token");
	if (strcmp(cl.session, c->session) != 0)
		return refuse(why, whylen, "the token is for another session");
	if (cl.generation != CAPABILITY_GENERATION)
		return refuse(why, whylen, "the token is for another generation of this session");
	time_t now = time(NULL);
	if (cl.expires_at <= (int64_t)now)
		return refuse(why, whylen, "the token has expired");
	if (cl.expires_at - (int64_t)now > CAPABILITY_MAX_LIFETIME)
		return refuse(why, whylen, "the token claims to live longer than an hour");
	if (strcmp(cl.operation, "execute") != 0)
		return refuse(why, whylen, "the token is for another operation");
	return 0;
}

int capability_authorize(const struct capability *c, const char *bearer, size_t bearer_len,
			 int authorization_count, const char *token, size_t token_len,
			 int token_count, char *why, size_t whylen)
{
	why[0] = '\0';
	if (token_count == 0 && authorization_count == 0)
		return 401;
	/* Two credentials of one kind are refused like a wrong one: which counts would be a
	 * guess. */
	if (token_count > 1 || (token_count == 0 && authorization_count > 1))
		return refuse(why, whylen, "more than one credential header");
	if (token_count == 0) {
		if (bearer == NULL)
			return refuse(why, whylen, "Authorization is not a Bearer capability");
		token = bearer;
		token_len = bearer_len;
	}
	return check_token(c, token, token_len, why, whylen);
}
