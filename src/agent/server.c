/* server.c — see server.h. */
#include "server.h"

#include "agent.h"
#include "capability.h"
#include "files.h"
#include "http.h"
#include "jobs.h"
#include "log.h"
#include "request.h"
#include "stream.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

/* The longest error text sent: far below the client's 4096-byte bound on error bodies. */
#define SERVER_ERROR_MAX 1024

struct route {
	const char *path;
	enum http_method method;
	int public;              /* health only: no credential, no activation */
	enum http_body_mode body;
	void (*handle)(struct http_request *req);
};

static void health(struct http_request *req);
static void activate(struct http_request *req);

static const struct route routes[] = {
	{ "/v1/health", HTTP_GET, 1, HTTP_BODY_BUFFERED, health },
	{ "/v1/activate", HTTP_POST, 0, HTTP_BODY_BUFFERED, activate },
	{ "/v1/exec", HTTP_POST, 0, HTTP_BODY_BUFFERED, stream_exec },
	{ "/v1/jobs/start", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_start },
	{ "/v1/jobs/poll", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_poll },
	{ "/v1/jobs/cancel", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_cancel },
	{ "/v1/files", HTTP_GET, 0, HTTP_BODY_BUFFERED, files_get },
	{ "/v1/files", HTTP_PUT, 0, HTTP_BODY_BUFFERED, files_put },
	{ "/v1/files/raw", HTTP_GET, 0, HTTP_BODY_BUFFERED, files_raw_get },
	{ "/v1/files/raw", HTTP_PUT, 0, HTTP_BODY_STREAMED, files_raw_put },
	{ "/v1/mkdir", HTTP_POST, 0, HTTP_BODY_BUFFERED, files_mkdir },
};
#define NROUTES (sizeof routes / sizeof routes[0])

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
	char text[SERVER_ERROR_MAX];
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

int read_cmd_request(struct http_request *req, struct cmd_request *r, const char *operation)
{
	size_t len;
	const char *body = request_body(req, &len);
	int rc = body ? cmd_request_parse(body, len, r) : -2;
	if (rc == -2) {
		if (body)
			cmd_request_free(r);
		reply_out_of_memory(req, operation);
	}
	return rc;
}

const char *request_body(struct http_request *req, size_t *len)
{
	return http_request_body(req, len);
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

static void health(struct http_request *req)
{
	char *v;
	size_t n;
	int r = request_param(req, "version", &v, &n);
	if (r == -3) {
		reply_out_of_memory(req, "answer health");
		return;
	}
	if (r == -2) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the query does not parse");
		return;
	}
	/* The version is named back, never negotiated down. */
	if (r == 0 && (n != 1 || v[0] != '1')) {
		char shown[32];
		util_printable(v, n, shown, sizeof shown);
		free(v);
		reply_error(req, 400, "PROTOCOL_VERSION_MISMATCH",
			    "Caller speaks sandbox agent protocol v%s, this agent speaks v%d", shown,
			    AGENT_PROTOCOL_VERSION);
		return;
	}
	free(v);
	struct evbuffer *b = evbuffer_new();
	if (b == NULL ||
	    evbuffer_add_printf(b,
				"{\"protocolVersion\":%d,\"bootId\":\"%s\",\"status\":\"%s\","
				"\"features\":[\"jobIdempotency\",\"outputCap\",\"rawFiles\"%s]}",
				AGENT_PROTOCOL_VERSION, agent.boot_id,
				agent.activated ? "ready" : "awaiting-network-verification",
				agent.cfg.capability ? ",\"capability\"" : "") < 0) {
		if (b)
			evbuffer_free(b);
		reply_out_of_memory(req, "answer health");
		return;
	}
	reply_json(req, 200, b);
}

static void activate(struct http_request *req)
{
	if (!agent.activated)
		log_info("activated");
	agent.activated = 1;
	reply_empty(req, 204);
}

/*
 * The one authorization decision (docs/protocol.md §2: bearer, capability, or none behind a
 * provider's proxy), made from the request's headers alone,
 * before any of its body is read. 1 when the request may proceed; otherwise it has answered
 * 401 (no credential) or 403 (a credential that is not accepted).
 */
static int authorized(struct http_request *req)
{
	if (agent.cfg.no_auth)
		return 1; /* provider mode: the proxy in front authorized the caller */
	int count, token_count;
	const struct http_head *head = http_request_head(req);
	const struct http_field *f = http_field(head, "Authorization", &count);
	if (agent.cfg.capability) {
		const struct http_field *t = http_field(head, CAPABILITY_HEADER, &token_count);
		char why[CAPABILITY_WHY_MAX];
		int status = capability_authorize(agent.cfg.capability, f ? f->value : NULL,
						  f ? f->value_len : 0, count, t ? t->value : NULL,
						  t ? t->value_len : 0, token_count, why, sizeof why);
		if (status == 401)
			reply_error(req, 401, NULL, "a capability is required");
		else if (status != 0)
			reply_error(req, 403, "SANDBOX_CAPABILITY_REFUSED",
				    "Sandbox capability refused: %s", why);
		return status == 0;
	}
	if (count == 0) {
		reply_error(req, 401, NULL, "a capability is required");
		return 0;
	}
	/* Two headers are refused like a wrong one: which of them counts would be a guess. The
	 * comparison runs over the whole token whatever the first difference. */
	int ok = count == 1 && f->value_len == 7 + AGENT_TOKEN_CHARS &&
		 memcmp(f->value, "Bearer ", 7) == 0 &&
		 util_ct_equal(f->value + 7, agent.cfg.token, AGENT_TOKEN_CHARS);
	if (!ok) {
		reply_error(req, 403, "SANDBOX_CAPABILITY_REFUSED",
			    "Sandbox capability refused: the bearer token is not this agent's");
		return 0;
	}
	return 1;
}

static const char *method_name(enum http_method m)
{
	switch (m) {
	case HTTP_GET: return "GET";
	case HTTP_POST: return "POST";
	case HTTP_PUT: return "PUT";
	default: return "?";
	}
}

/* Routing, authorization and activation, once the head is in (http.h on_head). */
static http_handler dispatch(struct http_request *req, enum http_body_mode *mode)
{
	const struct http_head *h = http_request_head(req);
	const struct route *match = NULL;
	char allow[32] = "";
	for (size_t i = 0; i < NROUTES; i++) {
		if (strlen(routes[i].path) != h->path_len ||
		    memcmp(routes[i].path, h->path, h->path_len) != 0)
			continue;
		if (routes[i].method == h->method)
			match = &routes[i];
		snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s", allow[0] ? ", " : "",
			 method_name(routes[i].method));
	}
	char shown[128];
	util_printable(h->path, h->path_len, shown, sizeof shown);
	if (match == NULL && allow[0] == '\0') {
		reply_error(req, 404, "ROUTE_NOT_FOUND", "No route %s in this agent", shown);
		return NULL;
	}
	if (match == NULL) {
		/* Allow is advice; without memory for it the 405 still says the same. */
		http_add_header(req, "Allow", allow);
		reply_error(req, 405, "METHOD_NOT_ALLOWED", "%s accepts %s", shown, allow);
		return NULL;
	}
	log_debug("%s %s", method_name(h->method), shown);
	*mode = match->body;
	if (match->public)
		return match->handle;
	if (!authorized(req))
		return NULL;
	if (agent.cfg.require_activation && !agent.activated && match->handle != activate) {
		reply_error(req, 503, "AGENT_NOT_ACTIVATED",
			    "the agent serves nothing before its first POST /v1/activate");
		return NULL;
	}
	return match->handle;
}

int server_start(unsigned *port)
{
	struct http_config cfg = {
		agent.cfg.listen_host, agent.cfg.listen_port, agent.cfg.max_connections,
		agent.cfg.header_timeout_ms, agent.cfg.body_timeout_ms, AGENT_BODY_MAX, dispatch,
	};
	return http_start(&cfg, port);
}

void server_stop(void)
{
	http_stop();
}
