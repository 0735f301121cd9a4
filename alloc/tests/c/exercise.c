/* Every function the preload library interposes, from 4 threads: contents
 * survive realloc, calloc zeroes, alignments hold, malloc_usable_size
 * covers the request; and how many blocks carry the sampled header (the
 * tag MAGIC ^ ptr before the pointer, as alloc/src/header.rs lays it out).
 * Prints "blocks N sampled M"; exits 1 on the first wrong answer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC 0x5a3da11c0ffee5a5ull
#define SLOTS 64

static unsigned long blocks, sampled;

/* What a result is stored to, so the compiler cannot fold an allocation
 * whose result is only compared with NULL. */
static void *volatile sink;

static void fail(const char *what, size_t size, size_t align)
{
	fprintf(stderr, "exercise: %s (size %zu, align %zu)\n", what, size, align);
	exit(1);
}

static int tagged(void *p)
{
	uintptr_t a = (uintptr_t)p;
	if ((a & 4095) < 8)
		return 0;
	return *(volatile uint64_t *)(a - 8) == (MAGIC ^ a);
}

struct slot {
	unsigned char *p;
	size_t size;
	unsigned char fill;
};

static void take(struct slot *s, void *p, size_t size, size_t align, unsigned char fill)
{
	if (!p)
		fail("no memory", size, align);
	if ((uintptr_t)p % align)
		fail("misaligned", size, align);
	if (malloc_usable_size(p) < size)
		fail("usable size below the request", size, align);
	__atomic_fetch_add(&blocks, 1, __ATOMIC_RELAXED);
	if (tagged(p))
		__atomic_fetch_add(&sampled, 1, __ATOMIC_RELAXED);
	memset(p, fill, size);
	s->p = p;
	s->size = size;
	s->fill = fill;
}

static void verify(const struct slot *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s->p[i] != s->fill)
			fail("contents changed", s->size, 0);
}

static uint64_t next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

static void *worker(void *arg)
{
	uint64_t x = (uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
	struct slot slots[SLOTS] = {0};
	for (int i = 0; i < 20000; i++) {
		struct slot *s = &slots[next(&x) % SLOTS];
		size_t size = (size_t)1 << (next(&x) % 17); /* 1 B .. 64 KiB */
		size += next(&x) % size;
		if (next(&x) % 500 == 0)
			size = 1 << 20;
		unsigned char fill = (unsigned char)next(&x);
		size_t align = (size_t)32 << (next(&x) % 8); /* 32 .. 4096 */
		if (s->p && next(&x) % 3 == 0) {
			verify(s, s->size);
			int array = next(&x) % 2;
			unsigned char *q = array ? reallocarray(s->p, size, 1) : realloc(s->p, size);
			struct slot old = *s;
			old.p = q;
			if (!q)
				fail(array ? "reallocarray" : "realloc", size, 1);
			verify(&old, old.size < size ? old.size : size);
			take(s, q, size, 16, fill);
			continue;
		}
		if (s->p) {
			verify(s, s->size);
			free(s->p);
			s->p = NULL;
		}
		void *p = NULL;
		switch (next(&x) % 6) {
		case 0:
			take(s, malloc(size), size, 16, fill);
			break;
		case 1:
			p = calloc(size, 1);
			for (size_t j = 0; p && j < size; j++)
				if (((unsigned char *)p)[j])
					fail("calloc not zeroed", size, 16);
			take(s, p, size, 16, fill);
			break;
		case 2:
			if (posix_memalign(&p, align, size))
				fail("posix_memalign", size, align);
			take(s, p, size, align, fill);
			break;
		case 3:
			take(s, aligned_alloc(align, size), size, align, fill);
			break;
		case 4:
			take(s, memalign(align, size), size, align, fill);
			break;
		default:
			take(s, malloc(size), size, 16, fill);
			if (!(p = realloc(NULL, 8)))
				fail("realloc(NULL)", 8, 16);
			if (realloc(p, 0) != NULL)
				fail("realloc(p, 0) kept a block", 0, 16);
			break;
		}
	}
	for (int i = 0; i < SLOTS; i++)
		if (slots[i].p) {
			verify(&slots[i], slots[i].size);
			free(slots[i].p);
		}
	/* The error paths: overflow and bad alignments. */
	volatile size_t huge = SIZE_MAX / 2; /* opaque: not folded away */
	sink = calloc(huge, 4); /* (clang assumes calloc leaves errno alone) */
	if (sink)
		fail("calloc overflow", 0, 0);
	sink = reallocarray(NULL, huge, 4);
	if (sink)
		fail("reallocarray overflow", 0, 0);
	void *p;
	/* Huge requests fail at once (a sample point per 512 KiB of them is
	 * counted at once, not drawn one by one). */
	volatile size_t big = (size_t)1 << 60;
	if ((sink = malloc(big)) || (sink = calloc(1, big)) || (sink = malloc(SIZE_MAX - 4096)))
		fail("a huge request", big, 16);
	if ((sink = memalign(64, big)))
		fail("a huge aligned request", big, 64);
	volatile size_t odd = 24;
	if (posix_memalign(&p, odd, 8) != EINVAL)
		fail("posix_memalign(24)", 8, 24);
	free(NULL);
	return NULL;
}

/* A program may allocate between a failed dlopen and its dlerror(): the
 * message must survive (the library once looked a symbol up with dlsym
 * inside realloc, which reset it). */
static void dlerror_survives_allocations(void)
{
	if (dlopen("/nonexistent/symtrace-test.so", RTLD_LAZY))
		fail("dlopen of a missing file", 0, 0);
	void *p = NULL;
	for (size_t size = 16; size < (1 << 20); size += size / 2 + 16) {
		void *q = malloc(size / 2 + 1);
		p = realloc(p, size);
		free(q);
		if (!p)
			fail("realloc", size, 16);
	}
	free(p);
	const char *message = dlerror();
	if (!message || !strstr(message, "symtrace-test"))
		fail("dlerror lost its message", 0, 0);
}

int main(void)
{
	dlerror_survives_allocations();
	pthread_t t[4];
	for (uintptr_t i = 0; i < 4; i++)
		pthread_create(&t[i], NULL, worker, (void *)(i + 1));
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	printf("blocks %lu sampled %lu\n", blocks, sampled);
	return 0;
}
