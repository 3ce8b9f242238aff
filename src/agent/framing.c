/* framing.c — see framing.h. */
#include "framing.h"

#include "common/frames.h"
#include "exec.h"

#include <event2/buffer.h>

const char *framing_content_type(enum framing f)
{
	return f == FRAMING_BINARY ? "application/vnd.sandkit.frames" : "application/x-ndjson";
}

/* A binary frame's header: its kind, and the length of the body that follows (≤ 64 KiB of
 * output plus its seq here, far under any reader's bound). */
static int binary_head(struct evbuffer *out, unsigned char kind, size_t body)
{
	unsigned char head[SK_FRAMES_BINARY_HEAD] = { kind, (unsigned char)(body >> 24),
		(unsigned char)(body >> 16), (unsigned char)(body >> 8), (unsigned char)body };
	return evbuffer_add(out, head, sizeof head);
}

int framing_output(struct evbuffer *out, enum framing f, int stream, uint64_t seq,
		   const unsigned char *data, size_t len)
{
	if (f == FRAMING_NDJSON)
		return frame_data(out, stream, seq, data, len) < 0 || evbuffer_add(out, "\n", 1) < 0
			? -1 : 0;
	unsigned char seq_be[SK_FRAMES_BINARY_SEQ];
	for (int i = 0; i < SK_FRAMES_BINARY_SEQ; i++)
		seq_be[i] = (unsigned char)(seq >> (8 * (SK_FRAMES_BINARY_SEQ - 1 - i)));
	unsigned char kind = stream == STREAM_STDERR ? SK_FRAMES_BINARY_STDERR : SK_FRAMES_BINARY_STDOUT;
	return binary_head(out, kind, sizeof seq_be + len) < 0 ||
	       evbuffer_add(out, seq_be, sizeof seq_be) < 0 || evbuffer_add(out, data, len) < 0
		? -1 : 0;
}

int framing_json(struct evbuffer *out, enum framing f, const char *text, size_t len)
{
	if (f == FRAMING_NDJSON)
		return evbuffer_add(out, text, len) < 0 || evbuffer_add(out, "\n", 1) < 0 ? -1 : 0;
	return binary_head(out, SK_FRAMES_BINARY_JSON, len) < 0 || evbuffer_add(out, text, len) < 0
		? -1 : 0;
}

int framing_terminal(struct evbuffer *out, enum framing f, const struct outcome *o)
{
	if (f == FRAMING_NDJSON)
		return frame_terminal(out, o) < 0 || evbuffer_add(out, "\n", 1) < 0 ? -1 : 0;
	/* Its length goes first: the text is made aside, then moved in behind its header. */
	struct evbuffer *text = evbuffer_new();
	int r = text == NULL || frame_terminal(text, o) < 0 ||
		binary_head(out, SK_FRAMES_BINARY_JSON, evbuffer_get_length(text)) < 0 ||
		evbuffer_add_buffer(out, text) < 0 ? -1 : 0;
	if (text)
		evbuffer_free(text);
	return r;
}
