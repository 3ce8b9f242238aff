/*
 * paths_fuzz.c — libFuzzer target for sandkit-agent's path normalizer (src/agent/paths.c), the
 * lexical half of confining a caller's path to the root: every file route and every cwd goes
 * through it before the kernel's openat2 does the rest.
 *
 *   make fuzz FUZZ_TARGETS=paths
 * sources: src/agent/paths.c src/agent/fserror.c src/common/beneath.c
 * options: -max_len=8192
 *
 * The whole input is one caller path (NUL bytes included, as a JSON string can carry them).
 * Checked on top of the sanitizers, for every input:
 *   - a path with a NUL, a ".." component, or nothing in it is refused;
 *   - an accepted path comes out as its own non-empty, non-"." components in order, joined by
 *     single slashes, NUL-terminated within PATHS_MAX ("." for the root itself) — so it can
 *     neither climb nor name anything the input did not;
 *   - normalizing the result again gives the result.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/agent.h"
#include "agent/paths.h"

/* paths.c resolves beneath agent.cfg.root_fd; the normalizer never touches it. */
struct agent agent;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The next component of p[0..len) at or after *i: its start and length, 0 at the end. */
static size_t next_component(const char *p, size_t len, size_t *i, size_t *start)
{
	for (;;) {
		while (*i < len && p[*i] == '/')
			(*i)++;
		*start = *i;
		while (*i < len && p[*i] != '/')
			(*i)++;
		size_t n = *i - *start;
		if (n == 1 && p[*start] == '.')
			continue;
		return n;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *in = (const char *)data;
	char out[PATHS_MAX];
	memset(out, 'X', sizeof out); /* anything the normalizer did not write is visible */
	const char *why = paths_normalize(in, size, out);

	int has_nul = size > 0 && memchr(in, '\0', size) != NULL;
	int climbs = 0, components = 0;
	size_t i = 0, start, n;
	while ((n = next_component(in, size, &i, &start)) > 0) {
		components++;
		if (n == 2 && in[start] == '.' && in[start + 1] == '.')
			climbs = 1;
	}
	if (why != NULL) {
		/* A refusal always says why. */
		if (why[0] == '\0')
			abort();
		return 0;
	}
	if (size == 0 || has_nul || climbs)
		abort();

	size_t olen = strnlen(out, sizeof out);
	if (olen == sizeof out)
		abort(); /* not terminated within PATHS_MAX */
	if (components == 0) {
		if (strcmp(out, ".") != 0)
			abort();
	} else {
		/* Component by component, the output is the input without its empty and "." parts. */
		size_t o = 0;
		i = 0;
		while ((n = next_component(in, size, &i, &start)) > 0) {
			if (o > 0 && out[o++] != '/')
				abort();
			if (o + n > olen || memcmp(out + o, in + start, n) != 0)
				abort();
			o += n;
		}
		if (o != olen)
			abort();
	}

	char again[PATHS_MAX];
	if (paths_normalize(out, olen, again) != NULL || strcmp(again, out) != 0)
		abort();
	return 0;
}
