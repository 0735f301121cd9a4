/* A tight loop of 64-byte malloc + free (the worst case for an allocator
 * wrapper: the cheapest call there is). Prints ns per malloc + free pair.
 *   malloc_loop [pairs] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void *volatile sink; /* the block escapes: no malloc/free elision */

int main(int argc, char **argv)
{
	long pairs = argc > 1 ? atol(argv[1]) : 100000000;
	struct timespec a, b;
	for (long i = 0; i < pairs / 10; i++) { /* warm up */
		sink = malloc(64);
		free(sink);
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < pairs; i++) {
		sink = malloc(64);
		free(sink);
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
	printf("%.2f ns per malloc + free\n", ns / pairs);
	return 0;
}
