/* symtrace_ctx.h: publish the current trace and span of each thread so that
 * an eBPF profiler (symtrace-agent, or any reader of the OpenTelemetry
 * thread context, OTEP 4947) ties every CPU sample to its span.
 *
 * Link libsymtrace_context.a (cargo build -p symtrace-context) with
 *   -lpthread -ldl -lm -Wl,--export-dynamic-symbol=otel_thread_ctx_v1
 * The last flag puts the TLS slot in .dynsym, where readers look for it.
 * No call here makes a syscall or takes a lock, except
 * symtrace_ctx_publish_process (once at start-up). */
#ifndef SYMTRACE_CTX_H
#define SYMTRACE_CTX_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What was published before an enter, to restore on exit. */
typedef struct symtrace_ctx_ids {
	uint8_t trace_id[16];
	uint8_t span_id[8];
	uint8_t trace_flags;
	bool active;
} __attribute__((aligned(16))) symtrace_ctx_ids;

/* Publish a span as this thread's context (W3C byte order; flags bit 0 =
 * sampled). All-zero IDs publish "no span". Returns the previous context. */
symtrace_ctx_ids symtrace_ctx_enter(const uint8_t trace_id[16], const uint8_t span_id[8],
				    uint8_t trace_flags);

/* Restore the context symtrace_ctx_enter returned (on the same thread). */
void symtrace_ctx_exit(const symtrace_ctx_ids *previous);

/* Publish the process context (OTEP 4719) with this service.name.
 * Returns 0, or -errno. */
int symtrace_ctx_publish_process(const char *service_name);

#ifdef __cplusplus
}
#endif

#endif
