/*
 * frames.h — incremental decoder for the agent's output stream (docs/protocol.md §3.3, §4), in
 * either of its two syntaxes: NDJSON lines, or the binary frames of §6 binaryFrames. One set of
 * rules for both: the same kinds, seq range, bounds and failures.
 * Sans-I/O with a plain C ABI, so the Lua C module and an FFI binding can share it:
 * hand it bytes as they arrive, take frames out.
 *
 * Input is consumed straight from the caller's buffer when a whole frame is in it; only a frame
 * split across reads is copied, into a buffer that never holds more than one frame.
 *
 * After the first failure the decoder delivers nothing more: a frame buffered behind a line
 * that did not parse must not answer the question that failure left open.
 */
#ifndef SANDKIT_FRAMES_H
#define SANDKIT_FRAMES_H

#include <stddef.h>
#include <stdint.h>

/*
 * Longest line accepted, newline included. A full 64 KiB data frame is about 87.4 KiB of base64
 * plus ~60 bytes of JSON; 1 MiB leaves room for a writer that escapes every '/' or sends long
 * error messages, and still bounds what one peer can make this process hold.
 */
#define SK_FRAMES_MAX_LINE ((size_t)1 << 20)

/*
 * The binary syntax (docs/protocol.md §6 binaryFrames): a frame is one kind byte, its body's
 * length as 4 bytes big-endian, then the body, whose length is bounded as a line is (the
 * decoder's max_line). An output frame's body is its seq as 8 bytes big-endian and then the
 * output's bytes as they are; a JSON frame's body is the text of any other frame (exit, error,
 * keepalive, event, end) as an NDJSON line holds it, without the newline.
 */
#define SK_FRAMES_BINARY_HEAD 5
#define SK_FRAMES_BINARY_SEQ 8
enum sk_frames_binary_kind { SK_FRAMES_BINARY_STDOUT = 'o', SK_FRAMES_BINARY_STDERR = 'e',
			     SK_FRAMES_BINARY_JSON = 'j' };

/*
 * The kinds of frame a stream may carry, told apart by `t`. A keep-alive ({"t":"keepalive"},
 * docs/protocol.md §6) says only that the connection is alive: it is consumed by the decoder
 * and never handed out, and a stream takes it only when it asked for it (sk_frames_admit). A
 * watch's stream (§6 fsWatch) carries events and ends with an `end` (or an `error`); it takes
 * those kinds alone (sk_frames_expect), and an exec stream never does.
 */
enum sk_frame_type { SK_FRAME_STDOUT = 1, SK_FRAME_STDERR, SK_FRAME_EXIT, SK_FRAME_ERROR,
	             SK_FRAME_KEEPALIVE, SK_FRAME_EVENT, SK_FRAME_END };

/* A set of kinds, for sk_frames_admit and sk_frames_expect: SK_FRAMES_KIND(SK_FRAME_EVENT) | … */
#define SK_FRAMES_KIND(type) (1u << (type))
/* What every stream takes unless told otherwise: an exec stream's output, exit and error. */
#define SK_FRAMES_KINDS_DEFAULT                                                              \
	(SK_FRAMES_KIND(SK_FRAME_STDOUT) | SK_FRAMES_KIND(SK_FRAME_STDERR) |                  \
	 SK_FRAMES_KIND(SK_FRAME_EXIT) | SK_FRAMES_KIND(SK_FRAME_ERROR))

typedef struct sk_frame {
	enum sk_frame_type type;
	uint64_t seq;               /* stdout/stderr: at most INT64_MAX (larger is refused) */
	const unsigned char *data;  /* stdout/stderr: decoded bytes, valid until the next call */
	size_t data_len;
	int32_t code;               /* exit */
	int truncated;              /* exit: 0 when absent */
	int has_signal;             /* exit: the `signal` extension was present */
	int32_t signal;
	int oom;                    /* exit: the `oom` extension said true (killed by a memory bound) */
	const char *error_code;     /* error: the frame's code, valid until the next call */
	size_t error_code_len;
	const char *message;        /* error: the frame's message, valid until the next call */
	size_t message_len;
	int data_is_base64;         /* stdout/stderr: data is the wire's base64 (sk_frames_keep_base64) */
	/* event: what happened (create, modify, remove, rename, overflow), to which path, and for
	 * a rename from which (NULL otherwise); valid until the next call */
	const char *event;
	size_t event_len;
	const char *path;           /* NULL for an overflow */
	size_t path_len;
	const char *from;
	size_t from_len;
	const char *reason;         /* end: why the stream ended, valid until the next call */
	size_t reason_len;
} sk_frame;

/* What went wrong: a line that is not a frame, a payload that is not base64, or a limit. */
enum sk_frames_failure {
	SK_FRAMES_NO_FAILURE = 0,
	SK_FRAMES_UNPARSABLE,  /* not JSON, unknown or unadmitted `t`, a missing or mistyped field */
	SK_FRAMES_UNDECODABLE, /* `data` is not strict standard base64 */
	SK_FRAMES_TOO_LONG,    /* a line over the decoder's limit */
	SK_FRAMES_NO_MEMORY
};

/* Return values of sk_frames_decode. */
#define SK_FRAMES_FRAME 1
#define SK_FRAMES_AGAIN 0
#define SK_FRAMES_FAILED (-1)

typedef struct sk_frames sk_frames;

/* max_line 0 means SK_FRAMES_MAX_LINE. Returns NULL when out of memory. */
sk_frames *sk_frames_new(size_t max_line);
/*
 * From now on, stdout/stderr frames carry their payload as the wire's base64 text, checked to
 * be strict base64 but not handed over decoded (data_is_base64 is set): for a relay that
 * writes the payload on as base64, which then never decodes and encodes it again.
 */
void sk_frames_keep_base64(sk_frames *d);
/*
 * Reads the binary syntax from now on, in place of NDJSON; called before any input. Output is
 * handed over as its bytes whatever sk_frames_keep_base64 says (data_is_base64 stays 0): a
 * relay that writes it on as base64 encodes it where the frame is taken, in room of its own
 * (lua_frames.c), rather than in room of each decoder's, allocated and freed for every frame.
 */
void sk_frames_binary(sk_frames *d);
/*
 * Adds kinds (SK_FRAMES_KIND bits) to what this stream takes; a frame of a kind it does not
 * take fails it, as a frame of an unknown kind does. Only kinds beyond the default need adding
 * (a keep-alive, for a stream that asked the agent for them).
 */
void sk_frames_admit(sk_frames *d, unsigned kinds);
/*
 * The kinds this stream takes from now on, in place of what it took (a watch's stream takes
 * events, its end and an error, and no output): a frame of any other kind fails it.
 */
void sk_frames_expect(sk_frames *d, unsigned kinds);
void sk_frames_free(sk_frames *d);

/*
 * Consumes input from *in (advancing *in and *in_len) until one frame is complete or the input
 * is used up; admitted keep-alives are consumed on the way. Returns SK_FRAMES_FRAME with *out filled, SK_FRAMES_AGAIN when it needs more
 * input (everything was consumed), or SK_FRAMES_FAILED — then and ever after.
 */
int sk_frames_decode(sk_frames *d, const char **in, size_t *in_len, sk_frame *out);

/*
 * As sk_frames_decode, except that a frame still arriving at the end of the input is left there,
 * *in pointing at it, when SK_FRAMES_AGAIN is returned (unless it is already over the bound,
 * which fails now): for a caller that keeps it where it lies while it waits for the rest, and
 * hands it over with sk_frames_gather when more input comes.
 */
int sk_frames_decode_whole(sk_frames *d, const char **in, size_t *in_len, sk_frame *out);

/*
 * Takes len bytes at in, which end no frame (sk_frames_decode_whole left them, or
 * sk_frames_whole found none), into the frame being gathered without looking for its end in
 * them again. SK_FRAMES_AGAIN, or SK_FRAMES_FAILED (past the bound, out of memory).
 */
int sk_frames_gather(sk_frames *d, const char *in, size_t len);

/*
 * Once the frame last returned was taken (its pointers are not used any more), gives back the
 * room past SK_FRAMES_KEPT that its payload was decoded in and that a line split across reads
 * was gathered in (unless a line is being gathered now). Streams spend most of their life
 * waiting — a relay's on a slow client, a fan-out's on its turn — and frames are decoded one
 * at a time: without this, every stream would keep room for the largest frame it met (64 KiB
 * decoded, 128 KiB for a split line) through every wait, where with it one stream's worth is
 * taken and given back again.
 */
void sk_frames_release(sk_frames *d);
/* Room kept between frames: short frames, most of a chatty command's, reuse it. (The fuzz
 * target sets it lower, so that its short lines are released too.) */
#ifndef SK_FRAMES_KEPT
#define SK_FRAMES_KEPT ((size_t)4096)
#endif

enum sk_frames_failure sk_frames_failure(const sk_frames *d);
/* A sentence naming the failure, e.g. "an output frame did not parse: expected ':' at byte 9". */
const char *sk_frames_error(const sk_frames *d);
/* Bytes of an unfinished frame held back; a body that ends with some left ended mid-frame. */
size_t sk_frames_pending(const sk_frames *d);

/*
 * Whether the len bytes at in end a frame, with what the decoder holds back before them: the
 * length up to the end of the first frame that ends there, 0 when none does. A frame whose
 * header is over the bound counts as ended, since decoding it fails at once. known: how many
 * leading bytes of in the caller already found to end no frame (0 if unknown), which an NDJSON
 * scan skips. A caller that keeps a frame still arriving in its own buffer, rather than
 * handing it over to be copied, asks this first.
 */
size_t sk_frames_whole(const sk_frames *d, const char *in, size_t len, size_t known);

#endif
