/* Shared by the hand-written OTEP 4947 writers of the correlation tests:
 * the record layout (written out here on purpose, independently of
 * symtrace-context), thread CPU time, a CPU burner and hex IDs. */
#ifndef OTEP4947_TEST_H
#define OTEP4947_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

struct record {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t valid;
	uint8_t trace_flags;
	uint16_t attrs_size;
	uint8_t attrs[612];
};

static inline double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Spins until the calling thread has used `seconds` of CPU time. */
static inline void burn_cpu(double seconds)
{
	static volatile unsigned long sink;
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		for (int i = 0; i < 100000; i++)
			sink += i;
}

static inline void from_hex(const char *hex, uint8_t *out, size_t n)
{
	for (size_t i = 0; i < n; i++)
		sscanf(hex + 2 * i, "%2hhx", &out[i]);
}

#endif
