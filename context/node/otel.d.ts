import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";

/** An OTel Resource (its `attributes` are used) or a plain object of attributes. */
export type ResourceLike =
  | { attributes: Record<string, unknown> }
  | Record<string, unknown>;

export interface SymtraceContextManagerOptions {
  /**
   * Published as the process context (see {@link publishResource}). Without
   * it, the resource of the first span entered is published (the SDK's
   * spans carry their provider's resource).
   */
  resource?: ResourceLike;
}

/**
 * An AsyncLocalStorageContextManager that also publishes the active span
 * as this thread's OTEP 4947 context: around every `with()` and around
 * every async continuation (await, timers, setImmediate, I/O callbacks).
 * Register it with `provider.register({ contextManager })`.
 */
export class SymtraceContextManager extends AsyncLocalStorageContextManager {
  constructor(options?: SymtraceContextManagerOptions);
  /** Starts publishing on async continuations. */
  enable(): this;
  /** Stops publishing and publishes "no span". */
  disable(): this;
}

/**
 * Publishes service.name (default `unknown_service:node`) and the scalar
 * attributes (string, number, boolean) of `resource` as the process
 * context (OTEP 4719).
 * @throws TypeError over 128 attributes, a key over 256 bytes or a value
 * over 4096 bytes.
 */
export function publishResource(resource: ResourceLike): void;
