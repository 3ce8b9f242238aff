/* files.c — see files.h. */
#include "files.h"

#include "../base64.h"
#include "../json.h"
#include "agent.h"
#include "fserror.h"
#include "paths.h"
#include "server.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/http.h>

/* Answers a file operation on the caller's path p that met err (fserror.h), while reading or
 * while creating and writing. */
static void reply_errno(struct evhttp_request *req, int err, const char *p, size_t len,
			const char *operation, int writing)
{
	const struct fs_error *e = fs_error(err, writing);
	if (e->status == 500) {
		reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation '%s' failed: %s",
			    operation, strerror(err));
		return;
	}
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, e->status, e->code, "%s%s%s%s", e->before, shown, e->after, e->why);
}

static void reply_not_regular(struct evhttp_request *req, const char *p, size_t len)
{
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' is not a regular file", shown);
}

static void reply_too_large(struct evhttp_request *req, const char *p, size_t len)
{
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, 400, "REQUEST_INVALID", "Request invalid: '%s' is over the %zu byte transfer limit",
		    shown, AGENT_FILE_MAX);
}

/* The raw value of the query parameter "path", percent-decoded ('+' is a space, as in every
 * form-encoded query); NULL when absent. *len tells an embedded NUL apart. */
static char *query_path(struct evhttp_request *req, size_t *len, int *oom)
{
	const char *q = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
	*oom = 0;
	if (q == NULL)
		return NULL;
	for (const char *p = q; *p;) {
		size_t n = strcspn(p, "&");
		if (n >= 5 && strncmp(p, "path=", 5) == 0) {
			char *raw = strndup(p + 5, n - 5);
			if (raw == NULL) {
				*oom = 1;
				return NULL;
			}
			char *v = evhttp_uridecode(raw, 1, len);
			free(raw);
			if (v == NULL)
				*oom = 1;
			return v;
		}
		p += n;
		if (*p == '&')
			p++;
	}
	return NULL;
}

/* Reads fd to the end into a buffer of at most AGENT_FILE_MAX + 1 bytes; the extra byte is
 * how a file over the limit is seen, whatever its size claimed. */
static int read_all(int fd, size_t hint, unsigned char **out, size_t *len)
{
	size_t cap = hint < AGENT_FILE_MAX ? hint + 1 : AGENT_FILE_MAX + 1, n = 0;
	if (cap < 4096)
		cap = 4096;
	unsigned char *buf = malloc(cap);
	if (buf == NULL)
		return -1;
	for (;;) {
		if (n == cap) {
			if (cap > AGENT_FILE_MAX)
				break;
			size_t ncap = cap * 2 > AGENT_FILE_MAX + 1 ? AGENT_FILE_MAX + 1 : cap * 2;
			unsigned char *nb = realloc(buf, ncap);
			if (nb == NULL) {
				free(buf);
				return -1;
			}
			buf = nb;
			cap = ncap;
		}
		ssize_t r = read(fd, buf + n, cap - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			free(buf);
			errno = e;
			return -1;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	*out = buf;
	*len = n;
	return 0;
}

void files_get(struct evhttp_request *req)
{
	size_t plen;
	int oom;
	char *p = query_path(req, &plen, &oom);
	if (p == NULL) {
		if (oom)
			reply_out_of_memory(req, "read a file");
		else
			reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the query needs a path");
		return;
	}
	char rel[PATHS_MAX];
	const char *why = paths_normalize(p, plen, rel);
	int probe = -1, fd = -1;
	unsigned char *data = NULL;
	struct stat before, after;
	if (why) {
		reply_path_refused(req, p, plen, why);
		goto out;
	}
	/* Look before opening for reading: opening a device or FIFO can itself act or block. */
	enum path_result r = paths_open(rel, O_PATH, 0, &probe);
	if (r != PATH_OK) {
		reply_errno(req, errno, p, plen, "read a file", 0);
		goto out;
	}
	if (fstat(probe, &before) < 0) {
		reply_errno(req, errno, p, plen, "read a file", 0);
		goto out;
	}
	if (!S_ISREG(before.st_mode)) {
		reply_not_regular(req, p, plen);
		goto out;
	}
	/* O_NONBLOCK: if a FIFO was swapped in meanwhile, the open cannot hang; the second look
	 * below refuses it. */
	r = paths_open(rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0, &fd);
	if (r != PATH_OK) {
		reply_errno(req, errno, p, plen, "read a file", 0);
		goto out;
	}
	if (fstat(fd, &after) < 0) {
		reply_errno(req, errno, p, plen, "read a file", 0);
		goto out;
	}
	if (!S_ISREG(after.st_mode) || after.st_ino != before.st_ino || after.st_dev != before.st_dev) {
		reply_not_regular(req, p, plen);
		goto out;
	}
	size_t n;
	if (read_all(fd, (size_t)after.st_size, &data, &n) < 0) {
		if (errno == ENOMEM)
			reply_out_of_memory(req, "read a file");
		else
			reply_errno(req, errno, p, plen, "read a file", 0);
		goto out;
	}
	if (n > AGENT_FILE_MAX) {
		reply_too_large(req, p, plen);
		goto out;
	}
	struct evbuffer *b = evbuffer_new();
	struct evbuffer_iovec v;
	size_t enc = SK_B64_ENCODED_LEN(n);
	if (b == NULL || evbuffer_add(b, "{\"contentsBase64\":\"", 19) < 0 ||
	    (enc > 0 && evbuffer_reserve_space(b, (ev_ssize_t)enc, &v, 1) < 1)) {
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "read a file");
		goto out;
	}
	if (enc > 0) {
		sk_b64_encode(data, n, v.iov_base);
		v.iov_len = enc;
		evbuffer_commit_space(b, &v, 1);
	}
	if (evbuffer_add(b, "\"}", 2) < 0) {
		evbuffer_free(b);
		reply_out_of_memory(req, "read a file");
		goto out;
	}
	reply_json(req, 200, b);
out:
	if (probe >= 0)
		close(probe);
	if (fd >= 0)
		close(fd);
	free(data);
	free(p);
}

/* Reads {"path": "...", "contentsBase64": "..."} (contents optional for mkdir). Returns 0, or
 * answers the request and returns -1. */
static int read_body(struct evhttp_request *req, int want_contents, char **path, size_t *plen,
		     sk_json_str *contents, int *has_contents)
{
	size_t len;
	const char *body = request_body(req, &len);
	if (body == NULL) {
		reply_out_of_memory(req, "read the request");
		return -1;
	}
	sk_json j;
	sk_json_init(&j, body, len);
	sk_json_str key, ps = { NULL, 0, 0 };
	int more, has_path = 0;
	const char *problem = NULL;
	*has_contents = 0;
	if (sk_json_object_begin(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not a JSON object");
		return -1;
	}
	while ((more = sk_json_object_key(&j, &key)) == 1) {
		if (sk_json_str_is(&key, "path") && !has_path) {
			has_path = 1;
			if (sk_json_peek(&j) == SK_JSON_STRING)
				sk_json_string(&j, &ps);
			else {
				problem = "path must be a string";
				sk_json_skip(&j);
			}
		} else if (want_contents && sk_json_str_is(&key, "contentsBase64") && !*has_contents) {
			*has_contents = 1;
			if (sk_json_peek(&j) == SK_JSON_STRING)
				sk_json_string(&j, contents);
			else {
				problem = "contentsBase64 must be a string";
				sk_json_skip(&j);
			}
		} else {
			sk_json_skip(&j);
		}
	}
	if (more < 0 || sk_json_finish(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not valid JSON: %s",
			    j.err ? j.err : "malformed");
		return -1;
	}
	if (problem == NULL && !has_path)
		problem = "path is required";
	if (problem == NULL && want_contents && !*has_contents)
		problem = "contentsBase64 is required";
	if (problem) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s", problem);
		return -1;
	}
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
static unsigned char *decode_contents(struct evhttp_request *req, const sk_json_str *c,
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

void files_put(struct evhttp_request *req)
{
	char *p = NULL;
	size_t plen, n = 0;
	sk_json_str contents;
	int has_contents, dirfd = -1, fd = -1;
	unsigned char *data = NULL;
	if (read_body(req, 1, &p, &plen, &contents, &has_contents) < 0)
		return;
	char rel[PATHS_MAX];
	const char *why = paths_normalize(p, plen, rel), *last;
	if (why) {
		reply_path_refused(req, p, plen, why);
		goto out;
	}
	if ((data = decode_contents(req, &contents, p, plen, &n)) == NULL)
		goto out;
	enum path_result r = paths_walk(rel, 1, 1, &dirfd, &last);
	if (r != PATH_OK) {
		reply_errno(req, errno, p, plen, "write a file", 1);
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
		reply_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	r = paths_open_at(dirfd, last, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOCTTY, 0666, &fd);
	if (r != PATH_OK) {
		reply_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		reply_not_regular(req, p, plen);
		goto out;
	}
	if (ftruncate(fd, 0) < 0) {
		reply_errno(req, errno, p, plen, "write a file", 1);
		goto out;
	}
	for (size_t off = 0; off < n;) {
		ssize_t w = write(fd, data + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			reply_errno(req, w == 0 ? EIO : errno, p, plen, "write a file", 1);
			goto out;
		}
		off += (size_t)w;
	}
	if (close(fd) < 0) {
		fd = -1;
		reply_errno(req, errno, p, plen, "write a file", 1);
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

void files_mkdir(struct evhttp_request *req)
{
	char *p = NULL;
	size_t plen;
	sk_json_str unused;
	int has_contents, dirfd = -1;
	if (read_body(req, 0, &p, &plen, &unused, &has_contents) < 0)
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
			reply_errno(req, errno, p, plen, "make a directory", 1);
		} else {
			reply_empty(req, 204);
		}
	}
	if (dirfd >= 0)
		close(dirfd);
	free(p);
}
