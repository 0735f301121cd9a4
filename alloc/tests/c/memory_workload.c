/* The memory profile workload, run under the LD_PRELOAD library (or
 * without it: then it fires no probe). Waits for a line on stdin, then:
 * thread "big" runs big_alloc, which allocates and frees 768 MiB in varied
 * sizes (16 B .. 1 MiB), thread "small" small_alloc, 256 MiB (3:1);
 * leaky keeps 64 MiB live (blocks of 4 KiB .. 256 KiB); with -DWITH_SPANS
 * (and symtrace-context's static library) span_alloc allocates and frees
 * 128 MiB inside span A, published through the C ABI. Each churn paces
 * itself (a short sleep every 8 MiB) so the profiler's ring buffer is
 * never flooded. Prints what it did:
 *   big BYTES / small BYTES / leaky BYTES / span A TRACE_ID SPAN_ID BYTES
 *   ready
 * and then sleeps LINGER seconds (argv[1], default 3) with the leaked
 * blocks live, so their in-use snapshot is taken, and exits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef WITH_SPANS
#include "symtrace_ctx.h"
#endif

static void *volatile sink;

static uint64_t next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void pause_briefly(void)
{
	struct timespec ts = {0, 2 * 1000 * 1000};
	nanosleep(&ts, NULL);
}

static uint64_t churn(uint64_t total, uint64_t seed)
{
	uint64_t done = 0, x = seed, paced = 0;
	while (done < total) {
		size_t size = (size_t)16 << (next(&x) % 17); /* 16 B .. 1 MiB */
		char *p = malloc(size);
		if (!p)
			abort();
		p[0] = 1;
		sink = p; /* (shared by the threads: free p, not sink) */
		free(p);
		done += size;
		if (done - paced >= (8u << 20)) {
			paced = done;
			pause_briefly();
		}
	}
	return done;
}

__attribute__((noinline)) static uint64_t big_alloc(void) { return churn(768ull << 20, 11); }
__attribute__((noinline)) static uint64_t small_alloc(void) { return churn(256ull << 20, 23); }
__attribute__((noinline)) static uint64_t span_alloc(void) { return churn(128ull << 20, 31); }

/* Keeps `total` bytes live, in blocks of 4 KiB .. 256 KiB. */
__attribute__((noinline)) static uint64_t leaky(uint64_t total)
{
	uint64_t done = 0, x = 47;
	while (done < total) {
		size_t size = (size_t)4096 << (next(&x) % 7);
		if (size > total - done)
			size = total - done;
		char *p = malloc(size);
		if (!p)
			abort();
		memset(p, 1, size); /* really live */
		sink = p;
		done += size;
	}
	return done;
}

static void *run(void *arg)
{
	int big = arg != NULL;
	pthread_setname_np(pthread_self(), big ? "big" : "small");
	uint64_t bytes = big ? big_alloc() : small_alloc();
	printf("%s %llu\n", big ? "big" : "small", (unsigned long long)bytes);
	return NULL;
}

int main(int argc, char **argv)
{
	int linger = argc > 1 ? atoi(argv[1]) : 3;
	char line[16];
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	pthread_t a, b;
	pthread_create(&a, NULL, run, (void *)1);
	pthread_create(&b, NULL, run, NULL);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	printf("leaky %llu\n", (unsigned long long)leaky(64ull << 20));
#ifdef WITH_SPANS
	uint8_t trace_id[16], span_id[8];
	FILE *r = fopen("/dev/urandom", "r");
	if (!r || fread(trace_id, 1, 16, r) != 16 || fread(span_id, 1, 8, r) != 8)
		return 1;
	fclose(r);
	symtrace_ctx_ids prev = symtrace_ctx_enter(trace_id, span_id, 1);
	uint64_t in_span = span_alloc();
	symtrace_ctx_exit(&prev);
	printf("span A ");
	for (int i = 0; i < 16; i++)
		printf("%02x", trace_id[i]);
	printf(" ");
	for (int i = 0; i < 8; i++)
		printf("%02x", span_id[i]);
	printf(" %llu\n", (unsigned long long)in_span);
#endif
	printf("ready\n");
	sleep(linger);
	return 0;
}
