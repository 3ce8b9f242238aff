/*
 * reaper.h — the loop of a process 1: it reaps every child the kernel hands it until a
 * lifeline descriptor says its holder is gone. Plain C: sandkit-init (process 1 of a confined
 * session, linked statically) and the agent's keeper (process 1 of its own PID namespace when
 * it contains commands without confinement) both run it.
 */
#ifndef SANDKIT_REAPER_H
#define SANDKIT_REAPER_H

/*
 * Reaps children until lifeline_fd is readable (its end of file: the other end is never
 * written) or cannot be waited on, then returns. SIGCHLD stays blocked but inside the wait, so
 * no exit slips between a round of reaping and the next wait, and none is left a zombie.
 */
void sk_reap_until(int lifeline_fd);

#endif
