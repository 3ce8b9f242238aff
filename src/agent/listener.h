/*
 * listener.h — the HTTP server's listening socket (http.h): binding, accept() in batches with
 * a back-off when the process runs out of descriptors or memory, and the connection cap, sized
 * to the descriptor limit and held at accept time by evicting the connection that has waited
 * longest with no request in progress, or else by answering the newcomer 503 and closing it
 * once it has had a moment (bounded) to read the answer.
 *
 * The connections themselves are http.c's: it opens one for each socket accepted here, enters
 * it in the listener's set and takes it out when it ends. Only http.c uses this header.
 */
#ifndef SANDKIT_AGENT_LISTENER_H
#define SANDKIT_AGENT_LISTENER_H

#include <stdint.h>

struct conn;
struct http_config;

/* A connection's place in the set the cap counts; http.c's struct conn holds one. */
struct listener_entry {
	struct listener_entry *prev, *next;
	struct conn *conn;
};

/* Binds cfg->host:cfg->port and starts accepting; *port receives the port bound. -1 with
 * errno (EINVAL: cfg->busy_text does not fit the 503 the listener keeps ready). */
int listener_start(const struct http_config *cfg, unsigned *port);
/* Stops accepting and closes the socket; the connections are http_stop's to close. */
void listener_stop(void);
void listener_add(struct listener_entry *e);
void listener_remove(struct listener_entry *e);
/* A connection of the set, NULL once it is empty: http_stop closes them one at a time. */
struct conn *listener_any(void);

/* What the listener asks of http.c. */
/* Serves an accepted socket (non-blocking, close-on-exec); closes it when that fails. */
void conn_open(int fd);
/* Ends a connection (http.c's conn_close: an unfinished request hears of it first). */
void conn_close(struct conn *c);
/* 1, with *since_ms, when the connection waits with no request in progress (idle, a head
 * arriving, or lingering after its last reply): the kind the cap may evict. */
int conn_evictable(const struct conn *c, uint64_t *since_ms);
/* The reason phrase of a status, for every status line the server writes. */
const char *http_reason(int status);

#endif
