/*
 * replay.c — a fuzz target's LLVMFuzzerTestOneInput run over the files named, without libFuzzer
 * or clang. `make fuzz-seeds` (part of `make check`) builds every target with it and replays
 * the target's committed corpus: a target that no longer builds, or whose checks now reject an
 * input that once mattered, fails the check instead of waiting for the next `make fuzz`.
 */
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The largest input read: every target's -max_len is at most 64 KiB, and libFuzzer keeps no
 * corpus entry longer than that; a longer file is refused rather than cut. */
#define REPLAY_MAX_INPUT ((size_t)1 << 20)

int main(int argc, char **argv)
{
	static uint8_t input[REPLAY_MAX_INPUT + 1];
	for (int i = 1; i < argc; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (f == NULL) {
			perror(argv[i]);
			return 1;
		}
		size_t n = fread(input, 1, sizeof input, f);
		int failed = ferror(f);
		fclose(f);
		if (failed || n > REPLAY_MAX_INPUT) {
			fprintf(stderr, "%s: %s\n", argv[i], failed ? "cannot be read" : "longer than 1 MiB");
			return 1;
		}
		LLVMFuzzerTestOneInput(input, n);
	}
	return 0;
}
