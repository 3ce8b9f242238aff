/* server.c — see server.h. */
#include "server.h"

#include "agent.h"
#include "capability.h"
#include "files.h"
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
#include <netinet/in.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

/* Request headers are a few hundred bytes; 64 KiB leaves room for any proxy's additions. */
#define SERVER_HEADERS_MAX 65536
/* The longest error text sent: far below the client's 4096-byte bound on error bodies. */
#define SERVER_ERROR_MAX 1024

struct route {
	const char *path;
	enum evhttp_cmd_type method;
	int public;              /* health only: no credential, no activation */
	void (*handle)(struct evhttp_request *req);
};

static void health(struct evhttp_request *req);
static void activate(struct evhttp_request *req);

static const struct route routes[] = {
	{ "/v1/health", EVHTTP_REQ_GET, 1, health },
	{ "/v1/activate", EVHTTP_REQ_POST, 0, activate },
	{ "/v1/exec", EVHTTP_REQ_POST, 0, stream_exec },
	{ "/v1/jobs/start", EVHTTP_REQ_POST, 0, jobs_start },
	{ "/v1/jobs/poll", EVHTTP_REQ_POST, 0, jobs_poll },
	{ "/v1/jobs/cancel", EVHTTP_REQ_POST, 0, jobs_cancel },
	{ "/v1/files", EVHTTP_REQ_GET, 0, files_get },
	{ "/v1/files", EVHTTP_REQ_PUT, 0, files_put },
	{ "/v1/mkdir", EVHTTP_REQ_POST, 0, files_mkdir },
};
#define NROUTES (sizeof routes / sizeof routes[0])

static void send_text(struct evhttp_request *req, int status, const char *text, size_t len)
{
	struct evbuffer *b = evbuffer_new();
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	/* Without memory for the header or the body the status alone still refuses. */
	if (b == NULL || evhttp_add_header(h, "Content-Type", "text/plain; charset=utf-8") < 0 ||
	    evbuffer_add(b, text, len) < 0) {
		/* No memory for a body: the status alone still refuses. */
		if (b)
			evbuffer_free(b);
		evhttp_send_reply(req, status, NULL, NULL);
		return;
	}
	evhttp_send_reply(req, status, NULL, b);
	evbuffer_free(b);
}

void reply_error(struct evhttp_request *req, int status, const char *code, const char *fmt, ...)
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

void reply_json(struct evhttp_request *req, int status, struct evbuffer *body)
{
	if (evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			      "application/json") < 0) {
		/* A JSON answer without its type would be misread; a bare 500 is honest. */
		evbuffer_free(body);
		evhttp_send_reply(req, 500, NULL, NULL);
		return;
	}
	evhttp_send_reply(req, status, NULL, body);
	evbuffer_free(body);
}

void reply_empty(struct evhttp_request *req, int status)
{
	evhttp_send_reply(req, status, NULL, NULL);
}

void reply_out_of_memory(struct evhttp_request *req, const char *operation)
{
	reply_error(req, 500, "AGENT_OPERATION_FAILED", "Agent operation '%s' failed: %s", operation,
		    strerror(ENOMEM));
}

void reply_path_refused(struct evhttp_request *req, const char *p, size_t len, const char *why)
{
	char shown[REPLY_SHOWN_PATH_MAX];
	util_printable(p, len, shown, sizeof shown);
	reply_error(req, 400, "PATH_REFUSED", "Path '%s' refused: %s", shown, why);
}

int read_cmd_request(struct evhttp_request *req, struct cmd_request *r, const char *operation)
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

const char *request_body(struct evhttp_request *req, size_t *len)
{
	struct evbuffer *in = evhttp_request_get_input_buffer(req);
	*len = evbuffer_get_length(in);
	if (*len == 0)
		return "";
	return (const char *)evbuffer_pullup(in, -1);
}

static void health(struct evhttp_request *req)
{
	struct evkeyvalq q;
	const char *query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
	TAILQ_INIT(&q);
	if (query && evhttp_parse_query_str(query, &q) < 0) {
		reply_error(req, 400, "REQUEST_INVALID", "Request invalid: the query does not parse");
		return;
	}
	const char *v = evhttp_find_header(&q, "version");
	if (v) {
		char shown[32];
		util_printable(v, strlen(v), shown, sizeof shown);
		/* The version is named back, never negotiated down. */
		if (strcmp(v, "1") != 0) {
			reply_error(req, 400, "PROTOCOL_VERSION_MISMATCH",
				    "Caller speaks sandbox agent protocol v%s, this agent speaks v%d", shown,
				    AGENT_PROTOCOL_VERSION);
			evhttp_clear_headers(&q);
			return;
		}
	}
	evhttp_clear_headers(&q);
	struct evbuffer *b = evbuffer_new();
	if (b == NULL ||
	    evbuffer_add_printf(b,
				"{\"protocolVersion\":%d,\"bootId\":\"%s\",\"status\":\"%s\","
				"\"features\":[\"jobIdempotency\"%s]}",
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

static void activate(struct evhttp_request *req)
{
	if (!agent.activated)
		log_info("activated");
	agent.activated = 1;
	reply_empty(req, 204);
}

/* Bearer and capability modes (docs/protocol.md §2). 1 when the request may proceed;
 * otherwise answered. */
static int authorized(struct evhttp_request *req)
{
	if (agent.cfg.no_auth)
		return 1; /* provider mode: the proxy in front authorized the caller */
	struct evkeyvalq *h = evhttp_request_get_input_headers(req);
	const char *value = NULL, *token = NULL;
	int count = 0, token_count = 0;
	for (struct evkeyval *kv = h->tqh_first; kv; kv = kv->next.tqe_next) {
		if (evutil_ascii_strcasecmp(kv->key, "Authorization") == 0) {
			value = kv->value;
			count++;
		} else if (evutil_ascii_strcasecmp(kv->key, CAPABILITY_HEADER) == 0) {
			token = kv->value;
			token_count++;
		}
	}
	if (agent.cfg.capability) {
		char why[CAPABILITY_WHY_MAX];
		int status = capability_authorize(agent.cfg.capability, value, count, token,
						  token_count, why, sizeof why);
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
	int ok = count == 1 && strncmp(value, "Bearer ", 7) == 0 &&
		 strlen(value + 7) == AGENT_TOKEN_CHARS &&
		 util_ct_equal(value + 7, agent.cfg.token, AGENT_TOKEN_CHARS);
	if (!ok) {
		reply_error(req, 403, "SANDBOX_CAPABILITY_REFUSED",
			    "Sandbox capability refused: the bearer token is not this agent's");
		return 0;
	}
	return 1;
}

static const char *method_name(enum evhttp_cmd_type m)
{
	switch (m) {
	case EVHTTP_REQ_GET: return "GET";
	case EVHTTP_REQ_POST: return "POST";
	case EVHTTP_REQ_PUT: return "PUT";
	default: return "?";
	}
}

static void dispatch(struct evhttp_request *req, void *arg)
{
	(void)arg;
	const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
	enum evhttp_cmd_type method = evhttp_request_get_command(req);
	const struct route *match = NULL;
	char allow[32] = "";
	if (path == NULL)
		path = "";
	for (size_t i = 0; i < NROUTES; i++) {
		if (strcmp(routes[i].path, path) != 0)
			continue;
		if (routes[i].method == method)
			match = &routes[i];
		snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s", allow[0] ? ", " : "",
			 method_name(routes[i].method));
	}
	char shown[128];
	util_printable(path, strlen(path), shown, sizeof shown);
	if (match == NULL && allow[0] == '\0') {
		reply_error(req, 404, "ROUTE_NOT_FOUND", "No route %s in this agent", shown);
		return;
	}
	if (match == NULL) {
		/* Allow is advice; without memory for it the 405 still says the same. */
		evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
		reply_error(req, 405, "METHOD_NOT_ALLOWED", "%s accepts %s", shown, allow);
		return;
	}
	log_debug("%s %s", method_name(method), shown);
	if (match->public) {
		match->handle(req);
		return;
	}
	if (!authorized(req))
		return;
	if (agent.cfg.require_activation && !agent.activated && match->handle != activate) {
		reply_error(req, 503, "AGENT_NOT_ACTIVATED",
			    "the agent serves nothing before its first POST /v1/activate");
		return;
	}
	match->handle(req);
}

int server_start(unsigned *port)
{
	agent.http = evhttp_new(agent.base);
	if (agent.http == NULL)
		return -1;
	evhttp_set_gencb(agent.http, dispatch, NULL);
	/* Every method evhttp can parse reaches dispatch, so a wrong one is a 405, not a 501. */
	evhttp_set_allowed_methods(agent.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
						       EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
						       EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
						       EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
	/* Over this evhttp answers 413 from the Content-Length alone, before reading the body. */
	evhttp_set_max_body_size(agent.http, (ev_ssize_t)AGENT_BODY_MAX);
	evhttp_set_max_headers_size(agent.http, SERVER_HEADERS_MAX);
	evhttp_set_timeout(agent.http, SERVER_IO_TIMEOUT_S);
	struct evhttp_bound_socket *bound =
		evhttp_bind_socket_with_handle(agent.http, agent.cfg.listen_host,
					       (ev_uint16_t)agent.cfg.listen_port);
	if (bound == NULL)
		return -1;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	if (getsockname(evhttp_bound_socket_get_fd(bound), (struct sockaddr *)&ss, &sl) < 0)
		return -1;
	*port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
					       : ((struct sockaddr_in *)&ss)->sin_port);
	return 0;
}

void server_stop(void)
{
	if (agent.http)
		evhttp_free(agent.http);
	agent.http = NULL;
}
