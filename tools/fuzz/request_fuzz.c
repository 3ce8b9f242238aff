/*
 * request_fuzz.c — libFuzzer target for what sandkit-agent reads from a caller before any
 * handler runs: the request head (src/agent/http_parse.c), the chunked body decoder fed in
 * pieces, the query string, and the exec/job body's JSON (src/agent/request.c).
 *   make fuzz FUZZ_TARGETS=request
 * sources: src/agent/http_parse.c src/agent/request.c src/common/json.c
 * options: -max_len=20000
 *
 * The input's first byte picks the piece size for the chunked decoder. The input is taken as a
 * head followed by a body: the body is decoded as chunked when the head says so, else parsed as
 * an exec body. Checked on top of the sanitizers: every span the parser hands back lies inside
 * the input, the decoder never returns more data than it was fed, a decoder that failed or
 * finished stays so, and a head taken is HTTP/1.0 or 1.1, with Host in 1.1, a target of visible
 * ASCII, and no 100-continue to invite in 1.0.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/http_parse.h"
#include "agent/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void inside(const char *base, size_t len, const char *p, size_t n)
{
	if (p == NULL && n == 0)
		return;
	if (p < base || p + n > base + len)
		abort();
}

static void chunked(const char *body, size_t len, size_t piece)
{
	struct http_chunked c;
	memset(&c, 0, sizeof c);
	size_t fed = 0, out = 0;
	/* After the end, what follows (the next request) is offered once more: the decoder must
	 * stay ended, taking nothing of it. After a failure the server stops feeding it. */
	int ended = 0, stop = 0;
	while (fed < len && !stop) {
		size_t n = len - fed < piece ? len - fed : piece;
		const char *in = body + fed;
		size_t left = n;
		while (left > 0) {
			size_t used = 0, off = 0, dn = 0;
			int r = http_chunked_step(&c, in, left, &used, &off, &dn);
			if (used > left || (r == HTTP_CHUNKED_DATA && (off + dn > used || dn == 0)))
				abort();
			if (ended && (r != HTTP_CHUNKED_DONE || used != 0))
				abort(); /* nothing after the end */
			if (r == HTTP_CHUNKED_DATA)
				out += dn;
			in += used;
			left -= used;
			if (r == HTTP_CHUNKED_ERROR || (r == HTTP_CHUNKED_DONE && ended)) {
				stop = 1;
				break;
			}
			if (r == HTTP_CHUNKED_DONE)
				ended = 1;
			else if (r == HTTP_CHUNKED_MORE && used == 0)
				abort(); /* no progress on input that is there */
		}
		fed += n;
	}
	if (out > len)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t piece = (size_t)data[0] % 64 + 1;
	const char *buf = (const char *)data + 1;
	size_t len = size - 1;

	size_t hl = http_head_length(buf, len < HTTP_HEAD_MAX ? len : HTTP_HEAD_MAX);
	if (hl > len)
		abort();
	const char *body = buf + hl;
	size_t body_len = len - hl;
	if (hl > 0) {
		struct http_head h;
		const char *why = NULL;
		int status = http_parse_head(buf, hl, &h, &why);
		if (status != 0 && why == NULL)
			abort();
		if (status == 0) {
			inside(buf, hl, h.method_text, h.method_len);
			inside(buf, hl, h.target, h.target_len);
			inside(buf, hl, h.path, h.path_len);
			inside(buf, hl, h.query, h.query_len);
			if (h.nfields > HTTP_FIELDS_MAX || (h.chunked && h.content_length != 0))
				abort();
			if (h.minor > 1 || (h.minor == 1 && http_field(&h, "Host", NULL) == NULL) ||
			    (h.minor == 0 && h.expect_continue))
				abort();
			for (size_t i = 0; i < h.target_len; i++)
				if ((unsigned char)h.target[i] < 0x21 || (unsigned char)h.target[i] > 0x7e)
					abort();
			for (size_t i = 0; i < h.nfields; i++) {
				inside(buf, hl, h.fields[i].name, h.fields[i].name_len);
				inside(buf, hl, h.fields[i].value, h.fields[i].value_len);
			}
			if (h.query) {
				char *v = malloc(h.query_len + 1);
				if (v) {
					long n = http_query_param(h.query, h.query_len, "path", v);
					if (n > (long)h.query_len)
						abort();
					free(v);
				}
			}
			if (h.chunked) {
				chunked(body, body_len, piece);
				return 0;
			}
		}
	}
	/* The rest (or all of it, when there is no head) as an exec or job body. */
	const char *json = hl > 0 ? body : buf;
	size_t json_len = hl > 0 ? body_len : len;
	struct cmd_request r;
	int rc = cmd_request_parse(json, json_len, &r);
	if (rc == -1 && r.invalid == NULL)
		abort();
	if (rc == 0 && r.invalid == NULL && (r.argv == NULL || r.argv[0] == NULL || r.timeout_ms == 0))
		abort(); /* a request taken as valid names a command and a timeout */
	cmd_request_free(&r);
	chunked(json, json_len, piece);
	return 0;
}
