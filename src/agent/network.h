/*
 * network.h — a confined session's network (docs/agent.md, "Network").
 *
 * --network none: the session has a loopback of its own and nothing else.
 * --network outbound: a user-mode network stack attached to the session's network namespace —
 * pasta (Debian's passt) where installed, else slirp4netns — makes its connections out through
 * the host's own sockets, with no port forwarded in either direction and the host's loopback out
 * of reach (an agent's port, another session's preview). Each runs as the sandbox user's host
 * uid, in the host's PID namespace, and dies with the agent.
 *
 * Either way one helper process sits in the session's network namespace and makes sockets there
 * for the agent, handed over a socket pair: a socket remembers the namespace it was made in, so
 * the agent, which never leaves the host's, connects it to the session's own loopback
 * (preview.h). The same helper serves a root agent and one that cannot come back to the host's
 * namespace once it left it.
 */
#ifndef SANDKIT_AGENT_NETWORK_H
#define SANDKIT_AGENT_NETWORK_H

#include <stddef.h>
#include <sys/types.h>

/* Where Debian's passt and slirp4netns packages put them (see CONFINE_BWRAP for why a path). */
#define NETWORK_PASTA "/usr/bin/pasta"
#define NETWORK_SLIRP4NETNS "/usr/bin/slirp4netns"

struct network_setup {
	int netns_fd;       /* the session's network namespace */
	uid_t uid;          /* the host uid the sandbox user is: the helpers run as it */
	int as_root;        /* the agent is host root: the helpers become uid */
};

/*
 * Starts the helper, as soon as the namespace exists. Call before the agent joins the session's
 * PID namespace, as network_start_stack. 0, or -1 with a sentence in why.
 */
int network_start_helper(const struct network_setup *s, char *why, size_t whysz);

/*
 * For --network outbound (nothing otherwise): starts the stack once the session is built, and
 * waits until it says the namespace is configured. 0, or -1 with a sentence in why and the
 * agent's exit status in *status; the stack is not left running then.
 */
int network_start_stack(const struct network_setup *s, char *why, size_t whysz, int *status);

/* A new non-blocking TCP socket in the session's network namespace, or -1 with errno. Waits for
 * the helper, which answers at once, at most NETWORK_HELPER_MS. */
int network_socket(void);

/* Ends the helper and the stack and waits for them. */
void network_stop(void);

#endif
