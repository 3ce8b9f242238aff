/*
 * server.h — the HTTP side: evhttp setup, routing (PROTOCOL.md §3), bearer authorization
 * (§2), activation (§3.2) and the text/plain error answers every route shares (§1, §3.6).
 */
#ifndef SANDKIT_AGENT_SERVER_H
#define SANDKIT_AGENT_SERVER_H

#include <stddef.h>

struct evhttp_request;
struct evbuffer;

/* Idle bound for reading a request and writing a plain answer, so a stalled or abandoned
 * connection cannot hold its buffers for ever. Streaming answers lift it (a slow reader is
 * the normal shape of backpressure) and restore it when they end. */
#define SERVER_IO_TIMEOUT_S 60

/* Creates the evhttp server and binds --listen; *port receives the port actually bound. */
int server_start(unsigned *port);
void server_stop(void);

/* "CODE: message" as text/plain (code NULL: the bare message). */
void reply_error(struct evhttp_request *req, int status, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Sends body (consumed) as application/json with the given status. */
void reply_json(struct evhttp_request *req, int status, struct evbuffer *body);
void reply_empty(struct evhttp_request *req, int status);
/* 500 AGENT_OPERATION_FAILED for an allocation that failed while answering. */
void reply_out_of_memory(struct evhttp_request *req, const char *operation);

/* The request body as one contiguous span; NULL only when memory ran out. */
const char *request_body(struct evhttp_request *req, size_t *len);

#endif
