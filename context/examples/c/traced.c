/* A C program that publishes its spans through symtrace-context's C ABI:
 * two threads, each in a span of its own trace, burning a given amount of
 * their own CPU time in c_alpha_work and c_beta_work.
 *
 *   cargo build -p symtrace-context --no-default-features
 *   clang -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer \
 *     -I context/include context/examples/c/traced.c target/debug/libsymtrace_context.a \
 *     -lpthread -ldl -lm -Wl,--export-dynamic-symbol=otel_thread_ctx_v1 -o traced
 *   ./traced my-service 0.8 0.4 [WARMUP_CPU_SECONDS]
 *
 * Prints each span's trace ID, span ID and the thread CPU seconds it used.
 * The optional warm-up burns CPU outside any span first, as a service's
 * start-up does: the agent learns where a process keeps its thread
 * contexts at its first sample, so a span entered in the very first
 * milliseconds of a process's life is not seen on every sample. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "symtrace_ctx.h"

static volatile unsigned long sink;

static double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void spin(void)
{
	for (int i = 0; i < 100000; i++)
		sink += i;
}

__attribute__((noinline)) void c_alpha_work(double seconds)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		spin();
}

__attribute__((noinline)) void c_beta_work(double seconds)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		spin();
}

struct job {
	const char *name;
	void (*work)(double);
	double seconds, used;
	uint8_t trace_id[16], span_id[8];
};

static void *run(void *arg)
{
	struct job *j = arg;
	symtrace_ctx_ids previous = symtrace_ctx_enter(j->trace_id, j->span_id, 1);
	double start = thread_cpu_seconds();
	j->work(j->seconds);
	j->used = thread_cpu_seconds() - start;
	symtrace_ctx_exit(&previous);
	return NULL;
}

static void random_bytes(uint8_t *out, size_t n)
{
	FILE *f = fopen("/dev/urandom", "rb");
	if (!f || fread(out, 1, n, f) != n)
		abort();
	fclose(f);
}

static void print_hex(const uint8_t *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
}

int main(int argc, char **argv)
{
	if (argc != 4 && argc != 5) {
		fprintf(stderr,
			"usage: %s SERVICE_NAME ALPHA_CPU_SECONDS BETA_CPU_SECONDS [WARMUP_CPU_SECONDS]\n",
			argv[0]);
		return 2;
	}
	if (symtrace_ctx_publish_process(argv[1]) != 0)
		fprintf(stderr, "warning: process context not published\n");
	if (argc == 5) {
		double warmup = atof(argv[4]), start = thread_cpu_seconds();
		while (thread_cpu_seconds() - start < warmup)
			spin();
	}
	struct job jobs[2] = {
		{"alpha", c_alpha_work, atof(argv[2]), 0, {0}, {0}},
		{"beta", c_beta_work, atof(argv[3]), 0, {0}, {0}},
	};
	pthread_t threads[2];
	for (int i = 0; i < 2; i++) {
		random_bytes(jobs[i].trace_id, 16);
		random_bytes(jobs[i].span_id, 8);
		pthread_create(&threads[i], NULL, run, &jobs[i]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(threads[i], NULL);
	for (int i = 0; i < 2; i++) {
		printf("%s ", jobs[i].name);
		print_hex(jobs[i].trace_id, 16);
		printf(" ");
		print_hex(jobs[i].span_id, 8);
		printf(" %.6f\n", jobs[i].used);
	}
	return 0;
}
