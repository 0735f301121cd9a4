/* Publishes through libraw_ctx.so (raw_lib.c), then burns SECONDS of thread
 * CPU time in lib_user_work.
 *
 *   raw_lib_main TRACE_ID_HEX SPAN_ID_HEX SECONDS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void raw_lib_enter(const uint8_t trace_id[16], const uint8_t span_id[8]);
static volatile unsigned long sink;

static double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void lib_user_work(double seconds)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		for (int i = 0; i < 100000; i++)
			sink += i;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	uint8_t trace[16], span[8];
	for (int i = 0; i < 16; i++)
		sscanf(argv[1] + 2 * i, "%2hhx", &trace[i]);
	for (int i = 0; i < 8; i++)
		sscanf(argv[2] + 2 * i, "%2hhx", &span[i]);
	raw_lib_enter(trace, span);
	lib_user_work(atof(argv[3]));
	printf("done\n");
	return 0;
}
