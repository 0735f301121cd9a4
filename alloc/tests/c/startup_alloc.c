/* Allocations at start-up (issue #38): from the first lines of main,
 * hold_at_start keeps 64 blocks of 1 MiB live (a service's caches, pools
 * and tables), then churn allocates and frees 64 MiB in small blocks.
 * Prints "held BYTES" and "ready", then sleeps LINGER seconds (argv[1],
 * default 3) with the blocks live, so in-use snapshots are taken, and
 * exits. With "churn-first" as argv[2], churn runs before hold_at_start:
 * thousands of small records just before the large ones, on one CPU.
 * Run under the LD_PRELOAD library. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCKS 64
#define BLOCK (1u << 20)

static void *volatile sink;

__attribute__((noinline)) size_t hold_at_start(void **kept)
{
	size_t held = 0;
	for (int i = 0; i < BLOCKS; i++) {
		kept[i] = malloc(BLOCK);
		if (!kept[i])
			abort();
		memset(kept[i], 1, 64);
		held += BLOCK;
	}
	return held;
}

__attribute__((noinline)) void churn(void)
{
	for (unsigned i = 0; i < (64u << 20) / 4096; i++) {
		sink = malloc(4096);
		free(sink);
	}
}

int main(int argc, char **argv)
{
	static void *kept[BLOCKS];
	int churn_first = argc > 2 && strcmp(argv[2], "churn-first") == 0;
	if (churn_first)
		churn();
	size_t held = hold_at_start(kept);
	if (!churn_first)
		churn();
	printf("held %zu\nready\n", held);
	fflush(stdout);
	sleep(argc > 1 ? (unsigned)atoi(argv[1]) : 3);
	sink = kept;
	return 0;
}
