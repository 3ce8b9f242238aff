/* json.c — see json.h. */
#include "json.h"

#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static int fail(sk_json *j, const char *why)
{
	if (j->err == NULL)
		j->err = why;
	return -1;
}

static void skip_ws(sk_json *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

void sk_json_init(sk_json *j, const char *text, size_t len)
{
	j->p = text;
	j->end = text + len;
	j->err = NULL;
	j->depth = 0;
	j->first = 0;
}

enum sk_json_kind sk_json_peek(sk_json *j)
{
	if (j->err)
		return SK_JSON_INVALID;
	skip_ws(j);
	if (j->p >= j->end)
		return SK_JSON_INVALID;
	switch (*j->p) {
	case 'n': return SK_JSON_NULL;
	case 'f': return SK_JSON_FALSE;
	case 't': return SK_JSON_TRUE;
	case '"': return SK_JSON_STRING;
	case '{': return SK_JSON_OBJECT;
	case '[': return SK_JSON_ARRAY;
	default:
		if (*j->p == '-' || (*j->p >= '0' && *j->p <= '9'))
			return SK_JSON_NUMBER;
		return SK_JSON_INVALID;
	}
}

static int literal(sk_json *j, const char *lit, size_t n)
{
	if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0)
		return fail(j, "not a JSON literal");
	j->p += n;
	return 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static long read_hex4(const char *p)
{
	long v = 0;
	for (int i = 0; i < 4; i++) {
		int h = hexval(p[i]);
		if (h < 0)
			return -1;
		v = (v << 4) | h;
	}
	return v;
}

/* Every byte of a 64-bit word set to 0x01, and to 0x80: for the word-at-a-time scan below. */
#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/*
 * The end of a plain run: the first '"', '\\' or control character at or after p, or end.
 * Base64 payloads are almost all plain run, so many bytes are tested at once. With SSE2
 * (every x86-64), sixteen: a control character is a byte that 0x1f minus it, saturated,
 * leaves zero. Then, and on other machines, eight at a time in a 64-bit word:
 * (x - ONES) & ~x & HIGHS is non-zero exactly when x has a zero byte, and
 * (w - 0x20 * ONES) & ~w & HIGHS when w has a byte below 0x20. A flagged block or word is
 * finished a byte at a time, which is the exact test; a false flag past the first hit costs
 * only speed. Local pointers rather than j->p: the text is char-typed and may alias *j, so a
 * loop on j->p reloads and stores it for every byte.
 */
static const char *plain_run(const char *p, const char *end)
{
#if defined(__SSE2__)
	const __m128i quotes = _mm_set1_epi8('"'), backslashes = _mm_set1_epi8('\\');
	const __m128i control_max = _mm_set1_epi8(0x1f), zero = _mm_setzero_si128();
	while (end - p >= 16) {
		__m128i x = _mm_loadu_si128((const __m128i *)(const void *)p);
		__m128i hit = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, quotes),
							_mm_cmpeq_epi8(x, backslashes)),
					   _mm_cmpeq_epi8(_mm_subs_epu8(x, control_max), zero));
		if (_mm_movemask_epi8(hit))
			break;
		p += 16;
	}
#endif
	while (end - p >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		uint64_t quote = w ^ (0x22 * ONES), backslash = w ^ (0x5c * ONES);
		uint64_t hit = ((quote - ONES) & ~quote) | ((backslash - ONES) & ~backslash) |
			       ((w - 0x20 * ONES) & ~w);
		if (hit & HIGHS)
			break;
		p += 8;
	}
	while (p < end && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
		p++;
	return p;
}

int sk_json_string(sk_json *j, sk_json_str *out)
{
	if (sk_json_peek(j) != SK_JSON_STRING)
		return fail(j, "expected a string");
	const char *start = ++j->p;
	int escaped = 0;
	for (;;) {
		j->p = plain_run(j->p, j->end);
		if (j->p >= j->end)
			return fail(j, "unterminated string");
		if (*j->p == '"')
			break;
		if ((unsigned char)*j->p < 0x20)
			return fail(j, "control character in a string");
		escaped = 1;
		if (j->end - j->p < 2)
			return fail(j, "unterminated string");
		switch (j->p[1]) {
		case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
			j->p += 2;
			break;
		case 'u': {
			if (j->end - j->p < 6)
				return fail(j, "short \\u escape");
			long u = read_hex4(j->p + 2);
			if (u < 0)
				return fail(j, "bad \\u escape");
			j->p += 6;
			/* A surrogate must come as a high-low pair: a lone half is not a character. */
			if (u >= 0xDC00 && u <= 0xDFFF)
				return fail(j, "lone low surrogate");
			if (u >= 0xD800 && u <= 0xDBFF) {
				if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u')
					return fail(j, "lone high surrogate");
				long lo = read_hex4(j->p + 2);
				if (lo < 0xDC00 || lo > 0xDFFF)
					return fail(j, "lone high surrogate");
				j->p += 6;
			}
			break;
		}
		default:
			return fail(j, "bad escape in a string");
		}
	}
	out->p = start;
	out->len = (size_t)(j->p - start);
	out->escaped = escaped;
	j->p++;
	return 0;
}

static size_t put_utf8(char *dst, unsigned long cp)
{
	if (cp < 0x80) {
		dst[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		dst[0] = (char)(0xC0 | (cp >> 6));
		dst[1] = (char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		dst[0] = (char)(0xE0 | (cp >> 12));
		dst[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
		dst[2] = (char)(0x80 | (cp & 0x3F));
		return 3;
	}
	dst[0] = (char)(0xF0 | (cp >> 18));
	dst[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
	dst[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
	dst[3] = (char)(0x80 | (cp & 0x3F));
	return 4;
}

/* Decodes the one character of an escaped span at *p (validated when it was read) into dst
 * (at most 4 bytes), advancing *p; returns its length. */
static size_t unescape_one(const char **p, char *dst)
{
	const char *q = *p;
	if (*q != '\\') {
		*dst = *q;
		*p = q + 1;
		return 1;
	}
	char c = q[1];
	*p = q + 2;
	switch (c) {
	case 'b': *dst = '\b'; return 1;
	case 'f': *dst = '\f'; return 1;
	case 'n': *dst = '\n'; return 1;
	case 'r': *dst = '\r'; return 1;
	case 't': *dst = '\t'; return 1;
	case 'u': {
		unsigned long cp = (unsigned long)read_hex4(q + 2);
		*p = q + 6;
		if (cp >= 0xD800 && cp <= 0xDBFF) {
			unsigned long lo = (unsigned long)read_hex4(q + 8);
			*p = q + 12;
			cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
		}
		return put_utf8(dst, cp);
	}
	default: *dst = c; return 1; /* '"', '\\', '/' */
	}
}

size_t sk_json_unescape(const sk_json_str *s, char *dst)
{
	if (!s->escaped) {
		if (s->len > 0) /* an empty span may have no pointer at all */
			memcpy(dst, s->p, s->len);
		return s->len;
	}
	const char *p = s->p, *end = s->p + s->len;
	size_t o = 0;
	while (p < end)
		o += unescape_one(&p, dst + o);
	return o;
}

int sk_json_str_is_escaped(const sk_json_str *s, const char *lit, size_t n)
{
	/* An escaped name means what it spells: {"\u0074": …} is "t" to every other reader, so
	 * it must be "t" here too, or a duplicate could hide behind the escape. */
	const char *p = s->p, *end = s->p + s->len;
	size_t o = 0;
	while (p < end) {
		char c[4];
		size_t k = unescape_one(&p, c);
		if (o + k > n || memcmp(lit + o, c, k) != 0)
			return 0;
		o += k;
	}
	return o == n;
}

int sk_json_str_cmp(const sk_json_str *a, const sk_json_str *b)
{
	if (!a->escaped && !b->escaped) {
		size_t n = a->len < b->len ? a->len : b->len;
		int c = n ? memcmp(a->p, b->p, n) : 0;
		if (c != 0)
			return c;
		return (a->len > b->len) - (a->len < b->len);
	}
	/* Both values a character at a time: unescaped on the fly, so nothing is allocated. */
	const char *pa = a->p, *ea = a->p + a->len, *pb = b->p, *eb = b->p + b->len;
	char ca[4], cb[4];
	size_t na = 0, ia = 0, nb = 0, ib = 0;
	for (;;) {
		if (ia == na && pa < ea) {
			na = unescape_one(&pa, ca);
			ia = 0;
		}
		if (ib == nb && pb < eb) {
			nb = unescape_one(&pb, cb);
			ib = 0;
		}
		int more_a = ia < na, more_b = ib < nb;
		if (!more_a || !more_b)
			return more_a - more_b;
		unsigned char x = (unsigned char)ca[ia++], y = (unsigned char)cb[ib++];
		if (x != y)
			return x < y ? -1 : 1;
	}
}

int sk_json_bool(sk_json *j, int *out)
{
	switch (sk_json_peek(j)) {
	case SK_JSON_TRUE: *out = 1; return literal(j, "true", 4);
	case SK_JSON_FALSE: *out = 0; return literal(j, "false", 5);
	default: return fail(j, "expected a boolean");
	}
}

int sk_json_null(sk_json *j)
{
	if (sk_json_peek(j) != SK_JSON_NULL)
		return fail(j, "expected null");
	return literal(j, "null", 4);
}

/* Scans a number per RFC 8259's grammar; *integral tells whether it had no fraction/exponent. */
static int scan_number(sk_json *j, const char **start, const char **digits, int *integral)
{
	if (sk_json_peek(j) != SK_JSON_NUMBER)
		return fail(j, "expected a number");
	*start = j->p;
	if (*j->p == '-')
		j->p++;
	*digits = j->p;
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return fail(j, "bad number");
	if (*j->p == '0') {
		j->p++;
	} else {
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	*integral = 1;
	if (j->p < j->end && *j->p == '.') {
		*integral = 0;
		j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return fail(j, "bad number");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		*integral = 0;
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return fail(j, "bad number");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	return 0;
}

int sk_json_u64(sk_json *j, uint64_t *out)
{
	const char *start, *digits;
	int integral;
	if (scan_number(j, &start, &digits, &integral) < 0)
		return -1;
	if (!integral || *start == '-')
		return fail(j, "expected a non-negative integer");
	uint64_t v = 0;
	for (const char *p = digits; p < j->p; p++) {
		unsigned d = (unsigned)(*p - '0');
		if (v > (UINT64_MAX - d) / 10)
			return fail(j, "integer out of range");
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

int sk_json_i64(sk_json *j, int64_t *out)
{
	const char *start, *digits;
	int integral;
	if (scan_number(j, &start, &digits, &integral) < 0)
		return -1;
	if (!integral)
		return fail(j, "expected an integer");
	int negative = *start == '-';
	uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, v = 0;
	for (const char *p = digits; p < j->p; p++) {
		unsigned d = (unsigned)(*p - '0');
		if (v > (limit - d) / 10)
			return fail(j, "integer out of range");
		v = v * 10 + d;
	}
	*out = negative ? (int64_t)(0 - v) : (int64_t)v;
	return 0;
}

/* Opens a container: consumes the bracket and marks the level as awaiting its first element. */
static int open_container(sk_json *j, enum sk_json_kind kind, const char *expected)
{
	if (sk_json_peek(j) != kind)
		return fail(j, expected);
	if (j->depth >= SK_JSON_MAX_DEPTH)
		return fail(j, "nested too deeply");
	j->first |= (uint32_t)1 << j->depth;
	j->depth++;
	j->p++;
	return 0;
}

/* 1 when another element follows, 0 when the container closed here, -1 on failure. */
static int next_element(sk_json *j, char close)
{
	if (j->err)
		return -1;
	if (j->depth <= 0)
		return fail(j, "no object or array is open");
	uint32_t bit = (uint32_t)1 << (j->depth - 1);
	int first = (j->first & bit) != 0;
	j->first &= ~bit;
	skip_ws(j);
	if (j->p >= j->end)
		return fail(j, "unterminated object or array");
	if (*j->p == close) {
		j->p++;
		j->depth--;
		return 0;
	}
	if (first)
		return 1;
	if (*j->p != ',')
		return fail(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
	j->p++;
	skip_ws(j);
	if (j->p < j->end && *j->p == close)
		return fail(j, "trailing comma");
	return 1;
}

int sk_json_object_begin(sk_json *j)
{
	return open_container(j, SK_JSON_OBJECT, "expected an object");
}

int sk_json_object_key(sk_json *j, sk_json_str *key)
{
	int more = next_element(j, '}');
	if (more <= 0)
		return more;
	if (sk_json_string(j, key) < 0)
		return fail(j, "expected a member name");
	skip_ws(j);
	if (j->p >= j->end || *j->p != ':')
		return fail(j, "expected ':'");
	j->p++;
	return 1;
}

int sk_json_array_begin(sk_json *j)
{
	return open_container(j, SK_JSON_ARRAY, "expected an array");
}

int sk_json_array_next(sk_json *j)
{
	return next_element(j, ']');
}

int sk_json_skip(sk_json *j)
{
	sk_json_str s;
	int b;
	switch (sk_json_peek(j)) {
	case SK_JSON_NULL: return sk_json_null(j);
	case SK_JSON_FALSE:
	case SK_JSON_TRUE: return sk_json_bool(j, &b);
	case SK_JSON_STRING: return sk_json_string(j, &s);
	case SK_JSON_NUMBER: {
		const char *start, *digits;
		int integral;
		return scan_number(j, &start, &digits, &integral);
	}
	case SK_JSON_OBJECT: {
		int r;
		if (sk_json_object_begin(j) < 0)
			return -1;
		while ((r = sk_json_object_key(j, &s)) == 1)
			if (sk_json_skip(j) < 0)
				return -1;
		return r;
	}
	case SK_JSON_ARRAY: {
		int r;
		if (sk_json_array_begin(j) < 0)
			return -1;
		while ((r = sk_json_array_next(j)) == 1)
			if (sk_json_skip(j) < 0)
				return -1;
		return r;
	}
	default:
		return fail(j, "expected a value");
	}
}

int sk_json_finish(sk_json *j)
{
	if (j->err)
		return -1;
	skip_ws(j);
	if (j->p != j->end)
		return fail(j, "trailing bytes after the value");
	return 0;
}
