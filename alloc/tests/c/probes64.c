/* A library with 64 otel_memory probe sites (32 alloc, 32 free) and no
 * thread-local storage: a hostile user's way to take probe slots, one
 * copy of it after another. */
#include <sys/sdt.h>

#define TWO(p, s, w) STAP_PROBE3(otel_memory, alloc, p, s, w); STAP_PROBE1(otel_memory, free, p);
#define EIGHT(p, s, w) TWO(p, s, w) TWO(p, s, w) TWO(p, s, w) TWO(p, s, w)
#define THIRTY_TWO(p, s, w) EIGHT(p, s, w) EIGHT(p, s, w) EIGHT(p, s, w) EIGHT(p, s, w)

void probes64(void *p, long size, long weight)
{
	THIRTY_TWO(p, size, weight)
	THIRTY_TWO(p, size, weight)
}
