/*
 * http_parse.h — the agent's HTTP/1.1 request syntax (RFC 9112), without I/O: the request head,
 * the framing rules that decide how long the body is, the chunked body decoder and the query
 * string. Everything here works on bytes the caller holds and allocates nothing, so the fuzz
 * target (tools/fuzz/request_fuzz.c) runs exactly the code the agent runs.
 */
#ifndef SANDKIT_AGENT_HTTP_PARSE_H
#define SANDKIT_AGENT_HTTP_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* Request line and headers together. Protocol requests carry a few hundred bytes; 16 KiB is
 * what nginx allows a header line and leaves room for any proxy's additions, while a thousand
 * connections still hold at most 16 MiB of heads. */
#define HTTP_HEAD_MAX 16384
/* Header fields per request: far above the dozen any client or proxy sends. */
#define HTTP_FIELDS_MAX 64
/* The refusals that name these bounds spell them from the constants (plain numbers, so that
 * the preprocessor can). A head with no end within HTTP_HEAD_MAX is refused in these words
 * whether the parser or the connection finds it. */
#define HTTP_SPELL(n) HTTP_SPELL_DIGITS(n)
#define HTTP_SPELL_DIGITS(n) #n
#define HTTP_HEAD_TOO_LARGE "the request head is over " HTTP_SPELL(HTTP_HEAD_MAX) " bytes"

enum http_method {
	HTTP_GET = 1, HTTP_POST, HTTP_PUT, HTTP_HEAD, HTTP_DELETE, HTTP_OPTIONS, HTTP_PATCH,
	HTTP_TRACE, HTTP_CONNECT, HTTP_OTHER
};

struct http_field {
	const char *name, *value; /* spans of the head; value without surrounding whitespace */
	size_t name_len, value_len;
};

struct http_head {
	enum http_method method;
	const char *method_text, *target, *path, *query; /* query NULL when absent */
	size_t method_len, target_len, path_len, query_len;
	int minor;                /* HTTP/1.minor */
	struct http_field fields[HTTP_FIELDS_MAX];
	size_t nfields;
	/* Framing (RFC 9112 §6): */
	int chunked;
	uint64_t content_length;  /* 0 when chunked or absent */
	int keep_alive;
	int expect_continue;
};

/*
 * Length of the head at the start of buf (request line through the empty line), 0 when it is
 * not complete yet. Leading empty lines before a request are part of it (RFC 9112 §2.2).
 */
size_t http_head_length(const char *buf, size_t len);

/*
 * Parses a complete head of len bytes (as measured by http_head_length). Returns 0, or the
 * status to refuse it with (400, 417, 431, 501, 505) and a static reason in *why. h points into
 * buf afterwards.
 */
int http_parse_head(const char *buf, size_t len, struct http_head *h, const char **why);

/* The value of the first field named name (case-insensitive), its count in *count. */
const struct http_field *http_field(const struct http_head *h, const char *name, int *count);

/* The token of an Authorization value "Bearer <token>" (RFC 6750 §2.1): 1 with *token
 * spanning it inside value, 0 for any other value. */
int http_bearer(const char *value, size_t len, const char **token, size_t *token_len);

/* The chunked transfer coding (RFC 9112 §7.1), fed in pieces. */
struct http_chunked {
	int state;
	uint64_t left;     /* data bytes still to come in the current chunk */
	size_t line;       /* bytes of the current size or trailer line seen */
	size_t trailers;   /* trailer bytes seen */
};

enum { HTTP_CHUNKED_MORE = 0, HTTP_CHUNKED_DATA = 1, HTTP_CHUNKED_DONE = 2, HTTP_CHUNKED_ERROR = -1 };

/*
 * Consumes from in[0..len): returns HTTP_CHUNKED_DATA with *data_off and *data_len naming body bytes
 * inside in, HTTP_CHUNKED_MORE when all of in was consumed without data, HTTP_CHUNKED_DONE after
 * the last chunk and its trailers, or HTTP_CHUNKED_ERROR. *used is what was consumed (data
 * included); call again with the rest.
 */
int http_chunked_step(struct http_chunked *c, const char *in, size_t len, size_t *used,
		      size_t *data_off, size_t *data_len);

/*
 * Finds name in a query string (a=b&c=d) and percent-decodes its value into out (room for
 * query_len + 1 bytes always suffices), '+' being a space. Returns the decoded length, -1 when
 * absent, -2 when the value has a bad escape.
 */
long http_query_param(const char *query, size_t query_len, const char *name, char *out);

#endif
