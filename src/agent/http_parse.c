/* http_parse.c — see http_parse.h. */
#include "http_parse.h"

#include <string.h>

/* Chunk extensions are read and dropped; a chunk line this long is plenty and keeps a hostile
 * body from holding the decoder in a line for ever. */
#define CHUNK_LINE_MAX 1024
/* All trailers of one body together, read and dropped. */
#define CHUNK_TRAILERS_MAX 4096
/* Hex digits of a chunk size: 16 fill 64 bits; more would overflow. */
#define CHUNK_SIZE_DIGITS 16

static int is_tchar(unsigned char c)
{
	if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
		return 1;
	return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static int lower(int c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

static int span_is(const char *s, size_t n, const char *lit)
{
	size_t m = strlen(lit);
	if (n != m)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (lower((unsigned char)s[i]) != lower((unsigned char)lit[i]))
			return 0;
	return 1;
}

size_t http_head_length(const char *buf, size_t len)
{
	size_t i = 0;
	/* RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request line. */
	while (i + 1 < len && buf[i] == '\r' && buf[i + 1] == '\n')
		i += 2;
	for (; i + 3 < len; i++) {
		if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n')
			return i + 4;
	}
	return 0;
}

static enum http_method method_of(const char *m, size_t n)
{
	static const struct { const char *name; enum http_method m; } known[] = {
		{ "GET", HTTP_GET }, { "POST", HTTP_POST }, { "PUT", HTTP_PUT }, { "HEAD", HTTP_HEAD },
		{ "DELETE", HTTP_DELETE }, { "OPTIONS", HTTP_OPTIONS }, { "PATCH", HTTP_PATCH },
		{ "TRACE", HTTP_TRACE }, { "CONNECT", HTTP_CONNECT },
	};
	/* Methods are case-sensitive (RFC 9110 §9.1): "get" is some other method. */
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
		if (strlen(known[i].name) == n && memcmp(known[i].name, m, n) == 0)
			return known[i].m;
	return HTTP_OTHER;
}

/* Parses 1*DIGIT into *out; -1 for anything else or an overflow. */
static int parse_length(const char *s, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	if (n == 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		unsigned d = (unsigned)(s[i] - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

/* Content-Length (RFC 9112 §6.3 rule 5): every field and every list element must name one
 * and the same number; two differing lengths make the framing unknowable. */
static int read_lengths(const struct http_head *h, uint64_t *out, int *seen)
{
	*seen = 0;
	for (size_t i = 0; i < h->nfields; i++) {
		const struct http_field *f = &h->fields[i];
		if (!span_is(f->name, f->name_len, "Content-Length"))
			continue;
		const char *p = f->value, *end = f->value + f->value_len;
		for (;;) {
			const char *comma = memchr(p, ',', (size_t)(end - p));
			const char *e = comma ? comma : end;
			const char *s = p;
			while (s < e && (*s == ' ' || *s == '\t'))
				s++;
			while (e > s && (e[-1] == ' ' || e[-1] == '\t'))
				e--;
			uint64_t v;
			if (parse_length(s, (size_t)(e - s), &v) < 0)
				return -1;
			if (*seen && v != *out)
				return -1;
			*out = v;
			*seen = 1;
			if (comma == NULL)
				break;
			p = comma + 1;
		}
	}
	return 0;
}

static int fail(const char **why, const char *text, int status)
{
	*why = text;
	return status;
}

int http_parse_head(const char *buf, size_t len, struct http_head *h, const char **why)
{
	memset(h, 0, sizeof *h);
	if (len > HTTP_HEAD_MAX)
		return fail(why, HTTP_HEAD_TOO_LARGE, 431);
	const char *p = buf, *end = buf + len;
	while (end - p >= 2 && p[0] == '\r' && p[1] == '\n')
		p += 2;

	/* request-line = method SP request-target SP HTTP-version CRLF */
	const char *m = p;
	while (p < end && is_tchar((unsigned char)*p))
		p++;
	if (p == m || p >= end || *p != ' ')
		return fail(why, "the request line is malformed", 400);
	h->method_text = m;
	h->method_len = (size_t)(p - m);
	h->method = method_of(m, h->method_len);
	const char *t = ++p;
	/* Only the origin form: the agent is no proxy, and a caller that sends an absolute URI or
	 * '*' is not speaking this protocol. A target is visible ASCII (RFC 3986 leaves the rest to
	 * percent-encoding): a byte of 0x80 or above is refused, as llhttp refuses it, rather than
	 * passed to a route that some front-end may have read differently. */
	while (p < end && (unsigned char)*p > 0x20 && (unsigned char)*p < 0x7f)
		p++;
	if (p == t || p >= end || *p != ' ' || *t != '/')
		return fail(why, "the request target is malformed", 400);
	h->target = t;
	h->target_len = (size_t)(p - t);
	const char *q = memchr(t, '?', h->target_len);
	const char *frag = memchr(t, '#', h->target_len);
	if (frag)
		return fail(why, "the request target has a fragment", 400);
	h->path = t;
	h->path_len = q ? (size_t)(q - t) : h->target_len;
	if (q) {
		h->query = q + 1;
		h->query_len = h->target_len - h->path_len - 1;
	}
	p++;
	/* HTTP-version = "HTTP/" DIGIT "." DIGIT (RFC 9112 §2.3). Only 1.0 and 1.1 are served:
	 * another version's framing rules are not these, so it is refused (505) rather than read
	 * as 1.1; text that is no version at all is a malformed line. */
	if (end - p < 10 || memcmp(p, "HTTP/", 5) != 0 || !is_digit(p[5]) || p[6] != '.' ||
	    !is_digit(p[7]) || p[8] != '\r' || p[9] != '\n')
		return fail(why, "the request line is malformed", 400);
	if (p[5] != '1' || (p[7] != '0' && p[7] != '1'))
		return fail(why, "the agent speaks HTTP/1.0 and HTTP/1.1 only", 505);
	h->minor = p[7] - '0';
	p += 10;

	/* field-line = field-name ":" OWS field-value OWS CRLF, until the empty line */
	int connection_close = 0, connection_keep = 0, hosts = 0, te_fields = 0, expects = 0;
	while (p < end) {
		if (end - p >= 2 && p[0] == '\r' && p[1] == '\n') {
			p += 2;
			break;
		}
		if (*p == ' ' || *p == '\t')
			return fail(why, "obsolete line folding is refused", 400);
		const char *n = p;
		while (p < end && is_tchar((unsigned char)*p))
			p++;
		/* No whitespace between name and colon (RFC 9112 §5.1): a smuggling classic. */
		if (p == n || p >= end || *p != ':')
			return fail(why, "a header line is malformed", 400);
		size_t nlen = (size_t)(p - n);
		p++;
		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		const char *v = p;
		while (p < end && *p != '\r') {
			unsigned char c = (unsigned char)*p;
			if ((c < 0x20 && c != '\t') || c == 0x7f)
				return fail(why, "a header value holds a control character", 400);
			p++;
		}
		if (end - p < 2 || p[1] != '\n')
			return fail(why, "a header line does not end in CRLF", 400);
		const char *ve = p;
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			ve--;
		p += 2;
		if (h->nfields == HTTP_FIELDS_MAX)
			return fail(why, "the request has over " HTTP_SPELL(HTTP_FIELDS_MAX) " header fields",
				    431);
		struct http_field *f = &h->fields[h->nfields++];
		f->name = n;
		f->name_len = nlen;
		f->value = v;
		f->value_len = (size_t)(ve - v);
		if (span_is(n, nlen, "Host"))
			hosts++;
		else if (span_is(n, nlen, "Transfer-Encoding"))
			te_fields++;
		else if (span_is(n, nlen, "Connection")) {
			/* a comma-separated list of options; only close and keep-alive matter here */
			const char *o = v;
			while (o < ve) {
				const char *c = memchr(o, ',', (size_t)(ve - o));
				const char *oe = c ? c : ve, *os = o;
				while (os < oe && (*os == ' ' || *os == '\t'))
					os++;
				while (oe > os && (oe[-1] == ' ' || oe[-1] == '\t'))
					oe--;
				if (span_is(os, (size_t)(oe - os), "close"))
					connection_close = 1;
				else if (span_is(os, (size_t)(oe - os), "keep-alive"))
					connection_keep = 1;
				o = c ? c + 1 : ve;
			}
		} else if (span_is(n, nlen, "Expect")) {
			if (!span_is(v, (size_t)(ve - v), "100-continue"))
				return fail(why, "the only expectation understood is 100-continue", 417);
			expects++;
		}
	}
	if (p != end)
		return fail(why, "the request head is malformed", 400);
	/* RFC 9112 §3.2: more than one Host is a 400, and so is none in HTTP/1.1. */
	if (hosts > 1)
		return fail(why, "the request has more than one Host", 400);
	if (hosts == 0 && h->minor == 1)
		return fail(why, "an HTTP/1.1 request without Host", 400);
	/* RFC 9110 §10.1.1: a 100-continue expectation in HTTP/1.0 is ignored; a 1.0 client cannot
	 * be sent an interim answer. */
	h->expect_continue = expects > 0 && h->minor >= 1;

	int has_length;
	if (read_lengths(h, &h->content_length, &has_length) < 0)
		return fail(why, "Content-Length is invalid or given twice with different values", 400);
	if (te_fields > 0) {
		/* RFC 9112 §6.1: Transfer-Encoding in HTTP/1.0 means the framing is faulty; with a
		 * Content-Length the two could disagree on where the body ends, so both are refused
		 * rather than one chosen. Only chunked alone is implemented. */
		if (h->minor == 0)
			return fail(why, "Transfer-Encoding in an HTTP/1.0 request", 400);
		if (has_length)
			return fail(why, "Transfer-Encoding together with Content-Length", 400);
		const struct http_field *te = http_field(h, "Transfer-Encoding", NULL);
		if (te_fields > 1 || !span_is(te->value, te->value_len, "chunked"))
			return fail(why, "the only transfer coding implemented is chunked", 501);
		h->chunked = 1;
		h->content_length = 0;
	}
	h->keep_alive = h->minor >= 1 ? !connection_close : (connection_keep && !connection_close);
	return 0;
}

const struct http_field *http_field(const struct http_head *h, const char *name, int *count)
{
	const struct http_field *first = NULL;
	int n = 0;
	for (size_t i = 0; i < h->nfields; i++) {
		if (span_is(h->fields[i].name, h->fields[i].name_len, name)) {
			if (first == NULL)
				first = &h->fields[i];
			n++;
		}
	}
	if (count)
		*count = n;
	return first;
}

int http_bearer(const char *value, size_t len, const char **token, size_t *token_len)
{
	/* Spelt exactly so: every client of this protocol sends it so, and one spelling leaves
	 * nothing for two readers to disagree on. */
	static const char scheme[] = "Bearer ";
	size_t n = sizeof scheme - 1;
	if (len < n || memcmp(value, scheme, n) != 0)
		return 0;
	*token = value + n;
	*token_len = len - n;
	return 1;
}

/*
 * The decoder's states. A chunk line is chunk-size [ chunk-ext ] CRLF, with
 *   chunk-ext = *( BWS ";" BWS ext-name [ BWS "=" BWS ( token / quoted-string ) ] )
 * and the trailer section is field lines (name ":" value), each CRLF, then an empty line (RFC
 * 9112 §7.1). Each is held to that grammar, as llhttp holds it: bytes a lenient reader skips
 * are where a front-end that reads them differently could find another body end.
 */
enum {
	CK_SIZE,            /* hex digits of the size */
	CK_SIZE_BWS,        /* whitespace after the size: a ';' must follow */
	CK_EXT_NAME_START,  /* after ';', before the extension's name */
	CK_EXT_NAME,
	CK_EXT_AFTER_NAME,  /* whitespace after a name: '=', ';' or the line's end */
	CK_EXT_VALUE_START, /* after '=' */
	CK_EXT_TOKEN,
	CK_EXT_QUOTED,
	CK_EXT_QUOTED_PAIR, /* after a backslash inside quotes */
	CK_EXT_AFTER_VALUE, /* whitespace after a value: ';' or the line's end */
	CK_SIZE_LF,
	CK_DATA, CK_DATA_CR, CK_DATA_LF,
	CK_TRAILER_START,   /* the start of a trailer line, or the empty line that ends the body */
	CK_TRAILER_NAME,
	CK_TRAILER_VALUE,
	CK_TRAILER_LF,
	CK_END_LF,          /* the LF of the empty line */
	CK_DONE,
	CK_FAILED           /* for ever after an error */
};

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)lower((unsigned char)c);
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

static int is_ws(unsigned char c)
{
	return c == ' ' || c == '\t';
}

/* quoted-string's qdtext and quoted-pair's second byte (RFC 9110 §5.6.4), obs-text included. */
static int is_qdtext(unsigned char c)
{
	return c == '\t' || c == ' ' || c == 0x21 || (c >= 0x23 && c <= 0x5b) ||
	       (c >= 0x5d && c <= 0x7e) || c >= 0x80;
}

static int is_pair_byte(unsigned char c)
{
	return c == '\t' || (c >= 0x20 && c != 0x7f);
}

/* One byte of a chunk line after its size: the next state, or -1 when the line is malformed. */
static int ext_step(int state, unsigned char ch)
{
	switch (state) {
	case CK_SIZE_BWS:
		return is_ws(ch) ? CK_SIZE_BWS : ch == ';' ? CK_EXT_NAME_START : -1;
	case CK_EXT_NAME_START:
		return is_ws(ch) ? CK_EXT_NAME_START : is_tchar(ch) ? CK_EXT_NAME : -1;
	case CK_EXT_NAME:
	case CK_EXT_AFTER_NAME:
		if (state == CK_EXT_NAME && is_tchar(ch))
			return CK_EXT_NAME;
		return is_ws(ch) ? CK_EXT_AFTER_NAME : ch == '=' ? CK_EXT_VALUE_START
			: ch == ';' ? CK_EXT_NAME_START : ch == '\r' ? CK_SIZE_LF : -1;
	case CK_EXT_VALUE_START:
		return is_ws(ch) ? CK_EXT_VALUE_START : ch == '"' ? CK_EXT_QUOTED
			: is_tchar(ch) ? CK_EXT_TOKEN : -1;
	case CK_EXT_TOKEN:
	case CK_EXT_AFTER_VALUE:
		if (state == CK_EXT_TOKEN && is_tchar(ch))
			return CK_EXT_TOKEN;
		return is_ws(ch) ? CK_EXT_AFTER_VALUE : ch == ';' ? CK_EXT_NAME_START
			: ch == '\r' ? CK_SIZE_LF : -1;
	case CK_EXT_QUOTED:
		return ch == '"' ? CK_EXT_AFTER_VALUE : ch == '\\' ? CK_EXT_QUOTED_PAIR
			: is_qdtext(ch) ? CK_EXT_QUOTED : -1;
	case CK_EXT_QUOTED_PAIR:
		return is_pair_byte(ch) ? CK_EXT_QUOTED : -1;
	}
	return -1;
}

/* One byte of the trailer section: the next state, or -1 when it is not a field line. */
static int trailer_step(int state, unsigned char ch)
{
	switch (state) {
	case CK_TRAILER_START:
		/* a line that starts with whitespace is obsolete folding: refused as in a head */
		return ch == '\r' ? CK_END_LF : is_tchar(ch) ? CK_TRAILER_NAME : -1;
	case CK_TRAILER_NAME:
		return is_tchar(ch) ? CK_TRAILER_NAME : ch == ':' ? CK_TRAILER_VALUE : -1;
	case CK_TRAILER_VALUE:
		return ch == '\r' ? CK_TRAILER_LF : (ch < 0x20 && ch != '\t') || ch == 0x7f ? -1
			: CK_TRAILER_VALUE;
	case CK_TRAILER_LF:
		return ch == '\n' ? CK_TRAILER_START : -1;
	}
	return -1;
}

int http_chunked_step(struct http_chunked *c, const char *in, size_t len, size_t *used,
		      size_t *data_off, size_t *data_len)
{
	size_t i = 0;
	while (i < len) {
		unsigned char ch = (unsigned char)in[i];
		switch (c->state) {
		case CK_SIZE: {
			int d = hexval((char)ch);
			if (d >= 0) {
				if (++c->line > CHUNK_SIZE_DIGITS)
					goto error;
				c->left = c->left * 16 + (uint64_t)d;
				i++;
				break;
			}
			if (c->line == 0)
				goto error;
			if (ch != '\r' && ch != ';' && !is_ws(ch))
				goto error;
			c->state = ch == '\r' ? CK_SIZE_LF : ch == ';' ? CK_EXT_NAME_START : CK_SIZE_BWS;
			i++;
			break;
		}
		case CK_SIZE_BWS:
		case CK_EXT_NAME_START:
		case CK_EXT_NAME:
		case CK_EXT_AFTER_NAME:
		case CK_EXT_VALUE_START:
		case CK_EXT_TOKEN:
		case CK_EXT_QUOTED:
		case CK_EXT_QUOTED_PAIR:
		case CK_EXT_AFTER_VALUE:
		{
			/* Extensions are read and ignored (RFC 9112 §7.1.1), but a line has a bound. */
			int next = ext_step(c->state, ch);
			if (++c->line > CHUNK_LINE_MAX || next < 0)
				goto error;
			c->state = next;
			i++;
			break;
		}
		case CK_SIZE_LF:
			if (ch != '\n')
				goto error;
			i++;
			c->line = 0;
			c->state = c->left ? CK_DATA : CK_TRAILER_START;
			break;
		case CK_DATA: {
			size_t n = len - i;
			if ((uint64_t)n > c->left)
				n = (size_t)c->left;
			c->left -= n;
			if (c->left == 0)
				c->state = CK_DATA_CR;
			*data_off = i;
			*data_len = n;
			*used = i + n;
			return HTTP_CHUNKED_DATA;
		}
		case CK_DATA_CR:
			if (ch != '\r')
				goto error;
			c->state = CK_DATA_LF;
			i++;
			break;
		case CK_DATA_LF:
			if (ch != '\n')
				goto error;
			c->state = CK_SIZE;
			c->line = 0;
			i++;
			break;
		case CK_TRAILER_START:
		case CK_TRAILER_NAME:
		case CK_TRAILER_VALUE:
		case CK_TRAILER_LF:
		{
			int next = trailer_step(c->state, ch);
			if (++c->trailers > CHUNK_TRAILERS_MAX || next < 0)
				goto error;
			c->state = next;
			i++;
			break;
		}
		case CK_END_LF:
			if (ch != '\n')
				goto error;
			i++;
			c->state = CK_DONE;
			*used = i;
			return HTTP_CHUNKED_DONE;
		case CK_DONE:
			*used = i;
			return HTTP_CHUNKED_DONE;
		default:
			goto error;
		}
	}
	*used = i;
	if (c->state == CK_FAILED)
		return HTTP_CHUNKED_ERROR;
	return c->state == CK_DONE ? HTTP_CHUNKED_DONE : HTTP_CHUNKED_MORE;
error:
	c->state = CK_FAILED;
	*used = i;
	return HTTP_CHUNKED_ERROR;
}

long http_query_param(const char *query, size_t query_len, const char *name, char *out)
{
	size_t nlen = strlen(name);
	const char *p = query, *end = query + query_len;
	while (p < end) {
		const char *amp = memchr(p, '&', (size_t)(end - p));
		const char *e = amp ? amp : end;
		if ((size_t)(e - p) > nlen && memcmp(p, name, nlen) == 0 && p[nlen] == '=') {
			long o = 0;
			for (const char *s = p + nlen + 1; s < e; s++) {
				if (*s == '+') {
					out[o++] = ' ';
				} else if (*s == '%') {
					int hi = e - s > 2 ? hexval(s[1]) : -1, lo = e - s > 2 ? hexval(s[2]) : -1;
					if (hi < 0 || lo < 0)
						return -2;
					out[o++] = (char)(hi * 16 + lo);
					s += 2;
				} else {
					out[o++] = *s;
				}
			}
			out[o] = '\0';
			return o;
		}
		p = amp ? amp + 1 : end;
	}
	return -1;
}
