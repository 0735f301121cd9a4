/* Two threads allocate and free in varied sizes (16 B .. 1 MiB): "big"
 * 768 MiB in all, "small" 256 MiB (3:1). Prints each one's bytes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where each block escapes to, so the compiler cannot pair and remove a
 * malloc and its free. */
static void *volatile sink;

static uint64_t next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static uint64_t churn(uint64_t total, uint64_t seed)
{
	uint64_t done = 0, x = seed;
	while (done < total) {
		size_t size = (size_t)16 << (next(&x) % 17); /* 16 B .. 1 MiB */
		char *p = malloc(size);
		if (!p)
			abort();
		p[0] = 1; /* touch it (not all of it: this is about sizes) */
		sink = p; /* (shared by the threads: free p, not sink) */
		free(p);
		done += size;
	}
	return done;
}

__attribute__((noinline)) static uint64_t big_alloc(void) { return churn(768ull << 20, 11); }
__attribute__((noinline)) static uint64_t small_alloc(void) { return churn(256ull << 20, 23); }

static void *run(void *arg)
{
	int big = arg != NULL;
	pthread_setname_np(pthread_self(), big ? "big" : "small");
	uint64_t bytes = big ? big_alloc() : small_alloc();
	printf("%s %llu\n", big ? "big" : "small", (unsigned long long)bytes);
	return NULL;
}

int main(void)
{
	pthread_t a, b;
	pthread_create(&a, NULL, run, (void *)1);
	pthread_create(&b, NULL, run, NULL);
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	return 0;
}
