/*
 * frames_fuzz.c — libFuzzer target for the frame decoder and the JSON reader under it.
 *   make fuzz FUZZ_TARGETS=frames
 * sources: src/frames.c src/json.c src/base64.c
 * options: -max_len=8192
 *
 * The input's first byte picks a chunk size, so frames arrive split at every possible place,
 * and (its top bit) whether payloads are kept as base64; the rest is fed as the body. Checked
 * on top of the sanitizers: the decoder never hands back more payload than the line could
 * encode, never a frame after a failure, never holds back more than one line, and base64 it
 * kept as checked is base64 the decoder would decode.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/base64.h"
#include "../../src/frames.h"

#define FUZZ_MAX_LINE 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t chunk = (size_t)data[0] % 64 + 1;
	int keep = data[0] & 0x80;
	const char *body = (const char *)data + 1;
	size_t left = size - 1;
	sk_frames *d = sk_frames_new(FUZZ_MAX_LINE);
	if (d == NULL)
		return 0;
	if (keep)
		sk_frames_keep_base64(d);
	int failed = 0;
	while (left > 0) {
		size_t n = left < chunk ? left : chunk;
		const char *in = body;
		size_t in_len = n;
		body += n;
		left -= n;
		for (;;) {
			sk_frame f;
			int r = sk_frames_decode(d, &in, &in_len, &f);
			if (r == SK_FRAMES_FRAME) {
				if (failed)
					abort(); /* nothing may follow a failure */
				int output = f.type == SK_FRAME_STDOUT || f.type == SK_FRAME_STDERR;
				if (output && f.data_len > (keep ? FUZZ_MAX_LINE : FUZZ_MAX_LINE / 4 * 3))
					abort();
				if (output && keep) {
					static unsigned char decoded[FUZZ_MAX_LINE];
					size_t n;
					if (!f.data_is_base64 ||
					    sk_b64_decode((const char *)f.data, f.data_len, decoded, &n) < 0)
						abort();
				}
				continue;
			}
			if (r == SK_FRAMES_FAILED) {
				failed = 1;
				if (sk_frames_error(d) == NULL)
					abort();
			}
			break;
		}
		if (sk_frames_pending(d) > FUZZ_MAX_LINE)
			abort();
	}
	sk_frames_free(d);
	return 0;
}
