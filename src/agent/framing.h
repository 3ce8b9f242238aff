/*
 * framing.h — how a stream's frames go on the wire: NDJSON lines (docs/protocol.md §3.3), or the
 * binary frames of §6 binaryFrames for a caller that asked for them, whose output then travels
 * as its bytes with no base64 to make or undo. Every stream of frames (an exec's, a job's live
 * one, their keep-alives) writes through these, so a frame has one form per framing.
 */
#ifndef SANDKIT_AGENT_FRAMING_H
#define SANDKIT_AGENT_FRAMING_H

#include <stddef.h>
#include <stdint.h>

struct evbuffer;
struct outcome;

enum framing { FRAMING_NDJSON = 0, FRAMING_BINARY };

/* The Content-Type of a stream in this framing: the caller tells the framing by it. */
const char *framing_content_type(enum framing f);

/* One whole output frame (a line, or a binary frame). 0, or -1 when memory ran out. */
int framing_output(struct evbuffer *out, enum framing f, int stream, uint64_t seq,
		   const unsigned char *data, size_t len);
/* The stream's terminal frame (exit or error), whole. 0, or -1 when memory ran out. */
int framing_terminal(struct evbuffer *out, enum framing f, const struct outcome *o);
/* A frame whose JSON text is text (a keep-alive's), whole. 0, or -1 when memory ran out. */
int framing_json(struct evbuffer *out, enum framing f, const char *text, size_t len);

#endif
