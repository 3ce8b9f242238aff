/*
 * limits.h — --memory, --pids, --cpus: what a session's commands may use together, enforced by
 * a control group of the session's own (docs/agent.md, "Limits").
 *
 * Per controller the agent takes cgroup v2 where its own group delegates that controller to
 * children (cgroup.subtree_control lists it), and otherwise a cgroup v1 hierarchy that has it
 * and that the agent may write (as root). It makes one group `sandkit-<agent pid>` beneath its
 * own in each, writes the bound there, and every command joins those groups before it becomes
 * the command (what it forks stays in them). The agent, bubblewrap and the session's init stay
 * outside: a command that takes every process or page the bound allows cannot stop the agent
 * from answering, nor kill the init (which would end the session).
 *
 * A limit the machine cannot enforce is a start that fails (AGENT_EXIT_NO_LIMITS), never a
 * limit accepted and ignored.
 */
#ifndef SANDKIT_AGENT_LIMITS_H
#define SANDKIT_AGENT_LIMITS_H

#include <stddef.h>
#include <stdint.h>

/* The smallest bounds under which a shell still starts and runs a command: below them every
 * command would fail in ways that say nothing of the limit. */
#define LIMITS_MEMORY_MIN ((uint64_t)8 << 20)
#define LIMITS_PIDS_MIN 8
/* Hundredths of a core: the kernel's quota takes 1 ms in each 100 ms period at least. */
#define LIMITS_CPU_MIN_CENTI 1
/* The largest bounds taken: far beyond any machine, below what the kernel's files overflow on. */
#define LIMITS_MEMORY_MAX ((uint64_t)1 << 50)
#define LIMITS_PIDS_MAX 4194304      /* the kernel's own pid_max ceiling */
#define LIMITS_CPU_MAX_CENTI 102400  /* 1024 cores */

/* What was asked; 0: no bound on that resource. */
struct limits_request {
	uint64_t memory;     /* bytes */
	uint64_t pids;       /* processes and threads */
	uint64_t cpu_centi;  /* hundredths of a core */
};

/* Makes the session's groups and writes the bounds; does nothing when nothing is asked. 0, or
 * -1 with a sentence in why and nothing left behind. */
int limits_start(const struct limits_request *r, char *why, size_t whysz);

/* In a new command's process, before it changes credentials: joins the session's groups. 0 or
 * -1 (errno set). Async-signal-safe: a write per group. */
int limits_join(void);

/* How many processes the memory bound has killed so far (0 without one): a command that died of
 * SIGKILL while this grew was killed by it. */
uint64_t limits_oom_kills(void);

/* The memory bound in bytes, 0 when none. */
uint64_t limits_memory(void);

/* Removes the groups once no process is left in them; call after the commands were killed. */
void limits_stop(void);

/* Which resources this machine lets the agent bound, as words ("memory pids cpu disk"), for
 * --probe-limits: "" when none. Tried by making and removing a group in each; disk when the
 * agent may attach loop devices (--disk). */
const char *limits_probe(void);

#endif
