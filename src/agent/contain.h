/*
 * contain.h — no command outlives the agent, however the agent ends (docs/agent.md
 * "Containment").
 *
 * A command's process group dies at its deadline, on cancel, on disconnect and at shutdown,
 * and its leader has a parent-death signal; but a descendant the leader forked has neither,
 * and an agent killed with SIGKILL kills nothing. So at start the agent puts every process it
 * will start into a PID namespace of their own, whose init is the keeper: a small process forked
 * from the agent that only reaps orphans and dies with the agent (a parent-death signal, and a
 * pipe from the agent whose end it watches). When the init of a PID namespace dies, the kernel
 * kills every process in it — a descendant that called setsid included, and nothing inside can
 * leave the namespace or signal its init. Each command also gets a mount namespace whose /proc
 * shows that PID namespace, so that its pids and /proc agree.
 *
 * The namespace needs CAP_SYS_ADMIN: as root the agent has it; otherwise it makes a user
 * namespace first that maps only its own user and group (so commands run as the same user, and
 * setuid programs no longer raise privileges). Both arrangements are tried in a throwaway process
 * first, since neither can be undone. Where neither works (a container that forbids unshare or
 * a /proc of its own) the agent runs its commands uncontained and says so at start.
 */
#ifndef SANDKIT_AGENT_CONTAIN_H
#define SANDKIT_AGENT_CONTAIN_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Before any other process is started: moves the agent's future children into a fresh PID
 * namespace and starts its keeper. 0 when commands are contained; -1 with a sentence in why
 * when they cannot be (the agent then runs them uncontained).
 */
int contain_start(char *why, size_t whysz);

/* After the event loop exists: watches the keeper, so that if something kills it (which kills
 * every command with it) the agent stops rather than run commands it could no longer contain. */
int contain_watch(void);

/* 1 when the keeper was killed while the agent served, which stopped the agent. */
int contain_lost(void);

/* How a contained agent placed its children: a sentence for the start-up log. */
const char *contain_description(void);

/* 1 when commands are started inside the namespace. */
int contain_active(void);

/*
 * In a command's child, once it is in its working directory: a mount namespace of its own with a
 * /proc that shows the PID namespace it is in, so that its pids and /proc agree ($$ names
 * /proc/$$). 0 or -1 with errno.
 */
int contain_enter_mounts(void);

/* Enters a user namespace that maps only the agent's own user and group onto themselves, which
 * gives an unprivileged agent the capabilities of namespaces (commands keep its identity). It
 * cannot be left again. 0, or -1 with errno. */
int contain_enter_user_namespace(void);

/* What a freshly started child sees as its parent's pid: 0 inside the namespace (the agent is
 * outside it), else the agent's own. */
pid_t contain_parent_pid(void);

/* Shutdown: kills the keeper, so the kernel kills whatever commands left behind; waits for it. */
void contain_stop(void);

#endif
