/*
 * json.h — a small strict JSON (RFC 8259) pull reader over one complete text in memory.
 * Plain C ABI, no allocation: strings come back as spans of the input, unescaped on request
 * into the caller's buffer. Shared by the frame decoder and sandkit-agent so that both sides
 * of the protocol read JSON by the same rules.
 *
 * Limits: nesting deeper than SK_JSON_MAX_DEPTH is refused (a hostile body cannot exhaust the
 * stack); numbers are read as 64-bit integers only where the protocol needs integers. Strings
 * are checked for control characters and escape syntax; their bytes are not checked for UTF-8
 * well-formedness and pass through as they are.
 */
#ifndef SANDKIT_JSON_H
#define SANDKIT_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Deep enough for any body the protocol defines (three levels), shallow enough to be cheap. */
#define SK_JSON_MAX_DEPTH 32

enum sk_json_kind {
	SK_JSON_INVALID = -1,
	SK_JSON_NULL,
	SK_JSON_FALSE,
	SK_JSON_TRUE,
	SK_JSON_NUMBER,
	SK_JSON_STRING,
	SK_JSON_OBJECT,
	SK_JSON_ARRAY
};

typedef struct sk_json {
	const char *p;   /* next unread byte */
	const char *end; /* one past the last byte */
	const char *err; /* static text of the first failure, NULL while all is well */
	int depth;
	uint32_t first; /* bit d set: the container at depth d has read no element yet */
} sk_json;

/* A string value as it appears in the input, quotes excluded. */
typedef struct sk_json_str {
	const char *p;
	size_t len;
	int escaped; /* 0 when the span is the value itself */
} sk_json_str;

void sk_json_init(sk_json *j, const char *text, size_t len);

/* Kind of the next value, without consuming it. */
enum sk_json_kind sk_json_peek(sk_json *j);

/* Object members: call object_begin, then object_key until it returns 0 (the closing brace)
 * or -1 (failure); after each key returning 1, read or skip exactly one value. */
int sk_json_object_begin(sk_json *j);
int sk_json_object_key(sk_json *j, sk_json_str *key);

/* Array elements: array_begin, then array_next until 0 or -1, one value after each 1. */
int sk_json_array_begin(sk_json *j);
int sk_json_array_next(sk_json *j);

/* Scalar readers return 0 on success and -1 (with j->err set) otherwise. */
int sk_json_string(sk_json *j, sk_json_str *out);
int sk_json_bool(sk_json *j, int *out);
int sk_json_null(sk_json *j);
/* An integer without fraction or exponent, within the type's range. */
int sk_json_u64(sk_json *j, uint64_t *out);
int sk_json_i64(sk_json *j, int64_t *out);
/* Any value, nested ones included. */
int sk_json_skip(sk_json *j);
/* 0 when only whitespace remains. */
int sk_json_finish(sk_json *j);

/* Writes the string's value to dst (at least s->len bytes; an unescaped value is never longer
 * than its escaped form). Returns the value's length; the span was validated when it was read. */
size_t sk_json_unescape(const sk_json_str *s, char *dst);

/* sk_json_str_is for an escaped s, against lit of n bytes. */
int sk_json_str_is_escaped(const sk_json_str *s, const char *lit, size_t n);

/* 1 when the string's value equals the NUL-terminated lit; an escaped string compares by the
 * value it spells, as every other JSON reader would read it. Inline: every frame's members are
 * named through it, and with a literal the length and the comparison fold to a few
 * instructions, where a call measured a strlen and a memcmp per member name tried. */
static inline int sk_json_str_is(const sk_json_str *s, const char *lit)
{
	size_t n = strlen(lit);
	if (!s->escaped)
		return s->len == n && (n == 0 || memcmp(s->p, lit, n) == 0);
	return sk_json_str_is_escaped(s, lit, n);
}

/* Orders two strings by their values, bytes compared unsigned as memcmp does: negative, zero
 * (the same value, however each is escaped) or positive. */
int sk_json_str_cmp(const sk_json_str *a, const sk_json_str *b);

#endif
