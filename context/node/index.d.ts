/**
 * @symtrace/context: publishes this thread's OpenTelemetry span (OTEP 4947
 * thread context) and the process resource (OTEP 4719 process context),
 * where the symtrace profiler reads them. Every JS thread (the main thread,
 * each worker_thread) has its own published span.
 */

/** The published span: trace ID (32 hex), span ID (16 hex), trace flags. */
export type PublishedSpan = [traceId: string, spanId: string, traceFlags: number];

/**
 * Publishes the span as this thread's context and saves what it replaced.
 * All-zero IDs publish "no span". Returns the token for {@link exit}.
 * @throws TypeError if an ID is not a string of 32 / 16 hex digits or
 * traceFlags is not an integer from 0 to 255.
 */
export function enter(traceId: string, spanId: string, traceFlags?: number): number;

/**
 * Restores what the {@link enter} that returned `token` replaced, forgetting
 * deeper enters not exited. A stale token does nothing.
 */
export function exit(token: number): void;

/** Publishes the span without saving what it replaces. Throws like {@link enter}. */
export function set(traceId: string, spanId: string, traceFlags?: number): void;

/** Publishes "no span". */
export function clear(): void;

/** What this thread has published, or null for no span. */
export function current(): PublishedSpan | null;

/**
 * Publishes the process context: service.name and the resource's scalar
 * attributes (others are skipped).
 * @throws TypeError over 128 attributes, a key over 256 bytes or a value
 * over 4096 bytes.
 */
export function publishProcess(
  serviceName: string,
  resource?: Record<string, string | number | boolean>,
): void;

/** The path of the loaded native addon. */
export const addonPath: string;
