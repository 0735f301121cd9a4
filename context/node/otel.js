// @symtrace/context/otel: an OpenTelemetry context manager that publishes
// the active span of this thread with the addon, so that the profiler can
// tie CPU samples to spans.
//
// The published span must follow the JS code that runs, not the code that
// started the span: it is switched
// - around every with() (startActiveSpan, context.with, bound functions);
// - around every async continuation (await, timers, setImmediate, I/O
//   callbacks...), by an async_hooks before/after hook: inside `before`,
//   AsyncLocalStorage already answers the continuation's context.
"use strict";
const asyncHooks = require("async_hooks");
const { createRequire } = require("module");
const path = require("path");
const native = require("./index.js");

// A peer dependency, as the application has it. Installed from a tarball
// or a registry (or with `npm install --install-links <path>`), the
// package sits in the application's node_modules and a plain require finds
// its peers. Installed as a link (`npm install <path>`), Node resolves from
// the link's real path, outside the application: then the peer is looked
// up from the application's main module and working directory.
function peer(name) {
  try {
    return require(name);
  } catch (e) {
    if (e.code !== "MODULE_NOT_FOUND") throw e;
    const from = [require.main && require.main.filename, path.join(process.cwd(), "index.js")];
    for (const file of from.filter(Boolean)) {
      try {
        return createRequire(file)(name);
      } catch (inner) {
        if (inner.code !== "MODULE_NOT_FOUND") throw inner;
      }
    }
    throw new Error(
      `@symtrace/context/otel needs the peer dependency ${name}: install it in the application ` +
        `(npm install ${name}); not found from ${__dirname} nor from the application`,
      { cause: e },
    );
  }
}

const { trace } = peer("@opentelemetry/api");
const { AsyncLocalStorageContextManager } = peer("@opentelemetry/context-async-hooks");

// The SpanContext published on this thread (null: none). Spans keep their
// SpanContext object, so comparing identities skips republishing the same
// span, the common case of continuations within one span.
let published = null;
// What each `before` replaced, restored by the matching `after` (they
// nest): saved[0..depth].
const saved = [];
let depth = 0;

// At most this many `before`s without their `after` (an exception that
// escaped a callback) are remembered.
const MAX_SAVED = 4096;

function switchTo(sc) {
  if (sc === published) return;
  if (sc) {
    // The addon checks the IDs (32 and 16 hex digits; all zeroes publish
    // no span), cheaper than isSpanContextValid's regular expressions.
    try {
      native.set(sc.traceId, sc.spanId, sc.traceFlags);
    } catch {
      native.clear();
    }
  } else {
    native.clear();
  }
  published = sc;
}

// The context last looked at and its span's SpanContext: contexts are
// immutable, and the continuations of one request resume with the same
// context object, so most lookups end here.
let lastContext;
let lastSpanContext = null;

function spanContextOf(ctx) {
  if (ctx !== lastContext) {
    lastContext = ctx;
    lastSpanContext = ctx === undefined ? null : (trace.getSpan(ctx)?.spanContext() ?? null);
  }
  return lastSpanContext;
}

/**
 * Publishes the resource's service.name (default `unknown_service:node`)
 * and its scalar attributes as the process context. `resource` is an OTel
 * Resource or a plain object of attributes.
 */
function publishResource(resource) {
  const attributes = resource?.attributes ?? resource ?? {};
  const scalars = {};
  for (const [key, value] of Object.entries(attributes)) {
    const type = typeof value;
    if (type === "string" || type === "number" || type === "boolean") scalars[key] = value;
  }
  native.publishProcess(String(scalars["service.name"] ?? "unknown_service:node"), scalars);
}

// Whether this thread published the process context (or was told to by a
// `resource` option): else the first span's resource is published.
let processPublished = false;

function publishSpanResource(context) {
  processPublished = true;
  const resource = trace.getSpan(context)?.resource; // the SDK's spans carry it
  if (resource !== undefined) {
    try {
      publishResource(resource);
    } catch {
      // A resource the addon refuses (over its bounds) is not published.
    }
  }
}

class SymtraceContextManager extends AsyncLocalStorageContextManager {
  constructor(options = {}) {
    super();
    // The store itself (active() would add ROOT_CONTEXT for none): the
    // hooks run at every callback and continuation of the process.
    const store = this._asyncLocalStorage;
    this._hook = asyncHooks.createHook({
      before() {
        if (depth === MAX_SAVED) depth = 0;
        saved[depth++] = published;
        switchTo(spanContextOf(store.getStore()));
      },
      after() {
        if (depth === 0) return switchTo(null);
        const previous = saved[--depth];
        saved[depth] = null; // not kept alive by this array
        switchTo(previous);
      },
    });
    if (options.resource !== undefined) {
      publishResource(options.resource);
      processPublished = true;
    }
  }

  with(context, fn, thisArg, ...args) {
    const prev = published;
    const sc = spanContextOf(context);
    if (!processPublished && sc !== null) publishSpanResource(context);
    switchTo(sc);
    try {
      return super.with(context, fn, thisArg, ...args);
    } finally {
      switchTo(prev);
    }
  }

  enable() {
    super.enable();
    this._hook.enable();
    return this;
  }

  disable() {
    this._hook.disable();
    super.disable();
    depth = 0;
    switchTo(null);
    return this;
  }
}

module.exports = { SymtraceContextManager, publishResource };
