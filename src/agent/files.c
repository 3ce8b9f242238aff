/* files.c — see files.h. */
#include "files.h"

#include "agent.h"
#include "common/base64.h"
#include "common/json.h"
#include "handler.h"
#include "http.h"
#include "paths.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>

static void reply_not_regular(struct http_request *req, const char *p, size_t len)
{
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' is not a regular file", shown);
}

static void reply_too_large(struct http_request *req, const char *p, size_t len)
{
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' is over the %zu byte transfer limit",
		    shown, AGENT_FILE_MAX);
}

/* Reads of a file are sent in pieces of this many bytes: a multiple of 3, so each piece
 * encodes to base64 without padding, and small enough that a stalled caller holds little. */
#define FILES_PIECE (48 * 1024)

/*
 * The caller's path of a file: normalized into rel (PATHS_MAX bytes). A trailing '/' names a
 * directory, which a file path must not: refused rather than dropped, or "PUT newfile/"
 * would make a file. Answers and returns NULL when refused.
 */
static const char *file_path(struct http_request *req, const char *p, size_t plen, char *rel)
{
	const char *why = plen > 0 && p[plen - 1] == '/' ? "a file path must not end in '/'"
							 : paths_normalize(p, plen, rel);
	if (why) {
		reply_path_refused(req, p, plen, why);
		return NULL;
	}
	return rel;
}

/*
 * Opens the caller's file for reading: looks at it with O_PATH first (opening a device or
 * FIFO can itself act or block), opens it O_NONBLOCK (a FIFO swapped in meanwhile cannot
 * hang the open) and checks it is still the same regular file. Returns the descriptor and its
 * size, or -1 after answering.
 */
static int open_for_read(struct http_request *req, const char *p, size_t plen, off_t *size)
{
	char rel[PATHS_MAX];
	int probe = -1, fd = -1;
	struct stat before, after;
	if (file_path(req, p, plen, rel) == NULL)
		return -1;
	enum path_result r = paths_open(rel, O_PATH, 0, &probe);
	if (r != PATH_OK) {
		reply_fs_errno(req, errno, p, plen, "read a file", 0);
		return -1;
	}
	if (fstat(probe, &before) < 0) {
		reply_fs_errno(req, errno, p, plen, "read a file", 0);
		goto fail;
	}
	if (!S_ISREG(before.st_mode)) {
		reply_not_regular(req, p, plen);
		goto fail;
	}
	r = paths_open(rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, &fd);
	if (r != PATH_OK) {
		reply_fs_errno(req, errno, p, plen, "read a file", 0);
		goto fail;
	}
	if (fstat(fd, &after) < 0) {
		reply_fs_errno(req, errno, p, plen, "read a file", 0);
		goto fail;
	}
	if (!S_ISREG(after.st_mode) || after.st_ino != before.st_ino || after.st_dev != before.st_dev) {
		reply_not_regular(req, p, plen);
		goto fail;
	}
	close(probe);
	*size = after.st_size;
	return fd;
fail:
	if (probe >= 0)
		close(probe);
	if (fd >= 0)
		close(fd);
	return -1;
}

/* A file on its way to the caller, read a piece at a time as the caller takes them. */
struct file_send {
	struct http_request *req;
	int fd;
	off_t off;         /* where the next file bytes are */
	uint64_t left;     /* file bytes still to send: the size when it was opened */
	int base64;        /* GET /v1/files: inside {"contentsBase64":"..."} */
};

static void send_free(struct file_send *fs)
{
	close(fs->fd);
	free(fs);
}

/* Appends one piece of at most FILES_PIECE bytes, base64-encoded or not. */
static int send_piece(struct file_send *fs, const unsigned char *piece, size_t n)
{
	struct evbuffer *b = evbuffer_new();
	int ok = b != NULL;
	if (ok && fs->base64) {
		struct evbuffer_iovec v;
		size_t enc = SK_B64_ENCODED_LEN(n);
		ok = evbuffer_reserve_space(b, (ev_ssize_t)enc, &v, 1) == 1;
		if (ok) {
			sk_b64_encode(piece, n, v.iov_base);
			v.iov_len = enc;
			ok = evbuffer_commit_space(b, &v, 1) == 0;
		}
	} else if (ok) {
		ok = evbuffer_add(b, piece, n) == 0;
	}
	ok = ok && http_reply_chunk(fs->req, b) == 0;
	if (b)
		evbuffer_free(b);
	return ok ? 0 : -1;
}

/* Sends pieces until the caller's queue is full or the file is sent (http.h drain callback). */
static void pump(void *ctx)
{
	struct file_send *fs = ctx;
	/* One piece at a time in a single-threaded loop: one buffer serves every transfer. */
	static unsigned char piece[FILES_PIECE];
	while (http_reply_queued(fs->req) < HTTP_OUTPUT_HIGH && fs->left > 0) {
		/* The raw bytes go from the file into the socket (sendfile(2)), as many as the
		 * socket takes, with the rest sent as it takes them: none passes through the agent.
		 * Where that cannot be now they are read and queued a piece at a time. */
		int r = fs->base64 || fs->left > SIZE_MAX ? 1
			: http_reply_file(fs->req, fs->fd, fs->off, (size_t)fs->left);
		if (r < 0) {
			http_reply_end(fs->req); /* cut: the connection closes short of the length */
			send_free(fs);
			return;
		}
		if (r != 1) {
			fs->off += (off_t)fs->left;
			fs->left = 0;
			if (r == 2)
				return; /* the drain callback comes once the socket took it all */
			break;
		}
		size_t want = fs->left < FILES_PIECE ? (size_t)fs->left : FILES_PIECE, got = 0;
		while (got < want) {
			ssize_t r = read(fs->fd, piece + got, want - got);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
			got += (size_t)r;
		}
		if (got < want || send_piece(fs, piece, got) < 0) {
			/* The file shrank or failed, or memory ran out, after the length was announced:
			 * the body ends short and the connection closes, which no caller takes as whole. */
			http_reply_end(fs->req);
			send_free(fs);
			return;
		}
		fs->left -= got;
		fs->off += (off_t)got;
	}
	if (fs->left > 0)
		return;
	if (fs->base64) {
		struct evbuffer *b = evbuffer_new();
		if (b && evbuffer_add(b, "\"}", 2) == 0)
			http_reply_chunk(fs->req, b);
		if (b)
			evbuffer_free(b);
	}
	http_reply_end(fs->req);
	send_free(fs);
}

static void send_gone(void *ctx)
{
	send_free(ctx);
}

/* GET /v1/files (base64 in JSON, at most AGENT_FILE_MAX) and GET /v1/files/raw (the bytes). The
 * size when the file was opened is what is sent. */
static void send_file(struct http_request *req, int base64)
{
	size_t plen;
	char *p = request_path(req, &plen);
	if (p == NULL)
		return;
	off_t size;
	int fd = open_for_read(req, p, plen, &size);
	if (fd >= 0 && base64 && (uint64_t)size > AGENT_FILE_MAX) {
		reply_too_large(req, p, plen);
		close(fd);
		fd = -1;
	}
	free(p);
	if (fd < 0)
		return;
	struct file_send *fs = calloc(1, sizeof *fs);
	if (fs == NULL) {
		close(fd);
		reply_out_of_memory(req, "read a file");
		return;
	}
	fs->req = req;
	fs->fd = fd;
	fs->left = (uint64_t)size;
	fs->base64 = base64;
	static const char open_json[] = "{\"contentsBase64\":\"";
	int64_t length = base64 ? (int64_t)(sizeof open_json - 1 + SK_B64_ENCODED_LEN((size_t)size) + 2)
				: (int64_t)size;
	if (http_reply_start(req, 200, base64 ? "application/json" : "application/octet-stream",
			     length) < 0) {
		http_reply_end(req);
		send_free(fs);
		return;
	}
	if (base64) {
		fs->base64 = 0; /* the JSON around the contents goes as it is */
		int failed = send_piece(fs, (const unsigned char *)open_json, sizeof open_json - 1) < 0;
		fs->base64 = 1;
		if (failed) {
			http_reply_end(req);
			send_free(fs);
			return;
		}
	}
	http_reply_watch(req, pump, send_gone, fs);
	pump(fs);
}

void files_get(struct http_request *req)
{
	send_file(req, 1);
}

void files_raw_get(struct http_request *req)
{
	send_file(req, 0);
}

/* A raw upload on its way into a temporary file beside the target. */
struct file_recv {
	struct http_request *req;
	char *p;                  /* the caller's path, for errors */
	size_t plen;
	int dirfd, fd;
	char last[PATHS_MAX];     /* the target's name in dirfd */
	char tmp[64];             /* the temporary file's name in dirfd; "" once gone or renamed */
};

/* The temporary file goes, if it is still there. A failure calls this before it answers: the
 * answer is written the moment it is complete, and whoever reads it must find no trace of the
 * upload. */
static void recv_discard(struct file_recv *fr)
{
	if (fr->fd >= 0)
		close(fr->fd);
	fr->fd = -1;
	if (fr->tmp[0])
		unlinkat(fr->dirfd, fr->tmp, 0);
	fr->tmp[0] = '\0';
}

static void recv_free(struct file_recv *fr)
{
	recv_discard(fr);
	if (fr->dirfd >= 0)
		close(fr->dirfd);
	free(fr->p);
	free(fr);
}

/* Writing the temporary file failed with err: the upload goes, and the answer says why. */
static void recv_failed(void *ctx, int err)
{
	struct file_recv *fr = ctx;
	recv_discard(fr);
	reply_fs_errno(fr->req, err, fr->p, fr->plen, "write a file", 1);
	recv_free(fr);
}

static int recv_data(void *ctx, const char *data, size_t n)
{
	struct file_recv *fr = ctx;
	while (n > 0) {
		ssize_t w = write(fr->fd, data, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			recv_failed(fr, w == 0 ? EIO : errno);
			return -1;
		}
		data += w;
		n -= (size_t)w;
	}
	return 0;
}

static void recv_end(void *ctx, int complete)
{
	struct file_recv *fr = ctx;
	if (!complete) {
		/* A cut upload never replaces the file: the temporary one goes. */
		recv_free(fr);
		return;
	}
	int fd = fr->fd;
	fr->fd = -1;
	if (close(fd) < 0 || renameat(fr->dirfd, fr->tmp, fr->dirfd, fr->last) < 0) {
		int err = errno;
		recv_discard(fr);
		if (err == EISDIR || err == ENOTEMPTY || err == EEXIST)
			reply_not_regular(fr->req, fr->p, fr->plen);
		else
			reply_fs_errno(fr->req, err, fr->p, fr->plen, "write a file", 1);
		recv_free(fr);
		return;
	}
	fr->tmp[0] = '\0';
	reply_empty(fr->req, 204);
	recv_free(fr);
}

/* PUT /v1/files/raw: the body goes to a temporary file beside the target, renamed over it
 * once the whole body arrived. */
void files_raw_put(struct http_request *req)
{
	struct file_recv *fr = calloc(1, sizeof *fr);
	if (fr == NULL) {
		reply_out_of_memory(req, "write a file");
		return;
	}
	fr->req = req;
	fr->dirfd = fr->fd = -1;
	char rel[PATHS_MAX];
	const char *last;
	if ((fr->p = request_path(req, &fr->plen)) == NULL || file_path(req, fr->p, fr->plen, rel) == NULL)
		goto fail;
	enum path_result r = paths_walk(rel, 1, 1, &fr->dirfd, &last);
	if (r != PATH_OK) {
		reply_fs_errno(req, errno, fr->p, fr->plen, "write a file", 1);
		goto fail;
	}
	snprintf(fr->last, sizeof fr->last, "%s", last);
	/* Only a regular file (or nothing) may be replaced; its permissions carry over. */
	int probe;
	struct stat st;
	int keep_mode = 0;
	r = paths_open_at(fr->dirfd, fr->last, O_PATH, 0, &probe);
	if (r == PATH_OK) {
		int ok = fstat(probe, &st) == 0 && S_ISREG(st.st_mode);
		close(probe);
		if (!ok) {
			reply_not_regular(req, fr->p, fr->plen);
			goto fail;
		}
		keep_mode = 1;
	} else if (r != PATH_MISSING) {
		reply_fs_errno(req, errno, fr->p, fr->plen, "write a file", 1);
		goto fail;
	}
	unsigned char rnd[8];
	if (util_random(rnd, sizeof rnd) < 0) {
		reply_fs_errno(req, errno, fr->p, fr->plen, "write a file", 1);
		goto fail;
	}
	snprintf(fr->tmp, sizeof fr->tmp, ".sandkit-upload-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0],
		 rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
	/* Created 0666 less the umask, as PUT /v1/files creates; a replaced file keeps its mode. */
	r = paths_open_at(fr->dirfd, fr->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOCTTY, 0666, &fr->fd);
	if (r != PATH_OK) {
		fr->tmp[0] = '\0';
		reply_fs_errno(req, errno, fr->p, fr->plen, "write a file", 1);
		goto fail;
	}
	if (keep_mode && fchmod(fr->fd, st.st_mode & 07777) < 0) {
		int err = errno;
		recv_discard(fr);
		reply_fs_errno(req, err, fr->p, fr->plen, "write a file", 1);
		goto fail;
	}
	http_body_stream_to_fd(req, recv_data, recv_end, recv_failed, fr, fr->fd);
	return;
fail:
	recv_free(fr);
}

/* The members of a file route's body, as read_json_body hands them over. */
struct file_body {
	int want_contents;        /* PUT /v1/files; mkdir takes a path alone */
	int has_path, has_contents;
	sk_json_str path, contents;
};

static const char *file_body_member(void *ctx, sk_json *j, const sk_json_str *key)
{
	struct file_body *fb = ctx;
	sk_json_str *into = NULL;
	const char *wrong = NULL;
	if (sk_json_str_is(key, "path") && !fb->has_path) {
		fb->has_path = 1;
		into = &fb->path;
		wrong = "path must be a string";
	} else if (fb->want_contents && sk_json_str_is(key, "contentsBase64") && !fb->has_contents) {
		fb->has_contents = 1;
		into = &fb->contents;
		wrong = "contentsBase64 must be a string";
	}
	if (into && sk_json_peek(j) == SK_JSON_STRING) {
		sk_json_string(j, into);
		return NULL;
	}
	sk_json_skip(j);
	return wrong;
}

/* Reads {"path": "...", "contentsBase64": "..."} (contents optional for mkdir). Returns 0, or
 * answers the request and returns -1. */
static int read_body(struct http_request *req, int want_contents, char **path, size_t *plen,
		     sk_json_str *contents)
{
	struct file_body fb = { want_contents, 0, 0, { NULL, 0, 0 }, { NULL, 0, 0 } };
	if (read_json_body(req, "read the request", file_body_member, &fb) < 0)
		return -1;
	const char *problem = !fb.has_path ? "path is required"
		: want_contents && !fb.has_contents ? "contentsBase64 is required" : NULL;
	if (problem) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s", problem);
		return -1;
	}
	*contents = fb.contents;
	sk_json_str ps = fb.path;
	*path = malloc(ps.len + 1);
	if (*path == NULL) {
		reply_out_of_memory(req, "read the request");
		return -1;
	}
	*plen = sk_json_unescape(&ps, *path);
	(*path)[*plen] = '\0';
	return 0;
}

/* Decodes contents; answers and returns NULL when they are not acceptable. */
static unsigned char *decode_contents(struct http_request *req, const sk_json_str *c,
				      const char *p, size_t plen, size_t *n)
{
	/* Beyond this many symbols the result would be over the limit whatever they are. */
	if (c->len > SK_B64_ENCODED_LEN(AGENT_FILE_MAX)) {
		reply_too_large(req, p, plen);
		return NULL;
	}
	char *text = NULL;
	const char *sym = c->p;
	size_t nsym = c->len;
	if (c->escaped) {
		/* Standard base64 has no character JSON must escape, but "\/" is legal JSON. */
		if ((text = malloc(c->len)) == NULL) {
			reply_out_of_memory(req, "write a file");
			return NULL;
		}
		nsym = sk_json_unescape(c, text);
		sym = text;
	}
	unsigned char *data = malloc(SK_B64_DECODED_MAX(nsym) + 1);
	if (data == NULL) {
		free(text);
		reply_out_of_memory(req, "write a file");
		return NULL;
	}
	if (sk_b64_decode(sym, nsym, data, n) < 0) {
		reply_error(req, 400, "REQUEST_INVALID",
			    "Request invalid: contents are not valid base64: symbol %zu is not allowed", *n);
		free(text);
		free(data);
		return NULL;
	}
	free(text);
	if (*n > AGENT_FILE_MAX) {
		reply_too_large(req, p, plen);
		free(data);
		return NULL;
	}
	return data;
}

void files_put(struct http_request *req)
{
	char *p = NULL;
	size_t plen, n = 0;
	sk_json_str contents;
	int dirfd = -1, fd = -1;
	unsigned char *data = NULL;
	if (read_body(req, 1, &p, &plen, &contents) < 0)
		return;
	char rel[PATHS_MAX];
	const char *last;
	if (file_path(req, p, plen, rel) == NULL)
		goto out;
	if ((data = decode_contents(req, &contents, p, plen, &n)) == NULL)
		goto out;
	enum path_result r = paths_walk(rel, 1, 1, &dirfd, &last);
	if (r != PATH_OK) {
		reply_fs_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	/* Look first: only a regular file (or nothing) may be opened for writing and truncated. */
	int probe;
	struct stat st;
	r = paths_open_at(dirfd, last, O_PATH, 0, &probe);
	if (r == PATH_OK) {
		int ok = fstat(probe, &st) == 0 && S_ISREG(st.st_mode);
		close(probe);
		if (!ok) {
			reply_not_regular(req, p, plen);
			goto out;
		}
	} else if (r != PATH_MISSING) {
		reply_fs_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	r = paths_open_at(dirfd, last, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY, 0666, &fd);
	if (r != PATH_OK) {
		reply_fs_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		reply_not_regular(req, p, plen);
		goto out;
	}
	if (ftruncate(fd, 0) < 0) {
		reply_fs_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, data + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			reply_fs_errno(req, w == 0 ? EIO : errno, p, plen, "write a file", 1);
			goto out;
		}
		off += (size_t)w;
	}
	if (close(fd) < 0) {
		fd = -1;
		reply_fs_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	fd = -1;
	reply_empty(req, 204);
out:
	if (fd >= 0)
		close(fd);
	if (dirfd >= 0)
		close(dirfd);
	free(data);
	free(p);
}

void files_mkdir(struct http_request *req)
{
	char *p = NULL;
	size_t plen;
	sk_json_str unused;
	int dirfd = -1;
	if (read_body(req, 0, &p, &plen, &unused) < 0)
		return;
	char rel[PATHS_MAX];
	const char *why = paths_normalize(p, plen, rel);
	if (why) {
		reply_path_refused(req, p, plen, why);
	} else {
		enum path_result r = paths_walk(rel, 1, 0, &dirfd, NULL);
		if (r == PATH_NOT_DIR) {
			char shown[REPLY_SHOWN_PATH_MAX];
			util_printable(p, plen, shown, sizeof shown);
			reply_error(req, 400, "REQUEST_INVALID",
				    "Request invalid: '%s' or one of its parents is not a directory", shown);
		} else if (r != PATH_OK) {
			reply_fs_errno(req, errno, p, plen, "make a directory", 1);
		} else {
			reply_empty(req, 204);
		}
	}
	if (dirfd >= 0)
		close(dirfd);
	free(p);
}
