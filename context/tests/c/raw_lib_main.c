/* Publishes through libraw_ctx.so (raw_lib.c), then burns SECONDS of thread
 * CPU time in lib_user_work.
 *
 *   raw_lib_main TRACE_ID_HEX SPAN_ID_HEX SECONDS */
#include <stdlib.h>

#include "otep4947_test.h"

void raw_lib_enter(const uint8_t trace_id[16], const uint8_t span_id[8]);

__attribute__((noinline)) void lib_user_work(double seconds)
{
	burn_cpu(seconds);
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	uint8_t trace[16], span[8];
	from_hex(argv[1], trace, 16);
	from_hex(argv[2], span, 8);
	raw_lib_enter(trace, span);
	lib_user_work(atof(argv[3]));
	printf("done\n");
	return 0;
}
