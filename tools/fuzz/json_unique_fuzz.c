/*
 * json_unique_fuzz.c — libFuzzer target for the repeated-member check of JSON answers.
 *   make fuzz FUZZ_TARGETS=json_unique
 * sources: src/common/json_unique.c src/common/json.c
 * options: -max_len=4096
 *
 * The input is the text. Checked on top of the sanitizers, against a second reading made the
 * plain way (recursion bounded by the reader's depth, every pair of names in an object
 * unescaped and compared byte for byte, no sorting): a text is passed exactly when it is valid
 * and no object repeats a name, refused as repeated only when some object does, and a
 * reported name is a quoted string of the text equal to another name.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/json_unique.h"

#define FUZZ_MAX_LEN 4096
/* Names of one object the plain reading keeps: every name takes at least four bytes. */
#define FUZZ_MAX_NAMES (FUZZ_MAX_LEN / 4 + 1)

/* The plain reading of one value: -1 invalid, else whether an object in it repeats a name. */
static int plain_value(sk_json *j)
{
	enum sk_json_kind kind = sk_json_peek(j);
	int dup = 0, r;
	if (kind == SK_JSON_ARRAY) {
		if (sk_json_array_begin(j) < 0)
			return -1;
		while ((r = sk_json_array_next(j)) == 1) {
			int d = plain_value(j);
			if (d < 0)
				return -1;
			dup |= d;
		}
		return r < 0 ? -1 : dup;
	}
	if (kind != SK_JSON_OBJECT)
		return sk_json_skip(j) < 0 ? -1 : 0;
	sk_json_str *names = malloc(FUZZ_MAX_NAMES * sizeof *names);
	size_t n = 0;
	if (names == NULL || sk_json_object_begin(j) < 0)
		goto invalid;
	while ((r = sk_json_object_key(j, &names[n])) == 1) {
		n++;
		int d = plain_value(j);
		if (d < 0)
			goto invalid;
		dup |= d;
	}
	if (r < 0)
		goto invalid;
	for (size_t a = 0; a < n && !dup; a++) {
		for (size_t b = a + 1; b < n && !dup; b++) {
			static char x[FUZZ_MAX_LEN], y[FUZZ_MAX_LEN];
			size_t nx = sk_json_unescape(&names[a], x), ny = sk_json_unescape(&names[b], y);
			dup = nx == ny && memcmp(x, y, nx) == 0;
		}
	}
	free(names);
	return dup;
invalid:
	free(names);
	return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > FUZZ_MAX_LEN)
		return 0;
	const char *text = (const char *)data;
	sk_json j;
	sk_json_init(&j, text, size);
	int plain = plain_value(&j);
	if (plain >= 0 && sk_json_finish(&j) < 0)
		plain = -1;
	sk_json_unique_report report;
	enum sk_json_unique_result rc = sk_json_unique(text, size, &report);
	if (rc == SK_JSON_UNIQUE_NO_MEMORY)
		return 0;
	/* Passed exactly when valid with no repeat; a valid text is never called unreadable. */
	if ((rc == SK_JSON_UNIQUE_OK) != (plain == 0))
		abort();
	if (plain == 1 && rc != SK_JSON_UNIQUE_REPEATED)
		abort();
	if (rc == SK_JSON_UNIQUE_UNREADABLE && (report.err == NULL || report.at > size))
		abort();
	if (rc == SK_JSON_UNIQUE_REPEATED) {
		/* A repeat may be found before a later flaw, so the plain reading may call the text
		 * invalid; it never finds the text clean. */
		if (plain == 0 || report.at >= size || text[report.at] != '"' ||
		    report.name.p != text + report.at + 1 || report.name.p + report.name.len >= text + size ||
		    report.name.p[report.name.len] != '"')
			abort();
	}
	return 0;
}
