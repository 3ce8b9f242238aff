/*
 * isolate.h — --isolate bwrap: every command runs under bubblewrap with the host filesystem
 * read-only, only the sandbox root writable (bound at its own path), a private /tmp and /dev,
 * the --hide directories empty, no network, and a pid namespace whose init dies with the agent's
 * child, so killing the command's process group ends everything inside — a descendant that
 * calls setsid included.
 */
#ifndef SANDKIT_AGENT_ISOLATE_H
#define SANDKIT_AGENT_ISOLATE_H

#include <stddef.h>

/* Debian's bubblewrap package installs it here; a PATH lookup would let $PATH pick the jail. */
#define ISOLATE_BWRAP "/usr/bin/bwrap"
/* --hide directories: a state folder or two; each adds two words to every command's bwrap argv. */
#define ISOLATE_HIDE_MAX 16

/*
 * --hide DIR: inside the sandbox DIR is an empty directory (a tmpfs over it), the root excepted.
 * This is how a state folder that holds other sessions, tokens and records (the local provider's)
 * stays out of reach. Call after the root is configured; 0, or -1 with a sentence in why.
 */
int isolate_hide(const char *dir, char *why, size_t whysz);
void isolate_free(void);

/*
 * Runs /bin/true under the same bwrap options, once, at start. 0 when it worked; -1 with a
 * sentence in why (whysz bytes) when bwrap is missing or cannot create its namespaces here.
 */
int isolate_probe(char *why, size_t whysz);

/* The argv that runs argv under bwrap starting in cwd_path (heap vector of borrowed strings;
 * free() the vector only). NULL when memory ran out. */
char **isolate_argv(char *const *argv, const char *cwd_path);

/*
 * execvp's lookup of prog with the command's own PATH, relative names against cwd_fd.
 * bwrap reports a missing program only as exit status 1, so the agent looks first to answer
 * spawnFailed as it does without isolation. 0 when found, else an errno value.
 */
int isolate_find_program(const char *prog, char *const *envp, int cwd_fd);

#endif
