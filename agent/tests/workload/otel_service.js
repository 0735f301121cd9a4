// Example OpenTelemetry service for the @symtrace/context package (used by
// the agent's tests and bench/node-context/throughput.js): an http server
// whose endpoints burn CPU in named functions inside spans.
//
// Env: SERVICE_NAME (default node-otel-service); PORT (0 = any; prints
// "listening PORT" when ready); SYMTRACE_CONTEXT: unset or 1 registers
// SymtraceContextManager, 0 the plain AsyncLocalStorageContextManager, lazy
// the plain one and loads the package on the first /lazy request;
// SYMTRACE_CONTEXT_PACKAGE: the package directory (default this
// repository's context/node). The OpenTelemetry packages come from
// NODE_PATH. Run with node --perf-basic-prof so that JS frames have names.
//
// Endpoints, each answering JSON {traceId, spanId} of the span it made:
//   GET /heavy?ms=N       span "heavy" around executeHeavyTask(N)
//   GET /interleave?ms=N&fn=alpha|beta
//                         span "interleave": ~2 ms chunks of chunkAlpha or
//                         chunkBeta until N ms, yielding (setImmediate)
//                         between chunks, so concurrent requests interleave
//   GET /worker?ms=N      a worker thread burns N ms in workerTask in span
//                         "worker" while the main thread burns N ms in
//                         mainTask in no span
//   GET /lazy?ms=N        loads the package, enter(random IDs), lazyTask(N),
//                         exit
//   GET /fast             span "fast": fixedTask(FAST_WORK), await
//                         setImmediate, fixedTask(FAST_WORK) (env FAST_WORK,
//                         default 20000 iterations): the throughput benchmark
"use strict";
const crypto = require("crypto");
const http = require("http");
const path = require("path");
const { Worker, isMainThread, parentPort, workerData } = require("worker_threads");
const { context, trace, ROOT_CONTEXT } = require("@opentelemetry/api");
const { AsyncLocalStorageContextManager } = require("@opentelemetry/context-async-hooks");
const { NodeTracerProvider } = require("@opentelemetry/sdk-trace-node");
const { resourceFromAttributes } = require("@opentelemetry/resources");

const mode = process.env.SYMTRACE_CONTEXT ?? "1";
const packageDir =
  process.env.SYMTRACE_CONTEXT_PACKAGE || path.join(__dirname, "../../../context/node");

// Each thread (main and worker) registers its own provider and manager.
function setupTracing() {
  const resource = resourceFromAttributes({
    "service.name": process.env.SERVICE_NAME || "node-otel-service",
  });
  const contextManager =
    mode === "0" || mode === "lazy"
      ? new AsyncLocalStorageContextManager()
      : new (require(path.join(packageDir, "otel.js")).SymtraceContextManager)({ resource });
  const provider = new NodeTracerProvider({ resource });
  provider.register({ contextManager });
  return trace.getTracer("otel-service");
}

// CPU work. The named functions are what the profile must show; each loops
// itself (besides calling sqrtSum) so that it stays on the stack even when
// V8 inlines the helper. They are copies on purpose: a function made by a
// factory would share one code object, and one name in the perf map, with
// every other function the factory makes.
function sqrtSum(n) {
  let s = 0;
  for (let i = 0; i < n; i++) s += Math.sqrt(i) * (i & 7);
  return s;
}

function executeHeavyTask(ms) {
  const end = Date.now() + ms;
  let s = 0;
  do s += sqrtSum(5000);
  while (Date.now() < end);
  return s;
}

function chunkAlpha(ms) {
  const end = Date.now() + ms;
  let s = 0;
  do s += sqrtSum(5000);
  while (Date.now() < end);
  return s;
}

function chunkBeta(ms) {
  const end = Date.now() + ms;
  let s = 0;
  do s += sqrtSum(5000) + 1;
  while (Date.now() < end);
  return s;
}

function workerTask(ms) {
  const end = Date.now() + ms;
  let s = 0;
  do s += sqrtSum(5000);
  while (Date.now() < end);
  return s;
}

function mainTask(ms) {
  const end = Date.now() + ms;
  let s = 0;
  do s += sqrtSum(5000);
  while (Date.now() < end);
  return s;
}

// The iterations of each half of a /fast request (env FAST_WORK).
const FAST_WORK = Number(process.env.FAST_WORK || 20000);

function fixedTask(n) {
  return sqrtSum(n);
}

function lazyTask(ms) {
  const end = Date.now() + ms;
  let s = 0;
  do s += sqrtSum(5000);
  while (Date.now() < end);
  return s;
}

function ids(span) {
  const { traceId, spanId } = span.spanContext();
  return { traceId, spanId };
}

// The worker of /worker: says when it starts burning, then sends its span.
function runWorker() {
  const tracer = setupTracing();
  tracer.startActiveSpan("worker", (span) => {
    parentPort.postMessage({ started: true });
    workerTask(workerData.ms);
    span.end();
    parentPort.postMessage(ids(span));
  });
}

function runServer() {
  const tracer = setupTracing();

  const routes = {
    "/heavy": (q) =>
      tracer.startActiveSpan("heavy", (span) => {
        executeHeavyTask(Number(q.get("ms") ?? 100));
        span.end();
        return ids(span);
      }),

    // Fixed work, not fixed time (so that what publishing costs shows in
    // the throughput), in two halves with an await between them (so that
    // continuations are republished too).
    "/fast": () =>
      tracer.startActiveSpan("fast", async (span) => {
        fixedTask(FAST_WORK);
        await new Promise((resolve) => setImmediate(resolve));
        fixedTask(FAST_WORK);
        span.end();
        return ids(span);
      }),

    "/interleave": (q) => {
      const ms = Number(q.get("ms") ?? 100);
      const chunk = q.get("fn") === "beta" ? chunkBeta : chunkAlpha;
      return tracer.startActiveSpan("interleave", async (span) => {
        let spent = 0;
        while (spent < ms) {
          const start = process.hrtime.bigint();
          chunk(Math.min(2, ms - spent));
          spent += Number(process.hrtime.bigint() - start) / 1e6;
          await new Promise((resolve) => setImmediate(resolve));
        }
        span.end();
        return ids(span);
      });
    },

    "/worker": (q) => {
      const ms = Number(q.get("ms") ?? 100);
      return new Promise((resolve, reject) => {
        const worker = new Worker(__filename, { workerData: { ms } });
        worker.on("error", reject);
        worker.on("message", (m) => {
          if (m.started) {
            // Outside any span, whatever the caller's context.
            context.with(ROOT_CONTEXT, () => mainTask(ms));
          } else {
            resolve(m);
          }
        });
      });
    },

    "/lazy": (q) => {
      const ctx = require(path.join(packageDir, "index.js"));
      const traceId = crypto.randomBytes(16).toString("hex");
      const spanId = crypto.randomBytes(8).toString("hex");
      const token = ctx.enter(traceId, spanId, 1);
      lazyTask(Number(q.get("ms") ?? 100));
      ctx.exit(token);
      return { traceId, spanId };
    },
  };

  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, "http://localhost");
    const route = req.method === "GET" ? routes[url.pathname] : undefined;
    if (!route) {
      res.writeHead(404).end();
      return;
    }
    try {
      const body = JSON.stringify(await route(url.searchParams));
      res.writeHead(200, { "content-type": "application/json" }).end(body);
    } catch (e) {
      res.writeHead(500).end(String(e));
    }
  });
  server.listen(Number(process.env.PORT || 0), "127.0.0.1", () => {
    console.log(`listening ${server.address().port}`);
  });
}

if (isMainThread) runServer();
else runWorker();
