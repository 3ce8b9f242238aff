/* http_parse.c — see http_parse.h. */
#include "http_parse.h"

#include <string.h>

/* Chunk extensions and trailers are read and dropped; one line of either this long is plenty
 * and keeps a hostile body from holding the decoder in a line for ever. */
#define CHUNK_LINE_MAX 1024
/* All trailers of one body together. */
#define CHUNK_TRAILERS_MAX 4096
/* Hex digits of a chunk size: 16 fill 64 bits; more would overflow. */
#define CHUNK_SIZE_DIGITS 16

static int is_tchar(unsigned char c)
{
	if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
		return 1;
	return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
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
	 * '*' is not speaking this protocol. Any control byte or space ends the target. */
	while (p < end && (unsigned char)*p > 0x20 && (unsigned char)*p != 0x7f)
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
	if (end - p < 10 || memcmp(p, "HTTP/1.", 7) != 0 || p[7] < '0' || p[7] > '9')
		return fail(why, "the request line does not name HTTP/1.x", 505);
	h->minor = p[7] - '0';
	if (p[8] != '\r' || p[9] != '\n')
		return fail(why, "the request line is malformed", 400);
	p += 10;

	/* field-line = field-name ":" OWS field-value OWS CRLF, until the empty line */
	int connection_close = 0, connection_keep = 0, hosts = 0, te_fields = 0;
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
			h->expect_continue = 1;
		}
	}
	if (p != end)
		return fail(why, "the request head is malformed", 400);
	/* RFC 9112 §3.2: more than one Host is a 400. */
	if (hosts > 1)
		return fail(why, "the request has more than one Host", 400);

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

enum { CK_SIZE, CK_EXT, CK_SIZE_LF, CK_DATA, CK_DATA_CR, CK_DATA_LF, CK_TRAILER, CK_TRAILER_LF,
       CK_DONE };

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c = (char)lower((unsigned char)c);
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

int http_chunked_step(struct http_chunked *c, const char *in, size_t len, size_t *used,
		      size_t *data_off, size_t *data_len)
{
	size_t i = 0;
	while (i < len) {
		char ch = in[i];
		switch (c->state) {
		case CK_SIZE: {
			int d = hexval(ch);
			if (d >= 0) {
				if (++c->line > CHUNK_SIZE_DIGITS)
					goto error;
				c->left = c->left * 16 + (uint64_t)d;
				i++;
				break;
			}
			if (c->line == 0)
				goto error;
			if (ch == ';' || ch == ' ' || ch == '\t') {
				c->state = CK_EXT;
			} else if (ch == '\r') {
				c->state = CK_SIZE_LF;
				i++;
			} else {
				goto error;
			}
			break;
		}
		case CK_EXT:
			/* Extensions are ignored (RFC 9112 §7.1.1), but a line has a bound. */
			if (ch == '\r') {
				c->state = CK_SIZE_LF;
			} else if ((unsigned char)ch < 0x20 && ch != '\t') {
				goto error;
			} else if (++c->line > CHUNK_LINE_MAX) {
				goto error;
			}
			i++;
			break;
		case CK_SIZE_LF:
			if (ch != '\n')
				goto error;
			i++;
			c->line = 0;
			c->state = c->left ? CK_DATA : CK_TRAILER;
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
		case CK_TRAILER:
			if (ch == '\r') {
				c->state = CK_TRAILER_LF;
			} else if (((unsigned char)ch < 0x20 && ch != '\t') || ++c->trailers > CHUNK_TRAILERS_MAX) {
				goto error;
			} else {
				c->line++;
			}
			i++;
			break;
		case CK_TRAILER_LF:
			if (ch != '\n')
				goto error;
			i++;
			if (c->line == 0) {
				c->state = CK_DONE;
				*used = i;
				return HTTP_CHUNKED_DONE;
			}
			c->line = 0;
			c->state = CK_TRAILER;
			break;
		default:
			*used = i;
			return HTTP_CHUNKED_DONE;
		}
	}
	*used = i;
	return c->state == CK_DONE ? HTTP_CHUNKED_DONE : HTTP_CHUNKED_MORE;
error:
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
