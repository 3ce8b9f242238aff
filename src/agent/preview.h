/*
 * preview.h — POST /v1/preview (docs/protocol.md §6 preview): a port a confined session's command
 * listens on, reached from the host.
 *
 * The session's loopback is its own (network.h), so a server a command starts on 127.0.0.1:8080
 * is out of the host's reach. For each port asked, the agent listens on the host's 127.0.0.1 at a
 * port the kernel picks and splices every connection it accepts to 127.0.0.1:<port> inside the
 * session, through a socket made there. Asking again for a port answers the same endpoint; it
 * lasts as long as the agent.
 *
 * Bounds: PREVIEW_PORTS_MAX ports; PREVIEW_CONNECTIONS_MAX connections at once across them (one
 * more is closed as soon as it is accepted); PREVIEW_BUFFER bytes waiting per direction of a
 * connection, past which the agent stops reading the side that sends until the other side took
 * them. The endpoint asks for no credential: anything on this machine can reach it, as anything
 * could reach the port of an unconfined session.
 */
#ifndef SANDKIT_AGENT_PREVIEW_H
#define SANDKIT_AGENT_PREVIEW_H

/* Ports one session may preview: a few servers' worth; each costs a listening socket. */
#define PREVIEW_PORTS_MAX 16
/* Connections spliced at once: a browser opens six per host; each costs two descriptors and at
 * most twice PREVIEW_BUFFER of memory. */
#define PREVIEW_CONNECTIONS_MAX 64
/* Bytes waiting to be written, per direction of a connection. */
#define PREVIEW_BUFFER (64 * 1024)

struct http_request;

/* {"port": N} -> 200 {"port": N, "endpoint": "http://127.0.0.1:P"}. */
void preview_open(struct http_request *req);

/* Shutdown: closes every listener and connection. */
void preview_close_all(void);

#endif
