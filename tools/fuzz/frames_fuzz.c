/*
 * frames_fuzz.c — libFuzzer target for the frame decoder and the JSON reader under it.
 *   make fuzz FUZZ_TARGETS=frames
 * sources: src/common/frames.c src/common/json.c src/common/base64.c
 * defines: -DSK_FRAMES_KEPT=16
 * options: -max_len=8192
 *
 * The input's first byte picks a chunk size (its low five bits), so frames arrive split at every
 * possible place, whether (bit 0, shared with the size) the stream admits keep-alives, whether
 * (bit 5) it is a watch's (taking events and ends, not output), whether (bit 6) the decoder is told to give back its room after every frame and every
 * chunk, mid-line included, and (its top bit) whether payloads are kept as base64; the rest is
 * fed as the body. A body that starts with a binary frame's kind byte ('o', 'e', 'j', which as
 * NDJSON fails at once) is read in the binary syntax of docs/protocol.md §6 binaryFrames. Checked on top of the sanitizers: the decoder never hands back more payload
 * than the line could encode, never a frame after a failure, never holds back more than one
 * line, base64 it kept as checked is base64 the decoder would decode, and the frames (and
 * whether it failed) are those of the same body fed in one piece — whether a frame still
 * arriving is gathered at once or, as the Lua decoder does, left in its piece until the next.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/base64.h"
#include "common/frames.h"

#define FUZZ_MAX_LINE 4096

/* What a run decoded, to compare two ways of feeding the same body. */
struct outcome {
	uint64_t digest; /* FNV-1a over every frame's fields and bytes, in order */
	size_t frames;
	int failed;
};

static void mix(uint64_t *h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		*h = (*h ^ b[i]) * 0x100000001b3ULL;
}

/* Where the last frame that ends in the n bytes at in ends (0: none does): the first one's
 * end as d, holding what it holds, finds it; each after it where a decoder holding nothing
 * (fresh, of the same syntax) finds its own. */
static size_t last_whole(const sk_frames *d, const sk_frames *fresh, const char *in, size_t n)
{
	size_t at = sk_frames_whole(d, in, n, 0), step;
	if (at == 0)
		return 0;
	while (at < n && (step = sk_frames_whole(fresh, in + at, n - at, 0)) > 0)
		at += step;
	return at;
}

/* Feeds body in pieces of chunk bytes, checking every frame as it comes. held: as the Lua
 * decoder does, a frame still arriving is left in its piece (sk_frames_decode_whole) and
 * gathered when the next piece comes (sk_frames_gather). */
static struct outcome run(const char *body, size_t left, size_t chunk, int keep, int release,
                          int keepalive, int watch, int binary, int held_back)
{
	struct outcome o = { 0xcbf29ce484222325ULL, 0, 0 };
	sk_frames *d = sk_frames_new(FUZZ_MAX_LINE);
	sk_frames *fresh = sk_frames_new(FUZZ_MAX_LINE);
	if (d == NULL || fresh == NULL)
		abort();
	if (binary) {
		sk_frames_binary(d);
		sk_frames_binary(fresh);
	}
	/* The most payload a frame carries: a line's base64 (decoded unless kept), or a binary
	 * body's bytes as they came, kept or not (a relay that keeps base64 encodes them above
	 * this layer); and the most held back: a line, or a frame and its header. */
	size_t max_data = binary ? FUZZ_MAX_LINE - SK_FRAMES_BINARY_SEQ
				 : (keep ? FUZZ_MAX_LINE : FUZZ_MAX_LINE / 4 * 3);
	size_t max_pending = binary ? FUZZ_MAX_LINE + SK_FRAMES_BINARY_HEAD : FUZZ_MAX_LINE;
	if (keep)
		sk_frames_keep_base64(d);
	if (keepalive)
		sk_frames_admit(d, SK_FRAMES_KIND(SK_FRAME_KEEPALIVE));
	if (watch)
		sk_frames_expect(d, SK_FRAMES_KIND(SK_FRAME_EVENT) | SK_FRAMES_KIND(SK_FRAME_END) |
				    SK_FRAMES_KIND(SK_FRAME_ERROR));
	const char *tail = NULL;
	size_t tail_len = 0;
	while (left > 0) {
		size_t n = left < chunk ? left : chunk;
		const char *in = body;
		size_t in_len = n;
		if (tail_len > 0 && sk_frames_gather(d, tail, tail_len) != SK_FRAMES_AGAIN)
			abort(); /* it was under the bound, or decoding it would have failed */
		tail_len = 0;
		/* What the decoder says ends frames here ends exactly where decoding them does:
		 * what it holds back afterwards is what lies past that (checked below). */
		size_t held = sk_frames_pending(d);
		size_t whole = last_whole(d, fresh, in, n);
		if (whole > n)
			abort();
		body += n;
		left -= n;
		for (;;) {
			sk_frame f;
			int r = held_back ? sk_frames_decode_whole(d, &in, &in_len, &f)
					  : sk_frames_decode(d, &in, &in_len, &f);
			if (r == SK_FRAMES_FRAME) {
				if (o.failed)
					abort(); /* nothing may follow a failure */
				if (f.type == SK_FRAME_KEEPALIVE)
					abort(); /* consumed, never handed out */
				int output = f.type == SK_FRAME_STDOUT || f.type == SK_FRAME_STDERR;
				if (output && f.data_len > max_data)
					abort();
				if (output && binary && f.data_is_base64)
					abort();
				if (output && keep && !binary) {
					static unsigned char decoded[SK_B64_DECODED_MAX(SK_B64_ENCODED_LEN(FUZZ_MAX_LINE))];
					size_t m;
					if (!f.data_is_base64 ||
					    sk_b64_decode((const char *)f.data, f.data_len, decoded, &m) < 0)
						abort();
				}
				mix(&o.digest, &f.type, sizeof f.type);
				mix(&o.digest, &f.seq, sizeof f.seq);
				mix(&o.digest, &f.code, sizeof f.code);
				mix(&o.digest, &f.truncated, sizeof f.truncated);
				mix(&o.digest, &f.signal, sizeof f.signal);
				if (f.error_code_len)
					mix(&o.digest, f.error_code, f.error_code_len);
				if (f.data_len)
					mix(&o.digest, f.data, f.data_len);
				if (f.message_len)
					mix(&o.digest, f.message, f.message_len);
				/* A kind the stream does not take is never handed over. */
				int event = f.type == SK_FRAME_EVENT || f.type == SK_FRAME_END;
				if (event != (watch && f.type != SK_FRAME_ERROR) && f.type != SK_FRAME_ERROR)
					abort();
				if (f.type == SK_FRAME_EVENT) {
					mix(&o.digest, f.event, f.event_len);
					if (f.path)
						mix(&o.digest, f.path, f.path_len);
					if (f.from)
						mix(&o.digest, f.from, f.from_len);
				}
				if (f.type == SK_FRAME_END)
					mix(&o.digest, f.reason, f.reason_len);
				o.frames++;
				if (release)
					sk_frames_release(d);
				continue;
			}
			if (r == SK_FRAMES_FAILED) {
				o.failed = 1;
				if (sk_frames_error(d) == NULL)
					abort();
			}
			break;
		}
		if (held_back && !o.failed) {
			/* Only a frame still arriving is left behind. */
			if (in_len > 0 && sk_frames_whole(d, in, in_len, 0) > 0)
				abort();
			tail = in;
			tail_len = in_len;
		}
		if (sk_frames_pending(d) + tail_len > max_pending)
			abort();
		if (!o.failed && sk_frames_pending(d) + tail_len != (whole ? n - whole : held + n))
			abort();
		if (release)
			sk_frames_release(d);
	}
	sk_frames_free(d);
	sk_frames_free(fresh);
	return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t chunk = (size_t)(data[0] & 0x1f) + 1;
	int watch = data[0] & 0x20;
	int keep = data[0] & 0x80;
	int release = data[0] & 0x40;
	/* Shares its bit with the chunk size's parity: both still take every value. */
	int keepalive = data[0] & 0x01;
	int binary = size > 1 && (data[1] == SK_FRAMES_BINARY_STDOUT || data[1] == SK_FRAMES_BINARY_STDERR ||
				  data[1] == SK_FRAMES_BINARY_JSON);
	struct outcome split = run((const char *)data + 1, size - 1, chunk, keep, release, keepalive, watch,
				   binary, 0);
	struct outcome held = run((const char *)data + 1, size - 1, chunk, keep, release, keepalive, watch,
				  binary, 1);
	/* However the body was cut, whenever room was given back and wherever a frame still
	 * arriving waited, it decodes as it does in one piece. */
	struct outcome whole = run((const char *)data + 1, size - 1, size, keep, 0, keepalive, watch, binary, 0);
	if (split.digest != whole.digest || split.frames != whole.frames || split.failed != whole.failed)
		abort();
	if (held.digest != whole.digest || held.frames != whole.frames || held.failed != whole.failed)
		abort();
	return 0;
}
