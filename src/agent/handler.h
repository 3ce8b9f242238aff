/*
 * handler.h — what every route handler reads its request and answers with, over http.h: the
 * query's parameters, an exec or job body, and the protocol's answers (docs/protocol.md §1,
 * §3.6): errors as text/plain "CODE: message", JSON, an empty reply.
 */
#ifndef SANDKIT_AGENT_HANDLER_H
#define SANDKIT_AGENT_HANDLER_H

#include <stddef.h>

struct http_request;
struct evbuffer;
struct cmd_request;
struct sk_json;
struct sk_json_str;

/* "CODE: message" as text/plain (code NULL: the bare message), cut short far below the
 * client's bound on error bodies. */
void reply_error(struct http_request *req, int status, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Sends body (consumed) as application/json with the given status. */
void reply_json(struct http_request *req, int status, struct evbuffer *body);
void reply_empty(struct http_request *req, int status);
/* 500 AGENT_OPERATION_FAILED for an allocation that failed while answering. */
void reply_out_of_memory(struct http_request *req, const char *operation);
/* 400 PATH_REFUSED naming the caller's path, made printable and cut short (a caller's path
 * cannot forge lines or swell the answer). */
void reply_path_refused(struct http_request *req, const char *p, size_t len, const char *why);

/* Answers a file operation on the caller's path p that met err, as the one errno table says
 * (fserror.h): met while reading (writing = 0) or while creating and writing. A 500 names the
 * operation and the system's sentence. */
void reply_fs_errno(struct http_request *req, int err, const char *p, size_t len,
		    const char *operation, int writing);

/* Longest caller path shown back in an error: the answer stays far below the client's
 * 4096-byte error-body bound. */
#define REPLY_SHOWN_PATH_MAX 200

/* The value of query parameter name, percent-decoded ('+' a space), in *value (heap, NUL
 * after *len bytes; *len tells an embedded NUL apart). 0; -1 absent; -2 a bad escape; -3 no
 * memory. */
int request_param(struct http_request *req, const char *name, char **value, size_t *len);

/*
 * Reads req's buffered body as one JSON object (the file and job routes' bodies). member runs
 * for each member with its name, reads or skips its value, and returns NULL or what is wrong
 * with it; the first problem found is the one answered, once the whole body was read. Returns
 * 0, or -1 once it has answered: 500 without memory, 400 REQUEST_INVALID for a body that is
 * not a JSON object, is not valid JSON, or has a problem.
 */
int read_json_body(struct http_request *req, const char *operation,
		   const char *(*member)(void *ctx, struct sk_json *j, const struct sk_json_str *key),
		   void *ctx);

/* The query's `path` (heap, NUL after *len bytes); answers 400 or 500 and returns NULL when it
 * is missing, badly escaped, or memory ran out. */
char *request_path(struct http_request *req, size_t *len);

/* Reads req's body as an exec or job request (request.h). Returns what cmd_request_parse
 * returns, or -2 once it has answered 500 itself because memory ran out; except after -2, the
 * caller frees r with cmd_request_free. */
int read_cmd_request(struct http_request *req, struct cmd_request *r, const char *operation);

#endif
