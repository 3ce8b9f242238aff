/*
 * server.h — the protocol over http.h: routing (docs/protocol.md §3), authorization (§2) before
 * any body is read, activation (§3.2), and the protocol's words for the HTTP layer's own
 * refusals (§1, §3.6). Handlers answer through handler.h.
 */
#ifndef SANDKIT_AGENT_SERVER_H
#define SANDKIT_AGENT_SERVER_H

/* Starts the HTTP server on --listen; *port receives the port actually bound. */
int server_start(unsigned *port);
void server_stop(void);

#endif
