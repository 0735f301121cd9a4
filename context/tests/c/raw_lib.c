/* An OTEP 4947 writer in a shared library (the slot defined in a .so and
 * accessed with TLSDESC, as the OTEP recommends), loaded at start-up by
 * raw_lib_main.c. The reader must find the slot through the library's
 * TLSDESC GOT entry, not the executable's TLS segment.
 *
 *   clang -shared -fPIC -mtls-dialect=gnu2 raw_lib.c -o libraw_ctx.so */
#include <string.h>

#include "otep4947_test.h"

__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;
static __thread struct record record;

/* Publishes a valid record with these IDs on the calling thread. */
void raw_lib_enter(const uint8_t trace_id[16], const uint8_t span_id[8])
{
	memcpy(record.trace_id, trace_id, 16);
	memcpy(record.span_id, span_id, 8);
	record.trace_flags = 1;
	record.valid = 1;
	otel_thread_ctx_v1 = &record;
}
