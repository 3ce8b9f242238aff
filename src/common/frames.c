/* frames.c — see frames.h. */
#include "frames.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "json.h"

struct sk_frames {
	size_t max_line;
	/* A line split across reads, until its newline arrives; never more than max_line. */
	char *line;
	size_t line_len, line_cap;
	/* About as long as the last split lines: the next, likely as long, gets that room at
	 * once instead of growing through every smaller size again after a release. */
	size_t line_hint;
	/* Decoded payloads and unescaped strings of the current frame; at most max_line. */
	unsigned char *scratch;
	size_t scratch_cap;
	enum sk_frames_failure failure;
	char error[160];
	int keep_base64;
	int binary;        /* the binary syntax (sk_frames_binary) rather than NDJSON */
	unsigned admitted; /* SK_FRAMES_KIND bits of the kinds this stream takes */
};

sk_frames *sk_frames_new(size_t max_line)
{
	sk_frames *d = calloc(1, sizeof *d);
	if (d == NULL)
		return NULL;
	d->max_line = max_line ? max_line : SK_FRAMES_MAX_LINE;
	d->admitted = SK_FRAMES_KINDS_DEFAULT;
	return d;
}

void sk_frames_keep_base64(sk_frames *d)
{
	d->keep_base64 = 1;
}

void sk_frames_binary(sk_frames *d)
{
	d->binary = 1;
}

void sk_frames_admit(sk_frames *d, unsigned kinds)
{
	d->admitted |= kinds;
}

void sk_frames_expect(sk_frames *d, unsigned kinds)
{
	d->admitted = kinds;
}

void sk_frames_free(sk_frames *d)
{
	if (d == NULL)
		return;
	free(d->line);
	free(d->scratch);
	free(d);
}

void sk_frames_release(sk_frames *d)
{
	if (d->line_len == 0 && d->line_cap > SK_FRAMES_KEPT) {
		free(d->line);
		d->line = NULL;
		d->line_cap = 0;
	}
	if (d->scratch_cap > SK_FRAMES_KEPT) {
		free(d->scratch);
		d->scratch = NULL;
		d->scratch_cap = 0;
	}
}

enum sk_frames_failure sk_frames_failure(const sk_frames *d)
{
	return d->failure;
}

const char *sk_frames_error(const sk_frames *d)
{
	return d->failure ? d->error : NULL;
}

size_t sk_frames_pending(const sk_frames *d)
{
	return d->line_len;
}

static int fail(sk_frames *d, enum sk_frames_failure why, const char *fmt, const char *detail,
                long at)
{
	d->failure = why;
	if (at >= 0)
		snprintf(d->error, sizeof d->error, fmt, detail, at);
	else
		snprintf(d->error, sizeof d->error, fmt, detail);
	/* Nothing held back may surface after a failure. */
	d->line_len = 0;
	return SK_FRAMES_FAILED;
}

/* Grows a buffer to at least need bytes — at least hint when it has none — in powers of two
 * from SK_FRAMES_KEPT; the callers bound need and hint by max_line. The buffer exists
 * afterwards even for need 0: an empty string is still copied into it. */
static int reserve(void **buf, size_t *cap, size_t need, size_t hint)
{
	if (*buf != NULL && need <= *cap)
		return 0;
	size_t n = *cap ? *cap : SK_FRAMES_KEPT;
	if (*cap == 0 && hint > need)
		need = hint;
	while (n < need)
		n *= 2;
	void *p = realloc(*buf, n);
	if (p == NULL)
		return -1;
	*buf = p;
	*cap = n;
	return 0;
}

/* Each kind as a refusal names it, by enum sk_frame_type. */
static const char *const kind_names[] = { "", "a stdout", "a stderr", "an exit", "an error", "a keepalive",
					   "an event", "an end" };

/* The members a frame may carry; the JSON is scanned once and typed after `t` is known. */
struct fields {
	sk_json_str t, data, message, code_str, event, path, from, reason;
	uint64_t seq;
	int64_t code_num, signal;
	int truncated, oom;
	unsigned has_t : 1, has_seq : 1, has_data : 1, has_message : 1, has_code_str : 1,
		has_code_num : 1, has_signal : 1, has_truncated : 1, has_event : 1, has_path : 1,
		has_from : 1, has_reason : 1, has_oom : 1;
};

/* The members a frame may carry, each allowed once, by their index in members[]. */
enum member { M_T, M_DATA, M_SEQ, M_CODE, M_MESSAGE, M_TRUNCATED, M_SIGNAL, M_EVENT, M_PATH, M_FROM,
	      M_REASON, M_OOM, M_OTHER };
static const char *const members[] = { "t", "data", "seq", "code", "message", "truncated", "signal",
					"event", "path", "from", "reason", "oom" };

/* Which member key names, compared once: a frame is mostly three short members, and short
 * frames are most of what a chatty command's stream decodes. */
static enum member member_of(const sk_json_str *key)
{
	for (unsigned i = 0; i < M_OTHER; i++)
		if (sk_json_str_is(key, members[i]))
			return (enum member)i;
	return M_OTHER;
}

static int scan_fields(sk_json *j, struct fields *f)
{
	sk_json_str key;
	unsigned seen = 0;
	int r;
	if (sk_json_object_begin(j) < 0)
		return -1;
	while ((r = sk_json_object_key(j, &key)) == 1) {
		enum member m = member_of(&key);
		/* A member given twice is what the last copy says to one reader and the first to
		 * another (the agent refuses the same in requests): not a frame. */
		if (m != M_OTHER) {
			if (seen & (1u << m)) {
				j->err = "a member appears twice";
				return -1;
			}
			seen |= 1u << m;
		}
		switch (m) {
		case M_T:
			f->has_t = sk_json_string(j, &f->t) == 0;
			break;
		case M_DATA:
			f->has_data = sk_json_string(j, &f->data) == 0;
			break;
		case M_SEQ:
			f->has_seq = sk_json_u64(j, &f->seq) == 0;
			break;
		case M_CODE:
			/* An exit's code is a number and an error's a string; which one `t` decides. */
			f->has_code_num = f->has_code_str = 0;
			if (sk_json_peek(j) == SK_JSON_STRING)
				f->has_code_str = sk_json_string(j, &f->code_str) == 0;
			else
				f->has_code_num = sk_json_i64(j, &f->code_num) == 0;
			break;
		case M_MESSAGE:
			f->has_message = sk_json_string(j, &f->message) == 0;
			break;
		case M_TRUNCATED:
			f->has_truncated = sk_json_bool(j, &f->truncated) == 0;
			break;
		case M_SIGNAL:
			f->has_signal = sk_json_i64(j, &f->signal) == 0;
			break;
		case M_OOM:
			f->has_oom = sk_json_bool(j, &f->oom) == 0;
			break;
		case M_EVENT:
			f->has_event = sk_json_string(j, &f->event) == 0;
			break;
		case M_PATH:
			f->has_path = sk_json_string(j, &f->path) == 0;
			break;
		case M_FROM:
			f->has_from = sk_json_string(j, &f->from) == 0;
			break;
		case M_REASON:
			f->has_reason = sk_json_string(j, &f->reason) == 0;
			break;
		case M_OTHER:
			if (sk_json_skip(j) < 0)
				return -1;
			break;
		}
		if (j->err)
			return -1;
	}
	if (r < 0)
		return -1;
	return sk_json_finish(j);
}

/* Unescaped copy of s into the scratch buffer at offset at; returns the length or -1. */
static long unescape_into(sk_frames *d, const sk_json_str *s, size_t at)
{
	if (reserve((void **)&d->scratch, &d->scratch_cap, at + s->len, 0) < 0)
		return -1;
	return (long)sk_json_unescape(s, (char *)d->scratch + at);
}

/* An event's members: which event, which path, and for a rename which path it came from; an
 * overflow says that events were lost, and names no path. */
static int parse_event(sk_frames *d, const struct fields *f, sk_frame *out)
{
	static const char *const events[] = { "create", "modify", "remove", "rename", "overflow" };
	size_t which = 0;
	while (which < sizeof events / sizeof events[0] && !(f->has_event && sk_json_str_is(&f->event, events[which])))
		which++;
	if (which == sizeof events / sizeof events[0])
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
		            "an event frame needs an `event` it knows", -1);
	int overflow = which == 4, rename = which == 3;
	if (f->has_path == overflow || f->has_from != rename)
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
		            overflow ? "an overflow event names no path"
		                     : rename ? "a rename event needs string `from` and `path`"
		                              : "an event needs a string `path` and no `from`", -1);
	size_t at = 0;
	long n = unescape_into(d, &f->event, at);
	if (n < 0)
		return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
	out->event_len = (size_t)n;
	at += (size_t)n;
	size_t path_at = at, from_at = at;
	if (f->has_path) {
		if ((n = unescape_into(d, &f->path, at)) < 0)
			return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
		out->path_len = (size_t)n;
		at += (size_t)n;
		from_at = at;
	}
	if (f->has_from) {
		if ((n = unescape_into(d, &f->from, at)) < 0)
			return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
		out->from_len = (size_t)n;
	}
	/* Pointers last: the scratch buffer may have moved as it grew. */
	out->event = (const char *)d->scratch;
	out->path = f->has_path ? (const char *)d->scratch + path_at : NULL;
	out->from = f->has_from ? (const char *)d->scratch + from_at : NULL;
	return 0;
}

/*
 * An output frame in the form sandkit-agent writes, {"t":"stdout","seq":N,"data":"…"} with
 * nothing else in the line, read by position: most frames of a chatty command are a short line
 * each, and the general scan costs them more than everything else the decoder does. Returns 1
 * with t, seq and data filled, or 0 for anything else (another order, a space, a leading zero,
 * a number of 20 digits), which scan_fields reads. The data string is taken as the span up to
 * the line's closing `"}` without looking inside it: a quote, a backslash or a control byte
 * there is no base64 symbol, so its decoding fails, and then the line is read again by
 * scan_fields (CANONICAL_RETRY), which words every refusal.
 */
static int canonical_output(const char *line, size_t len, struct fields *f)
{
	static const char t_head[] = "{\"t\":\"std", seq_head[] = "\",\"seq\":", data_head[] = ",\"data\":\"";
	/* The 19 digits of the largest number below 10^19, which a uint64_t holds without a check. */
	enum { SEQ_DIGITS_MAX = 19 };
	const char *p = line, *end = line + len;
	if (len < sizeof t_head - 1 + 3 + sizeof seq_head - 1 + 1 + sizeof data_head - 1 + 2 ||
	    memcmp(p, t_head, sizeof t_head - 1) != 0)
		return 0;
	p += sizeof t_head - 1;
	if (memcmp(p, "out", 3) != 0 && memcmp(p, "err", 3) != 0)
		return 0;
	p += 3;
	if (memcmp(p, seq_head, sizeof seq_head - 1) != 0)
		return 0;
	p += sizeof seq_head - 1;
	const char *digits = p;
	uint64_t seq = 0;
	while (p < end && p - digits < SEQ_DIGITS_MAX && *p >= '0' && *p <= '9')
		seq = seq * 10 + (uint64_t)(*p++ - '0');
	if (p == digits || (*digits == '0' && p - digits > 1))
		return 0;
	if ((size_t)(end - p) < sizeof data_head - 1 + 2 || memcmp(p, data_head, sizeof data_head - 1) != 0 ||
	    end[-2] != '"' || end[-1] != '}')
		return 0;
	p += sizeof data_head - 1;
	f->t.p = line + 6;
	f->t.len = 6;
	f->seq = seq;
	f->data.p = p;
	f->data.len = (size_t)(end - 2 - p);
	f->has_t = f->has_seq = f->has_data = 1;
	return 1;
}

/* parse_fields's answer when a line canonical_output took must be read by scan_fields after
 * all. */
#define CANONICAL_RETRY (-100)

static int parse_fields(sk_frames *d, const struct fields *f, int canonical, sk_frame *out);

static int parse_line(sk_frames *d, const char *line, size_t len, sk_frame *out)
{
	sk_json j;
	struct fields f;
	memset(&f, 0, sizeof f);
	if (canonical_output(line, len, &f)) {
		int r = parse_fields(d, &f, 1, out);
		if (r != CANONICAL_RETRY)
			return r;
		memset(&f, 0, sizeof f);
	}
	sk_json_init(&j, line, len);
	if (scan_fields(&j, &f) < 0)
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s at byte %ld",
		            j.err ? j.err : "malformed JSON", (long)(j.p - line));
	return parse_fields(d, &f, 0, out);
}

/* The frame the members f make, checked as its kind requires. */
static int parse_fields(sk_frames *d, const struct fields *f, int canonical, sk_frame *out)
{
	if (!f->has_t)
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
		            "missing field `t`", -1);

	memset(out, 0, sizeof *out);
	if (sk_json_str_is(&f->t, "stdout") || sk_json_str_is(&f->t, "stderr")) {
		out->type = f->t.p[3] == 'o' ? SK_FRAME_STDOUT : SK_FRAME_STDERR;
		if (!f->has_seq || !f->has_data)
			return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
			            f->has_seq ? "missing field `data`" : "missing field `seq`", -1);
		/* Lua 5.4 integers are signed 64-bit; a larger counter cannot be handed on exactly. */
		if (f->seq > (uint64_t)INT64_MAX)
			return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
			            "seq out of range", -1);
		out->seq = f->seq;
		const char *b64 = f->data.p;
		size_t b64_len = f->data.len;
		size_t base = 0;
		if (f->data.escaped) {
			/* Only a writer that escapes '/' gets here; unescape, then decode after it. */
			long n = unescape_into(d, &f->data, 0);
			if (n < 0)
				return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
			b64 = (const char *)d->scratch;
			b64_len = (size_t)n;
			base = (size_t)n;
		}
		size_t n;
		if (d->keep_base64) {
			/* Checked, not decoded: the text itself is what goes on, and needs no room. */
			if (sk_b64_check(b64, b64_len, &n) < 0)
				return canonical ? CANONICAL_RETRY : fail(d, SK_FRAMES_UNDECODABLE,
				            "an output frame did not decode: %s (at symbol %ld)",
				            "data was not valid base64", (long)n);
			out->data = (const unsigned char *)b64;
			out->data_len = b64_len;
			out->data_is_base64 = 1;
		} else {
			if (reserve((void **)&d->scratch, &d->scratch_cap,
			            base + SK_B64_DECODED_MAX(b64_len), 0) < 0)
				return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
			b64 = f->data.escaped ? (const char *)d->scratch : b64;
			if (sk_b64_decode(b64, b64_len, d->scratch + base, &n) < 0)
				return canonical ? CANONICAL_RETRY : fail(d, SK_FRAMES_UNDECODABLE,
				            "an output frame did not decode: %s (at symbol %ld)",
				            "data was not valid base64", (long)n);
			out->data = d->scratch + base;
			out->data_len = n;
		}
	} else if (sk_json_str_is(&f->t, "exit")) {
		out->type = SK_FRAME_EXIT;
		if (!f->has_code_num || f->code_num < INT32_MIN || f->code_num > INT32_MAX)
			return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
			            "an exit frame needs an integer `code`", -1);
		out->code = (int32_t)f->code_num;
		out->truncated = f->has_truncated && f->truncated;
		if (f->has_signal && f->signal >= 0 && f->signal <= INT32_MAX) {
			out->has_signal = 1;
			out->signal = (int32_t)f->signal;
		}
		out->oom = f->has_oom && f->oom;
	} else if (sk_json_str_is(&f->t, "keepalive")) {
		out->type = SK_FRAME_KEEPALIVE;
		/* It is counted nowhere and says nothing: a member that would make it mean
		 * something (a seq above all) is a frame this client cannot read. */
		if (f->has_seq || f->has_data || f->has_code_num || f->has_code_str || f->has_message ||
		    f->has_truncated || f->has_signal || f->has_oom)
			return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
			            "a keepalive frame carries nothing but `t`", -1);
	} else if (sk_json_str_is(&f->t, "error")) {
		out->type = SK_FRAME_ERROR;
		if (!f->has_code_str || !f->has_message)
			return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
			            "an error frame needs string `code` and `message`", -1);
		long cn = unescape_into(d, &f->code_str, 0);
		long mn = cn < 0 ? -1 : unescape_into(d, &f->message, (size_t)cn);
		if (mn < 0)
			return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
		out->error_code = (const char *)d->scratch;
		out->error_code_len = (size_t)cn;
		out->message = (const char *)d->scratch + cn;
		out->message_len = (size_t)mn;
	} else if (sk_json_str_is(&f->t, "event")) {
		out->type = SK_FRAME_EVENT;
		if (parse_event(d, f, out) < 0)
			return SK_FRAMES_FAILED;
	} else if (sk_json_str_is(&f->t, "end")) {
		out->type = SK_FRAME_END;
		if (!f->has_reason)
			return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
			            "an end frame needs a string `reason`", -1);
		long n = unescape_into(d, &f->reason, 0);
		if (n < 0)
			return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
		out->reason = (const char *)d->scratch;
		out->reason_len = (size_t)n;
	} else {
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
		            "unknown frame type", -1);
	}
	if (!(d->admitted & SK_FRAMES_KIND(out->type)))
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s frame, "
		            "which this stream did not ask for", kind_names[out->type], -1);
	return SK_FRAMES_FRAME;
}

static uint64_t big_endian(const unsigned char *p, size_t n)
{
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

/* One binary frame whose body is whole at body (docs/protocol.md §6 binaryFrames). */
static int parse_binary(sk_frames *d, unsigned char kind, const unsigned char *body, size_t len,
			sk_frame *out)
{
	if (kind == SK_FRAMES_BINARY_JSON) {
		int r = parse_line(d, (const char *)body, len, out);
		/* Output has one form in a binary stream, so that no reader meets two. */
		if (r == SK_FRAMES_FRAME && (out->type == SK_FRAME_STDOUT || out->type == SK_FRAME_STDERR))
			return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
			            "output in a JSON frame of a binary stream", -1);
		return r;
	}
	if (kind != SK_FRAMES_BINARY_STDOUT && kind != SK_FRAMES_BINARY_STDERR)
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s (byte %ld)",
		            "unknown binary frame kind", (long)kind);
	if (len < SK_FRAMES_BINARY_SEQ)
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
		            "an output frame's body is shorter than its seq", -1);
	memset(out, 0, sizeof *out);
	out->type = kind == SK_FRAMES_BINARY_STDOUT ? SK_FRAME_STDOUT : SK_FRAME_STDERR;
	out->seq = big_endian(body, SK_FRAMES_BINARY_SEQ);
	/* The NDJSON syntax's range: a Lua integer holds it exactly. */
	if (out->seq > (uint64_t)INT64_MAX)
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s",
		            "seq out of range", -1);
	if (!(d->admitted & SK_FRAMES_KIND(out->type)))
		return fail(d, SK_FRAMES_UNPARSABLE, "an output frame did not parse: %s frame, "
		            "which this stream did not ask for", kind_names[out->type], -1);
	out->data = body + SK_FRAMES_BINARY_SEQ; /* the bytes as they came: no copy, no decoding */
	out->data_len = len - SK_FRAMES_BINARY_SEQ;
	return SK_FRAMES_FRAME;
}

/* The whole frame's length from its header, or 0 past the bound (the header alone is 5). */
static size_t binary_total(const sk_frames *d, const unsigned char *head)
{
	uint64_t body = big_endian(head + 1, 4);
	return body > d->max_line ? 0 : SK_FRAMES_BINARY_HEAD + (size_t)body;
}

static int too_long(sk_frames *d)
{
	return fail(d, SK_FRAMES_TOO_LONG, "an output frame did not parse: %s (%ld bytes)",
	            "a frame exceeded the decoder's limit", (long)d->max_line);
}

/* After a frame the line buffer held: it holds nothing now, and remembers about how long the
 * frames it gathered were. Shrinking by an eighth lets one long frame be forgotten after a
 * dozen or so, and a short one (a test runner's line between full frames) not forget the long
 * ones. */
static void gathered(sk_frames *d)
{
	size_t kept = d->line_hint - d->line_hint / 8;
	d->line_hint = kept > d->line_len ? kept : d->line_len;
	d->line_len = 0;
}

/* What one decoded frame means to the caller, whichever syntax it came in: an admitted
 * keep-alive did its work by arriving, so the next frame is read; a frame gathered in the
 * decoder's own buffer empties it for the next one (a failed stream leaves it as it was). */
static int settle(sk_frames *d, int held, int r, const sk_frame *out)
{
	if (r == SK_FRAMES_FRAME && out->type == SK_FRAME_KEEPALIVE)
		r = SK_FRAMES_AGAIN;
	if (held && r != SK_FRAMES_FAILED)
		gathered(d);
	return r;
}

static int decode_binary(sk_frames *d, const char **in, size_t *in_len, sk_frame *out, int gather)
{
	while (*in_len > 0) {
		const unsigned char *p = (const unsigned char *)*in;
		const unsigned char *frame;
		size_t total = 0;
		int held = 0;
		if (d->line_len == 0 && *in_len >= SK_FRAMES_BINARY_HEAD) {
			if ((total = binary_total(d, p)) == 0)
				return too_long(d);
		}
		if (d->line_len == 0 && *in_len >= SK_FRAMES_BINARY_HEAD && *in_len >= total) {
			frame = p; /* the whole frame is in the caller's buffer: no copy */
		} else {
			/* A frame still arriving stays where it lies unless gathered; its end is in its
			 * header, so knowing it costs no scan. */
			if (!gather && sk_frames_whole(d, *in, *in_len, 0) == 0)
				return SK_FRAMES_AGAIN;
			/* The header first, then (its length known) the rest, into room for all. */
			size_t want = d->line_len < SK_FRAMES_BINARY_HEAD
				? SK_FRAMES_BINARY_HEAD
				: binary_total(d, (const unsigned char *)d->line);
			size_t take = want - d->line_len < *in_len ? want - d->line_len : *in_len;
			if (reserve((void **)&d->line, &d->line_cap, want, d->line_hint) < 0)
				return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
			memcpy(d->line + d->line_len, p, take);
			d->line_len += take;
			*in += take;
			*in_len -= take;
			if (d->line_len < want)
				return SK_FRAMES_AGAIN;
			if (want == SK_FRAMES_BINARY_HEAD) {
				if ((total = binary_total(d, (const unsigned char *)d->line)) == 0)
					return too_long(d);
				if (total > want)
					continue; /* the body follows */
			}
			frame = (const unsigned char *)d->line;
			total = d->line_len;
			held = 1;
		}
		if (!held) {
			*in += total;
			*in_len -= total;
		}
		int r = parse_binary(d, frame[0], frame + SK_FRAMES_BINARY_HEAD,
				     total - SK_FRAMES_BINARY_HEAD, out);
		r = settle(d, held, r, out);
		if (r != SK_FRAMES_AGAIN)
			return r;
	}
	return SK_FRAMES_AGAIN;
}

size_t sk_frames_whole(const sk_frames *d, const char *in, size_t len, size_t known)
{
	if (!d->binary) {
		if (known >= len)
			return 0;
		const char *nl = memchr(in + known, '\n', len - known);
		return nl ? (size_t)(nl - in) + 1 : 0;
	}
	const unsigned char *p = (const unsigned char *)in;
	if (d->line_len > 0) {
		/* The frame being gathered: its header, from what is held and what follows. */
		unsigned char head[SK_FRAMES_BINARY_HEAD];
		size_t have = d->line_len < sizeof head ? d->line_len : sizeof head;
		size_t more = sizeof head - have;
		if (more > len)
			return 0;
		memcpy(head, d->line, have);
		memcpy(head + have, p, more);
		size_t total = binary_total(d, head);
		if (total == 0)
			return more;
		return total - d->line_len <= len ? total - d->line_len : 0;
	}
	if (len < SK_FRAMES_BINARY_HEAD)
		return 0;
	size_t total = binary_total(d, p);
	if (total == 0)
		return SK_FRAMES_BINARY_HEAD;
	return total <= len ? total : 0;
}

static int blank(const char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r')
			return 0;
	return 1;
}

static int line_too_long(sk_frames *d)
{
	return fail(d, SK_FRAMES_TOO_LONG, "an output frame did not parse: %s (%ld bytes)",
	            "a line exceeded the decoder's limit", (long)d->max_line);
}

/* Adds len bytes of a line to the one being gathered, within the decoder's bound. */
static int gather_line(sk_frames *d, const char *in, size_t len)
{
	if (d->line_len + len > d->max_line)
		return line_too_long(d);
	if (reserve((void **)&d->line, &d->line_cap, d->line_len + len, d->line_hint) < 0)
		return fail(d, SK_FRAMES_NO_MEMORY, "%s", "out of memory", -1);
	memcpy(d->line + d->line_len, in, len);
	d->line_len += len;
	return SK_FRAMES_AGAIN;
}

/* sk_frames_decode (gather) and sk_frames_decode_whole (not): whether a frame still arriving
 * at the end of the input is taken into the decoder or left where it lies. */
static int decode(sk_frames *d, const char **in, size_t *in_len, sk_frame *out, int gather)
{
	if (d->failure)
		return SK_FRAMES_FAILED;
	if (d->binary)
		return decode_binary(d, in, in_len, out, gather);
	while (*in_len > 0) {
		const char *nl = memchr(*in, '\n', *in_len);
		size_t take = nl ? (size_t)(nl - *in) + 1 : *in_len;
		if (d->line_len + take > d->max_line)
			return line_too_long(d);
		if (!nl && !gather)
			return SK_FRAMES_AGAIN;
		const char *line;
		size_t len;
		if (d->line_len == 0 && nl) {
			line = *in; /* the whole line is in the caller's buffer: no copy */
			len = take - 1;
		} else {
			if (gather_line(d, *in, take) == SK_FRAMES_FAILED)
				return SK_FRAMES_FAILED;
			if (!nl) {
				*in += take;
				*in_len -= take;
				return SK_FRAMES_AGAIN;
			}
			line = d->line;
			len = d->line_len - 1;
		}
		*in += take;
		*in_len -= take;
		int held = line == d->line;
		int r = blank(line, len) ? SK_FRAMES_AGAIN : parse_line(d, line, len, out);
		r = settle(d, held, r, out);
		if (r != SK_FRAMES_AGAIN)
			return r;
	}
	return SK_FRAMES_AGAIN;
}

int sk_frames_decode(sk_frames *d, const char **in, size_t *in_len, sk_frame *out)
{
	return decode(d, in, in_len, out, 1);
}

int sk_frames_decode_whole(sk_frames *d, const char **in, size_t *in_len, sk_frame *out)
{
	return decode(d, in, in_len, out, 0);
}

int sk_frames_gather(sk_frames *d, const char *in, size_t len)
{
	if (d->failure)
		return SK_FRAMES_FAILED;
	if (d->binary) {
		sk_frame unused;
		return decode_binary(d, &in, &len, &unused, 1);
	}
	return gather_line(d, in, len);
}
