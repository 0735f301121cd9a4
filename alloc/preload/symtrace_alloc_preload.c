/* symtrace-alloc's LD_PRELOAD library: memory allocation profiling for C
 * and C++ programs that cannot be rebuilt, the OpenTelemetry way
 * (design-docs/00003-memory-profiling of the OpenTelemetry eBPF profiler).
 *
 *   LD_PRELOAD=/path/to/libsymtrace_alloc_preload.so ./service
 *
 * It interposes glibc's malloc, calloc, realloc, reallocarray, free,
 * posix_memalign, aligned_alloc, memalign and malloc_usable_size. Each
 * thread counts down the bytes to its next sample point, drawn from an
 * exponential distribution with mean OTEL_MEMORY_SAMPLING_INTERVAL bytes
 * (default 524288; 0 turns sampling off): a Poisson process over allocated
 * bytes. A sampled allocation fires the USDT probe
 * otel_memory:alloc(ptr, size, weight), weight = sample points crossed ×
 * interval, and carries a 16-byte header before its pointer (the distance
 * back to glibc's block and its size, then a tag: MAGIC ^ ptr) by which
 * free recognises it and fires otel_memory:free(ptr). Everything else goes
 * straight to glibc (__libc_malloc & co.): the unsampled path is a
 * thread-local subtraction and branch, and on free one 8-byte load of
 * glibc's own chunk header.
 *
 * The same scheme as the Rust SampledAllocator (alloc/src/sampler.rs,
 * alloc/src/header.rs; keep them in step). Page-aligned requests
 * (alignment >= 4096) and valloc/pvalloc take no header: a sampled one is
 * reported allocated and freed at once (allocated bytes, never in use).
 *
 * Build: make -C alloc/preload (needs <sys/sdt.h>: Debian's
 * systemtap-sdt-dev). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)

#define DEFAULT_INTERVAL (512u * 1024u)
#define MAGIC 0x5a3da11c0ffee5a5ull
#define HEADER 16u
#define PAGE 4096u
#define MAX_DRAW ((double)(1ull << 62))
#define BULK 64 /* intervals past the first point counted at once */

struct countdown {
	int64_t left; /* bytes to the next sample point; 0: not seeded */
	uint64_t rng; /* xorshift64* state; 0: not seeded */
};

/* initial-exec: a fixed offset from %fs, never __tls_get_addr (which may
 * call malloc) — the library is preloaded, so its TLS is in the static
 * block. */
static __thread struct countdown cd __attribute__((tls_model("initial-exec")));

static uint64_t interval_bytes; /* 0: not read; UINT64_MAX: sampling off */
static uint64_t seeds;

static uint64_t splitmix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t interval(void)
{
	uint64_t v = __atomic_load_n(&interval_bytes, __ATOMIC_RELAXED);
	if (v)
		return v;
	/* secure_getenv: a setuid program under /etc/ld.so.preload does not
	 * take it from the user. */
	const char *s = secure_getenv("OTEL_MEMORY_SAMPLING_INTERVAL");
	v = DEFAULT_INTERVAL;
	if (s && *s) {
		uint64_t n = 0;
		int ok = 1;
		for (const char *c = s; *c; c++) {
			if (*c < '0' || *c > '9' || n > (UINT64_MAX - 9) / 10) {
				ok = 0;
				break;
			}
			n = n * 10 + (uint64_t)(*c - '0');
		}
		if (ok)
			v = n == 0 ? UINT64_MAX : (n > (1ull << 40) ? (1ull << 40) : n);
	}
	__atomic_store_n(&interval_bytes, v, __ATOMIC_RELAXED);
	return v;
}

/* A uniform number in (0, 1] (xorshift64*: 53 bits). */
static double uniform(void)
{
	uint64_t x = cd.rng;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	cd.rng = x;
	uint64_t bits = (x * 0x2545f4914f6cdd1dull) >> 11;
	return (double)(bits + 1) / (double)(1ull << 53);
}

/* The distance to the next point: geometric with mean exactly `mean`
 * (1 + floor(ln u / ln(1 - 1/mean)), >= 1). */
static int64_t draw(uint64_t mean)
{
	double u = uniform();
	if (mean <= 1)
		return 1;
	double d = 1.0 + floor(log(u) / log1p(-1.0 / (double)mean));
	if (d < 1.0)
		d = 1.0;
	if (d > MAX_DRAW)
		d = MAX_DRAW;
	return (int64_t)d;
}

/* The slow path: how many sample points `size` bytes cross. */
__attribute__((noinline, cold)) static uint64_t crossed(size_t size)
{
	uint64_t mean = interval();
	if (mean == UINT64_MAX) {
		cd.left = INT64_MAX;
		cd.rng = 1;
		return 0;
	}
	if (cd.rng == 0) {
		cd.rng = splitmix64(__atomic_fetch_add(&seeds, 1, __ATOMIC_RELAXED) ^
				    (uint64_t)(uintptr_t)&cd) | 1;
		cd.left = draw(mean);
	}
	int64_t s = size > (size_t)INT64_MAX ? INT64_MAX : (int64_t)size;
	int64_t left = cd.left - s; /* cd.left > 0, s >= 0: no overflow */
	uint64_t points = 0;
	/* Past the first point the process is memoryless: a huge request gets
	 * the expected count of the rest at once (randomized rounding keeps it
	 * unbiased), not a draw per point. */
	if (left <= 0) {
		uint64_t rest = (uint64_t)(-left); /* bytes past the first point */
		if (rest / BULK > mean) {
			points = 1 + (uint64_t)((double)rest / (double)mean + uniform());
			left = draw(mean);
		}
	}
	while (left <= 0) {
		points++;
		left += draw(mean);
	}
	cd.left = left;
	return points;
}

/* The fast path: 0 unless `size` bytes reach the next sample point. */
static inline uint64_t sample(size_t size)
{
	if (LIKELY((uint64_t)size < (uint64_t)cd.left)) {
		cd.left -= (int64_t)size;
		return 0;
	}
	return crossed(size);
}

/* One probe site each per library. */
__attribute__((noinline)) static void fire_alloc(void *ptr, size_t size, uint64_t weight)
{
	STAP_PROBE3(otel_memory, alloc, ptr, size, weight);
}

__attribute__((noinline)) static void fire_free(void *ptr)
{
	STAP_PROBE1(otel_memory, free, ptr);
}

static inline uint64_t tag(const void *p)
{
	return MAGIC ^ (uint64_t)(uintptr_t)p;
}

/* Reads the 8 bytes before p (glibc's chunk size word for its blocks)
 * unless they are on another page. */
static inline int is_sampled(const void *p)
{
	uintptr_t at = (uintptr_t)p;
	if ((at & (PAGE - 1)) < 8)
		return 0;
	return *(const volatile uint64_t *)(at - 8) == tag(p);
}

/* Header word 0: the distance back to glibc's block (< 8192) | size << 16. */
static inline void *raw_of(void *p, size_t *size)
{
	uint64_t w = ((uint64_t *)p)[-2];
	if (size)
		*size = (size_t)(w >> 16);
	return (char *)p - (w & 0xffff);
}

static void *sampled_block(size_t size, size_t align, uint64_t points, int zeroed)
{
	uint64_t weight = points * interval();
	size_t step = align > HEADER ? align : HEADER;
	if (step >= PAGE || size >= (1ull << 47)) {
		void *p = __libc_memalign(align, size);
		if (p) {
			if (zeroed)
				memset(p, 0, size);
			fire_alloc(p, size, weight);
			fire_free(p);
		}
		return p;
	}
	size_t total = size + 2 * step;
	void *raw = align > HEADER ? __libc_memalign(align, total)
		    : zeroed      ? __libc_calloc(1, total)
				  : __libc_malloc(total);
	if (!raw)
		return NULL;
	if (zeroed && align > HEADER)
		memset(raw, 0, total);
	char *p = (char *)raw + step;
	if (((uintptr_t)p & (PAGE - 1)) == 0)
		p += step; /* a page's first byte is never read before */
	((uint64_t *)p)[-2] = (uint64_t)(p - (char *)raw) | ((uint64_t)size << 16);
	((uint64_t *)p)[-1] = tag(p);
	fire_alloc(p, size, weight);
	return p;
}

static void free_sampled(void *p)
{
	fire_free(p);
	void *raw = raw_of(p, NULL);
	((uint64_t *)p)[-1] = 0; /* a stale tag in reused memory never matches */
	__libc_free(raw);
}

EXPORT void *malloc(size_t size)
{
	/* (A huge request is sampled: its points are counted at once and
	 * glibc fails it in sampled_block.) */
	uint64_t points = sample(size);
	if (LIKELY(points == 0))
		return __libc_malloc(size);
	return sampled_block(size, HEADER, points, 0);
}

EXPORT void free(void *p)
{
	if (LIKELY(!is_sampled(p))) {
		__libc_free(p);
		return;
	}
	free_sampled(p);
}

EXPORT void *calloc(size_t n, size_t each)
{
	size_t size;
	if (__builtin_mul_overflow(n, each, &size)) {
		errno = ENOMEM;
		return NULL;
	}
	uint64_t points = sample(size);
	if (LIKELY(points == 0))
		return __libc_calloc(n, each);
	return sampled_block(size, HEADER, points, 1);
}

/* glibc's malloc_usable_size (it has no __libc_ name), found once at load
 * time: a dlsym later, from inside an allocation, would reset the thread's
 * dlerror state — a program that allocates between a failed dlopen and its
 * dlerror() would get a freed message (bash's `enable -f` did). */
static size_t (*real_usable_size)(void *);

__attribute__((constructor)) static void find_usable_size(void)
{
	real_usable_size = (size_t (*)(void *))dlsym(RTLD_NEXT, "malloc_usable_size");
}

EXPORT size_t malloc_usable_size(void *p)
{
	if (!p)
		return 0;
	if (is_sampled(p)) {
		size_t size;
		raw_of(p, &size);
		return size;
	}
	if (!real_usable_size)
		find_usable_size(); /* called before our constructor ran */
	return real_usable_size ? real_usable_size(p) : 0;
}

EXPORT void *realloc(void *p, size_t size)
{
	if (!p)
		return malloc(size);
	int sampled = is_sampled(p);
	if (size == 0) { /* glibc: frees and returns NULL */
		free(p);
		return NULL;
	}
	uint64_t points = sampled ? 0 : sample(size);
	/* (Before our constructor, an unsampled block's size is not known:
	 * such a realloc stays glibc's.) */
	if (LIKELY(!sampled && (points == 0 || !real_usable_size)))
		return __libc_realloc(p, size);
	/* A sampled block moves with its header; a block that becomes sampled
	 * moves into one with a header: a free and an allocation. */
	size_t old;
	if (sampled)
		raw_of(p, &old);
	else
		old = malloc_usable_size(p);
	void *q = sampled ? malloc(size) : sampled_block(size, HEADER, points, 0);
	if (!q)
		return NULL;
	memcpy(q, p, old < size ? old : size);
	free(p);
	return q;
}

EXPORT void *reallocarray(void *p, size_t n, size_t each)
{
	size_t size;
	if (__builtin_mul_overflow(n, each, &size)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, size);
}

static void *aligned(size_t align, size_t size)
{
	if (align <= HEADER)
		return malloc(size);
	uint64_t points = sample(size);
	if (LIKELY(points == 0))
		return __libc_memalign(align, size);
	return sampled_block(size, align, points, 0);
}

/* glibc's memalign takes any alignment and rounds it up to a power of two. */
EXPORT void *memalign(size_t align, size_t size)
{
	if (align & (align - 1)) {
		if (align > (SIZE_MAX >> 1) + 1) {
			errno = EINVAL;
			return NULL;
		}
		size_t a = 1;
		while (a < align)
			a <<= 1;
		align = a;
	}
	return aligned(align, size);
}

/* glibc before 2.38 makes aligned_alloc memalign (any alignment, rounded
 * up); the library keeps the running glibc's answer for valid requests
 * and memalign's for the rest. */
EXPORT void *aligned_alloc(size_t align, size_t size)
{
	return memalign(align, size);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
	if (align == 0 || (align & (align - 1)) || align % sizeof(void *))
		return EINVAL;
	int saved = errno;
	void *p = aligned(align, size);
	if (!p)
		return ENOMEM;
	errno = saved;
	*out = p;
	return 0;
}
