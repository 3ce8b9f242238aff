/*
 * base64.h — standard base64 with padding (RFC 4648 §4), strict: plain C ABI, no allocation.
 *
 * Strict means: only the standard alphabet, length a multiple of four, padding only at the
 * end and only as much as the last group needs, and the unused bits of the last symbol zero.
 * Anything else is refused rather than guessed at, because a payload that decodes two ways
 * is not a payload.
 */
#ifndef SANDKIT_BASE64_H
#define SANDKIT_BASE64_H

#include <stddef.h>

/* Bytes needed to encode n bytes; the caller checks n against SIZE_MAX / 4 * 3 first. */
#define SK_B64_ENCODED_LEN(n) ((((n) + 2) / 3) * 4)
/* Upper bound of the bytes that n base64 symbols decode to. */
#define SK_B64_DECODED_MAX(n) (((n) / 4) * 3)

/* Writes SK_B64_ENCODED_LEN(len) bytes to out (no terminator). */
void sk_b64_encode(const unsigned char *in, size_t len, char *out);

/*
 * Decodes len symbols into out, which holds at least SK_B64_DECODED_MAX(len) bytes.
 * Returns 0 and stores the decoded length in *out_len, or -1 when the input is not strict
 * standard base64 (then *out_len is the offset of the first offending symbol).
 */
int sk_b64_decode(const char *in, size_t len, unsigned char *out, size_t *out_len);

/*
 * Whether len symbols are strict standard base64, by the same rules as sk_b64_decode, without
 * writing anything: 0, or -1 with the offset of the first offending symbol in *bad_at.
 */
int sk_b64_check(const char *in, size_t len, size_t *bad_at);

#endif
