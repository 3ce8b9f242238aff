/* handler.c — see handler.h. */
#include "handler.h"

#include "common/json.h"
#include "fserror.h"
#include "http.h"
#include "log.h"
#include "request.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

/* The longest error text sent: far below the client's 4096-byte bound on error bodies. */
#define REPLY_ERROR_MAX 1024

static void send_text(struct http_request *req, int status, const char *text, size_t len)
{
	struct evbuffer *b = evbuffer_new();
	/* Without memory for the body the status alone still refuses. */
	if (b && evbuffer_add(b, text, len) < 0) {
		evbuffer_free(b);
		b = NULL;
	}
	http_reply(req, status, "text/plain; charset=utf-8", b);
}

void reply_error(struct http_request *req, int status, const char *code, const char *fmt, ...)
{
	char text[REPLY_ERROR_MAX];
	int n = 0;
	if (code)
		n = snprintf(text, sizeof text, "%s: ", code);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(text + n, sizeof text - (size_t)n, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len >= sizeof text)
		len = sizeof text - 1;
	log_debug("answered %d %.*s", status, (int)len, text);
	send_text(req, status, text, len);
}

void reply_json(struct http_request *req, int status, struct evbuffer *body)
{
	http_reply(req, status, "application/json", body);
}

void reply_empty(struct http_request *req, int status)
{
	http_reply(req, status, NULL, NULL);
}

void reply_out_of_memory(struct http_request *req, const char *operation)
{
	reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation '%s' failed: %s", operation,
		    strerror(ENOMEM));
}

void reply_path_refused(struct http_request *req, const char *p, size_t len, const char *why)
{
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, 400, "PATH_REFUSED", "Path '%s' refused: %s", shown, why);
}

void reply_fs_errno(struct http_request *req, int err, const char *p, size_t len,
		    const char *operation, int writing)
{
	const struct fs_error *e = fs_error(err, writing);
	if (e->status == 500) {
		reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation '%s' failed: %s", operation,
			    strerror(err));
		return;
	}
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, e->status, e->code, "%s%s%s%s", e->before, shown, e->after, e->why);
}

int request_param(struct http_request *req, const char *name, char **value, size_t *len)
{
	const struct http_head *h = http_request_head(req);
	*value = NULL;
	if (h->query == NULL)
		return -1;
	char *v = malloc(h->query_len + 1);
	if (v == NULL)
		return -3;
	long n = http_query_param(h->query, h->query_len, name, v);
	if (n < 0) {
		free(v);
		return (int)n;
	}
	*value = v;
	*len = (size_t)n;
	return 0;
}

int read_json_body(struct http_request *req, const char *operation,
		   const char *(*member)(void *ctx, sk_json *j, const sk_json_str *key), void *ctx)
{
	size_t len;
	const char *body = http_request_body(req, &len);
	if (body == NULL) {
		reply_out_of_memory(req, operation);
		return -1;
	}
	sk_json j;
	sk_json_init(&j, body, len);
	if (sk_json_object_begin(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not a JSON object");
		return -1;
	}
	const char *problem = NULL;
	sk_json_str key;
	int more;
	while ((more = sk_json_object_key(&j, &key)) == 1) {
		const char *p = member(ctx, &j, &key);
		if (problem == NULL)
			problem = p;
	}
	if (more < 0 || sk_json_finish(&j) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the body is not valid JSON: %s",
			    j.err ? j.err : "malformed");
		return -1;
	}
	if (problem) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: %s", problem);
		return -1;
	}
	return 0;
}

char *request_path(struct http_request *req, size_t *len)
{
	char *v;
	switch (request_param(req, "path", &v, len)) {
	case 0:
		return v;
	case -2:
		reply_error(req, 400, "REQUEST_INVALID",
			    "Request invalid: the path is not percent-encoded correctly");
		return NULL;
	case -3:
		reply_out_of_memory(req, "read the request");
		return NULL;
	default:
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the query needs a path");
		return NULL;
	}
}

int read_cmd_request(struct http_request *req, struct cmd_request *r, const char *operation)
{
	size_t len;
	const char *body = http_request_body(req, &len);
	int rc = body ? cmd_request_parse(body, len, r) : -2;
	if (rc == -2) {
		if (body)
			cmd_request_free(r);
		reply_out_of_memory(req, operation);
	}
	return rc;
}
