/* The off-CPU workload: a thread named "sleeper" alternates sleepy_a, which
 * blocks in nanosleep for 30 ms, and sleepy_b, which blocks reading a pipe
 * that a "feeder" thread writes 10 ms after being asked. Built with
 * -DWITH_SPANS (and symtrace-context's static library), each call runs in a
 * span of its own trace published through the C ABI: span A around
 * sleepy_a, span B around sleepy_b.
 *
 *   OTEL_SERVICE_NAME=SERVICE ./offcpu SERVICE ROUNDS
 *
 * Prints what the sleeper measured, in nanoseconds: per function, wall
 * time minus the thread's CPU time (how long it was away), and the
 * thread's whole run:
 *   sleepy_a BLOCKED_NS
 *   sleepy_b BLOCKED_NS
 *   thread WALL_NS CPU_NS
 * and with spans, per span: `span A|B TRACE_ID SPAN_ID BLOCKED_NS`. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef WITH_SPANS
#include "symtrace_ctx.h"
#endif

static int ask[2], answer[2];

static int64_t ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Wall minus thread CPU time of `work`. */
static int64_t away(void (*work)(void))
{
	int64_t wall = ns(CLOCK_MONOTONIC), cpu = ns(CLOCK_THREAD_CPUTIME_ID);
	work();
	return (ns(CLOCK_MONOTONIC) - wall) - (ns(CLOCK_THREAD_CPUTIME_ID) - cpu);
}

__attribute__((noinline)) void sleepy_a(void)
{
	struct timespec t = {0, 30 * 1000 * 1000};
	nanosleep(&t, NULL);
}

__attribute__((noinline)) void sleepy_b(void)
{
	char c = 'x';
	if (write(ask[1], &c, 1) != 1 || read(answer[0], &c, 1) != 1)
		abort();
}

static void *feeder(void *unused)
{
	(void)unused;
	pthread_setname_np(pthread_self(), "feeder");
	char c;
	while (read(ask[0], &c, 1) == 1) {
		struct timespec t = {0, 10 * 1000 * 1000};
		nanosleep(&t, NULL);
		if (write(answer[1], &c, 1) != 1)
			abort();
	}
	return NULL;
}

#ifdef WITH_SPANS
struct span {
	uint8_t trace_id[16], span_id[8];
	int64_t away;
};

static void random_bytes(uint8_t *out, size_t n)
{
	FILE *f = fopen("/dev/urandom", "rb");
	if (!f || fread(out, 1, n, f) != n)
		abort();
	fclose(f);
}

static void print_span(const char *name, const struct span *s)
{
	printf("span %s ", name);
	for (int i = 0; i < 16; i++)
		printf("%02x", s->trace_id[i]);
	printf(" ");
	for (int i = 0; i < 8; i++)
		printf("%02x", s->span_id[i]);
	printf(" %lld\n", (long long)s->away);
}
#endif

__attribute__((noinline)) void sleeper_loop(int rounds, int64_t *a, int64_t *b)
{
#ifdef WITH_SPANS
	struct span span_a = {0}, span_b = {0};
	random_bytes(span_a.trace_id, 16);
	random_bytes(span_a.span_id, 8);
	random_bytes(span_b.trace_id, 16);
	random_bytes(span_b.span_id, 8);
#endif
	for (int i = 0; i < rounds; i++) {
#ifdef WITH_SPANS
		symtrace_ctx_ids prev = symtrace_ctx_enter(span_a.trace_id, span_a.span_id, 1);
		int64_t t = away(sleepy_a);
		symtrace_ctx_exit(&prev);
		span_a.away += t;
		*a += t;
		prev = symtrace_ctx_enter(span_b.trace_id, span_b.span_id, 1);
		t = away(sleepy_b);
		symtrace_ctx_exit(&prev);
		span_b.away += t;
		*b += t;
#else
		*a += away(sleepy_a);
		*b += away(sleepy_b);
#endif
	}
#ifdef WITH_SPANS
	print_span("A", &span_a);
	print_span("B", &span_b);
#endif
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s SERVICE ROUNDS\n", argv[0]);
		return 2;
	}
#ifdef WITH_SPANS
	if (symtrace_ctx_publish_process(argv[1]) != 0)
		fprintf(stderr, "warning: process context not published\n");
#endif
	int rounds = atoi(argv[2]);
	if (pipe(ask) || pipe(answer))
		abort();
	pthread_t f;
	pthread_create(&f, NULL, feeder, NULL);
	pthread_setname_np(pthread_self(), "sleeper");
	/* Warm up (0.3 s of CPU, outside any span): the agent learns where the
	 * process keeps its thread contexts at its first sample. */
	int64_t start = ns(CLOCK_THREAD_CPUTIME_ID);
	volatile uint64_t sink = 0;
	while (ns(CLOCK_THREAD_CPUTIME_ID) - start < 300 * 1000 * 1000)
		sink += 1;
	int64_t a = 0, b = 0;
	int64_t wall = ns(CLOCK_MONOTONIC), cpu = ns(CLOCK_THREAD_CPUTIME_ID);
	sleeper_loop(rounds, &a, &b);
	wall = ns(CLOCK_MONOTONIC) - wall;
	cpu = ns(CLOCK_THREAD_CPUTIME_ID) - cpu;
	printf("sleepy_a %lld\nsleepy_b %lld\nthread %lld %lld\n", (long long)a, (long long)b,
	       (long long)wall, (long long)cpu);
	fflush(stdout);
	/* Outlive the last wait's end by a little: the agent reads the process
	 * while it is there. */
	usleep(200 * 1000);
	return 0;
}
