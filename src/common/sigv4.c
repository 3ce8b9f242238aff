/* sigv4.c — see sigv4.h. */
#include "sigv4.h"

#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

static const char hexdigits[] = "0123456789abcdef";
static const char HEXDIGITS[] = "0123456789ABCDEF";

/* RFC 3986 unreserved: the only bytes SigV4 leaves unencoded in a path segment or a query. */
static int is_unreserved(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '.' || c == '_' || c == '~';
}

/* RFC 9110 tchar: what a method and a header name are made of. */
static int is_tchar(unsigned char c)
{
	return is_unreserved(c) || (c != '\0' && strchr("!#$%&'*+^`|", c) != NULL);
}

static int is_ctl(unsigned char c)
{
	return c < 0x20 || c == 0x7f;
}

static int hexval(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

static unsigned char lower(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

/* Case-insensitive (ASCII) equality of a header name with a lowercase literal. */
static int name_is(const sk_sigv4_pair *h, const char *lit)
{
	size_t n = strlen(lit);
	if (h->name_len != n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (lower((unsigned char)h->name[i]) != (unsigned char)lit[i])
			return 0;
	return 1;
}

/* ---- checking --------------------------------------------------------------------------- */

static int check_scope_part(const char *s, size_t n)
{
	if (s == NULL || n == 0 || n > SK_SIGV4_MAX_SCOPE_PART)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (!is_unreserved((unsigned char)s[i]) || s[i] == '~')
			return -1;
	return 0;
}

/* Pieces of a raw query string that carry a parameter (empty ones, as in "a=1&&b=2", do not). */
static size_t count_query_params(const char *q, size_t n)
{
	size_t count = 0, i = 0;
	while (i < n) {
		size_t j = i;
		while (j < n && q[j] != '&')
			j++;
		if (j > i)
			count++;
		i = j + 1;
	}
	return count;
}

static int check_headers(const sk_sigv4_request *r)
{
	size_t total = 0;
	int host = 0;

	if (r->nheaders > SK_SIGV4_MAX_HEADERS || (r->nheaders > 0 && r->headers == NULL))
		return SK_SIGV4_EHEADERS;
	for (size_t i = 0; i < r->nheaders; i++) {
		const sk_sigv4_pair *h = &r->headers[i];
		if (h->name == NULL || h->name_len == 0 || h->name_len > SK_SIGV4_MAX_HEADER_NAME)
			return SK_SIGV4_EHEADER_NAME;
		for (size_t k = 0; k < h->name_len; k++)
			if (!is_tchar((unsigned char)h->name[k]))
				return SK_SIGV4_EHEADER_NAME;
		if ((h->value == NULL && h->value_len > 0) || h->value_len > SK_SIGV4_MAX_HEADER_VALUE)
			return SK_SIGV4_EHEADER_VALUE;
		/* CR and LF would let a value smuggle a header into the request that is sent. */
		for (size_t k = 0; k < h->value_len; k++)
			if (is_ctl((unsigned char)h->value[k]) && h->value[k] != '\t')
				return SK_SIGV4_EHEADER_VALUE;
		total += h->name_len + h->value_len;
		if (total > SK_SIGV4_MAX_HEADER_BYTES)
			return SK_SIGV4_EHEADERS;
		if (name_is(h, "host"))
			host = 1;
		/* Headers the signer writes itself, or that cannot sign themselves. */
		if (name_is(h, "x-amz-date") || name_is(h, "authorization") ||
		    (r->session_token != NULL && name_is(h, "x-amz-security-token")) ||
		    ((r->flags & SK_SIGV4_CONTENT_SHA256_HEADER) && name_is(h, "x-amz-content-sha256")))
			return SK_SIGV4_ERESERVED;
	}
	return host ? SK_SIGV4_OK : SK_SIGV4_ENOHOST;
}

int sk_sigv4_check(const sk_sigv4_request *r)
{
	if (r->method == NULL || r->method_len == 0 || r->method_len > SK_SIGV4_MAX_METHOD)
		return SK_SIGV4_EMETHOD;
	for (size_t i = 0; i < r->method_len; i++)
		if (!is_tchar((unsigned char)r->method[i]))
			return SK_SIGV4_EMETHOD;

	if (r->path == NULL || r->path_len == 0 || r->path_len > SK_SIGV4_MAX_PATH || r->path[0] != '/')
		return SK_SIGV4_EPATH;
	for (size_t i = 0; i < r->path_len; i++) {
		unsigned char c = (unsigned char)r->path[i];
		if (is_ctl(c) || c == '?' || c == '#')
			return SK_SIGV4_EPATH;
	}

	if (r->query != NULL) {
		if (r->nparams > 0 || r->query_len > SK_SIGV4_MAX_QUERY)
			return SK_SIGV4_EQUERY;
		for (size_t i = 0; i < r->query_len; i++)
			if (is_ctl((unsigned char)r->query[i]) || r->query[i] == '#')
				return SK_SIGV4_EQUERY;
		if (count_query_params(r->query, r->query_len) > SK_SIGV4_MAX_PARAMS)
			return SK_SIGV4_EQUERY;
	} else if (r->nparams > 0) {
		size_t total = 0;
		if (r->params == NULL || r->nparams > SK_SIGV4_MAX_PARAMS)
			return SK_SIGV4_EQUERY;
		for (size_t i = 0; i < r->nparams; i++) {
			const sk_sigv4_pair *p = &r->params[i];
			if ((p->name == NULL && p->name_len > 0) || (p->value == NULL && p->value_len > 0))
				return SK_SIGV4_EQUERY;
			if (p->name_len > SK_SIGV4_MAX_QUERY || p->value_len > SK_SIGV4_MAX_QUERY)
				return SK_SIGV4_EQUERY;
			total += p->name_len + p->value_len;
			if (total > SK_SIGV4_MAX_QUERY)
				return SK_SIGV4_EQUERY;
		}
	}

	int rc = check_headers(r);
	if (rc != SK_SIGV4_OK)
		return rc;

	if (r->payload_hash != NULL) {
		if (r->payload_hash_len == 0 || r->payload_hash_len > SK_SIGV4_MAX_PAYLOAD_HASH)
			return SK_SIGV4_EPAYLOAD;
		for (size_t i = 0; i < r->payload_hash_len; i++) {
			unsigned char c = (unsigned char)r->payload_hash[i];
			if (!is_unreserved(c) || c == '.' || c == '_' || c == '~')
				return SK_SIGV4_EPAYLOAD;
		}
	} else if (r->body == NULL && r->body_len > 0) {
		return SK_SIGV4_EPAYLOAD;
	}

	if (check_scope_part(r->region, r->region_len) != 0 ||
	    check_scope_part(r->service, r->service_len) != 0)
		return SK_SIGV4_ESCOPE;

	/* The access key ends at the '/' that starts the scope in Credential=, and the header's
	 * parameters are split on ',' and spaces. */
	if (r->access_key == NULL || r->access_key_len == 0 ||
	    r->access_key_len > SK_SIGV4_MAX_ACCESS_KEY)
		return SK_SIGV4_EACCESS_KEY;
	for (size_t i = 0; i < r->access_key_len; i++) {
		unsigned char c = (unsigned char)r->access_key[i];
		if (c <= 0x20 || c >= 0x7f || c == '/' || c == ',')
			return SK_SIGV4_EACCESS_KEY;
	}
	if (r->secret_key == NULL || r->secret_key_len == 0 ||
	    r->secret_key_len > SK_SIGV4_MAX_SECRET_KEY)
		return SK_SIGV4_ESECRET_KEY;

	if (r->session_token != NULL) {
		if (r->session_token_len == 0 || r->session_token_len > SK_SIGV4_MAX_TOKEN)
			return SK_SIGV4_ETOKEN;
		for (size_t i = 0; i < r->session_token_len; i++) {
			unsigned char c = (unsigned char)r->session_token[i];
			if (c <= 0x20 || c >= 0x7f)
				return SK_SIGV4_ETOKEN;
		}
	}

	if (r->time < 0 || r->time > SK_SIGV4_MAX_TIME)
		return SK_SIGV4_ETIME;
	return SK_SIGV4_OK;
}

size_t sk_sigv4_workspace_size(const sk_sigv4_request *r)
{
	size_t query = r->query != NULL ? r->query_len : 0, headers = 0, names = 0;
	for (size_t i = 0; i < r->nparams; i++)
		query += r->params[i].name_len + r->params[i].value_len;
	for (size_t i = 0; i < r->nheaders; i++) {
		headers += r->headers[i].name_len + r->headers[i].value_len + 3; /* ':' ',' '\n' */
		names += r->headers[i].name_len + 1;                              /* ';' */
	}
	/* The headers the signer adds, with their separators. */
	headers += sizeof "x-amz-date:" + 16 + sizeof "x-amz-security-token:" + r->session_token_len +
	           sizeof "x-amz-content-sha256:" + SK_SIGV4_MAX_PAYLOAD_HASH + 8;
	names += sizeof "x-amz-date;x-amz-security-token;x-amz-content-sha256;";
	size_t scope = 8 + r->region_len + r->service_len + sizeof "///aws4_request";

	/* Each byte of a path or query encodes to at most three. The query is written twice: once
	 * encoded parameter by parameter for sorting, then joined with '=' and '&'. */
	return r->method_len + 3 * r->path_len + 2 + 2 * 3 * query + 2 * SK_SIGV4_MAX_PARAMS +
	       headers + names + SK_SIGV4_MAX_PAYLOAD_HASH + 8 +                   /* request */
	       sizeof "AWS4-HMAC-SHA256\n" + 17 + scope + 1 + 64 + 1 +             /* to sign */
	       sizeof "AWS4-HMAC-SHA256 Credential=" + r->access_key_len + 1 + scope +
	       sizeof ", SignedHeaders=" + names + sizeof ", Signature=" + 64 + 1; /* header */
}

/* ---- writing ---------------------------------------------------------------------------- */

/* A bounded writer into the workspace. sk_sigv4_sign sizes the workspace first, so `full` is a
 * second line of defence, not the way a short workspace is reported. */
struct out {
	char *p;
	size_t len, cap;
	int full;
};

static void put(struct out *o, const void *s, size_t n)
{
	if (n == 0)
		return;
	if (o->full || n > o->cap - o->len) {
		o->full = 1;
		return;
	}
	memcpy(o->p + o->len, s, n);
	o->len += n;
}

static void put_c(struct out *o, char c)
{
	put(o, &c, 1);
}

static void put_s(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

static void put_pct(struct out *o, unsigned char c)
{
	char e[3] = { '%', HEXDIGITS[c >> 4], HEXDIGITS[c & 15] };
	put(o, e, 3);
}

/* Ends a string with NUL (not counted in its length) and returns where it started. */
static const char *finish(struct out *o, size_t start, size_t *len)
{
	*len = o->len - start;
	put_c(o, '\0');
	return o->p + start;
}

/*
 * Encodes bytes for the canonical URI or query: unreserved bytes as they are, everything else
 * as %XX. With `decode`, a valid %XX already there stands for its byte (so an escape is neither
 * encoded twice nor left in lowercase), and a '%' that starts no escape is a literal '%'.
 */
static void put_encoded(struct out *o, const char *s, size_t n, int decode)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (decode && c == '%' && i + 2 < n && hexval((unsigned char)s[i + 1]) >= 0 &&
		    hexval((unsigned char)s[i + 2]) >= 0) {
			c = (unsigned char)(hexval((unsigned char)s[i + 1]) * 16 +
			                    hexval((unsigned char)s[i + 2]));
			i += 2;
		}
		if (is_unreserved(c))
			put_c(o, (char)c);
		else
			put_pct(o, c);
	}
}

/*
 * The canonical URI. Segments are encoded one by one, so '/' separates them and never comes
 * from an escape; with normalization, "." and empty segments are dropped and ".." takes back
 * the segment written before it (RFC 3986 §5.2.4), which is found again by its leading '/'.
 */
static void put_canonical_uri(struct out *o, const char *path, size_t n, unsigned flags)
{
	int keep_escapes = !(flags & SK_SIGV4_DOUBLE_ENCODE_PATH);
	int normalize = (flags & SK_SIGV4_NORMALIZE_PATH) != 0;
	size_t start = o->len, i = 1;
	int dir = 0; /* whether the normalized path ends in a directory, i.e. with '/' */

	while (i <= n) {
		size_t j = i;
		while (j < n && path[j] != '/')
			j++;
		const char *seg = path + i;
		size_t len = j - i;
		if (normalize && (len == 0 || (len == 1 && seg[0] == '.'))) {
			dir = 1;
		} else if (normalize && len == 2 && seg[0] == '.' && seg[1] == '.') {
			while (o->len > start && o->p[o->len - 1] != '/')
				o->len--;
			if (o->len > start)
				o->len--;
			dir = 1;
		} else {
			put_c(o, '/');
			put_encoded(o, seg, len, keep_escapes);
			dir = 0;
		}
		i = j + 1;
	}
	if (o->len == start || dir)
		put_c(o, '/');
}

struct span {
	size_t name, name_len, value, value_len; /* offsets into the workspace */
};

static int span_cmp(const char *base, const struct span *a, const struct span *b)
{
	size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
	int c = n ? memcmp(base + a->name, base + b->name, n) : 0;
	if (c != 0)
		return c;
	if (a->name_len != b->name_len)
		return a->name_len < b->name_len ? -1 : 1;
	n = a->value_len < b->value_len ? a->value_len : b->value_len;
	c = n ? memcmp(base + a->value, base + b->value, n) : 0;
	if (c != 0)
		return c;
	return a->value_len < b->value_len ? -1 : a->value_len > b->value_len;
}

static void add_param(struct out *o, struct span *sp, const char *name, size_t name_len,
                      const char *value, size_t value_len, int decode)
{
	sp->name = o->len;
	put_encoded(o, name, name_len, decode);
	sp->name_len = o->len - sp->name;
	sp->value = o->len;
	put_encoded(o, value, value_len, decode);
	sp->value_len = o->len - sp->value;
}

/*
 * Encodes every parameter into the workspace at o (the scratch area) and sorts them by name,
 * then value, byte by byte, as SigV4 orders them. Returns how many there are.
 */
static size_t collect_params(const sk_sigv4_request *r, struct out *o, struct span *sp)
{
	size_t count = 0;
	if (r->query != NULL) {
		size_t i = 0, n = r->query_len;
		while (i < n) {
			size_t j = i, eq;
			while (j < n && r->query[j] != '&')
				j++;
			if (j > i) {
				for (eq = i; eq < j && r->query[eq] != '='; eq++)
					;
				size_t vstart = eq < j ? eq + 1 : j;
				add_param(o, &sp[count++], r->query + i, eq - i, r->query + vstart,
				          j - vstart, 1);
			}
			i = j + 1;
		}
	} else {
		for (size_t k = 0; k < r->nparams; k++)
			add_param(o, &sp[count++], r->params[k].name, r->params[k].name_len,
			          r->params[k].value, r->params[k].value_len, 0);
	}
	/* Insertion sort: at most SK_SIGV4_MAX_PARAMS entries, and stable. */
	for (size_t k = 1; k < count; k++) {
		struct span cur = sp[k];
		size_t m = k;
		while (m > 0 && span_cmp(o->p, &cur, &sp[m - 1]) < 0) {
			sp[m] = sp[m - 1];
			m--;
		}
		sp[m] = cur;
	}
	return count;
}

static int name_cmp(const sk_sigv4_pair *a, const sk_sigv4_pair *b)
{
	size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
	for (size_t i = 0; i < n; i++) {
		unsigned char x = lower((unsigned char)a->name[i]), y = lower((unsigned char)b->name[i]);
		if (x != y)
			return x < y ? -1 : 1;
	}
	return a->name_len < b->name_len ? -1 : a->name_len > b->name_len;
}

static void put_lower(struct out *o, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		put_c(o, (char)lower((unsigned char)s[i]));
}

/* A header value with leading and trailing blanks removed and inner runs of them made one
 * space, as SigV4 canonicalizes values (an obs-fold is the caller's to unfold into a space). */
static void put_trimmed(struct out *o, const char *s, size_t n)
{
	int blank = 0, any = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == ' ' || s[i] == '\t') {
			blank = 1;
			continue;
		}
		if (blank && any)
			put_c(o, ' ');
		put_c(o, s[i]);
		blank = 0;
		any = 1;
	}
}

/* ---- crypto ----------------------------------------------------------------------------- */

static int sha256(const void *data, size_t len, unsigned char md[32])
{
	unsigned int md_len = 0;
	if (EVP_Digest(len ? data : "", len, md, &md_len, EVP_sha256(), NULL) != 1 || md_len != 32)
		return -1;
	return 0;
}

static int hmac(const unsigned char *key, size_t key_len, const void *data, size_t len,
                unsigned char md[32])
{
	unsigned int md_len = 0;
	if (HMAC(EVP_sha256(), key, (int)key_len, len ? data : (const void *)"", len, md,
	         &md_len) == NULL || md_len != 32)
		return -1;
	return 0;
}

static void to_hex(const unsigned char md[32], char out[65])
{
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hexdigits[md[i] >> 4];
		out[2 * i + 1] = hexdigits[md[i] & 15];
	}
	out[64] = '\0';
}

int sk_sha256_hex(const void *data, size_t len, char out[65])
{
	unsigned char md[32];
	if (sha256(data, len, md) != 0)
		return -1;
	to_hex(md, out);
	return 0;
}

/* kSigning = HMAC(HMAC(HMAC(HMAC("AWS4" secret, date), region), service), "aws4_request");
 * then the signature over the string to sign. Every key is wiped before returning. */
static int sign_string(const sk_sigv4_request *r, const char *date8, const char *sts,
                       size_t sts_len, char signature[65])
{
	unsigned char k0[4 + SK_SIGV4_MAX_SECRET_KEY], k[32], md[32];
	int rc = -1;

	memcpy(k0, "AWS4", 4);
	memcpy(k0 + 4, r->secret_key, r->secret_key_len);
	if (hmac(k0, 4 + r->secret_key_len, date8, 8, k) == 0 &&
	    hmac(k, 32, r->region, r->region_len, k) == 0 &&
	    hmac(k, 32, r->service, r->service_len, k) == 0 &&
	    hmac(k, 32, "aws4_request", 12, k) == 0 && hmac(k, 32, sts, sts_len, md) == 0) {
		to_hex(md, signature);
		rc = 0;
	}
	OPENSSL_cleanse(k0, sizeof k0);
	OPENSSL_cleanse(k, sizeof k);
	return rc;
}

/* ---- signing ---------------------------------------------------------------------------- */

/* YYYYMMDD'T'HHMMSS'Z' from Unix seconds, by the proleptic Gregorian calendar (days to civil
 * date after Howard Hinnant's algorithm), so the result depends on no time zone setting. */
static void amz_date(int64_t t, char out[17])
{
	int64_t days = t / 86400, secs = t % 86400;
	int64_t z = days + 719468, era = z / 146097;
	int64_t doe = z - era * 146097;
	int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	int64_t mp = (5 * doy + 2) / 153;
	int64_t d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
	int64_t y = yoe + era * 400 + (m <= 2);
	int64_t f[6] = { y, m, d, secs / 3600, secs / 60 % 60, secs % 60 };
	int width[6] = { 4, 2, 2, 2, 2, 2 }, p = 0;

	for (int i = 0; i < 6; i++) {
		for (int w = width[i] - 1; w >= 0; w--) {
			out[p + w] = (char)('0' + f[i] % 10);
			f[i] /= 10;
		}
		p += width[i];
		if (i == 2)
			out[p++] = 'T';
	}
	out[15] = 'Z';
	out[16] = '\0';
}

const char *sk_sigv4_strerror(int status)
{
	switch (status) {
	case SK_SIGV4_OK: return "no error";
	case SK_SIGV4_EMETHOD: return "method must be an HTTP token of 1 to 32 bytes";
	case SK_SIGV4_EPATH: return "path must start with '/', be at most 8192 bytes, and hold no control character, '?' or '#'";
	case SK_SIGV4_EQUERY: return "query must be a string or parameters (not both), at most 16384 bytes and 256 parameters, without control characters or '#'";
	case SK_SIGV4_EHEADER_NAME: return "a header name must be an HTTP token of 1 to 128 bytes";
	case SK_SIGV4_EHEADER_VALUE: return "a header value must be at most 8192 bytes with no control character but tab";
	case SK_SIGV4_EHEADERS: return "at most 64 header lines and 32768 bytes of headers can be signed";
	case SK_SIGV4_ENOHOST: return "headers must include host";
	case SK_SIGV4_ERESERVED: return "headers must not include authorization, x-amz-date, or the x-amz-security-token or x-amz-content-sha256 the signer adds";
	case SK_SIGV4_EPAYLOAD: return "payload hash must be 1 to 128 letters, digits or '-'";
	case SK_SIGV4_ESCOPE: return "region and service must be 1 to 64 letters, digits, '-', '.' or '_'";
	case SK_SIGV4_EACCESS_KEY: return "access key must be 1 to 128 printable ASCII bytes without space, '/' or ','";
	case SK_SIGV4_ESECRET_KEY: return "secret key must be 1 to 128 bytes";
	case SK_SIGV4_ETOKEN: return "session token must be 1 to 8192 printable ASCII bytes without space";
	case SK_SIGV4_ETIME: return "time must be Unix seconds from 1970 to the end of 9999";
	case SK_SIGV4_ENOSPACE: return "workspace too small for this request";
	case SK_SIGV4_ECRYPTO: return "libcrypto failed to compute SHA-256 or HMAC";
	default: return "unknown SigV4 status";
	}
}

int sk_sigv4_sign(const sk_sigv4_request *r, char *ws, size_t ws_size, sk_sigv4_result *res)
{
	struct out o = { ws, 0, ws_size, 0 };
	struct span params[SK_SIGV4_MAX_PARAMS];
	const sk_sigv4_pair *hs[SK_SIGV4_MAX_HEADERS + 3];
	sk_sigv4_pair extra[3];
	size_t nh = 0, nparams;
	char body_hash[65], date8[9];
	unsigned char md[32];
	int rc = sk_sigv4_check(r);

	if (rc != SK_SIGV4_OK)
		return rc;
	if (ws == NULL || ws_size < sk_sigv4_workspace_size(r))
		return SK_SIGV4_ENOSPACE;
	memset(res, 0, sizeof *res);
	amz_date(r->time, res->amz_date);
	memcpy(date8, res->amz_date, 8);
	date8[8] = '\0';

	const char *payload = r->payload_hash;
	size_t payload_len = r->payload_hash_len;
	if (payload == NULL) {
		if (sk_sha256_hex(r->body, r->body_len, body_hash) != 0)
			return SK_SIGV4_ECRYPTO;
		payload = body_hash;
		payload_len = 64;
	}

	/* The signed headers: the caller's, and those the signer adds, sorted by lowercase name.
	 * The sort is stable, so a repeated name keeps its values in the order given. */
	for (size_t i = 0; i < r->nheaders; i++)
		hs[nh++] = &r->headers[i];
	extra[0] = (sk_sigv4_pair){ "x-amz-date", 10, res->amz_date, 16 };
	hs[nh++] = &extra[0];
	if (r->session_token != NULL && !(r->flags & SK_SIGV4_UNSIGNED_SESSION_TOKEN)) {
		extra[1] = (sk_sigv4_pair){ "x-amz-security-token", 20, r->session_token,
		                            r->session_token_len };
		hs[nh++] = &extra[1];
	}
	if (r->flags & SK_SIGV4_CONTENT_SHA256_HEADER) {
		extra[2] = (sk_sigv4_pair){ "x-amz-content-sha256", 20, payload, payload_len };
		hs[nh++] = &extra[2];
	}
	for (size_t k = 1; k < nh; k++) {
		const sk_sigv4_pair *cur = hs[k];
		size_t m = k;
		while (m > 0 && name_cmp(cur, hs[m - 1]) < 0) {
			hs[m] = hs[m - 1];
			m--;
		}
		hs[m] = cur;
	}

	nparams = collect_params(r, &o, params);

	/* The canonical request. */
	size_t creq = o.len;
	put(&o, r->method, r->method_len);
	put_c(&o, '\n');
	put_canonical_uri(&o, r->path, r->path_len, r->flags);
	put_c(&o, '\n');
	size_t cquery = o.len;
	for (size_t k = 0; k < nparams; k++) {
		if (k > 0)
			put_c(&o, '&');
		put(&o, o.p + params[k].name, params[k].name_len);
		put_c(&o, '=');
		put(&o, o.p + params[k].value, params[k].value_len);
	}
	size_t cquery_len = o.len - cquery;
	put_c(&o, '\n');
	for (size_t k = 0; k < nh; k++) {
		if (k == 0 || name_cmp(hs[k], hs[k - 1]) != 0) {
			put_lower(&o, hs[k]->name, hs[k]->name_len);
			put_c(&o, ':');
		} else {
			put_c(&o, ',');
		}
		put_trimmed(&o, hs[k]->value, hs[k]->value_len);
		if (k + 1 == nh || name_cmp(hs[k], hs[k + 1]) != 0)
			put_c(&o, '\n');
	}
	put_c(&o, '\n');
	size_t signed_headers = o.len;
	for (size_t k = 0; k < nh; k++) {
		if (k > 0 && name_cmp(hs[k], hs[k - 1]) == 0)
			continue;
		if (k > 0)
			put_c(&o, ';');
		put_lower(&o, hs[k]->name, hs[k]->name_len);
	}
	size_t signed_headers_len = o.len - signed_headers;
	put_c(&o, '\n');
	size_t payload_at = o.len;
	put(&o, payload, payload_len);
	res->canonical_request = finish(&o, creq, &res->canonical_request_len);
	if (o.full)
		return SK_SIGV4_ENOSPACE;
	res->canonical_query = o.p + cquery;
	res->canonical_query_len = cquery_len;
	res->signed_headers = o.p + signed_headers;
	res->signed_headers_len = signed_headers_len;
	res->payload_hash = o.p + payload_at;
	res->payload_hash_len = payload_len;
	if (sha256(res->canonical_request, res->canonical_request_len, md) != 0)
		return SK_SIGV4_ECRYPTO;

	/* The string to sign, with the credential scope in the middle. */
	size_t sts = o.len;
	put_s(&o, "AWS4-HMAC-SHA256\n");
	put(&o, res->amz_date, 16);
	put_c(&o, '\n');
	size_t scope = o.len;
	put(&o, date8, 8);
	put_c(&o, '/');
	put(&o, r->region, r->region_len);
	put_c(&o, '/');
	put(&o, r->service, r->service_len);
	put_s(&o, "/aws4_request");
	size_t scope_len = o.len - scope;
	put_c(&o, '\n');
	char hex[65];
	to_hex(md, hex);
	put(&o, hex, 64);
	res->string_to_sign = finish(&o, sts, &res->string_to_sign_len);
	if (o.full)
		return SK_SIGV4_ENOSPACE;

	if (sign_string(r, date8, res->string_to_sign, res->string_to_sign_len, res->signature) != 0)
		return SK_SIGV4_ECRYPTO;

	size_t authz = o.len;
	put_s(&o, "AWS4-HMAC-SHA256 Credential=");
	put(&o, r->access_key, r->access_key_len);
	put_c(&o, '/');
	put(&o, o.p + scope, scope_len);
	put_s(&o, ", SignedHeaders=");
	put(&o, o.p + signed_headers, signed_headers_len);
	put_s(&o, ", Signature=");
	put(&o, res->signature, 64);
	res->authorization = finish(&o, authz, &res->authorization_len);
	return o.full ? SK_SIGV4_ENOSPACE : SK_SIGV4_OK;
}
