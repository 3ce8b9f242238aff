/*
 * fs_tar.c — a directory as a tar stream (docs/protocol.md §6 fsTar), through
 * common/tarstream.h: GET /v1/fs/tar writes the archive as the caller reads it, PUT extracts
 * the body as it arrives. Both take the caller's pace: a GET makes a piece only while fewer
 * than HTTP_OUTPUT_HIGH bytes wait for the caller, a PUT reads the next piece only once the last
 * one was written out (http.h).
 */
#include "fs.h"

#include "agent.h"
#include "archive_loader.h"
#include "common/tarstream.h"
#include "common/tree_remove.h"
#include "fserror.h"
#include "handler.h"
#include "http.h"
#include "log.h"
#include "paths.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>

/* Whether libarchive could not be loaded (archive_loader.h), answered as the operation's
 * failure before anything of it is done. */
static int tar_unavailable(struct http_request *req, const char *operation)
{
	const char *why = archive_loader_load();
	if (why == NULL)
		return 0;
	reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation '%s' failed: %s", operation, why);
	return 1;
}

/* ---- GET: the archive out ---- */

struct tar_send {
	struct http_request *req;
	sk_tar *tar;
	int dirfd;
	char shown[REPLY_SHOWN_PATH_MAX];
};

static void send_free(struct tar_send *s)
{
	sk_tar_free(s->tar);
	close(s->dirfd);
	free(s);
}

static void send_gone(void *ctx)
{
	send_free(ctx);
}

/* Makes pieces until the caller's queue is full or the archive is all out (http.h drain). */
static void send_pump(void *ctx)
{
	struct tar_send *s = ctx;
	/* One piece at a time in a single-threaded loop: one buffer serves every archive. */
	static char piece[SK_TAR_PIECE];
	while (http_reply_queued(s->req) < HTTP_OUTPUT_HIGH) {
		long n = sk_tar_read(s->tar, piece, sizeof piece);
		struct evbuffer *b = n > 0 ? evbuffer_new() : NULL;
		if (n > 0 && (b == NULL || evbuffer_add(b, piece, (size_t)n) < 0 || http_reply_chunk(s->req, b) < 0))
			n = -1;
		if (b)
			evbuffer_free(b);
		if (n > 0)
			continue;
		if (n < 0) {
			/* Headers promised bytes that are not there: the body ends cut short, which no
			 * caller takes for a whole archive. */
			char why[REPLY_SHOWN_PATH_MAX];
			util_printable(sk_tar_error(s->tar), strlen(sk_tar_error(s->tar)), why, sizeof why);
			log_info("the archive of '%s' was cut short: %s", s->shown, why);
			http_reply_cut(s->req);
		}
		http_reply_end(s->req);
		send_free(s);
		return;
	}
}

void fs_tar_get(struct http_request *req)
{
	size_t plen;
	char *p = request_path(req, &plen);
	char rel[PATHS_MAX];
	int dirfd;
	if (p == NULL)
		return;
	if (fs_normalize(req, p, plen, rel) < 0 || tar_unavailable(req, "archive a directory"))
		goto out;
	if (paths_open(rel, O_PATH | O_DIRECTORY, 0, &dirfd) != PATH_OK) {
		if (errno == ENOTDIR) {
			char shown[REPLY_SHOWN_PATH_MAX];
			util_printable(p, plen, shown, sizeof shown);
			reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' is not a directory", shown);
		} else {
			reply_fs_errno(req, errno, p, plen, "archive a directory", 0);
		}
		goto out;
	}
	struct tar_send *s = calloc(1, sizeof *s);
	if (s == NULL || (s->tar = sk_tar_new(dirfd, fs_open_beneath)) == NULL) {
		free(s);
		close(dirfd);
		reply_out_of_memory(req, "archive a directory");
		goto out;
	}
	s->req = req;
	s->dirfd = dirfd;
	util_printable(p, plen, s->shown, sizeof s->shown);
	if (http_reply_start(req, 200, "application/x-tar", -1) < 0) {
		http_reply_end(req);
		send_free(s);
		goto out;
	}
	http_reply_watch(req, send_pump, send_gone, s);
	send_pump(s);
out:
	free(p);
}

/* ---- PUT: the archive in ---- */

struct tar_recv {
	struct http_request *req;
	sk_untar *untar;
	int targetfd;
	char rel[PATHS_MAX];     /* the target, normalized */
	int created;             /* the target did not exist: a failure removes it again */
	char shown[REPLY_SHOWN_PATH_MAX];
};

/* A failed extraction leaves nothing of a target it made; in one that was there, what landed
 * before the failure stays (and the failure says so). The target's parent is opened again for
 * the removal, by its path, rather than held through the whole upload. */
static void recv_free(struct tar_recv *r, int failed)
{
	sk_untar_free(r->untar);
	if (r->targetfd >= 0)
		close(r->targetfd);
	int parentfd = -1;
	const char *last;
	if (failed && r->created &&
	    (paths_walk(r->rel, 0, 1, &parentfd, &last) != PATH_OK ||
	     sk_tree_remove(parentfd, last, NULL, 0) < 0))
		log_info("an extraction into '%s' failed, and what it made could not all be removed: %s",
			 r->shown, strerror(errno));
	if (parentfd >= 0)
		close(parentfd);
	free(r);
}

static void reply_failure(struct http_request *req, enum sk_tar_failure kind, int err, const char *why,
			  const char *shown)
{
	switch (kind) {
	case SK_TAR_REFUSED:
		reply_error(req, 400, "ARCHIVE_REFUSED", "Archive refused for '%s': %s", shown, why);
		return;
	case SK_TAR_INVALID:
		reply_error(req, 400, "ARCHIVE_INVALID", "Archive invalid for '%s': %s", shown, why);
		return;
	case SK_TAR_TOO_LARGE:
		reply_error(req, 413, "ARCHIVE_TOO_LARGE", "Archive too large for '%s': %s", shown, why);
		return;
	case SK_TAR_ERRNO: {
		const struct fs_error *e = fs_error(err, 1);
		if (e->status != 500) {
			reply_error(req, e->status, e->code, "Extracting into '%s' failed: %s", shown, why);
			return;
		}
	}
		/* fallthrough */
	default:
		reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation 'extract an archive' "
			    "failed for '%s': %s", shown, why);
	}
}

/* The extraction failed: what it made goes before the answer does, as the answer is written the
 * moment it is complete, and whoever reads it must find the target as the failure left it. */
static void fail_extraction(struct tar_recv *r)
{
	struct http_request *req = r->req;
	enum sk_tar_failure kind = sk_untar_failure(r->untar);
	int err = sk_untar_errno(r->untar);
	const char *text = sk_untar_error(r->untar);
	char why[REPLY_SHOWN_PATH_MAX * 2];
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(text, strlen(text), why, sizeof why);
	memcpy(shown, r->shown, sizeof shown);
	recv_free(r, 1);
	reply_failure(req, kind, err, why, shown);
}

static int recv_data(void *ctx, const char *data, size_t n)
{
	struct tar_recv *r = ctx;
	if (sk_untar_write(r->untar, data, n) == 0)
		return 0;
	fail_extraction(r);
	return -1;
}

static void recv_end(void *ctx, int complete)
{
	struct tar_recv *r = ctx;
	if (!complete) {
		/* A cut upload: the entry being written goes, and a target it made. */
		recv_free(r, 1);
		return;
	}
	if (sk_untar_finish(r->untar) < 0) {
		fail_extraction(r);
		return;
	}
	reply_empty(r->req, 204);
	recv_free(r, 0);
}

/* A bound the caller may lower but never raise: the query's, or the agent's own. */
static int read_bound(struct http_request *req, const char *name, uint64_t most, uint64_t *out)
{
	char *v;
	size_t n;
	int rc = request_param(req, name, &v, &n);
	*out = most;
	if (rc == -1)
		return 0;
	if (rc == -3) {
		reply_out_of_memory(req, "read the request");
		return -1;
	}
	uint64_t value = 0;
	int ok = rc == 0 && n > 0 && n <= 19;
	for (size_t i = 0; ok && i < n; i++) {
		ok = v[i] >= '0' && v[i] <= '9';
		value = value * 10 + (uint64_t)(v[i] - '0');
	}
	free(v);
	if (!ok) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s must be a whole number", name);
		return -1;
	}
	if (value < most)
		*out = value;
	return 0;
}

void fs_tar_put(struct http_request *req)
{
	size_t plen;
	char *p = request_path(req, &plen);
	char rel[PATHS_MAX];
	uint64_t max_entries, max_bytes;
	struct tar_recv *r = NULL;
	int parentfd = -1;
	if (p == NULL)
		return;
	if (fs_normalize(req, p, plen, rel) < 0 ||
	    read_bound(req, "maxEntries", SK_TAR_MAX_ENTRIES, &max_entries) < 0 ||
	    read_bound(req, "maxBytes", SK_TAR_MAX_BYTES, &max_bytes) < 0 ||
	    tar_unavailable(req, "extract an archive"))
		goto fail;
	if ((r = calloc(1, sizeof *r)) == NULL) {
		reply_out_of_memory(req, "extract an archive");
		goto fail;
	}
	r->req = req;
	r->targetfd = -1;
	memcpy(r->rel, rel, strlen(rel) + 1);
	util_printable(p, plen, r->shown, sizeof r->shown);
	const char *last;
	if (paths_walk(rel, 1, 1, &parentfd, &last) != PATH_OK) {
		reply_fs_errno(req, errno, p, plen, "extract an archive", 1);
		goto fail;
	}
	struct stat st;
	if (fstatat(parentfd, last, &st, AT_SYMLINK_NOFOLLOW) == 0) {
		if (!S_ISDIR(st.st_mode)) {
			reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' exists and is not a "
				    "directory", r->shown);
			goto fail;
		}
	} else if (errno != ENOENT) {
		reply_fs_errno(req, errno, p, plen, "extract an archive", 1);
		goto fail;
	} else if (mkdirat(parentfd, last, 0777) < 0) {
		reply_fs_errno(req, errno, p, plen, "extract an archive", 1);
		goto fail;
	} else {
		r->created = 1;
	}
	if (paths_open_at(parentfd, last, O_PATH | O_DIRECTORY, 0, &r->targetfd) != PATH_OK) {
		int err = errno;
		r->targetfd = -1;
		/* A target made here goes before the answer, as in fail_extraction. */
		recv_free(r, 1);
		r = NULL;
		reply_fs_errno(req, err, p, plen, "extract an archive", 1);
		goto fail;
	}
	close(parentfd);
	parentfd = -1;
	if ((r->untar = sk_untar_new(r->targetfd, fs_open_beneath, max_entries, max_bytes)) == NULL) {
		recv_free(r, 1);
		r = NULL;
		reply_out_of_memory(req, "extract an archive");
		goto fail;
	}
	free(p);
	http_body_stream(req, recv_data, recv_end, r);
	return;
fail:
	if (parentfd >= 0)
		close(parentfd);
	if (r)
		recv_free(r, 1);
	free(p);
}
