/*
 * confine.h — --isolate bwrap: the session is a small computer of its own (docs/agent.md,
 * "Confinement").
 *
 * At start the agent has bubblewrap build one set of namespaces for the whole session — user,
 * mount, PID, network, IPC, UTS, and cgroup where the kernel has it — whose `/` is the agent's
 * root directory, with /usr and a few files of /etc read-only from the host, a private /tmp, a
 * minimal /dev and the session's own /proc. Process 1 in it is sandkit-init (src/init/init.c).
 * Every command then joins those namespaces with setns(2) through a pidfd of that init, becomes
 * the sandbox user (uid and gid 1000, mapped to one unprivileged host uid, never to root) and
 * drops every capability before it runs: commands pay a join, not a sandbox each, and share one
 * loopback, one /tmp and one process table for the session's life.
 *
 * The agent stays outside: in the host's PID namespace, so nothing inside can see, trace or
 * signal it, and in the host's network namespace, where it listens. Its later children are
 * created in the session's PID namespace (setns(CLONE_NEWPID) on the agent itself), and its file
 * routes resolve beneath /proc/<init>/root, so they see exactly the tree commands see, with the
 * sandbox user's rights.
 *
 * However the agent ends, the session ends with it: the init exits at the end of file of a pipe
 * only the agent holds, bubblewrap dies with its parent and takes the init along, and the end of
 * a PID namespace's init kills every process in it, whatever it did to leave its group.
 *
 * As root the agent needs --host-uid (or a root directory owned by the uid to use); as another
 * user it maps the sandbox user to itself, from a user namespace of its own (contain.h).
 */
#ifndef SANDKIT_AGENT_CONFINE_H
#define SANDKIT_AGENT_CONFINE_H

#include <stddef.h>
#include <sys/types.h>

/* The sandbox user: what `id`, $HOME and $USER say inside. 1000 is the first ordinary user on
 * Debian, which is what programs and images expect a non-root user to be. */
#define CONFINE_UID 1000
#define CONFINE_USER "user"
#define CONFINE_HOME "/home/user"
#define CONFINE_HOSTNAME "sandbox"
/* Where Debian's bubblewrap package puts it; a $PATH lookup would let $PATH pick the jail. */
#define CONFINE_BWRAP "/usr/bin/bwrap"
/* Where Debian's fuse-overlayfs package puts it: what lays an image where the kernel's overlayfs
 * is refused. */
#define CONFINE_FUSE_OVERLAYFS "/usr/bin/fuse-overlayfs"
/* The session's process 1, looked for next to the agent's own executable unless --init says. */
#define CONFINE_INIT_NAME "sandkit-init"

/*
 * Builds the session and moves the agent's later children into it; call before the agent
 * starts any other process. 0; or -1 with a sentence in why and the exit status the agent
 * should end with in *status (agent.h: a start-up failure, confinement the machine refuses, or
 * an outbound network it cannot give). Nothing is left running after a failure.
 */
int confine_start(char *why, size_t whysz, int *status);

/* After the event loop exists: if the session's init dies (which ends every command), the
 * agent stops rather than serve a session it no longer has. */
int confine_watch(void);

/* 1 when the session's init was killed while the agent served, which stopped the agent. */
int confine_lost(void);

/* Once the agent has written its ready line: from then on it touches the session's files as
 * the sandbox user's host uid, so the file routes obey the permissions commands obey. */
void confine_settle(void);

/* 1 when commands run in the session. */
int confine_active(void);

/* A sentence for the start-up log: how the session was built. */
const char *confine_description(void);

/* The directory a command starts in when its request names none: the sandbox user's home
 * (or /, should a command have removed it). An O_PATH descriptor the caller does not close. */
int confine_default_cwd(void);

/*
 * In a command's child, before it changes directory: joins the session's namespaces, becomes
 * the sandbox user, and gives up every capability and the means to regain one (no_new_privs).
 * 0, or -1 with errno.
 */
int confine_enter(void);

/* Host root's supplementary groups, which must not follow a process into the session: 0, or -1
 * with errno. */
int confine_drop_groups(void);

/* Gives up every capability, in every set, and the means to regain one (no_new_privs): for a
 * process of the agent's that will act inside the session. 0, or -1 with errno. */
int confine_drop_capabilities(void);

/* Shutdown: ends the session (every process in it) and waits for bubblewrap. */
void confine_stop(void);

#endif
