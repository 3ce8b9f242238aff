/* server.c — see server.h. */
#include "server.h"

#include "agent.h"
#include "capability.h"
#include "confine.h"
#include "files.h"
#include "fs.h"
#include "handler.h"
#include "http.h"
#include "jobs.h"
#include "jobs_live.h"
#include "log.h"
#include "preview.h"
#include "stream.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

/* Descriptors serving one request may hold at once: its socket, a command's two pipes and its
 * pidfd; or a directory's archive: its socket, the directory, the one being read, and a file
 * (a walk stepping down opens the next directory a moment before it lets the last go); a job's
 * input spliced into its pipe takes two, its socket and its duplicate of the pipe. */
#define FDS_PER_CONNECTION 4
/* Descriptors kept out of the connections' budget: stdio, root, listener, event loop, signal
 * pipe, and what a request opens for a moment; and each job's pipes and pidfd. */
#define FDS_RESERVED 16
/* A job: its pidfd and two output pipes, or its terminal's master and a duplicate for input,
 * and an input pipe: four at most. */
#define FDS_PER_JOB 4

struct route {
	const char *path;
	enum http_method method;
	int public;              /* health only: no credential, no activation, so no body */
	enum http_body_mode body;
	void (*handle)(struct http_request *req);
};

static void health(struct http_request *req);
static void activate(struct http_request *req);

static const struct route routes[] = {
	{ "/v1/health", HTTP_GET, 1, HTTP_BODY_NONE, health },
	{ "/v1/activate", HTTP_POST, 0, HTTP_BODY_BUFFERED, activate },
	{ "/v1/exec", HTTP_POST, 0, HTTP_BODY_BUFFERED, stream_exec },
	{ "/v1/jobs/start", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_start },
	{ "/v1/jobs/poll", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_poll },
	{ "/v1/jobs/cancel", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_cancel },
	{ "/v1/jobs/stdin", HTTP_POST, 0, HTTP_BODY_STREAMED, jobs_stdin },
	{ "/v1/jobs/resize", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_resize },
	{ "/v1/jobs/signal", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_signal },
	{ "/v1/jobs/stream", HTTP_POST, 0, HTTP_BODY_BUFFERED, jobs_stream },
	{ "/v1/jobs/list", HTTP_GET, 0, HTTP_BODY_NONE, jobs_list },
	{ "/v1/files", HTTP_GET, 0, HTTP_BODY_NONE, files_get },
	{ "/v1/files", HTTP_PUT, 0, HTTP_BODY_BUFFERED, files_put },
	{ "/v1/files/raw", HTTP_GET, 0, HTTP_BODY_NONE, files_raw_get },
	{ "/v1/files/raw", HTTP_PUT, 0, HTTP_BODY_STREAMED, files_raw_put },
	{ "/v1/mkdir", HTTP_POST, 0, HTTP_BODY_BUFFERED, files_mkdir },
	{ "/v1/fs/list", HTTP_GET, 0, HTTP_BODY_NONE, fs_list },
	{ "/v1/fs/stat", HTTP_GET, 0, HTTP_BODY_NONE, fs_stat },
	{ "/v1/fs/remove", HTTP_POST, 0, HTTP_BODY_BUFFERED, fs_remove },
	{ "/v1/fs/rename", HTTP_POST, 0, HTTP_BODY_BUFFERED, fs_rename },
	{ "/v1/fs/tar", HTTP_GET, 0, HTTP_BODY_NONE, fs_tar_get },
	{ "/v1/fs/tar", HTTP_PUT, 0, HTTP_BODY_STREAMED, fs_tar_put },
	{ "/v1/fs/watch", HTTP_POST, 0, HTTP_BODY_BUFFERED, fs_watch },
	{ "/v1/preview", HTTP_POST, 0, HTTP_BODY_BUFFERED, preview_open },
};
#define NROUTES (sizeof routes / sizeof routes[0])

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
	char mine[16];
	int mine_len = snprintf(mine, sizeof mine, "%d", AGENT_PROTOCOL_VERSION);
	if (r == 0 && (n != (size_t)mine_len || memcmp(v, mine, n) != 0)) {
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
				"\"features\":[\"binaryFrames\",\"jobIdempotency\",\"keepalive\",\"outputCap\",\"rawFiles\","
				"\"fs\",\"fsTar\",\"fsWatch\",\"jobStdin\",\"jobPty\",\"jobSignal\","
				"\"jobStream\",\"jobList\"%s%s]}",
				AGENT_PROTOCOL_VERSION, agent.boot_id,
				agent.activated ? "ready" : "awaiting-network-verification",
				agent.cfg.capability ? ",\"capability\"" : "",
				confine_active() ? ",\"preview\"" : "") < 0) {
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
	const char *bearer = NULL;
	size_t bearer_len = 0;
	if (f && !http_bearer(f->value, f->value_len, &bearer, &bearer_len))
		bearer = NULL;
	if (agent.cfg.capability) {
		const struct http_field *t = http_field(head, CAPABILITY_HEADER, &token_count);
		char why[CAPABILITY_WHY_MAX];
		int status = capability_authorize(agent.cfg.capability, bearer, bearer_len, count,
						  t ? t->value : NULL, t ? t->value_len : 0,
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
	int ok = count == 1 && bearer != NULL && bearer_len == AGENT_TOKEN_CHARS &&
		 util_ct_equal(bearer, agent.cfg.token, AGENT_TOKEN_CHARS);
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

/* The HTTP layer's own refusals (http.h) in the protocol's codes, by status (docs/agent.md
 * lists them). */
static void refuse(struct http_request *req, int status, const char *why)
{
	const char *code;
	switch (status) {
	case 500: code = "AGENT_OPERATION_FAILED"; break;
	case 503: code = "AGENT_BUSY"; break;
	case 505: code = "PROTOCOL_VERSION_MISMATCH"; break;
	default: code = "REQUEST_INVALID"; break; /* 400, 413, 417, 431, 501: the request as sent */
	}
	reply_error(req, status, code, "%s", why);
}

int server_start(unsigned *port)
{
	struct http_config cfg = {
		.base = agent.base,
		.host = agent.cfg.listen_host,
		.port = agent.cfg.listen_port,
		.socket_path = agent.cfg.listen_socket,
		.max_connections = agent.cfg.max_connections,
		.fds_per_connection = FDS_PER_CONNECTION,
		.fds_reserved = FDS_RESERVED + AGENT_JOBS_MAX * FDS_PER_JOB,
		.header_timeout_ms = agent.cfg.header_timeout_ms,
		.body_timeout_ms = agent.cfg.body_timeout_ms,
		.stall_timeout_ms = agent.cfg.stall_timeout_ms,
		.body_max = AGENT_BODY_MAX,
		.busy_text = "AGENT_BUSY: every connection the agent allows is in use",
		.on_head = dispatch,
		.refuse = refuse,
	};
	return http_start(&cfg, port);
}

void server_stop(void)
{
	http_stop();
}
