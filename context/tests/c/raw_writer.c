/* Another OTEP 4947 writer, written in plain C without symtrace-context, to
 * check the agent's reader on its own: the TLS slot is declared here, with
 * the TLSDESC dialect (clang -mtls-dialect=gnu2), and the record is a static
 * struct. Modes:
 *   ok       a valid record with the IDs given (hex) on the command line;
 *   invalid  the same record with valid = 0 (a writer mid-update);
 *   garbage  the slot holds an unmapped address.
 * Burns SECONDS of thread CPU time in raw_work, then prints "done".
 *
 *   raw_writer MODE TRACE_ID_HEX SPAN_ID_HEX SECONDS */
#include <stdlib.h>
#include <string.h>

#include "otep4947_test.h"

__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;
static struct record record;

__attribute__((noinline)) void raw_work(double seconds)
{
	burn_cpu(seconds);
}

int main(int argc, char **argv)
{
	if (argc != 5)
		return 2;
	from_hex(argv[2], record.trace_id, 16);
	from_hex(argv[3], record.span_id, 8);
	record.trace_flags = 1;
	/* One attribute, key 0: the reader names it from the key map or by index. */
	memcpy(record.attrs, "\x00\x04raw!", 6);
	record.attrs_size = 6;
	if (!strcmp(argv[1], "ok")) {
		record.valid = 1;
		otel_thread_ctx_v1 = &record;
	} else if (!strcmp(argv[1], "invalid")) {
		record.valid = 0;
		otel_thread_ctx_v1 = &record;
	} else if (!strcmp(argv[1], "garbage")) {
		otel_thread_ctx_v1 = (void *)0xdead0000f000ul;
	} else {
		return 2;
	}
	raw_work(atof(argv[4]));
	printf("done\n");
	return 0;
}
